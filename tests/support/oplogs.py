"""What an operator process under test logged (one JSON object per line,
:mod:`agentrun.telemetry.logs`): its lines, the tracebacks among them, and the lines of
retries made while the API server was away (marked ``retry``), held against
``agentrun_api_retries_total``."""

from __future__ import annotations

import json
from typing import Any

from agentrun.telemetry.logs import RETRY_FIELD
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import wait_for
from tests.support.scraping import scrape, value

RETRIES = "agentrun_api_retries_total"


def log_lines(op: OperatorProcess) -> list[dict[str, Any]]:
    """The JSON lines of the operator's log (all starts); the test's own marks left out."""
    lines = []
    for text in op.log_text().splitlines():
        if text.startswith("{"):
            try:
                lines.append(json.loads(text))
            except ValueError:
                continue
    return lines


def tracebacks(op: OperatorProcess) -> list[str]:
    """``logger: message`` of every line of the log that carries a traceback, and the first
    line of any traceback written outside the JSON lines (a crash's stderr)."""
    found = [
        f"{line['logger']}: {line['message']}" for line in log_lines(op) if "exception" in line
    ]
    found += [text for text in op.log_text().splitlines() if text.startswith("Traceback")]
    return found


def retried(op: OperatorProcess) -> float:
    """``agentrun_api_retries_total`` (every ``by`` and ``reason``) as /metrics says now."""
    samples, _ = scrape(op)
    return value(samples, RETRIES)


def retry_lines(op: OperatorProcess) -> list[dict[str, Any]]:
    """The log's lines of retries (marked ``retry``)."""
    return [line for line in log_lines(op) if RETRY_FIELD in line]


def assert_retries_quiet(op: OperatorProcess) -> int:
    """No line of the log has a traceback, and every retry counted in
    ``agentrun_api_retries_total`` has exactly one line of its own, a warning (a retry is
    counted just before its line is written: compared until the two agree); the count."""
    assert not tracebacks(op), "tracebacks in the operator's log:\n" + "\n".join(tracebacks(op))

    def agreed() -> tuple[int, list[dict[str, Any]]] | None:
        counted, lines = retried(op), retry_lines(op)
        return (int(counted), lines) if counted == len(lines) else None

    counted, lines = wait_for(
        f"each retry counted in {RETRIES} to have one line in the log", agreed, timeout=10
    )
    assert all(line["level"] == "warning" for line in lines), lines
    return counted
