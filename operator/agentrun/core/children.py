"""Sub-agents in a pass: a sub-agent call's step makes its child AgentRun, adopts it, reads
its outcome and counts its tokens; the parent's cancel and suspend reach its children. The
decisions are :mod:`agentrun.core.subagents`'; this module moves data between them and the
pass (:class:`agentrun.core.builder.Builder`).

A call's step goes Pending, then (approved, when gated) Launching with its intent committed:
the idempotency key, the child's name (from the key) and the budget carved for it are in
status before the :class:`~agentrun.core.actions.CreateChild` runs, and every create repeated
after a crash is built from them, so it is the same AgentRun and meets AlreadyExists. Found
under its name, the child is adopted only when it carries the operator's proof, its controller
is this run by uid and its spec is the one the call makes (else the call fails, ChildNameTaken,
and the object is left alone: see :func:`agentrun.core.subagents.adopt`);
its uid is committed, and from then on the call's outcome and tokens are read from the run
with that uid only. The child's answer is the call's result; a child that failed, was
cancelled or is gone is an error the model reads. A sub-agent call is never retried. A create
the API server refuses fails the call (ChildRefused), but for a refusal that may pass (a quota
on AgentRuns, :mod:`agentrun.core.refusals`): that one is tried again every few seconds for a
while.
"""

from __future__ import annotations

import json
from typing import Any

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import naming, subagents
from agentrun.core.actions import CreateChild, EmitEvent, PatchChild, StoreResult
from agentrun.core.builder import Builder, truncate
from agentrun.core.envelope import summary_line
from agentrun.core.observed import ObservedChild
from agentrun.core.refusals import create_refusal_waits
from agentrun.core.turn_steps import declared_tool
from agentrun.core.turns import child_call

CHILD_FAILED = "SubAgentFailed"
UNLIMITED = 2**53 - 1


def _tool(b: Builder, call: agent_status.ToolCallStatus) -> a.AgentTool | None:
    agent = b.run.spec.agent
    if agent is None:
        return None
    return next((t for t in agent.tools or [] if t.name == call.tool and t.agent), None)


def manifest(b: Builder, call: agent_status.ToolCallStatus, key: str) -> dict[str, Any] | None:
    """The child AgentRun of ``call`` (committed with its intent), as the operator creates
    it; None when the run no longer declares the tool."""
    agent = b.run.spec.agent
    tool = _tool(b, call)
    if agent is None or tool is None or tool.agent is None or call.child is None:
        return None
    declared = declared_tool(agent, b.status.agent, tool)
    arguments = json.loads(call.arguments or "{}")
    goal = subagents.goal_of(declared, arguments if isinstance(arguments, dict) else {})
    if goal is None:  # pragma: no cover - validated before the call was accepted
        return None
    return subagents.child_manifest(b.run, b.observed.depth, key, declared, goal, call.child.tokens)


def launch(b: Builder, st: m.StepStatus) -> CreateChild | None:
    """The name of the call's child, committed now, and the create to run once it is."""
    call = child_call(b.status.agent, st.name)
    key = st.idempotency_key or ""
    if call is None or call.child is None:  # pragma: no cover - launched as a child call
        return None
    body = manifest(b, call, key)
    if body is None:  # pragma: no cover - the tool is frozen with the run
        return None
    call.child.name = str(body["metadata"]["name"])
    st.job_name = call.child.name
    return CreateChild(st.name, body)


def _found(b: Builder, name: str | None) -> ObservedChild | None:
    return next((c for c in b.observed.children or () if c.name == name), None)


def observe(b: Builder, step: m.Step, st: m.StepStatus) -> None:
    """A launched sub-agent call: create its child again until found, adopt it, and end the
    call with the child's outcome."""
    call = child_call(b.status.agent, st.name)
    if call is None or call.child is None or b.observed.children is None:
        return  # the children were not read in this pass
    child = call.child
    refused = b.observed.job_refusals.get(child.name or "")
    if child.uid is None and refused is not None:
        what = f"child AgentRun {child.name}"
        if not create_refusal_waits(b, st, what, refused, "ChildRefused"):
            _fail(b, st, "ChildRefused", f"the API refused the child AgentRun: {refused}")
            return
    if child.uid is None:
        found = _found(b, child.name)
        body = manifest(b, call, st.idempotency_key or "")
        if body is None:  # pragma: no cover - the tool is frozen with the run
            return
        if found is None:
            b.after.append(CreateChild(st.name, body))
            return
        verdict = subagents.adopt(
            found, b.run.metadata.uid or "", subagents.spec_digest(body["spec"])
        )
        if isinstance(verdict, subagents.Refused):  # someone else's object holds the name
            _fail(b, st, verdict.reason, verdict.message)
            text = truncate(f"step {st.name}: {verdict.message}")
            b.events.append(EmitEvent("Warning", verdict.reason, text))
            return
        child.uid = verdict.uid
        b.move(
            st,
            SP.RUNNING,
            "SubAgentStarted",
            f"child AgentRun {found.name} (uid {found.uid}) runs the call"
            + (f" with up to {child.tokens} tokens" if child.tokens is not None else ""),
        )
    outcome = subagents.child_outcome(child.uid, b.observed.children)
    if not outcome.done:
        return
    if outcome.answer is None:
        _fail(b, st, CHILD_FAILED, outcome.error or "the sub-agent gave no answer")
        return
    _succeed(b, st, outcome.answer, child.name or "")


def _succeed(b: Builder, st: m.StepStatus, answer: str, name: str) -> None:
    st.summary = summary_line(answer) or "(no answer)"
    st.result = None
    st.result_ref = None
    st.result_digest = None
    if len(answer.encode("utf-8", "surrogatepass")) <= min(
        b.config.inline_result_limit, m.MAX_INLINE_RESULT
    ):
        st.result = answer
    else:
        st.result_digest = naming.sha256_text(answer)
        ref = naming.result_object_name(
            b.run.metadata.name or "", b.run.metadata.uid or "", st.name, st.attempt
        )
        b.before.append(StoreResult(ref, st.name, st.attempt, (("result", answer),)))
        st.result_ref = m.ResultRef(name=ref, key="result")
    st.error = None
    st.finished_at = b.now
    st.attempt_started_at = None
    b.move(st, SP.SUCCEEDED, "SubAgentAnswered", f"child AgentRun {name} answered")


def _fail(b: Builder, st: m.StepStatus, reason: str, message: str) -> None:
    st.error = m.StepError(reason=reason, message=truncate(message, 1024), at=b.now)
    st.finished_at = b.now
    st.attempt_started_at = None
    b.move(st, SP.FAILED, reason, message)


def _in_flight(b: Builder) -> list[agent_status.ChildCall]:
    ag = b.status.agent
    return [c.child for c in (ag.calls if ag is not None else None) or [] if c.child]


def count(b: Builder) -> None:
    """Add what the current turn's children used since the last pass to the run's tokens
    (each at most its carved budget, never less than counted before)."""
    if b.observed.children is None:
        return
    adopted = [c for c in _in_flight(b) if c.uid is not None]
    carved = {c.uid: UNLIMITED if c.tokens is None else c.tokens for c in adopted if c.uid}
    before = {c.uid: c.counted for c in adopted if c.uid}
    now = subagents.counted_tokens(carved, before, b.observed.children)
    added = 0
    for child in adopted:
        if child.uid is None:  # pragma: no cover - filtered above
            continue
        new = now.get(child.uid, child.counted)
        added += new - child.counted
        child.counted = new
    if added:
        usage = b.status.usage or m.Usage()
        usage.tokens = min(usage.tokens + added, m.MAX_TOKENS)
        b.status.usage = usage


def switches(b: Builder, cancel: bool = False) -> None:
    """Set the children's spec.cancel and spec.suspend as the run's say (``cancel``: the run
    is ending)."""
    if b.observed.children is None:
        return
    mine = {c.uid: c for c in _in_flight(b) if c.uid is not None}
    carved = {uid: UNLIMITED if c.tokens is None else c.tokens for uid, c in mine.items() if uid}
    found = [c for c in b.observed.children if c.uid in mine]
    if cancel:  # a child created but not adopted yet: the run's only with the operator's proof
        named = {c.name for c in _in_flight(b) if c.uid is None and c.name}
        found += [
            c
            for c in b.observed.children
            if c.name in named and c.controller_uid == b.run.metadata.uid and c.proven
        ]
    wanted = subagents.child_switches(
        cancel or bool(b.run.spec.cancel), bool(b.run.spec.suspend), found, carved
    )
    for switch in wanted:
        b.after.append(PatchChild(switch.name, switch.uid, switch.cancel, switch.suspend))


def is_child_step(b: Builder, name: str) -> bool:
    return child_call(b.status.agent, name) is not None
