"""What one committed status write changed, as facts for metrics and traces.

A pass reads a run (``before``: its status as read), the core derives the next status, and the
ledger commits it (``after``). :func:`derive` compares the two and says what happened in
between: attempts started and ended, approvals decided, tokens reported, the run ending. It is
called only once a write has committed, with the status as read and the status committed, so
a pass that meets 409 counts nothing; the pass that re-derives and commits counts the change
once. Nothing here keeps state between passes, reads the cluster or adds a request: every fact
comes from the two statuses (the transitions committed since ``before`` are those of
``after.history`` with a higher ``seq``).

:func:`observe_commit` is the one call the reconciler makes: it derives the changes and hands
them to :mod:`agentrun.telemetry.metrics` and :mod:`agentrun.telemetry.tracing`.
"""

from __future__ import annotations

import logging
from datetime import datetime

from agentrun.api import models as m
from agentrun.telemetry import metrics, tracing

# Re-exported: callers and tests read the facts where they are derived.
from agentrun.telemetry.facts import APPROVED as APPROVED
from agentrun.telemetry.facts import CANCELLED as CANCELLED
from agentrun.telemetry.facts import EXPIRED as EXPIRED
from agentrun.telemetry.facts import FAILED as FAILED
from agentrun.telemetry.facts import REJECTED as REJECTED
from agentrun.telemetry.facts import SUCCEEDED as SUCCEEDED
from agentrun.telemetry.facts import ApprovalDecided as ApprovalDecided
from agentrun.telemetry.facts import AttemptEnded as AttemptEnded
from agentrun.telemetry.facts import Changes as Changes
from agentrun.telemetry.facts import RunEnded as RunEnded

log = logging.getLogger("agentrun.telemetry")

SP = m.StepPhase
ACTIVE = frozenset({str(SP.LAUNCHING), str(SP.RUNNING)})


def new_transitions(before: m.AgentRunStatus | None, after: m.AgentRunStatus) -> list[m.Transition]:
    """The transitions ``after`` committed that ``before`` did not hold, oldest first."""
    seen = (before.history_seq if before else None) or 0
    if (after.history_seq or 0) <= seen:
        return []
    return sorted((t for t in after.history or [] if t.seq > seen), key=lambda t: t.seq)


def derive(before: m.AgentRunStatus | None, after: m.AgentRunStatus) -> Changes:
    """What was committed between the status as read (``before``, None for a new run) and the
    status written (``after``)."""
    old_usage = (before.usage if before else None) or m.Usage()
    new_usage = after.usage or m.Usage()
    transitions = new_transitions(before, after)
    # Only the steps the new transitions name: a pass of a long plan changes a step or two.
    named = {t.step for t in transitions if t.step is not None}
    old_steps = _named(before.steps if before else None, named)
    new_steps = _named(after.steps, named)

    attempt = {name: st.attempt for name, st in old_steps.items()}
    launched_at: dict[str, datetime] = {}
    ended: list[AttemptEnded] = []
    approvals: list[ApprovalDecided] = []
    for t in transitions:
        name = t.step
        if name is None:
            continue
        old = old_steps.get(name)
        new = new_steps.get(name)
        if t.from_phase == SP.WAITING_FOR_APPROVAL and t.to_phase != SP.WAITING_FOR_APPROVAL:
            decision = _decision(t)
            if decision is not None:
                requested = old.approval_requested_at if old is not None else None
                approvals.append(ApprovalDecided(name, decision, requested, t.at, t.by))
        if t.to_phase == SP.LAUNCHING and t.from_phase != SP.LAUNCHING:
            attempt[name] = attempt.get(name, 0) + 1
            launched_at[name] = t.at
            continue
        outcome = _attempt_outcome(t)
        if outcome is None:
            continue
        started = launched_at.pop(name, None)
        if started is None and old is not None:
            started = old.attempt_started_at
        ended_at = t.at
        tokens = 0
        if outcome == SUCCEEDED and new is not None:
            ended_at = min(new.finished_at or t.at, t.at)
            old_tokens = old.usage.tokens if old is not None and old.usage else 0
            tokens = max((new.usage.tokens if new.usage else 0) - old_tokens, 0)
        ended.append(
            AttemptEnded(
                step=name,
                attempt=attempt.get(name, new.attempt if new is not None else 0),
                outcome=outcome,
                retried=t.to_phase == SP.BACKING_OFF,
                reason=t.reason,
                started_at=started,
                ended_at=ended_at,
                tokens=tokens,
                approval_wait_seconds=_approval_wait(after.history or [], name, t.seq),
            )
        )
    return Changes(
        attempts_started=max(new_usage.attempts - old_usage.attempts, 0),
        attempts_ended=tuple(ended),
        approvals=tuple(approvals),
        tokens=max(new_usage.tokens - old_usage.tokens, 0),
        run_ended=_run_ended(before, after),
    )


def _named(steps: list[m.StepStatus] | None, names: set[str]) -> dict[str, m.StepStatus]:
    """The statuses among ``steps`` of the steps ``names``, by name."""
    if not names:
        return {}
    return {st.name: st for st in steps or [] if st.name in names}


def _attempt_outcome(t: m.Transition) -> str | None:
    """How a transition of a step ends its attempt, if it does (from Launching or Running)."""
    if t.from_phase not in ACTIVE:
        return None
    if t.to_phase == SP.SUCCEEDED:
        return SUCCEEDED
    if t.to_phase in (SP.FAILED, SP.BACKING_OFF):
        return FAILED
    if t.to_phase in (SP.CANCELLED, SP.PENDING, SP.SKIPPED):
        return CANCELLED
    return None


def _decision(t: m.Transition) -> str | None:
    if t.to_phase == SP.LAUNCHING:
        return APPROVED
    if t.reason == "Rejected":
        return REJECTED
    if t.reason == "ApprovalExpired":
        return EXPIRED
    return None  # e.g. skipped because the run ended, or the step left the plan


def _approval_wait(history: list[m.Transition], step: str, until_seq: int) -> float | None:
    """Seconds between the step entering WaitingForApproval and its approval launching the
    attempt that the transition ``until_seq`` ends; None when that attempt was not launched
    by an approval, or the history no longer holds both transitions."""
    launch: m.Transition | None = None
    for t in reversed(history):
        if t.step != step or t.seq > until_seq:
            continue
        if launch is None:
            if t.to_phase == SP.LAUNCHING and t.from_phase != SP.LAUNCHING:
                if t.from_phase != SP.WAITING_FOR_APPROVAL:
                    return None
                launch = t
            continue
        if t.to_phase == SP.WAITING_FOR_APPROVAL and t.from_phase != SP.WAITING_FOR_APPROVAL:
            return max((launch.at - t.at).total_seconds(), 0.0)
    return None


def _run_ended(before: m.AgentRunStatus | None, after: m.AgentRunStatus) -> RunEnded | None:
    was = before.phase if before else None
    if after.phase not in m.TERMINAL_RUN_PHASES or was in m.TERMINAL_RUN_PHASES:
        return None
    usage = after.usage or m.Usage()
    succeeded = next((c for c in after.conditions or [] if c.type == "Succeeded"), None)
    return RunEnded(
        phase=str(after.phase),
        reason=succeeded.reason if succeeded is not None else str(after.phase),
        started_at=after.started_at,
        completed_at=after.completed_at,
        tokens=usage.tokens,
        attempts=usage.attempts,
        steps=usage.steps,
    )


def observe_commit(run: m.AgentRun, committed: m.AgentRunStatus) -> None:
    """Count and trace what a pass committed: ``run`` as read, ``committed`` as written. Never
    raises (what is observed must not fail the pass that has already committed)."""
    try:
        changes = derive(run.status, committed)
        if not changes:
            return
        metrics.record(run.metadata.namespace, changes)
        tracing.record(run, changes)
    except Exception:
        log.exception("could not record the metrics of a committed pass")
