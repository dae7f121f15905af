"""The agent loop's steps as the state machine runs them: their names, the steps synthesized
for the current turn (a model turn in the operator's image, a tool call in its tool's
container with the call's arguments, the discovery of an MCP server before the first turn and
a call of one of its tools, and a call of an HTTP tool, all in the operator's image), their
idempotency keys, and the small questions the machine asks about them (is this a tool call,
may it launch yet, is its turn closed).

See :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agentrun.api import agent as a
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.api.base import SecretKeySelector
from agentrun.api.models import StepPhase as SP
from agentrun.core import http_tool, naming
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
from agentrun.core.rights import Check, checks_for

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


def turn_needs(model: a.ModelEndpoint, ctx: a.ContextStatus, config: AgentConfig) -> int:
    """Tokens a turn may use: its output limit and its prompt, estimated from the size of the
    whole request it sends (messages, tool definitions and settings)."""
    return model.max_output_tokens + math.ceil(ctx.bytes / config.bytes_per_token)


def prompt_ceiling(ctx: a.ContextStatus) -> int:
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


EXECUTOR_STAGES = (a.AgentStage.READY, a.AgentStage.THINKING, a.AgentStage.ACTING)
"""The loop's stages in which a run keeps its executor."""


def keeps_executor(status: a.AgentStatus, steps: Iterable[str]) -> bool:
    """Whether a run whose loop is at ``status``, with the steps ``steps`` in its status,
    keeps its executor: while it may take turns (:data:`EXECUTOR_STAGES`), and while its MCP
    servers' tools are discovered before the first turn (the executor starts beside the
    discovery steps, so that the first turn finds it running)."""
    if status.stage in EXECUTOR_STAGES:
        return True
    return (
        status.stage == a.AgentStage.WAITING
        and status.turn == 0
        and any(name.startswith(DISCOVERY) for name in steps)
    )


def _keeping(run: m.AgentRun) -> a.AgentStatus | None:
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


def executor_secrets(agent: a.Agent | None) -> dict[str, SecretKeySelector]:
    """The executor's variables holding its run's MCP servers' and HTTP tools' header
    Secrets, by name."""
    refs = [
        header.secret_key_ref
        for server in (agent.mcp_servers if agent is not None else None) or []
        for header in server.headers or []
    ]
    refs += http_tool.header_secrets(agent)
    return {executor_secret_env(ref): ref for ref in refs}


def executor_step(run: m.AgentRun, status: a.AgentStatus, config: AgentConfig) -> m.Step:
    """The step the run's executor Job is built from: a model turn's, for no turn in
    particular (each request says which), with the values of the MCP servers' header
    Secrets (:func:`executor_secret_env`: a call of their tools may be sent to it too), no
    deadline of its own (each call has its own), and not retried (a lost executor is
    replaced, and the attempt it held retried)."""
    turn = model_turn_step(run, status, max(status.turn, 1), config)
    env = [e for e in turn.container.env or [] if e.name != ENV_TURN]
    held = executor_secrets(run.spec.agent)
    env += [_secret_env(name, ref) for name, ref in sorted(held.items())]
    container = m.ContainerAction.model_construct(
        image=turn.container.image, command=turn.container.command, env=env
    )
    return m.Step.model_construct(
        name=EXECUTOR_STEP,
        description="the run's executor: its model turns and MCP calls",
        container=container,
        risk=m.Risk.READ,
        approval=m.ApprovalMode.AUTO,
        on_rejection=m.OnRejection.FAIL_RUN,
        retry=m.RetryPolicy(limit=0),
        timeout_seconds=None,
    )


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


def dynamic_names(status: a.AgentStatus | None, agent: a.Agent | None = None) -> set[str]:
    """The steps of the current turn (whether they exist yet or not); before the first turn,
    the discovery steps of ``agent``'s MCP servers."""
    if status is None:
        return set()
    if status.turn == 0:
        if agent is None or status.stage != a.AgentStage.WAITING:
            return set()
        return {discovery_step(server.name) for server in agent.mcp_servers or []}
    names = {model_step(status.turn)}
    names |= {c.step for c in status.calls or [] if c.step}
    return names


def is_tool_step(status: a.AgentStatus | None, name: str) -> bool:
    return status is not None and any(c.step == name for c in status.calls or [])


def _env(name: str, value: str) -> m.EnvVar:
    return m.EnvVar.model_construct(name=name, value=value, value_from=None)


def _secret_env(name: str, ref: SecretKeySelector) -> m.EnvVar:
    """``name`` from a key of a Secret of the run's namespace."""
    return m.EnvVar(
        name=name,
        value_from=m.EnvVarSource(secret_key_ref=m.SecretKeySelector(name=ref.name, key=ref.key)),
    )


def model_of(agent: a.Agent, status: a.AgentStatus | None) -> a.ModelEndpoint:
    """The model the run's turns call: ``spec.agent.model`` as frozen on the operator's first
    pass (:mod:`agentrun.core.frozen`), never the spec as it reads now. The spec only for a
    status an operator from before the freeze wrote, until the next pass freezes it."""
    if status is not None and status.frozen is not None:
        return status.frozen.model
    return agent.model


def tool_choice_of(agent: a.Agent, status: a.AgentStatus | None) -> str | None:
    """``spec.agent.toolChoice`` as frozen on the operator's first pass (as :func:`model_of`)."""
    if status is not None and status.frozen is not None:
        return status.frozen.tool_choice
    return agent.tool_choice


def model_turn_step(
    run: m.AgentRun, status: a.AgentStatus, turn: int, config: AgentConfig
) -> m.Step:
    """The step of model turn ``turn``, with the image and command committed when the turn
    started (the operator's settings before that), and the endpoint, model and API key Secret
    frozen when the run started (``status.agent.frozen``). Its context is not part of it: the
    pod takes it by request once the turn's intent is committed (:mod:`agentrun.pod.llm`), so
    the Job can be made before the turn begins (:class:`agentrun.core.actions.PrepareTurn`);
    the context's digest is in the step's args hash (:func:`context_inputs`)."""
    agent = run.spec.agent
    assert agent is not None
    image = status.turn_image or config.llm_image
    command = list(status.turn_command or config.llm_command)
    model = model_of(agent, status)
    env = [
        _env(ENV_TURN, str(turn)),
        _env(ENV_MODEL_BASE_URL, model.base_url),
        _env(ENV_MODEL_NAME, model.name),
        _env(ENV_MODEL_MAX_OUTPUT_TOKENS, str(model.max_output_tokens)),
    ]
    if model.temperature is not None:
        env.append(_env(ENV_MODEL_TEMPERATURE, repr(model.temperature)))
    choice = tool_choice_of(agent, status)
    if choice is not None:
        env.append(_env(ENV_MODEL_TOOL_CHOICE, choice))
    if model.api_key_secret_ref is not None:
        env.append(_secret_env(ENV_MODEL_API_KEY, model.api_key_secret_ref))
    container = m.ContainerAction.model_construct(image=image, command=command, env=env)
    return m.Step.model_construct(
        name=model_step(turn),
        description=f"model turn {turn}",
        container=container,
        risk=m.Risk.READ,
        approval=m.ApprovalMode.AUTO,
        on_rejection=m.OnRejection.FAIL_RUN,
        retry=model.retry,
        timeout_seconds=model.timeout_seconds,
    )


AHEAD_LIMIT = 4
"""The most turns after the current one whose model turn's Job may be made ahead
(:attr:`AgentConfig.turns_ahead` says how many are; see
:class:`agentrun.core.actions.PrepareTurn`)."""


def ahead_names(run: m.AgentRun) -> list[str]:
    """The names of the model turns' Jobs that may exist before their turn's intent while a
    turn runs: the current turn's first attempt before its launch is committed, and those of
    the next :data:`AHEAD_LIMIT` turns (:func:`made_ahead` says which a found Job is)."""
    status = run.status.agent if run.status is not None else None
    if status is None or status.stage not in (a.AgentStage.THINKING, a.AgentStage.ACTING):
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
    if status.stage in (a.AgentStage.ANSWERED, a.AgentStage.STOPPED):
        return False
    if run.status is not None and run.status.phase in m.TERMINAL_RUN_PHASES:
        return False
    return job_name == naming.job_name(run.metadata.name, run.metadata.uid, step, 1)


def context_inputs(
    status: a.AgentStatus | None, step: str
) -> tuple[list[m.EnvVar], dict[str, str]]:
    """The inputs of a model turn's step: the digest of its context, for the args hash (the
    pod takes the context itself by request, :class:`agentrun.core.actions.SendTurn`).
    Nothing for any other step."""
    ctx = status.context if status is not None else None
    if status is None or ctx is None or step != model_step(status.turn) or ctx.turn != status.turn:
        return [], {}
    return [], {CONTEXT_INPUT: ctx.digest}


def _call_env(tool: str, call: a.ToolCallStatus, turn: int) -> list[m.EnvVar]:
    """What every tool call's step gets: the tool, the call's id, the turn, the arguments."""
    return [
        _env(ENV_TOOL_NAME, tool),
        _env(ENV_TOOL_CALL_ID, call.id),
        _env(ENV_TURN, str(turn)),
        _env(ENV_TOOL_ARGS, call.arguments),
    ]


def _call_step(
    call: a.ToolCallStatus,
    description: str,
    container: m.ContainerAction,
    tool: a.AgentTool | mcp_api.McpTool,
    *,
    limited: bool = True,
) -> m.Step:
    """The step of a valid call: gated and limited as its tool says (not ``limited``: no
    retries and no deadline, as for a sub-agent, whose child has its own); a refused call is
    answered to the model and the run goes on."""
    assert call.step is not None
    return m.Step.model_construct(
        name=call.step,
        description=description,
        container=container,
        risk=tool.risk,
        approval=tool.approval,
        on_rejection=m.OnRejection.SKIP_STEP,
        retry=tool.retry if limited else None,
        timeout_seconds=tool.timeout_seconds if limited else None,
    )


def tool_call_step(turn: int, call: a.ToolCallStatus, tool: a.AgentTool) -> m.Step:
    """The step of a valid tool call: the tool's container with the call's arguments."""
    assert call.step is not None and tool.container is not None
    own = [e for e in tool.container.env or [] if e.name not in RESERVED_ENV]
    container = tool.container.model_copy(update={"env": [*own, *_call_env(tool.name, call, turn)]})
    return _call_step(call, f"turn {turn}: call {call.id} of {tool.name}", container, tool)


def dynamic_steps(
    run: m.AgentRun, steps: Mapping[str, m.StepStatus], config: AgentConfig
) -> list[m.Step]:
    """The steps of the current turn that exist in ``steps``, as the machine runs them."""
    agent = run.spec.agent
    status = run.status.agent if run.status else None
    return _dynamic(agent, status, steps, run, config)


def _operator_image(status: a.AgentStatus, config: AgentConfig) -> tuple[str, list[str]]:
    """The image and command committed for the current turn (or the discovery before it)."""
    return (status.turn_image or config.llm_image, list(status.turn_command or config.llm_command))


def _server_env(server: mcp_api.McpServer) -> list[m.EnvVar]:
    """The server's entry (its headers by Secret reference only) and each header's value from
    its Secret: the environment of ``agentrun step mcp``."""
    env = [_env(ENV_MCP_SERVER, server.model_dump_json(by_alias=True, exclude_none=True))]
    env += [
        _secret_env(f"{ENV_MCP_HEADER}{i}", header.secret_key_ref)
        for i, header in enumerate(server.headers or [])
    ]
    return env


def discovery_step_of(
    server: mcp_api.McpServer, status: a.AgentStatus, config: AgentConfig
) -> m.Step:
    """The step listing ``server``'s tools (``agentrun step mcp discover``)."""
    image, command = _operator_image(status, config)
    container = m.ContainerAction.model_construct(
        image=image, command=program_command(command, "mcp", "discover"), env=_server_env(server)
    )
    return m.Step.model_construct(
        name=discovery_step(server.name),
        description=f"list the tools of MCP server {server.name}",
        container=container,
        risk=m.Risk.READ,
        approval=m.ApprovalMode.AUTO,
        on_rejection=m.OnRejection.FAIL_RUN,
        retry=DISCOVERY_RETRY,
        timeout_seconds=server.timeout_seconds,
    )


def mcp_call_step(
    turn: int,
    call: a.ToolCallStatus,
    server: mcp_api.McpServer,
    tool: mcp_api.McpTool,
    pinned: mcp_api.PinnedTool,
    status: a.AgentStatus,
    config: AgentConfig,
) -> m.Step:
    """The step of a valid call of an MCP server's tool (``agentrun step mcp call``): the
    pinned definition's digest is part of its environment, so of its args hash, so an
    approval names the arguments and the definition they were checked against."""
    assert call.step is not None
    image, command = _operator_image(status, config)
    env = [
        *_server_env(server),
        _env(ENV_MCP_PINNED, pinned.model_dump_json(by_alias=True, exclude_none=True)),
        *_call_env(tool.name, call, turn),
    ]
    container = m.ContainerAction.model_construct(
        image=image, command=program_command(command, "mcp", "call"), env=env
    )
    description = f"turn {turn}: call {call.id} of {tool.name} (MCP server {server.name})"
    return _call_step(call, description, container, tool)


def http_call_step(
    turn: int,
    call: a.ToolCallStatus,
    tool: a.AgentTool,
    status: a.AgentStatus,
    config: AgentConfig,
) -> m.Step:
    """The step of a valid call of an HTTP tool (``agentrun step http``): the tool's
    declaration (its header Secrets by reference) and the arguments are its environment, so
    its args hash covers the method, the URL, the headers and the body."""
    assert call.step is not None and tool.http is not None
    image, command = _operator_image(status, config)
    env = [*http_tool.step_env(tool), *_call_env(tool.name, call, turn)]
    container = m.ContainerAction.model_construct(
        image=image, command=program_command(command, "http"), env=env
    )
    description = f"turn {turn}: call {call.id} of {tool.name} (HTTP {tool.http.method.value})"
    return _call_step(call, description, container, tool)


def child_agent(agent: a.Agent, status: a.AgentStatus | None, tool: a.AgentTool) -> a.Agent:
    """The ``spec.agent`` of a child of the sub-agent tool ``tool``: the run's frozen model,
    the declared instructions and maxTurns, and the tools it names, copied."""
    sub = tool.agent
    assert sub is not None
    named = {t.name: t for t in agent.tools or []}
    tools = [named[n].model_copy(deep=True) for n in sub.tools or [] if n in named]
    return a.Agent(
        model=model_of(agent, status).model_copy(deep=True),
        instructions=sub.instructions,
        tools=tools or None,
        max_turns=sub.max_turns,
    )


def declaration(agent: a.Agent, status: a.AgentStatus | None, tool: a.AgentTool) -> str:
    """What a sub-agent tool's call is made of besides its arguments, as canonical JSON: the
    child's agent, the preamble and the most tokens."""
    sub = tool.agent
    assert sub is not None
    child = child_agent(agent, status, tool)
    wire = {
        "agent": child.model_dump(
            mode="json", by_alias=True, exclude_defaults=True, exclude_none=True
        ),
        "preamble": sub.preamble,
        "maxTokens": sub.max_tokens,
    }
    return naming.canonical_json(wire)


def child_call_step(
    turn: int, call: a.ToolCallStatus, agent: a.Agent, status: a.AgentStatus, tool: a.AgentTool
) -> m.Step:
    """The step of a valid call of a sub-agent tool: launched, it creates the call's child
    AgentRun (never a Job). Its environment (so its args hash, which an approval names) holds
    the declaration, the arguments and the budget carved for the child."""
    assert call.step is not None and call.child is not None
    env = [*_call_env(tool.name, call, turn), _env(ENV_SUBAGENT, declaration(agent, status, tool))]
    if call.child.tokens is not None:
        env.append(_env(ENV_CHILD_TOKENS, str(call.child.tokens)))
    container = m.ContainerAction.model_construct(image=CHILD_IMAGE, command=None, env=env)
    description = f"turn {turn}: call {call.id} of {tool.name} (a sub-agent)"
    return _call_step(call, description, container, tool, limited=False)


def call_of(status: a.AgentStatus | None, step: str) -> a.ToolCallStatus | None:
    """The current call whose step is ``step``, if any."""
    return next((c for c in (status.calls if status else None) or [] if c.step == step), None)


def child_call(status: a.AgentStatus | None, step: str) -> a.ToolCallStatus | None:
    """The current call whose step is ``step``, when it is a sub-agent's."""
    if status is None:
        return None
    return next((c for c in status.calls or [] if c.step == step and c.child), None)


def mcp_tools_of(
    agent: a.Agent, status: a.AgentStatus | None
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


def _dynamic(
    agent: a.Agent | None,
    status: a.AgentStatus | None,
    steps: Mapping[str, m.StepStatus],
    run: m.AgentRun,
    config: AgentConfig,
) -> list[m.Step]:
    if agent is None or status is None:
        return []
    if status.turn == 0:
        return [
            discovery_step_of(server, status, config)
            for server in agent.mcp_servers or []
            if discovery_step(server.name) in steps
        ]
    found: list[m.Step] = []
    ctx = status.context
    if model_step(status.turn) in steps and ctx is not None and ctx.turn == status.turn:
        found.append(model_turn_step(run, status, status.turn, config))
    tools = {t.name: t for t in agent.tools or []}
    mcp_tools = mcp_tools_of(agent, status)
    for call in status.calls or []:
        if not call.step or call.step not in steps:
            continue
        tool = tools.get(call.tool)
        if tool is not None and tool.agent is not None and call.child is not None:
            found.append(child_call_step(status.turn, call, agent, status, tool))
        elif tool is not None and tool.container is not None:
            found.append(tool_call_step(status.turn, call, tool))
        elif tool is not None and tool.http is not None:
            found.append(http_call_step(status.turn, call, tool, status, config))
        elif call.tool in mcp_tools:
            server, listed, pinned = mcp_tools[call.tool]
            found.append(mcp_call_step(status.turn, call, server, listed, pinned, status, config))
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
    call = call_of(status, step)
    return f"{run.metadata.uid}:{turn}:{call.id}:{args_hash}" if call else None


def image_exempt(status: a.AgentStatus | None, step: str, agent: a.Agent | None = None) -> bool:
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


def executor_checks(run: m.AgentRun) -> list[Check]:
    """The permissions the run's executor uses on its creator's behalf (the model's API key
    Secret, the MCP servers' header Secrets, the ServiceAccount), while the run may take turns
    or is about to begin its first (none otherwise): the shell keeps its verdicts on them
    current, so that an executor can be made (:func:`rights_granted`) without waiting for a
    step that uses each of them, in the pass that begins the first turn too (which then
    waits for it instead of running as a Job of its own)."""
    status = _keeping(run) or _beginning(run)
    if run.spec.agent is None or status is None:
        return []
    return checks_for(run, executor_step(run, status, AgentConfig()))


def _beginning(run: m.AgentRun) -> a.AgentStatus | None:
    """The loop's status of ``run`` as read (a new one if there is none yet) while the next
    pass may begin its first turn: the loop not begun, the run not ended, and every step of
    its plan done; None otherwise."""
    status = run.status
    if run.spec.agent is None or (status is not None and status.phase in m.TERMINAL_RUN_PHASES):
        return None
    ag = status.agent if status is not None else None
    if ag is not None and (ag.stage != a.AgentStage.WAITING or ag.turn != 0):
        return None
    done = {
        st.name
        for st in (status.steps if status is not None else None) or []
        if st.phase in (m.StepPhase.SUCCEEDED, m.StepPhase.SKIPPED)
    }
    if any(step.name not in done for step in run.spec.plan.steps):
        return None
    return ag if ag is not None else a.AgentStatus()


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
