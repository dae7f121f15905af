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
* :class:`Drop` answers nothing and closes the connection;
* a callable is called with the request's body and returns one of the above (an answer that
  depends on what the model was sent).

Before any of that, each chat completion request is checked as strictly as real servers check
it (:func:`check_request`): the roles and their order (no two user or assistant messages in
a row, as chat templates like Gemma's require), the content types, every assistant tool
call's arguments (JSON text of an object), every tool call id answered by exactly one tool
message before the next assistant or user message, tool messages answering only calls made,
the tools and ``tool_choice``. A request that fails is answered like those servers answer it
(HTTP 400 with an OpenAI-style error, or HTTP 500 for arguments that are not JSON, as
llama.cpp's ``llama-server`` does) and does not use up a reply of the script, so a test whose
operator sends something a real server refuses fails on the run, not in production.
:attr:`ScriptedModel.refused` lists the refusals; ``strict=False`` turns the check off (a server
that accepts anything).

When the script is used up, the :attr:`ScriptedModel.responder` answers (a callable as above:
a model whose answers depend on the conversation, for runs without a fixed length); without
one every request gets HTTP 500 ("the script has no more replies"), so a test that expected
fewer turns fails with a clear message. ``delay`` makes each chat completion wait a while
before it is answered (seconds drawn evenly from a range, seeded), as a real model thinks
(the benchmark's agent case). ``GET /v1/models`` lists the one
model. ``python -m agentrun_devcluster.modelserver SCRIPT.json`` serves a JSON script (a list
of replies as :func:`reply` returns them) until interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Drop",
    "Raw",
    "Recorded",
    "Refusal",
    "ScriptedModel",
    "Status",
    "check_request",
    "reply",
    "tool_call",
]

MODEL = "scripted"
ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PART_TYPES = ("text", "image_url", "input_audio", "file")


@dataclass(frozen=True)
class Status:
    """An HTTP error answer."""

    code: int
    message: str = "scripted error"
    headers: tuple[tuple[str, str], ...] = ()
    """Headers sent with it (``(("Retry-After", "2"),)`` for a 429 that says when to come
    back)."""


@dataclass(frozen=True)
class Drop:
    """No answer at all: the connection is closed once the request is read (a server that
    crashed or a proxy that gave up)."""


@dataclass(frozen=True)
class Raw:
    """Any body, as is."""

    body: bytes
    content_type: str = "application/json"
    code: int = 200


Answer = dict[str, Any] | Status | Raw | Drop
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
class Refusal:
    """Why a real server would refuse a request: the HTTP status and its error message."""

    code: int
    message: str
    param: str | None = None


def _bad(message: str, param: str | None = None) -> Refusal:
    return Refusal(400, message, param)


def _type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def _content_problem(role: str, content: Any, where: str, *, optional: bool) -> Refusal | None:
    if content is None:
        if optional:
            return None
        return _bad(f"Invalid value for '{where}': expected a string, got null.", where)
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return _bad(
            f"Invalid type for '{where}': expected one of a string or array of objects, "
            f"but got {_type(content)} instead.",
            where,
        )
    allowed = _PART_TYPES if role == "user" else ("text",)
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            shown = json.dumps(kind) if isinstance(kind, str) else _type(part)
            return _bad(
                f"Invalid value: {shown}. Supported values for '{where}[{i}].type' are: "
                + ", ".join(f"'{t}'" for t in allowed)
                + ".",
                f"{where}[{i}].type",
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            return _bad(f"Invalid type for '{where}[{i}].text': expected a string.", where)
    return None


def _tool_calls_problem(calls: Any, where: str, pending: dict[str, str]) -> Refusal | None:
    if not isinstance(calls, list) or not calls:
        return _bad(f"Invalid type for '{where}': expected a non-empty array of tool calls.", where)
    for i, call in enumerate(calls):
        at = f"{where}[{i}]"
        if not isinstance(call, dict):
            return _bad(f"Invalid type for '{at}': expected an object.", at)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            return _bad(f"Missing required parameter: '{at}.id'.", f"{at}.id")
        if call_id in pending:
            return _bad(f"Duplicate tool call id '{call_id}' in '{where}'.", f"{at}.id")
        if call.get("type") != "function":
            return _bad(f"Invalid value for '{at}.type': expected 'function'.", f"{at}.type")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return _bad(f"Missing required parameter: '{at}.function.name'.", f"{at}.function")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            return _bad(
                f"Invalid type for '{at}.function.arguments': expected a string, "
                f"but got {_type(arguments)} instead.",
                f"{at}.function.arguments",
            )
        try:
            parsed = json.loads(arguments)
        except ValueError as error:
            # llama.cpp's server: an internal error, and the same request fails again.
            return Refusal(500, f"Failed to parse tool call arguments as JSON: {error}")
        if not isinstance(parsed, dict):
            return Refusal(500, f"Tool call arguments must be a JSON object, got {_type(parsed)}")
        pending[call_id] = function["name"]
    return None


def _tools_problem(body: dict[str, Any]) -> tuple[Refusal | None, set[str]]:
    tools = body.get("tools")
    names: set[str] = set()
    if tools is None:
        return None, names
    if not isinstance(tools, list):
        return _bad(
            f"Invalid type for 'tools': expected an array, got {_type(tools)}.", "tools"
        ), names
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            return _bad(f"Invalid value for '{at}.type': expected 'function'.", at), names
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            return _bad(
                f"Invalid '{at}.function.name': string does not match pattern. Expected a "
                "string that matches the pattern '^[a-zA-Z0-9_-]+$' (at most 64 characters).",
                f"{at}.function.name",
            ), names
        if name in names:
            return _bad(f"Duplicate tool name '{name}' in 'tools'.", at), names
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if parameters is not None and not isinstance(parameters, dict):
            return _bad(
                f"Invalid type for '{at}.function.parameters': expected an object.", at
            ), names
        names.add(name)
    return None, names


def _tool_choice_problem(body: dict[str, Any], names: set[str]) -> Refusal | None:
    if "tool_choice" not in body:
        return None
    choice = body["tool_choice"]
    if not names:
        return _bad(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
            "specified.",
            "tool_choice",
        )
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            return _bad(
                f"Invalid value: '{choice}'. Supported values are: 'none', 'auto', and 'required'.",
                "tool_choice",
            )
        return None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        return _bad(
            "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}.',
            "tool_choice",
        )
    if name not in names:
        return _bad(
            f"Invalid value for 'tool_choice': no function named '{name}' was specified in "
            "the 'tools' parameter.",
            "tool_choice",
        )
    return None


def check_request(body: Any) -> Refusal | None:
    """Why an OpenAI-compatible server would refuse this chat completion request; None when
    it would take it. As strict as OpenAI's API and llama.cpp's server are: roles and content
    types valid, tool call arguments JSON text of an object, every assistant tool call id
    answered by exactly one tool message before the next assistant or user message, and tool
    messages answering only the calls made; and as chat templates that want user and
    assistant turns to alternate are: no two user (or assistant) messages in a row."""
    if not isinstance(body, dict):
        return _bad("We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _bad("Missing required parameter: 'model'.", "model")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        return _bad(
            f"Invalid 'max_tokens': expected an integer >= 1, got {json.dumps(max_tokens)}.",
            "max_tokens",
        )
    problem, names = _tools_problem(body)
    if problem is not None:
        return problem
    problem = _tool_choice_problem(body, names)
    if problem is not None:
        return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad("Invalid 'messages': expected a non-empty array.", "messages")
    pending: dict[str, str] = {}
    """Tool call ids of the last assistant message not answered yet."""
    answered: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return _bad(f"Invalid type for '{where}': expected an object.", where)
        role = message.get("role")
        if role not in ROLES:
            return _bad(
                f"Invalid value: {json.dumps(role)}. Supported values are: 'system', "
                "'assistant', 'user', 'tool', and 'developer'.",
                f"{where}.role",
            )
        previous = messages[i - 1].get("role") if i and isinstance(messages[i - 1], dict) else None
        if role in ("user", "assistant") and role == previous:
            # Chat templates that want turns to alternate (Gemma's, Mistral's) raise this.
            return Refusal(
                500,
                "Conversation roles must alternate user/assistant/user/assistant/... "
                f"(messages[{i - 1}] and messages[{i}] are both {role})",
            )
        if role != "tool" and pending:
            return _bad(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                "response messages: " + ", ".join(sorted(pending)),
                f"{where}.role",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                return _bad(f"Missing required parameter: '{where}.tool_call_id'.", where)
            if call_id not in pending:
                said = "was already answered" if call_id in answered else "is not a call made"
                return _bad(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceding message with 'tool_calls' ('{call_id}' {said}).",
                    f"{where}.tool_call_id",
                )
            del pending[call_id]
            answered.add(call_id)
            problem = _content_problem("tool", message.get("content"), f"{where}.content",
                                       optional=False)  # fmt: skip
        elif role == "assistant":
            answered = set()
            calls = message.get("tool_calls")
            if calls is not None:
                problem = _tool_calls_problem(calls, f"{where}.tool_calls", pending)
                if problem is not None:
                    return problem
            problem = _content_problem(
                "assistant", message.get("content"), f"{where}.content", optional=bool(calls)
            )
        else:
            answered = set()
            problem = _content_problem(role, message.get("content"), f"{where}.content",
                                       optional=False)  # fmt: skip
        if problem is not None:
            return problem
    if pending:
        return _bad(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            "response messages: " + ", ".join(sorted(pending)),
            "messages",
        )
    return None


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    path: str
    body: dict[str, Any]
    authorization: str | None
    """The Authorization header as sent (tests check a key arrived, or none did)."""
    method: str = "POST"
    at: float = 0.0
    """When it was received (``time.time()``)."""

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
    strict: bool = True
    """Refuse what a real server refuses (:func:`check_request`) before answering."""
    refused: list[Refusal] = field(default_factory=list)
    """The requests refused by the check, in order."""
    answered_at: list[float] = field(default_factory=list)
    """When each chat completion was answered (``time.time()`` once the answer was sent)."""
    delay: tuple[float, float] = (0.0, 0.0)
    """Seconds each chat completion takes before it is answered (after the check): drawn
    evenly from this range, as a model that thinks for a while (:meth:`thinking`)."""
    delay_seed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _random: random.Random | None = None
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

    def thinking(self) -> float:
        """The next answer's delay (seeded: the same run of answers waits the same)."""
        low, high = self.delay
        if high <= 0:
            return 0.0
        with self._lock:
            if self._random is None:
                self._random = random.Random(self.delay_seed)
            return self._random.uniform(low, high)

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

        def _send(
            self,
            code: int,
            body: bytes,
            content_type: str = "application/json",
            headers: Sequence[tuple[str, str]] = (),
        ) -> None:
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
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
            record = Recorded(self.path, body, self.headers.get("Authorization"), at=time.time())
            with model._lock:
                model.requests.append(record)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, b'{"error": {"message": "not found"}}')
                return
            refusal = check_request(body) if model.strict else None
            if refusal is not None:
                with model._lock:
                    model.refused.append(refusal)
                kind = "invalid_request_error" if refusal.code == 400 else "server_error"
                error = {"error": {"message": refusal.message, "type": kind,
                                   "param": refusal.param, "code": None}}  # fmt: skip
                self._send(refusal.code, json.dumps(error).encode())
                return
            pause = model.thinking()
            if pause > 0:
                time.sleep(pause)
            answer = model._next(body)
            if isinstance(answer, Drop):
                self.close_connection = True  # and no answer: the client sees it closed
            elif isinstance(answer, Status):
                error = {"error": {"message": answer.message, "type": "scripted", "code": None}}
                self._send(answer.code, json.dumps(error).encode(), headers=answer.headers)
            elif isinstance(answer, Raw):
                self._send(answer.code, answer.body, answer.content_type)
            else:
                self._send(200, json.dumps(answer).encode())
                with model._lock:
                    model.answered_at.append(time.time())

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
