"""Waiting for a started process to answer, and the ``with`` protocol of the local cluster's
processes (agentrun_devcluster.lifecycle), with a real child process and HTTP server."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Self

import pytest

from agentrun_devcluster.lifecycle import StartStop, http_answer, wait_answer


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/healthz" else 503
        body = b"ok" if code == 200 else b"starting"
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def server() -> Iterator[str]:
    httpd = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_http_answer_is_none_only_for_200_with_an_accepted_body(server: str) -> None:
    assert http_answer(f"{server}/healthz") is None
    assert http_answer(f"{server}/healthz", lambda body: body == b"ok") is None
    assert http_answer(f"{server}/healthz", lambda body: body == b"yes") == "HTTP 200: b'ok'"
    assert http_answer(f"{server}/readyz") == "HTTP 503: b'starting'"


def test_wait_answer_raises_with_the_last_answer_after_the_timeout(server: str) -> None:
    with pytest.raises(RuntimeError) as failed:
        wait_answer(
            lambda: http_answer(f"{server}/readyz"),
            exit_code=lambda: None,
            timeout=0,
            what="the server",
            where=f"at {server}/readyz",
            error=lambda message: RuntimeError(f"{message}\n(log tail)"),
        )
    assert str(failed.value) == (
        f"the server not ready at {server}/readyz after 0s (last: HTTP 503: b'starting')\n"
        "(log tail)"
    )


def test_wait_answer_raises_with_the_exit_code_of_a_process_that_exited() -> None:
    proc = subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=False)
    asked: list[str] = []

    def answer() -> str | None:
        asked.append("asked")
        return None

    with pytest.raises(RuntimeError, match=r"^the process exited with code 3 while starting$"):
        wait_answer(
            answer,
            exit_code=lambda: proc.returncode,
            timeout=60,
            what="the process",
            error=RuntimeError,
        )
    assert asked == []  # an exited process is not asked


def test_wait_answer_returns_once_answered(server: str) -> None:
    wait_answer(
        lambda: http_answer(f"{server}/healthz"),
        exit_code=lambda: None,
        timeout=60,
        what="the server",
        error=RuntimeError,
    )


class _Part(StartStop):
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.events: list[str] = []

    def start(self) -> Self:
        self.events.append("start")
        if self.fail:
            raise RuntimeError("did not answer")
        return self

    def stop(self) -> None:
        self.events.append("stop")


def test_with_starts_and_stops() -> None:
    part = _Part(fail=False)
    with part as started:
        assert started is part
        assert part.events == ["start"]
    assert part.events == ["start", "stop"]


def test_a_failed_start_is_stopped_before_the_error_propagates() -> None:
    part = _Part(fail=True)
    with pytest.raises(RuntimeError, match="did not answer"), part:
        pytest.fail("the body of the with statement ran")
    assert part.events == ["start", "stop"]
