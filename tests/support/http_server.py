"""An HTTP server for the tests of HTTP tools, in the test's own process on 127.0.0.1 (the
local node's step pods are processes of this machine, so they reach it there): it records
every request (method, path, headers, body) and answers by path.

* ``/status/CODE``: that status, the body ``status CODE``.
* ``/redirect?to=URL``: 302 to URL.
* ``/big/N``: N bytes of ``x``.
* ``/slow/SECONDS``: waits, then 200.
* ``/echo-auth``: 200, the Authorization header it got as the body.
* anything else: 200, a JSON body naming the method, the path and the body it got.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Seen:
    """A request as it reached the server."""

    method: str
    path: str
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes


@dataclass
class Recorder:
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, found: Seen) -> None:
        with self.lock:
            self.seen.append(found)

    def requests(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorder.add(Seen(self.command, self.path, headers, body))
            parts = urlsplit(self.path)
            status, out, extra = 200, b"", {"Content-Type": "application/json"}
            if parts.path.startswith("/status/"):
                status = int(parts.path.rsplit("/", 1)[1])
                out, extra = f"status {status}".encode(), {"Content-Type": "text/plain"}
            elif parts.path == "/redirect":
                status, extra = 302, {"Location": parse_qs(parts.query)["to"][0]}
            elif parts.path.startswith("/big/"):
                out = b"x" * int(parts.path.rsplit("/", 1)[1])
                extra = {"Content-Type": "text/plain"}
            elif parts.path.startswith("/slow/"):
                time.sleep(float(parts.path.rsplit("/", 1)[1]))
                out = b"{}"
            elif parts.path == "/echo-auth":
                out = (headers.get("authorization") or "").encode()
                extra = {"Content-Type": "text/plain"}
            else:
                said = {"method": self.command, "path": self.path, "body": body.decode()}
                out = json.dumps(said).encode()
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(out)  # a client that read enough may have gone

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    return Handler


@dataclass
class Server:
    """The server, running: its port and what reached it."""

    port: int
    recorder: Recorder

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[Seen]:
        return self.recorder.requests()


@contextmanager
def serving() -> Iterator[Server]:
    """The server on a free port of 127.0.0.1 while the block runs."""
    recorder = Recorder()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.1,), daemon=True)
    thread.start()
    try:
        yield Server(httpd.server_address[1], recorder)
    finally:
        httpd.shutdown()
        httpd.server_close()
