"""A TCP forwarder: what a network path between two processes would carry, in a thread.

:class:`Forwarder` listens on a host address of its own and joins each connection it accepts
to a new connection to an upstream address, bytes passed both ways unchanged (TLS included).
The partition tests put it between an operator in a network namespace and the API server on
127.0.0.1 (:mod:`agentrun_devcluster.partition`). With a ``delay`` it also holds every chunk
for that many seconds in each direction before passing it on, as a slow link would (what
``tc qdisc ... netem delay`` does to packets; kernels without netem still have this): the
chunks stay in order and in flight at once, so the delay adds latency, not a limit on
throughput. :attr:`Forwarder.delay` may be changed while connections are open; a chunk keeps
the delay of the moment it arrived::

    with Forwarder("127.0.0.1", ("127.0.0.1", etcd_port), delay=0.0) as link:
        ...                 # the upstream at full speed, through the forwarder
        link.delay = 0.05   # 50 ms each way from now on
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Self

__all__ = ["Forwarder"]

CHUNK = 65536
"""Bytes read at most at once from a connection."""


class Forwarder:
    """Accepts TCP connections on ``host`` (a port of its own, :attr:`port`) and joins each to
    a new connection to ``upstream``; when either side ends or fails, both are closed.
    ``delay`` (seconds, each direction): None passes bytes on as they come; a number, even 0,
    passes each chunk through a queue that holds it until that long after it was read, and
    may be changed later. :meth:`close` (or the ``with`` block's end) ends the listener and
    every connection."""

    def __init__(self, host: str, upstream: tuple[str, int], *, delay: float | None = None) -> None:
        if delay is not None and delay < 0:
            raise ValueError(f"delay must not be negative, not {delay}")
        self.upstream = upstream
        self.delay = delay
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)  # so that the accept loop sees close() soon
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self.accepted = 0
        """How many connections were accepted."""
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"forwarder-{host}:{self.port}", daemon=True
        )
        self._acceptor.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self.accepted += 1
                self._sockets.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.add(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        """Join ``conn`` to a new upstream connection until either ends; then close both."""
        pair = [conn]
        try:
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                return
            upstream.settimeout(None)
            pair.append(upstream)
            with self._lock:
                self._sockets.add(upstream)
                closed = self._closed
            if closed:
                return
            for sock in pair:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pump = self._pump if self.delay is None else self._held_pump
            back = threading.Thread(target=pump, args=(upstream, conn, pair), daemon=True)
            back.start()
            pump(conn, upstream, pair)
            back.join()
        finally:
            for sock in pair:
                self._shutdown(sock)
                sock.close()
            with self._lock:
                self._sockets.difference_update(pair)
                self._threads.discard(threading.current_thread())

    def _pump(self, src: socket.socket, dst: socket.socket, pair: list[socket.socket]) -> None:
        """Copy ``src`` to ``dst`` until ``src`` ends or either fails; then shut both
        connections of ``pair`` down (which wakes the pump of the other direction)."""
        with self._ending(pair):
            while data := src.recv(CHUNK):
                dst.sendall(data)

    def _held_pump(self, src: socket.socket, dst: socket.socket, pair: list[socket.socket]) -> None:
        """As :meth:`_pump`, but each chunk read goes into a queue with the time it is due
        (read + :attr:`delay`) and a second thread sends it then: reading never waits for
        sending, so many chunks are in flight at once, as on a long link."""
        held: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        sender = threading.Thread(target=self._send_when_due, args=(held, dst, pair), daemon=True)
        sender.start()
        try:
            while data := src.recv(CHUNK):
                held.put((time.monotonic() + (self.delay or 0.0), data))
        except OSError:
            pass
        finally:
            held.put(None)
            sender.join()

    def _send_when_due(
        self,
        held: queue.SimpleQueue[tuple[float, bytes] | None],
        dst: socket.socket,
        pair: list[socket.socket],
    ) -> None:
        """Send each chunk of ``held`` to ``dst`` once it is due, in order, until the reader's
        end (None) or a failure; then shut both connections of ``pair`` down."""
        with self._ending(pair):
            while (item := held.get()) is not None:
                due, data = item
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                dst.sendall(data)

    @classmethod
    @contextlib.contextmanager
    def _ending(cls, pair: list[socket.socket]) -> Iterator[None]:
        """Stop quietly at a connection's failure, and shut both connections of ``pair`` down
        at the end (which wakes whatever waits on the other)."""
        try:
            with contextlib.suppress(OSError):
                yield
        finally:
            for sock in pair:
                cls._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, end every connection, wait (up to ``timeout`` each) for the
        threads."""
        with self._lock:
            self._closed = True
            sockets, threads = list(self._sockets), list(self._threads)
        self._acceptor.join(timeout)
        self._listener.close()
        for sock in sockets:
            self._shutdown(sock)
        for thread in threads:
            thread.join(timeout)
