"""The agent loop, pure: model turns and tool calls as steps of the run.

An agent run (``spec.agent``) moves through stages (``status.agent.stage``):

``Waiting``
    The plan's steps run first. When every one of them succeeded (or was skipped), the first
    turn's context is assembled: the system message (``instructions``) and one user message,
    the goal followed by the plan's results (each step's summary and result, in plan order).
``Ready`` / ``Paused``
    The context of turn N is stored (a ConfigMap, see :mod:`agentrun.core.context`). Before
    the turn starts, the tokens left (``budget.maxTokens`` minus what was used) are checked
    against what the turn may use: ``maxOutputTokens`` plus the size of the request it sends
    (messages, tool definitions, settings) at 4 bytes a token. When they do not cover it the
    loop is ``Paused`` (run phase Suspended, reason BudgetExhausted) until
    ``spec.budget.maxTokens`` is raised. A turn is counted for what the endpoint reported, but
    never more than it could have used (:func:`counted_tokens`); a count it did not report, as
    ``agentrun step llm`` estimated it, which the run is told of (:func:`_note_unreported`).
``Thinking``
    Turn N's model step (``t{N}-model``) runs like any step: committed intent, a Job with a
    deterministic name, retries per ``agent.model.retry``. It runs ``agentrun step llm`` in
    the operator's image; its result is the turn's output (:func:`context.parse_output`).
``Acting``
    Every proposed call is validated (the tool exists, the arguments parse and match the
    tool's JSON Schema, its image is allowed, ``maxToolCallsPerTurn`` and ``budget.maxSteps``
    left). An invalid call never runs: it is recorded with the reason, which is what the model
    reads as the call's result. A valid call becomes the step ``t{N}-{index}-{tool}`` with
    idempotency key ``{run uid}:{N}:{call id}:{argsHash}``; a gated tool's call waits for an
    approval of that step and argsHash, as a gated plan step does (a rejection is answered to
    the model; the run goes on). A call that fails after its retries is answered as an error.
``Answered``
    The model answered without calling a tool: the answer is the run's result, stored once in
    the turn's transcript record (up to :data:`agentrun.api.agent.MAX_ANSWER_BYTES`; a larger
    one fails the run, reason AnswerTooLarge). An answer cut off at ``maxOutputTokens``
    (finish reason ``length``, no tool call) is not one: the run fails (reason AnswerCutOff).

When every call of turn N has an outcome, the turn is closed: its transcript record (the
assistant message, each call with its arguments, outcome, approval and result, usage) is
written to a ConfigMap owned by the run, the context of turn N+1 is assembled from turn N's
context and that record and paged to ``contextBytes``, the turn's steps leave
``status.steps`` (the record keeps them), and turn N+1 is ready. A model still calling tools
in turn ``maxTurns`` fails the run with reason MaxTurnsReached (the context of turn N+1 is
stored all the same, so that a fork can continue after the last turn).

A run with ``spec.agent.resumeFrom`` starts from another run's conversation instead of the
goal: its first context holds the messages that run's turn N+1 saw, read from that run's
records and verified by the shell and the core (:mod:`agentrun.core.resume`); if that fails,
the run fails (reason ResumeRefused) before its plan or any turn runs.

The model a turn calls (``spec.agent.model``: endpoint, model name, API key Secret) and the
tools it is offered are fixed at creation: the operator's first pass of the run takes them into
``status.agent.frozen`` (:func:`pin`), every turn's Job is built from that copy, and a run whose
spec.agent no longer matches it fails (reason AgentSpecChanged) before anything of the pass is
launched (:mod:`agentrun.core.frozen`).

Everything the loop reads beyond the status comes from committed records: results kept in
ConfigMaps and the previous context are read by the shell when :func:`wanted_documents` asks
for them (``Observed.documents``). A stage that needs one not yet read simply waits for the
next pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from agentrun.api import agent as a
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import context as cx
from agentrun.core import executor, naming
from agentrun.core import frozen as freezing
from agentrun.core import mcp as mcp_core
from agentrun.core import resume as resuming
from agentrun.core.actions import (
    Action,
    CreateJob,
    DeleteJob,
    PrepareTurn,
    StartPod,
    StoreRecord,
)
from agentrun.core.arguments import args_hash, resolve_inputs
from agentrun.core.calls import call_outcome, content_of, cut, validate_calls
from agentrun.core.envelope import summary_line
from agentrun.core.observed import AheadJob, JobState, ObservedJob
from agentrun.core.turns import (
    AHEAD_LIMIT,
    CONTEXT_INPUT,
    ENV_CONTEXT_PART,
    ENV_CONTEXT_PARTS,
    ENV_CONTEXT_SHA256,
    ENV_MODEL_API_KEY,
    ENV_MODEL_BASE_URL,
    ENV_MODEL_MAX_OUTPUT_TOKENS,
    ENV_MODEL_NAME,
    ENV_MODEL_TEMPERATURE,
    ENV_MODEL_TOOL_CHOICE,
    ENV_TOOL_ARGS,
    ENV_TOOL_CALL_ID,
    ENV_TOOL_NAME,
    ENV_TURN,
    KIND_CONTEXT,
    KIND_TRANSCRIPT,
    AgentConfig,
    Host,
    ahead_names,
    call_step,
    committed,
    compacted,
    context_inputs,
    context_name,
    current_steps,
    discovery_step,
    dynamic_names,
    dynamic_steps,
    executor_checks,
    idempotency_key,
    image_exempt,
    is_agent_run,
    is_model_turn,
    is_tool_step,
    mcp_tools_of,
    model_of,
    model_step,
    model_turn_step,
    pauses_for_tokens,
    prompt_ceiling,
    record_name,
    rights_confirmed,
    tool_choice_of,
    transcript_prefix,
    turn_needs,
    turn_of_step,
)

__all__ = [
    "CONTEXT_INPUT",
    "ENV_CONTEXT_PART",
    "ENV_CONTEXT_PARTS",
    "ENV_CONTEXT_SHA256",
    "ENV_MODEL_API_KEY",
    "ENV_MODEL_BASE_URL",
    "ENV_MODEL_MAX_OUTPUT_TOKENS",
    "ENV_MODEL_NAME",
    "ENV_MODEL_TEMPERATURE",
    "ENV_MODEL_TOOL_CHOICE",
    "ENV_TOOL_ARGS",
    "ENV_TOOL_CALL_ID",
    "ENV_TOOL_NAME",
    "ENV_TURN",
    "KIND_CONTEXT",
    "KIND_TRANSCRIPT",
    "SPEC_CHANGED",
    "USAGE_NOT_REPORTED",
    "AgentConfig",
    "Host",
    "Settled",
    "advance",
    "ahead_names",
    "clear_name",
    "committed",
    "compacted",
    "context_inputs",
    "context_name",
    "counted_tokens",
    "current_steps",
    "dynamic_names",
    "dynamic_steps",
    "executor_checks",
    "finish",
    "idempotency_key",
    "image_exempt",
    "is_agent_run",
    "is_model_turn",
    "is_tool_step",
    "launch_actions",
    "model_of",
    "model_step",
    "model_turn_step",
    "paused_message",
    "pauses_for_tokens",
    "pin",
    "prompt_ceiling",
    "record_name",
    "rights_confirmed",
    "sent_bytes",
    "settled",
    "tool_choice_of",
    "transcript_prefix",
    "turn_needs",
    "turn_of_step",
    "validate_calls",
    "wanted_documents",
]

WAIT_SECONDS = 1
"""A stage waiting for a record the shell has not read yet looks again this soon."""
ANSWER_KEY = "answer"
"""The key of the last transcript record that holds the answer (its ``turn`` entry names it as
``contentKey`` rather than holding the answer again)."""
CUT_OFF = "length"
"""The finish reason of an output cut off at max_tokens."""
CUT_OFF_REASON = "AnswerCutOff"
"""The reason of a run whose model answered, but was cut off at maxOutputTokens."""
SPEC_CHANGED = freezing.REASON
"""The reason of a run whose spec.agent changed after it started (:func:`pin`)."""

# ---------------------------------------------------------------------------------------------
# What the shell reads for the loop
# ---------------------------------------------------------------------------------------------

DocumentKey = tuple[str, str]
"""(ConfigMap name, key)."""


def _ref_of(st: m.StepStatus | None) -> list[DocumentKey]:
    if st is None or st.phase != SP.SUCCEEDED or st.result_ref is None:
        return []
    return [(st.result_ref.name, st.result_ref.key)]


def wanted_documents(run: m.AgentRun) -> list[DocumentKey]:
    """The ConfigMap keys the next pass needs, from the committed status: plan results
    before the first turn, a model turn's output kept by reference, and, while a turn's calls
    run, the turn's context and the results kept by reference that are committed."""
    agent = run.spec.agent
    status = run.status
    if agent is None or status is None or status.phase in m.TERMINAL_RUN_PHASES:
        return []
    ag = status.agent or a.AgentStatus()
    steps = {st.name: st for st in status.steps or []}
    wanted: list[DocumentKey] = []
    if ag.stage == a.AgentStage.WAITING:
        sts = [steps.get(s.name) for s in run.spec.plan.steps]
        if all(st is not None and st.phase in (SP.SUCCEEDED, SP.SKIPPED) for st in sts):
            for st in sts:
                wanted += _ref_of(st)
            for server in agent.mcp_servers or []:
                wanted += _ref_of(steps.get(discovery_step(server.name)))
    elif ag.stage == a.AgentStage.THINKING:
        wanted += _ref_of(steps.get(model_step(ag.turn)))
        if agent.mcp_servers and ag.context is not None:
            # The definitions of the MCP tools offered, which calls are checked against.
            wanted += [(ag.context.name, f"part-{i}") for i in range(ag.context.parts)]
    elif ag.stage == a.AgentStage.ACTING:
        # Also while calls still run: the pass that takes the last one's result closes the
        # turn and begins the next in the same write (kept by the shell, the context it wrote
        # costs no read: agentrun.loop.written).
        if ag.context is not None:
            wanted += [(ag.context.name, f"part-{i}") for i in range(ag.context.parts)]
        wanted += _ref_of(steps.get(model_step(ag.turn)))
        for call in ag.calls or []:
            if call.step:
                wanted += _ref_of(steps.get(call.step))
    return wanted


# ---------------------------------------------------------------------------------------------
# One pass of the loop
# ---------------------------------------------------------------------------------------------


def pin(b: Host, first: bool) -> str | None:
    """What the run's turns call, fixed at creation (:mod:`agentrun.core.frozen`). On the
    operator's ``first`` pass of an agent run, ``spec.agent.model`` and a digest of its tools go
    into ``status.agent.frozen``; on every later pass, why the run must stop because its
    spec.agent no longer matches them (None: it does). Called before anything of the pass
    builds a step of the loop, so no turn is ever built from a changed spec."""
    agent = b.run.spec.agent
    ag = b.status.agent
    if ag is None:
        if agent is None:
            return None  # a plan run
        if not first:
            return freezing.added(agent)  # the first pass saw a run without an agent
        ag = b.status.agent = a.AgentStatus()
    if ag.frozen is None:
        # The first pass; or a run an operator from before the freeze started, whose spec is
        # taken as it reads now (it cannot be told from the one the run was created with).
        ag.frozen = freezing.freeze(b.run)
        return None
    changed = freezing.changes(agent, ag.frozen)
    return freezing.refusal(agent, ag.frozen, changed) if changed else None


def advance(b: Host, config: AgentConfig) -> None:
    """The loop's part of a pass: after the machine observed the attempts, before it
    launches steps. Moves at most through closing one turn and starting the next."""
    agent = b.run.spec.agent
    if agent is None:
        return
    ag = b.status.agent or a.AgentStatus()
    b.status.agent = ag
    if ag.transcript is None:
        ag.transcript = transcript_prefix(b.run)
    if ag.stage in (a.AgentStage.ANSWERED, a.AgentStage.STOPPED) or b.halt is not None:
        return
    _move(b, agent, ag, config)
    executor.keep(b, agent, ag, config)


def _move(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    for _ in range(4):
        before = (ag.stage, ag.turn)
        if ag.stage == a.AgentStage.WAITING:
            _start(b, agent, ag, config)
        elif ag.stage in (a.AgentStage.READY, a.AgentStage.PAUSED):
            _begin_turn(b, agent, ag, config)
        elif ag.stage == a.AgentStage.THINKING:
            _take_output(b, agent, ag, config)
        elif ag.stage == a.AgentStage.ACTING:
            _close_turn(b, agent, ag, config)
        if (ag.stage, ag.turn) == before or b.halt is not None:
            return


def _wait(b: Host) -> None:
    b.timer(b.now + timedelta(seconds=WAIT_SECONDS))


def sent_bytes(agent: a.Agent, ag: a.AgentStatus, ctx: cx.Context) -> int:
    """Bytes of the request a turn sends for ``ctx``: its messages, its tools, and the settings
    (:func:`agentrun.core.context.request_body`, as ``agentrun step llm`` sends it)."""
    model = model_of(agent, ag)
    return cx.request_size(
        ctx, model.name, model.max_output_tokens, model.temperature, tool_choice_of(agent, ag)
    )


def _store_context(b: Host, ag: a.AgentStatus, ctx: cx.Context) -> None:
    stored = cx.Stored.of(ctx)
    parts, digest = stored.parts, stored.digest
    name = context_name(b.run, ctx.turn, digest)
    data = tuple((f"part-{i}", part) for i, part in enumerate(parts))
    b.before.append(StoreRecord(name, KIND_CONTEXT, ctx.turn, data, stored))
    agent = b.run.spec.agent
    sent = sent_bytes(agent, ag, ctx) if agent is not None else ctx.bytes + ctx.tools_bytes
    ag.context = a.ContextStatus(
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
    agent: a.Agent, ag: a.AgentStatus, tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The definitions among ``tools`` (a context's) of the MCP tools pinned for the run."""
    pinned = mcp_tools_of(agent, ag)
    return [
        dict(t)
        for t in tools
        if isinstance(t.get("function"), Mapping) and t["function"].get("name") in pinned
    ]


def _start(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    """Once the plan is done (and the MCP servers' tools are discovered): the first turn's
    context. A run that continues another's conversation checks that first, so that it fails
    before its plan runs when it cannot."""
    taken: tuple[cx.Context, a.ResumedFrom] | None = None
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
        ag.stage = a.AgentStage.READY
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
    ag.stage = a.AgentStage.READY
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
    b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig
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
            ag.stage = a.AgentStage.STOPPED
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
            ag.stage = a.AgentStage.STOPPED
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


def counted_tokens(b: Host, step: str, reported: int) -> int:
    """The tokens a model turn's step is counted for: what the endpoint reported, but never
    more than the turn could have used (its maxOutputTokens and :func:`prompt_ceiling`). A
    report over that is recorded (a transition ReportedUsageRefused, a Warning Event, and
    ``status.agent.overReportedTurns``)."""
    agent = b.run.spec.agent
    ag = b.status.agent
    ctx = ag.context if ag is not None else None
    if agent is None or ag is None or ctx is None or step != model_step(ag.turn):
        return reported
    if ctx.turn != ag.turn:  # pragma: no cover - a turn runs with its own context
        return reported
    model = model_of(agent, ag)
    ceiling = model.max_output_tokens + prompt_ceiling(ctx)
    if reported <= ceiling:
        return reported
    ag.over_reported_turns += 1
    b.record(
        step,
        None,
        "Counted",
        "ReportedUsageRefused",
        f"turn {ag.turn}: the endpoint reported {reported} tokens, more than the turn could "
        f"have used (maxOutputTokens {model.max_output_tokens} + a prompt of at most "
        f"{prompt_ceiling(ctx)}); {ceiling} counted",
    )
    return ceiling


USAGE_NOT_REPORTED = "UsageNotReported"
"""The reason of the transition (and Warning Event) of a turn whose endpoint reported no usage,
or only part of it."""


def _note_unreported(b: Host, ag: a.AgentStatus, output: cx.Output) -> None:
    """Say on the run that turn ``ag.turn``'s endpoint reported no usage (or only part of it),
    and how it was counted: ``agentrun step llm`` estimated each missing count at
    :data:`agentrun.core.context.BYTES_PER_TOKEN` bytes a token (of the request sent, of the
    output), so that budget.maxTokens still holds; a transition UsageNotReported, a Warning
    Event, and ``status.agent.unreportedUsageTurns``."""
    ag.unreported_usage_turns += 1
    if len(output.unreported) == len(cx.USAGE_COUNTS):
        missing = "usage"
    else:
        missing = " and ".join(f"usage.{key}" for key in output.unreported)
    b.record(
        model_step(ag.turn),
        None,
        "Counted",
        USAGE_NOT_REPORTED,
        f"turn {ag.turn}: the model endpoint reported no {missing}; counted as estimated at "
        f"{cx.BYTES_PER_TOKEN} bytes a token instead ({output.prompt_tokens} prompt + "
        f"{output.completion_tokens} completion tokens against budget.maxTokens)",
    )


def _begin_turn(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    ctx = ag.context
    if ctx is None or ctx.turn != ag.turn:  # pragma: no cover - a context comes with each turn
        ag.stage = a.AgentStage.WAITING if ag.turn == 0 else ag.stage
        return
    if b.run.spec.suspend:
        return
    need = turn_needs(model_of(agent, ag), ctx, config)
    budget = b.run.spec.budget or m.Budget()
    usage = b.status.usage or m.Usage()
    note = ""
    if budget.max_tokens is not None:
        left = budget.max_tokens - usage.tokens
        if need > left:
            ag.stage = a.AgentStage.PAUSED
            return
        note = f"; {max(left, 0)} of budget.maxTokens {budget.max_tokens} left"
    resumed = " (resumed: the budget covers it now)" if ag.stage == a.AgentStage.PAUSED else ""
    name = model_step(ag.turn)
    b.steps[name] = m.StepStatus(name=name, phase=SP.PENDING)
    b.record(
        name,
        None,
        SP.PENDING,
        "TurnStarted",
        f"model turn {ag.turn} of {agent.max_turns}{resumed}: context {ctx.bytes} bytes, "
        f"needs up to {need} tokens{note}",
    )
    ag.stage = a.AgentStage.THINKING
    ag.turn_image = config.llm_image
    ag.turn_command = list(config.llm_command)
    ag.calls = None
    ag.finish_reason = None


def paused_message(
    agent: a.Agent, run: m.AgentRun, status: m.AgentRunStatus, cfg: AgentConfig
) -> str:
    ag = status.agent
    budget = run.spec.budget or m.Budget()
    used = (status.usage or m.Usage()).tokens
    if ag is None or ag.context is None or budget.max_tokens is None:
        return "paused"
    model = model_of(agent, ag)
    need = turn_needs(model, ag.context, cfg)
    return (
        f"paused before turn {ag.turn}: it may use {need} tokens (maxOutputTokens "
        f"{model.max_output_tokens} + about {need - model.max_output_tokens} of "
        f"prompt) but {max(budget.max_tokens - used, 0)} of budget.maxTokens "
        f"{budget.max_tokens} are left; raise spec.budget.maxTokens to resume"
    )


def _model_output(b: Host, ag: a.AgentStatus) -> cx.Output | str | None:
    st = b.steps.get(model_step(ag.turn))
    if st is None or st.phase != SP.SUCCEEDED:
        return None
    text = content_of(b, st)
    if text is None:
        return None
    return cx.parse_output(text, ag.turn)


def _take_output(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    name = model_step(ag.turn)
    st = b.steps.get(name)
    if st is None:  # the step was lost from status (an old operator, a hand edit): again
        b.steps[name] = m.StepStatus(name=name, phase=SP.PENDING)
        return
    if st.phase != SP.SUCCEEDED:
        _send_turn(b, ag, st)
        if ag.turn > 1:  # a run past its first turn likely goes on
            _prepare_next_turn(b, agent, ag, config)
        elif _offers_tools(agent):  # the first turn may answer: one pod at stake, not more
            _prepare_next_turn(b, agent, ag, config, 1)
        return
    output = _model_output(b, ag)
    if output is None:
        _wait(b)
        return
    mcp_schemas: dict[str, Mapping[str, Any]] = {}
    if agent.mcp_servers and not isinstance(output, str) and output.tool_calls:
        current = _previous_context(b, ag)  # this turn's: what the model was offered
        if current is None:
            _wait(b)
            return
        for tool in _mcp_definitions(agent, ag, current.tools):
            mcp_schemas[tool["function"]["name"]] = tool["function"].get("parameters") or {}
    if isinstance(output, str):
        text = f"turn {ag.turn}: the model step's result is not a turn's output: {output}"
        st.error = m.StepError(reason="InvalidModelOutput", message=text, at=b.now)
        b.move(st, SP.FAILED, "InvalidModelOutput", text)
        b.stop("InvalidModelOutput", text)
        return
    output = _bounded(agent, ag, output)
    if output.unreported:
        _note_unreported(b, ag, output)
    ag.prompt_tokens = min(ag.prompt_tokens + output.prompt_tokens, m.MAX_TOKENS)
    ag.completion_tokens = min(ag.completion_tokens + output.completion_tokens, m.MAX_TOKENS)
    ag.finish_reason = output.finish_reason
    if not output.tool_calls and output.finish_reason == CUT_OFF:
        _cut_off(b, agent, ag, st, output)
        return
    if not output.tool_calls:
        _answer(b, ag, st, output)
        return
    calls = validate_calls(b, agent, ag.turn, output.tool_calls, mcp_schemas, config)
    ag.calls = calls
    ag.children_started += sum(1 for c in calls if c.child is not None)
    invalid = [c for c in calls if c.problem]
    ag.tool_calls += len(calls)
    ag.invalid_tool_calls += len(invalid)
    for call in calls:
        if call.step is not None:
            b.steps[call.step] = m.StepStatus(name=call.step, phase=SP.PENDING)
    hashes = _args_hashes(b, config, {c.step for c in calls if c.step is not None})
    for index, call in enumerate(calls):
        if call.step is not None:
            h = hashes.get(call.step)
            b.record(
                call.step,
                None,
                SP.PENDING,
                "ToolCallAccepted",
                f"turn {ag.turn}: call {call.id} of {call.tool}"
                + (f" with args {h[:12]}" if h else ""),
            )
        else:
            b.record(
                call_step(ag.turn, index, call.tool),
                None,
                "Invalid",
                "ToolCallRefused",
                f"turn {ag.turn}: call {call.id} of {call.tool} not run: {call.problem}",
            )
    ag.stage = a.AgentStage.ACTING


def _args_hashes(b: Host, config: AgentConfig, names: set[str]) -> dict[str, str]:
    """The argsHash of the current turn's steps ``names`` (accepted calls'), by name: the one
    each one's launch computes and an approval of it binds to (never a digest of the
    arguments alone, which the history would show beside the argsHash as if another)."""
    hashes: dict[str, str] = {}
    for step in current_steps(b, config):
        if step.name not in names:
            continue
        resolved = resolve_inputs(b, step)
        h = args_hash(b.run, step, resolved[1]) if not isinstance(resolved, str) else None
        if h is not None:
            hashes[step.name] = h
    return hashes


def _answer(b: Host, ag: a.AgentStatus, st: m.StepStatus, output: cx.Output) -> None:
    """The model answered: the run's result. The answer is stored once, under the key
    ``answer`` of the turn's transcript record (whose ``turn`` entry names that key instead of
    holding it again), so the largest accepted answer (:data:`a.MAX_ANSWER_BYTES`) keeps the
    record within a ConfigMap's limit. A larger one fails the run."""
    answer = output.content
    size = len(answer.encode("utf-8", "surrogatepass"))
    if size > a.MAX_ANSWER_BYTES:
        record = _record(b, ag, st, output, [])
        record["content"] = answer[:1024]
        record["contentCut"] = size
        b.before.append(
            StoreRecord(
                record_name(b.run, ag.turn),
                KIND_TRANSCRIPT,
                ag.turn,
                (("turn", naming.canonical_json(record)),),
            )
        )
        _remember(ag, output, 0)
        ag.stage = a.AgentStage.STOPPED
        b.stop(
            "AnswerTooLarge",
            f"the model's answer in turn {ag.turn} is {size} bytes, more than the "
            f"{a.MAX_ANSWER_BYTES} a run accepts as its result (its first 1024 characters are "
            "in the transcript); ask for a shorter answer in spec.agent.instructions or lower "
            "spec.agent.model.maxOutputTokens",
        )
        return
    record = _record(b, ag, st, output, [], answer=True)
    record["content"] = None
    record["contentKey"] = ANSWER_KEY
    name = record_name(b.run, ag.turn)
    b.before.append(
        StoreRecord(
            name,
            KIND_TRANSCRIPT,
            ag.turn,
            (("turn", naming.canonical_json(record)), (ANSWER_KEY, answer)),
        )
    )
    if len(answer) <= a.MAX_ANSWER:
        ag.answer = answer
    else:
        ag.answer_ref = m.ResultRef(name=name, key=ANSWER_KEY)
    ag.answer_digest = naming.sha256_text(answer)
    _remember(ag, output, 0)
    ag.stage = a.AgentStage.ANSWERED


def _bounded(agent: a.Agent, ag: a.AgentStatus, output: cx.Output) -> cx.Output:
    """``output`` with its usage at most what the turn could have used (the reported numbers
    kept in ``reported_tokens``)."""
    ctx = ag.context
    if ctx is None:  # pragma: no cover - every turn has its context
        return output
    prompt = min(output.prompt_tokens, prompt_ceiling(ctx))
    completion = min(output.completion_tokens, model_of(agent, ag).max_output_tokens)
    if (prompt, completion) == (output.prompt_tokens, output.completion_tokens):
        return output
    reported = min(output.prompt_tokens + output.completion_tokens, m.MAX_TOKENS)
    return replace(
        output, prompt_tokens=prompt, completion_tokens=completion, reported_tokens=reported
    )


def _cut_off(
    b: Host, agent: a.Agent, ag: a.AgentStatus, st: m.StepStatus, output: cx.Output
) -> None:
    """The model stopped at its output limit without calling a tool: what it said is cut
    off, so it is not taken as the run's answer. The run fails (reason AnswerCutOff), with the
    text kept in the turn's transcript record; the message says how to go on."""
    record = _record(b, ag, st, output, [])
    record["cutOff"] = True
    b.before.append(
        StoreRecord(
            record_name(b.run, ag.turn),
            KIND_TRANSCRIPT,
            ag.turn,
            (("turn", naming.canonical_json(record)),),
        )
    )
    _remember(ag, output, 0)
    limit = model_of(agent, ag).max_output_tokens
    if ag.turn > 1:
        how = (
            f"raise spec.agent.model.maxOutputTokens in a fork from turn {ag.turn - 1} "
            f"(kubectl agentrun fork {b.run.metadata.name} --from {ag.turn - 1} --dry-run, "
            "edit, create)"
        )
    else:
        how = "create the run again with a larger spec.agent.model.maxOutputTokens"
    ag.stage = a.AgentStage.STOPPED
    b.stop(
        CUT_OFF_REASON,
        f"the model's answer in turn {ag.turn} was cut off at maxOutputTokens ({limit}; "
        f"finish reason {CUT_OFF}), so it is not the run's result (kubectl agentrun "
        f"transcript shows it); {how}",
    )


def _remember(ag: a.AgentStatus, output: cx.Output, invalid: int) -> None:
    recent = [*(ag.recent or []), _summary(ag.turn, output, invalid)]
    ag.recent = recent[-a.MAX_RECENT_TURNS :]


def _summary(turn: int, output: cx.Output, invalid: int) -> a.TurnSummary:
    return a.TurnSummary(
        turn=turn,
        tool_calls=len(output.tool_calls),
        invalid_calls=invalid,
        tokens=min(output.prompt_tokens + output.completion_tokens, m.MAX_TOKENS),
        reported_tokens=output.reported_tokens,
        finish_reason=output.finish_reason,
        summary=cx.output_summary(output),
    )


def _record(
    b: Host,
    ag: a.AgentStatus,
    model_st: m.StepStatus,
    output: cx.Output,
    calls: list[dict[str, Any]],
    *,
    answer: bool = False,
) -> dict[str, Any]:
    """A turn's transcript record (from committed records only)."""
    ctx = ag.context
    record: dict[str, Any] = {
        "turn": ag.turn,
        "step": model_st.name,
        "attempts": model_st.attempt,
        "finishedAt": model_st.finished_at.isoformat() if model_st.finished_at else None,
        "content": output.content,
        "finishReason": output.finish_reason,
        "model": output.model,
        "usage": {
            "promptTokens": output.prompt_tokens,
            "completionTokens": output.completion_tokens,
        },
        **({"reportedTokens": output.reported_tokens} if output.reported_tokens else {}),
        **({"usageEstimated": list(output.unreported)} if output.unreported else {}),
        "toolCalls": calls,
        "answer": answer,
    }
    if output.dropped_calls:
        record["droppedCalls"] = output.dropped_calls
    if ctx is not None:
        record["context"] = {
            "name": ctx.name,
            "bytes": ctx.bytes,
            "messages": ctx.messages,
            "pagedResults": ctx.paged_results,
            "omittedTurns": ctx.omitted_turns,
        }
    return record


def _send_turn(b: Host, ag: a.AgentStatus, st: m.StepStatus) -> None:
    """Once the turn's intent is committed and its pod runs, send the pod its request (the
    executor its attempt is bound to, if any: it answers a repeat without a second call)."""
    if st.phase not in (SP.LAUNCHING, SP.RUNNING) or not st.job_name:
        return
    if st.executor_pod is not None:
        holder = executor.holding(b, st)
        if holder is not None:
            b.after.extend(executor.request(ag, st, holder))
        return
    job = next((j for j in b.observed.jobs if j.name == st.job_name), None)
    if job is not None and job.attempt == st.attempt:
        b.after.extend(_request(ag, st, job))


def _unsettled(st: m.StepStatus | None) -> bool:
    return st is None or st.phase not in m.TERMINAL_STEP_PHASES


def _send_calls(b: Host, bound: list[m.StepStatus], config: AgentConfig) -> None:
    """Send the run's executor the request of each call's (or discovery's) attempt in
    ``bound`` (bound to an executor's pod), while it runs there (it answers a repeat without
    a second call: an operator restarted while the call ran asks for its outcome so)."""
    if not bound:
        return
    steps = {x.name: x for x in current_steps(b, config)}
    for st in bound:
        holder = executor.holding(b, st) if st.phase in (SP.LAUNCHING, SP.RUNNING) else None
        step = steps.get(st.name)
        if holder is not None and step is not None:
            b.after.extend(executor.call_request(st, step, holder, b.run))


def _request(ag: a.AgentStatus, st: m.StepStatus, job: ObservedJob) -> list[Action]:
    if job.state != JobState.ACTIVE:
        return []
    return executor.request_to(ag, st, job.name, job.address)


def _ahead(b: Host, name: str) -> AheadJob | None:
    """The model turn's Job ``name`` made ahead of its turn, as observed (None if none)."""
    return next((x for x in b.observed.ahead if x.job.name == name), None)


def launch_actions(
    b: Host, st: m.StepStatus, create: CreateJob, config: AgentConfig
) -> list[Action]:
    """What carries out a committed launch intent: its Job's create; for a model turn, or a
    call of an MCP server's tool or a discovery of its tools, that the run's executor takes
    (:mod:`agentrun.core.executor`),
    the request to it, once the intent (binding the attempt to the executor's pod) is
    committed; for a model turn whose
    Job this process made ahead of the turn (:class:`PrepareTurn`), none is needed, and its
    request goes as soon as the intent is committed when its pod runs already."""
    ag = b.status.agent
    model = is_model_turn(st.name)
    call = not model and executor.takes_call(b, create.step, len(create.input_env))
    holder = executor.usable(b, config) if model or call else None
    if st.executor_pod is not None:
        st.executor_pod = None  # an earlier attempt's: this one is bound anew
    if ag is not None and holder is not None:
        st.executor_pod = holder.pod_uid
        if call:
            return executor.call_request(st, create.step, holder, b.run)
        return executor.request(ag, st, holder)
    ahead = _ahead(b, create.job_name)
    if (
        ag is None
        or ahead is None
        or not ahead.trusted
        or create.attempt != 1
        or ahead.job.state != JobState.ACTIVE
        or ahead.job.deleting
    ):
        return [create]
    return _request(ag, st, ahead.job)


def clear_name(b: Host, name: str) -> bool:
    """Whether Job ``name`` is held by a stray (a model turn's Job made ahead that ended
    before its turn) or by a Job made ahead whose waiting pod ended or went before its turn
    (the Job controller has not failed it yet: a turn begun in it would fail); one that has
    ended, or lost its pod, is deleted, whatever the run's retention (no attempt ran in it),
    and let go a grace later (:func:`agentrun.core.settle.let_strays_go`)."""
    stray = next((j for j in b.observed.strays if j.name == name), None)
    if stray is not None:
        if stray.state != JobState.ACTIVE and not stray.deleting:
            b.after.append(DeleteJob(name, "EndedBeforeItsTurn"))
        return True
    ahead = _ahead(b, name)
    if ahead is None:
        return False
    if ahead.job.deleting:
        # Going, whoever deleted it: let go by the operator's finalizer, it may stay a while
        # (its pods are deleted first), and its deletion made it a generation this process
        # never created. A create under its name would meet it and take it for the attempt's.
        return True
    if not ahead.trusted:
        return False
    if ahead.job.state == JobState.ACTIVE and not ahead.job.pod_lost:
        return False
    b.after.append(DeleteJob(name, "EndedBeforeItsTurn"))
    return True


def _offers_tools(agent: a.Agent) -> bool:
    """Whether the model may call a tool: else its first answer is the run's."""
    return bool(agent.tools or agent.mcp_servers) and agent.tool_choice != "none"


def _prepare_next_turn(
    b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig, most: int | None = None
) -> None:
    """While the turn runs (its model call, then its calls), have the Jobs of the next
    :attr:`AgentConfig.turns_ahead` turns (``most``, if fewer) made and their pods started,
    so that a turn waits for no pod (a pod's start takes longer than a quick turn). During
    the first turn's model call only the second turn's is made, and only if the model is
    offered a tool: a run that answers at once leaves one pod unused, or none. A run that
    ends sooner leaves them unused: they go as strays. Not while a call waits for approval
    (that may take long) or the run is held, nor past the last turn."""
    if b.run.spec.suspend or b.run.spec.cancel or config.executor:
        return  # (with an executor, the next turns go to it: no Job is made for them)
    if any(
        b.steps.get(c.step or "") is not None
        and b.steps[c.step or ""].phase == SP.WAITING_FOR_APPROVAL
        for c in ag.calls or []
    ):
        return
    committed = b.run.status.agent if b.run.status is not None else None
    if committed is None:
        return
    if committed.turn != ag.turn and (
        committed.turn != ag.turn - 1
        or committed.stage not in (a.AgentStage.THINKING, a.AgentStage.ACTING)
    ):
        return  # the run as read is further behind: the next pass prepares
    # In the pass that begins a turn (the run as read a turn behind, mid-turn), its Jobs are
    # made after the write that begins it: the Jobs this pass knows of (observed.ahead, from
    # the run as read) are those of the next AHEAD_LIMIT turns after the one as read.
    count = config.turns_ahead if most is None else min(most, config.turns_ahead)
    last = min(ag.turn + count, agent.max_turns, committed.turn + AHEAD_LIMIT)
    if last <= ag.turn or not rights_confirmed(b, model_turn_step(b.run, ag, last, config)):
        # A turn's pod holds what its creator must be allowed to use (the model's API key
        # Secret): made, and let start, only while the shell found that granted within the
        # rights TTL, as a turn's own launch is (else each turn's Job is made at its launch).
        return
    for turn in range(ag.turn + 1, last + 1):
        name = naming.job_name(b.run.metadata.name, b.run.metadata.uid, model_step(turn), 1)
        ahead = _ahead(b, name)
        if clear_name(b, name):
            continue  # it ended before its turn: made again once it is gone
        if ahead is None:
            b.later.append(PrepareTurn(model_turn_step(b.run, ag, turn, config), name))
        elif ahead.trusted and ahead.job.start_pod is not None:
            b.later.append(StartPod(ahead.job.name, ahead.job.start_pod))


def _close_turn(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    calls = ag.calls or []
    running = [b.steps.get(c.step) for c in calls if c.step and _unsettled(b.steps.get(c.step))]
    if running:  # still running, waiting for approval or retrying
        _send_calls(b, [st for st in running if st is not None and st.executor_pod], config)
        _prepare_next_turn(b, agent, ag, config)
        return
    output = _model_output(b, ag)
    if output is None or isinstance(output, str):  # read in the pass that took it
        _wait(b)
        return
    output = _bounded(agent, ag, output)
    outcomes: list[dict[str, Any]] = []
    for call in calls:
        outcome = call_outcome(b, call)
        if outcome is None:
            _wait(b)
            return
        outcomes.append(outcome)
    previous = _previous_context(b, ag)
    if previous is None:
        _wait(b)
        return
    model_st = b.steps[model_step(ag.turn)]
    records: list[dict[str, Any]] = []
    marked = resuming.conversation_turn(ag)
    messages = [cx.assistant_message(marked, _as_called(output, calls))]
    for call, outcome in zip(calls, outcomes, strict=True):
        full = outcome.pop("answer", None)
        result = outcome.get("result")
        if result is not None:
            answer = cut(result, config.tool_result_bytes) or "(no output)"
            outcome["result"] = cut(result, config.tool_result_bytes)
        else:
            answer = str(full)
        summary = outcome.get("summary") or summary_line(answer) or "(no output)"
        messages.append(cx.tool_message(marked, call.id, answer, summary))
        records.append({"id": call.id, "name": call.tool, "arguments": call.arguments, **outcome})
    record = _record(b, ag, model_st, output, records)
    b.before.append(
        StoreRecord(
            record_name(b.run, ag.turn),
            KIND_TRANSCRIPT,
            ag.turn,
            (("turn", naming.canonical_json(record)),),
        )
    )
    _remember(ag, output, sum(1 for c in calls if c.problem))
    for name in dynamic_names(ag):
        st = b.steps.pop(name, None)
        if st is not None:
            b.closed[name] = st
    nxt = previous.extended(
        ag.turn + 1,
        messages,
        tools=[*_tools(agent), *_mcp_definitions(agent, ag, previous.tools)],
        previous=ag.context.digest if ag.context is not None else None,
    )
    # Stored even after the last turn: a fork from this turn continues with it.
    _store_context(b, ag, cx.page(nxt, agent.context_bytes))
    if ag.turn >= agent.max_turns:
        ag.stage = a.AgentStage.STOPPED
        b.stop(
            "MaxTurnsReached",
            f"the model was still calling tools in turn {ag.turn}, the last one "
            f"(spec.agent.maxTurns {agent.max_turns}), and gave no answer",
        )
        return
    ag.turn += 1
    ag.calls = None
    ag.finish_reason = None
    ag.stage = a.AgentStage.READY


def _as_called(output: cx.Output, calls: Sequence[a.ToolCallStatus]) -> cx.Output:
    """The output with exactly the calls recorded (ids as normalized)."""
    return cx.Output(
        content=output.content,
        tool_calls=tuple(cx.ToolCall(c.id, c.tool, c.arguments) for c in calls),
        finish_reason=output.finish_reason,
    )


def _previous_context(b: Host, ag: a.AgentStatus) -> cx.Context | None:
    ctx = ag.context
    if ctx is None:  # pragma: no cover - every turn has its context
        return cx.Context(turn=ag.turn, messages=[])
    written = next((x for x in b.before if isinstance(x, StoreRecord) and x.name == ctx.name), None)
    parts: list[str] = []
    for i in range(ctx.parts):
        key = (ctx.name, f"part-{i}")
        text = dict(written.data).get(key[1]) if written is not None else None
        if text is None:
            text = b.observed.documents.get(key)
        if text is None:
            return None
        parts.append(text)
    # The text as stored is what the committed digest is of (Context.encoded): checked as it
    # is, not encoded again. The document as this process stored it, when these are its
    # parts, is taken as it is rather than parsed again.
    doc: cx.Context | str | None = None
    if naming.sha256_text("".join(parts)) == ctx.digest:
        stored = written.stored if written is not None else b.observed.contexts.get(ctx.name)
        doc = stored.document(parts, ctx.digest) if stored is not None else None
        if doc is None:
            doc = cx.Context.from_parts(parts)
    if doc is None or isinstance(doc, str):
        # Changed under us: the turn cannot be continued from it. Start from the first
        # messages again, saying so (the transcript keeps everything).
        return cx.Context(
            turn=ag.turn,
            messages=[{"role": "user", "content": "[the earlier context could not be read]"}],
        )
    return doc


# ---------------------------------------------------------------------------------------------
# The run's phase, progress and end
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settled:
    """The run's phase as the loop sees it."""

    phase: m.RunPhase
    reason: str
    message: str
    done: bool = False


def settled(run: m.AgentRun, status: m.AgentRunStatus, config: AgentConfig) -> Settled | None:
    """The phase an agent run is in, when the loop decides it; None for a plan-only run and
    while the plan runs."""
    agent = run.spec.agent
    ag = status.agent
    if agent is None or ag is None:
        return None
    if ag.stage == a.AgentStage.ANSWERED:
        said = ag.recent[-1].summary if ag.recent else None
        return Settled(
            m.RunPhase.SUCCEEDED,
            "Succeeded",
            f"the model answered in turn {ag.turn}" + (f": {said}" if said else ""),
            done=True,
        )
    if ag.stage == a.AgentStage.PAUSED:
        return Settled(
            m.RunPhase.SUSPENDED, "BudgetExhausted", paused_message(agent, run, status, config)
        )
    if ag.stage == a.AgentStage.WAITING:
        return None
    return Settled(m.RunPhase.RUNNING, "Running", f"turn {ag.turn}: {str(ag.stage).lower()}")


def finish(run: m.AgentRun, status: m.AgentRunStatus) -> None:
    """Progress of an agent run (``turn N/maxTurns``), and the loop's end with the run's."""
    agent = run.spec.agent
    ag = status.agent
    if ag is None:
        return
    if agent is not None and ag.turn > 0:
        status.progress = f"turn {ag.turn}/{agent.max_turns}"
    if status.phase in m.TERMINAL_RUN_PHASES and ag.stage != a.AgentStage.ANSWERED:
        ag.stage = a.AgentStage.STOPPED
