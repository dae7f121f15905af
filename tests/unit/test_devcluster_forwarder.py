"""The TCP forwarder of the partition and slow-link tests, against a real echo server on
127.0.0.1: bytes pass unchanged and in order, a delay holds each chunk at least that long each
way (a lower bound only: a busy machine may add to it, never take from it), the delay may
be set while a connection is open, closing ends every connection, and a stall keeps every
connection open while forwarding nothing, until its client gives it up."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agentrun_devcluster.forwarder import Forwarder


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A server on 127.0.0.1 that sends back what each connection sends it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield listener.getsockname()[:2]
    stop.set()
    acceptor.join(5)
    listener.close()


def _connect(link: Forwarder) -> socket.socket:
    sock = socket.create_connection((link.host, link.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _round_trip(sock: socket.socket, payload: bytes) -> float:
    started = time.monotonic()
    sock.sendall(payload)
    assert _read(sock, len(payload)) == payload
    return time.monotonic() - started


@pytest.mark.parametrize("delay", [None, 0.0, 0.01])
def test_bytes_pass_both_ways_unchanged_and_in_order(
    echo: tuple[str, int], delay: float | None
) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: many chunks, each in flight at once
    with Forwarder("127.0.0.1", echo, delay=delay) as link, _connect(link) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert _read(sock, len(payload)) == payload
        sender.join()
        assert link.accepted == 1


def test_a_delay_holds_each_chunk_that_long_each_way_and_may_change(
    echo: tuple[str, int],
) -> None:
    with Forwarder("127.0.0.1", echo, delay=0.0) as link, _connect(link) as sock:
        _round_trip(sock, b"warm")  # the upstream connection is open
        link.delay = 0.3
        assert _round_trip(sock, b"held") >= 0.6  # 0.3 s there and 0.3 s back


def test_close_ends_every_connection(echo: tuple[str, int]) -> None:
    link = Forwarder("127.0.0.1", echo, delay=0.0)
    with _connect(link) as sock:
        _round_trip(sock, b"open")
        link.close()
        sock.settimeout(5)
        assert sock.recv(1) == b""  # the forwarder's side is shut down
    with pytest.raises(OSError):
        socket.create_connection((link.host, link.port), timeout=2).close()


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        Forwarder("127.0.0.1", ("127.0.0.1", 9), delay=-1)


def _hears_nothing(sock: socket.socket, seconds: float = 0.5) -> bool:
    """Whether ``sock`` receives nothing, not even its end, for ``seconds``."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    return False


@pytest.mark.parametrize("delay", [None, 0.0])
def test_a_stall_keeps_connections_open_and_forwards_nothing_until_their_clients_end(
    echo: tuple[str, int], delay: float | None
) -> None:
    with Forwarder("127.0.0.1", echo, delay=delay) as link, _connect(link) as open_before:
        _round_trip(open_before, b"open")
        link.stall()
        open_before.sendall(b"lost")  # acknowledged by the kernel, dropped by the proxy
        assert _hears_nothing(open_before)
        with _connect(link) as during:  # accepted, never joined
            during.sendall(b"lost too")
            assert _hears_nothing(during)
        assert link.stalled == 2
        link.resume()
        with _connect(link) as after:
            after.settimeout(5)
            _round_trip(after, b"joined again")
        open_before.sendall(b"still lost")
        assert _hears_nothing(open_before)  # a stalled connection stays stalled
        assert link.stalled == 2 and link.accepted == 3


def test_close_ends_stalled_connections_too(echo: tuple[str, int]) -> None:
    link = Forwarder("127.0.0.1", echo)
    with _connect(link) as sock:
        _round_trip(sock, b"open")
        link.stall()
        assert _hears_nothing(sock, 0.2)
        link.close()
        sock.settimeout(5)
        assert sock.recv(1) == b""
