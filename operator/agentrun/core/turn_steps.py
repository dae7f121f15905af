"""The steps of the agent loop as the state machine runs them, built from the status: a model
turn in the operator's image, a tool call in its tool's container with the call's arguments,
the discovery of an MCP server before the first turn and a call of one of its tools, a call of
an HTTP tool, a sub-agent's call, and the run's executor with the permissions it uses.

Their names, idempotency keys and the small questions the machine asks about them are in
:mod:`agentrun.core.turns`; see :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.api.base import SecretKeySelector
from agentrun.core import http_tool, naming, subagents
from agentrun.core.pod_env import (
    ENV_MODEL_API_KEY,
    ENV_MODEL_BASE_URL,
    ENV_MODEL_FALLBACKS,
    ENV_MODEL_MAX_OUTPUT_TOKENS,
    ENV_MODEL_NAME,
    ENV_MODEL_TEMPERATURE,
    ENV_MODEL_TIMEOUT_SECONDS,
    ENV_MODEL_TOOL_CHOICE,
    ENV_TOOL_ARGS,
    ENV_TOOL_CALL_ID,
    ENV_TOOL_NAME,
    ENV_TURN,
    fallback_env,
)
from agentrun.core.rights import Check, checks_for
from agentrun.core.turns import (
    CHILD_IMAGE,
    DISCOVERY_RETRY,
    ENV_CHILD_TOKENS,
    ENV_MCP_HEADER,
    ENV_MCP_PINNED,
    ENV_MCP_SERVER,
    ENV_SUBAGENT,
    EXECUTOR_STEP,
    RESERVED_ENV,
    AgentConfig,
    Host,
    _keeping,
    discovery_step,
    executor_secret_env,
    mcp_tools_of,
    model_of,
    model_step,
    program_command,
    tool_choice_of,
)


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


def executor_step(run: m.AgentRun, status: agent_status.AgentStatus, config: AgentConfig) -> m.Step:
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


def _env(name: str, value: str) -> m.EnvVar:
    return m.EnvVar.model_construct(name=name, value=value, value_from=None)


def _secret_env(name: str, ref: SecretKeySelector) -> m.EnvVar:
    """``name`` from a key of a Secret of the run's namespace."""
    return m.EnvVar(
        name=name,
        value_from=m.EnvVarSource(secret_key_ref=m.SecretKeySelector(name=ref.name, key=ref.key)),
    )


def model_turn_step(
    run: m.AgentRun, status: agent_status.AgentStatus, turn: int, config: AgentConfig
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
    env += _fallback_env(model)
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


def _fallback_env(model: a.ModelEndpoint) -> list[m.EnvVar]:
    """The variables of the model's fallbacks (each one's key from its own Secret, so that
    :func:`agentrun.core.rights.checks_for` asks the creator's right to each), and of the
    turn's deadline, which a fallback shares: none without fallbacks."""
    if not model.fallbacks:
        return []
    env = [_env(ENV_MODEL_FALLBACKS, str(len(model.fallbacks)))]
    if model.timeout_seconds is not None:
        env.append(_env(ENV_MODEL_TIMEOUT_SECONDS, str(model.timeout_seconds)))
    for index, fallback in enumerate(model.fallbacks, start=1):
        env.append(_env(fallback_env(index, "BASE_URL"), fallback.base_url))
        env.append(_env(fallback_env(index, "NAME"), fallback.name))
        if fallback.temperature is not None:
            env.append(_env(fallback_env(index, "TEMPERATURE"), repr(fallback.temperature)))
        if fallback.api_key_secret_ref is not None:
            env.append(_secret_env(fallback_env(index, "API_KEY"), fallback.api_key_secret_ref))
    return env


def _call_env(tool: str, call: agent_status.ToolCallStatus, turn: int) -> list[m.EnvVar]:
    """What every tool call's step gets: the tool, the call's id, the turn, the arguments."""
    return [
        _env(ENV_TOOL_NAME, tool),
        _env(ENV_TOOL_CALL_ID, call.id),
        _env(ENV_TURN, str(turn)),
        _env(ENV_TOOL_ARGS, call.arguments),
    ]


def _call_step(
    call: agent_status.ToolCallStatus,
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


def tool_call_step(turn: int, call: agent_status.ToolCallStatus, tool: a.AgentTool) -> m.Step:
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


def _operator_image(status: agent_status.AgentStatus, config: AgentConfig) -> tuple[str, list[str]]:
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
    server: mcp_api.McpServer, status: agent_status.AgentStatus, config: AgentConfig
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
    call: agent_status.ToolCallStatus,
    server: mcp_api.McpServer,
    tool: mcp_api.McpTool,
    pinned: mcp_api.PinnedTool,
    status: agent_status.AgentStatus,
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
    call: agent_status.ToolCallStatus,
    tool: a.AgentTool,
    status: agent_status.AgentStatus,
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


def child_agent(
    agent: a.Agent, status: agent_status.AgentStatus | None, tool: a.AgentTool
) -> a.Agent:
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


def declared_tool(
    agent: a.Agent, status: agent_status.AgentStatus | None, tool: a.AgentTool
) -> subagents.SubAgentTool:
    """What the sub-agent tool ``tool`` declares for each child: the child's agent
    (:func:`child_agent`), or the Agent it runs by reference; the preamble and most tokens."""
    sub = tool.agent
    assert sub is not None
    return subagents.SubAgentTool(
        agent=None if sub.agent_ref is not None else child_agent(agent, status, tool),
        preamble=sub.preamble,
        max_tokens=sub.max_tokens,
        agent_ref=sub.agent_ref,
    )


def declaration(agent: a.Agent, status: agent_status.AgentStatus | None, tool: a.AgentTool) -> str:
    """What a sub-agent tool's call is made of besides its arguments, as canonical JSON: the
    child's agent (or the Agent it runs), the preamble and the most tokens."""
    declared = declared_tool(agent, status, tool)
    wire = {**declared.child_agent(), "preamble": declared.preamble,
            "maxTokens": declared.max_tokens}  # fmt: skip
    return naming.canonical_json(wire)


def child_call_step(
    turn: int,
    call: agent_status.ToolCallStatus,
    agent: a.Agent,
    status: agent_status.AgentStatus,
    tool: a.AgentTool,
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


def _dynamic(
    agent: a.Agent | None,
    status: agent_status.AgentStatus | None,
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


def executor_checks(run: m.AgentRun) -> list[Check]:
    """The permissions the run's executor uses on its creator's behalf (the model's API key
    Secret and each of its fallbacks', the MCP servers' header Secrets, the ServiceAccount),
    while the run may take turns
    or is about to begin its first (none otherwise): the shell keeps its verdicts on them
    current, so that an executor can be made (:func:`rights_granted`) without waiting for a
    step that uses each of them, in the pass that begins the first turn too (which then
    waits for it instead of running as a Job of its own)."""
    status = _keeping(run) or _beginning(run)
    if run.spec.agent is None or status is None:
        return []
    return checks_for(run, executor_step(run, status, AgentConfig()))


def _beginning(run: m.AgentRun) -> agent_status.AgentStatus | None:
    """The loop's status of ``run`` as read (a new one if there is none yet) while the next
    pass may begin its first turn: the loop not begun, the run not ended, and every step of
    its plan done; None otherwise."""
    status = run.status
    if run.spec.agent is None or (status is not None and status.phase in m.TERMINAL_RUN_PHASES):
        return None
    ag = status.agent if status is not None else None
    if ag is not None and (ag.stage != agent_status.AgentStage.WAITING or ag.turn != 0):
        return None
    done = {
        st.name
        for st in (status.steps if status is not None else None) or []
        if st.phase in (m.StepPhase.SUCCEEDED, m.StepPhase.SKIPPED)
    }
    if any(step.name not in done for step in run.spec.plan.steps):
        return None
    return ag if ag is not None else agent_status.AgentStatus()
