"""What a process costs, from /proc (Linux): resident memory and CPU time."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "parse_cpu_seconds", "parse_rss_bytes", "rss_bytes"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_rss_bytes(status: str) -> int:
    """Resident set size in bytes, from the text of ``/proc/PID/status`` (``VmRSS:  1234 kB``).
    Raises ValueError when the line is missing (a kernel thread, a zombie)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            amount, unit = line.split()[1:3]
            if unit.lower() != "kb":
                raise ValueError(f"unexpected unit in {line!r}")
            return int(amount) * 1024
    raise ValueError("no VmRSS line")


def parse_cpu_seconds(stat: str, clock_ticks: int = _CLOCK_TICKS) -> float:
    """User plus system CPU seconds of the process itself (``utime + stime``, fields 14 and 15
    of ``/proc/PID/stat``; the command name in parentheses may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15.
    return (int(fields[11]) + int(fields[12])) / clock_ticks


def rss_bytes(pid: int) -> int:
    return parse_rss_bytes(Path(f"/proc/{pid}/status").read_text())


def cpu_seconds(pid: int) -> float:
    return parse_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
