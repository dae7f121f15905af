"""The shell's view of a run's executor (agentrun.loop.observe): the executor Job status names
is observed apart from the attempts and strays, and the attempts bound to its pod are observed
as Jobs from what the executor answered, or as lost once the pod is gone."""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

from agentrun import settings as s
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import CreateJob, JobState, PrepareExecutor, turns
from agentrun.core import executor as ex
from agentrun.execution import jobs, proof
from agentrun.loop.reconciler import Apis, Reconciler
from agentrun.observation.view import JOBS, PODS, ClusterView, Source
from tests.support.agent_sim import agent_run, call
from tests.support.executor_sim import ExecutorSim


def _bound_run() -> tuple[ExecutorSim, PrepareExecutor]:
    """A run whose turn 2 was sent to its executor (generation 1)."""
    sim = ExecutorSim(agent_run())
    prepare: list[PrepareExecutor] = []
    original = sim.apply

    def apply(action: object) -> None:
        if isinstance(action, PrepareExecutor):
            prepare.append(action)
        original(action)

    sim.apply = apply  # type: ignore[method-assign]
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    assert sim.step_status("t2-model").executor_pod == "executor-pod-1"
    return sim, prepare[0]


def _executor_objects(run: m.AgentRun, prepare: PrepareExecutor) -> tuple[dict[str, Any], ...]:
    intent = CreateJob(prepare.step, prepare.generation, prepare.job_name, "", "")
    job = jobs.step_job(run, intent, bytes(32))
    proof.sign(bytes(32), run.metadata.uid, prepare.step.name, prepare.generation, job)
    job["metadata"]["uid"] = "executor-job-uid"
    pod = {
        "metadata": {
            "name": f"{prepare.job_name}-pod",
            "namespace": "default",
            "uid": "executor-pod-1",
            "labels": dict(job["spec"]["template"]["metadata"]["labels"]),
            "ownerReferences": [
                {"controller": True, "uid": "executor-job-uid", "kind": "Job", "name": "j"}
            ],
        },
        "spec": {**copy.deepcopy(job["spec"]["template"]["spec"]), "schedulingGates": []},
        "status": {"phase": "Running", "podIP": "10.0.0.9"},
    }
    return job, pod


def _observer(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> Reconciler:
    view = ClusterView()
    view.replace(Source(JOBS, None), [job] if job is not None else [])
    view.replace(Source(PODS, None), pods)
    apis = Apis(core=mock.Mock(), batch=mock.Mock(), custom=mock.Mock())
    rec = Reconciler(apis, s.Settings(namespaces=("default",)), view=view)
    # Not the key the fixtures are signed with: an executor it did not make is not verified
    # (and no dry run is made) unless a test says so (_verifying).
    rec.observer.adoption.key = lambda: bytes([7]) * 32
    return rec


def _verifying(rec: Reconciler, key: bytes, stored: dict[str, Any]) -> mock.Mock:
    """Give ``rec`` the key ``key`` and a dry-run create that stores ``stored``'s spec."""
    rec.observer.adoption.key = lambda: key

    def dry_run(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        return {**manifest, "spec": copy.deepcopy(stored["spec"])}

    made = rec.observer.adoption.dry_run = mock.Mock(side_effect=dry_run)
    return made


def test_an_executor_another_process_made_is_trusted_once_verified() -> None:
    """After a restart the executor status names is the operator's when it carries the proof
    of the operator's key and its spec is the one the operator creates for it (a dry run), as
    an attempt's Job is: turns go on to it (not replaced, its pod not let start again)."""
    sim, prepare = _bound_run()
    job, pod = _executor_objects(sim.run, prepare)
    rec = _observer(job, [pod])
    made = _verifying(rec, bytes(32), job)
    observed = rec.observer._observe(sim.run)
    assert observed.executor is not None and observed.executor.trusted
    assert observed.executor.job.pod_uid == "executor-pod-1"
    assert observed.executor.job.start_pod is None, "its pod started: no other is let start"
    rec.observer._observe(sim.run)
    assert made.call_count == 1, "kept by the Job's uid and generation"
    # Signed with another key (say a Job someone made and signed with a key of their own).
    rec = _observer(job, [pod])
    _verifying(rec, bytes([7]) * 32, job)
    observed = rec.observer._observe(sim.run)
    assert observed.executor is not None and not observed.executor.trusted
    # Signed, but its spec is not what the operator makes for it now (another turns' image).
    rec = _observer(job, [pod])
    other = copy.deepcopy(job)
    other["spec"]["template"]["spec"]["containers"][0]["image"] = "elsewhere/agentrun:1"
    _verifying(rec, bytes(32), other)
    observed = rec.observer._observe(sim.run)
    assert observed.executor is not None and not observed.executor.trusted


def test_the_executor_is_observed_and_its_attempt_runs_while_its_pod_does() -> None:
    sim, prepare = _bound_run()
    job, pod = _executor_objects(sim.run, prepare)
    rec = _observer(job, [pod])
    read = rec.observer.adoption.read_job = mock.Mock(return_value=None)
    observed = rec.observer._observe(sim.run)
    assert observed.executor is not None and not observed.executor.trusted
    assert observed.executor.job.name == prepare.job_name
    assert observed.executor.job.pod_uid == "executor-pod-1"
    assert prepare.job_name not in {j.name for j in observed.jobs}
    assert prepare.job_name not in {j.name for j in observed.strays}
    st = sim.step_status("t2-model")
    (bound,) = [j for j in observed.jobs if j.name == st.job_name]
    assert (bound.state, bound.address) == (JobState.ACTIVE, "10.0.0.9")
    # Its answer, once it came: the attempt as a Job that ended with that message.
    rec.observer.note_answer(sim.run.metadata.uid, st.job_name or "", 0, '{"ok":true}')
    (answered,) = [j for j in rec.observer._observe(sim.run).jobs if j.name == st.job_name]
    assert (answered.state, answered.termination_message) == (JobState.SUCCEEDED, '{"ok":true}')
    # No Job is read for it: it has none.
    assert st.job_name not in [c.args[1] for c in read.call_args_list]


def test_an_attempt_whose_executor_pod_went_is_observed_as_lost() -> None:
    sim, prepare = _bound_run()
    job, _pod = _executor_objects(sim.run, prepare)
    observed = _observer(job, []).observer._observe(sim.run)
    st = sim.step_status("t2-model")
    (lost,) = [j for j in observed.jobs if j.name == st.job_name]
    assert (lost.state, lost.reason) == (JobState.FAILED, ex.LOST)


def test_an_executor_no_longer_named_or_of_a_run_that_ended_is_a_stray() -> None:
    sim, prepare = _bound_run()
    job, pod = _executor_objects(sim.run, prepare)
    ended = sim.run.model_copy(deep=True)
    assert ended.status is not None and ended.status.agent is not None
    ended.status.agent.stage = agent_status.AgentStage.ANSWERED
    ended.status.steps = []
    assert turns.executor_wanted(ended) is None
    observed = _observer(job, [pod]).observer._observe(ended)
    assert observed.executor is None
    assert [j.name for j in observed.strays] == [prepare.job_name]
    # And one whose name status no longer gives (a later generation is named).
    renamed = sim.run.model_copy(deep=True)
    assert renamed.status is not None and renamed.status.agent is not None
    renamed.status.agent.executor = agent_status.ExecutorStatus(generation=2, job_name="another")
    renamed.status.steps = []
    observed = _observer(job, [pod]).observer._observe(renamed)
    assert observed.executor is None
    assert [j.name for j in observed.strays] == [prepare.job_name]
