"""A port taken by someone else between its lease and its bind, on purpose: how the tests show
that the local cluster's processes start again on new ports (agentrun_devcluster.ports)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agentrun_devcluster.ports import PortLease, lease_ports


@contextmanager
def first_lease_taken(monkeypatch: pytest.MonkeyPatch, module: object) -> Iterator[list[int]]:
    """Make ``module``'s first ``lease_ports`` call return ports that other sockets already
    listen on (as if a program took them after the lease), and later calls lease as usual.
    Yields the sizes of the leases asked for, in order."""
    asked: list[int] = []
    takers: list[socket.socket] = []

    def lease(count: int) -> PortLease:
        asked.append(count)
        got = lease_ports(count)
        if len(asked) == 1:
            for port in got.ports:
                taker = socket.socket()
                takers.append(taker)
                taker.bind(("127.0.0.1", port))
                taker.listen()
        return got

    monkeypatch.setattr(module, "lease_ports", lease)
    try:
        yield asked
    finally:
        for taker in takers:
            taker.close()
