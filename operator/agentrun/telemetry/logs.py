"""Structured logs: one JSON object per line (python-json-logger's formatter), naming the run,
step and attempt when known.

Every line has ``time`` (RFC 3339, UTC, milliseconds), ``level`` (lower case), ``logger`` and
``message``; the operator's own lines add the fields of their ``agentrun`` extra (``run`` as
``namespace/name``, ``step``, ``attempt``) at the top level, kopf's lines about a run add its
``run``; a line logged with an exception adds ``exception`` (the traceback). A retry of a
request the API server did not answer is one warning line without one, with ``retry`` (who
tries again) and ``reason`` (:mod:`agentrun.telemetry.retries`); so are the retries of the
kubernetes client and of kopf (:class:`RetryLines`).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from agentrun.api.models import KIND
from agentrun.kubeapi import THROTTLED, UNAVAILABLE, UNREACHABLE
from agentrun.telemetry.metrics import API_RETRIES

CONTEXT = "agentrun"
"""The ``extra`` key of the operator's log context: ``extra={"agentrun": {"run": ...}}``."""
RETRY_FIELD = "retry"
"""On the line of a retry: who tries again (``agentrun_api_retries_total``'s ``by``)."""
REASON_FIELD = "reason"
"""On the line of a retry: why (unreachable, unavailable, throttled)."""

# kopf's per-object loggers put these on their records; kopf's own formatter leaves them out.
_KOPF_EXTRAS = ("k8s_ref", "k8s_skip", "settings")


class JsonFormatter(_JsonFormatter):
    """python-json-logger's formatter with the operator's field names."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={
                "asctime": "time",
                "levelname": "level",
                "name": "logger",
                "exc_info": "exception",
            },
            reserved_attrs=[*RESERVED_ATTRS, *_KOPF_EXTRAS, CONTEXT],
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["level"] = record.levelname.lower()
        context = getattr(record, CONTEXT, None)
        if isinstance(context, dict):
            log_data.update(context)
        ref = getattr(record, "k8s_ref", None)
        if "run" not in log_data and isinstance(ref, dict) and ref.get("kind") == KIND:
            namespace = ref.get("namespace")
            log_data["run"] = f"{namespace}/{ref['name']}" if namespace else str(ref["name"])


KOPF_RETRY = "failed; will retry"
"""What kopf's line about a request it tries again says (``kopf._cogs.clients.api``)."""


def kopf_reason(message: str) -> str:
    """The reason of a kopf retry line, from the error it names."""
    if "APITooManyRequestsError" in message:
        return THROTTLED
    # kopf retries 5xx and, as the API server being upgraded, 403.
    if "APIServerError" in message or "APIForbiddenError" in message:
        return UNAVAILABLE
    return UNREACHABLE


class RetryLines(logging.Filter):
    """On the log's handler: the retries the operator does not see, told by their own lines,
    are counted (``agentrun_api_retries_total``) and marked as retries (``retry``,
    ``reason``):

    * the kubernetes client's (urllib3 tries a request that got no answer once more, and logs
      a warning ``Retrying (...) after connection broken by ...``);
    * kopf's, of its own requests (its watch of runs, its patches), which it logs as errors
      (``Request attempt #2/9 failed; will retry: GET ... -> ...``): made warnings here. What
      kopf gives up on (``escalating``) stays an error.

    Passes every record on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "urllib3.connectionpool" and str(record.msg).startswith("Retrying"):
            self._mark(record, "client", UNREACHABLE)
        elif record.name.startswith("kopf") and record.levelno > logging.WARNING:
            message = record.getMessage()
            if KOPF_RETRY in message:
                self._mark(record, "kopf", kopf_reason(message))
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True

    @staticmethod
    def _mark(record: logging.LogRecord, by: str, reason: str) -> None:
        API_RETRIES.labels(by, reason).inc()
        context = getattr(record, CONTEXT, None)
        marked = dict(context) if isinstance(context, dict) else {}
        marked.update({RETRY_FIELD: by, REASON_FIELD: reason})
        setattr(record, CONTEXT, marked)


def configure(level: int = logging.INFO) -> None:
    """JSON lines on stderr for the operator's own loggers and kopf's; the retries of the
    kubernetes client and of kopf are counted on the way (:class:`RetryLines`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RetryLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    # kopf reports every handler success at INFO; the operator logs what it does itself.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
