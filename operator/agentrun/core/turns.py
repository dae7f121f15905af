"""The agent loop's steps as the state machine runs them: their names, their idempotency
keys, and the small questions the machine asks about them (is this a tool call, may it launch
yet, is its turn closed). The steps synthesized for the current turn (a model turn in the
operator's image, a tool call in its tool's container with the call's arguments, the discovery
of an MCP server before the first turn and a call of one of its tools, and a call of an HTTP
tool, all in the operator's image) are built in :mod:`agentrun.core.turn_steps`.

See :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.api.base import SecretKeySelector
from agentrun.api.models import StepPhase as SP
from agentrun.core import naming
from agentrun.core.actions import Action
from agentrun.core.observed import Observed
from agentrun.core.pod_env import ENV_CONTEXT_PART as ENV_CONTEXT_PART
from agentrun.core.pod_env import ENV_CONTEXT_PARTS as ENV_CONTEXT_PARTS
from agentrun.core.pod_env import ENV_CONTEXT_SHA256 as ENV_CONTEXT_SHA256
from agentrun.core.pod_env import ENV_EXECUTOR_SECRET
from agentrun.core.pod_env import ENV_MODEL_API_KEY as ENV_MODEL_API_KEY
from agentrun.core.pod_env import ENV_MODEL_BASE_URL as ENV_MODEL_BASE_URL
from agentrun.core.pod_env import ENV_MODEL_MAX_OUTPUT_TOKENS as ENV_MODEL_MAX_OUTPUT_TOKENS
from agentrun.core.pod_env import ENV_MODEL_NAME as ENV_MODEL_NAME
from agentrun.core.pod_env import ENV_MODEL_TEMPERATURE as ENV_MODEL_TEMPERATURE
from agentrun.core.pod_env import ENV_MODEL_TOOL_CHOICE as ENV_MODEL_TOOL_CHOICE
from agentrun.core.pod_env import ENV_TOOL_ARGS as ENV_TOOL_ARGS
from agentrun.core.pod_env import ENV_TOOL_CALL_ID as ENV_TOOL_CALL_ID
from agentrun.core.pod_env import ENV_TOOL_NAME as ENV_TOOL_NAME
from agentrun.core.pod_env import ENV_TURN as ENV_TURN
from agentrun.core.rights import checks_for

CONTEXT_INPUT = "AGENTRUN_CONTEXT"
"""The name the context's digest has among a model turn's inputs (in its args hash)."""
ENV_SUBAGENT = "AGENTRUN_SUBAGENT"
ENV_CHILD_TOKENS = "AGENTRUN_CHILD_TOKENS"
"""The declaration of a sub-agent tool and the budget carved for a call's child: part of the
call's step, so of its args hash (such a step makes a child AgentRun, never a Job)."""
CHILD_IMAGE = "agentrun.dev/sub-agent"
"""The image name of a sub-agent call's step: never pulled, it names what the step is."""
ENV_MCP_SERVER = "AGENTRUN_MCP_SERVER"
ENV_MCP_HEADER = "AGENTRUN_MCP_HEADER_"
ENV_MCP_PINNED = "AGENTRUN_MCP_PINNED"
"""The environment of ``agentrun step mcp discover|call`` (see :mod:`agentrun.pod.mcp`)."""
RESERVED_ENV = frozenset(
    {ENV_TOOL_ARGS, ENV_TOOL_NAME, ENV_TOOL_CALL_ID, ENV_TURN}
)  # a tool's own env may not set these

KIND_TRANSCRIPT = "transcript"
KIND_CONTEXT = "context"
MODEL = "model"
DISCOVERY = "t0-mcp-"
"""The step listing the tools of MCP server ``s`` before the first turn is ``t0-mcp-{s}``."""
DISCOVERY_RETRY = m.RetryPolicy(limit=3)
"""Retries of a discovery step (a server not up yet, a dropped connection)."""
AGAIN_NEXT_TURN = "call it again next turn"
"""What a call refused by a limit of one turn (tool calls or sub-agents per turn) is told to
do; the model reads it with the next turn's context. Never said in the last turn
(:func:`again`), nor shown for a turn that had no next one (``kubectl agentrun transcript``)."""
_DYNAMIC = re.compile(r"^t([0-9]+)-")
_LABEL = re.compile(r"[^a-z0-9-]+")


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
    turns_ahead: int = 2
    """How many turns ahead model turns' Jobs are made (at most :data:`AHEAD_LIMIT`; see
    :class:`agentrun.core.actions.PrepareTurn`)."""
    executor: bool = False
    """Model turns and MCP servers' tool calls go to one executor per run
    (:class:`agentrun.core.actions.PrepareExecutor`) instead of a Job each; a turn that finds
    no executor running runs as a Job of its own, made ahead as :attr:`turns_ahead` says."""


def again(turn: int, max_turns: int) -> str:
    """What a call of ``turn`` refused by a limit of one turn may do: call it again next turn,
    unless ``turn`` is the last one (``spec.agent.maxTurns``), which no turn follows."""
    if turn >= max_turns:
        return f"this is the last turn (spec.agent.maxTurns {max_turns})"
    return AGAIN_NEXT_TURN


TEMPLATE_TOKENS = 2048
"""Tokens a server's chat template may add to a prompt besides the bytes sent (role markers,
a preamble offering the tools), when bounding what a turn could have used."""
TEMPLATE_TOKENS_PER_MESSAGE = 32


def turn_needs(model: a.ModelEndpoint, ctx: agent_status.ContextStatus, config: AgentConfig) -> int:
    """Tokens a turn may use: its output limit and its prompt, estimated from the size of the
    whole request it sends (messages, tool definitions and settings)."""
    return model.max_output_tokens + math.ceil(ctx.bytes / config.bytes_per_token)


def prompt_ceiling(ctx: agent_status.ContextStatus) -> int:
    """Most prompt tokens a turn could have used: a token covers at least one byte of what was
    sent, plus what a chat template adds."""
    return ctx.bytes + TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * ctx.messages


class Host(Protocol):
    """What the state machine's working state offers the loop (builder.Builder)."""

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
    def closed(self) -> dict[str, m.StepStatus]: ...
    @property
    def before(self) -> list[Action]: ...
    @property
    def after(self) -> list[Action]: ...
    @property
    def later(self) -> list[Action]: ...
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


EXECUTOR_STEP = "t0-executor"
"""The step label of a run's executor Job (no plan step of an agent run may be named like
that, and no turn is numbered 0)."""


def executor_name(run: m.AgentRun, generation: int) -> str:
    """The Job of the run's executor ``generation``."""
    return naming.job_name(run.metadata.name, run.metadata.uid, EXECUTOR_STEP, generation)


EXECUTOR_STAGES = (
    agent_status.AgentStage.READY,
    agent_status.AgentStage.THINKING,
    agent_status.AgentStage.ACTING,
)
"""The loop's stages in which a run keeps its executor."""


def keeps_executor(status: agent_status.AgentStatus, steps: Iterable[str]) -> bool:
    """Whether a run whose loop is at ``status``, with the steps ``steps`` in its status,
    keeps its executor: while it may take turns (:data:`EXECUTOR_STAGES`), and while its MCP
    servers' tools are discovered before the first turn (the executor starts beside the
    discovery steps, so that the first turn finds it running)."""
    if status.stage in EXECUTOR_STAGES:
        return True
    return (
        status.stage == agent_status.AgentStage.WAITING
        and status.turn == 0
        and any(name.startswith(DISCOVERY) for name in steps)
    )


def _keeping(run: m.AgentRun) -> agent_status.AgentStatus | None:
    """The loop's status of ``run`` as read, while the run keeps its executor
    (:func:`keeps_executor`, and the run not ended); None otherwise."""
    status = run.status
    ag = status.agent if status is not None else None
    if status is None or ag is None or status.phase in m.TERMINAL_RUN_PHASES:
        return None
    return ag if keeps_executor(ag, (st.name for st in status.steps or [])) else None


def executor_wanted(run: m.AgentRun) -> str | None:
    """The Job of the executor ``status.agent.executor`` names, while the run as read may
    still send it turns; None otherwise (a Job of it left is then a stray, and goes)."""
    status = _keeping(run)
    if status is None or status.executor is None:
        return None
    return status.executor.job_name


def executor_secret_env(ref: SecretKeySelector) -> str:
    """The variable of the run's executor that holds the value of the Secret key ``ref`` (an
    MCP server's header), which a call sent to it takes in place of its own variable."""
    return ENV_EXECUTOR_SECRET + naming.sha256_text(f"{ref.name}\0{ref.key}")[:16].upper()


def call_step(turn: int, index: int, tool: str) -> str:
    """The step of call ``index`` (0-based) of turn ``turn``: a DNS label."""
    label = _LABEL.sub("-", tool.lower()).strip("-") or "tool"
    return f"t{turn}-{index}-{label}"[: naming.MAX_NAME].rstrip("-")


def discovery_step(server: str) -> str:
    """The step listing the tools of MCP server ``server`` (a DNS label of at most 20)."""
    return f"{DISCOVERY}{server}"


def program_command(command: Sequence[str], *program: str) -> list[str]:
    """The command of another step program of the operator's image (``agentrun step mcp
    call``), from the model turns' command (``agentrun step llm``, or what
    ``AGENTRUN_LLM_COMMAND`` says): the same executable, ``program`` in place of ``llm``."""
    base = list(command)
    if base and base[-1] == "llm":
        base.pop()
    return [*base, *program]


def is_model_turn(name: str) -> bool:
    """Whether ``name`` is the step of a model turn (``t{N}-model``; no plan step of an agent
    run may be named like that)."""
    turn = turn_of_step(name)
    return turn is not None and name == model_step(turn)


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


def dynamic_names(
    status: agent_status.AgentStatus | None, agent: a.Agent | None = None
) -> set[str]:
    """The steps of the current turn (whether they exist yet or not); before the first turn,
    the discovery steps of ``agent``'s MCP servers."""
    if status is None:
        return set()
    if status.turn == 0:
        if agent is None or status.stage != agent_status.AgentStage.WAITING:
            return set()
        return {discovery_step(server.name) for server in agent.mcp_servers or []}
    names = {model_step(status.turn)}
    names |= {c.step for c in status.calls or [] if c.step}
    return names


def is_tool_step(status: agent_status.AgentStatus | None, name: str) -> bool:
    return status is not None and any(c.step == name for c in status.calls or [])


def model_of(agent: a.Agent, status: agent_status.AgentStatus | None) -> a.ModelEndpoint:
    """The model the run's turns call: ``spec.agent.model`` as frozen on the operator's first
    pass (:mod:`agentrun.core.frozen`), never the spec as it reads now. The spec only for a
    status an operator from before the freeze wrote, until the next pass freezes it."""
    if status is not None and status.frozen is not None:
        return status.frozen.model
    return agent.model


def tool_choice_of(agent: a.Agent, status: agent_status.AgentStatus | None) -> str | None:
    """``spec.agent.toolChoice`` as frozen on the operator's first pass (as :func:`model_of`)."""
    if status is not None and status.frozen is not None:
        return status.frozen.tool_choice
    return agent.tool_choice


AHEAD_LIMIT = 4
"""The most turns after the current one whose model turn's Job may be made ahead
(:attr:`AgentConfig.turns_ahead` says how many are; see
:class:`agentrun.core.actions.PrepareTurn`)."""


def ahead_names(run: m.AgentRun) -> list[str]:
    """The names of the model turns' Jobs that may exist before their turn's intent while a
    turn runs: the current turn's first attempt before its launch is committed, and those of
    the next :data:`AHEAD_LIMIT` turns (:func:`made_ahead` says which a found Job is)."""
    status = run.status.agent if run.status is not None else None
    if status is None or status.stage not in (
        agent_status.AgentStage.THINKING,
        agent_status.AgentStage.ACTING,
    ):
        return []
    names = []
    for turn in range(status.turn, status.turn + AHEAD_LIMIT + 1):
        name = naming.job_name(run.metadata.name, run.metadata.uid, model_step(turn), 1)
        if made_ahead(run, name, model_step(turn)):
            names.append(name)
    return names


def made_ahead(run: m.AgentRun, job_name: str, step: str | None) -> bool:
    """Whether Job ``job_name`` (of step ``step``, by its label) is a model turn's made before
    its turn (:class:`agentrun.core.actions.PrepareTurn`) that the run may still need: attempt
    1 of a turn after the current one, or of the current one before its first launch intent
    is committed, under the name that attempt commits, while the run goes on. Such a Job is
    neither observed as an attempt's nor a stray; a pass that reads the run as it was a
    moment ago must not take it for one either."""
    status = run.status.agent if run.status is not None else None
    turn = turn_of_step(step or "")
    if status is None or turn is None or step != model_step(turn) or turn < status.turn:
        return False
    if turn == status.turn and any(  # the turn began: is its first attempt launched yet?
        st.name == step and st.attempt > 0 for st in (run.status.steps if run.status else []) or []
    ):
        return False
    if status.stage in (agent_status.AgentStage.ANSWERED, agent_status.AgentStage.STOPPED):
        return False
    if run.status is not None and run.status.phase in m.TERMINAL_RUN_PHASES:
        return False
    return job_name == naming.job_name(run.metadata.name, run.metadata.uid, step, 1)


def context_inputs(
    status: agent_status.AgentStatus | None, step: str
) -> tuple[list[m.EnvVar], dict[str, str]]:
    """The inputs of a model turn's step: the digest of its context, for the args hash (the
    pod takes the context itself by request, :class:`agentrun.core.actions.SendTurn`).
    Nothing for any other step."""
    ctx = status.context if status is not None else None
    if status is None or ctx is None or step != model_step(status.turn) or ctx.turn != status.turn:
        return [], {}
    return [], {CONTEXT_INPUT: ctx.digest}


def call_of(
    status: agent_status.AgentStatus | None, step: str
) -> agent_status.ToolCallStatus | None:
    """The current call whose step is ``step``, if any."""
    return next((c for c in (status.calls if status else None) or [] if c.step == step), None)


def child_call(
    status: agent_status.AgentStatus | None, step: str
) -> agent_status.ToolCallStatus | None:
    """The current call whose step is ``step``, when it is a sub-agent's."""
    if status is None:
        return None
    return next((c for c in status.calls or [] if c.step == step and c.child), None)


def mcp_tools_of(
    agent: a.Agent, status: agent_status.AgentStatus | None
) -> dict[str, tuple[mcp_api.McpServer, mcp_api.McpTool, mcp_api.PinnedTool]]:
    """The MCP tools the model may call, by name: each pinned tool with its server's entry
    and the entry's settings of it."""
    out: dict[str, tuple[mcp_api.McpServer, mcp_api.McpTool, mcp_api.PinnedTool]] = {}
    servers = {s.name: s for s in agent.mcp_servers or []}
    for pinned in (status.mcp_tools if status is not None else None) or []:
        server = servers.get(pinned.server)
        tool = next((t for t in server.tools if t.name == pinned.name), None) if server else None
        if server is not None and tool is not None:
            out[pinned.name] = (server, tool, pinned)
    return out


def idempotency_key(
    run: m.AgentRun, status: agent_status.AgentStatus | None, step: str, args_hash: str
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
    call = call_of(status, step)
    return f"{run.metadata.uid}:{turn}:{call.id}:{args_hash}" if call else None


def image_exempt(
    status: agent_status.AgentStatus | None, step: str, agent: a.Agent | None = None
) -> bool:
    """Model turns, MCP discoveries, MCP calls and calls of ``agent``'s HTTP tools run the
    operator's own image, and a sub-agent's call runs none (it makes a child AgentRun), which
    policy.allowedImages does not govern (a tool's image is checked when its call is
    validated)."""
    if status is None:
        return False
    if status.turn == 0:
        return step.startswith(DISCOVERY)
    if step == model_step(status.turn):
        return True
    own = {p.name for p in status.mcp_tools or []}
    own |= {t.name for t in (agent.tools if agent is not None else None) or [] if t.http}
    return any(
        c.step == step and (c.tool in own or c.child is not None) for c in status.calls or []
    )


def pauses_for_tokens(run: m.AgentRun, status: m.AgentRunStatus) -> bool:
    """Whether the token budget pauses the loop instead of failing the run: once the agent
    has started (the plan before it is held to budget.maxTokens as plan runs are)."""
    return run.spec.agent is not None and status.agent is not None and status.agent.turn > 0


def committed(run: m.AgentRun, step: str) -> bool:
    """Whether ``step`` may be launched in this pass: a plan step always; a step of the loop
    (a new turn's model step, a new tool call) once the status as read has it, so that the
    shell checked what it uses (the API key Secret, a tool's env) against the creator's
    rights (agentrun.access.authz) before its launch is decided; or, for a model turn or a
    container tool's call, in the pass that makes it when those rights are known
    (:func:`rights_confirmed`)."""
    if run.spec.agent is None or run.step(step) is not None:
        return True
    return any(st.name == step for st in (run.status.steps if run.status else None) or [])


def rights_confirmed(b: Host, step: m.Step) -> bool:
    """Whether ``step``, a step of the loop this pass made, is a model turn or a call of a
    container tool whose every permission on the creator's behalf
    (:func:`agentrun.core.rights.checks_for`: its env's Secrets and ConfigMaps, the
    ServiceAccount) the shell found granted within the rights TTL (``Observed.granted``), so
    that it may be launched in this pass: what the shell would check once it is committed is
    already known, and the check of the pass after would give the same verdict. A step that
    uses nothing of the creator's needs no check. A call of an MCP server's tool or a
    sub-agent waits until it is committed."""
    if not is_model_turn(step.name):
        call = call_of(b.status.agent, step.name)
        agent = b.run.spec.agent
        tool = next((t for t in (agent.tools if agent else None) or []
                     if call is not None and t.name == call.tool), None)  # fmt: skip
        if tool is None or tool.container is None or tool.agent is not None:
            return False
    return rights_granted(b, step)


def rights_granted(b: Host, step: m.Step) -> bool:
    """Whether every permission ``step`` uses on its creator's behalf is among those the
    shell found granted within the rights TTL (``Observed.granted``)."""
    granted = b.observed.granted
    return all(check.permission in granted for check in checks_for(b.run, step))


def compacted(run: m.AgentRun, step: str) -> bool:
    """Whether ``step`` belongs to a closed turn (its outcome lives in the transcript)."""
    status = run.status.agent if run.status else None
    if run.spec.agent is None or status is None or run.step(step) is not None:
        return False
    turn = turn_of_step(step)
    return turn is not None and turn < status.turn
