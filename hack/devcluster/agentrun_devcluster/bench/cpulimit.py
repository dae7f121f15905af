"""CPU limits for the operator's replicas: each process in a cgroup of its own, with a CFS
quota, so that the operator, not the machine, bounds a case.

* cgroup v1 (a ``cpu`` hierarchy at ``/sys/fs/cgroup/cpu``): a child group with
  ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``;
* cgroup v2 (``/sys/fs/cgroup/cgroup.controllers`` lists ``cpu``): a child group with
  ``cpu.max`` (``QUOTA PERIOD``), ``+cpu`` written to the root's ``cgroup.subtree_control``
  first if it is not there.

v1 is taken first (a hybrid machine binds the cpu controller to v1). Neither writable (not
root, a read-only ``/sys/fs/cgroup``): :func:`probe` says why, and the processes run without a
limit. A group is removed (its processes moved back to the root first) when its ``with``
ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CGROUP_ROOT",
    "PERIOD_US",
    "Groups",
    "Hierarchy",
    "find_hierarchy",
    "limited",
    "parse_cpu_stat",
    "probe",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000
"""The smallest quota the kernel takes."""


@dataclass(frozen=True)
class Hierarchy:
    """Where the groups are made: ``path`` (a cgroup v1 ``cpu`` hierarchy, or the v2 root)."""

    version: int
    path: Path

    def limit(self, cpus: float, period_us: int = PERIOD_US) -> dict[str, str]:
        """The files of a group, and what is written to them, for ``cpus`` CPUs."""
        quota = max(MIN_QUOTA_US, round(cpus * period_us))
        if self.version == 1:
            return {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}
        return {"cpu.max": f"{quota} {period_us}"}

    def describe(self, cpus: float) -> str:
        files = ", ".join(f"{name} {value}" for name, value in self.limit(cpus).items())
        return (
            f"{cpus:g} CPU each: a cgroup v{self.version} group per replica under "
            f"{self.path} ({files})"
        )


def find_hierarchy(root: Path = CGROUP_ROOT) -> Hierarchy | None:
    """The hierarchy with a cpu controller under ``root``: v1's ``cpu``, else v2's root."""
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").is_file():
        return Hierarchy(1, v1)
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    return Hierarchy(2, root) if "cpu" in controllers else None


def parse_cpu_stat(text: str) -> tuple[int, int]:
    """(CFS periods, periods throttled) from a group's ``cpu.stat`` (v1 and v2 alike)."""
    fields = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
    return int(fields.get("nr_periods", 0)), int(fields.get("nr_throttled", 0))


class _Group:
    """One group: made by :meth:`create`, removed by :meth:`remove`."""

    def __init__(self, hierarchy: Hierarchy, name: str, cpus: float) -> None:
        self.hierarchy = hierarchy
        self.path = hierarchy.path / name
        self.cpus = cpus

    def create(self) -> None:
        if self.hierarchy.version == 2:
            control = self.hierarchy.path / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
        self.path.mkdir()
        for name, value in self.hierarchy.limit(self.cpus).items():
            (self.path / name).write_text(value)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def periods(self) -> tuple[int, int]:
        return parse_cpu_stat((self.path / "cpu.stat").read_text())

    def remove(self) -> None:
        if not self.path.is_dir():
            return
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # it may have exited meanwhile
                    (self.hierarchy.path / "cgroup.procs").write_text(pid)
        self.path.rmdir()


def probe(cpus: float, root: Path = CGROUP_ROOT) -> tuple[Hierarchy | None, str]:
    """Where a limit of ``cpus`` can be set (a group is made and removed to find out), and
    the report's words for how it is set, or why not (``cpus`` 0: no limit asked)."""
    if cpus <= 0:
        return None, "no CPU limit (--replica-cpu 0)"
    hierarchy = find_hierarchy(root)
    if hierarchy is None:
        return None, f"no CPU limit: no cgroup v1 cpu hierarchy nor cgroup v2 cpu under {root}"
    group = _Group(hierarchy, f"agentrun-bench-probe-{os.getpid()}", cpus)
    try:
        group.create()
    except OSError as error:
        return (
            None,
            f"no CPU limit: cgroup v{hierarchy.version} under {hierarchy.path} not "
            f"writable ({error})",
        )
    finally:
        with contextlib.suppress(OSError):
            group.remove()
    return hierarchy, hierarchy.describe(cpus)


class Groups:
    """The groups of :func:`limited` (none: no limit)."""

    def __init__(self, groups: Sequence[_Group]) -> None:
        self.groups = list(groups)

    def place(self, index: int, pid: int) -> None:
        """Put process ``pid`` into the ``index``-th group."""
        if self.groups:
            self.groups[index].add(pid)

    def periods(self) -> tuple[int, int] | None:
        """CFS periods so far, and those throttled, of every group together (None: none,
        or cpu.stat unreadable)."""
        if not self.groups:
            return None
        try:
            counts = [g.periods() for g in self.groups]
        except (OSError, ValueError):
            return None
        return sum(c[0] for c in counts), sum(c[1] for c in counts)


@contextlib.contextmanager
def limited(hierarchy: Hierarchy | None, cpus: float, name: str, count: int) -> Iterator[Groups]:
    """``count`` groups of ``cpus`` CPUs each (none without ``hierarchy``), named
    ``NAME-1`` on. The groups are removed at the end: stop their processes first."""
    groups: list[_Group] = []
    try:
        if hierarchy is not None and cpus > 0:
            for index in range(count):
                group = _Group(hierarchy, f"{name}-{index + 1}", cpus)
                group.create()
                groups.append(group)
        yield Groups(groups)
    finally:
        for group in groups:
            with contextlib.suppress(OSError):
                group.remove()
