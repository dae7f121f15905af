"""Launching: which ready steps start, and the committed intent that starts each.

A step is ready once its dependencies succeeded and its backoff passed. It may then fail
before any Job of it exists (image not allowed, its creator forbidden, an input missing,
arguments that cannot be hashed), wait for an approval of its args hash, or be refused
(rejected, or the approval expired: skipped or failed as ``onRejection`` says); the step and
attempt budgets are checked last. A launch is an intent committed in status (attempt number,
Job name, idempotency key) with a :class:`CreateJob` to run once it is committed.
:func:`reissue_create` creates the Job of a committed intent again while the spec still gives
its args hash, and :func:`committed_launch` tells the shell what the Job of a committed attempt
must be.

Imports :mod:`.builder` and :mod:`.arguments`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_launch, agent_loop, children, executor, naming
from agentrun.core import frozen as freezing
from agentrun.core.actions import Action, CreateJob
from agentrun.core.arguments import (
    UNHASHABLE,
    args_hash,
    decision_for,
    needs_approval,
    resolve_inputs,
)
from agentrun.core.builder import Builder, CoreConfig, all_steps, truncate
from agentrun.core.observed import Observed


def launch_ready_steps(b: Builder, budget: m.Budget) -> None:
    """Start the ready steps of the plan and of the current turn, in order; one that stops
    the run (a failure before launch, a refusal, a budget reached) ends the loop."""
    steps = b.steps
    usage = b.status.usage or m.Usage()
    b.status.usage = usage
    for step in all_steps(b):
        st = steps[step.name]
        if st.phase not in (SP.PENDING, SP.WAITING_FOR_APPROVAL, SP.BACKING_OFF):
            continue
        if _waits_for_dependencies(steps, step):
            continue  # most of a long plan's steps, on most passes: told before anything else
        if not agent_loop.committed(b.run, step.name) and not agent_loop.rights_confirmed(b, step):
            continue  # a new step of the loop starts once committed (and checked by the shell)
        skipped = [d for d in step.depends_on or [] if steps[d].phase == SP.SKIPPED]
        if skipped:
            st.finished_at = b.now
            b.move(st, SP.SKIPPED, "DependencySkipped", f"{', '.join(skipped)} was skipped")
            continue
        if st.phase == SP.BACKING_OFF and st.next_attempt_at and b.now < st.next_attempt_at:
            b.timer(st.next_attempt_at)
            continue
        exempt = agent_loop.image_exempt(b.status.agent, step.name, b.run.spec.agent)
        if not exempt and not _image_allowed(b.run, step):
            image = step.container.image
            message = f"image {image} is not allowed by policy.allowedImages"
            _fail_before_launch(b, step, st, "ImageNotAllowed", message)
            return
        lent = freezing.step_refusal(b.run, step, st.frozen)
        if lent is not None:  # an editor's step would use the creator's rights
            st.next_attempt_at = None
            st.approval_requested_at = None
            _fail_before_launch(b, step, st, "Forbidden", lent)
            return
        refusal = b.observed.refusals.get(step.name)
        if refusal is not None:  # the creator may not have it run: fail before any Job
            st.next_attempt_at = None
            st.approval_requested_at = None
            _fail_before_launch(b, step, st, "Forbidden", refusal)
            return
        if executor.awaits(b, step, b.config.agent):
            continue  # a model turn or a discovery waits for the run's executor while it starts
        resolved = resolve_inputs(b, step)
        if isinstance(resolved, str):
            _fail_before_launch(b, step, st, "InputMissing", resolved)
            return
        input_env, input_digests = resolved
        # Recomputed for every attempt: a retry whose arguments, ServiceAccount or any other
        # covered field changed since the last attempt gets a new hash, so a gated step needs
        # a new approval (and the attempt a new idempotency key).
        h = args_hash(b.run, step, input_digests)
        if h is None:
            _fail_before_launch(b, step, st, "InvalidStep", UNHASHABLE)
            return
        if st.args_hash is not None and st.args_hash != h:
            b.record(
                step.name,
                st.phase,
                st.phase,
                "ArgsChanged",
                f"step {step.name}: arguments changed (args {st.args_hash[:12]} -> {h[:12]})",
            )
        st.args_hash = h
        decision = None
        if needs_approval(b.run, step) or st.gated:
            st.gated = True  # once gated, gated for the run's life (see StepStatus.gated)
            decision = decision_for(b.run, step.name, h)
            if decision is None:
                if _wait_for_approval(b, step, st, h):
                    continue
                return
            st.decided_by = decision.by
            if decision.decision == m.ApprovalDecision.REJECT:
                text = f"rejected by {decision.by}" + (
                    f": {decision.reason}" if decision.reason else ""
                )
                if _refuse(b, step, st, "Rejected", text, decision.by):
                    continue
                return
        first = st.attempt == 0
        if first and budget.max_steps is not None and usage.steps >= budget.max_steps:
            b.stop(
                "BudgetExceeded",
                f"step budget of {budget.max_steps} (budget.maxSteps) reached; "
                f"step {step.name} not started",
            )
            return
        if budget.max_attempts is not None and usage.attempts >= budget.max_attempts:
            b.stop(
                "BudgetExceeded",
                f"attempt budget of {budget.max_attempts} (budget.maxAttempts) reached; "
                f"step {step.name} not started",
            )
            return
        if _earlier_attempt_running(b, step.name):
            continue  # an earlier attempt's pod is still stopping: attempts never overlap
        if _name_held(b, step.name, st.attempt + 1):
            continue  # a Job made ahead that ended before its turn holds the name, going
        _commit_launch_intent(b, step, st, h, input_env, first, decision)


def _waits_for_dependencies(steps: dict[str, m.StepStatus], step: m.Step) -> bool:
    """Whether ``step`` waits for a dependency to succeed, none of them skipped (a skipped one
    skips it instead)."""
    phases = [st.phase if (st := steps.get(d)) else None for d in step.depends_on or []]
    return SP.SKIPPED not in phases and any(p != SP.SUCCEEDED for p in phases)


def _earlier_attempt_running(b: Builder, step_name: str) -> bool:
    """Whether a pod of a Job of the step (verified, or a stray) has not terminated yet: of
    an earlier attempt, since the step is not in flight."""
    names = {j.name for j in b.observed.jobs if j.step == step_name}
    names |= {j.name for j in b.observed.strays if j.step == step_name}
    return not names.isdisjoint(b.observed.running)


def _name_held(b: Builder, step_name: str, attempt: int) -> bool:
    """Whether the Job name of the step's next attempt is held by a Job no attempt accounts
    for (a model turn's made ahead that ended before its turn): the attempt waits until it is
    gone, so its create never meets it (:func:`agentrun.core.agent_launch.clear_name`)."""
    name = naming.job_name(b.run.metadata.name, b.run.metadata.uid, step_name, attempt)
    return agent_launch.clear_name(b, name)


def _fail_before_launch(
    b: Builder, step: m.Step, st: m.StepStatus, reason: str, message: str
) -> None:
    """The step cannot be launched (its image, its creator's rights, its inputs or its
    arguments forbid it): it fails before any Job of it exists, and the run stops."""
    st.finished_at = b.now
    st.error = m.StepError(reason=reason, message=truncate(message, 1024), at=b.now)
    b.move(st, SP.FAILED, reason, message)
    b.stop(reason, f"step {step.name}: {message}")


def _wait_for_approval(b: Builder, step: m.Step, st: m.StepStatus, h: str) -> bool:
    """Wait (or expire). Returns whether the launch loop may go on with other steps."""
    if st.phase != SP.WAITING_FOR_APPROVAL or st.approval_requested_at is None:
        st.approval_requested_at = b.now
    st.decided_by = None
    timeout = b.run.spec.policy.approval_timeout_seconds if b.run.spec.policy else None
    if timeout is not None:
        expires = st.approval_requested_at + timedelta(seconds=timeout)
        if b.now >= expires:
            return _refuse(
                b,
                step,
                st,
                "ApprovalExpired",
                f"no decision on args {h[:12]} within {timeout}s (policy.approvalTimeoutSeconds)",
                None,
            )
        b.timer(expires)
    b.move(
        st,
        SP.WAITING_FOR_APPROVAL,
        "ApprovalRequested",
        f"waiting for approval of args {h[:12]} (risk {step.risk})",
    )
    return True


def _refuse(
    b: Builder, step: m.Step, st: m.StepStatus, reason: str, text: str, by: str | None
) -> bool:
    """A gated step is refused (rejected or expired): skip it or fail the run, as the step
    says. Returns whether the launch loop may go on with other steps."""
    st.finished_at = b.now
    st.approval_requested_at = None
    st.error = m.StepError(reason=reason, message=truncate(text, 1024), at=b.now)
    if step.on_rejection == m.OnRejection.SKIP_STEP:
        b.move(st, SP.SKIPPED, reason, f"{text}; skipped (onRejection: skipStep)", by)
        return True
    b.move(st, SP.FAILED, reason, text, by)
    b.stop(reason, f"step {step.name} {text}")
    return False


def runs_where(b: Builder, st: m.StepStatus) -> str:
    """Where the step's current attempt runs, for the history: on the run's executor when it
    is bound to the executor's pod (a model turn, an MCP call or discovery: its Job name is
    only the attempt's name, no such Job is made), else as its own Job."""
    executor = b.status.agent.executor if b.status.agent is not None else None
    if st.executor_pod is not None and executor is not None:
        return f"on the run's executor {executor.job_name} (pod {st.executor_pod})"
    return f"as Job {st.job_name}"


def _commit_launch_intent(
    b: Builder,
    step: m.Step,
    st: m.StepStatus,
    h: str,
    input_env: tuple[m.EnvVar, ...],
    first: bool,
    approval: m.Approval | None,
) -> None:
    usage = b.status.usage or m.Usage()
    st.attempt += 1
    usage.attempts += 1
    if first:
        usage.steps += 1
        st.started_at = b.now
    st.job_name = naming.job_name(b.run.metadata.name, b.run.metadata.uid, step.name, st.attempt)
    st.idempotency_key = agent_loop.idempotency_key(
        b.run, b.status.agent, step.name, h
    ) or naming.idempotency_key(b.run.metadata.uid, step.name, step.container.image, h)
    create_child = children.launch(b, st) if children.is_child_step(b, step.name) else None
    st.attempt_started_at = b.now
    st.next_attempt_at = None
    st.approval_requested_at = None
    approved = ""
    if approval is not None and first:
        approved = f" (approved by {approval.by}" + (
            f": {approval.reason})" if approval.reason else ")"
        )
    actions: list[Action] = []
    if create_child is not None:
        actions.append(create_child)
        where = f"as child AgentRun {st.job_name}"
    else:
        create = CreateJob(step, st.attempt, st.job_name, st.idempotency_key, h, input_env)
        actions.extend(agent_launch.launch_actions(b, st, create, b.config.agent))
        where = runs_where(b, st)
    b.move(
        st,
        SP.LAUNCHING,
        "Launching",
        f"attempt {st.attempt} launching {where}{approved}",
        approval.by if approval is not None and first else None,
    )
    b.after.extend(actions)


def reissue_create(b: Builder, step: m.Step, st: m.StepStatus) -> None:
    """Re-issue the create of a committed intent whose Job is not observed (yet).

    The Job is built from the spec as read now, so it is created only while that spec still
    gives the committed args hash: an intent whose step changed in between (new arguments, a
    new ServiceAccount) is dropped, and the step starts again from the launch path, which
    asks for a new approval when the step is gated. Its next attempt gets a new Job name, so
    the dropped Job, should a stalled operator still create it, is not taken for it.
    """
    resolved = resolve_inputs(b, step)
    if isinstance(resolved, str):
        why = resolved
    else:
        input_env, input_digests = resolved
        h = args_hash(b.run, step, input_digests)
        if h is not None and h == st.args_hash:
            key = st.idempotency_key or ""
            b.after.append(CreateJob(step, st.attempt, st.job_name or "", key, h, input_env))
            return
        why = f"args {h[:12]}" if h is not None else UNHASHABLE
    st.attempt_started_at = None
    b.move(
        st,
        SP.PENDING,
        "IntentDropped",
        f"the step changed before the Job of attempt {st.attempt} was created "
        f"(committed args {(st.args_hash or '')[:12]}, now {why}); it starts again",
    )


def committed_launch(run: m.AgentRun, step_name: str) -> CreateJob | None:
    """The Job create of the step's last committed attempt, as :func:`reconcile` issues it:
    what a Job holding that attempt's name must be to count as the attempt's (the shell
    compares the two). None when the step has no committed attempt, or when the spec as read
    no longer gives the committed args hash (the step changed since)."""
    status = run.status or m.AgentRunStatus()
    steps = {s.name: s for s in status.steps or []}
    st = steps.get(step_name)
    step = next((s for s in run.spec.plan.steps if s.name == step_name), None)
    if step is None:  # a step of an agent run's current turn, from the committed status
        loop_steps = agent_loop.dynamic_steps(run, steps, agent_loop.AgentConfig())
        step = next((s for s in loop_steps if s.name == step_name), None)
    if st is None or step is None or not st.job_name or not st.args_hash:
        return None
    # Only the steps are read (inputs come from committed results); no clock is involved.
    b = Builder(run, Observed(), datetime.fromtimestamp(0, UTC), CoreConfig(), status, steps)
    resolved = resolve_inputs(b, step)
    if isinstance(resolved, str):
        return None
    input_env, input_digests = resolved
    if args_hash(run, step, input_digests) != st.args_hash:
        return None
    key = st.idempotency_key or ""
    return CreateJob(step, st.attempt, st.job_name, key, st.args_hash, input_env)


def _image_allowed(run: m.AgentRun, step: m.Step) -> bool:
    allowed = run.spec.policy.allowed_images if run.spec.policy else None
    return allowed is None or any(step.container.image.startswith(p) for p in allowed)
