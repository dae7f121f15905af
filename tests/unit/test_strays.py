"""Jobs that lost their step: a step removed from the plan (or changed since its launch), or an
attempt a later one superseded. No committed intent describes such a Job, so adoption cannot
verify it and its outcome is never read; but its pod must stop, its finalizer must be released
once no stalled create can need it (the deletion grace), and the step's next attempt must not
start while that pod still runs."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import (
    CoreConfig,
    CreateJob,
    DeleteJob,
    JobState,
    Observed,
    ReleaseJob,
    StrayJob,
    reconcile,
)
from agentrun.execution import jobs, proof
from agentrun.loop.reconciler import Apis, Reconciler
from agentrun.observation.view import JOBS, PODS, ClusterView, Source
from tests.support.sim import UID, Sim, make_run, step

SP = m.StepPhase
GRACE = CoreConfig().job_deletion_grace_seconds


def _two_running() -> tuple[Sim, str]:
    """A run whose steps a and b both run; b's Job name."""
    sim = Sim(make_run([step("a"), step("b")]))
    sim.tick()
    b_job = sim.step_status("b").job_name
    assert b_job is not None and sim.step_status("b").phase == SP.LAUNCHING
    return sim, b_job


def _without_b(sim: Sim) -> None:
    plan = sim.run.spec.plan
    assert plan is not None
    sim.spec_update(plan=plan.model_copy(update={"steps": plan.steps[:1]}))


def _seen_as_stray(sim: Sim, name: str, running: bool = False, **fields: Any) -> Observed:
    """What the shell observes once Job ``name`` lost its step: not among the verified Jobs, a
    stray (see agentrun.loop.observe.Observer._strays), its pod ``running`` or not."""
    job = sim.jobs.pop(name)
    sim.creations.pop(name, None)
    stray = StrayJob(
        name=name,
        step=job.step,
        attempt=job.attempt,
        state=job.state,
        deleting=job.deleting,
        deleted_at=job.deleted_at,
    )
    return dataclasses.replace(
        Sim.observed(sim),
        strays=(dataclasses.replace(stray, **fields),),
        running=frozenset({name} if running else ()),
    )


def test_a_removed_running_step_is_stopped_and_its_job_released_after_the_grace() -> None:
    sim, b_job = _two_running()
    _without_b(sim)
    decision = sim.tick()
    assert DeleteJob(b_job, "RemovedFromPlan") in decision.after_commit
    assert sim.step_status("b").phase == SP.CANCELLED
    observed = _seen_as_stray(sim, b_job, running=True)

    held = reconcile(sim.run, observed, sim.now + timedelta(seconds=1), sim.config)
    assert not any(isinstance(a, DeleteJob) and a.release for a in held.after_commit)
    assert held.requeue_after is not None and held.requeue_after <= GRACE

    due = reconcile(sim.run, observed, sim.now + timedelta(seconds=GRACE), sim.config)
    assert DeleteJob(b_job, "Deleted", release=True) in due.after_commit


def test_a_stray_still_running_and_not_deleted_is_deleted() -> None:
    """Its step lost it before the operator deleted it (a crash between the commit and the
    delete, another operator): deleted now, its finalizer kept for the grace."""
    sim, b_job = _two_running()
    _without_b(sim)
    sim.tick()
    sim.jobs[b_job].deleting, sim.jobs[b_job].deleted_at = False, None  # the delete was lost
    observed = _seen_as_stray(sim, b_job, running=True)
    decision = reconcile(sim.run, observed, sim.now, sim.config)
    assert DeleteJob(b_job, "NotCurrentAttempt") in decision.after_commit
    assert not any(isinstance(a, DeleteJob) and a.release for a in decision.after_commit)


@pytest.mark.parametrize(
    ("keep", "state", "released"),
    [
        (m.KeepJobs.NONE, JobState.SUCCEEDED, True),
        (m.KeepJobs.NONE, JobState.FAILED, True),
        (m.KeepJobs.FAILED, JobState.SUCCEEDED, True),
        (m.KeepJobs.FAILED, JobState.FAILED, False),
        (m.KeepJobs.ALL, JobState.SUCCEEDED, False),
    ],
)
def test_a_finished_stray_goes_to_the_ttl_controller_unless_retention_keeps_it(
    keep: m.KeepJobs, state: JobState, released: bool
) -> None:
    sim = Sim(make_run([step("a"), step("b")], retention={"keepJobs": keep.value}))
    sim.tick()
    b_job = sim.step_status("b").job_name
    assert b_job is not None
    _without_b(sim)
    sim.tick()
    sim.jobs[b_job].deleting, sim.jobs[b_job].deleted_at = False, None
    observed = _seen_as_stray(sim, b_job, state=state)
    decision = reconcile(sim.run, observed, sim.now, sim.config)
    assert (ReleaseJob(b_job, GRACE) in decision.after_commit) is released
    assert not any(isinstance(a, DeleteJob) for a in decision.after_commit)


def test_a_step_added_back_waits_until_its_earlier_attempts_pod_stopped() -> None:
    sim, b_job = _two_running()
    plan = sim.run.spec.plan
    assert plan is not None
    _without_b(sim)
    sim.tick()
    sim.spec_update(plan=plan)  # b is back
    stopping = _seen_as_stray(sim, b_job, running=True)
    sim.observed = lambda: stopping  # type: ignore[method-assign]
    decision = sim.tick()
    assert sim.step_status("b").phase == SP.PENDING
    assert not any(isinstance(a, CreateJob) for a in decision.after_commit), "overlap"

    stopped = dataclasses.replace(stopping, running=frozenset())
    sim.observed = lambda: stopped  # type: ignore[method-assign]
    decision = sim.tick()
    (create,) = [a for a in decision.after_commit if isinstance(a, CreateJob)]
    assert create.step.name == "b" and create.attempt == 2 and create.job_name != b_job


def test_a_retry_waits_until_the_pod_of_the_attempt_it_replaces_stopped() -> None:
    """The Job of a timed-out attempt, verified and deleting: its pod is killed, and the
    next attempt starts once it has stopped."""
    retry = {"limit": 1, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
    sim = Sim(make_run([step("slow", retry=retry, timeoutSeconds=10)]))
    sim.tick()
    first = sim.step_status("slow").job_name
    assert first is not None
    for _ in range(40):  # Running, then past timeoutSeconds and its grace
        sim.advance(1)
        sim.tick()
        if sim.step_status("slow").phase == SP.BACKING_OFF:
            break
    slow = sim.step_status("slow")
    assert slow.error is not None and slow.error.reason == "StepTimeout", slow
    assert slow.phase == SP.BACKING_OFF and sim.jobs[first].deleting, slow
    sim.advance(5)  # the backoff is over
    stopping = dataclasses.replace(Sim.observed(sim), running=frozenset({first}))
    decision = reconcile(sim.run, stopping, sim.now, sim.config)
    assert not any(isinstance(a, CreateJob) for a in decision.after_commit), "overlap"
    decision = reconcile(sim.run, Sim.observed(sim), sim.now, sim.config)
    assert any(isinstance(a, CreateJob) and a.attempt == 2 for a in decision.after_commit)


# -- the shell: which Jobs are strays, and how a Job is deleted ------------------------------


def _job(run: m.AgentRun, step_name: str, attempt: int, **meta: Any) -> dict[str, Any]:
    sim = Sim(run)
    decision = sim.tick()
    create = next(
        a for a in decision.after_commit if isinstance(a, CreateJob) and a.step.name == step_name
    )
    job = jobs.build_job(run, dataclasses.replace(create, attempt=attempt))
    job["metadata"]["name"] = f"{create.job_name}-{attempt}"
    job["metadata"]["labels"][s.LABEL_ATTEMPT] = str(attempt)
    job["metadata"].update(uid=f"job-{step_name}-{attempt}", **meta)
    proof.sign(bytes(32), run.metadata.uid, step_name, attempt, job)  # as the operator made it
    return job


def _pod(job: dict[str, Any], phase: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job['metadata']['name']}-pod",
            "namespace": "default",
            "uid": f"pod-{job['metadata']['uid']}",
            "labels": {s.LABEL_RUN_UID: UID},
            "ownerReferences": [
                {"controller": True, "uid": job["metadata"]["uid"], "kind": "Job", "name": "j"}
            ],
        },
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),  # the Job's own pod
        "status": {"phase": phase},
    }


def test_the_observer_finds_the_held_jobs_no_intent_accounts_for() -> None:
    sim, _ = _two_running()
    run = sim.run
    in_flight = _job(run, "a", 1)
    in_flight["metadata"]["name"] = sim.step_status("a").job_name
    deleting = _job(run, "b", 1, deletionTimestamp="2026-01-01T00:00:00Z")
    stopped = _job(run, "b", 2)
    released = _job(run, "b", 3)
    released["metadata"]["finalizers"] = []
    # Someone else's copy of an attempt's Job, unsigned: never the operator's to delete.
    copied = _job(run, "b", 4)
    del copied["metadata"]["annotations"][s.ANNOTATION_PROOF]
    view = ClusterView()
    view.replace(Source(JOBS, None), [in_flight, deleting, stopped, released, copied])
    view.replace(Source(PODS, None), [_pod(deleting, "Running"), _pod(stopped, "Failed")])
    apis = Apis(core=mock.Mock(), batch=mock.Mock(), custom=mock.Mock())
    rec = Reconciler(apis, s.Settings(namespaces=("default",)), view=view)

    found = rec.observer._strays(run, ())
    strays = {j.name: j for j in found}

    assert set(strays) == {deleting["metadata"]["name"], stopped["metadata"]["name"]}
    first = strays[deleting["metadata"]["name"]]
    assert first.deleting and first.deleted_at is not None
    assert first.step == "b" and first.attempt == 1
    running = rec.observer._running(UID, set(strays))
    assert running == {deleting["metadata"]["name"]}, running


def test_the_operator_deletes_a_job_pods_first() -> None:
    """Background propagation deletes a Job's pods only once the Job is gone, which the
    operator's finalizer delays for the grace: its pod would run on."""
    sim, b_job = _two_running()
    batch = mock.Mock()
    apis = Apis(core=mock.Mock(), batch=batch, custom=mock.Mock())
    rec = Reconciler(apis, s.Settings(namespaces=("default",)), view=ClusterView())
    with mock.patch.object(rec.actor.adoption, "deletable", return_value="uid-b"):
        rec.actor.act(sim.run, (DeleteJob(b_job, "RemovedFromPlan"),))
    body = copy.deepcopy(batch.delete_namespaced_job.call_args.kwargs["body"])
    assert body == {"propagationPolicy": "Foreground", "preconditions": {"uid": "uid-b"}}
    batch.patch_namespaced_job.assert_not_called()  # the finalizer stays for the grace
