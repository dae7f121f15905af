"""Asking an agent run the next question (``kubectl agentrun ask RUN QUESTION``,
:meth:`agentrun.clients.typed.AgentRunClient.ask`): pure functions, no API calls; making the
run is :func:`agentrun.clients.forks.ask`.

A follow-up is a fork after the answer: a new run with the old run's spec (model, tools,
instructions, limits, budget, policy), its own goal, the question, and
``spec.agent.resumeFrom`` naming the old run (name and uid) and the turn it answered in. The
operator reads the conversation from the old run's records up to that turn, adds the answer
and then the question (:mod:`agentrun.core.resume`), so the model sees the whole conversation
and the question after it. Left out of the copy: the plan and its carried results (the plan's
results are in the conversation already), ``actor`` (someone else may ask), approvals,
``suspend`` and ``cancel``.

Only a run that answered (phase Succeeded) can be asked: a run that failed or was cancelled
gave no answer to follow up on (a fork continues its conversation after a turn it closed), and
one still running has not answered yet.

The new run is named ``BASE-N`` with the lowest free N from 2 (the caller tries the names of
:func:`names` in order, taking the next when one exists). BASE is the old run's name, or the
conversation's first run's for a run that is itself a follow-up (annotation
:data:`ANNOTATION_CONVERSATION`); asking ``review-2`` of that conversation starts at
``review-3``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from agentrun.api import models as m
from agentrun.core import fork_plan as forking
from agentrun.core import resume as resuming

ANNOTATION_CONVERSATION = f"{m.GROUP}/conversation"
"""On a follow-up: the name of the conversation's first run, which its default names extend."""
ANNOTATION_ASKED_AFTER = f"{m.GROUP}/asked-after"
"""On a follow-up: ``namespace/name`` of the run asked, and the turn it answered in."""
MAX_NAMES = 100
"""Default names tried before the caller is told to name the new run."""
_NUMBERED = re.compile(r"^(.*)-([0-9]+)$")


def question_problem(question: str) -> str | None:
    """Why ``question`` cannot be asked; None when it can."""
    if not question.strip():
        return (
            "the question is empty: give the next question to ask (it becomes the new run's "
            "spec.goal)"
        )
    if len(question) > m.MAX_GOAL:
        return (
            f"the question is {len(question)} characters; a run's spec.goal, which it becomes, "
            f"holds at most {m.MAX_GOAL}: ask a shorter one"
        )
    return None


def ask_problem(run: m.AgentRun) -> str | None:
    """Why ``run`` cannot be asked the next question (a message saying what to do instead);
    None when it answered and can."""
    name = run.metadata.name
    where = f"agentrun/{name}"
    if run.spec.agent is None:
        return (
            f"{where} is not an agent run (it has no spec.agent): only an agent run's "
            "conversation can be asked the next question; create an agent run with the "
            "question as its spec.goal instead"
        )
    status = run.status or m.AgentRunStatus()
    phase = status.phase or m.RunPhase.PENDING
    said = f": {status.message}" if status.message else ""
    if phase not in m.TERMINAL_RUN_PHASES:
        return (
            f"{where} has not finished (phase {phase}{said}): ask once it has answered; "
            f"kubectl agentrun wait {name} waits for it"
        )
    if resuming.answered_in(run) is None:
        closed = _closed_turns(run)
        fork = (
            f"continue its conversation after a turn it closed with kubectl agentrun fork {name} "
            f"--from TURN (TURN 1 to {closed}), or create a new run"
            if closed
            else "create a new run with the question as its goal"
        )
        why = f" ({status.message})" if status.message else ""
        return (
            f"{where} ended {phase} without an answer{why}: there is no answer to ask the next "
            f"question of; {fork}"
        )
    problem = forking.agent_problem(run, "a follow-up")
    return f"{where}: {problem}" if problem is not None else None


def _closed_turns(run: m.AgentRun) -> int:
    """The last turn of ``run`` a fork can continue after (0: none)."""
    ag = run.status.agent if run.status else None
    ctx = ag.context if ag is not None else None
    return ctx.turn - 1 if ctx is not None else 0


def answered_turn(run: m.AgentRun) -> int:
    """The turn ``run`` answered in (after :func:`ask_problem` found nothing)."""
    turn = resuming.answered_in(run)
    assert turn is not None, "ask_problem lets only a run that answered through"
    return turn


def conversation(run: m.AgentRun) -> str:
    """The name of the first run of ``run``'s conversation: the base of default names."""
    annotations = run.metadata.annotations or {}
    return annotations.get(ANNOTATION_CONVERSATION) or run.metadata.name


def names(run: m.AgentRun) -> Iterator[str]:
    """The default names of a follow-up of ``run``, in the order to try them: ``BASE-N`` from
    N = 2, or after K when ``run`` is ``BASE-K`` itself; at most :data:`MAX_NAMES`."""
    base = conversation(run)
    first = 2
    numbered = _NUMBERED.match(run.metadata.name)
    if numbered and forking.suffixed(base, f"-{numbered.group(2)}") == run.metadata.name:
        first = int(numbered.group(2)) + 1
    for n in range(first, first + MAX_NAMES):
        yield forking.suffixed(base, f"-{n}")


def new_run(old: Mapping[str, Any], run: m.AgentRun, question: str, name: str) -> dict[str, Any]:
    """The follow-up ``name`` of ``run`` (``old``: the run as stored) asking ``question``
    (after :func:`question_problem` and :func:`ask_problem` found nothing)."""
    spec = forking.copied_spec(old)
    for key in ("plan", "actor"):
        spec.pop(key, None)
    spec["goal"] = question
    turn = answered_turn(run)
    forking.continuing(spec, run.metadata.name, run.metadata.uid, turn)
    annotations = {
        ANNOTATION_CONVERSATION: conversation(run),
        ANNOTATION_ASKED_AFTER: f"{run.metadata.namespace}/{run.metadata.name} at turn {turn}",
    }
    return forking.manifest(old, name, annotations, spec)
