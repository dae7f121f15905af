"""The order in which ``make test`` hands test groups to its workers: the longest first.

pytest-xdist's ``--dist loadgroup`` gives each worker a group (a test module, or every test of
the Docker engine) and the next one when it runs dry. A long group handed out last keeps one
worker busy while the others have finished: the suite takes as long as that group's start plus
its length. So the groups are handed out longest first (the classic longest-processing-time
rule), by how long each took in the last run on this machine: the conftest writes every
group's seconds to :func:`durations_file` at the end of a run and reads them at collection.
A group that has no recorded time yet (a new machine, a new module) is ranked by its suite,
the slower suites first: the Docker engine's, e2e, then integration, then unit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "SUITE_RANK",
    "durations_file",
    "load_durations",
    "ranked_groups",
    "save_durations",
]

SUITE_RANK = {"docker": 0, "containers": 0, "e2e": 1, "integration": 2, "unit": 3}
"""A group without a recorded time goes with its suite, in this order (``docker``, the group
of every test of the Docker engine, first: on a new machine it installs the engine)."""


def durations_file() -> Path:
    """Where the last run's seconds per group are kept: the cache the project's builds use,
    outside the repository (``$AGENTRUN_CACHE_DIR``, else ``$XDG_CACHE_HOME/agentrun``, else
    ``~/.cache/agentrun``), so that a fresh clone on the same machine still has them."""
    root = os.environ.get("AGENTRUN_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "agentrun")
    return Path(root) / "test-durations.json"


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
    parts = group.split("/")
    return parts[0] if parts else ""


def ranked_groups(groups: list[str], durations: Mapping[str, float]) -> list[str]:
    """``groups`` longest first: recorded groups by their seconds, above those of their
    suite with none; each suite's unrecorded groups after the recorded ones of the same
    suite, in their own order. Ties keep the order given (the sort is stable)."""

    def key(item: tuple[int, str]) -> tuple[int, float, int]:
        index, group = item
        rank = SUITE_RANK.get(_suite(group), len(SUITE_RANK))
        known = durations.get(group)
        if known is not None:
            return (0, -known, index)
        return (1, float(rank), index)

    return [g for _, g in sorted(enumerate(groups), key=key)]
