"""The order in which ``make test`` hands test groups to its workers: the longest first.

pytest-xdist's ``--dist loadgroup`` gives each worker a group (a test module, or every test of
the Docker engine) and the next one when it runs dry. A long group handed out last keeps one
worker busy while the others have finished: the suite takes as long as that group's start plus
its length. So the groups are handed out longest first (the classic longest-processing-time
rule), by how long each took in the last run on this machine: the conftest writes every
group's seconds to :func:`durations_file` at the end of a run and reads them at collection.
A group that has no recorded time yet (a new machine, a new module) is taken to last what
groups of its suite usually do (:data:`SUITE_GUESS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from agentrun_devcluster.binaries import cache_root

__all__ = [
    "SUITE_GUESS",
    "durations_file",
    "load_durations",
    "ranked_groups",
    "save_durations",
]

SUITE_GUESS = {"docker": 600.0, "containers": 600.0, "e2e": 60.0, "integration": 10.0, "unit": 1.0}
"""The seconds a group with no recorded time is taken to last, by its suite (``docker``, the
group of every test of the Docker engine, longest: on a new machine it installs the engine):
about what such a group took on a 2-core machine, so that a new module ranks among the
recorded ones of its kind."""


def durations_file() -> Path:
    """Where the last run's seconds per group are kept: the cache the project's builds use,
    outside the repository (:func:`agentrun_devcluster.binaries.cache_root`), so that a fresh
    clone on the same machine still has them."""
    return cache_root() / "test-durations.json"


def load_durations(path: Path) -> dict[str, float]:
    """The recorded seconds per group; empty when there are none or the file is unreadable
    (the order is then by suite alone: nothing depends on the file being there)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float) and v >= 0}


def save_durations(path: Path, seconds: Mapping[str, float], previous: Mapping[str, float]) -> None:
    """Record ``seconds`` per group, keeping ``previous`` groups this run did not run (a run
    of one suite keeps the others' times). Written whole to a temporary file, then renamed:
    a reader never sees half a file."""
    merged = {**previous, **{k: round(v, 1) for k, v in seconds.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    tmp.replace(path)


def _suite(group: str) -> str:
    return group.split("/", 1)[0]


def ranked_groups(groups: list[str], durations: Mapping[str, float]) -> list[str]:
    """``groups`` longest first, each by its recorded seconds, else by its suite's
    :data:`SUITE_GUESS` (a suite not in it: last). Ties keep the order given (the sort is
    stable)."""

    def seconds(group: str) -> float:
        known = durations.get(group)
        return known if known is not None else SUITE_GUESS.get(_suite(group), 0.0)

    return sorted(groups, key=lambda group: -seconds(group))
