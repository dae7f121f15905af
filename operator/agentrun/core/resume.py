"""Continuing another agent run's conversation (``spec.agent.resumeFrom``), pure: the checks
the shell makes while it reads the source run's records, and the first context of the run that
continues it.

A run with ``resumeFrom: {run: S, uid: U, turn: N}`` starts its loop, once its plan is done,
with the messages S's turn N+1 saw (or would have seen): S's context document of turn N+1,
which the operator assembled from S's committed records when S closed turn N. Nothing the
forking user writes goes into it, and nothing is trusted for its name or labels:

* S is read by name in this run's own namespace (``run`` is a name; a namespace cannot be
  named), and counts only when its ``metadata.uid`` is U;
* a context document counts only when the ConfigMap holding it is controlled by S (its
  controller owner reference is S's uid) and its content has the digest the chain gives it:
  S's status, which only the operator writes, commits the digest of S's newest context
  (``status.agent.context.digest``), and every context names the digest of the one it was made
  from (``previous``, :class:`agentrun.core.context.Context`), so walking back from the newest
  context to turn N+1 checks every document on the way;
* the run's creator must be allowed to ``get`` S and the ConfigMap holding that document (the
  shell asks with LocalSubjectAccessReviews, :mod:`agentrun.access.authz`): the operator does not
  lend
  its own right to read them.

A run that continues after the turn S **answered** in (``turn`` is S's last turn: kubectl
agentrun ask) asks S's conversation the next question: its first context is S's context of that
turn itself, then S's answer (``status.agent.answer``, or the transcript record S's status
names, checked against ``status.agent.answerDigest``) as the assistant message of that turn, then
this run's ``spec.goal`` as a user message. The question has no turn of its own (no ``x-turn``),
so paging keeps it as it keeps the first user message.

Any failure ends the run before its first model turn, reason :data:`REASON`, with a message
saying what did not hold. The first context keeps the source's messages as they are (their
``x-turn`` marks are the source's turn numbers) and gets this run's tools; this run's turns
then mark their messages with their number in the conversation (``earlierTurns`` + turn), so
paging sees one conversation. Budgets and ``maxTurns`` count this run's own turns only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import context as cx
from agentrun.core import naming
from agentrun.core.observed import ResumeSource
from agentrun.core.turns import context_name

REASON = "ResumeRefused"
"""The reason a run that cannot continue the conversation it names fails with."""


def wanted(run: m.AgentRun) -> a.ResumeFrom | None:
    """The conversation to read for ``run`` in this pass: its ``spec.agent.resumeFrom`` until
    its first turn has taken it (and never for a finished run)."""
    agent = run.spec.agent
    if agent is None or agent.resume_from is None:
        return None
    status = run.status
    if status is not None and status.phase in m.TERMINAL_RUN_PHASES:
        return None
    if status is not None and status.agent is not None and status.agent.turn > 0:
        return None
    return agent.resume_from


def _source_ref(run: m.AgentRun, resume: a.ResumeFrom) -> str:
    return f"agentrun/{resume.run} in namespace {run.metadata.namespace}"


def source_problem(run: m.AgentRun, resume: a.ResumeFrom, source: m.AgentRun | None) -> str | None:
    """Why ``source`` (the run of ``resume.run`` in ``run``'s namespace, None when there is
    none) cannot be continued after ``resume.turn``; None when its records may be read."""
    where = _source_ref(run, resume)
    if source is None:
        return f"{where} does not exist: the conversation to continue is gone with it"
    if source.metadata.uid != resume.uid:
        return (
            f"{where} has uid {source.metadata.uid}, not {resume.uid}: it is not the run "
            "resumeFrom names (that one was deleted, or is not in this namespace)"
        )
    if source.metadata.uid == run.metadata.uid:
        return "a run cannot continue its own conversation"
    return turn_problem(source, resume.turn, where)


def turn_problem(source: m.AgentRun, turn: int, where: str) -> str | None:
    """Why the conversation of ``source`` (``where``, for the message) cannot be continued
    after ``turn`` as its status stands; None when it can."""
    if source.spec.agent is None:
        return f"{where} is not an agent run (it has no spec.agent): it has no conversation"
    ag = source.status.agent if source.status else None
    ctx = ag.context if ag is not None else None
    if ag is None or ctx is None:
        return f"{where} has not started its conversation"
    last = ctx.turn - 1  # the turns closed with a context after them
    if 1 <= turn <= last or turn == answered_in(source):
        return None
    closed = f"its conversation goes up to turn {last}" if last else "it has closed no turn yet"
    return f"{where} has not closed turn {turn}: {closed}"


def answered_in(source: m.AgentRun) -> int | None:
    """The turn ``source`` answered in; None while it has not answered (or never will)."""
    ag = source.status.agent if source.status else None
    return ag.turn if ag is not None and ag.stage == agent_status.AgentStage.ANSWERED else None


def context_turn(source: m.AgentRun, turn: int) -> int:
    """The turn whose context document holds the conversation continued after ``turn``: the
    next turn's; for the turn ``source`` answered in, that turn's own (its answer and the
    question follow it)."""
    return turn if turn == answered_in(source) else turn + 1


def answer_map(source: m.AgentRun) -> str | None:
    """The ConfigMap holding ``source``'s answer, when status keeps it there rather than
    inline."""
    ag = source.status.agent if source.status else None
    if ag is None or ag.answer is not None or ag.answer_ref is None:
        return None
    return ag.answer_ref.name


def verified_answer(
    source: m.AgentRun, config_map: Mapping[str, Any] | None
) -> tuple[str, str] | str:
    """``source``'s answer and its digest: from its status, or from ``config_map`` (the one
    :func:`answer_map` names, None when missing) if it is ``source``'s and holds the answer
    with the digest status commits; else why not."""
    ag = source.status.agent if source.status else None
    what = f"the answer of agentrun/{source.metadata.name}"
    if ag is None or (ag.answer is None and ag.answer_ref is None):
        return f"{what} is not in its status"
    if ag.answer is not None:
        text = ag.answer
    else:
        assert ag.answer_ref is not None
        where = f"{what} (ConfigMap {ag.answer_ref.name}, key {ag.answer_ref.key})"
        if config_map is None:
            return f"{where} is gone"
        if not _controlled_by(config_map, source.metadata.uid):
            return f"{where} is not controlled by that run: it is not its record"
        found = (config_map.get("data") or {}).get(ag.answer_ref.key)
        if not isinstance(found, str):
            return f"{where} is not there"
        text = found
    digest = naming.sha256_text(text)
    if ag.answer_digest is not None and digest != ag.answer_digest:
        return (
            f"{what} does not have the digest {ag.answer_digest[:12]} that run committed: it "
            "was changed"
        )
    return text, digest


def anchor(source: m.AgentRun) -> tuple[int, str]:
    """The newest context of ``source`` and its digest, as its status commits them (after
    :func:`source_problem` found none)."""
    ctx = source.status.agent.context if source.status and source.status.agent else None
    assert ctx is not None
    return ctx.turn, ctx.digest


def context_map(source: m.AgentRun, turn: int, digest: str) -> str:
    """The name of ``source``'s ConfigMap holding its context of ``turn`` with ``digest``."""
    return context_name(source, turn, digest)


def _controlled_by(config_map: Mapping[str, Any], uid: str) -> bool:
    owners = (config_map.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(o, Mapping) and o.get("uid") == uid and o.get("controller") is True
        for o in owners
    )


def verified_document(
    config_map: Mapping[str, Any] | None, source: m.AgentRun, turn: int, digest: str
) -> tuple[str, cx.Context] | str:
    """The context document of ``turn`` of ``source`` from ``config_map`` (the ConfigMap
    :func:`context_map` names, None when missing), as text and parsed, if it is ``source``'s
    and has ``digest``; else why not."""
    name = context_map(source, turn, digest)
    what = f"the context of turn {turn} of agentrun/{source.metadata.name} (ConfigMap {name})"
    if config_map is None:
        return f"{what} is gone"
    if not _controlled_by(config_map, source.metadata.uid):
        return f"{what} is not controlled by that run: it is not its record"
    data = config_map.get("data") or {}
    parts: list[str] = []
    while isinstance(data.get(f"part-{len(parts)}"), str):
        parts.append(data[f"part-{len(parts)}"])
    document = "".join(parts)
    if naming.sha256_text(document) != digest:
        return f"{what} does not have the digest {digest[:12]} that run committed: it was changed"
    doc = cx.Context.from_parts([document])
    if isinstance(doc, str):
        return f"{what}: {doc}"
    if doc.turn != turn:
        return f"{what} is the context of turn {doc.turn}"
    return document, doc


def previous_link(doc: cx.Context, turn: int, source: m.AgentRun) -> tuple[int, str] | str:
    """The context before ``doc`` (of ``turn``) and its digest; or why it cannot be reached."""
    if doc.previous is None or turn <= 1:
        return (
            f"the context of turn {turn} of agentrun/{source.metadata.name} does not name the "
            f"one before it (an operator from before forks wrote it): fork from turn "
            f"{max(turn - 1, 1)} or later"
        )
    return turn - 1, doc.previous


def earlier_turns(source: m.AgentRun) -> int:
    """Turns of ``source``'s conversation before its own first (it may continue another)."""
    ag = source.status.agent if source.status else None
    return ag.resumed_from.earlier_turns if ag is not None and ag.resumed_from else 0


# ---------------------------------------------------------------------------------------------
# The core's side: the first context
# ---------------------------------------------------------------------------------------------


def take(
    run: m.AgentRun,
    resume: a.ResumeFrom,
    source: ResumeSource | None,
    tools: list[dict[str, Any]],
) -> tuple[cx.Context, agent_status.ResumedFrom] | str | None:
    """The first context of ``run`` (turn 1: the source's messages and ``run``'s tools, not
    paged yet) and what it was taken from; why not (a message for the run); or None while the
    shell has not read the source named by ``resume``."""
    origin = f"{run.metadata.namespace}/{resume.run}"
    if source is None or (source.run, source.uid, source.turn) != (
        origin,
        resume.uid,
        resume.turn,
    ):
        return None
    if source.problem is not None:
        return f"spec.agent.resumeFrom: {source.problem}"
    what = f"spec.agent.resumeFrom: the context of {origin} after turn {resume.turn}"
    if source.document is None or source.digest is None:
        return f"{what} was not read"
    if naming.sha256_text(source.document) != source.digest:
        return f"{what} does not have the digest {source.digest[:12]} its run committed"
    doc = cx.Context.from_parts([source.document])
    # After the answer: that turn's own context, its answer and this run's question follow.
    turn = resume.turn if source.answer is not None else resume.turn + 1
    if isinstance(doc, str) or doc.turn != turn:
        return f"{what} is not the context of turn {turn}"
    messages = doc.messages
    if source.answer is not None:
        if naming.sha256_text(source.answer) != source.answer_digest:
            return f"{what}: its answer does not have the digest its run committed"
        marked = source.earlier_turns + resume.turn
        messages = [*messages, *follow_up(marked, source.answer, run.spec.goal)]
    first = cx.Context(
        turn=1,
        messages=messages,
        tools=tools,
        omitted_turns=doc.omitted_turns,
        paged_results=doc.paged_results,
    )
    taken = agent_status.ResumedFrom(
        run=origin,
        uid=resume.uid,
        turn=resume.turn,
        context_digest=source.digest,
        earlier_turns=source.earlier_turns + resume.turn,
    )
    return first, taken


def follow_up(turn: int, answer: str, question: str) -> list[cx.Message]:
    """The messages after the context of ``turn`` (of the conversation) that its model
    answered in: the answer, then the next question, of no turn (so it is never left out)."""
    said = cx.assistant_message(turn, cx.Output(content=answer, finish_reason="stop"))
    return [said, {"role": "user", "content": question}]


def started_message(taken: agent_status.ResumedFrom, messages: int) -> str:
    """What the AgentStarted transition of a run that continues a conversation says."""
    return (
        f"the agent continues the conversation of {taken.run} after its turn {taken.turn} "
        f"({messages} messages, context {taken.context_digest[:12]}); turns and budgets count "
        "from here"
    )


def conversation_turn(ag: agent_status.AgentStatus) -> int:
    """The current turn's number in the conversation (its messages' ``x-turn``)."""
    return ag.turn + (ag.resumed_from.earlier_turns if ag.resumed_from else 0)
