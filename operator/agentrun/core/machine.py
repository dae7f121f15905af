"""The run state machine: ``(run, observed jobs, clock) -> (next status, actions)``.

Level-triggered: every call derives the whole next state from the run as read and the Jobs
observed now, never from remembering earlier calls. Called twice with the same inputs it returns
the same status, so duplicated events, conflicts and restarts are harmless.

How the shell must apply a :class:`Decision` (this order is what makes crashes harmless):

1. run ``before_commit`` actions (result objects that the new status will reference);
2. commit ``status`` with the resourceVersion the run was read at. A 409 Conflict means someone
   else moved the run: re-read, call :func:`reconcile` again, and drop this decision. When the
   decision contains a :class:`CreateJob` or :class:`CreateChild`, or a :class:`DeleteJob`
   that stops a Job, this write is mandatory even if the status did not change: it is the
   fence proving that the decision was derived from the latest committed state (the launch
   intent is still current, its outcome not recorded; the Job to stop is no attempt's in
   flight: one the run read does not account for may be a later attempt's, its Job seen
   before the intent that launched it);
3. run ``after_commit`` actions (create Jobs of committed intents, delete Jobs, events).

Launching a step is two steps apart: first the intent "step s, attempt k, Job J" is committed
(phase Launching), then Job J is created. J's name is a function of (run uid, s, k), so a crash
in between only means the next reconcile creates J again and meets AlreadyExists.

Finished step Jobs are deleted (per retention) only ``job_deletion_grace_seconds`` after they
finished, and never before their outcome is committed: the operator's finalizer keeps them
until then. Once it is, one write releases the finalizer and sets ``ttlSecondsAfterFinished``
to the grace, and Kubernetes' TTL controller deletes the Job when it is due. That grace is the
window in which a stalled operator that had already passed its fence write could still issue
its create; an operator must not stall longer than that between its fence write and its Job
creation.

The parts of a pass live in modules of their own, in layers (each imports only the ones
listed before it):

* :mod:`.builder`: the working state of a pass (:class:`~.builder.Builder`), which every part
  writes to, and :class:`CoreConfig`;
* :mod:`.arguments`: a step's inputs, its args hash and the approval rules keyed on it;
* :mod:`.settle`: ending the run, its phase and conditions from its steps, retention;
* :mod:`.launch`: which ready steps start, and their committed launch intents;
* :mod:`.carried`: results carried from an earlier run;
* :mod:`.attempts`: what the Jobs of running attempts say about them;
* this module: :func:`reconcile`, the order of those parts in a pass, and the
  :class:`Decision` it returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_loop, agent_refs, children, http_tool, mcp
from agentrun.core import frozen as freezing
from agentrun.core.actions import Action, CreateChild, CreateJob, DeleteJob, StartPod
from agentrun.core.arguments import needs_approval
from agentrun.core.attempts import observe_attempt
from agentrun.core.builder import Builder, CoreConfig, all_steps, floor_seconds, posts_event
from agentrun.core.carried import carry_results
from agentrun.core.graph import plan_problems
from agentrun.core.launch import committed_launch, launch_ready_steps
from agentrun.core.observed import Observed
from agentrun.core.settle import (
    READY,
    abort,
    apply_retention,
    end_run,
    ended_reason,
    forget_removed_steps,
    restart_readded,
    set_conditions,
    settle,
)

__all__ = ["CoreConfig", "Decision", "committed_launch", "posts_event", "reconcile"]


@dataclass(frozen=True)
class Decision:
    """The next status and what to do around committing it."""

    status: m.AgentRunStatus
    before_commit: tuple[Action, ...] = ()
    after_commit: tuple[Action, ...] = ()
    requeue_after: float | None = None
    """Seconds until a timer (backoff, deadline, retention) needs another reconcile."""

    @property
    def needs_fence(self) -> bool:
        """True when the commit must happen even if the status is unchanged: the decision
        creates a Job or a sub-agent's child run, or stops a Job (a release of a Job already
        being deleted stops nothing)."""
        return any(
            isinstance(a, CreateJob | CreateChild) or (isinstance(a, DeleteJob) and not a.release)
            for a in self.after_commit
        )

    def status_changed(self, previous: m.AgentRunStatus | None) -> bool:
        old = previous.to_wire() if previous is not None else {}
        return old != self.status.to_wire()


def reconcile(
    run: m.AgentRun, observed: Observed, now: datetime, config: CoreConfig | None = None
) -> Decision:
    """Derive the next status of ``run`` and the actions that move it forward."""
    config = config or CoreConfig()
    now = floor_seconds(now)
    status = _copy_status(run.status)
    run, by_ref = _take_agent(run, observed, status)
    steps = {s.name: s for s in (status.steps or [])}
    b = Builder(run, observed, now, config, status, steps)
    first_pass = status.phase is None

    if status.phase is None:
        status.phase = m.RunPhase.PENDING
        status.started_at = now
        b.record(None, None, m.RunPhase.PENDING, "Accepted", f"run accepted: {run.spec.goal}")
    if status.started_at is None:
        status.started_at = now

    if status.phase in m.TERMINAL_RUN_PHASES:
        if not any(c.type == READY for c in status.conditions or []):
            set_conditions(b, ended_reason(status))  # finished before Ready existed
        return _finish(b)

    if by_ref is not None:  # the Agent spec.agentRef names: not taken yet, or refused
        if by_ref:
            end_run(b, m.RunPhase.FAILED, agent_refs.REFUSED, by_ref)
        else:
            status.message = agent_refs.waiting_message(run)
            b.timers.append(now + timedelta(seconds=agent_refs.WAIT_SECONDS))
        return _finish(b)
    ref_changed = agent_refs.changed(run)
    if ref_changed is not None:
        by = _modified_by(run)
        abort(b, m.RunPhase.FAILED, agent_refs.CHANGED, ref_changed, by)
        return _finish(b)

    if not _spec_checked(run, status):
        problems = plan_problems(run.spec.plan.steps)
        if problems:
            end_run(b, m.RunPhase.FAILED, "InvalidPlan", "; ".join(problems))
            return _finish(b)
        agent = run.spec.agent
        problems = agent_problems(agent) if agent is not None else []
        if problems:
            end_run(b, m.RunPhase.FAILED, "InvalidAgent", "; ".join(problems))
            return _finish(b)

    # Before any step of the loop is built: its model turns are built from what this froze,
    # and a run whose spec.agent changed since stops here, launching nothing.
    changed = agent_loop.pin(b, first_pass)
    if changed is not None:
        by = _modified_by(run)
        abort(
            b,
            m.RunPhase.FAILED,
            agent_loop.SPEC_CHANGED,
            changed + (f" (spec last changed by {by})" if by else ""),
            by,
        )
        return _finish(b)

    _sync_plan(b)
    for step in all_steps(b):
        st = steps[step.name]
        if st.phase in (SP.LAUNCHING, SP.RUNNING):
            if children.is_child_step(b, step.name):
                children.observe(b, step, st)
            else:
                observe_attempt(b, step, st)
    children.count(b)

    budget = run.spec.budget or m.Budget()
    if _ended_by_cancel_or_deadline(b, budget):
        return _finish(b)
    _stop_for_budget_or_failure(b, budget)

    children.switches(b)
    if b.halt is None:
        agent_loop.advance(b, config.agent)
    if b.halt is None and not run.spec.suspend:
        launch_ready_steps(b, budget)

    settle(b)
    return _finish(b)


def _take_agent(
    run: m.AgentRun, observed: Observed, status: m.AgentRunStatus
) -> tuple[m.AgentRun, str | None]:
    """A run that names an Agent (spec.agentRef) and has not taken it: take what the shell
    read (into ``status.agent.definition``) and read the run with it from now on. Returns the
    run as the pass reads it, and None when it goes on; else why it fails (a message), or ""
    while the shell has not read the Agent yet."""
    if (
        run.spec.agent_ref is None
        or run.spec.agent is not None  # the shell gave it the agent it took
        or status.phase in m.TERMINAL_RUN_PHASES
        or agent_refs.definition_of(run) is not None
    ):
        return run, None
    taken = agent_refs.take(run, observed.definition)
    if taken is None or isinstance(taken, str):
        return run, taken or ""
    if status.agent is None:
        status.agent = agent_status.AgentStatus()
    status.agent.definition = taken
    return agent_refs.with_definition(run, taken), None


def _copy_status(status: m.AgentRunStatus | None) -> m.AgentRunStatus:
    """A copy of ``status`` the pass may change, ``run.status`` staying as read. Its steps are
    copied field by field, sharing their values (strings, numbers, timestamps: none of them
    changes in place) and copying the small models among them (:func:`_copy_step`): a pass
    changes a step or two, and validating every step again from its dump was the cost of a
    pass that grew most with a plan's size. The rest is validated from its dump (the models
    are plain data, so that is a deep copy). The history's transitions, most of the status
    once its ring is full, are frozen: shared, in a list of the copy's own."""
    if status is None:
        return m.AgentRunStatus()
    copy = m.AgentRunStatus.model_validate(status.model_dump(exclude={"history", "steps"}))
    if status.steps is not None:
        copy.steps = [_copy_step(st) for st in status.steps]
    if status.history is not None:
        copy.history = list(status.history)
    return copy


def _copy_step(st: m.StepStatus) -> m.StepStatus:
    """``st`` as a pass may change it without changing ``st``: its fields are immutable values
    or the models copied here, whose own fields are immutable values
    (``tests/unit/test_machine_copy.py`` checks that this stays so)."""
    copy = _shallow(st)
    for name in _STEP_MODELS:
        value = st.__dict__[name]
        if value is not None:
            copy.__dict__[name] = _shallow(value)
    return copy


_STEP_MODELS = ("error", "usage", "result_ref")
"""The fields of a step's status that hold models (see :func:`_copy_step`)."""

_Model = TypeVar("_Model", bound=BaseModel)


def _shallow(model: _Model) -> _Model:
    """A shallow copy of ``model``: what pydantic's ``model_copy()`` makes of a model without
    extra fields or private attributes (the API's: ``extra="forbid"``, none declared;
    ``tests/unit/test_machine_copy.py`` checks both), without the generic copies it pays for,
    which cost twice as much on every step of every pass."""
    copy = object.__new__(type(model))
    object.__setattr__(copy, "__dict__", model.__dict__.copy())
    object.__setattr__(copy, "__pydantic_fields_set__", set(model.__pydantic_fields_set__))
    object.__setattr__(copy, "__pydantic_extra__", None)
    object.__setattr__(copy, "__pydantic_private__", None)
    return copy


def _spec_checked(run: m.AgentRun, status: m.AgentRunStatus) -> bool:
    """Whether a pass already found nothing wrong with this spec (its plan and agent): the
    status read was written for this generation of it (``observedGeneration``) and the run
    goes on, which a problem found would have ended. The checks walk the whole plan, so a run
    of many steps would otherwise pay them on each of its passes."""
    generation = run.metadata.generation
    return bool(generation) and status.observed_generation == generation


def agent_problems(agent: a.Agent) -> list[str]:
    """What is wrong with ``spec.agent`` that its schema cannot tell: a tool name offered
    twice (the model calls tools by name), a sub-agent tool naming a tool there is not, an
    HTTP tool whose URL or body takes an argument it does not declare or whose URL names a
    host it does not allow."""
    problems: list[str] = []
    if agent.mcp_servers:
        clashes = mcp.name_conflicts([t.name for t in agent.tools or []], agent.mcp_servers)
        if clashes:
            problems.append(
                "; ".join(clashes) + ": the model calls tools by name, so each must be unique"
            )
    names = {t.name for t in agent.tools or []}
    for tool in agent.tools or []:
        problems += http_tool.declaration_problems(tool)
        missing = [n for n in (tool.agent.tools or []) if n not in names] if tool.agent else []
        if missing:
            problems.append(
                f"the sub-agent tool {tool.name} names tools spec.agent.tools does not have: "
                + ", ".join(missing)
            )
    return problems


def _sync_plan(b: Builder) -> None:
    """Steps of the plan the status does not know yet start Pending (or take the result carried
    for them), a step added back after its removal starts again, gated steps are marked, and
    steps removed from the plan are forgotten."""
    run, steps = b.run, b.steps
    carried = {c.step: c for c in run.spec.carried_results or []}
    to_carry: list[m.Step] = []
    first_pass = not steps
    for step in run.spec.plan.steps:
        if step.name not in steps:
            steps[step.name] = m.StepStatus(
                name=step.name,
                phase=SP.PENDING,
                # What the step may use with its creator's rights (agentrun.core.frozen).
                frozen=freezing.step_digest(run, step) if first_pass else freezing.ADDED,
            )
            if step.name in carried:
                to_carry.append(step)
        elif steps[step.name].phase == SP.CANCELLED:
            # Only removal from the plan cancels a step of a run that goes on (every other
            # cancellation ends the run): the step is back, so it starts again.
            restart_readded(b, steps[step.name])
        if needs_approval(run, step):
            steps[step.name].gated = True  # and stays so: see StepStatus.gated
    carry_results(b, to_carry, carried)
    forget_removed_steps(b)


def _ended_by_cancel_or_deadline(b: Builder, budget: m.Budget) -> bool:
    """End the run when it is cancelled or past its deadline (True); else set the timer of
    the deadline, if any."""
    run, status = b.run, b.status
    assert status.started_at is not None  # set by reconcile before
    deadline = (
        status.started_at + timedelta(seconds=budget.max_wall_time_seconds)
        if budget.max_wall_time_seconds
        else None
    )
    if run.spec.cancel:
        abort(
            b,
            m.RunPhase.CANCELLED,
            "Cancelled",
            "cancelled: spec.cancel is true",
            _modified_by(run),
        )
        return True
    if deadline is not None and b.now >= deadline:
        abort(
            b,
            m.RunPhase.FAILED,
            "DeadlineExceeded",
            f"run deadline of {budget.max_wall_time_seconds}s (budget.maxWallTimeSeconds) passed",
        )
        return True
    b.timer(deadline)
    return False


def _stop_for_budget_or_failure(b: Builder, budget: m.Budget) -> None:
    """Launch nothing more when the token budget is used up (unless the agent pauses instead)
    or a plan step or model turn failed (a failed tool call is answered to the model)."""
    run, status, steps = b.run, b.status, b.steps
    usage = status.usage or m.Usage()
    status.usage = usage
    tokens_pause = agent_loop.pauses_for_tokens(run, status)  # the agent pauses instead
    if budget.max_tokens is not None and usage.tokens >= budget.max_tokens and not tokens_pause:
        b.stop(
            "BudgetExceeded",
            f"token budget of {budget.max_tokens} (budget.maxTokens) used up: {usage.tokens}",
        )
    failed = [
        s
        for s in all_steps(b)
        if steps[s.name].phase == SP.FAILED and not agent_loop.is_tool_step(status.agent, s.name)
    ]
    if failed:
        first = steps[failed[0].name]
        why = first.message or (first.error.message if first.error else None)
        b.stop(
            first.error.reason if first.error else "StepFailed",
            f"step {first.name} failed: {why or 'no message'}",
        )


def _modified_by(run: m.AgentRun) -> str | None:
    """The user who last changed the spec, as recorded at admission."""
    return (run.metadata.annotations or {}).get(m.ANNOTATION_MODIFIED_BY)


def _trim_history(
    history: list[m.Transition], audit: m.AuditStatus | None, limit: int
) -> list[m.Transition]:
    """The last ``limit`` transitions, plus older ones the audit record has not stored yet
    (so the ring never drops what is not recorded elsewhere), never more than the hard cap."""
    recorded = audit.recorded_seq if audit is not None else None
    keep_from = max(len(history) - limit, 0)
    if recorded is not None:
        unrecorded = [i for i, t in enumerate(history) if t.seq > recorded]
        if unrecorded:
            keep_from = min(keep_from, unrecorded[0])
    keep_from = max(keep_from, len(history) - m.MAX_HISTORY_HARD)
    return history[keep_from:]


def _dedupe(actions: Sequence[Action]) -> tuple[Action, ...]:
    """Each action once; a Job is deleted once, for the first reason found, and no pod of a
    Job being deleted is let start."""
    seen: list[Action] = []
    deleted: set[str] = set()
    going = {a.job_name for a in actions if isinstance(a, DeleteJob)}
    for action in actions:
        if isinstance(action, StartPod) and action.job_name in going:
            continue
        if isinstance(action, DeleteJob):
            if action.job_name in deleted:
                continue
            deleted.add(action.job_name)
        if action not in seen:
            seen.append(action)
    return tuple(seen)


def _finish(b: Builder) -> Decision:
    """The pass's decision: retention applied, the steps in plan order, progress, the audit
    record's mark, the history ring trimmed, and the soonest timer as ``requeue_after``."""
    apply_retention(b)
    status = b.status
    status.observed_generation = b.run.metadata.generation or None
    plan_names = [s.name for s in b.run.spec.plan.steps]
    in_plan = set(plan_names)
    ordered = [b.steps[n] for n in plan_names if n in b.steps]
    ordered += [st for n, st in b.steps.items() if n not in in_plan]
    status.steps = ordered or None
    done = sum(1 for n in plan_names if n in b.steps and b.steps[n].phase == SP.SUCCEEDED)
    status.progress = f"{done}/{len(plan_names)}"
    agent_loop.finish(b.run, status)
    if status.phase in m.TERMINAL_RUN_PHASES:
        status.current_step = None
    if b.observed.recorded_seq is not None:
        audit = status.audit or m.AuditStatus()
        audit.recorded_seq = max(audit.recorded_seq, b.observed.recorded_seq)
        audit.record = b.observed.record_name
        status.audit = audit
    history = [*(status.history or []), *b.transitions]
    if history:
        status.history = _trim_history(history, status.audit, b.config.history_limit)
    requeue = None
    if b.timers:
        soonest = min(b.timers)
        requeue = max(math.ceil((soonest - b.now).total_seconds()), 1)
    return Decision(
        status=status,
        before_commit=tuple(b.before),
        after_commit=_dedupe([*b.after, *b.later, *b.events]),
        requeue_after=float(requeue) if requeue is not None else None,
    )
