"""An MCP server for the tests, made with the official SDK and served over streamable HTTP:
``python -m tests.support.mcp_server --port PORT --log FILE [--wide]``.

Tools: ``add`` (a structured result), ``fail`` (answers isError), ``echo`` (its text
repeated, as large as asked), ``rm`` (for a server entry that does not allow it). With
``--wide``, ``add`` takes a third, optional argument: the same tool with another input schema,
as a server changed mid-run lists it. Every call appends one JSON line to the log: the tool,
the idempotency key of its ``_meta`` and its Authorization header, so that a test can tell what
reached the server.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from agentrun.core.mcp import META_IDEMPOTENCY_KEY


def build(log: Path, wide: bool) -> MCPServer:
    server = MCPServer("e2e-tools", log_level="WARNING")

    def called(tool: str, ctx: Context) -> None:
        meta: Mapping[str, Any] = ctx.request_context.meta or {}
        headers = ctx.headers or {}
        line = {
            "tool": tool,
            "key": meta.get(META_IDEMPOTENCY_KEY),
            "authorization": headers.get("authorization"),
        }
        with log.open("a") as f:
            f.write(json.dumps(line) + "\n")

    if wide:

        @server.tool(name="add")
        def add_wide(a: int, b: int, ctx: Context, c: int = 0) -> int:
            """Add two integers."""
            called("add", ctx)
            return a + b + c

    else:

        @server.tool()
        def add(a: int, b: int, ctx: Context) -> int:
            """Add two integers."""
            called("add", ctx)
            return a + b

    @server.tool()
    def fail(path: str, ctx: Context) -> str:
        """Always fails."""
        called("fail", ctx)
        raise ValueError(f"no such file: {path}")

    @server.tool()
    def echo(text: str, ctx: Context, times: int = 1) -> str:
        """Its text, ``times`` times."""
        called("echo", ctx)
        return text * times

    @server.tool()
    def rm(path: str, ctx: Context) -> str:
        """Removes a file (never allowed by the tests' entries)."""
        called("rm", ctx)
        return f"removed {path}"

    return server


def calls(log: Path) -> list[dict[str, Any]]:
    """What reached the server, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--wide", action="store_true")
    args = parser.parse_args()
    build(args.log, args.wide).run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
