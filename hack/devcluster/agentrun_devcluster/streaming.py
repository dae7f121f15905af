"""The local node's streaming server: ``pods/exec`` and ``pods/attach`` reach its containers.

THIS IS A TEST STAND-IN FOR THE KUBELET'S STREAMING SERVER, small on purpose. kube-apiserver
(v1.37, ``pkg/registry/core/pod/rest/subresources.go``) serves a ``pods/exec`` or
``pods/attach`` request, after authorization and admission (a CONNECT), by proxying it to the
node the pod is bound to (``pod.ExecLocation``, ``pkg/kubelet/client``):

* where: ``https://<address>:<port>/exec/<namespace>/<pod>/<container>?command=..&command=..
  &input=1&output=1&error=1&tty=1`` (``streamParams``: the client's ``stdin``, ``stdout``,
  ``stderr`` and ``tty`` under the names a kubelet reads; ``/attach/...`` without
  ``command``), at the Node's
  address of the first type of ``--kubelet-preferred-address-types`` it has (the default puts
  ``Hostname`` first; :mod:`~agentrun_devcluster.controlplane` asks for ``InternalIP``) and the
  port of ``status.daemonEndpoints.kubeletEndpoint.Port``;
* how: with the client certificate of ``--kubelet-client-certificate``, checking the node's
  serving certificate against ``--kubelet-certificate-authority`` (none: not checked). The
  local node gets one signed by the cluster (:mod:`~agentrun_devcluster.servingcert`) and
  serves only the client the control plane gives its API servers (:data:`API_SERVER_CLIENT`);
* what: a WebSocket request is passed on as the client sent it (``UpgradeAwareHandler``),
  except one offering ``v5.channel.k8s.io`` (kubectl's default; the Python client offers v5,
  then v4), which the API server translates to SPDY unless the Node declares
  ``ExtendWebSocketsToKubelet`` in ``status.declaredFeatures`` (beta, on by default since
  1.36): then it too is passed on. The local node declares it
  (:mod:`~agentrun_devcluster.registration`), so every WebSocket request reaches this server
  as sent. SPDY (older clients; ``pods/portforward``) is not served: it is answered 400.

Protocols ``v5.channel.k8s.io`` and ``v4.channel.k8s.io`` (the first the client offers): every
WebSocket message starts with a channel byte, 0 stdin (client to node), 1 stdout, 2 stderr, 3
the outcome as a ``metav1.Status`` in JSON (``Success``, or ``Failure`` with reason
``NonZeroExitCode`` and the exit code as its cause ``ExitCode``, the way a kubelet reports
it), and in v5 only, ``255 <channel>``: the client closed that channel (its stdin).

exec runs the command as the process runtime runs the container
(:class:`~agentrun_devcluster.process.ExecContext`): the container's environment and working
directory, its container paths mapped to the local files that stand in for them, so that
``echo x > /dev/termination-log`` writes the container's termination message as in a real pod.
attach follows the container's output (stdout and stderr, which the process runtime merges,
on channel 1) until the container ends; the process runtime gives containers no stdin, so what
the client sends is dropped. Differences from a kubelet: no TTY (refused), no port-forward, an
exec'd process is killed when its client goes and not when its container ends, and the docker
runtime serves neither (answered 501, saying so).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import selectors
import signal
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

from .pki import CertPair
from .process import ExecContext

__all__ = ["API_SERVER_CLIENT", "PROTOCOLS", "NotServed", "StreamingServer"]

log = logging.getLogger(__name__)

#: The common name of the client certificate the control plane gives its API servers for
#: reaching nodes (``--kubelet-client-certificate``); the only client served.
API_SERVER_CLIENT = "kube-apiserver-kubelet-client"
#: The WebSocket subprotocols served, in the order of preference of a kubelet.
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
_WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
_OP_CONTINUATION, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0, 1, 2, 8, 9, 10
_MAX_HEAD = 64 * 1024
#: After the exec'd process exits, how long its output pipes may stay open (held by a
#: process it left behind) before the outcome is sent anyway.
_DRAIN_SECONDS = 0.5


class NotServed(Exception):
    """The request cannot be served: answered ``status`` with ``message``, before any upgrade."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


#: Finds the running container ``(namespace, pod, container)`` on this node, or raises
#: :class:`NotServed` saying why not.
Find = Callable[[str, str, str], ExecContext]
FindLog = Callable[[str, str, str], tuple[Path, Callable[[], bool]]]
"""``find_log(namespace, pod, container)``: the container's output file, and whether it still
runs (a container that ended keeps its log until its pod is deleted, as on a kubelet)."""


def _status(outcome: int | str) -> bytes:
    """The outcome on channel 3: an exit code, or an error that kept the command from running."""
    body: dict[str, Any]
    if outcome == 0:
        body = {"metadata": {}, "status": "Success"}
    elif isinstance(outcome, int):
        body = {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit code {outcome}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(outcome)}]},
        }
    else:
        body = {
            "metadata": {},
            "status": "Failure",
            "message": outcome,
            "reason": "InternalError",
            "code": 500,
        }
    return json.dumps(body).encode()


def _frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked (server to client) WebSocket frame."""
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 127]) + n.to_bytes(8, "big")
    return head + payload


def _parse_frame(buf: bytearray) -> tuple[bool, int, bytes] | None:
    """The first complete frame in ``buf`` as ``(fin, opcode, payload)``, removed from it;
    None while it is incomplete."""
    if len(buf) < 2:
        return None
    fin, opcode = bool(buf[0] & 0x80), buf[0] & 0x0F
    masked, n, i = bool(buf[1] & 0x80), buf[1] & 0x7F, 2
    if n == 126:
        if len(buf) < 4:
            return None
        n, i = int.from_bytes(buf[2:4], "big"), 4
    elif n == 127:
        if len(buf) < 10:
            return None
        n, i = int.from_bytes(buf[2:10], "big"), 10
    mask = b""
    if masked:
        if len(buf) < i + 4:
            return None
        mask, i = bytes(buf[i : i + 4]), i + 4
    if len(buf) < i + n:
        return None
    payload = bytes(buf[i : i + n])
    del buf[: i + n]
    if masked and n:
        key = (mask * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return fin, opcode, payload


class _Channels:
    """One upgraded connection: channel messages out, the client's messages in. Used by one
    thread only (an SSL socket must not be read and written by two at once)."""

    def __init__(self, sock: ssl.SSLSocket, buf: bytearray, protocol: str) -> None:
        self.sock = sock
        self.buf = buf
        self.protocol = protocol
        self.open = True
        self._fragments: list[bytes] = []

    def send(self, channel: int, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(_frame(_OP_BINARY, bytes([channel]) + data))

    def finish(self, outcome: int | str) -> None:
        """Send the outcome on channel 3 and close the connection."""
        self.send(STATUS, _status(outcome))
        with contextlib.suppress(OSError):
            self.sock.sendall(_frame(_OP_CLOSE, (1000).to_bytes(2, "big")))
        self.open = False

    def receive(self) -> list[tuple[int, bytes]]:
        """Read what the client sent (the socket is readable) and return its channel messages
        as ``(channel, data)``; answers pings, and marks the connection closed at its end."""
        try:
            data = self.sock.recv(65536)
            while data and self.sock.pending():
                data += self.sock.recv(self.sock.pending())
        except OSError:
            data = b""
        if not data:
            self.open = False
        self.buf += data
        return self.messages()

    def messages(self) -> list[tuple[int, bytes]]:
        """The complete channel messages in the buffer."""
        out = []
        while (frame := _parse_frame(self.buf)) is not None:
            fin, opcode, payload = frame
            if opcode == _OP_CLOSE:
                self.open = False
                break
            if opcode == _OP_PING:
                with contextlib.suppress(OSError):
                    self.sock.sendall(_frame(_OP_PONG, payload))
                continue
            if opcode not in (_OP_CONTINUATION, _OP_TEXT, _OP_BINARY):
                continue
            self._fragments.append(payload)
            if fin:
                message = b"".join(self._fragments)
                self._fragments = []
                if message:
                    out.append((message[0], message[1:]))
        return out


#: The names of the stream parameters in the API server's request to a node
#: (``ExecStdinParam``... in pkg/apis/core/types.go).
_PARAMS = {"stdin": "input", "stdout": "output", "stderr": "error", "tty": "tty"}


def _flag(query: Mapping[str, list[str]], name: str) -> bool:
    """Whether the client asked for stream ``name`` (``stdin``, ``stdout``, ...)."""
    return (query.get(_PARAMS[name]) or [""])[-1].lower() in ("1", "true")


def _refuse(sock: ssl.SSLSocket, method: str, target: str, e: NotServed) -> None:
    """Answer a request this node does not serve with its status and why, in plain text."""
    log.info("streaming: %s %s: %s %s", method, target, e.status, e.message)
    body = e.message.encode() + b"\n"
    sock.sendall(
        f"HTTP/1.1 {e.status} {_REASONS.get(e.status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


def _asked(query: Mapping[str, list[str]], name: str) -> bool:
    """Whether a boolean query parameter ``name`` of a log request (``follow``, ``previous``)
    is true."""
    return (query.get(name) or [""])[-1].lower() in ("1", "true")


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        raw: socket.socket = self.request
        raw.settimeout(10)
        try:
            sock = self.server.ssl_context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError) as e:
            log.info("streaming: TLS handshake with %s failed: %r", self.client_address, e)
            return
        try:
            self._serve(sock)
        except Exception:
            log.exception("streaming: request from %s failed", self.client_address)
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, sock: ssl.SSLSocket) -> None:
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            while data and sock.pending():  # all that is decrypted: select() cannot see it
                data += sock.recv(sock.pending())
            if not data or len(buf) > _MAX_HEAD:
                return
            buf += data
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        method, target = [*request_line.split(" "), "", ""][:2]
        if urlsplit(target).path.startswith("/containerLogs/"):
            self._logs(sock, method, target)
            return
        try:
            client = self._client(sock)
            context, kind, query, protocol = self._route(method, target, headers)
        except NotServed as e:
            _refuse(sock, method, target, e)
            return
        accept = base64.b64encode(
            hashlib.sha1((headers["sec-websocket-key"] + _WEBSOCKET_GUID).encode()).digest()
        ).decode()
        sock.sendall(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n".encode()
        )
        sock.settimeout(None)
        channels = _Channels(sock, bytearray(rest), protocol)
        log.info("streaming: %s %s for %s (%s)", kind, urlsplit(target).path, client, protocol)
        if kind == "exec":
            _exec(channels, context, query)
        else:
            _attach(channels, context, query)

    def _logs(self, sock: ssl.SSLSocket, method: str, target: str) -> None:
        """``GET /containerLogs/<namespace>/<pod>/<container>`` (``pods/log``): the container's
        output so far, then, with ``follow=true``, what it writes until it ends or the client
        goes; ``tailLines`` and ``limitBytes`` as a kubelet reads them. Timestamps and
        ``previous`` are not served (the process runtime never restarts a container)."""
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        try:
            self._client(sock)
            if method != "GET" or len(parts) != 4:
                raise NotServed(404, f"{method} {url.path}: not found")
            if self.server.find_log is None:
                raise NotServed(501, "the agentrun local node serves no logs here")
            if _asked(query, "previous"):
                raise NotServed(400, "logs: containers here are never restarted: no previous")
            path, running = self.server.find_log(parts[1], parts[2], parts[3])
        except NotServed as e:
            _refuse(sock, method, target, e)
            return
        data = path.read_bytes() if path.exists() else b""
        tail = (query.get("tailLines") or [""])[0]
        if tail.isdigit():
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[len(lines) - int(tail) :]) if int(tail) else b""
        limit = (query.get("limitBytes") or [""])[0]
        if limit.isdigit():
            data = data[: int(limit)]
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + data
        )
        if not _asked(query, "follow") or not path.exists():
            return
        sock.settimeout(None)
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            while True:
                alive = running()
                chunk = f.read(65536)
                if chunk:
                    sock.sendall(chunk)
                    continue
                if not alive:
                    return
                time.sleep(0.1)

    def _client(self, sock: ssl.SSLSocket) -> str:
        """The client's common name; only :attr:`_Server.client` is served."""
        cert = sock.getpeercert() or {}
        subject = cast(tuple[tuple[tuple[str, str], ...], ...], cert.get("subject", ()))
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        if names != [self.server.client]:
            raise NotServed(403, f"{names}: only {self.server.client} may use this node's streams")
        return names[0]

    def _route(
        self, method: str, target: str, headers: Mapping[str, str]
    ) -> tuple[ExecContext, str, dict[str, list[str]], str]:
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if len(parts) == 3 and parts[0] == "portForward":
            raise NotServed(501, "the agentrun local node does not serve port-forward")
        if len(parts) != 4 or parts[0] not in ("exec", "attach") or method not in ("GET", "POST"):
            raise NotServed(404, f"{method} {url.path}: not found")
        kind, namespace, pod, container = parts
        query = parse_qs(url.query)
        if headers.get("upgrade", "").lower() != "websocket" or "sec-websocket-key" not in headers:
            raise NotServed(
                400,
                f"{kind}: the agentrun local node serves WebSocket ({', '.join(PROTOCOLS)}) only,"
                " not SPDY",
            )
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        protocol = next((p for p in offered if p in PROTOCOLS), None)
        if protocol is None:
            raise NotServed(400, f"{kind}: none of the subprotocols {offered} is served")
        if _flag(query, "tty"):
            raise NotServed(400, f"{kind}: the agentrun local node has no TTY")
        if kind == "exec" and not query.get("command"):
            raise NotServed(400, "exec: no command")
        return self.server.find(namespace, pod, container), kind, query, protocol


_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 501: "Not Implemented"}


def _exec(channels: _Channels, context: ExecContext, query: Mapping[str, list[str]]) -> None:
    """Run the command in the container until it ends (or the client goes), its output on
    channels 1 and 2, channel 0 to its stdin; then the outcome on channel 3."""
    argv = context.argv(query["command"])
    pipe = subprocess.PIPE
    try:
        proc = subprocess.Popen(
            argv,
            stdin=pipe if _flag(query, "stdin") else subprocess.DEVNULL,
            stdout=pipe if _flag(query, "stdout") else subprocess.DEVNULL,
            stderr=pipe if _flag(query, "stderr") else subprocess.DEVNULL,
            env=dict(context.env),
            cwd=context.cwd,
            process_group=0,
        )
    except OSError as e:
        channels.finish(f"failed to exec in container: {argv[0]!r}: {e.strerror or e}")
        return
    selector = selectors.DefaultSelector()
    selector.register(channels.sock, selectors.EVENT_READ, None)
    outputs: set[int] = set()  # the open output pipes
    for stream, channel in ((proc.stdout, STDOUT), (proc.stderr, STDERR)):
        if stream is not None:
            os.set_blocking(stream.fileno(), False)
            selector.register(stream.fileno(), selectors.EVENT_READ, channel)
            outputs.add(stream.fileno())
    exited_at: float | None = None
    try:
        for channel, data in channels.messages():
            _to_stdin(channels, proc, channel, data)
        while channels.open:
            for key, _ in selector.select(timeout=0.1):
                if key.data is None:
                    for channel, data in channels.receive():
                        _to_stdin(channels, proc, channel, data)
                    continue
                with contextlib.suppress(BlockingIOError):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        channels.send(key.data, chunk)
                    else:
                        selector.unregister(key.fd)
                        outputs.discard(key.fd)
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and (
                not outputs or time.monotonic() - exited_at > _DRAIN_SECONDS
            ):
                channels.finish(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)
                return
    finally:
        selector.close()
        if proc.poll() is None:  # the client went first
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _to_stdin(
    channels: _Channels, proc: subprocess.Popen[bytes], channel: int, data: bytes
) -> None:
    stdin = proc.stdin
    if stdin is None or stdin.closed:
        return
    if channel == STDIN:
        with contextlib.suppress(OSError):
            stdin.write(data)
            stdin.flush()
    elif channel == CLOSE and channels.protocol == PROTOCOLS[0] and data[:1] == bytes([STDIN]):
        with contextlib.suppress(OSError):
            stdin.close()


def _attach(channels: _Channels, context: ExecContext, query: Mapping[str, list[str]]) -> None:
    """Follow the container's output from now on until it ends (or the client goes)."""
    out = STDOUT if _flag(query, "stdout") else STDERR if _flag(query, "stderr") else None
    with context.log_path.open("rb") as f, selectors.DefaultSelector() as selector:
        selector.register(channels.sock, selectors.EVENT_READ)
        f.seek(0, os.SEEK_END)
        channels.messages()  # stdin is dropped: containers here have none
        while channels.open:
            running = context.running()
            chunk = f.read(65536)
            if chunk and out is not None:
                channels.send(out, chunk)
            if chunk:
                continue
            if not running:
                channels.finish(0)
                return
            if selector.select(timeout=0.1):
                channels.receive()


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        ssl_context: ssl.SSLContext,
        find: Find,
        client: str,
        find_log: FindLog | None = None,
    ) -> None:
        self.ssl_context = ssl_context
        self.find = find
        self.find_log = find_log
        self.client = client
        super().__init__(address, _Handler)


class StreamingServer:
    """The node's HTTPS streaming server on ``host:port`` (0: any free port; :attr:`port`
    says which), serving ``cert`` to clients with a certificate signed by ``client_ca`` whose
    common name is ``client``; ``find`` locates a running container."""

    def __init__(
        self,
        find: Find,
        cert: CertPair,
        client_ca: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        client: str = API_SERVER_CLIENT,
        find_log: FindLog | None = None,
    ) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert.cert), str(cert.key))
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca.decode())
        self._server = _Server((host, port), context, find, client, find_log)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="streaming", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()
