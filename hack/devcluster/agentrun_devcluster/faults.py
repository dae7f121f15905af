"""Fault injection for the crash tests: the operator with a checkpoint hook that kills it.

``python -m agentrun_devcluster.faults run ...`` is ``agentrun run ...`` with a
:data:`agentrun.loop.reconciler.Checkpoint` hook. ``AGENTRUN_CRASH_AT="after-intent-commit:3,
after-job-create:1"`` makes that process SIGKILL itself the 3rd time a pass reaches
``after-intent-commit`` and the 1st time it reaches ``after-job-create``. The product never
imports this module: the hook is passed in from here.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Mapping, Sequence

from agentrun import cli
from agentrun.loop.reconciler import CHECKPOINTS

CRASH_ENV = "AGENTRUN_CRASH_AT"
POINTS = CHECKPOINTS

log = logging.getLogger("agentrun_devcluster.faults")


def parse_targets(raw: str) -> dict[str, int]:
    """``"point:n,point"`` -> ``{point: n, point: 1}``; unknown points are an error."""
    targets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        point, _, count = part.partition(":")
        if point not in POINTS:
            raise ValueError(f"{CRASH_ENV}: unknown crash point {point!r}; known: {POINTS}")
        targets[point] = int(count or "1")
    return targets


class CrashAt:
    """A checkpoint hook that counts passes and SIGKILLs this process at the chosen ones."""

    def __init__(self, targets: Mapping[str, int]) -> None:
        self.targets = dict(targets)
        self.reached: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, point: str) -> None:
        with self._lock:
            self.reached[point] += 1
            hit = self.targets.get(point) == self.reached[point]
        if hit:
            log.warning(
                "crash point %s reached (pass %d): killing the operator",
                point,
                self.reached[point],
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    hook = CrashAt(parse_targets(os.environ.get(CRASH_ENV, "")))
    return cli.main(argv, checkpoint=hook)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
