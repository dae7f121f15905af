"""Giving freed memory back to the system.

Listing thousands of runs at startup allocates
a burst of memory that is freed again within seconds. Python hands the freed blocks back to
the C allocator, but glibc's keeps most of them mapped (they are spread over its heap among
blocks still in use), so the process's resident memory stays at the burst's peak for good.
:func:`give_back` asks glibc to return every free page it can (``malloc_trim``); the janitor
calls it after each sweep (agentrun/loop/janitor.py). It is a no-op where the C library has
no ``malloc_trim`` (musl, macOS).

glibc also gives each thread that allocates while another holds the lock an arena of its own,
up to eight per core; the operator's pass threads, watch threads and kopf's executor each
fragment one, and the free pages among their blocks stay resident. :func:`limit_arenas`
caps them (``mallopt(M_ARENA_MAX)``, ``AGENTRUN_MALLOC_ARENAS``, 2 by default); ``agentrun
run`` calls it before any thread starts. Passes spend their time waiting on the API server,
so threads seldom contend for an arena.

Python's own allocator (pymalloc) serves small objects from arenas of its own, which it gives
back only when every object in one is gone: the objects a start makes for thousands of runs
and keeps (a few per run) are spread over the arenas the burst made, and keep them all
resident. :func:`use_c_allocator` has ``agentrun run`` start again with ``PYTHONMALLOC=malloc``
(every allocation from glibc, whose free pages ``malloc_trim`` can return) unless
``PYTHONMALLOC`` is set already: 141 MiB at rest with 2,000 finished runs against 153 MiB with
pymalloc, for about a tenth more CPU per step (docs/benchmarks.md). ``PYTHONMALLOC=pymalloc``
keeps Python's allocator.

Python's cyclic garbage collector also walks, on each of its full collections, every object
it tracks: most of them are what the start made and keeps for good (modules, classes, kopf's
and the operator's own state), and a full collection comes after every few thousand objects
that outlive a pass, so a run of many steps (whose every pass keeps a new body and model of
it) paid for walking them on each of its steps. :func:`freeze_startup`, called by ``agentrun
run`` once the operator is set up, leaves them out of every later collection
(``gc.freeze``): the collector's share of a 120-step plan's CPU went from 0.62 of 4.5 s to
0.17 of 3.4 s, of twelve 10-step plans' from 0.18 of 3.2 s to 0.05 of 2.7 s
(docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import sys
from collections.abc import Callable
from typing import cast

log = logging.getLogger("agentrun.memory")


M_ARENA_MAX = -8
"""``mallopt``'s parameter for the most arenas (glibc's malloc.h)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def limit_arenas(arenas: int) -> bool:
    """Let glibc's allocator use at most ``arenas`` arenas (0: leave its default); True if
    the C library took the limit. Call it before threads start: an arena made is never
    given up."""
    if arenas <= 0:
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


@functools.cache
def _trim() -> Callable[[int], int] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast("Callable[[int], int]", trim)


def give_back() -> bool:
    """Return the C allocator's free memory to the system; True if some was."""
    trim = _trim()
    if trim is None:
        return False
    try:
        return bool(trim(0))
    except OSError:
        log.debug("malloc_trim failed", exc_info=True)
        return False


def use_c_allocator() -> None:
    """Start this process again, the same command with the same arguments and the same pid
    (``execve``), with ``PYTHONMALLOC=malloc``, unless ``PYTHONMALLOC`` is set (then return):
    the allocator is chosen before the interpreter starts. Call it first thing, before any
    thread or file is opened. A process that cannot be started again goes on as it is."""
    if os.environ.get("PYTHONMALLOC"):
        return
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as error:
        log.warning("staying on Python's allocator: could not start again: %s", error)


def freeze_startup() -> int:
    """Leave every object alive now out of the garbage collector's later collections, after
    a collection of their garbage (which would otherwise be kept for good); how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
