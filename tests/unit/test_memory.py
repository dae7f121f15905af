"""The operator's hold on the C allocator (agentrun/loop/memory.py)."""

from __future__ import annotations

import argparse
import ctypes.util
import subprocess
import sys
from typing import Any

import pytest

from agentrun import cli
from agentrun.loop import handlers, memory
from agentrun.settings import Settings

GLIBC = sys.platform == "linux" and "libc.so.6" in str(ctypes.util.find_library("c"))


def test_no_limit_asked_is_none_set() -> None:
    assert memory.limit_arenas(0) is False
    assert memory.limit_arenas(-1) is False


@pytest.mark.skipif(not GLIBC, reason="mallopt(M_ARENA_MAX) is glibc's; this C library is another")
def test_glibc_takes_the_arena_limit_and_gives_memory_back() -> None:
    # In a process of its own: the limit holds for the rest of a process's life.
    code = (
        "from agentrun.loop import memory\n"
        "assert memory.limit_arenas(2) is True\n"
        "memory.give_back()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_setting_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRUN_MALLOC_ARENAS", raising=False)
    assert Settings().malloc_arenas == 2
    monkeypatch.setenv("AGENTRUN_MALLOC_ARENAS", "0")
    assert Settings().malloc_arenas == 0
    monkeypatch.setenv("AGENTRUN_MALLOC_ARENAS", "few")
    with pytest.raises(ValueError, match="AGENTRUN_MALLOC_ARENAS"):
        Settings()


def test_agentrun_run_limits_the_arenas_before_the_operator_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[Any] = []
    monkeypatch.setenv("AGENTRUN_MALLOC_ARENAS", "3")

    def limit(arenas: int) -> bool:
        order.append(("arenas", arenas))
        return True

    monkeypatch.setattr(memory, "limit_arenas", limit)
    monkeypatch.setattr(
        handlers, "run_operator", lambda settings, **_: order.append(("operator", None))
    )
    parser = cli.build_parser(extensions=False)
    args: argparse.Namespace = parser.parse_args(["run", "--standalone"])
    args.checkpoint = None
    assert args.func(args) == 0
    assert order == [("arenas", 3), ("operator", None)]
