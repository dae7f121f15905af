"""Fault injection for the crash tests.

``AGENTRUN_CRASH_AT="after-intent-commit:3,after-job-create:1"`` makes the operator SIGKILL
itself the 3rd time it reaches ``after-intent-commit`` and the 1st time it reaches
``after-job-create``. Unset (always, outside tests), :func:`reach` only counts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import Counter

from agentrun.settings import CRASH_ENV

POINTS = (
    "after-intent-commit",
    "after-job-create",
    "after-result-store",
    "before-result-commit",
    "after-result-commit",
    "before-job-delete",
)

log = logging.getLogger("agentrun.crashpoints")
_lock = threading.Lock()
_reached: Counter[str] = Counter()


def _targets() -> dict[str, int]:
    raw = os.environ.get(CRASH_ENV, "")
    targets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        point, _, count = part.partition(":")
        if point not in POINTS:
            raise ValueError(f"{CRASH_ENV}: unknown crash point {point!r}; known: {POINTS}")
        targets[point] = int(count or "1")
    return targets


_TARGETS = _targets()


def reach(point: str) -> None:
    """Count a pass through ``point``; SIGKILL this process if it is the chosen pass."""
    with _lock:
        _reached[point] += 1
        hit = _TARGETS.get(point) == _reached[point]
    if hit:
        log.warning(
            "crash point %s reached (pass %d): killing the operator", point, _reached[point]
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
