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

:meth:`Forwarder.stall` makes it a proxy that lost its backend but not its clients: every
connection open then, and every one accepted until :meth:`Forwarder.resume`, stays open and
forwards nothing, either way (what a client sends is read and dropped; its upstream connection
is closed). The client's kernel gets every segment acknowledged and every keepalive probe
answered, so only a timeout of the client's own finds out. After :meth:`~Forwarder.resume`,
new connections are joined again; a stalled one stays stalled until its client closes it.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from typing import Self

__all__ = ["Forwarder"]

CHUNK = 65536
"""Bytes read at most at once from a connection."""


class _Link:
    """One accepted connection, its upstream connection once made, and whether it stalled."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.stalled = False

    def sockets(self) -> list[socket.socket]:
        return [self.client] + ([self.upstream] if self.upstream is not None else [])


class Forwarder:
    """Accepts TCP connections on ``host`` (a port of its own, :attr:`port`) and joins each to
    a new connection to ``upstream``; when either side ends or fails, both are closed (but
    for a stalled connection: see the module docstring). ``delay`` (seconds, each direction):
    None passes bytes on as they come; a number, even 0, passes each chunk through a queue
    that holds it until that long after it was read, and may be changed later. :meth:`close`
    (or the ``with`` block's end) ends the listener and every connection."""

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
        self.stalled = 0
        """How many connections stalled (open at a :meth:`stall`, or accepted during one)."""
        self.stalling = False
        """Whether connections accepted now stall (between :meth:`stall` and :meth:`resume`)."""
        self._lock = threading.Lock()
        self._closed = False
        self._links: set[_Link] = set()
        self._threads: set[threading.Thread] = set()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"forwarder-{host}:{self.port}", daemon=True
        )
        self._acceptor.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stall(self) -> None:
        """Forward nothing more on any open connection, nor on any accepted from now until
        :meth:`resume`; close their upstream connections, keep the clients' open."""
        with self._lock:
            self.stalling = True
            links = [link for link in self._links if not link.stalled]
            for link in links:
                link.stalled = True
            self.stalled += len(links)
        for link in links:
            if link.upstream is not None:
                self._shutdown(link.upstream)

    def resume(self) -> None:
        """Join the connections accepted from now on again; stalled ones stay stalled."""
        with self._lock:
            self.stalling = False

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
                link = _Link(conn)
                if self.stalling:
                    link.stalled = True
                    self.stalled += 1
                self._links.add(link)
                thread = threading.Thread(target=self._serve, args=(link,), daemon=True)
                self._threads.add(thread)
            thread.start()

    def _serve(self, link: _Link) -> None:
        """Join ``link``'s client to a new upstream connection until either ends (a stalled
        link: until the client ends); then close both."""
        try:
            if link.stalled:
                self._swallow(link)
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                return
            upstream.settimeout(None)
            with self._lock:
                link.upstream = upstream
                closed, stalled = self._closed, link.stalled
            if closed:
                return
            if stalled:  # stalled while the upstream connection was being made
                self._shutdown(upstream)
                self._swallow(link)
                return
            for sock in link.sockets():
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pump = self._pump if self.delay is None else self._held_pump
            back = threading.Thread(target=pump, args=(upstream, link.client, link), daemon=True)
            back.start()
            pump(link.client, upstream, link)
            back.join()
        finally:
            for sock in link.sockets():
                self._shutdown(sock)
                sock.close()
            with self._lock:
                self._links.discard(link)
                self._threads.discard(threading.current_thread())

    def _swallow(self, link: _Link) -> None:
        """Read what ``link``'s client sends and drop it, until the client ends."""
        with contextlib.suppress(OSError):
            while link.client.recv(CHUNK):
                pass

    @staticmethod
    def _send(dst: socket.socket, data: bytes, link: _Link) -> None:
        """Pass ``data`` on, unless the link stalled (then it is dropped; so is a send that
        failed because the link stalled meanwhile)."""
        if link.stalled:
            return
        try:
            dst.sendall(data)
        except OSError:
            if not link.stalled:
                raise

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link) -> None:
        """Copy ``src`` to ``dst`` until ``src`` ends or either fails; then end the link
        (:meth:`_end`)."""
        try:
            while data := src.recv(CHUNK):
                self._send(dst, data, link)
        except OSError:
            pass
        finally:
            self._end(link, src)

    def _held_pump(self, src: socket.socket, dst: socket.socket, link: _Link) -> None:
        """As :meth:`_pump`, but each chunk read goes into a queue with the time it is due
        (read + :attr:`delay`) and a second thread sends it then: reading never waits for
        sending, so many chunks are in flight at once, as on a long link."""
        held: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        sender = threading.Thread(
            target=self._send_when_due, args=(held, src, dst, link), daemon=True
        )
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
        src: socket.socket,
        dst: socket.socket,
        link: _Link,
    ) -> None:
        """Send each chunk of ``held`` to ``dst`` once it is due, in order, until the reader's
        end (None) or a failure; then end the link (:meth:`_end`)."""
        try:
            while (item := held.get()) is not None:
                due, data = item
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                self._send(dst, data, link)
        except OSError:
            pass
        finally:
            self._end(link, src)

    def _end(self, link: _Link, src: socket.socket) -> None:
        """``src`` of ``link`` ended or failed: shut both connections down (which wakes
        whatever waits on the other), but for a stalled link whose upstream ended: its client
        hears nothing of it."""
        if link.stalled and src is not link.client:
            self._shutdown(src)
            return
        for sock in link.sockets():
            self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, end every connection (stalled ones too), wait (up to ``timeout``
        each) for the threads."""
        with self._lock:
            self._closed = True
            sockets = [sock for link in self._links for sock in link.sockets()]
            threads = list(self._threads)
        self._acceptor.join(timeout)
        self._listener.close()
        for sock in sockets:
            self._shutdown(sock)
        for thread in threads:
            thread.join(timeout)
