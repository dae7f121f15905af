"""Tools from MCP servers, the pure part: which of a server's tools are offered, what their
definitions are pinned to, whether a server still lists a tool as it was pinned, and what a
call's result is as the run records it and the model reads it.

The I/O (``tools/list`` and ``tools/call`` over streamable HTTP) runs in the run's step pods
(:mod:`agentrun.pod.mcp`), which use these functions, so that what a pod checks and what the
operator checks are the same code.

Work in progress: the agent loop does not call this module yet (see :mod:`agentrun.api.mcp`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrun.api import mcp as api
from agentrun.core import naming
from agentrun.core.calls import schema_problem
from agentrun.core.envelope import clean, summary_line

META_IDEMPOTENCY_KEY = "agentrun.dev/idempotencyKey"
"""The key of a call's ``_meta`` that carries the step attempt's idempotency key (the same in
every attempt of the call), so that a server can answer a repeated call without acting twice."""
DEFINITION_KEYS = ("name", "description", "inputSchema", "outputSchema")
"""What of a listed tool is its definition: what the model is told and what its arguments and
result are checked against. Annotations and ``_meta`` are hints and are not pinned."""


def definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The definition of a tool as ``tools/list`` gave it (its JSON, camelCase keys)."""
    return {k: tool[k] for k in DEFINITION_KEYS if tool.get(k) is not None}


def tool_digest(tool: Mapping[str, Any]) -> str:
    """sha256 of the tool's definition as canonical JSON."""
    return naming.sha256_text(naming.canonical_json(definition(tool)))


@dataclass
class Discovery:
    """What discovery of one server found: the allowed tools with their definitions, pinned;
    and what is wrong (an allowed tool the server does not list, a definition that cannot be
    offered). A discovery with problems offers none of the server's tools."""

    server: str
    pinned: list[api.PinnedTool] = field(default_factory=list)
    definitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """The discovery step's result: what the operator pins and offers."""
        return {
            "server": self.server,
            "tools": [
                {**self.definitions[p.name], "digest": p.digest}
                for p in self.pinned
                if p.name in self.definitions
            ],
            "problems": list(self.problems),
        }


def _definition_problem(tool: Mapping[str, Any]) -> str | None:
    schema = tool.get("inputSchema")
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return "its inputSchema is not a JSON Schema of an object"
    size = len(naming.canonical_json(definition(tool)).encode())
    if size > api.MAX_TOOL_DEFINITION:
        return f"its definition is {size} bytes, more than the {api.MAX_TOOL_DEFINITION} allowed"
    return None


def pin(server: api.McpServer, listed: Sequence[Mapping[str, Any]]) -> Discovery:
    """Pin the tools ``server`` allows among those it ``listed`` (``tools/list``, all pages).
    Tools it lists but does not allow are left out: they are never offered or called."""
    found = Discovery(server=server.name)
    by_name: dict[str, Mapping[str, Any]] = {}
    for tool in listed:
        name = tool.get("name")
        if not isinstance(name, str):
            continue
        if name in by_name:
            found.problems.append(f"the server lists the tool {clean(name)[:64]} twice")
        by_name[name] = tool
    for allowed in server.tools:
        listed_tool = by_name.get(allowed.name)
        if listed_tool is None:
            found.problems.append(
                f"the server does not list the tool {allowed.name} "
                f"(it lists: {', '.join(sorted(clean(n)[:48] for n in by_name)[:16]) or 'none'})"
            )
            continue
        tool = listed_tool
        problem = _definition_problem(tool)
        if problem is not None:
            found.problems.append(f"the tool {allowed.name} cannot be offered: {problem}")
            continue
        found.definitions[allowed.name] = definition(tool)
        found.pinned.append(
            api.PinnedTool(server=server.name, name=allowed.name, digest=tool_digest(tool))
        )
    return found


def check(
    pinned: api.PinnedTool, listed: Iterable[Mapping[str, Any]], arguments: Any = None
) -> str | None:
    """Why a call to ``pinned`` may not be sent, given what the server lists now: the tool is
    gone, its definition is not the one pinned at discovery, or (when given) the ``arguments``
    do not match the pinned inputSchema. None when it may."""
    for tool in listed:
        if tool.get("name") != pinned.name:
            continue
        digest = tool_digest(tool)
        if digest == pinned.digest:
            if arguments is None:
                return None
            problem = arguments_problem(tool, arguments)
            return f"{problem}: the call was not sent" if problem else None
        return (
            f"the server {pinned.server} changed the tool {pinned.name} since it was "
            f"discovered (definition {digest[:12]}, pinned {pinned.digest[:12]}): the call was "
            "not sent"
        )
    return (
        f"the server {pinned.server} no longer lists the tool {pinned.name}: the call was not sent"
    )


def arguments_problem(tool: Mapping[str, Any], arguments: Any) -> str | None:
    """Why ``arguments`` may not be sent to ``tool`` (its listed definition): they are not an
    object, or do not match its inputSchema. None when they may."""
    if not isinstance(arguments, dict):
        return f"the arguments must be a JSON object, not {type(arguments).__name__}"
    schema = tool.get("inputSchema")
    if not isinstance(schema, Mapping):
        return f"the tool {clean(str(tool.get('name')))[:48]} has no inputSchema"
    return schema_problem(dict(schema), arguments)


def offered(discoveries: Iterable[Discovery]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """The discovered tools as the model is offered them: (name, description, parameters), the
    form :func:`agentrun.core.context.tool_definitions` takes. A server whose discovery has
    problems offers nothing."""
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for found in discoveries:
        if found.problems:
            continue
        for p in found.pinned:
            d = found.definitions[p.name]
            out.append((p.name, str(d.get("description") or p.name), d["inputSchema"]))
    return out


def name_conflicts(container_tools: Iterable[str], servers: Sequence[api.McpServer]) -> list[str]:
    """Tool names offered twice (by spec.agent.tools and a server, or by two servers): the
    model calls tools by name, so each must be unique."""
    seen: dict[str, str] = {name: "spec.agent.tools" for name in container_tools}
    servers_seen: set[str] = set()
    problems: list[str] = []
    for server in servers:
        if server.name in servers_seen:
            problems.append(f"two MCP servers are named {server.name}")
        servers_seen.add(server.name)
        for tool in server.tools:
            where = f"MCP server {server.name}"
            if tool.name in seen:
                problems.append(f"the tool {tool.name} is offered by {seen[tool.name]} and {where}")
            else:
                seen[tool.name] = where
    return problems


def call_meta(idempotency_key: str) -> dict[str, str]:
    """The ``_meta`` of a call's ``tools/call`` request."""
    return {META_IDEMPOTENCY_KEY: idempotency_key} if idempotency_key else {}


def call_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """A ``tools/call`` result (its JSON) as the call's step records it: content,
    structuredContent and isError, nothing else the server sent."""
    out: dict[str, Any] = {
        "isError": bool(result.get("isError", False)),
        "content": list(result.get("content") or []),
    }
    if result.get("structuredContent") is not None:
        out["structuredContent"] = result["structuredContent"]
    return out


def result_summary(recorded: Mapping[str, Any]) -> str:
    """The first line of a recorded call result: its first text content (``error:`` first when
    the server answered isError), else its structured content."""
    text = next(
        (
            str(c.get("text"))
            for c in recorded.get("content") or []
            if isinstance(c, Mapping) and c.get("type") == "text"
        ),
        None,
    )
    if text is None and recorded.get("structuredContent") is not None:
        text = naming.canonical_json(recorded["structuredContent"])
    if text is None:
        text = f"{len(recorded.get('content') or [])} content blocks"
    line = summary_line(text)
    return f"error: {line}" if recorded.get("isError") else line
