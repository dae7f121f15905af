"""Structured logs: one JSON object per line (python-json-logger's formatter), naming the run,
step and attempt when known.

Every line has ``time`` (RFC 3339, UTC, milliseconds), ``level`` (lower case), ``logger`` and
``message``; the operator's own lines add the fields of their ``agentrun`` extra (``run`` as
``namespace/name``, ``step``, ``attempt``) at the top level, kopf's lines about a run add its
``run``; a line logged with an exception adds ``exception`` (the traceback).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from agentrun.api.models import KIND

CONTEXT = "agentrun"
"""The ``extra`` key of the operator's log context: ``extra={"agentrun": {"run": ...}}``."""

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


def configure(level: int = logging.INFO) -> None:
    """JSON lines on stderr for the operator's own loggers and kopf's."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    # kopf reports every handler success at INFO; the operator logs what it does itself.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
