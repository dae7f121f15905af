"""A scripted OpenAI-compatible model server: real HTTP on 127.0.0.1, answers from a script.

Tests and the agent demo point an agent run's ``spec.agent.model.baseURL`` at it
(:attr:`ScriptedModel.base_url`, ``http://127.0.0.1:PORT/v1``). Every request it receives is
recorded (:attr:`ScriptedModel.requests`: the method, path, JSON body and Authorization header,
so that a test can check that a server got nothing at all), and each ``POST
/v1/chat/completions`` is answered with the next entry of the script:

* :func:`reply` builds a chat completion: an assistant message with ``content`` and/or tool
  calls, a finish reason and token usage;
* :class:`Status` answers with an HTTP error status and an OpenAI-style error body;
* :class:`Raw` answers with any bytes (garbage, a truncated body...);
* a callable is called with the request's body and returns one of the above (an answer that
  depends on what the model was sent).

When the script is used up, the :attr:`ScriptedModel.responder` answers (a callable as above:
a model whose answers depend on the conversation, for runs without a fixed length); without
one every request gets HTTP 500 ("the script has no more replies"), so a test that expected
fewer turns fails with a clear message. ``GET /v1/models`` lists the one
model. ``python -m agentrun_devcluster.modelserver SCRIPT.json`` serves a JSON script (a list
of replies as :func:`reply` returns them) until interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Raw", "Recorded", "ScriptedModel", "Status", "reply", "tool_call"]

MODEL = "scripted"


@dataclass(frozen=True)
class Status:
    """An HTTP error answer."""

    code: int
    message: str = "scripted error"


@dataclass(frozen=True)
class Raw:
    """Any body, as is."""

    body: bytes
    content_type: str = "application/json"
    code: int = 200


Answer = dict[str, Any] | Status | Raw
Entry = Answer | Callable[[dict[str, Any]], Answer]

_ids = itertools.count(1)


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """A tool call as a chat completion carries it (``arguments`` as JSON text; a string is
    sent as it is, so a test can send invalid JSON)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call_id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def reply(
    content: str | None = None,
    tool_calls: Sequence[dict[str, Any]] = (),
    *,
    prompt_tokens: int = 50,
    completion_tokens: int = 10,
    finish_reason: str | None = None,
    model: str = MODEL,
) -> dict[str, Any]:
    """A chat completion (the JSON body ``POST /v1/chat/completions`` returns)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    path: str
    body: dict[str, Any]
    authorization: str | None
    """The Authorization header as sent (tests check a key arrived, or none did)."""
    method: str = "POST"

    @property
    def messages(self) -> list[dict[str, Any]]:
        found = self.body.get("messages")
        return found if isinstance(found, list) else []

    @property
    def tool_answers(self) -> dict[str, str]:
        """The tool messages sent, by call id."""
        return {
            str(m.get("tool_call_id")): str(m.get("content"))
            for m in self.messages
            if m.get("role") == "tool"
        }


@dataclass
class ScriptedModel:
    """The server. Use as a context manager, or :meth:`start` and :meth:`stop`."""

    script: list[Entry] = field(default_factory=list)
    responder: Callable[[dict[str, Any]], Answer] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def add(self, *entries: Entry) -> None:
        """Append to the script."""
        with self._lock:
            self.script.extend(entries)

    def completions(self) -> list[Recorded]:
        """The chat completion requests received so far."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.method == "POST" and r.path.endswith("/chat/completions")
            ]

    def received(self) -> list[Recorded]:
        """Every request received so far, whatever its method and path."""
        with self._lock:
            return list(self.requests)

    def _next(self, body: dict[str, Any]) -> Answer:
        with self._lock:
            entry = self.script.pop(0) if self.script else None
        if entry is None and self.responder is not None:
            return self.responder(body)
        if entry is None:
            return Status(500, "the script has no more replies")
        return entry(body) if callable(entry) else entry

    def start(self) -> ScriptedModel:
        server = ThreadingHTTPServer((self.host, self.port), _handler(self))
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="scripted-model", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            record = Recorded(self.path, {}, self.headers.get("Authorization"), "GET")
            with model._lock:
                model.requests.append(record)
            if self.path.rstrip("/").endswith("/models"):
                listing = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                self._send(200, json.dumps(listing).encode())
            else:
                self._send(404, b'{"error": {"message": "not found"}}')

        def _other(self) -> None:
            """Any other method: recorded, and refused."""
            record = Recorded(self.path, {}, self.headers.get("Authorization"), self.command)
            with model._lock:
                model.requests.append(record)
            self._send(405, b'{"error": {"message": "method not allowed"}}')

        do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _other

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"unreadable": raw.decode("utf-8", "replace")}
            record = Recorded(self.path, body, self.headers.get("Authorization"))
            with model._lock:
                model.requests.append(record)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, b'{"error": {"message": "not found"}}')
                return
            answer = model._next(body)
            if isinstance(answer, Status):
                error = {"error": {"message": answer.message, "type": "scripted", "code": None}}
                self._send(answer.code, json.dumps(error).encode())
            elif isinstance(answer, Raw):
                self._send(answer.code, answer.body, answer.content_type)
            else:
                self._send(200, json.dumps(answer).encode())

    return Handler


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun_devcluster.modelserver",
        description="Serve a scripted OpenAI-compatible model on 127.0.0.1.",
    )
    parser.add_argument("script", help="a JSON list of chat completions to answer with")
    parser.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    with open(args.script, encoding="utf-8") as handle:
        script = json.load(handle)
    with ScriptedModel(script=list(script), port=args.port) as model:
        print(f"scripted model at {model.base_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
