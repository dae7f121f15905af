"""Tool calls of the agent loop: validating what the model proposed, and reading each call's
outcome back as the model will see it (see :mod:`agentrun.core.agent_loop`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import context as cx
from agentrun.core import http_tool, naming, subagents
from agentrun.core.actions import StoreResult
from agentrun.core.envelope import clean
from agentrun.core.turn_steps import declared_tool
from agentrun.core.turns import AgentConfig, Host, again, call_step, model_of


def content_of(b: Host, st: m.StepStatus) -> str | None:
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


def cut(text: str, limit: int) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f" …[{len(data) - limit} more bytes]"


def _allowed(run: m.AgentRun, image: str) -> bool:
    allowed = run.spec.policy.allowed_images if run.spec.policy else None
    return allowed is None or any(image.startswith(p) for p in allowed)


def schema_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    # Imported on first use: only agent runs whose model calls a tool need it, and it holds
    # several MiB the operator would otherwise carry at rest.
    import jsonschema
    import jsonschema.exceptions

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
    b: Host,
    agent: a.Agent,
    turn: int,
    calls: Sequence[cx.ToolCall],
    mcp_schemas: Mapping[str, Mapping[str, Any]] | None = None,
    config: AgentConfig | None = None,
) -> list[agent_status.ToolCallStatus]:
    """Every call, valid (with its step) or not (with the problem). ``mcp_schemas``: the
    inputSchema of each MCP server's tool offered in this turn, by name."""
    tools = {t.name: t for t in agent.tools or []}
    mcp = dict(mcp_schemas or {})
    children = _Children(b, agent, turn, len(calls), config or AgentConfig())
    budget = b.run.spec.budget or m.Budget()
    started = (b.status.usage or m.Usage()).steps
    accepted = 0
    out: list[agent_status.ToolCallStatus] = []
    for index, call in enumerate(calls):
        problem = _problem(b, tools, mcp, call)
        if problem is None and accepted >= agent.max_tool_calls_per_turn:
            problem = (
                f"the model may make at most {agent.max_tool_calls_per_turn} tool calls a turn "
                f"(spec.agent.maxToolCallsPerTurn); this one was not run; "
                f"{again(turn, agent.max_turns)}"
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
        child: agent_status.ChildCall | None = None
        tool = tools.get(call.name)
        if problem is None and tool is not None and tool.agent is not None:
            carved = children.accept(tool, json.loads(call.arguments or "{}"))
            if isinstance(carved, str):
                problem = carved
            else:
                child = carved
        arguments = call.arguments
        if problem is not None:
            out.append(
                agent_status.ToolCallStatus(
                    id=call.id,
                    tool=call.name,
                    arguments=cut(arguments, 1024)[: a.MAX_TOOL_ARGUMENTS],
                    problem=problem[:1024],
                )
            )
            continue
        accepted += 1
        out.append(
            agent_status.ToolCallStatus(
                id=call.id,
                tool=call.name,
                step=call_step(turn, index, call.name),
                arguments=arguments,
                child=child,
            )
        )
    return out


class _Children:
    """The sub-agents a turn's calls start: the limits on how many and how deep, and the
    budget carved for each (:mod:`agentrun.core.subagents`)."""

    def __init__(self, b: Host, agent: a.Agent, turn: int, calls: int, config: AgentConfig) -> None:
        self.b = b
        self.agent = agent
        self.again = again(turn, agent.max_turns)
        self.calls = calls
        self.config = config
        self.accepted = 0
        self.carved = 0

    def accept(self, tool: a.AgentTool, arguments: Any) -> agent_status.ChildCall | str:
        """The child of a valid call of ``tool``, or why the call may not start one."""
        b, agent = self.b, self.agent
        sub = tool.agent
        assert sub is not None
        ag = b.status.agent
        declared = declared_tool(agent, ag, tool)
        goal = subagents.goal_of(declared, arguments if isinstance(arguments, dict) else {})
        if goal is None:
            return (
                f"a call of {tool.name} needs the argument {subagents.GOAL_ARGUMENT}: a string "
                "saying what the sub-agent is to do"
            )
        started = ag.children_started if ag is not None else 0
        problem = subagents.limit_problem(
            b.observed.depth,
            self.accepted,
            started + self.accepted,
            subagents.Limits(),
            again=self.again,
        )
        if problem is not None:
            return problem
        model = model_of(agent, ag)
        ctx = ag.context if ag is not None else None
        budget = b.run.spec.budget or m.Budget()
        keep = 0
        if ctx is not None:
            keep = subagents.parent_keeps(model, ctx, self.calls, self.config)
        told = declared.agent.instructions if declared.agent is not None else None
        prompt = len((told or "") + goal)
        minimum = model.max_output_tokens + -(-prompt // self.config.bytes_per_token) + 512
        used = (b.status.usage or m.Usage()).tokens
        carve = subagents.carve(budget.max_tokens, used, self.carved, keep, sub.max_tokens, minimum)
        if carve.problem is not None:
            return carve.problem
        self.accepted += 1
        self.carved += carve.tokens or 0
        return agent_status.ChildCall(tokens=carve.tokens)


def _problem(
    b: Host,
    tools: Mapping[str, a.AgentTool],
    mcp: Mapping[str, Mapping[str, Any]],
    call: cx.ToolCall,
) -> str | None:
    tool = tools.get(call.name)
    if tool is None and call.name not in mcp:
        names = ", ".join(sorted([*tools, *mcp])) or "none"
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
    if tool is None:  # a tool of an MCP server: its pinned definition's inputSchema
        return schema_problem(dict(mcp[call.name]), arguments)
    mismatch = schema_problem(tool.parameters, arguments)
    if mismatch is not None:
        return mismatch
    if tool.http is not None:  # its URL, its host and its body, as its step would make them
        return http_tool.call_problem(tool.http, arguments)
    if tool.container is not None and not _allowed(b.run, tool.container.image):
        return (
            f"the tool's image {tool.container.image} is not allowed by policy.allowedImages; "
            "the call was not run"
        )
    return None


def call_outcome(b: Host, call: agent_status.ToolCallStatus) -> dict[str, Any] | None:
    """The call's outcome for the record and the model; None while a result is unread."""
    if call.problem is not None or call.step is None:
        answer = f"error: the call was not run: {call.problem}"
        if cx.sendable_arguments(call.arguments) != call.arguments:
            answer += f" (your message above shows {cx.SENT_FOR_INVALID} as its arguments)"
        return {"outcome": "Invalid", "problem": call.problem, "answer": answer}
    st = b.steps.get(call.step)
    if st is None:  # pragma: no cover - a current call's step stays in status
        return {"outcome": "Lost", "answer": "error: the call's step was lost"}
    out: dict[str, Any] = {"outcome": str(st.phase), "step": st.name, "attempts": st.attempt}
    if st.decided_by:
        out["decidedBy"] = st.decided_by
    if st.usage is not None and st.usage.tokens:
        out["tokens"] = st.usage.tokens
    if st.phase == SP.SUCCEEDED:
        text = content_of(b, st)
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
