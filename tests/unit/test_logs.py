"""The operator's JSON log lines (python-json-logger's formatter, the operator's field names)."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

from agentrun.telemetry.logs import JsonFormatter


def line(
    message: str, *args: object, level: int = logging.INFO, exc: bool = False, **extra: Any
) -> dict[str, Any]:
    record = logging.LogRecord("agentrun.reconciler", level, __file__, 1, message, args, None)
    if exc:
        try:
            raise ValueError("bad value")
        except ValueError:
            record.exc_info = sys.exc_info()
    for key, value in extra.items():
        setattr(record, key, value)
    text = JsonFormatter().format(record)
    assert "\n" not in text, "one object per line"
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def test_a_line_names_time_level_logger_message_and_the_run_step_and_attempt() -> None:
    out = line(
        "created Job %s", "j-1", agentrun={"run": "team-a/nightly", "step": "fetch", "attempt": 2}
    )
    assert list(out)[:4] == ["time", "level", "logger", "message"]
    assert out["level"] == "info" and out["logger"] == "agentrun.reconciler"
    assert out["message"] == "created Job j-1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", out["time"])
    assert (out["run"], out["step"], out["attempt"]) == ("team-a/nightly", "fetch", 2)
    assert "agentrun" not in out


def test_an_exception_is_one_field_and_kopf_internals_stay_out() -> None:
    out = line(
        "reconcile failed",
        level=logging.ERROR,
        exc=True,
        k8s_ref={"kind": "AgentRun", "name": "r", "namespace": "ns"},
        k8s_skip=False,
        settings=object(),
    )
    assert out["level"] == "error"
    assert out["exception"].startswith("Traceback") and "ValueError: bad value" in out["exception"]
    assert out["run"] == "ns/r", "kopf's lines about a run name it like the operator's"
    assert not {"k8s_ref", "k8s_skip", "settings", "exc_info"} & set(out)
