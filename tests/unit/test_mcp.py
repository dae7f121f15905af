"""Tools from MCP servers: pinning and checking tool definitions (agentrun.core.mcp), and the
discovery and call steps (agentrun.pod.mcp) against a server made with the official SDK, in
process (the streamable HTTP transport is the SDK's own)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer

from agentrun import cli
from agentrun import settings as s
from agentrun.api import mcp as api
from agentrun.core import mcp as core
from agentrun.core.executor import call_digest
from agentrun.core.naming import sha256_text
from agentrun.pod import executor, runner
from agentrun.pod import mcp as pod
from tests.support.stores import FakeStore

ADD = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def _server(*tools: str, headers: int = 0) -> api.McpServer:
    return api.McpServer.model_validate(
        {
            "name": "calc",
            "url": "http://127.0.0.1:1/mcp",
            "tools": [{"name": t} for t in tools],
            "headers": [
                {"name": f"X-H{i}", "secretKeyRef": {"name": "mcp", "key": f"h{i}"}}
                for i in range(headers)
            ]
            or None,
        }
    )


# -- the pure part ------------------------------------------------------------------------------


def test_a_digest_covers_the_definition_and_nothing_else() -> None:
    reordered = {k: ADD[k] for k in reversed(list(ADD))}
    assert core.tool_digest(reordered) == core.tool_digest(ADD)
    assert core.tool_digest({**ADD, "annotations": {"readOnlyHint": True}}) == core.tool_digest(ADD)
    assert core.tool_digest({**ADD, "description": "Add, and mail the sum."}) != core.tool_digest(
        ADD
    )
    changed = {**ADD, "inputSchema": {**ADD["inputSchema"], "required": ["a"]}}  # type: ignore[dict-item]
    assert core.tool_digest(changed) != core.tool_digest(ADD)


def test_only_allowed_tools_are_pinned_and_offered() -> None:
    found = core.pin(_server("add"), [ADD, {**ADD, "name": "rm"}])
    assert found.problems == []
    assert [(p.server, p.name, p.digest) for p in found.pinned] == [
        ("calc", "add", core.tool_digest(ADD))
    ]
    assert core.offered([found]) == [("add", "Add two integers.", ADD["inputSchema"])]
    assert [t["name"] for t in found.to_wire()["tools"]] == ["add"]


def test_an_allowed_tool_the_server_does_not_list_offers_nothing() -> None:
    found = core.pin(_server("add", "mul"), [ADD])
    assert found.problems == ["the server does not list the tool mul (it lists: add)"]
    assert core.offered([found]) == []


def test_a_tool_whose_input_is_not_an_object_is_not_offered() -> None:
    found = core.pin(_server("add"), [{**ADD, "inputSchema": {"type": "string"}}])
    assert found.pinned == []
    assert "not a JSON Schema of an object" in found.problems[0]


def test_a_call_is_checked_against_the_pinned_definition() -> None:
    pinned = core.pin(_server("add"), [ADD]).pinned[0]
    assert core.check(pinned, [ADD]) is None
    changed = {**ADD, "inputSchema": {**ADD["inputSchema"], "required": []}}  # type: ignore[dict-item]
    said = core.check(pinned, [changed])
    assert said is not None and "changed the tool add since it was discovered" in said
    assert core.check(pinned, [ADD], {"a": 1, "b": 2}) is None
    bad = core.check(pinned, [ADD], {"a": "one"})
    assert bad is not None and bad.startswith("the arguments do not match the tool's parameters")
    assert bad.endswith(": the call was not sent")
    gone = core.check(pinned, [])
    assert gone is not None and "no longer lists the tool add" in gone


def test_tool_names_are_unique_across_containers_and_servers() -> None:
    other = api.McpServer.model_validate({**_server("add").to_wire(), "name": "other"})
    assert core.name_conflicts(["search"], [_server("add"), other]) == [
        "the tool add is offered by MCP server calc and MCP server other"
    ]
    assert core.name_conflicts(["add"], [_server("add")]) == [
        "the tool add is offered by spec.agent.tools and MCP server calc"
    ]
    assert core.name_conflicts(["search"], [_server("add")]) == []


def test_a_call_result_keeps_content_structured_content_and_is_error() -> None:
    recorded = core.call_result(
        {
            "content": [{"type": "text", "text": "3"}],
            "structuredContent": {"result": 3},
            "isError": False,
            "_meta": {"x": 1},
            "resultType": "complete",
        }
    )
    assert recorded == {
        "isError": False,
        "content": [{"type": "text", "text": "3"}],
        "structuredContent": {"result": 3},
    }
    assert core.result_summary(recorded) == "3"
    failed = core.call_result({"content": [{"type": "text", "text": "no such file"}], "isError": 1})
    assert failed == {"isError": True, "content": [{"type": "text", "text": "no such file"}]}
    assert core.result_summary(failed) == "error: no such file"


# -- the steps, against a server made with the SDK ----------------------------------------------


class Calc:
    """A server with add (structured), fail (isError), echo, key (echoes the idempotency key it was
    sent) and rm (never allowed); ``wide`` gives add another input schema."""

    def __init__(self, wide: bool = False) -> None:
        self.calls: list[str] = []
        self.server = MCPServer("calc")
        calls = self.calls

        if wide:

            @self.server.tool(name="add")
            def add_wide(a: int, b: int, c: int = 0) -> int:
                """Add two integers."""
                calls.append("add")
                return a + b + c

        else:

            @self.server.tool()
            def add(a: int, b: int) -> int:
                """Add two integers."""
                calls.append("add")
                return a + b

        @self.server.tool()
        def fail(path: str) -> str:
            """Always fails."""
            calls.append("fail")
            raise ValueError(f"no such file: {path}")

        @self.server.tool()
        def key(ctx: Context) -> str:
            """The idempotency key of the call."""
            calls.append("key")
            meta: Mapping[str, Any] = ctx.request_context.meta or {}
            return str(meta.get(core.META_IDEMPOTENCY_KEY))

        @self.server.tool()
        def echo(text: str) -> str:
            """Its text."""
            calls.append("echo")
            return text

        @self.server.tool()
        def rm(path: str) -> str:
            """Not allowed."""
            calls.append("rm")
            return path


def _connect(calc: Calc, seen: list[Mapping[str, str]] | None = None) -> pod.Connect:
    @asynccontextmanager
    async def connect(server: api.McpServer, headers: Mapping[str, str]) -> AsyncIterator[Any]:
        if seen is not None:
            seen.append(dict(headers))
        async with Client(calc.server) as client:
            yield client

    return connect


def _env(tmp_path: Path, server: api.McpServer, **more: str) -> dict[str, str]:
    return {
        s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination"),
        pod.ENV_SERVER: json.dumps(server.to_wire()),
        **more,
    }


def _termination(tmp_path: Path) -> str:
    return (tmp_path / "termination").read_text()


def _no_store(identity: runner.StepIdentity, env: dict[str, str]) -> None:
    return None


def _pinned(tmp_path: Path, calc: Calc, server: api.McpServer) -> api.PinnedTool:
    assert pod.run("discover", _env(tmp_path, server), _connect(calc), _no_store) == 0
    found = json.loads(_termination(tmp_path))["result"]
    tool = found["tools"][0]
    return api.PinnedTool(server=server.name, name=tool["name"], digest=tool["digest"])


def test_discovery_pins_the_allowed_tools_with_their_definitions(tmp_path: Path) -> None:
    server = _server("add", "fail", headers=1)
    seen: list[Mapping[str, str]] = []
    env = _env(tmp_path, server, **{f"{pod.ENV_HEADER}0": "Bearer t0ken"})
    assert pod.run("discover", env, _connect(Calc(), seen), _no_store) == 0
    envelope = json.loads(_termination(tmp_path))
    assert envelope["ok"] is True
    assert envelope["summary"] == "MCP server calc: 2 tools (add, fail)"
    tools = envelope["result"]["tools"]
    assert [t["name"] for t in tools] == ["add", "fail"]
    for tool in tools:
        assert tool["digest"] == core.tool_digest(tool)
        assert tool["inputSchema"]["type"] == "object"
    assert seen == [{"X-H0": "Bearer t0ken"}]
    assert "t0ken" not in _termination(tmp_path)


def test_discovery_fails_in_one_line_when_an_allowed_tool_is_missing(tmp_path: Path) -> None:
    assert pod.run("discover", _env(tmp_path, _server("add", "mul")), _connect(Calc()), _no_store)
    said = _termination(tmp_path)
    assert said.startswith("MCP server calc: the server does not list the tool mul")
    assert "\n" not in said


def test_a_header_without_its_value_fails_before_connecting(tmp_path: Path) -> None:
    seen: list[Mapping[str, str]] = []
    env = _env(tmp_path, _server("add", headers=1))
    assert pod.run("discover", env, _connect(Calc(), seen), _no_store) == 1
    assert seen == []
    assert "AGENTRUN_MCP_HEADER_0 (the value of header X-H0) is not set" in _termination(tmp_path)


def test_a_call_sends_the_idempotency_key_and_records_the_result(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("add", "key")
    add = _pinned(tmp_path, calc, server)
    env = _env(
        tmp_path,
        server,
        **{
            pod.ENV_PINNED: add.model_dump_json(),
            pod.ENV_TOOL_ARGS: '{"a": 2, "b": 3}',
            s.ENV_IDEMPOTENCY_KEY: "uid:1:call_1:abc",
        },
    )
    assert pod.run("call", env, _connect(calc), _no_store) == 0
    envelope = json.loads(_termination(tmp_path))
    assert envelope == {
        "ok": True,
        "summary": "5",
        "result": {
            "isError": False,
            "content": [{"type": "text", "text": "5"}],
            "structuredContent": {"result": 5},
        },
    }
    assert calc.calls == ["add"]


def test_the_idempotency_key_reaches_the_server_in_meta(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("key")
    key = _pinned(tmp_path, calc, server)
    env = _env(
        tmp_path,
        server,
        **{pod.ENV_PINNED: key.model_dump_json(), s.ENV_IDEMPOTENCY_KEY: "uid:1:call_1:abc"},
    )
    assert pod.run("call", env, _connect(calc), _no_store) == 0
    assert json.loads(_termination(tmp_path))["result"]["structuredContent"] == {
        "result": "uid:1:call_1:abc"
    }


def test_a_result_the_server_marks_is_error_is_recorded_for_the_model(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("fail")
    fail = _pinned(tmp_path, calc, server)
    env = _env(
        tmp_path,
        server,
        **{pod.ENV_PINNED: fail.model_dump_json(), pod.ENV_TOOL_ARGS: '{"path": "/x"}'},
    )
    assert pod.run("call", env, _connect(calc), _no_store) == 0
    envelope = json.loads(_termination(tmp_path))
    assert envelope["ok"] is True
    assert envelope["result"]["isError"] is True
    assert envelope["summary"].startswith("error: ")
    assert calc.calls == ["fail"]


def test_a_tool_the_entry_does_not_allow_is_never_called(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("add")
    rm = api.PinnedTool(server="calc", name="rm", digest="0" * 64)
    env = _env(
        tmp_path,
        server,
        **{pod.ENV_PINNED: rm.model_dump_json(), pod.ENV_TOOL_ARGS: '{"path": "/"}'},
    )
    assert pod.run("call", env, _connect(calc), _no_store) == 1
    assert _termination(tmp_path) == "the tool rm is not allowed by the server entry calc"
    assert calc.calls == []


def test_a_tool_changed_since_discovery_is_refused_unsent(tmp_path: Path) -> None:
    server = _server("add")
    add = _pinned(tmp_path, Calc(), server)
    changed = Calc(wide=True)
    env = _env(
        tmp_path,
        server,
        **{pod.ENV_PINNED: add.model_dump_json(), pod.ENV_TOOL_ARGS: '{"a": 1, "b": 2}'},
    )
    assert pod.run("call", env, _connect(changed), _no_store) == 1
    assert "changed the tool add since it was discovered" in _termination(tmp_path)
    assert changed.calls == []


def test_a_large_result_is_stored_by_reference(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("echo")
    echo = _pinned(tmp_path, calc, server)
    text = "".join(f"{i:05d}/" for i in range(2000))
    env = _env(
        tmp_path,
        server,
        **{
            pod.ENV_PINNED: echo.model_dump_json(),
            pod.ENV_TOOL_ARGS: json.dumps({"text": text}),
            s.ENV_RUN: "r",
            s.ENV_NAMESPACE: "ns",
            s.ENV_RUN_UID: "u",
            s.ENV_STEP: "t1-0-echo",
            s.ENV_IDEMPOTENCY_KEY: "u:1:c:h",
        },
    )
    stores: list[FakeStore] = []

    def store(identity: runner.StepIdentity, env: dict[str, str]) -> FakeStore:
        stores.append(FakeStore(identity))
        return stores[-1]

    assert pod.run("call", env, _connect(calc), store) == 0
    envelope = json.loads(_termination(tmp_path))
    stored = stores[0].objects[envelope["resultRef"]["name"]]["result"]
    assert envelope["resultDigest"] == sha256_text(stored)
    assert json.loads(stored)["structuredContent"] == {"result": text}
    # A second attempt of the same call finds a stored result under the same key: it proves
    # nothing of who wrote it, so the call is made again (with the same idempotency key).
    assert pod.run("call", env, _connect(calc), lambda i, e: stores[0]) == 0
    assert "replayed" not in json.loads(_termination(tmp_path))
    assert calc.calls == ["echo", "echo"]


@pytest.mark.parametrize("argv", [[], ["list"], ["call", "x"]])
def test_the_command_takes_one_action(argv: list[str]) -> None:
    assert pod.main(argv) == 2
    assert cli.main(["step", "mcp", *argv]) == 2


def test_agentrun_step_mcp_runs_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a server entry: the step fails in one line, before any connection."""
    termination = tmp_path / "termination"
    monkeypatch.setenv(s.ENV_TERMINATION_MESSAGE_PATH, str(termination))
    monkeypatch.delenv(pod.ENV_SERVER, raising=False)
    assert cli.main(["step", "mcp", "discover"]) == 1
    assert termination.read_text().startswith("AGENTRUN_MCP_SERVER is not set")


def test_a_server_that_cannot_be_reached_fails_the_step_in_one_line(tmp_path: Path) -> None:
    """The real transport, to a port nothing listens on (port 1 of the loopback)."""
    assert pod.run("discover", _env(tmp_path, _server("add")), store_factory=_no_store) == 1
    said = _termination(tmp_path)
    assert said.startswith("the MCP discover failed: ")
    assert "\n" not in said and "Traceback" not in said


def test_arguments_that_do_not_match_the_pinned_schema_are_not_sent(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("add")
    add = _pinned(tmp_path, calc, server)
    env = _env(
        tmp_path,
        server,
        **{pod.ENV_PINNED: add.model_dump_json(), pod.ENV_TOOL_ARGS: '{"a": 1}'},
    )
    assert pod.run("call", env, _connect(calc), _no_store) == 1
    said = _termination(tmp_path)
    assert "'b' is a required property" in said and said.endswith("the call was not sent")
    assert calc.calls == []


# -- the call on the run's executor -------------------------------------------------------------

TOKEN = "executor-token"
HELD = "AGENTRUN_EXECUTOR_SECRET_0123456789ABCDEF"


def _call_request(pinned: api.PinnedTool, server: api.McpServer, **changes: Any) -> bytes:
    env = {
        pod.ENV_SERVER: json.dumps(server.to_wire()),
        pod.ENV_PINNED: pinned.model_dump_json(),
        pod.ENV_TOOL_ARGS: '{"a": 2, "b": 3}',
    }
    secret = {f"{pod.ENV_HEADER}0": HELD}
    request: dict[str, Any] = {
        "token": TOKEN,
        "job": "r-t1-0-add-1",
        "step": "t1-0-add",
        "attempt": 1,
        "turn": 1,
        "idempotencyKey": "uid:1:call_1:abc",
        "program": executor.MCP_CALL,
        "env": env,
        "secretEnv": secret,
        "timeoutSeconds": 30,
    }
    request.update(changes)
    request.setdefault("sha256", call_digest(request["env"], request["secretEnv"]))
    return json.dumps(request).encode()


def _executor(calc: Calc, seen: list[Mapping[str, str]], connect: Any = None) -> executor.Turns:
    env = {HELD: "Bearer t0ken", "AGENTRUN_MODEL_API_KEY": "model-key"}
    turn = executor.turn_call(store_factory=_no_store)
    call = executor.mcp_call(connect or _connect(calc, seen), _no_store)
    discover = executor.mcp_discover(connect or _connect(calc, seen), _no_store)
    return executor.Turns(env, sha256_text(TOKEN), turn, call, discover)


def _discovery_request(server: api.McpServer, **changes: Any) -> bytes:
    request: dict[str, Any] = {
        "token": TOKEN,
        "job": "r-t0-mcp-calc-1",
        "step": "t0-mcp-calc",
        "attempt": 1,
        "turn": 0,
        "idempotencyKey": "",
        "program": executor.MCP_DISCOVER,
        "env": {pod.ENV_SERVER: json.dumps(server.to_wire())},
        "secretEnv": {f"{pod.ENV_HEADER}0": HELD},
        "timeoutSeconds": 30,
    }
    request.update(changes)
    request.setdefault("sha256", call_digest(request["env"], request["secretEnv"]))
    return json.dumps(request).encode()


def test_the_executor_discovers_a_servers_tools_as_a_discovery_step_would(
    tmp_path: Path,
) -> None:
    calc = Calc()
    server = _server("add", headers=1)
    env = _env(tmp_path, server, **{f"{pod.ENV_HEADER}0": "Bearer t0ken"})
    assert pod.run("discover", env, _connect(calc), _no_store) == 0
    in_a_pod = json.loads(_termination(tmp_path))
    seen: list[Mapping[str, str]] = []
    turns = _executor(calc, seen)
    assert turns.take(_discovery_request(server))[0] == 202
    answer = _answer(turns, "r-t0-mcp-calc-1")
    assert answer["exitCode"] == 0
    assert json.loads(answer["message"]) == in_a_pod
    assert seen == [{"X-H0": "Bearer t0ken"}] and calc.calls == []
    # Only the server's entry: a call's variables make it no discovery's request.
    env = json.loads(_discovery_request(server))["env"]
    arguments = {**env, pod.ENV_TOOL_ARGS: "{}"}
    code, said = turns.take(_discovery_request(server, job="other", env=arguments))
    assert code == 400 and pod.ENV_TOOL_ARGS in said["error"]


def _answer(turns: executor.Turns, job: str = "r-t1-0-add-1") -> dict[str, Any]:
    code, answer = turns.answer(json.dumps({"token": TOKEN, "job": job, "wait": 30}).encode())
    assert code == 200, answer
    return answer


def test_the_executor_runs_a_call_once_with_the_header_value_it_holds(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("add", headers=1)
    env = _env(tmp_path, server, **{f"{pod.ENV_HEADER}0": "Bearer t0ken"})
    assert pod.run("discover", env, _connect(calc), _no_store) == 0
    tool = json.loads(_termination(tmp_path))["result"]["tools"][0]
    add = api.PinnedTool(server="calc", name="add", digest=tool["digest"])
    seen: list[Mapping[str, str]] = []
    turns = _executor(calc, seen)
    body = _call_request(add, server)
    code, taken = turns.take(body)
    assert code == 202
    answer = _answer(turns)
    assert answer["exitCode"] == 0 and answer["taken"] == taken["taken"]
    assert json.loads(answer["message"])["result"]["structuredContent"] == {"result": 5}
    assert seen == [{"X-H0": "Bearer t0ken"}]
    # A repeat is answered from what was taken; the same attempt with other arguments is not.
    assert turns.take(body)[0] == 200
    other = _call_request(add, server, env={**json.loads(body)["env"], pod.ENV_TOOL_ARGS: "{}"})
    assert turns.take(other)[0] == 409
    assert calc.calls == ["add"]


def test_the_executor_refuses_a_call_it_cannot_run_as_its_step_would(tmp_path: Path) -> None:
    calc = Calc()
    server = _server("add", headers=1)
    add = api.PinnedTool(server="calc", name="add", digest="0" * 64)
    turns = _executor(calc, [])
    wrong_token = _call_request(add, server, token="guess")
    assert turns.take(wrong_token)[0] == 403
    env = json.loads(_call_request(add, server))["env"]
    cases: dict[str, dict[str, Any]] = {
        "a variable a call's step has not": {"env": {**env, "PATH": "/tmp"}},
        "a Secret it does not hold": {"secretEnv": {f"{pod.ENV_HEADER}0": "AGENTRUN_OTHER"}},
        "another of its own variables": {
            "secretEnv": {f"{pod.ENV_HEADER}0": "AGENTRUN_MODEL_API_KEY"}
        },
        "a digest of something else": {"sha256": "0" * 64},
        "a program it does not run": {"program": "shell"},
    }
    for why, changes in cases.items():
        code, answer = turns.take(_call_request(add, server, **changes))
        assert code == 400, why
        assert answer["error"], why
    assert calc.calls == []


def test_the_executor_stops_a_call_at_its_timeout(tmp_path: Path) -> None:
    server = _server("add")
    add = api.PinnedTool(server="calc", name="add", digest="0" * 64)

    @asynccontextmanager
    async def stuck(server: api.McpServer, headers: Mapping[str, str]) -> AsyncIterator[Any]:
        await anyio.sleep(30)
        yield None

    turns = _executor(Calc(), [], stuck)
    assert turns.take(_call_request(add, server, secretEnv={}, timeoutSeconds=1))[0] == 202
    answer = _answer(turns)
    assert answer["exitCode"] == 1
    assert answer["message"] == (
        "the call of add did not end within 1 s (the tool's timeoutSeconds): stopped"
    )
    # A discovery too, at the server's timeoutSeconds.
    request = _discovery_request(server, secretEnv={}, timeoutSeconds=1)
    assert turns.take(request)[0] == 202
    answer = _answer(turns, "r-t0-mcp-calc-1")
    assert answer["exitCode"] == 1
    assert answer["message"] == (
        "the tools of MCP server calc were not listed within 1 s (its timeoutSeconds): stopped"
    )
