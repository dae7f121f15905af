"""The operator's hold on the C allocator (agentrun/loop/memory.py)."""

from __future__ import annotations

import argparse
import ctypes.util
import os
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
    _prints_ok_in_its_own_process(code)


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


def test_the_operators_own_process_starts_again_on_the_c_allocator_unless_one_is_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, list(argv), dict(env)))

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "agentrun", "run", "-A"])
    memory.use_c_allocator()
    ((path, argv, env),) = calls
    assert path == sys.executable and argv == ["python", "-m", "agentrun", "run", "-A"]
    assert env["PYTHONMALLOC"] == "malloc"
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc")  # chosen: kept, no new start
    memory.use_c_allocator()
    assert len(calls) == 1
    monkeypatch.delenv("PYTHONMALLOC")

    def refused(path: str, argv: list[str], env: dict[str, str]) -> None:
        raise PermissionError("no exec here")

    monkeypatch.setattr(os, "execve", refused)
    memory.use_c_allocator()  # goes on as it is


def test_agentrun_run_starts_again_only_as_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main()`` as the command (no argv given) may start the process again; ``main(argv)``
    from a caller's process (a test) never does."""
    started: list[str] = []
    monkeypatch.setattr(memory, "use_c_allocator", lambda: started.append("again"))
    monkeypatch.setattr(memory, "limit_arenas", lambda arenas: True)
    monkeypatch.setattr(handlers, "run_operator", lambda settings, **_: None)
    assert cli.main(["run", "--standalone"]) == 0
    assert started == []
    monkeypatch.setattr(sys, "argv", ["agentrun", "run", "--standalone"])
    assert cli.main() == 0
    assert started == ["again"]


def test_what_the_start_made_is_left_out_of_later_collections_and_its_garbage_is_not_kept() -> None:
    # In a process of its own: nothing frozen is ever collected again in that process.
    code = (
        "import gc, weakref\n"
        "from agentrun.loop import memory\n"
        "class Node: pass\n"
        "garbage = Node(); garbage.me = garbage; gone = weakref.ref(garbage); del garbage\n"
        "kept = Node(); kept.me = kept\n"
        "assert memory.freeze_startup() > 1000\n"
        "assert gone() is None, 'garbage of the start was frozen'\n"
        "later = Node(); later.me = later; after = weakref.ref(later); del later\n"
        "gc.collect()\n"
        "assert after() is None, 'a cycle made after the start was not collected'\n"
        "print('ok')\n"
    )
    _prints_ok_in_its_own_process(code)


def _prints_ok_in_its_own_process(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
