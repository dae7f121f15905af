"""The agent loop, pure: model turns and tool calls as steps of the run.

An agent run (``spec.agent``) moves through stages (``status.agent.stage``):

``Waiting``
    The plan's steps run first. When every one of them succeeded (or was skipped), the first
    turn's context is assembled: the system message (``instructions``) and one user message,
    the goal followed by the plan's results (each step's summary and result, in plan order).
``Ready`` / ``Paused``
    The context of turn N is stored (a ConfigMap, see :mod:`agentrun.core.context`). Before
    the turn starts, the tokens left (``budget.maxTokens`` minus what was used) are checked
    against what the turn may use: ``maxOutputTokens`` plus the context's size at 4 bytes a
    token. When they do not cover it the loop is ``Paused`` (run phase Suspended, reason
    BudgetExhausted) until ``spec.budget.maxTokens`` is raised.
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
    The model answered without calling a tool: the answer is the run's result.

When every call of turn N has an outcome, the turn is closed: its transcript record (the
assistant message, each call with its arguments, outcome, approval and result, usage) is
written to a ConfigMap owned by the run, the context of turn N+1 is assembled from turn N's
context and that record and paged to ``contextBytes``, the turn's steps leave
``status.steps`` (the record keeps them), and turn N+1 is ready. A model still calling tools
in turn ``maxTurns`` fails the run with reason MaxTurnsReached.

Everything the loop reads beyond the status comes from committed records: results kept in
ConfigMaps and the previous context are read by the shell when :func:`wanted_documents` asks
for them (``Observed.documents``). A stage that needs one not yet read simply waits for the
next pass.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import jsonschema
import jsonschema.exceptions

from agentrun.api import agent as a
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import context as cx
from agentrun.core import naming
from agentrun.core.actions import Action, DeleteJob, StoreRecord, StoreResult
from agentrun.core.envelope import clean, summary_line
from agentrun.core.observed import Observed

# Environment of model turns and tool calls (besides the AGENTRUN_* identity of every step).
ENV_TOOL_ARGS = "AGENTRUN_TOOL_ARGS"
ENV_TOOL_NAME = "AGENTRUN_TOOL_NAME"
ENV_TOOL_CALL_ID = "AGENTRUN_TOOL_CALL_ID"
ENV_TURN = "AGENTRUN_TURN"
ENV_MODEL_BASE_URL = "AGENTRUN_MODEL_BASE_URL"
ENV_MODEL_NAME = "AGENTRUN_MODEL_NAME"
ENV_MODEL_TEMPERATURE = "AGENTRUN_MODEL_TEMPERATURE"
ENV_MODEL_MAX_OUTPUT_TOKENS = "AGENTRUN_MODEL_MAX_OUTPUT_TOKENS"
ENV_MODEL_API_KEY = "AGENTRUN_MODEL_API_KEY"
ENV_CONTEXT_PARTS = "AGENTRUN_CONTEXT_PARTS"
ENV_CONTEXT_SHA256 = "AGENTRUN_CONTEXT_SHA256"
ENV_CONTEXT_PART = "AGENTRUN_CONTEXT_PART_"
"""``AGENTRUN_CONTEXT_PART_0`` ... : the parts of the context document."""
CONTEXT_INPUT = "AGENTRUN_CONTEXT"
"""The name the context's digest has among a model turn's inputs (in its args hash)."""
RESERVED_ENV = frozenset(
    {ENV_TOOL_ARGS, ENV_TOOL_NAME, ENV_TOOL_CALL_ID, ENV_TURN}
)  # a tool's own env may not set these

KIND_TRANSCRIPT = "transcript"
KIND_CONTEXT = "context"
MODEL = "model"
_DYNAMIC = re.compile(r"^t([0-9]+)-")
_LABEL = re.compile(r"[^a-z0-9-]+")
WAIT_SECONDS = 1
"""A stage waiting for a record the shell has not read yet looks again this soon."""


@dataclass(frozen=True)
class AgentConfig:
    """Operator settings of the loop (not user API)."""

    llm_image: str = "agentrun-operator:0.1.0"
    """Image of model turns: the operator's own (it has ``agentrun step llm``)."""
    llm_command: tuple[str, ...] = ("agentrun", "step", "llm")
    bytes_per_token: int = 4
    """How the prompt's tokens are estimated before a turn, for the budget."""
    tool_result_bytes: int = 16 * 1024
    """Most bytes of one tool result (or plan step result) put into the context and the
    transcript record; the whole result stays where the step committed it."""


class Host(Protocol):
    """What the state machine's working state offers the loop (machine._Builder)."""

    @property
    def run(self) -> m.AgentRun: ...
    @property
    def observed(self) -> Observed: ...
    @property
    def now(self) -> datetime: ...
    @property
    def status(self) -> m.AgentRunStatus: ...
    @property
    def steps(self) -> dict[str, m.StepStatus]: ...
    @property
    def before(self) -> list[Action]: ...
    @property
    def after(self) -> list[Action]: ...
    @property
    def halt(self) -> object: ...

    def record(
        self,
        step: str | None,
        old: str | None,
        new: str,
        reason: str,
        msg: str,
        by: str | None = None,
    ) -> None: ...

    def move(
        self, st: m.StepStatus, phase: SP, reason: str, msg: str, by: str | None = None
    ) -> None: ...

    def stop(self, reason: str, message: str) -> None: ...

    def timer(self, at: datetime | None) -> None: ...


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------


def model_step(turn: int) -> str:
    """The step of model turn ``turn``."""
    return f"t{turn}-{MODEL}"


def call_step(turn: int, index: int, tool: str) -> str:
    """The step of call ``index`` (0-based) of turn ``turn``: a DNS label."""
    label = _LABEL.sub("-", tool.lower()).strip("-") or "tool"
    return f"t{turn}-{index}-{label}"[: naming.MAX_NAME].rstrip("-")


def turn_of_step(name: str) -> int | None:
    found = _DYNAMIC.match(name)
    return int(found.group(1)) if found else None


def _run_digest(run: m.AgentRun, *parts: str) -> str:
    return naming.sha256_text("\x00".join([run.metadata.uid, *parts]))


def record_name(run: m.AgentRun, turn: int) -> str:
    """The transcript record of turn ``turn`` (sorted by name, records are in turn order)."""
    return naming.dns_label(f"{run.metadata.name}-transcript", f"{_run_digest(run)[:8]}-{turn:04d}")


def transcript_prefix(run: m.AgentRun) -> str:
    """What every record name of the run starts with (then ``-{turn:04d}``)."""
    return record_name(run, 0)[:-5]


def context_name(run: m.AgentRun, turn: int, digest: str) -> str:
    """The ConfigMap of a turn's context; its content decides its name."""
    return naming.dns_label(
        f"{run.metadata.name}-context", f"{_run_digest(run, digest)[:10]}-{turn:04d}"
    )


# ---------------------------------------------------------------------------------------------
# The steps of the loop, as the state machine runs them
# ---------------------------------------------------------------------------------------------


def is_agent_run(run: m.AgentRun) -> bool:
    return run.spec.agent is not None


def dynamic_names(status: a.AgentStatus | None) -> set[str]:
    """The steps of the current turn (whether they exist yet or not)."""
    if status is None or status.turn == 0:
        return set()
    names = {model_step(status.turn)}
    names |= {c.step for c in status.calls or [] if c.step}
    return names


def is_tool_step(status: a.AgentStatus | None, name: str) -> bool:
    return status is not None and any(c.step == name for c in status.calls or [])


def _env(name: str, value: str) -> m.EnvVar:
    return m.EnvVar.model_construct(name=name, value=value, value_from=None)


def model_turn_step(
    run: m.AgentRun, status: a.AgentStatus, ctx: a.ContextStatus, config: AgentConfig
) -> m.Step:
    """The step of the model turn ``ctx`` was assembled for, with the image and command
    committed when the turn started (the operator's settings before that)."""
    agent = run.spec.agent
    assert agent is not None
    image = status.turn_image or config.llm_image
    command = list(status.turn_command or config.llm_command)
    model = agent.model
    env = [
        _env(ENV_TURN, str(ctx.turn)),
        _env(ENV_MODEL_BASE_URL, model.base_url),
        _env(ENV_MODEL_NAME, model.name),
        _env(ENV_MODEL_MAX_OUTPUT_TOKENS, str(model.max_output_tokens)),
        _env(ENV_CONTEXT_SHA256, ctx.digest),
        _env(ENV_CONTEXT_PARTS, str(ctx.parts)),
    ]
    if model.temperature is not None:
        env.append(_env(ENV_MODEL_TEMPERATURE, repr(model.temperature)))
    if model.api_key_secret_ref is not None:
        ref = model.api_key_secret_ref
        env.append(
            m.EnvVar(
                name=ENV_MODEL_API_KEY,
                value_from=m.EnvVarSource(
                    secret_key_ref=m.SecretKeySelector(name=ref.name, key=ref.key)
                ),
            )
        )
    container = m.ContainerAction.model_construct(image=image, command=command, env=env)
    return m.Step.model_construct(
        name=model_step(ctx.turn),
        description=f"model turn {ctx.turn}",
        container=container,
        risk=m.Risk.READ,
        approval=m.ApprovalMode.AUTO,
        on_rejection=m.OnRejection.FAIL_RUN,
        retry=model.retry,
        timeout_seconds=model.timeout_seconds,
    )


def context_inputs(
    status: a.AgentStatus | None, step: str
) -> tuple[list[m.EnvVar], dict[str, str]]:
    """The inputs of a model turn's step: the parts of its context, by reference to the
    run's own ConfigMap (``AGENTRUN_CONTEXT_PART_{i}``), and their digest for the args hash.
    Nothing for any other step. Like the inputs of plan steps, they name an object the
    operator wrote, so they are not checked against the creator's rights."""
    ctx = status.context if status is not None else None
    if status is None or ctx is None or step != model_step(status.turn) or ctx.turn != status.turn:
        return [], {}
    env = [
        m.EnvVar(
            name=f"{ENV_CONTEXT_PART}{i}",
            value_from=m.EnvVarSource(
                config_map_key_ref=m.ConfigMapKeySelector(name=ctx.name, key=f"part-{i}")
            ),
        )
        for i in range(ctx.parts)
    ]
    return env, {CONTEXT_INPUT: ctx.digest}


def tool_call_step(turn: int, call: a.ToolCallStatus, tool: a.AgentTool) -> m.Step:
    """The step of a valid tool call: the tool's container with the call's arguments."""
    assert call.step is not None
    own = [e for e in tool.container.env or [] if e.name not in RESERVED_ENV]
    env = [
        *own,
        _env(ENV_TOOL_NAME, tool.name),
        _env(ENV_TOOL_CALL_ID, call.id),
        _env(ENV_TURN, str(turn)),
        _env(ENV_TOOL_ARGS, call.arguments),
    ]
    container = tool.container.model_copy(update={"env": env})
    return m.Step.model_construct(
        name=call.step,
        description=f"turn {turn}: call {call.id} of {tool.name}",
        container=container,
        risk=tool.risk,
        approval=tool.approval,
        # A refused call is answered to the model; the run goes on.
        on_rejection=m.OnRejection.SKIP_STEP,
        retry=tool.retry,
        timeout_seconds=tool.timeout_seconds,
    )


def dynamic_steps(
    run: m.AgentRun, steps: Mapping[str, m.StepStatus], config: AgentConfig
) -> list[m.Step]:
    """The steps of the current turn that exist in ``steps``, as the machine runs them."""
    agent = run.spec.agent
    status = run.status.agent if run.status else None
    return _dynamic(agent, status, steps, run, config)


def _dynamic(
    agent: a.Agent | None,
    status: a.AgentStatus | None,
    steps: Mapping[str, m.StepStatus],
    run: m.AgentRun,
    config: AgentConfig,
) -> list[m.Step]:
    if agent is None or status is None or status.turn == 0:
        return []
    found: list[m.Step] = []
    ctx = status.context
    if model_step(status.turn) in steps and ctx is not None and ctx.turn == status.turn:
        found.append(model_turn_step(run, status, ctx, config))
    tools = {t.name: t for t in agent.tools or []}
    for call in status.calls or []:
        if call.step and call.step in steps and call.tool in tools:
            found.append(tool_call_step(status.turn, call, tools[call.tool]))
    return found


def current_steps(b: Host, config: AgentConfig) -> list[m.Step]:
    """The current turn's steps, from the status being derived."""
    return _dynamic(b.run.spec.agent, b.status.agent, b.steps, b.run, config)


def idempotency_key(
    run: m.AgentRun, status: a.AgentStatus | None, step: str, args_hash: str
) -> str | None:
    """``{run uid}:{turn}:{call id}:{args hash}`` for a tool call of the current turn
    (``model`` for the call id of a model turn); None for a plan step."""
    if run.spec.agent is None or status is None:
        return None
    turn = turn_of_step(step)
    if turn is None or turn != status.turn:
        return None
    if step == model_step(turn):
        return f"{run.metadata.uid}:{turn}:{MODEL}:{args_hash}"
    call = next((c for c in status.calls or [] if c.step == step), None)
    return f"{run.metadata.uid}:{turn}:{call.id}:{args_hash}" if call else None


def image_exempt(status: a.AgentStatus | None, step: str) -> bool:
    """Model turns run the operator's own image, which policy.allowedImages does not govern
    (a tool's image is checked when its call is validated)."""
    return status is not None and status.turn > 0 and step == model_step(status.turn)


def pauses_for_tokens(run: m.AgentRun, status: m.AgentRunStatus) -> bool:
    """Whether the token budget pauses the loop instead of failing the run: once the agent
    has started (the plan before it is held to budget.maxTokens as plan runs are)."""
    return run.spec.agent is not None and status.agent is not None and status.agent.turn > 0


def committed(run: m.AgentRun, step: str) -> bool:
    """Whether ``step`` may be launched in this pass: a plan step always; a step of the loop
    (a new turn's model step, a new tool call) only once the status as read has it, so that
    the shell checked what it uses (the API key Secret, a tool's env) against the creator's
    rights (agentrun.authz) before its launch is decided."""
    if run.spec.agent is None or run.step(step) is not None:
        return True
    return any(st.name == step for st in (run.status.steps if run.status else None) or [])


def compacted(run: m.AgentRun, step: str) -> bool:
    """Whether ``step`` belongs to a closed turn (its outcome lives in the transcript)."""
    status = run.status.agent if run.status else None
    if run.spec.agent is None or status is None or run.step(step) is not None:
        return False
    turn = turn_of_step(step)
    return turn is not None and turn < status.turn


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
    before the first turn, a model turn's output kept by reference, and, once a turn's calls
    all have outcomes, the turn's context and the results kept by reference."""
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
    elif ag.stage == a.AgentStage.THINKING:
        wanted += _ref_of(steps.get(model_step(ag.turn)))
    elif ag.stage == a.AgentStage.ACTING:
        calls = [steps.get(c.step) for c in ag.calls or [] if c.step]
        if all(st is not None and st.phase in m.TERMINAL_STEP_PHASES for st in calls):
            if ag.context is not None:
                wanted += [(ag.context.name, f"part-{i}") for i in range(ag.context.parts)]
            wanted += _ref_of(steps.get(model_step(ag.turn)))
            for st in calls:
                wanted += _ref_of(st)
    return wanted


def _content(b: Host, st: m.StepStatus) -> str | None:
    """A succeeded step's whole result: inline, stored in this pass, or read by the shell;
    None while it has not been read."""
    if st.result_ref is None:
        return st.result if st.result is not None else ""
    ref = st.result_ref
    for action in b.before:
        if isinstance(action, StoreResult) and action.name == ref.name:
            return dict(action.data).get(ref.key)
    text = b.observed.documents.get((ref.name, ref.key))
    if text is not None and st.result_digest and naming.sha256_text(text) != st.result_digest:
        return f"[the stored result does not match its digest {st.result_digest[:12]}]"
    return text


def _cut(text: str, limit: int) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f" …[{len(data) - limit} more bytes]"


# ---------------------------------------------------------------------------------------------
# One pass of the loop
# ---------------------------------------------------------------------------------------------


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
    _cancel_orphans(b, agent, ag)
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


def _cancel_orphans(b: Host, agent: a.Agent, ag: a.AgentStatus) -> None:
    """Calls of a tool removed from spec.agent.tools cannot run: stop them."""
    tools = {t.name for t in agent.tools or []}
    for call in ag.calls or []:
        st = b.steps.get(call.step or "")
        if st is None or call.tool in tools or st.phase in m.TERMINAL_STEP_PHASES:
            continue
        if st.phase in m.ACTIVE_STEP_PHASES and st.job_name:
            b.after.append(DeleteJob(st.job_name, "ToolRemoved"))
        text = f"tool {call.tool} was removed from spec.agent.tools"
        st.error = m.StepError(reason="ToolRemoved", message=text, at=b.now)
        st.finished_at = b.now
        b.move(st, SP.CANCELLED, "ToolRemoved", text)


def _store_context(b: Host, ag: a.AgentStatus, ctx: cx.Context) -> None:
    parts = ctx.parts()
    digest = ctx.digest()
    name = context_name(b.run, ctx.turn, digest)
    data = tuple((f"part-{i}", part) for i, part in enumerate(parts))
    b.before.append(StoreRecord(name, KIND_CONTEXT, ctx.turn, data))
    ag.context = a.ContextStatus(
        turn=ctx.turn,
        name=name,
        parts=len(parts),
        digest=digest,
        bytes=ctx.bytes + ctx.tools_bytes,
        messages=len(ctx.messages),
        paged_results=ctx.paged_results,
        omitted_turns=ctx.omitted_turns,
    )


def _tools(agent: a.Agent) -> list[dict[str, Any]]:
    return cx.tool_definitions((t.name, t.description, t.parameters) for t in agent.tools or [])


def _start(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    """Once the plan is done: the first turn's context."""
    plan = b.run.spec.plan.steps
    sts = [b.steps[s.name] for s in plan if s.name in b.steps]
    if len(sts) != len(plan) or any(st.phase not in (SP.SUCCEEDED, SP.SKIPPED) for st in sts):
        return
    sections: list[str] = []
    for st in sts:
        if st.phase == SP.SKIPPED:
            sections.append(f"## step {st.name}: skipped ({st.message or 'not run'})")
            continue
        text = _content(b, st)
        if text is None:
            _wait(b)
            return
        lines = [f"## step {st.name}: succeeded"]
        if st.summary:
            lines.append(f"summary: {st.summary}")
        if text:
            lines.append(_cut(text, config.tool_result_bytes))
        sections.append("\n".join(lines))
    user = b.run.spec.goal
    if sections:
        user += "\n\n# Results of the plan's steps, which ran before you\n\n" + "\n\n".join(
            sections
        )
    first = cx.Context(
        turn=1, messages=cx.first_messages(agent.instructions, user), tools=_tools(agent)
    )
    _store_context(b, ag, cx.page(first, agent.context_bytes))
    ag.turn = 1
    ag.stage = a.AgentStage.READY
    b.record(
        None,
        str(b.status.phase) if b.status.phase else None,
        str(b.status.phase or m.RunPhase.RUNNING),
        "AgentStarted",
        f"the agent starts: model {agent.model.name} at {agent.model.base_url}, "
        f"{len(agent.tools or [])} tools, up to {agent.max_turns} turns",
    )


def turn_needs(agent: a.Agent, ctx: a.ContextStatus, config: AgentConfig) -> int:
    """Tokens a turn may use: its output limit and its prompt, estimated from its size."""
    return agent.model.max_output_tokens + math.ceil(ctx.bytes / config.bytes_per_token)


def _begin_turn(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    ctx = ag.context
    if ctx is None or ctx.turn != ag.turn:  # pragma: no cover - a context comes with each turn
        ag.stage = a.AgentStage.WAITING if ag.turn == 0 else ag.stage
        return
    if b.run.spec.suspend:
        return
    need = turn_needs(agent, ctx, config)
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
    need = turn_needs(agent, ag.context, cfg)
    return (
        f"paused before turn {ag.turn}: it may use {need} tokens (maxOutputTokens "
        f"{agent.model.max_output_tokens} + about {need - agent.model.max_output_tokens} of "
        f"prompt) but {max(budget.max_tokens - used, 0)} of budget.maxTokens "
        f"{budget.max_tokens} are left; raise spec.budget.maxTokens to resume"
    )


def _model_output(b: Host, ag: a.AgentStatus) -> cx.Output | str | None:
    st = b.steps.get(model_step(ag.turn))
    if st is None or st.phase != SP.SUCCEEDED:
        return None
    text = _content(b, st)
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
        return
    output = _model_output(b, ag)
    if output is None:
        _wait(b)
        return
    if isinstance(output, str):
        text = f"turn {ag.turn}: the model step's result is not a turn's output: {output}"
        st.error = m.StepError(reason="InvalidModelOutput", message=text, at=b.now)
        b.move(st, SP.FAILED, "InvalidModelOutput", text)
        b.stop("InvalidModelOutput", text)
        return
    ag.prompt_tokens = min(ag.prompt_tokens + output.prompt_tokens, m.MAX_TOKENS)
    ag.completion_tokens = min(ag.completion_tokens + output.completion_tokens, m.MAX_TOKENS)
    ag.finish_reason = output.finish_reason
    if not output.tool_calls:
        _answer(b, ag, st, output)
        return
    calls = validate_calls(b, agent, ag.turn, output.tool_calls)
    ag.calls = calls
    invalid = [c for c in calls if c.problem]
    ag.tool_calls += len(calls)
    ag.invalid_tool_calls += len(invalid)
    for index, call in enumerate(calls):
        if call.step is not None:
            b.steps[call.step] = m.StepStatus(name=call.step, phase=SP.PENDING)
            b.record(
                call.step,
                None,
                SP.PENDING,
                "ToolCallAccepted",
                f"turn {ag.turn}: call {call.id} of {call.tool} with args "
                f"{naming.sha256_text(call.arguments)[:12]}",
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


def _answer(b: Host, ag: a.AgentStatus, st: m.StepStatus, output: cx.Output) -> None:
    answer = output.content
    record = _record(b, ag, st, output, [], answer=True)
    name = record_name(b.run, ag.turn)
    b.before.append(
        StoreRecord(
            name,
            KIND_TRANSCRIPT,
            ag.turn,
            (("turn", naming.canonical_json(record)), ("answer", answer)),
        )
    )
    if len(answer) <= a.MAX_ANSWER:
        ag.answer = answer
    else:
        ag.answer_ref = m.ResultRef(name=name, key="answer")
    ag.answer_digest = naming.sha256_text(answer)
    _remember(ag, output, 0)
    ag.stage = a.AgentStage.ANSWERED


def _remember(ag: a.AgentStatus, output: cx.Output, invalid: int) -> None:
    recent = [*(ag.recent or []), _summary(ag.turn, output, invalid)]
    ag.recent = recent[-a.MAX_RECENT_TURNS :]


def _summary(turn: int, output: cx.Output, invalid: int) -> a.TurnSummary:
    return a.TurnSummary(
        turn=turn,
        tool_calls=len(output.tool_calls),
        invalid_calls=invalid,
        tokens=min(output.prompt_tokens + output.completion_tokens, m.MAX_TOKENS),
        finish_reason=output.finish_reason,
        summary=cx.output_summary(output),
    )


def _allowed(run: m.AgentRun, image: str) -> bool:
    allowed = run.spec.policy.allowed_images if run.spec.policy else None
    return allowed is None or any(image.startswith(p) for p in allowed)


def _schema_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        validator = validator_class(schema)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    except jsonschema.exceptions.SchemaError as e:
        return f"the tool's parameters are not a valid JSON Schema: {e.message[:200]}"
    except Exception as e:  # a user-written schema may fail in any way (unresolvable $ref...)
        return f"the arguments could not be checked against the tool's parameters: {e}"[:300]
    if not errors:
        return None
    said = []
    for error in errors[:3]:
        where = "/".join(str(p) for p in error.absolute_path) or "(the arguments)"
        said.append(f"{where}: {error.message[:200]}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "the arguments do not match the tool's parameters: " + "; ".join(said) + more


def validate_calls(
    b: Host, agent: a.Agent, turn: int, calls: Sequence[cx.ToolCall]
) -> list[a.ToolCallStatus]:
    """Every call, valid (with its step) or not (with the problem)."""
    tools = {t.name: t for t in agent.tools or []}
    budget = b.run.spec.budget or m.Budget()
    started = (b.status.usage or m.Usage()).steps
    accepted = 0
    out: list[a.ToolCallStatus] = []
    for index, call in enumerate(calls):
        problem = _problem(b, agent, tools, call)
        if problem is None and accepted >= agent.max_tool_calls_per_turn:
            problem = (
                f"the model may make at most {agent.max_tool_calls_per_turn} tool calls a turn "
                "(spec.agent.maxToolCallsPerTurn); this one was not run, call it again next turn"
            )
        # Room is kept for one more model turn, which answers.
        if (
            problem is None
            and budget.max_steps is not None
            and started + accepted + 1 >= budget.max_steps
        ):
            problem = (
                f"budget.maxSteps ({budget.max_steps}) leaves no room for this call; answer "
                "with what you have"
            )
        arguments = call.arguments
        if problem is not None:
            out.append(
                a.ToolCallStatus(
                    id=call.id,
                    tool=call.name,
                    arguments=_cut(arguments, 1024)[: a.MAX_TOOL_ARGUMENTS],
                    problem=problem[:1024],
                )
            )
            continue
        accepted += 1
        out.append(
            a.ToolCallStatus(
                id=call.id,
                tool=call.name,
                step=call_step(turn, index, call.name),
                arguments=arguments,
            )
        )
    return out


def _problem(
    b: Host, agent: a.Agent, tools: Mapping[str, a.AgentTool], call: cx.ToolCall
) -> str | None:
    tool = tools.get(call.name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        return f"there is no tool '{clean(call.name)[:64]}' (the tools: {names})"
    size = len(call.arguments.encode("utf-8", "surrogatepass"))
    if size > a.MAX_TOOL_ARGUMENTS:
        return f"the arguments are {size} bytes, more than the {a.MAX_TOOL_ARGUMENTS} allowed"
    try:
        arguments = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError) as e:
        return f"the arguments are not valid JSON: {str(e)[:200]}"
    if not isinstance(arguments, dict):
        return f"the arguments must be a JSON object, not {type(arguments).__name__}"
    schema_problem = _schema_problem(tool.parameters, arguments)
    if schema_problem is not None:
        return schema_problem
    if not _allowed(b.run, tool.container.image):
        return (
            f"the tool's image {tool.container.image} is not allowed by policy.allowedImages; "
            "the call was not run"
        )
    return None


def _call_outcome(b: Host, call: a.ToolCallStatus) -> dict[str, Any] | None:
    """The call's outcome for the record and the model; None while a result is unread."""
    if call.problem is not None or call.step is None:
        return {
            "outcome": "Invalid",
            "problem": call.problem,
            "answer": f"error: the call was not run: {call.problem}",
        }
    st = b.steps.get(call.step)
    if st is None:  # pragma: no cover - a current call's step stays in status
        return {"outcome": "Lost", "answer": "error: the call's step was lost"}
    out: dict[str, Any] = {"outcome": str(st.phase), "step": st.name, "attempts": st.attempt}
    if st.decided_by:
        out["decidedBy"] = st.decided_by
    if st.usage is not None and st.usage.tokens:
        out["tokens"] = st.usage.tokens
    if st.phase == SP.SUCCEEDED:
        text = _content(b, st)
        if text is None:
            return None
        out["summary"] = st.summary
        if st.result_ref is not None:
            out["resultRef"] = st.result_ref.to_wire()
            out["resultDigest"] = st.result_digest
        out["result"] = text
        return out
    error = st.error
    why = f"{error.reason}: {error.message}" if error else (st.message or "no reason recorded")
    out["error"] = why
    if st.phase == SP.SKIPPED and error is not None and error.reason == "Rejected":
        out["answer"] = f"error: the call was not run: it was rejected ({error.message})"
    elif st.phase in (SP.SKIPPED, SP.CANCELLED):
        out["answer"] = f"error: the call was not run ({why})"
    else:
        out["answer"] = f"error: the tool failed ({why})"
    return out


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


def _close_turn(b: Host, agent: a.Agent, ag: a.AgentStatus, config: AgentConfig) -> None:
    calls = ag.calls or []
    for call in calls:
        st = b.steps.get(call.step or "")
        if call.step and (st is None or st.phase not in m.TERMINAL_STEP_PHASES):
            return  # still running, waiting for approval or retrying
    output = _model_output(b, ag)
    if output is None or isinstance(output, str):  # read in the pass that took it
        _wait(b)
        return
    outcomes: list[dict[str, Any]] = []
    for call in calls:
        outcome = _call_outcome(b, call)
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
    messages = [cx.assistant_message(ag.turn, _as_called(output, calls))]
    for call, outcome in zip(calls, outcomes, strict=True):
        full = outcome.pop("answer", None)
        result = outcome.get("result")
        if result is not None:
            answer = _cut(result, config.tool_result_bytes) or "(no output)"
            outcome["result"] = _cut(result, config.tool_result_bytes)
        else:
            answer = str(full)
        summary = outcome.get("summary") or summary_line(answer) or "(no output)"
        messages.append(cx.tool_message(ag.turn, call.id, answer, summary))
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
        b.steps.pop(name, None)
    if ag.turn >= agent.max_turns:
        ag.stage = a.AgentStage.STOPPED
        b.stop(
            "MaxTurnsReached",
            f"the model was still calling tools in turn {ag.turn}, the last one "
            f"(spec.agent.maxTurns {agent.max_turns}), and gave no answer",
        )
        return
    nxt = cx.Context(
        turn=ag.turn + 1,
        messages=[*previous.messages, *messages],
        tools=_tools(agent),
        omitted_turns=previous.omitted_turns,
        paged_results=previous.paged_results,
    )
    _store_context(b, ag, cx.page(nxt, agent.context_bytes))
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
    parts: list[str] = []
    for i in range(ctx.parts):
        key = (ctx.name, f"part-{i}")
        text = next(
            (
                dict(action.data).get(key[1])
                for action in b.before
                if isinstance(action, StoreRecord) and action.name == ctx.name
            ),
            None,
        )
        if text is None:
            text = b.observed.documents.get(key)
        if text is None:
            return None
        parts.append(text)
    doc = cx.Context.from_parts(parts)
    if isinstance(doc, str) or doc.digest() != ctx.digest:
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
    if agent is None or ag is None:
        return
    if ag.turn > 0:
        status.progress = f"turn {ag.turn}/{agent.max_turns}"
    if status.phase in m.TERMINAL_RUN_PHASES and ag.stage != a.AgentStage.ANSWERED:
        ag.stage = a.AgentStage.STOPPED
