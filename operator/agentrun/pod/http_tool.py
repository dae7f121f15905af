"""``agentrun step http``: a call of an HTTP tool of an agent run, inside the step's pod (in
the run's namespace, with the run's identity: never from the operator's own pod), or on the
run's executor (:mod:`agentrun.pod.executor`), which runs :func:`outcome` the same way.

It reads the tool's entry of spec.agent.tools (``AGENTRUN_HTTP_TOOL``), the values of its
headers from Secrets (``AGENTRUN_HTTP_HEADER_0`` ..., by the header's index: environment
variables taken from the Secrets the entry names; never printed) and the call's arguments
(``AGENTRUN_TOOL_ARGS``), checks the arguments against the tool's parameters again, builds
the request (:func:`agentrun.core.http_tool.request_of`: the URL filled and checked against
allowedHosts, the body, the headers, ``Idempotency-Key`` with the attempt's idempotency key)
and sends it once, connecting to the checked host and port itself (``http.client``), within
the tool's timeoutSeconds (30 s when unset).

* A response is a result, whatever its status: ``{status, reason, url, contentType, body,
  truncated, error}`` with the body cut at maxResponseBytes and any Secret header's value
  replaced (:func:`agentrun.core.http_tool.response_record`); a status that is not 2xx has
  ``error`` and a summary beginning ``error:``, and the model reads it. The step succeeds.
* A redirect is followed only by a GET, at most 5 times, to a URL that passes the same check
  and keeps https (with the same headers: the host is one the tool allows); any other is the
  result, with why it was not followed.
* A request that could not be made (no connection, no such host, TLS, the deadline passed),
  a URL the pod refuses, or a Secret value that cannot be a header fails the attempt (exit
  code 1, one line); the tool's retry decides, and a retry sends the same idempotency key.

A result too large for the termination message is carried compressed (``resultZ``) when that
fits, else stored in a ConfigMap of the run as ``agentrun step --`` stores one.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentrun import settings as s
from agentrun.api import agent as a
from agentrun.api import http_tool as api
from agentrun.core import http_tool as core
from agentrun.core import naming
from agentrun.core.calls import schema_problem
from agentrun.core.envelope import RESULT_Z, compress_result
from agentrun.core.pod_env import ENV_CALL_TIMEOUT, ENV_HTTP_HEADER, ENV_HTTP_TOOL
from agentrun.pod import runner

READ_CHUNK = 64 * 1024


class HttpFailed(Exception):
    """The call has no result; the message says why, in one line."""


_one_line = runner.one_line


def tool_of(env: Mapping[str, str]) -> tuple[a.AgentTool, api.HttpRequest, dict[str, str]]:
    """The tool's entry, its request and the values of its Secret headers (name to value)."""
    raw = env.get(ENV_HTTP_TOOL)
    if not raw:
        raise HttpFailed(
            f"{ENV_HTTP_TOOL} is not set: this command runs as a call of an agent run's HTTP "
            "tool, which the operator starts"
        )
    try:
        tool = a.AgentTool.model_validate_json(raw)
    except ValueError as error:
        raise HttpFailed(
            f"{ENV_HTTP_TOOL} is not a tool's entry: {_one_line(error, 200)}"
        ) from None
    if tool.http is None:
        raise HttpFailed(f"the tool {tool.name} is not an HTTP tool")
    secrets: dict[str, str] = {}
    for i, header in enumerate(tool.http.headers or []):
        if header.secret_key_ref is None:
            continue
        value = env.get(f"{ENV_HTTP_HEADER}{i}")
        if value is None:
            raise HttpFailed(f"{ENV_HTTP_HEADER}{i} (the value of header {header.name}) is not set")
        problem = _header_value_problem(value)
        if problem is not None:
            ref = header.secret_key_ref
            raise HttpFailed(
                f"the value of header {header.name} (Secret {ref.name}, key {ref.key}) {problem}: "
                "put the value alone in the Secret (kubectl create secret generic ... "
                "--from-literal); the value itself is never printed"
            )
        secrets[header.name] = value
    return tool, tool.http, secrets


def _header_value_problem(value: str) -> str | None:
    for i, c in enumerate(value):
        if c in "\r\n":
            return f"has a line break (at character {i})"
        if not (0x20 <= ord(c) <= 0x7E or c == "\t"):
            return f"has a character that is not printable ASCII (at character {i})"
    return None


def arguments_of(env: Mapping[str, str], tool: a.AgentTool) -> dict[str, Any]:
    """The call's arguments, checked against the tool's parameters as the operator checked
    them."""
    try:
        arguments = runner.call_arguments(env)
    except ValueError as error:
        raise HttpFailed(str(error)) from None
    problem = schema_problem(tool.parameters, arguments)
    if problem is not None:
        raise HttpFailed(f"{problem}: the request was not sent")
    return arguments


def _deadline(env: Mapping[str, str], tool: a.AgentTool) -> float:
    seconds = float(tool.timeout_seconds or api.DEFAULT_TIMEOUT_SECONDS)
    limit = env.get(ENV_CALL_TIMEOUT)
    if limit:
        with contextlib.suppress(ValueError):  # the executor's own number: never not one
            seconds = min(seconds, float(limit))
    return time.monotonic() + seconds


Exchange = tuple[int, str, dict[str, str], bytes, bool]
"""A response: status, reason, headers (lower-case names), body (at most the limit) and
whether the body was cut."""


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the tool's timeoutSeconds passed")
    return left


def exchange(
    method: str,
    target: core.Target,
    headers: list[tuple[str, str]],
    body: bytes | None,
    limit: int,
    deadline: float,
) -> Exchange:
    """Send one request to ``target`` (its host and port, as checked) and read its response,
    at most ``limit`` bytes of its body, before ``deadline``."""
    connection: http.client.HTTPConnection
    if target.scheme == "https":
        context = ssl.create_default_context()
        connection = http.client.HTTPSConnection(
            target.host, target.port, timeout=_left(deadline), context=context
        )
    else:
        connection = http.client.HTTPConnection(target.host, target.port, timeout=_left(deadline))
    try:
        # Accept-Encoding: identity (the body is read as sent), unless the tool sets one.
        own_encoding = any(name.lower() == "accept-encoding" for name, _ in headers)
        connection.putrequest(method, target.path, skip_accept_encoding=own_encoding)
        for name, value in headers:
            connection.putheader(name, value)
        if body is not None or method in ("POST", "PUT", "PATCH"):
            connection.putheader("Content-Length", str(len(body or b"")))
        connection.endheaders(body)
        response = connection.getresponse()
        data = bytearray()
        while len(data) <= limit:
            left = _left(deadline)  # each read within what is left (the first one's at most)
            if connection.sock is not None:
                connection.sock.settimeout(left)
            chunk = response.read(min(READ_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        found = {k.lower(): v for k, v in response.getheaders()}
        return response.status, response.reason, found, bytes(data[:limit]), len(data) > limit
    finally:
        connection.close()


SendOne = Callable[[str, core.Target, list[tuple[str, str]], bytes | None, int, float], Exchange]
""":func:`exchange`, or what a test puts in its place."""


def send(
    request: core.Request,
    declared: api.HttpRequest,
    secrets: Mapping[str, str],
    deadline: float,
    send_one: SendOne = exchange,
) -> dict[str, Any]:
    """The call's recorded result: its request sent, and the redirects that may be followed
    (see the module's doc)."""
    headers = [*request.headers, *((name, secrets[name]) for name in request.secret_headers)]
    target, body, method = request.target, request.body, request.method
    for hop in range(core.MAX_REDIRECTS + 1):
        try:
            status, reason, got, data, cut = send_one(
                method, target, headers, body, declared.max_response_bytes, deadline
            )
        except TimeoutError:
            raise HttpFailed(
                f"the request to {target.url} got no answer within the tool's timeoutSeconds: "
                "stopped"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            raise HttpFailed(
                f"the request to {target.url} could not be made: {type(error).__name__}: "
                f"{_one_line(core.redact(str(error), secrets), 200)}"
            ) from None
        not_followed: str | None = None
        if status in core.REDIRECTS:
            if method != "GET":
                not_followed = f"the redirect of a {method} request is never followed"
            elif hop == core.MAX_REDIRECTS:
                not_followed = f"more than {core.MAX_REDIRECTS} redirects"
            else:
                followed = core.redirect(target, got.get("location"), declared.allowed_hosts)
                if isinstance(followed, core.Target):
                    target = followed
                    continue
                not_followed = followed
        content_type = got.get("content-type")
        return core.response_record(
            status, reason, content_type, data, cut, secrets, target.url, not_followed
        )
    raise AssertionError("unreachable")  # pragma: no cover - the last hop returns


def _envelope_text(body: dict[str, Any], store: runner.ResultStore | None) -> tuple[int, str]:
    """The termination message: the envelope as it is, compressed (``resultZ``) when only
    that fits, else its result stored by reference in ``store``."""
    text = json.dumps(body, separators=(",", ":"))
    if len(text.encode()) <= runner.INLINE_LIMIT:
        return 0, text
    packed = {k: v for k, v in body.items() if k != "result"}
    packed[RESULT_Z] = compress_result(naming.canonical_json(body["result"]))
    compact = json.dumps(packed, separators=(",", ":"))
    if len(compact.encode()) <= runner.TERMINATION_LIMIT:
        return 0, compact
    return runner.reported(body, text, 0, store)


def outcome(
    env: Mapping[str, str], store: runner.ResultStore | None, send_one: SendOne = exchange
) -> tuple[int, str]:
    """One call: its exit code and termination message."""
    secrets: dict[str, str] = {}
    try:
        tool, declared, secrets = tool_of(env)
        arguments = arguments_of(env, tool)
        deadline = _deadline(env, tool)
        try:
            request = core.request_of(declared, arguments, env.get(s.ENV_IDEMPOTENCY_KEY, ""))
        except core.Refused as refused:
            raise HttpFailed(f"{refused}: the request was not sent") from None
        record = send(request, declared, secrets, deadline, send_one)
    except Exception as raised:  # a one-line reason, never a traceback, whatever went wrong
        message = (
            str(raised)
            if isinstance(raised, HttpFailed)
            else f"the HTTP call failed: {type(raised).__name__}: {_one_line(raised)}"
        )
        message = core.redact(message, secrets)
        print(f"agentrun step http: {message}", file=sys.stderr)
        return 1, _one_line(message, runner.TERMINATION_LIMIT // 4)
    summary = core.result_summary(record)
    print(f"agentrun step http: {summary}")
    return _envelope_text({"ok": True, "summary": summary, "result": record}, store)


def run(
    env: dict[str, str] | None = None,
    store_factory: runner.StoreFactory = runner.default_store,
    send_one: SendOne = exchange,
) -> int:
    """One call's attempt in a step's pod; its exit code."""
    env = dict(os.environ if env is None else env)
    attempt = runner.begin(env, store_factory)
    code, message = outcome(env, attempt.store, send_one)
    attempt.termination.write_text(message)
    return code


def main(argv: list[str]) -> int:
    if argv:
        print("usage: agentrun step http (no arguments: the call is in its environment)",
              file=sys.stderr)  # fmt: skip
        return 2
    return run()
