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
    never more than it could have used (:func:`~agentrun.core.agent_budget.counted_tokens`); a
    count it did not report, as ``agentrun step llm`` estimated it, which the run is told of
    (:func:`~agentrun.core.agent_budget._note_unreported`).
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

The loop's pass is spread over modules of one concern each: this one reads the records and
moves through the stages; :mod:`agentrun.core.agent_start` starts the loop (the first turn's
context, the MCP servers' tools), :mod:`agentrun.core.agent_budget` begins a turn when the
budget covers it and counts its tokens, :mod:`agentrun.core.agent_output` takes a turn's output
and closes the turn, and :mod:`agentrun.core.agent_launch` carries out the launches.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import executor
from agentrun.core import frozen as freezing
from agentrun.core.agent_budget import _begin_turn, paused_message
from agentrun.core.agent_output import _close_turn, _take_output
from agentrun.core.agent_start import _start
from agentrun.core.calls import validate_calls
from agentrun.core.turn_steps import current_steps, dynamic_steps, executor_checks, model_turn_step
from agentrun.core.turns import (
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
    committed,
    compacted,
    context_inputs,
    context_name,
    discovery_step,
    dynamic_names,
    idempotency_key,
    image_exempt,
    is_agent_run,
    is_model_turn,
    is_tool_step,
    model_of,
    model_step,
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
    "AgentConfig",
    "Host",
    "Settled",
    "advance",
    "ahead_names",
    "committed",
    "compacted",
    "context_inputs",
    "context_name",
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
    "model_of",
    "model_step",
    "model_turn_step",
    "pauses_for_tokens",
    "pin",
    "prompt_ceiling",
    "record_name",
    "rights_confirmed",
    "settled",
    "tool_choice_of",
    "transcript_prefix",
    "turn_needs",
    "turn_of_step",
    "validate_calls",
    "wanted_documents",
]

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
    ag = status.agent or agent_status.AgentStatus()
    steps = {st.name: st for st in status.steps or []}
    wanted: list[DocumentKey] = []
    if ag.stage == agent_status.AgentStage.WAITING:
        sts = [steps.get(s.name) for s in run.spec.plan.steps]
        if all(st is not None and st.phase in (SP.SUCCEEDED, SP.SKIPPED) for st in sts):
            for st in sts:
                wanted += _ref_of(st)
            for server in agent.mcp_servers or []:
                wanted += _ref_of(steps.get(discovery_step(server.name)))
    elif ag.stage == agent_status.AgentStage.THINKING:
        wanted += _ref_of(steps.get(model_step(ag.turn)))
        if agent.mcp_servers and ag.context is not None:
            # The definitions of the MCP tools offered, which calls are checked against.
            wanted += [(ag.context.name, f"part-{i}") for i in range(ag.context.parts)]
    elif ag.stage == agent_status.AgentStage.ACTING:
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
        ag = b.status.agent = agent_status.AgentStatus()
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
    ag = b.status.agent or agent_status.AgentStatus()
    b.status.agent = ag
    if ag.transcript is None:
        ag.transcript = transcript_prefix(b.run)
    if (
        ag.stage in (agent_status.AgentStage.ANSWERED, agent_status.AgentStage.STOPPED)
        or b.halt is not None
    ):
        return
    _move(b, agent, ag, config)
    executor.keep(b, agent, ag, config)


def _move(b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig) -> None:
    for _ in range(4):
        before = (ag.stage, ag.turn)
        if ag.stage == agent_status.AgentStage.WAITING:
            _start(b, agent, ag, config)
        elif ag.stage in (agent_status.AgentStage.READY, agent_status.AgentStage.PAUSED):
            _begin_turn(b, agent, ag, config)
        elif ag.stage == agent_status.AgentStage.THINKING:
            _take_output(b, agent, ag, config)
        elif ag.stage == agent_status.AgentStage.ACTING:
            _close_turn(b, agent, ag, config)
        if (ag.stage, ag.turn) == before or b.halt is not None:
            return


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
    if ag.stage == agent_status.AgentStage.ANSWERED:
        said = ag.recent[-1].summary if ag.recent else None
        return Settled(
            m.RunPhase.SUCCEEDED,
            "Succeeded",
            f"the model answered in turn {ag.turn}" + (f": {said}" if said else ""),
            done=True,
        )
    if ag.stage == agent_status.AgentStage.PAUSED:
        return Settled(
            m.RunPhase.SUSPENDED, "BudgetExhausted", paused_message(agent, run, status, config)
        )
    if ag.stage == agent_status.AgentStage.WAITING:
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
    if status.phase in m.TERMINAL_RUN_PHASES and ag.stage != agent_status.AgentStage.ANSWERED:
        ag.stage = agent_status.AgentStage.STOPPED
