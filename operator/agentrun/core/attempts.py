"""Observing attempts: what the Job of a Launching or Running step says about its attempt.

The Job as observed decides: not seen yet (its create is issued again, see
:func:`.launch.reissue_create`), refused by the API server, lost or deleted, taken by someone
else's Job, its pod refused (a refusal that may pass is waited out for a while:
:func:`refusal_waits`), still running (Launching becomes Running; the step's timeout is
checked), succeeded (the result envelope parsed, the result kept inline or in a ConfigMap,
tokens counted) or failed. A failed attempt is retried after a backoff while ``retry.limit``
and ``budget.maxAttempts`` allow, and fails the step otherwise.

Imports :mod:`.builder` and :mod:`.launch`.
"""

from __future__ import annotations

from datetime import timedelta

from agentrun.api import models as m
from agentrun.api import names
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_budget, agent_loop, naming
from agentrun.core.actions import DeleteJob, EmitEvent, StartPod, StoreResult
from agentrun.core.backoff import backoff_seconds
from agentrun.core.builder import MESSAGE_LIMIT, REASON_LIMIT, Builder, floor_seconds, truncate
from agentrun.core.envelope import MAX_TOKENS, Envelope, parse, result_object_data
from agentrun.core.launch import reissue_create, runs_where
from agentrun.core.observed import JobState, ObservedJob
from agentrun.core.refusals import create_refusal_waits, refusal_waits

INLINE_RESULT_MAX = m.MAX_INLINE_RESULT
"""Results are kept inline only up to this many bytes, whatever the configured limit:
status.steps[].result's maxLength."""
EXIT_CODES = range(-(2**31), 2**31)
RESULT_TAMPERED = "ResultTampered"
"""Reason of an attempt whose result by reference, or an input by reference, is not the
content committed for it."""
RESULT_REF_REFUSED = "ResultRefRefused"
"""Reason of an attempt whose envelope references a ConfigMap that is not its own result."""


def observe_attempt(b: Builder, step: m.Step, st: m.StepStatus) -> None:
    """Move a Launching or Running step on from what its attempt's Job, as observed, says."""
    tampered = b.observed.tampered.get(st.job_name or "")
    if tampered is not None:  # its result or an input is not what was committed: never used
        _fail_closed(b, step, st, RESULT_TAMPERED, tampered)
        return
    job = b.observed.job(st.job_name or "")
    if job is None:
        refused = b.observed.job_refusals.get(st.job_name or "")
        if st.phase == SP.LAUNCHING and refused is not None:
            if create_refusal_waits(b, st, f"Job {st.job_name}", refused, "JobRefused"):
                reissue_create(b, step, st)
            else:
                _job_refused(b, step, st, refused)
        elif st.phase == SP.LAUNCHING and (st.job_name or "") not in b.observed.vanished:
            reissue_create(b, step, st)
        else:
            _attempt_failed(
                b,
                step,
                st,
                "JobLost",
                f"Job {st.job_name} of attempt {st.attempt} disappeared before it finished",
                None,
            )
        return
    if job.name_taken is not None:  # not the attempt's Job: it never ran the step
        _attempt_failed(b, step, st, "JobNameTaken", job.name_taken, None)
        return
    if job.state == JobState.ACTIVE and job.pod_refused is not None:
        note = (
            f"the API server refuses the pod of Job {job.name} for now (see the Job's "
            f"FailedCreate Events); the Job controller tries again"
        )
        if refusal_waits(b, st, job.pod_refused, note, "PodRefused"):
            _check_step_timeout(b, step, st, job)
            return
        b.after.append(DeleteJob(job.name, "PodRefused"))  # no pod may start later
        _attempt_failed(b, step, st, "PodRefused", job.pod_refused, None)
        return
    if job.state == JobState.ACTIVE and job.deleting:
        _attempt_failed(
            b,
            step,
            st,
            "JobLost",
            f"Job {job.name} of attempt {st.attempt} was deleted before it finished",
            None,
        )
        return
    if job.state == JobState.ACTIVE:
        if job.start_pod is not None:  # the attempt's one pod: the only one that ever runs
            b.after.append(StartPod(job.name, job.start_pod))
        if st.phase == SP.LAUNCHING:
            _note_running(b, st, job)
        _check_step_timeout(b, step, st, job)
        return
    code = job.exit_code
    exit_code = code if type(code) is int and code in EXIT_CODES else None  # an int32, or unknown
    if job.state == JobState.SUCCEEDED:
        envelope = parse(job.termination_message)
        if envelope.problem is not None:
            _attempt_failed(b, step, st, "InvalidEnvelope", envelope.problem, exit_code)
        elif envelope.ok:
            _attempt_succeeded(b, step, st, job, envelope)
        elif (tampered := reported_tampering(job.termination_message)) is not None:
            _fail_closed(b, step, st, RESULT_TAMPERED, tampered)
        else:
            _attempt_failed(
                b,
                step,
                st,
                "StepReportedFailure",
                envelope.summary or "the step reported ok: false",
                exit_code,
            )
        return
    tampered = reported_tampering(job.termination_message)
    if tampered is not None:  # the step's own pod found its result's name taken
        _fail_closed(b, step, st, RESULT_TAMPERED, tampered)
        return
    reason, message = _failure_of(job, exit_code)
    _attempt_failed(b, step, st, reason, message, exit_code)


def _note_running(b: Builder, st: m.StepStatus, job: ObservedJob) -> None:
    """Launching becomes Running once the step's command has run ``running_after_seconds``
    in the attempt's pod (a model turn: since its intent, its pod having waited for it); a
    command that ends sooner skips Running, however long its pod took to start (a status
    write fewer: most steps and model turns). A timer brings the pass that sees
    it. A pod's start wakes no pass, so while none runs the command yet, the next look comes
    when the Job has waited twice as long as now (at most a few looks, however slow the
    pod's start; Running shows at most that much late)."""
    after = b.config.running_after_seconds
    if job.running_since is None:
        started = job.started_at or st.attempt_started_at  # the Job's startTime, else the intent's
        since = min(floor_seconds(started), b.now) if started else b.now
        waited = (b.now - since).total_seconds()
        b.timer(since + timedelta(seconds=max(after, 2 * waited, 1)))
        return
    since = min(floor_seconds(job.running_since), b.now)
    if st.attempt_started_at is not None and agent_loop.is_model_turn(st.name):
        # A model turn's pod made ahead of its turn waits with its command running: the
        # turn runs from its intent (its request is sent once that is committed).
        since = max(since, min(floor_seconds(st.attempt_started_at), b.now))
    due = since + timedelta(seconds=after)
    if b.now >= due:
        b.move(st, SP.RUNNING, "Started", f"attempt {st.attempt} running {runs_where(b, st)}")
    else:
        b.timer(due)


def _job_refused(b: Builder, step: m.Step, st: m.StepStatus, message: str) -> None:
    """The API server refused the attempt's Job: the attempt failed, and the step's retry
    policy decides what follows (a spec the API rejects is rejected again, so retries end)."""
    attempt = st.attempt
    _attempt_failed(b, step, st, "JobRefused", message, None)
    if st.phase != SP.FAILED:  # a retry is scheduled: warn all the same, in the API's words
        text = f"step {step.name}: the Job of attempt {attempt} was refused: {message}"
        b.events.append(EmitEvent("Warning", "JobRefused", truncate(text)))


def _fail_closed(b: Builder, step: m.Step, st: m.StepStatus, reason: str, message: str) -> None:
    """The attempt failed for a reason its creator must hear of even when a retry follows."""
    attempt = st.attempt
    _attempt_failed(b, step, st, reason, message, None)
    text = f"step {step.name}, attempt {attempt}: {message}"
    b.events.append(EmitEvent("Warning", reason, truncate(text)))


def own_result_names(run: m.AgentRun, step: str, attempt: int) -> tuple[str, ...]:
    """The ConfigMaps a step's envelope may name as its result: the one the step runner
    writes for this attempt (the operator derives the name; no other object may be passed
    on, not even an earlier attempt's: nothing found is a replay of one)."""
    meta = run.metadata
    return (naming.result_object_name(meta.name, meta.uid, step, attempt),)


def result_ref_problem(run: m.AgentRun, step: str, attempt: int, env: Envelope) -> str | None:
    """Why the envelope's resultRef cannot be taken as the step's result; None when it names
    a result object of the step itself, with the digest of its content."""
    if env.result_ref is None:
        return None
    name, key = env.result_ref
    if name not in own_result_names(run, step, attempt) or key != "result":
        return (
            f"the result envelope names ConfigMap {name} (key {key}), which is not the "
            f"step's own result object; a step may only reference the result the step runner "
            f"stored for it (key result), so nothing was read or passed on"
        )
    if not env.result_digest:
        return (
            f"the result envelope names ConfigMap {name} without a resultDigest, so its "
            f"content cannot be verified where it is used; report the sha256 of the result"
        )
    return None


def reported_tampering(message: str | None) -> str | None:
    """What the attempt's own pod reported when it found its result object's name taken (its
    report, plain or the envelope's summary, begins ``ResultTampered:``); None otherwise. The
    report is the kubelet's record of the pod's termination message: a claim a step can only
    make about itself, failing its own attempt."""
    envelope = parse(message)
    text = envelope.summary if envelope.problem is None and envelope.summary else ""
    if not text and envelope.problem is None and envelope.result is not None:
        text = envelope.result
    prefix = f"{RESULT_TAMPERED}:"
    if not text.startswith(prefix):
        return None
    return text[len(prefix) :].strip() or "the attempt's result object was not its own"


def _failure_of(job: ObservedJob, exit_code: int | None) -> tuple[str, str]:
    if job.reason == "DeadlineExceeded":
        return "StepTimeout", "the attempt ran past timeoutSeconds"
    detail = (job.termination_message or job.message or "")[: 2 * MESSAGE_LIMIT].strip()
    turn_failure = model_turn_failure(job.step, detail)
    if turn_failure is not None:
        return turn_failure
    if exit_code is not None:
        text = f"exit code {exit_code}" + (f": {detail}" if detail else "")
        return "Error", text
    return job.reason or "Error", detail or "the Job failed"


def model_turn_failure(step: str, message: str) -> tuple[str, str] | None:
    """The reason and message of a failed model turn's attempt, from the one line its pod (or
    the run's executor) ended with: ``agentrun step llm`` begins it with the reason
    (``ModelUnreachable: the model endpoint ...``, one of :data:`names.TURN_FAILURES`). None
    for any other step, whose container may write anything, and for a line without one of
    those reasons (an older operator image's)."""
    if not agent_loop.is_model_turn(step):
        return None
    reason, colon, rest = message.partition(":")
    if not colon or reason not in names.TURN_FAILURES or not rest.strip():
        return None
    return reason, rest.strip()


def _check_step_timeout(b: Builder, step: m.Step, st: m.StepStatus, job: ObservedJob) -> None:
    if not step.timeout_seconds or st.attempt_started_at is None:
        return
    limit = st.attempt_started_at + timedelta(
        seconds=step.timeout_seconds + b.config.step_timeout_grace_seconds
    )
    if b.now >= limit:
        b.after.append(DeleteJob(job.name, "StepTimeout"))
        _attempt_failed(
            b,
            step,
            st,
            "StepTimeout",
            f"the attempt ran past timeoutSeconds ({step.timeout_seconds}s)",
            None,
        )
    else:
        b.timer(limit)


def _attempt_succeeded(
    b: Builder, step: m.Step, st: m.StepStatus, job: ObservedJob, env: Envelope
) -> None:
    refused = result_ref_problem(b.run, step.name, st.attempt, env)
    if refused is not None:
        _fail_closed(b, step, st, RESULT_REF_REFUSED, refused)
        return
    st.summary = env.summary
    st.result = None
    st.result_ref = None
    st.result_digest = None
    if env.result_ref is not None:
        st.result_ref = m.ResultRef(name=env.result_ref[0], key=env.result_ref[1])
        st.result_digest = env.result_digest
    elif env.result is not None:
        inline_limit = min(b.config.inline_result_limit, INLINE_RESULT_MAX)
        if len(env.result.encode()) <= inline_limit:
            st.result = env.result  # its digest is implied; status stays small
        else:
            st.result_digest = naming.sha256_text(env.result)
            name = naming.result_object_name(
                b.run.metadata.name, b.run.metadata.uid, step.name, st.attempt
            )
            data = result_object_data(env.result, fields=not agent_loop.is_model_turn(step.name))
            b.before.append(StoreResult(name, step.name, st.attempt, data))
            st.result_ref = m.ResultRef(name=name, key="result")
    tokens = env.tokens
    if tokens and agent_loop.is_model_turn(step.name):
        tokens = agent_budget.counted_tokens(b, step.name, tokens)  # never more than it could use
    if tokens:
        # Clamped: a sum past int64 would make every later status write fail validation.
        step_tokens = (st.usage.tokens if st.usage else 0) + tokens
        st.usage = m.StepUsage(tokens=min(step_tokens, MAX_TOKENS))
        usage = b.status.usage or m.Usage()
        usage.tokens = min(usage.tokens + tokens, MAX_TOKENS)
        b.status.usage = usage
    st.error = None
    # Never later than now: a finish time from the future would only postpone retention.
    st.finished_at = min(floor_seconds(job.finished_at), b.now) if job.finished_at else b.now
    st.next_attempt_at = None
    st.attempt_started_at = None
    b.move(st, SP.SUCCEEDED, "StepSucceeded", f"attempt {st.attempt} succeeded")


def _attempt_failed(
    b: Builder, step: m.Step, st: m.StepStatus, reason: str, message: str, exit_code: int | None
) -> None:
    st.error = m.StepError(
        reason=truncate(reason, REASON_LIMIT),
        message=truncate(message, 1024),
        exit_code=exit_code,
        at=b.now,
    )
    limit = step.retry.limit if step.retry else 0
    budget = b.run.spec.budget or m.Budget()
    usage = b.status.usage or m.Usage()
    retries_left = st.attempt <= limit
    attempts_left = budget.max_attempts is None or usage.attempts < budget.max_attempts
    if retries_left and attempts_left and not b.run.spec.cancel:
        delay = backoff_seconds(
            step.retry.backoff if step.retry else None,
            st.attempt,
            seed=b.config.jitter_seed,
            run_uid=b.run.metadata.uid,
            step=step.name,
        )
        st.next_attempt_at = b.now + timedelta(seconds=delay)
        b.move(
            st,
            SP.BACKING_OFF,
            "RetryScheduled",
            f"attempt {st.attempt} failed ({reason}: {truncate(message, 200)}); "
            f"attempt {st.attempt + 1} in {delay}s",
        )
        return
    st.finished_at = b.now
    st.next_attempt_at = None
    st.attempt_started_at = None
    why = f"{reason}: {truncate(message, 300)}"
    if retries_left and not attempts_left:
        why += f" (no retry: budget.maxAttempts {budget.max_attempts} reached)"
        st.error.reason = "BudgetExceeded"
    elif limit:
        why += f" (after {st.attempt} attempts)"
    b.move(st, SP.FAILED, st.error.reason, why)
