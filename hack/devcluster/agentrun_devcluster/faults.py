"""Fault injection for the crash tests: the operator with a checkpoint hook that kills it.

``python -m agentrun_devcluster.faults run ...`` is ``agentrun run ...`` with a
:data:`agentrun.loop.reconciler.Checkpoint` hook. ``AGENTRUN_CRASH_AT="after-intent-commit:3,
after-job-create:1"`` makes that process SIGKILL itself the 3rd time a pass reaches
``after-intent-commit`` and the 1st time it reaches ``after-job-create``. The product never
imports this module: the hook is passed in from here.

:class:`Stutter` slows a process down from outside instead (an etcd that answers late).
"""

from __future__ import annotations

import contextlib
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


class Stutter:
    """Makes a process answer slowly without killing it: a thread stops it (SIGSTOP) for
    ``pause`` seconds of every ``period``, as a disk that stalls or a starved CPU would, until
    the ``with`` block ends (the process is always continued then). For a slow etcd::

        with Stutter(control_plane.pids()["etcd"], pause=0.15, period=0.25):
            ...
    """

    def __init__(self, pid: int, *, pause: float, period: float) -> None:
        if not 0 < pause < period:
            raise ValueError("pause must be shorter than the period, and positive")
        self.pid = pid
        self.pause = pause
        self.period = period
        self.stops = 0
        """How many times the process was stopped."""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stutter", daemon=True)

    def __enter__(self) -> Stutter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self.stops += 1
                self._done.wait(self.pause)
                os.kill(self.pid, signal.SIGCONT)
                self._done.wait(self.period - self.pause)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)


def main(argv: Sequence[str] | None = None) -> int:
    hook = CrashAt(parse_targets(os.environ.get(CRASH_ENV, "")))
    return cli.main(argv, checkpoint=hook)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
