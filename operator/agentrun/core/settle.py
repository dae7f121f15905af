"""Ending, settling and retention: the end of a pass, and what ends a run.

:func:`settle` derives the run's phase, message and current steps from its steps, and ends the
run when every step is done, or when it must stop and nothing runs any more. :func:`end_run`
and :func:`abort` end it at once; :func:`set_conditions` derives its conditions from its phase
(Succeeded for ``kubectl wait``; Ready, Reconciling and Stalled after kstatus). A step removed
from the plan is cancelled here (:func:`forget_removed_steps`), and one added back starts
again (:func:`restart_readded`).

:func:`apply_retention` deletes finished step Jobs, never before their outcome is committed
and only a grace later, and the finished run once its TTL passed; :func:`let_strays_go` stops
and lets go the Jobs that lost their step.

Imports :mod:`.builder` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_loop, children
from agentrun.core.actions import CreateJob, DeleteJob, DeleteRun, ReleaseJob
from agentrun.core.builder import Builder, all_steps, floor_seconds, truncate
from agentrun.core.observed import JobState, ObservedJob

SUCCEEDED = "Succeeded"
APPROVAL_PENDING = "ApprovalPending"
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
"""Ready, Reconciling and Stalled follow kstatus (sigs.k8s.io/cli-utils/pkg/kstatus), the
library behind Flux's health checks and Helm 4's ``--wait``: see :func:`set_conditions`."""
TTL_LIMIT = 100 * 365 * 86400


def forget_removed_steps(b: Builder) -> None:
    """Steps removed from the plan keep their record; running ones are stopped."""
    names = {s.name for s in b.run.spec.plan.steps} | agent_loop.dynamic_names(
        b.status.agent, b.run.spec.agent
    )
    for name, st in b.steps.items():
        if name in names or st.phase in m.TERMINAL_STEP_PHASES:
            continue
        if st.phase in m.ACTIVE_STEP_PHASES and st.job_name:
            b.after.append(DeleteJob(st.job_name, "RemovedFromPlan"))
        st.finished_at = b.now
        b.move(st, SP.CANCELLED, "RemovedFromPlan", "the step was removed from the plan")


def restart_readded(b: Builder, st: m.StepStatus) -> None:
    """A step removed from the plan and added back: it starts again, from its next attempt
    number (so a new Job name: the Job of its last attempt may still be going away). Its
    attempts so far still count against retry.limit and the budget."""
    st.error = None
    st.summary = None
    st.result = None
    st.result_ref = None
    st.result_digest = None
    st.finished_at = None
    st.next_attempt_at = None
    st.attempt_started_at = None
    st.approval_requested_at = None
    st.decided_by = None
    b.move(
        st,
        SP.PENDING,
        "ReAddedToPlan",
        f"the step is back in the plan; it starts again as attempt {st.attempt + 1}",
    )


def abort(b: Builder, phase: m.RunPhase, reason: str, message: str, by: str | None = None) -> None:
    """End the run now: stop running attempts (cancel running children), keep every committed
    result."""
    children.switches(b, cancel=True)
    stopped = set()
    for st in b.steps.values():
        if st.phase in m.ACTIVE_STEP_PHASES:
            if st.job_name and not children.is_child_step(b, st.name):
                b.after.append(DeleteJob(st.job_name, reason))
                stopped.add(st.job_name)
            st.finished_at = b.now
            b.move(st, SP.CANCELLED, reason, f"stopped: {message}", by)
    # A committed intent whose Job this pass was about to create (again) is not carried out:
    # the run ends in this same write.
    b.after[:] = [a for a in b.after if not (isinstance(a, CreateJob) and a.job_name in stopped)]
    end_run(b, phase, reason, message, by)


def end_run(
    b: Builder, phase: m.RunPhase, reason: str, message: str, by: str | None = None
) -> None:
    for st in b.steps.values():
        if st.phase not in m.TERMINAL_STEP_PHASES:
            st.next_attempt_at = None
            b.move(st, SP.SKIPPED, "NotRun", f"not run: {message}")
    status = b.status
    old = status.phase
    status.phase = phase
    status.completed_at = b.now
    status.message = truncate(message)
    if status.started_at is not None:
        usage = status.usage or m.Usage()
        usage.wall_time_seconds = int((b.now - status.started_at).total_seconds())
        status.usage = usage
    b.record(None, old, phase, reason, message, by)
    set_conditions(b, reason)


def settle(b: Builder) -> None:
    """Derive the run's phase, progress and message from its steps."""
    sts = [b.steps[s.name] for s in all_steps(b)]
    active = [s for s in sts if s.phase in m.ACTIVE_STEP_PHASES]
    backing = [s for s in sts if s.phase == SP.BACKING_OFF]
    waiting = [s for s in sts if s.phase == SP.WAITING_FOR_APPROVAL]
    status = b.status
    loop = agent_loop.settled(b.run, status, b.config.agent)  # None: not an agent run (yet)

    if b.halt is not None:
        if not active:
            end_run(b, m.RunPhase.FAILED, b.halt.reason, b.halt.message)
            return
        phase, reason = m.RunPhase.RUNNING, "Stopping"
        message = f"stopping ({b.halt.message}); waiting for {_names(active)} to finish"
    elif loop is not None and loop.done:
        end_run(b, loop.phase, loop.reason, loop.message)
        return
    elif not agent_loop.is_agent_run(b.run) and all(
        s.phase in (SP.SUCCEEDED, SP.SKIPPED) for s in sts
    ):
        skipped = sum(1 for s in sts if s.phase == SP.SKIPPED)
        message = f"all {len(sts)} steps succeeded"
        if skipped:
            message = f"{len(sts) - skipped} steps succeeded, {skipped} skipped after a rejection"
        end_run(b, m.RunPhase.SUCCEEDED, "Succeeded", message)
        return
    elif b.run.spec.suspend:
        phase, reason = m.RunPhase.SUSPENDED, "Suspended"
        message = "suspended: no new step starts until spec.suspend is false"
        if active:
            message += f"; {_names(active)} still running"
    elif loop is not None and loop.phase == m.RunPhase.SUSPENDED and not active:
        phase, reason, message = loop.phase, loop.reason, loop.message
    elif waiting and not active and not backing:
        phase, reason = m.RunPhase.WAITING_FOR_APPROVAL, "WaitingForApproval"
        message = "waiting for approval of " + ", ".join(
            f"{s.name} (args {(s.args_hash or '')[:12]})" for s in waiting
        )
    elif active or backing or waiting:
        phase, reason = m.RunPhase.RUNNING, "Running"
        parts = []
        if active:
            parts.append(f"running {_names(active)}")
        if backing:
            parts.append(f"retrying {_names(backing)}")
        if waiting:
            parts.append(f"waiting for approval of {_names(waiting)}")
        message = "; ".join(parts)
    elif loop is not None:
        phase, reason, message = loop.phase, loop.reason, loop.message
    else:  # pragma: no cover - every non-terminal plan has one of the above
        phase, reason, message = m.RunPhase.PENDING, "Pending", "nothing to run yet"

    if status.phase != phase:
        b.record(None, status.phase, phase, reason, message)
        status.phase = phase
    status.message = truncate(message)
    current = active + backing + waiting
    status.current_step = truncate(", ".join(s.name for s in current), 200) or None
    set_conditions(b, reason)


def _names(sts: Sequence[m.StepStatus]) -> str:
    names = [s.name for s in sts]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def set_conditions(b: Builder, reason: str) -> None:
    """The run's conditions, from its phase; ``reason`` is the phase's.

    ``Succeeded`` (Unknown, then True or False) is what ``kubectl wait`` waits for. ``Ready``,
    ``Reconciling`` and ``Stalled`` follow kstatus, so tools that compute a resource's status
    read a run as Current once it succeeded, InProgress while it moves, and Failed once it
    cannot go on:

    * Ready: True only when the run Succeeded.
    * Reconciling: True while the run moves (Pending, Running, WaitingForApproval, and
      Running while stopping). False once it ended, and while Suspended: nothing starts until
      someone acts.
    * Stalled: True when the run Failed or was Cancelled, and when the agent loop paused it
      for want of budget (Suspended without spec.suspend): it cannot go on by itself. A user's
      spec.suspend is a choice, not a stall: Stalled stays False (kstatus then reads the run
      as InProgress, from Ready False).
    """
    status = b.status
    phase = status.phase
    message = status.message or ""
    if phase == m.RunPhase.SUCCEEDED:
        value = m.ConditionStatus.TRUE
    elif phase in (m.RunPhase.FAILED, m.RunPhase.CANCELLED):
        value = m.ConditionStatus.FALSE
    else:
        value = m.ConditionStatus.UNKNOWN
    _condition(b, SUCCEEDED, value, reason, message)
    ready = phase == m.RunPhase.SUCCEEDED
    moving = phase not in m.TERMINAL_RUN_PHASES and phase != m.RunPhase.SUSPENDED
    stalled = phase in (m.RunPhase.FAILED, m.RunPhase.CANCELLED) or (
        phase == m.RunPhase.SUSPENDED and not b.run.spec.suspend
    )
    _condition(b, READY, _truth(ready), reason, message)
    _condition(b, RECONCILING, _truth(moving), reason, message if moving else "")
    _condition(b, STALLED, _truth(stalled), reason, message if stalled else "")
    waiting = [s for s in b.steps.values() if s.phase == SP.WAITING_FOR_APPROVAL]
    if waiting:
        _condition(
            b,
            APPROVAL_PENDING,
            m.ConditionStatus.TRUE,
            "ApprovalRequested",
            "; ".join(f"step {s.name} needs approval of argsHash {s.args_hash}" for s in waiting),
        )
    elif any(c.type == APPROVAL_PENDING for c in status.conditions or []):
        _condition(b, APPROVAL_PENDING, m.ConditionStatus.FALSE, "NoApprovalPending", "")


def _truth(value: bool) -> m.ConditionStatus:
    return m.ConditionStatus.TRUE if value else m.ConditionStatus.FALSE


def ended_reason(status: m.AgentRunStatus) -> str:
    """The reason a finished run ended with, as its Succeeded condition recorded it."""
    done = next((c for c in status.conditions or [] if c.type == SUCCEEDED), None)
    return done.reason if done is not None else str(status.phase)


def _condition(b: Builder, ctype: str, value: m.ConditionStatus, reason: str, msg: str) -> None:
    conditions = b.status.conditions or []
    generation = b.run.metadata.generation or None
    existing = next((c for c in conditions if c.type == ctype), None)
    if existing is None:
        conditions.append(
            m.Condition(
                type=ctype,
                status=value,
                reason=reason,
                message=truncate(msg),
                observed_generation=generation,
                last_transition_time=b.now,
            )
        )
    else:
        if existing.status != value:
            existing.last_transition_time = b.now
        existing.status = value
        existing.reason = reason
        existing.message = truncate(msg)
        existing.observed_generation = generation
    b.status.conditions = conditions


def _outcome_committed(committed: m.StepStatus | None, job: ObservedJob) -> bool:
    """Whether the status as read (not the one being derived) already records this attempt's
    outcome: only then may its Job, the last evidence of that outcome, go away."""
    if committed is None:
        return False
    if committed.attempt > job.attempt:
        return True
    return committed.attempt == job.attempt and (
        committed.phase in m.TERMINAL_STEP_PHASES or committed.phase == SP.BACKING_OFF
    )


def let_strays_go(b: Builder, retention: m.Retention, grace: timedelta) -> None:
    """Jobs that lost their step (removed from the plan, changed, or a later attempt's):
    one still running is deleted, its pods first (so none keeps running); one deleting is
    released once it has been deleting for the grace, which a stalled create cannot outlast;
    a finished one goes to the TTL controller, unless retention keeps it."""
    for job in b.observed.strays:
        if job.deleting:
            since = min(floor_seconds(job.deleted_at), b.now) if job.deleted_at else b.now
            if b.now >= since + grace:
                b.after.append(DeleteJob(job.name, "Deleted", release=True))
            else:
                b.timer(since + grace)
        elif job.state == JobState.ACTIVE:
            b.after.append(DeleteJob(job.name, "NotCurrentAttempt"))
        elif retention.keep_jobs == m.KeepJobs.NONE or (
            retention.keep_jobs == m.KeepJobs.FAILED and job.state == JobState.SUCCEEDED
        ):
            b.after.append(ReleaseJob(job.name, b.config.job_deletion_grace_seconds))


def apply_retention(b: Builder) -> None:
    """Delete finished step Jobs (after a grace) and, past its TTL, the finished run."""
    retention = b.run.spec.retention or m.Retention()
    grace = timedelta(seconds=b.config.job_deletion_grace_seconds)
    _retain_jobs(b, retention, grace)
    let_strays_go(b, retention, grace)
    status = b.status
    ttl = retention.ttl_seconds_after_finished
    if status.phase in m.TERMINAL_RUN_PHASES and ttl is not None and status.completed_at:
        # The API allows any int64; past a century it means "keep", and stays a valid date.
        due = status.completed_at + timedelta(seconds=min(ttl, TTL_LIMIT))
        if b.now >= due:
            b.after.append(DeleteRun(f"ttlSecondsAfterFinished ({ttl}s) passed"))
        else:
            b.timer(due)


def _retain_jobs(b: Builder, retention: m.Retention, grace: timedelta) -> None:
    """Release, delete or keep each of the run's Jobs observed (none on most passes of a
    plan: the Jobs let go are not observed)."""
    if not b.observed.jobs:
        return
    current = {st.job_name: st for st in b.steps.values() if st.job_name}
    committed = {st.name: st for st in (b.run.status.steps if b.run.status else None) or []}
    derived = {**b.closed, **{st.name: st for st in b.steps.values()}}
    for job in b.observed.jobs:
        if job.name_taken is not None:  # someone else's Job: left alone
            continue
        st = current.get(job.name)
        if job.state == JobState.ACTIVE and not job.deleting:
            if st is None or st.phase not in m.ACTIVE_STEP_PHASES:
                b.after.append(DeleteJob(job.name, "NotCurrentAttempt"))
            continue
        compacted = agent_loop.compacted(b.run, job.step)
        failed = job.state == JobState.FAILED or (st is not None and st.phase == SP.FAILED)
        keep = retention.keep_jobs == m.KeepJobs.ALL or (
            retention.keep_jobs == m.KeepJobs.FAILED and failed
        )
        if (
            not keep
            and job.held
            and not job.deleting
            and _outcome_committed(derived.get(job.step), job)
        ):
            # Committed by this decision or before: after_commit runs only once it is.
            b.after.append(ReleaseJob(job.name, b.config.job_deletion_grace_seconds))
            continue
        if not _outcome_committed(committed.get(job.step), job) and not compacted:
            continue
        if job.deleting and job.held:
            # Deleted (by someone else, or by the operator), its outcome recorded: released
            # once it has been deleting for the grace, which a stalled create cannot outlast.
            since = min(floor_seconds(job.deleted_at), b.now) if job.deleted_at else b.now
            if job.deleted_at is None or b.now >= since + grace:
                b.after.append(DeleteJob(job.name, "Deleted", release=True))
            else:
                b.timer(since + grace)
            continue
        if job.deleting:  # released, and going (the TTL controller's doing): nothing to do
            continue
        if keep or (job.expires and not job.held):
            continue  # kept, or released to the TTL controller, which deletes it when due
        since = (st.finished_at if st and st.finished_at else None) or job.finished_at or b.now
        due = min(floor_seconds(since), b.now) + grace
        if b.now >= due:
            b.after.append(DeleteJob(job.name, "Retention"))
        else:
            b.timer(due)
