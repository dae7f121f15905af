"""Giving freed memory back to the system.

Listing thousands of runs at startup, or adding the run finalizer to each of them, allocates
a burst of memory that is freed again within seconds. Python hands the freed blocks back to
the C allocator, but glibc's keeps most of them mapped (they are spread over its heap among
blocks still in use), so the process's resident memory stays at the burst's peak for good.
:func:`give_back` asks glibc to return every free page it can (``malloc_trim``); the janitor
calls it after each sweep (agentrun/loop/janitor.py). It is a no-op where the C library has
no ``malloc_trim`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable
from typing import cast

log = logging.getLogger("agentrun.memory")


@functools.cache
def _trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
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
