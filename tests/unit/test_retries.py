"""Retries made as a matter of course while the API server is away, unavailable or throttling:
one warning line each, never a traceback, marked ``retry`` and ``reason``, and counted in
``agentrun_api_retries_total``; kopf's and the kubernetes client's own retries, told only by
their log lines, the same. Anything else a pass or a sweep fails with keeps its traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any
from unittest import mock

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from agentrun.loop import janitor, scheduler
from agentrun.observation import watches
from agentrun.telemetry import metrics
from agentrun.telemetry.logs import CONTEXT, REASON_FIELD, RETRY_FIELD, JsonFormatter, RetryLines
from agentrun.telemetry.retries import BY, fields

NO_ANSWER = urllib3.exceptions.MaxRetryError(
    urllib3.HTTPSConnectionPool("kubernetes.default.svc", 443),
    "/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r",
    urllib3.exceptions.ReadTimeoutError(None, "/apis", "Read timed out. (read timeout=30)"),  # type: ignore[arg-type]
)


def retries(by: str, reason: str) -> float:
    labels = {"by": by, "reason": reason}
    return REGISTRY.get_sample_value("agentrun_api_retries_total", labels) or 0.0


def shown(record: logging.LogRecord) -> dict[str, Any]:
    """The record as the operator's log shows it: through the filter, then the formatter."""
    assert RetryLines().filter(record)
    parsed: dict[str, Any] = json.loads(JsonFormatter().format(record))
    return parsed


def record(name: str, level: int, message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args, None)


def test_kopfs_retry_lines_are_warnings_marked_and_counted_what_it_gives_up_on_stays_an_error() -> (
    None
):
    before = retries("kopf", "throttled"), retries("kopf", "unreachable")
    throttled = shown(
        record(
            "kopf._cogs.clients.watching",
            logging.ERROR,
            "Request attempt #1/9 failed; will retry: GET https://k/apis -> "
            "APITooManyRequestsError('storage is (re)initializing')",
        )
    )
    assert throttled["level"] == "warning"
    assert (throttled[RETRY_FIELD], throttled[REASON_FIELD]) == ("kopf", "throttled")
    broken = shown(
        record(
            "kopf.objects",
            logging.ERROR,
            "Request attempt #2/9 failed; will retry: PATCH https://k/apis -> "
            "ServerDisconnectedError('Server disconnected')",
        )
    )
    assert (broken["level"], broken[REASON_FIELD]) == ("warning", "unreachable")
    escalated = shown(
        record(
            "kopf._cogs.clients.watching",
            logging.ERROR,
            "Request attempt #9/9 failed; escalating: GET https://k/apis -> TimeoutError()",
        )
    )
    assert escalated["level"] == "error" and RETRY_FIELD not in escalated
    assert (retries("kopf", "throttled"), retries("kopf", "unreachable")) == (
        before[0] + 1,
        before[1] + 1,
    )


def test_the_clients_own_retry_line_is_marked_and_counted_other_lines_pass_unchanged() -> None:
    before = retries("client", "unreachable")
    line = shown(
        record(
            "urllib3.connectionpool",
            logging.WARNING,
            "Retrying (%r) after connection broken by '%r': %s",
            "Retry(total=0)",
            "ProtocolError('Connection aborted.')",
            "/api/v1/pods",
        )
    )
    assert (line["level"], line[RETRY_FIELD], line[REASON_FIELD]) == (
        "warning",
        "client",
        "unreachable",
    )
    assert retries("client", "unreachable") == before + 1
    other = shown(record("agentrun.reconciler", logging.ERROR, "something else failed"))
    assert other["level"] == "error" and RETRY_FIELD not in other


def test_a_retry_keeps_the_lines_context_and_every_retry_line_is_marked_alike() -> None:
    assert fields("pass", "unreachable", {CONTEXT: {"run": "ns/r"}}) == {
        CONTEXT: {"run": "ns/r", RETRY_FIELD: "pass", REASON_FIELD: "unreachable"}
    }
    assert fields("janitor", "throttled") == {
        CONTEXT: {RETRY_FIELD: "janitor", REASON_FIELD: "throttled"}
    }
    # The watches mark their lines themselves (they import no telemetry): the same fields.
    assert watches._retry_line("unreachable") == fields("watch", "unreachable")
    assert "watch" in BY


def test_a_pass_the_api_server_did_not_answer_is_one_line_counted_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = retries("pass", "unreachable")
    with caplog.at_level(logging.WARNING, logger="agentrun.handlers"):
        wait = scheduler._failed("reconcile", NO_ANSWER, "ns", "r")
    assert wait == scheduler.FAILED_PASS_RETRY_SECONDS
    assert retries("pass", "unreachable") == before + 1
    (line,) = caplog.records
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert line.getMessage().startswith(
        "reconcile failed: the API server did not answer (ReadTimeoutError: "
    )
    marked = {"run": "ns/r", RETRY_FIELD: "pass", REASON_FIELD: "unreachable"}
    assert getattr(line, CONTEXT) == marked


def test_a_throttled_pass_waits_its_retry_after_and_any_other_failure_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = ApiException(status=429, reason="Too Many Requests")
    refused.headers = {"Retry-After": "2"}
    throttled = metrics.THROTTLED_PASSES._value.get()
    with caplog.at_level(logging.WARNING, logger="agentrun.handlers"):
        assert scheduler._failed("reconcile", refused, "ns", "r") == 2.0
        try:
            raise ValueError("a bug")
        except ValueError as bug:
            assert scheduler._failed("reconcile", bug, "ns", "r") == 5.0
    assert metrics.THROTTLED_PASSES._value.get() == throttled + 1
    waited, failed = caplog.records
    assert "throttled by the API server (429: " in waited.getMessage() and not waited.exc_info
    assert failed.levelno == logging.ERROR and failed.exc_info is not None
    assert RETRY_FIELD not in getattr(failed, CONTEXT)


def test_a_sweep_the_api_server_did_not_answer_is_one_line_counted_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Away:
        def sweep(self) -> Any:
            raise NO_ANSWER

    async def sleep(seconds: float) -> None:
        raise asyncio.CancelledError

    before = retries("janitor", "unreachable")
    with (
        caplog.at_level(logging.WARNING, logger="agentrun.janitor"),
        mock.patch("agentrun.loop.janitor.asyncio.sleep", sleep),
        pytest.raises(asyncio.CancelledError),
    ):
        asyncio.run(janitor.keep_sweeping(Away(), 30.0))  # type: ignore[arg-type]
    assert retries("janitor", "unreachable") == before + 1
    (line,) = caplog.records
    assert line.exc_info is None and line.getMessage().startswith(
        "janitor pass failed: the API server did not answer ("
    )
    assert getattr(line, CONTEXT) == {RETRY_FIELD: "janitor", REASON_FIELD: "unreachable"}


def test_the_log_handler_of_the_operator_carries_the_filter() -> None:
    from agentrun.telemetry import logs

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        logs.configure()
        (handler,) = root.handlers
        assert any(isinstance(f, RetryLines) for f in handler.filters)
        assert getattr(handler, "stream", None) is sys.stderr
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
