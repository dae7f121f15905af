"""TCP ports on 127.0.0.1 for the processes the local cluster starts (etcd, kube-apiserver,
kube-controller-manager, the operator, the chart's operator pod on the node's network), with
no free-port race. Every part of the local cluster and of the tests that hands a port to a
process takes it here.

The race: a port found free by binding port 0 and closing the socket is handed to a process
that binds it a moment later. In between, the kernel may give the same port to any outgoing
connection or ``bind(("", 0))`` on the machine (it takes both from
``net.ipv4.ip_local_port_range``), and the process then fails with "address already in use".
Two measures close it:

1. :func:`lease_ports` picks ports *below* that ephemeral range (default 32768-60999, so from
   20000-32767 here), which the kernel never hands out by itself, and skips any port something
   listens on. A lease holds an exclusive ``flock`` on ``/tmp/agentrun-ports/<port>.lock`` until
   it is released (or its process dies), so no two leases anywhere on the machine (two pytest
   workers, two clusters of one worker) hold the same port at once. Keep a lease for as long as
   its process uses the port.
2. :func:`retry_port_clash` starts a process again on new ports when it failed because a port
   was taken anyway (by a program that chose that port itself): the one retry loop of the
   control plane and the operator process.

A leased port that nothing binds is also a port where connections are refused, for as long as
the lease is held: tests that need an endpoint that is down use that.

Where the ephemeral range leaves no room below it (it starts under 21024), ports come from above
it, or else from anywhere, and only the retry protects.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import random
import socket
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

__all__ = [
    "PortLease",
    "PortsExhausted",
    "ephemeral_range",
    "lease_ports",
    "port_clash",
    "retry_port_clash",
    "usable_range",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
LOCK_DIR = Path("/tmp/agentrun-ports")
"""Where the leases' lock files live, one per port ever leased (empty files, never removed:
removing a lock file while another process waits on it would split the lock). One directory
for the whole machine, whatever a process's TMPDIR: the leases of every process must meet."""
LOWEST = 20000
"""The lowest port leased when the ephemeral range leaves room below it."""
MIN_SPAN = 1024
"""The fewest ports a usable range must have."""
PORT_CLASH_ATTEMPTS = 5
"""How many times :func:`retry_port_clash` starts a process before giving up."""

T = TypeVar("T")


class PortsExhausted(RuntimeError):
    """No free port could be leased in the usable range."""


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The kernel's range for ports it picks by itself (Linux's default where unreadable)."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def usable_range(ephemeral: range) -> range:
    """Ports to lease: below ``ephemeral`` from :data:`LOWEST`, else above it, else any
    unprivileged port."""
    if ephemeral.start - LOWEST >= MIN_SPAN:
        return range(LOWEST, ephemeral.start)
    if 65536 - ephemeral.stop >= MIN_SPAN:
        return range(ephemeral.stop, 65536)
    return range(1024, 65536)


class PortLease:
    """Ports held for one process: :attr:`ports`, in the order asked. No other lease gets them
    until :meth:`release` (or the end of a ``with`` block, or of this process)."""

    def __init__(self, ports: tuple[int, ...], locks: list[int]) -> None:
        self.ports = ports
        self._locks = locks

    @property
    def port(self) -> int:
        """The first (for a lease of one, the only) port."""
        return self.ports[0]

    def release(self) -> None:
        """Let other leases have the ports (idempotent)."""
        locks, self._locks = self._locks, []
        for fd in locks:
            os.close(fd)  # closing the descriptor drops its flock

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"PortLease({', '.join(map(str, self.ports))})"


def _lock(port: int) -> int | None:
    """An open descriptor holding the port's lock, or None if another lease holds it."""
    return exclusive_lock(LOCK_DIR / f"{port}.lock")


def exclusive_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive ``flock`` on ``path`` (made, with its
    directory, if missing: a directory every user may write in), or None if another open
    descriptor holds it. The lock lasts until the descriptor is closed, or the process ends."""
    path.parent.mkdir(mode=0o1777, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``HOST:port`` now (nothing listens there, no connection
    lingers on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def lease_ports(count: int, *, candidates: range | None = None, tries: int = 2000) -> PortLease:
    """``count`` distinct ports, bindable now and held by no other lease, from ``candidates``
    (default: :func:`usable_range` of this machine's ephemeral range), chosen at random."""
    pool = usable_range(ephemeral_range()) if candidates is None else candidates
    chosen: list[int] = []
    locks: list[int] = []
    try:
        for _ in range(tries):
            if len(chosen) == count:
                return PortLease(tuple(chosen), locks)
            port = random.choice(pool)
            if port in chosen:
                continue
            fd = _lock(port)
            if fd is None:
                continue
            if not _bindable(port):
                os.close(fd)
                continue
            chosen.append(port)
            locks.append(fd)
        if len(chosen) == count:
            return PortLease(tuple(chosen), locks)
    except BaseException:
        for fd in locks:
            os.close(fd)
        raise
    for fd in locks:
        os.close(fd)
    raise PortsExhausted(
        f"found {len(chosen)} of {count} free ports in {pool.start}-{pool.stop - 1} after "
        f"{tries} tries (see the locks in {LOCK_DIR} and `ss -ltn`)"
    )


def port_clash(error: BaseException | str) -> bool:
    """Whether ``error`` (or a process's log text) says a port was already in use."""
    return "address already in use" in str(error).lower()


def retry_port_clash(
    start: Callable[[], T],
    *,
    what: str,
    clash: Callable[[Exception], bool] = port_clash,
    attempts: int = PORT_CLASH_ATTEMPTS,
) -> T:
    """``start()``, called again while it fails with an error that ``clash`` says was a taken
    port (default: :func:`port_clash` of its message). ``start`` leases its ports itself and,
    when it fails, stops what it started and releases its lease. Any other error, or the last
    attempt's, propagates."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as e:
            if attempt == attempts or not clash(e):
                raise
            log.warning(
                "%s: a port was taken before it was bound; starting again on new ports "
                "(attempt %d of %d)",
                what,
                attempt + 1,
                attempts,
            )
    raise AssertionError("unreachable")
