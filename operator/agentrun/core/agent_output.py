"""The agent loop's turns, pure: a model turn's output taken (its calls validated and made
steps, its answer taken as the run's result, an answer cut off refused), and the turn closed
once every call has an outcome: its transcript record written and the next turn's context
assembled from the previous one.

See :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import context as cx
from agentrun.core import naming
from agentrun.core import resume as resuming
from agentrun.core.actions import StoreRecord
from agentrun.core.agent_budget import _bounded, _note_unreported
from agentrun.core.agent_launch import (
    _offers_tools,
    _prepare_next_turn,
    _send_calls,
    _send_turn,
    _unsettled,
)
from agentrun.core.agent_start import _mcp_definitions, _store_context, _tools, _wait
from agentrun.core.arguments import args_hash, resolve_inputs
from agentrun.core.calls import call_outcome, content_of, cut, validate_calls
from agentrun.core.envelope import summary_line
from agentrun.core.turn_steps import current_steps
from agentrun.core.turns import (
    KIND_TRANSCRIPT,
    AgentConfig,
    Host,
    call_step,
    dynamic_names,
    model_of,
    model_step,
    record_name,
)

ANSWER_KEY = "answer"
"""The key of the last transcript record that holds the answer (its ``turn`` entry names it as
``contentKey`` rather than holding the answer again)."""


CUT_OFF = "length"
"""The finish reason of an output cut off at max_tokens."""


CUT_OFF_REASON = "AnswerCutOff"
"""The reason of a run whose model answered, but was cut off at maxOutputTokens."""


MODEL_FALLBACK = "ModelFallback"
"""The reason of the transition (and Warning Event) of a turn answered by a fallback of
spec.agent.model, the models before it having failed."""


def answerer(ag: agent_status.AgentStatus, output: cx.Output) -> cx.Answerer | None:
    """The model that answered ``output``'s turn, named as the frozen model names it
    (``status.agent.frozen``): the one whose index the output names (a turn with fallbacks),
    or the model itself for a turn without (whose output names none). None when it is not
    known (no frozen model, an index it does not have)."""
    model = ag.frozen.model if ag.frozen is not None else None
    if model is None:
        return None
    models = [(model.name, model.base_url)]
    models += [(f.name, f.base_url) for f in model.fallbacks or []]
    by = output.answered_by
    if by is None:
        return cx.Answerer(0, model.name, model.base_url) if len(models) == 1 else None
    if by.index >= len(models):
        return None
    name, base_url = models[by.index]
    return cx.Answerer(by.index, name, base_url)


def _note_fallback(b: Host, ag: agent_status.AgentStatus, output: cx.Output) -> None:
    """Say on the run that turn ``ag.turn`` was answered by a fallback, and why each model
    before it failed: a transition ModelFallback and a Warning Event."""
    by = answerer(ag, output)
    if by is None or by.index == 0:
        return
    before = "; ".join(output.fallback_from) or "the models before it failed"
    b.record(
        model_step(ag.turn),
        None,
        "Answered",
        MODEL_FALLBACK,
        f"turn {ag.turn}: answered by fallback {by.index} {by.name} at {by.base_url} after: "
        f"{before}",
    )


def _model_output(b: Host, ag: agent_status.AgentStatus) -> cx.Output | str | None:
    st = b.steps.get(model_step(ag.turn))
    if st is None or st.phase != SP.SUCCEEDED:
        return None
    text = content_of(b, st)
    if text is None:
        return None
    return cx.parse_output(text, ag.turn)


def _take_output(
    b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig
) -> None:
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
    _note_fallback(b, ag, output)
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
    ag.stage = agent_status.AgentStage.ACTING


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


def _answer(b: Host, ag: agent_status.AgentStatus, st: m.StepStatus, output: cx.Output) -> None:
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
        ag.stage = agent_status.AgentStage.STOPPED
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
    ag.stage = agent_status.AgentStage.ANSWERED


def _cut_off(
    b: Host, agent: a.Agent, ag: agent_status.AgentStatus, st: m.StepStatus, output: cx.Output
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
    ag.stage = agent_status.AgentStage.STOPPED
    b.stop(
        CUT_OFF_REASON,
        f"the model's answer in turn {ag.turn} was cut off at maxOutputTokens ({limit}; "
        f"finish reason {CUT_OFF}), so it is not the run's result (kubectl agentrun "
        f"transcript shows it); {how}",
    )


def _remember(ag: agent_status.AgentStatus, output: cx.Output, invalid: int) -> None:
    recent = [*(ag.recent or []), _summary(ag.turn, output, invalid, answerer(ag, output))]
    ag.recent = recent[-a.MAX_RECENT_TURNS :]


def _summary(
    turn: int, output: cx.Output, invalid: int, by: cx.Answerer | None = None
) -> agent_status.TurnSummary:
    return agent_status.TurnSummary(
        model=by.name if by is not None else None,
        fallback=by.index if by is not None and by.index else None,
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
    ag: agent_status.AgentStatus,
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
    by = answerer(ag, output)
    if by is not None:
        record["answeredBy"] = {"index": by.index, "name": by.name, "baseURL": by.base_url}
    if output.fallback_from:
        record["fallbackFrom"] = list(output.fallback_from)
    if ctx is not None:
        record["context"] = {
            "name": ctx.name,
            "bytes": ctx.bytes,
            "messages": ctx.messages,
            "pagedResults": ctx.paged_results,
            "omittedTurns": ctx.omitted_turns,
        }
    return record


def _close_turn(b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig) -> None:
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
        ag.stage = agent_status.AgentStage.STOPPED
        b.stop(
            "MaxTurnsReached",
            f"the model was still calling tools in turn {ag.turn}, the last one "
            f"(spec.agent.maxTurns {agent.max_turns}), and gave no answer",
        )
        return
    ag.turn += 1
    ag.calls = None
    ag.finish_reason = None
    ag.stage = agent_status.AgentStage.READY


def _as_called(output: cx.Output, calls: Sequence[agent_status.ToolCallStatus]) -> cx.Output:
    """The output with exactly the calls recorded (ids as normalized)."""
    return cx.Output(
        content=output.content,
        tool_calls=tuple(cx.ToolCall(c.id, c.tool, c.arguments) for c in calls),
        finish_reason=output.finish_reason,
    )


def _previous_context(b: Host, ag: agent_status.AgentStatus) -> cx.Context | None:
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
