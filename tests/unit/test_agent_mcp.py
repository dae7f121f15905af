"""Tools from MCP servers in the agent loop (docs/agent.md, "Tools from MCP servers"): one
discovery step per server before the first turn, the allowed tools pinned by the operator from
what the step reported, offered to the model beside spec.agent.tools, and every call a step of
its own in the operator's image, approved for its arguments and the pinned definition."""

from __future__ import annotations

import json
from typing import Any

from agentrun.api import agent_status
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_loop as loop
from agentrun.core import agent_start, mcp, turns
from tests.support.agent_sim import SEARCH, AgentSim, agent_run, call, tool_envelope
from tests.support.sim import UID

LOOKUP: dict[str, Any] = {
    "name": "lookup",
    "description": "Look a word up.",
    "inputSchema": {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    },
}
DEPLOY: dict[str, Any] = {
    "name": "deploy",
    "description": "Deploy a service.",
    "inputSchema": {"type": "object", "properties": {"service": {"type": "string"}}},
}
HIDDEN: dict[str, Any] = {
    "name": "hidden",
    "description": "Not allowed.",
    "inputSchema": {"type": "object"},
}
SERVER: dict[str, Any] = {
    "name": "tools",
    "url": "http://tools.team.svc:8000/mcp",
    "headers": [{"name": "Authorization", "secretKeyRef": {"name": "mcp", "key": "token"}}],
    "tools": [{"name": "lookup"}, {"name": "deploy", "risk": "external", "approval": "required"}],
}
DISCOVERY = turns.discovery_step("tools")


def _sim(**agent: Any) -> AgentSim:
    return AgentSim(agent_run(mcpServers=[SERVER], **agent))


def _env(sim: AgentSim, step: str) -> dict[str, m.EnvVar]:
    create = next(c for c in sim.created_specs.values() if c.step.name == step)
    return {e.name: e for e in create.step.container.env or []}


def _discovered(sim: AgentSim, listed: list[dict[str, Any]] | None = None) -> None:
    """The discovery step reports what ``agentrun step mcp discover`` would for ``listed``."""
    sim.settle()
    job = next(j for j in sim.tool_jobs() if j.step == DISCOVERY)
    server = mcp_api.McpServer.model_validate(SERVER)
    found = mcp.pin(server, listed if listed is not None else [LOOKUP, DEPLOY, HIDDEN])
    sim.finish(job.name, True, tool_envelope(json.dumps(found.to_wire()), "2 tools"))
    sim.settle()


def _reason(sim: AgentSim) -> str | None:
    ready = sim.condition("Ready")
    return ready.reason if ready is not None else None


def _offered(sim: AgentSim) -> dict[str, Any]:
    return {t["function"]["name"]: t["function"] for t in sim.context().tools}


def test_discovery_runs_first_as_a_step_in_the_operators_image_with_the_header_secret() -> None:
    sim = _sim()
    sim.settle()
    assert sim.agent.turn == 0 and sim.agent.stage == agent_status.AgentStage.WAITING
    assert [j.step for j in sim.active()] == [DISCOVERY]
    create = next(c for c in sim.created_specs.values() if c.step.name == DISCOVERY)
    assert create.step.container.image == loop.AgentConfig().llm_image
    assert create.step.container.command == ["agentrun", "step", "mcp", "discover"]
    env = _env(sim, DISCOVERY)
    entry = json.loads(env[turns.ENV_MCP_SERVER].value or "")
    assert entry["url"] == SERVER["url"] and "value" not in json.dumps(entry["headers"])
    header = env[f"{turns.ENV_MCP_HEADER}0"].value_from
    assert header is not None and header.secret_key_ref is not None
    assert (header.secret_key_ref.name, header.secret_key_ref.key) == ("mcp", "token")
    assert "McpDiscoveryStarted" in [t.reason for t in sim.status.history or []]


def test_the_allowed_tools_are_pinned_and_offered_beside_the_container_tools() -> None:
    sim = _sim()
    _discovered(sim)
    assert sim.agent.turn == 1 and sim.agent.stage == agent_status.AgentStage.THINKING
    pins = {p.name: p for p in sim.agent.mcp_tools or []}
    assert sorted(pins) == ["deploy", "lookup"]
    assert pins["lookup"].digest == mcp.tool_digest(LOOKUP)
    assert pins["lookup"].server == "tools"
    offered = _offered(sim)
    assert sorted(offered) == ["deploy", "lookup", "search"]  # never the tool not allowed
    assert offered["lookup"]["parameters"] == LOOKUP["inputSchema"]
    # The discovery step left status; its outcome is the pins (and its transitions).
    assert DISCOVERY not in {st.name for st in sim.status.steps or []}
    started = next(t for t in sim.status.history or [] if t.reason == "AgentStarted")
    assert "3 tools (2 of them from MCP servers)" in (started.message or "")


def test_a_call_of_an_mcp_tool_is_a_step_that_sends_the_pinned_definition_and_the_key() -> None:
    sim = _sim()
    _discovered(sim)
    sim.answer("", [call("lookup", {"word": "latency"}, "c1")])
    (job,) = sim.tool_jobs()
    assert job.step == "t1-0-lookup"
    create = sim.created_specs[job.name]
    assert create.step.container.command == ["agentrun", "step", "mcp", "call"]
    assert create.step.container.image == loop.AgentConfig().llm_image
    env = _env(sim, "t1-0-lookup")
    pinned = mcp_api.PinnedTool.model_validate_json(env[turns.ENV_MCP_PINNED].value or "")
    assert (pinned.server, pinned.name, pinned.digest) == (
        "tools",
        "lookup",
        mcp.tool_digest(LOOKUP),
    )
    assert json.loads(env[loop.ENV_TOOL_ARGS].value or "") == {"word": "latency"}
    st = sim.step_status("t1-0-lookup")
    assert st.idempotency_key == f"{UID}:1:c1:{st.args_hash}"
    recorded = {"isError": False, "content": [{"type": "text", "text": "latency: delay"}]}
    sim.tools_return(lambda j: (True, tool_envelope(json.dumps(recorded), "latency: delay")))
    assert sim.agent.turn == 2
    # The next turn is offered the same tools, from the pinned definitions.
    assert sorted(_offered(sim)) == ["deploy", "lookup", "search"]
    (outcome,) = sim.transcript()[0]["toolCalls"]
    assert outcome["outcome"] == "Succeeded" and json.loads(outcome["result"]) == recorded


def test_calls_are_checked_against_the_pinned_input_schema_before_any_step() -> None:
    sim = _sim()
    _discovered(sim)
    sim.answer(
        "",
        [
            call("lookup", {"word": 5}, "bad"),
            call("hidden", {}, "unlisted"),
            call("lookup", {"word": "ok"}, "good"),
        ],
    )
    calls = {c.id: c for c in sim.agent.calls or []}
    assert calls["bad"].step is None
    assert "word: 5 is not of type 'string'" in (calls["bad"].problem or "")
    assert calls["unlisted"].step is None
    assert calls["unlisted"].problem == (
        "there is no tool 'hidden' (the tools: deploy, lookup, search)"
    )
    assert [j.step for j in sim.tool_jobs()] == ["t1-2-lookup"]


def test_a_gated_mcp_tool_waits_for_an_approval_bound_to_its_arguments_and_definition() -> None:
    sim = _sim()
    _discovered(sim)
    sim.answer("", [call("deploy", {"service": "checkout"}, "d1")])
    st = sim.step_status("t1-0-deploy")
    assert st.phase == SP.WAITING_FOR_APPROVAL and sim.tool_jobs() == []
    # Another definition of the same tool, with the same arguments, is another argsHash.
    other = _sim()
    changed = {**DEPLOY, "description": "Deploy a service (now also deletes it)."}
    _discovered(other, [LOOKUP, changed])
    other.answer("", [call("deploy", {"service": "checkout"}, "d1")])
    assert other.step_status("t1-0-deploy").args_hash != st.args_hash
    ok = m.Approval(step="t1-0-deploy", decision="approve", args_hash=st.args_hash, by="alice")
    sim.spec_update(approvals=[ok])
    sim.settle()
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-deploy"]


def test_mcp_steps_run_the_operators_image_whatever_policy_allowed_images_says() -> None:
    sim = AgentSim(agent_run(mcpServers=[SERVER], spec={"policy": {"allowedImages": ["ghcr.io/"]}}))
    _discovered(sim)
    sim.answer("", [call("lookup", {"word": "x"}, "c")])
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-lookup"]


def test_a_server_without_an_allowed_tool_fails_the_run_before_any_turn() -> None:
    sim = _sim()
    _discovered(sim, [LOOKUP])
    assert sim.status.phase == m.RunPhase.FAILED
    assert _reason(sim) == agent_start.DISCOVERY_FAILED
    assert sim.status.message == (
        "MCP server tools: the server does not list the tool deploy (it lists: lookup)"
    )
    assert sim.agent.turn == 0 and sim.model_job() is None


def test_a_failed_discovery_fails_the_run_with_the_steps_reason() -> None:
    sim = _sim()
    sim.settle()
    job = next(j for j in sim.tool_jobs() if j.step == DISCOVERY)
    sim.finish(job.name, False, "MCP server tools: connection refused")
    sim.run_to_end(lambda j: (False, "MCP server tools: connection refused"))
    assert sim.status.phase == m.RunPhase.FAILED
    assert "connection refused" in (sim.status.message or "")
    assert sim.model_job() is None and sim.agent.turn == 0


def test_two_tools_of_one_name_fail_the_run_before_anything_runs() -> None:
    clash = {**SERVER, "tools": [{"name": "search"}]}
    sim = AgentSim(agent_run(mcpServers=[clash]))
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED and _reason(sim) == "InvalidAgent"
    assert sim.status.message == (
        "the tool search is offered by spec.agent.tools and MCP server tools: the model calls "
        "tools by name, so each must be unique"
    )
    assert sim.jobs == {}


def test_changing_the_mcp_servers_after_the_first_pass_fails_the_run_closed() -> None:
    sim = _sim()
    sim.settle()
    agent = sim.run.spec.agent
    assert agent is not None
    moved = mcp_api.McpServer.model_validate({**SERVER, "url": "http://attacker.example/mcp"})
    sim.spec_update(agent=agent.model_copy(update={"mcp_servers": [moved]}))
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    assert _reason(sim) == loop.SPEC_CHANGED
    assert "spec.agent.mcpServers changed after the run started" in (sim.status.message or "")
    urls = {
        e.value
        for c in sim.created_specs.values()
        for e in c.step.container.env or []
        if e.name == turns.ENV_MCP_SERVER
    }
    assert all("attacker" not in (u or "") for u in urls)


def test_a_run_without_mcp_servers_freezes_as_before() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH]))
    sim.settle()
    frozen = sim.agent.frozen
    assert frozen is not None and frozen.mcp_servers_digest is None
    assert sim.agent.mcp_tools is None
