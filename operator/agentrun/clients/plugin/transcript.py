"""``kubectl agentrun transcript``: an agent run's conversation, turn by turn, and the agent's
part of ``kubectl agentrun status``.

The finished turns come from the run's transcript records (ConfigMaps labelled
``agentrun.dev/object=transcript``, one per turn, written by the operator when the turn
closed); the turn in progress from ``status.agent``, unless it has a record (the last turn of a
run that stopped after it closed: shown once, from its record). A run that ended had no turn
after its last: that turn's refused calls are shown without the model's hint to call them
again next turn. Pure functions over plain data: the command reads, these render.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.clients.plugin.render import one_line
from agentrun.core import agent_loop, turns

RESULT_LIMIT = 300
"""Characters of a tool result or a message shown per line; the record keeps all of it."""


def records_of(run: m.AgentRun, config_maps: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The turn records among ``config_maps`` that the run owns, in turn order (a ConfigMap
    that only carries the labels, made by someone else, is left out)."""
    found: dict[int, dict[str, Any]] = {}
    for cm in config_maps:
        meta = cm.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        if not any(o.get("uid") == run.metadata.uid and o.get("controller") for o in owners):
            continue
        data = cm.get("data") or {}
        try:
            record = json.loads(data.get("turn") or "")
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("turn"), int):
            key = record.get("contentKey")
            if isinstance(key, str) and record.get("content") is None:
                record["content"] = data.get(key)  # the answer, stored once under its key
            found[record["turn"]] = record
    return [found[t] for t in sorted(found)]


def _tokens(record: Mapping[str, Any]) -> str:
    usage = record.get("usage") or {}
    prompt, completion = usage.get("promptTokens", 0), usage.get("completionTokens", 0)
    return f"{prompt} prompt + {completion} completion tokens"


def _problem(problem: str, last: bool) -> str:
    """A refused call's problem as shown: for the ``last`` turn of a run that ended, without
    the hint to call it again next turn (the model read it with no next turn)."""
    if last:
        for joint in ("; ", ", "):
            problem = problem.replace(joint + turns.AGAIN_NEXT_TURN, "")
    return one_line(problem, RESULT_LIMIT)


def _call_lines(call: Mapping[str, Any], last: bool = False) -> list[str]:
    head = f"  -> {call.get('name')}({one_line(str(call.get('arguments') or ''), 200)})"
    head += f"  [{call.get('id')}]"
    outcome = str(call.get("outcome") or "?")
    if call.get("step"):
        outcome += f" as step {call['step']}"
        if call.get("attempts", 1) not in (None, 1):
            outcome += f" after {call['attempts']} attempts"
    if call.get("decidedBy"):
        outcome += f", decided by {call['decidedBy']}"
    if call.get("tokens"):
        outcome += f", {call['tokens']} tokens"
    lines = [head, f"     {outcome}"]
    if call.get("problem"):
        lines.append(f"     invalid: {_problem(str(call['problem']), last)}")
    if call.get("error"):
        lines.append(f"     error: {one_line(str(call['error']), RESULT_LIMIT)}")
    result = call.get("result")
    if call.get("summary") and one_line(str(call["summary"])) != one_line(str(result or "")):
        lines.append(f"     summary: {one_line(str(call['summary']), RESULT_LIMIT)}")
    if result is not None:
        lines.append(f"     result: {one_line(str(call['result']), RESULT_LIMIT)}")
    ref = call.get("resultRef")
    if isinstance(ref, Mapping):
        lines.append(f"     (whole result: ConfigMap {ref.get('name')} key {ref.get('key')})")
    return lines


def _answered_by_lines(record: Mapping[str, Any]) -> list[str]:
    """The model that answered the turn, when it was a fallback of spec.agent.model: ``answered
    by NAME at URL (fallback 1 after: why each model before it failed)``."""
    by = record.get("answeredBy")
    if not isinstance(by, Mapping) or not isinstance(by.get("index"), int) or by["index"] < 1:
        return []
    before = [str(line) for line in record.get("fallbackFrom") or []]
    why = f" after: {one_line('; '.join(before), RESULT_LIMIT)}" if before else ""
    return [f"  answered by {by.get('name')} at {by.get('baseURL')} (fallback {by['index']}{why})"]


def turn_lines(record: Mapping[str, Any], last: bool = False) -> list[str]:
    """One finished turn (``last``: the last of a run that ended, which no turn followed)."""
    context = record.get("context") or {}
    paged = ""
    if context.get("pagedResults") or context.get("omittedTurns"):
        paged = (
            f", {context.get('pagedResults', 0)} results by summary, "
            f"{context.get('omittedTurns', 0)} turns left out"
        )
    lines = [
        f"turn {record.get('turn')} (step {record.get('step')}; {_tokens(record)}; "
        f"finish {record.get('finishReason')}; context {context.get('bytes', '?')} bytes in "
        f"{context.get('messages', '?')} messages{paged})"
    ]
    content = str(record.get("content") or "")
    label = "answer" if record.get("answer") else "model"
    if record.get("cutOff"):
        label = "model (cut off at maxOutputTokens)"
    if content:
        lines.append(f"  {label}: {one_line(content, RESULT_LIMIT)}")
    lines.extend(_answered_by_lines(record))
    for call in record.get("toolCalls") or []:
        if isinstance(call, Mapping):
            lines.extend(_call_lines(call, last))
    if record.get("droppedCalls"):
        lines.append(f"  ({record['droppedCalls']} more calls dropped: over 64 in one turn)")
    return lines


def _ended(run: m.AgentRun) -> bool:
    """Whether the run's loop is over without an answer still to come: no turn follows its
    current one."""
    ag = run.status.agent if run.status else None
    phase = run.status.phase if run.status else None
    return phase in m.TERMINAL_RUN_PHASES or (
        ag is not None and ag.stage == agent_status.AgentStage.STOPPED
    )


def current_lines(run: m.AgentRun, closed: Iterable[int] = ()) -> list[str]:
    """The turn in progress, from status; for a run that ended, the turn it stopped in before
    that turn closed. Nothing when that turn is among ``closed`` (it has its record)."""
    ag = run.status.agent if run.status else None
    if (
        ag is None
        or ag.turn == 0
        or ag.stage == agent_status.AgentStage.ANSWERED
        or ag.turn in set(closed)
    ):
        return []
    stopped = _ended(run)
    steps = {st.name: st for st in (run.status.steps if run.status else None) or []}
    model = steps.get(agent_loop.model_step(ag.turn))
    if stopped and model is None and not ag.calls:
        return []  # it stopped before the turn began: there is nothing of it to show
    state = "stopped before it closed" if stopped else f"{str(ag.stage).lower()}, in progress"
    lines = [f"turn {ag.turn} ({state})"]
    if model is not None:
        lines.append(f"  model step {model.name}: {model.phase} ({one_line(model.message)})")
    for call in ag.calls or []:
        lines.append(f"  -> {call.tool}({one_line(call.arguments, 200)})  [{call.id}]")
        if call.problem:
            lines.append(f"     invalid: {_problem(call.problem, stopped)}")
        st = steps.get(call.step or "")
        if st is not None:
            waiting = ""
            if st.phase == m.StepPhase.WAITING_FOR_APPROVAL and not stopped:
                waiting = f" (kubectl agentrun approve {run.metadata.name} {st.name})"
            lines.append(f"     {st.phase} as step {st.name}, args {(st.args_hash or '')[:12]}"
                         f"{waiting}")  # fmt: skip
    return lines


def _resumed_line(run: m.AgentRun) -> list[str]:
    ag = run.status.agent if run.status else None
    taken = ag.resumed_from if ag is not None else None
    if taken is None:
        return []
    name = taken.run.partition("/")[2]
    return [
        f"(continues the conversation of {taken.run} after its turn {taken.turn}: "
        f"kubectl agentrun transcript {name})"
    ]


def transcript_lines(run: m.AgentRun, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The whole conversation: every finished turn, then the one in progress or the one the
    run stopped in before it closed (for a run that continues another's conversation, a first
    line saying whose). ``records`` are in turn order (:func:`records_of`)."""
    lines: list[str] = _resumed_line(run)
    current = current_lines(run, [int(record["turn"]) for record in records])
    final = _ended(run) and not current  # the last record is the run's last turn
    for index, record in enumerate(records):
        lines.extend(turn_lines(record, final and index == len(records) - 1))
    return lines + current


def _definition_line(run: m.AgentRun) -> str | None:
    """For a run of an Agent (spec.agentRef): which Agent and ModelConfig, at which
    generation, it took into status.agent.definition (or that it has not taken them)."""
    ref = run.spec.agent_ref
    if ref is None:
        return None
    ag = run.status.agent if run.status else None
    taken = ag.definition if ag is not None else None
    if taken is None:
        ended = run.status is not None and run.status.phase in m.TERMINAL_RUN_PHASES
        state = "never taken (the message says why)" if ended else "not taken yet"
        return f"agent: Agent {ref.name} (spec.agentRef), {state}"
    line = f"agent: Agent {taken.agent.name} (generation {taken.agent.generation})"
    source = taken.model_config_source
    if source is not None:
        line += f", ModelConfig {source.name} (generation {source.generation})"
    return line


def agent_status_lines(run: m.AgentRun) -> list[str]:
    """The agent's part of ``kubectl agentrun status``. ``run`` as the plugin reads it: a run
    of an Agent with ``spec.agent`` from the definition it took (agent_refs.effective)."""
    agent = run.spec.agent
    ag = run.status.agent if run.status else None
    definition = _definition_line(run)
    if agent is None:
        return [definition] if definition is not None else []
    model = ag.frozen.model if ag is not None and ag.frozen is not None else agent.model
    about = f"model {model.name} at {model.base_url}"
    if model.fallbacks:
        about += " (then " + ", ".join(f"{f.name} at {f.base_url}" for f in model.fallbacks) + ")"
    lines = [f"agent: {about}"] if definition is None else [definition, f"  {about}"]
    if ag is None:
        return [*lines, "  not started"]
    if ag.resumed_from is not None:
        lines.append(
            f"  continues the conversation of {ag.resumed_from.run} after its turn "
            f"{ag.resumed_from.turn}"
        )
    lines.append(
        f"  {str(ag.stage).lower()}, turn {ag.turn} of {agent.max_turns}; "
        f"{ag.tool_calls} tool calls ({ag.invalid_tool_calls} invalid); "
        f"{ag.prompt_tokens} prompt + {ag.completion_tokens} completion tokens"
    )
    for summary in ag.recent or []:
        lines.append(
            f"  turn {summary.turn}: {summary.tool_calls} calls"
            + (f" ({summary.invalid_calls} invalid)" if summary.invalid_calls else "")
            + f", {summary.tokens} tokens"
            + (f", fallback {summary.fallback} {summary.model}" if summary.fallback else "")
            + f": {one_line(summary.summary, 120)}"
        )
    if ag.answer is not None:
        lines.append(f"  answer: {one_line(ag.answer, RESULT_LIMIT)}")
    elif ag.answer_ref is not None:
        lines.append(f"  answer: in ConfigMap {ag.answer_ref.name} (kubectl agentrun result)")
    return lines
