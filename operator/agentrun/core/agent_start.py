"""The agent loop's start, pure: once the plan is done, the first turn's context (the goal
and the plan's results, or the conversation of the run it continues), after the MCP servers'
tools are discovered and pinned; and how a turn's context is stored and measured.

See :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import context as cx
from agentrun.core import mcp as mcp_core
from agentrun.core import resume as resuming
from agentrun.core.actions import StoreRecord
from agentrun.core.agent_launch import _send_calls
from agentrun.core.calls import content_of, cut
from agentrun.core.turns import (
    KIND_CONTEXT,
    AgentConfig,
    Host,
    context_name,
    discovery_step,
    mcp_tools_of,
    model_of,
    tool_choice_of,
)

WAIT_SECONDS = 1
"""A stage waiting for a record the shell has not read yet looks again this soon."""


def _wait(b: Host) -> None:
    b.timer(b.now + timedelta(seconds=WAIT_SECONDS))


def sent_bytes(agent: a.Agent, ag: agent_status.AgentStatus, ctx: cx.Context) -> int:
    """Bytes of the request a turn sends for ``ctx``: its messages, its tools, and the settings
    (:func:`agentrun.core.context.request_body`, as ``agentrun step llm`` sends it)."""
    model = model_of(agent, ag)
    return cx.request_size(
        ctx, model.name, model.max_output_tokens, model.temperature, tool_choice_of(agent, ag)
    )


def _store_context(b: Host, ag: agent_status.AgentStatus, ctx: cx.Context) -> None:
    stored = cx.Stored.of(ctx)
    parts, digest = stored.parts, stored.digest
    name = context_name(b.run, ctx.turn, digest)
    data = tuple((f"part-{i}", part) for i, part in enumerate(parts))
    b.before.append(StoreRecord(name, KIND_CONTEXT, ctx.turn, data, stored))
    agent = b.run.spec.agent
    sent = sent_bytes(agent, ag, ctx) if agent is not None else ctx.bytes + ctx.tools_bytes
    ag.context = agent_status.ContextStatus(
        turn=ctx.turn,
        name=name,
        parts=len(parts),
        digest=digest,
        bytes=sent,
        messages=len(ctx.messages),
        paged_results=ctx.paged_results,
        omitted_turns=ctx.omitted_turns,
    )


def _tools(agent: a.Agent) -> list[dict[str, Any]]:
    return cx.tool_definitions((t.name, t.description, t.parameters) for t in agent.tools or [])


def _mcp_definitions(
    agent: a.Agent, ag: agent_status.AgentStatus, tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The definitions among ``tools`` (a context's) of the MCP tools pinned for the run."""
    pinned = mcp_tools_of(agent, ag)
    return [
        dict(t)
        for t in tools
        if isinstance(t.get("function"), Mapping) and t["function"].get("name") in pinned
    ]


def _start(b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig) -> None:
    """Once the plan is done (and the MCP servers' tools are discovered): the first turn's
    context. A run that continues another's conversation checks that first, so that it fails
    before its plan runs when it cannot."""
    taken: tuple[cx.Context, agent_status.ResumedFrom] | None = None
    if agent.resume_from is not None:
        found = resuming.take(b.run, agent.resume_from, b.observed.resume, _tools(agent))
        if found is None:
            _wait(b)
            return
        if isinstance(found, str):
            b.stop(resuming.REASON, found)
            return
        taken = found
    plan = b.run.spec.plan.steps
    sts = [b.steps[s.name] for s in plan if s.name in b.steps]
    if len(sts) != len(plan) or any(st.phase not in (SP.SUCCEEDED, SP.SKIPPED) for st in sts):
        return
    tools = _tools(agent)
    offered = 0
    if agent.mcp_servers:
        discovered = _discover(b, agent, ag, config)
        if discovered is None:
            return
        offered = len(discovered)
        tools += cx.tool_definitions(discovered)
    from_servers = f" ({offered} of them from MCP servers)" if agent.mcp_servers else ""
    if taken is not None:
        first, ag.resumed_from = taken
        first = replace(first, tools=tools)
        _store_context(b, ag, cx.page(first, agent.context_bytes))
        ag.turn = 1
        ag.stage = agent_status.AgentStage.READY
        phase = str(b.status.phase) if b.status.phase else None
        b.record(
            None,
            phase,
            str(b.status.phase or m.RunPhase.RUNNING),
            "AgentStarted",
            resuming.started_message(ag.resumed_from, len(first.messages))
            + (f"; {len(tools)} tools{from_servers}" if agent.mcp_servers else ""),
        )
        return
    sections: list[str] = []
    for st in sts:
        if st.phase == SP.SKIPPED:
            sections.append(f"## step {st.name}: skipped ({st.message or 'not run'})")
            continue
        text = content_of(b, st)
        if text is None:
            _wait(b)
            return
        lines = [f"## step {st.name}: succeeded"]
        if st.summary:
            lines.append(f"summary: {st.summary}")
        if text:
            lines.append(cut(text, config.tool_result_bytes))
        sections.append("\n".join(lines))
    user = b.run.spec.goal
    if sections:
        user += "\n\n# Results of the plan's steps, which ran before you\n\n" + "\n\n".join(
            sections
        )
    first = cx.Context(turn=1, messages=cx.first_messages(agent.instructions, user), tools=tools)
    _store_context(b, ag, cx.page(first, agent.context_bytes))
    ag.turn = 1
    ag.stage = agent_status.AgentStage.READY
    model = model_of(agent, ag)
    b.record(
        None,
        str(b.status.phase) if b.status.phase else None,
        str(b.status.phase or m.RunPhase.RUNNING),
        "AgentStarted",
        f"the agent starts: model {model.name} at {model.base_url}, "
        f"{len(tools)} tools{from_servers}, up to {agent.max_turns} turns",
    )


DISCOVERY_FAILED = "McpDiscoveryFailed"
"""The reason of a run whose MCP servers' tools could not be discovered and pinned."""


def _discover(
    b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig
) -> list[tuple[str, str, Mapping[str, Any]]] | None:
    """The MCP servers' tools, as the model is offered them, once every server's discovery
    step succeeded: the operator pins the allowed tools itself from the definitions each step
    reported (:func:`agentrun.core.mcp.pin`) into ``status.agent.mcpTools``, and the discovery
    steps leave ``status.steps`` (the pins and the transitions keep their outcome). None while
    the steps run (they are added on the first call, with the image of the operator as
    configured now), or when the run stops because a server's tools cannot be offered."""
    servers = agent.mcp_servers or []
    missing = [s for s in servers if discovery_step(s.name) not in b.steps]
    if missing:
        if ag.turn_image is None:
            ag.turn_image = config.llm_image
            ag.turn_command = list(config.llm_command)
        for server in missing:
            name = discovery_step(server.name)
            b.steps[name] = m.StepStatus(name=name, phase=SP.PENDING)
            b.record(
                name,
                None,
                SP.PENDING,
                "McpDiscoveryStarted",
                f"list the tools of MCP server {server.name} at {server.url}",
            )
        return None
    sts = [b.steps[discovery_step(s.name)] for s in servers]
    if any(st.phase not in m.TERMINAL_STEP_PHASES for st in sts):
        _send_calls(b, [st for st in sts if st.executor_pod], config)
        return None
    discoveries: list[mcp_core.Discovery] = []
    for server, st in zip(servers, sts, strict=True):
        if st.phase != SP.SUCCEEDED:
            why = st.message or (st.error.message if st.error else None) or str(st.phase)
            ag.stage = agent_status.AgentStage.STOPPED
            b.stop(
                DISCOVERY_FAILED, f"the tools of MCP server {server.name} were not listed: {why}"
            )
            return None
        text = content_of(b, st)
        if text is None:
            _wait(b)
            return None
        found = _pin_reported(server, text)
        if isinstance(found, str):
            ag.stage = agent_status.AgentStage.STOPPED
            b.stop(DISCOVERY_FAILED, f"MCP server {server.name}: {found}")
            return None
        discoveries.append(found)
    ag.mcp_tools = [p for found in discoveries for p in found.pinned]
    for server in servers:
        b.steps.pop(discovery_step(server.name), None)
    return mcp_core.offered(discoveries)


def _pin_reported(server: mcp_api.McpServer, text: str) -> mcp_core.Discovery | str:
    """The tools ``server`` allows, pinned from the definitions its discovery step reported;
    or what is wrong with them."""
    try:
        reported = json.loads(text)
    except (ValueError, RecursionError):
        return "the discovery step's result is not JSON"
    listed = reported.get("tools") if isinstance(reported, dict) else None
    if not isinstance(listed, list) or not all(isinstance(t, dict) for t in listed):
        return "the discovery step's result has no list of tools"
    found = mcp_core.pin(server, listed)
    if found.problems:
        return "; ".join(found.problems)
    return found
