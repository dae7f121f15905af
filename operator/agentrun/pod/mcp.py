"""``agentrun step mcp discover|call``: a step of an agent run that talks to an MCP server,
inside the step's pod (in the run's namespace, with the run's identity: never from the
operator's own pod).

Both connect to ``url`` of the server's entry (``AGENTRUN_MCP_SERVER``: the entry of
spec.agent.mcpServers as JSON, header values excluded) over streamable HTTP with the official
``mcp`` SDK, sending the entry's headers with their values from ``AGENTRUN_MCP_HEADER_0`` ...
(environment variables taken from the Secrets the entry names; never printed).

* ``discover`` lists the server's tools (every page) and pins those the entry allows
  (:func:`agentrun.core.mcp.pin`); its result is the pinned tools with their definitions and
  digests. It fails (exit code 1, one line) when an allowed tool is missing or cannot be
  offered, or the server cannot be reached.
* ``call`` calls the pinned tool ``AGENTRUN_MCP_PINNED`` (server, name, digest) with the
  arguments in ``AGENTRUN_TOOL_ARGS``. It lists the server's tools first and refuses the call,
  unsent, when the tool's definition is not the one pinned or the arguments do not match its
  inputSchema (:func:`agentrun.core.mcp.check`);
  it sends the attempt's idempotency key in the request's ``_meta``
  (:data:`agentrun.core.mcp.META_IDEMPOTENCY_KEY`) and records the result's content,
  structuredContent and isError. A result the server marks isError is a result (the step
  succeeds and the model reads it); a call that could not be made fails the attempt. A result
  too large for the termination message goes to a ConfigMap of the run, as ``agentrun step
  --`` does, and an attempt whose result was stored before its pod was lost is not sent again.

A call may also run on the run's executor instead of a pod of its own
(:mod:`agentrun.pod.executor`, :func:`outcome`), stopped after the tool's timeoutSeconds.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from agentrun import settings as s
from agentrun.api import mcp as api
from agentrun.core import mcp as core
from agentrun.pod import runner

if TYPE_CHECKING:
    import httpx2

ENV_SERVER = "AGENTRUN_MCP_SERVER"
ENV_HEADER = "AGENTRUN_MCP_HEADER_"
"""``AGENTRUN_MCP_HEADER_0`` ...: the values of the entry's headers, in its order."""
ENV_PINNED = "AGENTRUN_MCP_PINNED"
ENV_TOOL_ARGS = "AGENTRUN_TOOL_ARGS"
MAX_PAGES = 64
"""Most pages of ``tools/list`` read."""
READ_TIMEOUT = 300.0

Connect = Callable[[api.McpServer, Mapping[str, str]], AbstractAsyncContextManager[Any]]
"""Opens a connected ``mcp.Client`` to a server, given the header values."""


class McpFailed(Exception):
    """The step cannot produce a result; the message says why, in one line."""


_one_line = runner.one_line


def _leaf(error: BaseException) -> BaseException:
    """The first error an exception group (what the SDK's task groups raise) holds."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def server_of(env: Mapping[str, str]) -> tuple[api.McpServer, dict[str, str]]:
    """The server's entry and its headers (name to value) from the environment."""
    raw = env.get(ENV_SERVER)
    if not raw:
        raise McpFailed(
            f"{ENV_SERVER} is not set: this command runs as a step of an agent run with MCP "
            "servers, which the operator starts"
        )
    try:
        server = api.McpServer.model_validate_json(raw)
    except ValueError as error:
        raise McpFailed(f"{ENV_SERVER} is not a server entry: {_one_line(error, 200)}") from None
    headers: dict[str, str] = {}
    for i, header in enumerate(server.headers or []):
        value = env.get(f"{ENV_HEADER}{i}")
        if value is None:
            raise McpFailed(f"{ENV_HEADER}{i} (the value of header {header.name}) is not set")
        headers[header.name] = value
    return server, headers


HTTP_TIMEOUT = 30.0
"""Seconds to connect, write a request or wait for a pooled connection (the SDK's default)."""
HTTP_READ_TIMEOUT = 300.0
"""Seconds a read may wait: a server may hold a response stream open (the SDK's default)."""


def http_client(headers: Mapping[str, str]) -> httpx2.AsyncClient:
    """The HTTP client :func:`connect_http` hands the SDK's public ``streamable_http_client``.

    Built here, with httpx2 (the SDK's HTTP library) directly, rather than with the SDK's
    private helper: the same timeouts as its default client (30 s, reads 300 s) and redirects
    not followed by the client (the transport follows one itself only within the server's
    origin).
    """
    import httpx2

    return httpx2.AsyncClient(
        headers=dict(headers),
        timeout=httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT),
        follow_redirects=False,
    )


@asynccontextmanager
async def connect_http(server: api.McpServer, headers: Mapping[str, str]) -> AsyncIterator[Any]:
    """A client of ``server.url`` over streamable HTTP, sending ``headers``."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (
        http_client(headers) as http,
        Client(
            streamable_http_client(server.url, http_client=http),
            read_timeout_seconds=READ_TIMEOUT,
            cache=None,
        ) as client,
    ):
        yield client


async def list_tools(client: Any) -> list[dict[str, Any]]:
    """Every tool the server lists (all pages), as JSON."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise McpFailed(f"the server lists more than {MAX_PAGES} pages of tools")


async def discover(client: Any, server: api.McpServer) -> core.Discovery:
    return core.pin(server, await list_tools(client))


async def call(
    client: Any, pinned: api.PinnedTool, arguments: dict[str, Any], idempotency_key: str
) -> dict[str, Any]:
    """The recorded result of one call, after checking the tool is still as pinned."""
    refusal = core.check(pinned, await list_tools(client), arguments)
    if refusal is not None:
        raise McpFailed(refusal)
    result = await client.call_tool(
        pinned.name, arguments, meta=core.call_meta(idempotency_key) or None
    )
    return core.call_result(result.model_dump(mode="json", by_alias=True, exclude_none=True))


def _arguments(env: Mapping[str, str]) -> dict[str, Any]:
    try:
        return runner.call_arguments(env)
    except ValueError as error:
        raise McpFailed(str(error)) from None


def _pinned(env: Mapping[str, str], server: api.McpServer) -> api.PinnedTool:
    try:
        pinned = api.PinnedTool.model_validate_json(env.get(ENV_PINNED) or "")
    except ValueError as error:
        raise McpFailed(f"{ENV_PINNED} is not a pinned tool: {_one_line(error, 200)}") from None
    if pinned.server != server.name or pinned.name not in {t.name for t in server.tools}:
        raise McpFailed(f"the tool {pinned.name} is not allowed by the server entry {server.name}")
    return pinned


async def _work(
    action: str, env: Mapping[str, str], connect: Connect, timeout: float | None = None
) -> dict[str, Any]:
    """The step's envelope (ok, summary, result); a discovery or a call stopped after
    ``timeout`` seconds."""
    server, headers = server_of(env)
    if action == "discover":
        try:
            with anyio.fail_after(timeout):
                async with connect(server, headers) as client:
                    found = await discover(client, server)
        except TimeoutError:
            raise McpFailed(
                f"the tools of MCP server {server.name} were not listed within {timeout:g} s "
                "(its timeoutSeconds): stopped"
            ) from None
        if found.problems:
            raise McpFailed(f"MCP server {server.name}: " + "; ".join(found.problems))
        names = ", ".join(p.name for p in found.pinned)
        return {
            "ok": True,
            "summary": f"MCP server {server.name}: {len(found.pinned)} tools ({names})",
            "result": found.to_wire(),
        }
    pinned = _pinned(env, server)
    arguments = _arguments(env)
    key = env.get(s.ENV_IDEMPOTENCY_KEY, "")
    try:
        with anyio.fail_after(timeout):
            async with connect(server, headers) as client:
                recorded = await call(client, pinned, arguments, key)
    except TimeoutError:
        raise McpFailed(
            f"the call of {pinned.name} did not end within {timeout:g} s (the tool's "
            "timeoutSeconds): stopped"
        ) from None
    return {"ok": True, "summary": core.result_summary(recorded), "result": recorded}


def outcome(
    action: str,
    env: Mapping[str, str],
    store: runner.ResultStore | None,
    connect: Connect = connect_http,
    timeout: float | None = None,
) -> tuple[int, str]:
    """One discovery or call: its exit code and termination message (the result stored by
    reference in ``store`` when the message would not hold it)."""
    try:
        body = anyio.run(_work, action, env, connect, timeout)
    except Exception as raised:  # a one-line reason, never a traceback, whatever went wrong
        error = _leaf(raised)
        message = (
            str(error)
            if isinstance(error, McpFailed)
            else f"the MCP {action} failed: {type(error).__name__}: {_one_line(error)}"
        )
        print(f"agentrun step mcp {action}: {message}", file=sys.stderr)
        return 1, _one_line(message, runner.TERMINATION_LIMIT // 4)
    text = json.dumps(body["result"], separators=(",", ":"))
    print(f"agentrun step mcp {action}: {body['summary']}")
    return runner.reported(body, text, 0, store)


def run(
    action: str,
    env: dict[str, str] | None = None,
    connect: Connect = connect_http,
    store_factory: Callable[
        [runner.StepIdentity, dict[str, str]], runner.ResultStore | None
    ] = runner.default_store,
) -> int:
    """One discovery or call attempt in a step's pod; its exit code."""
    env = dict(os.environ if env is None else env)
    attempt = runner.begin(env, store_factory)
    code, message = outcome(action, env, attempt.store, connect)
    attempt.termination.write_text(message)
    return code


def main(argv: list[str]) -> int:
    if argv not in (["discover"], ["call"]):
        print("usage: agentrun step mcp discover|call", file=sys.stderr)
        return 2
    return run(argv[0])
