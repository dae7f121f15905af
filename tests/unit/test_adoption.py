"""Which Jobs count as a step attempt's (agentrun.observation.adoption): the two checks
(controller, spec),
each way of failing them, the verdict cache, the pods that count, and what the core does with
a Job that holds an attempt's name but is not its Job, or whose pod the API refused."""

from __future__ import annotations

import copy
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import (
    CoreConfig,
    CreateJob,
    DeleteJob,
    EmitEvent,
    JobState,
    Observed,
    ObservedJob,
    reconcile,
)
from agentrun.core.machine import committed_launch
from agentrun.core.refusals import refusal_may_pass
from agentrun.execution import jobs, proof
from agentrun.observation import adoption
from agentrun.observation.view import JOBS, PODS, ClusterView
from tests.support.sim import T0, UID, Sim, make_run, step


def launched(*steps: dict[str, Any]) -> m.AgentRun:
    """A run whose first step's attempt 1 is committed (Launching), as the operator leaves it."""
    sim = Sim(make_run(list(steps) or [step("a")]))
    sim.decide()
    decision, version = sim.decide()
    assert sim.commit(decision, version)
    st = sim.step_status("a")
    assert st.phase == m.StepPhase.LAUNCHING and st.job_name
    return sim.run


def stored(manifest: dict[str, Any], name: str, uid: str, generation: int = 1) -> dict[str, Any]:
    """``manifest`` as the API server stores it: named, with a uid, defaulted, the selector
    and the derived pod template labels set."""
    job = copy.deepcopy(manifest)
    meta = job["metadata"]
    meta.pop("generateName", None)
    meta.update(name=name, uid=uid, generation=generation, resourceVersion="1")
    spec = job["spec"]
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("suspend", False)
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = spec["template"]["metadata"]["labels"]
    labels.update(
        {
            "controller-uid": uid,
            "batch.kubernetes.io/controller-uid": uid,
            "job-name": name,
            "batch.kubernetes.io/job-name": name,
        }
    )
    spec["template"]["spec"].setdefault("dnsPolicy", "ClusterFirst")
    return job


class FakeApi:
    """The dry run, the direct reads and the reports, recorded."""

    def __init__(self) -> None:
        self.dry_runs: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.reads: list[str] = []
        self.pods: list[dict[str, Any]] = []
        self.reports: list[str] = []

    def dry_run(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        self.dry_runs.append(manifest)
        return stored(manifest, manifest["metadata"]["generateName"] + "x7k2p", "dry-run-uid")

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(name)
        return self.stored.get(name)

    def list_pods(self, namespace: str, run_uid: str) -> list[dict[str, Any]]:
        return self.pods

    def report(self, run: m.AgentRun, reason: str, message: str) -> None:
        self.reports.append(message)


KEY = bytes(range(32))
"""The operator's key of step Jobs' proofs."""


def adopter(view: ClusterView, api: FakeApi) -> adoption.Adoption:
    return adoption.Adoption(
        view, api.dry_run, api.read_job, api.list_pods, api.report, lambda: KEY
    )


def operators_job(run: m.AgentRun, uid: str = "job-uid", key: bytes = KEY) -> dict[str, Any]:
    """The Job the operator creates for step a's committed attempt, signed with ``key``."""
    intent = committed_launch(run, "a")
    assert intent is not None
    manifest = jobs.build_job(run, intent)
    proof.sign(key, run.metadata.uid, "a", intent.attempt, manifest)
    return stored(manifest, intent.job_name, uid)


def unsigned(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` without the operator's proof: what anyone can build with jobs.build_job."""
    copied = copy.deepcopy(job)
    del copied["metadata"]["annotations"][s.ANNOTATION_PROOF]
    return copied


FINISHED_AT = "2026-11-22T09:00:05Z"


def job_pod(job: dict[str, Any], message: str | None, *, controlled: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{job['metadata']['name']}-pod",
        "namespace": "default",
        "uid": f"pod-of-{job['metadata']['uid']}" + ("" if controlled else "-forged"),
        "labels": {s.LABEL_RUN_UID: UID, "job-name": job["metadata"]["name"]},
    }
    if controlled:
        meta["ownerReferences"] = [
            {"kind": "Job", "uid": job["metadata"]["uid"], "controller": True}
        ]
    state = {"terminated": {"exitCode": 0, "message": message, "finishedAt": FINISHED_AT}}
    spec = copy.deepcopy(job["spec"]["template"]["spec"])  # made from the Job's template
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"containerStatuses": [{"name": "step", "state": state}]},
    }


def finished(job: dict[str, Any]) -> dict[str, Any]:
    done = copy.deepcopy(job)
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    return done


# -- check (i): the controller ---------------------------------------------------------------


def test_a_job_controlled_by_the_run_and_labelled_as_its_passes_check_one() -> None:
    run = launched(step("a"))
    assert adoption.ownership_problem(operators_job(run), UID) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda j: j["metadata"].pop("ownerReferences"), "no controller owner reference"),
        (
            lambda j: j["metadata"]["ownerReferences"][0].update(controller=False),
            "no controller owner reference",
        ),
        (
            lambda j: j["metadata"]["ownerReferences"][0].update(uid="someone-else"),
            "not this run",
        ),
        (lambda j: j["metadata"]["ownerReferences"][0].update(kind="ReplicaSet"), "not this run"),
        (
            lambda j: j["metadata"]["ownerReferences"][0].update(apiVersion="apps/v1"),
            "not this run",
        ),
    ],
    ids=["no-owner", "not-controller", "other-uid", "other-kind", "other-group"],
)
def test_check_one_fails_for_any_other_controller(change: Any, problem: str) -> None:
    run = launched(step("a"))
    job = operators_job(run)
    change(job)
    found = adoption.ownership_problem(job, UID)
    assert found is not None and problem in found


def test_labels_decide_nothing_about_the_controller() -> None:
    # Anyone who may edit the Job may change its labels.
    run = launched(step("a"))
    job = operators_job(run)
    job["metadata"]["labels"] = {s.LABEL_RUN_UID: "another-run"}
    assert adoption.ownership_problem(job, UID) is None


# -- check (ii): the spec ---------------------------------------------------------------------


def test_the_operators_spec_matches_its_dry_run_whatever_the_name_and_uid() -> None:
    run = launched(step("a"))
    api = FakeApi()
    intent = committed_launch(run, "a")
    assert intent is not None
    expected = api.dry_run("default", adoption.dry_run_manifest(run, intent, KEY))
    assert expected["metadata"]["name"] != intent.job_name
    assert adoption.spec_problem(expected, operators_job(run)) is None


def _forged(path: str, value: Any) -> Any:
    def change(job: dict[str, Any]) -> None:
        target: Any = job["spec"]
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return change


_DELETE = object()


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            _forged("template.spec.containers.0.command", ["sh", "-c", "echo forged"]),
            "spec.template.spec.containers[0].command",
        ),
        (_forged("template.spec.containers.0.image", "evil:1"), "containers[0].image"),
        (_forged("template.spec.serviceAccountName", "admin"), "serviceAccountName"),
        (_forged("suspend", True), "spec.suspend"),
        (_forged("activeDeadlineSeconds", 99999), "spec.activeDeadlineSeconds"),
        (_forged("backoffLimit", _DELETE), "spec.backoffLimit (missing)"),
        (_forged("template.metadata.labels.extra", "x"), "labels.extra (unexpected)"),
        (
            lambda j: j["spec"]["template"]["spec"]["containers"].append({"name": "side"}),
            "containers (2 items, not 1)",
        ),
    ],
    ids=[
        "command",
        "image",
        "service-account",
        "suspended",
        "deadline",
        "missing",
        "extra-label",
        "extra-container",
    ],
)
def test_check_two_fails_for_any_other_spec_and_says_where(change: Any, where: str) -> None:
    run = launched(step("a"))
    api = FakeApi()
    intent = committed_launch(run, "a")
    assert intent is not None
    expected = api.dry_run("default", adoption.dry_run_manifest(run, intent, KEY))
    job = operators_job(run)
    change(job)
    problem = adoption.spec_problem(expected, job)
    assert problem is not None and where in problem


def test_only_the_name_and_uid_derived_parts_are_ignored() -> None:
    run = launched(step("a"))
    job = operators_job(run)
    other = operators_job(run, uid="another-uid")
    other["metadata"]["name"] = "another-name"
    other["spec"]["template"]["metadata"]["labels"]["job-name"] = "another-name"
    other["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "another"
    assert adoption.first_difference(
        adoption.comparable_spec(job), adoption.comparable_spec(other)
    ) is None  # fmt: skip
    other["spec"]["template"]["metadata"]["labels"][s.LABEL_STEP] = "b"
    assert adoption.spec_problem(job, other) is not None


# -- observing a run ----------------------------------------------------------------------------


def test_a_job_the_operator_created_is_observed_without_a_dry_run() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    taker = adopter(view, api)
    taker.created(job)
    (seen,) = taker.observe(run)  # not in the view yet: the create's answer stands in
    assert seen.name == job["metadata"]["name"] and seen.name_taken is None
    view.apply(JOBS, "ADDED", job)
    (seen,) = taker.observe(run)
    assert seen.state == JobState.ACTIVE and api.dry_runs == [] and api.reads == []


def test_a_job_the_view_shows_before_the_operators_own_patch_needs_no_dry_run() -> None:
    """The operator's release (a patch: its finalizer off, a TTL on) makes a new generation;
    the view may still show the one before. Both are the operator's: no dry run for either.
    A generation someone else made is checked."""
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    taker = adopter(view, api)
    taker.created(job)
    released = copy.deepcopy(job)
    released["metadata"]["generation"] = 2
    released["spec"]["ttlSecondsAfterFinished"] = 30
    taker.created(released)  # the patch's answer
    view.apply(JOBS, "ADDED", job)  # the view, a moment behind
    (seen,) = taker.observe(run)
    assert seen.name_taken is None and api.dry_runs == []
    view.apply(JOBS, "MODIFIED", released)
    (seen,) = taker.observe(run)
    assert seen.name_taken is None and api.dry_runs == []
    edited = copy.deepcopy(released)
    edited["metadata"]["generation"] = 3
    view.apply(JOBS, "MODIFIED", edited)
    taker.observe(run)
    assert len(api.dry_runs) == 1


def test_a_job_found_after_a_restart_is_verified_once_by_a_dry_run() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    view.apply(JOBS, "ADDED", operators_job(run))
    taker = adopter(view, api)
    for _ in range(3):
        (seen,) = taker.observe(run)
        assert seen.name_taken is None
    assert len(api.dry_runs) == 1
    manifest = api.dry_runs[0]
    assert "name" not in manifest["metadata"] and manifest["metadata"]["generateName"]


def test_a_new_generation_of_a_verified_job_is_checked_again() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    taker = adopter(view, api)
    taker.created(job)
    view.apply(JOBS, "ADDED", job)
    taker.observe(run)
    edited = copy.deepcopy(job)
    edited["metadata"]["generation"] = 2
    edited["spec"]["activeDeadlineSeconds"] = 99999
    view.apply(JOBS, "MODIFIED", edited)
    (seen,) = taker.observe(run)
    assert seen.name_taken is not None and "spec.activeDeadlineSeconds" in seen.name_taken
    assert len(api.dry_runs) == 1


def test_a_raised_parallelism_leaves_the_job_the_attempts() -> None:
    """Its second pod is held by the operator's gate (one pod per attempt), so the Job still
    runs the attempt as created."""
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    taker = adopter(view, api)
    taker.created(job)
    view.apply(JOBS, "ADDED", job)
    edited = copy.deepcopy(job)
    edited["metadata"]["generation"] = 2
    edited["spec"]["parallelism"] = 5
    view.apply(JOBS, "MODIFIED", edited)
    (seen,) = taker.observe(run)
    assert seen.name_taken is None


def test_a_job_with_a_forged_owner_and_its_own_command_holds_the_name_in_vain() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    forged = operators_job(run, uid="forged-uid")
    forged["spec"]["template"]["spec"]["containers"][0]["command"] = ["echo", "forged"]
    done = finished(forged)
    view.apply(JOBS, "ADDED", done)
    view.apply(PODS, "ADDED", job_pod(done, '{"ok":true,"summary":"forged"}'))
    taker = adopter(view, api)
    (seen,) = taker.observe(run)
    assert seen.name_taken is not None
    assert "not created by the operator" in seen.name_taken and "command" in seen.name_taken
    assert seen.termination_message is None and seen.state == JobState.ACTIVE
    taker.observe(run)
    assert len(api.dry_runs) == 1 and len(api.reports) == 1, "checked and reported once"
    assert taker.deletable(run, forged["metadata"]["name"]) is None


def test_a_job_under_the_name_without_the_run_as_controller_holds_it_in_vain() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    forged = unsigned(finished(operators_job(run, uid="forged-uid")))
    del forged["metadata"]["ownerReferences"]
    del forged["metadata"]["labels"][s.LABEL_RUN_UID]  # not even watched
    api.stored[forged["metadata"]["name"]] = forged
    taker = adopter(view, api)
    (seen,) = taker.observe(run)
    assert api.reads == [forged["metadata"]["name"]], "read once the view has no such Job"
    assert seen.name_taken is not None and "no controller owner reference" in seen.name_taken
    assert api.dry_runs == []
    assert taker.deletable(run, forged["metadata"]["name"]) is None


def test_only_the_verified_jobs_own_pods_are_read() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = finished(operators_job(run))
    view.apply(JOBS, "ADDED", job)
    view.apply(PODS, "ADDED", job_pod(job, "forged", controlled=False))
    view.apply(PODS, "ADDED", job_pod(job, '{"ok":true,"summary":"real"}'))
    (seen,) = adopter(view, api).observe(run)
    assert seen.termination_message == '{"ok":true,"summary":"real"}'


def test_a_finished_job_whose_pod_the_view_lacks_gets_its_pods_read_now() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = finished(operators_job(run))
    view.apply(JOBS, "ADDED", job)
    api.pods = [job_pod(job, "forged", controlled=False), job_pod(job, "real")]
    (seen,) = adopter(view, api).observe(run)
    assert seen.termination_message == "real"


def test_a_pod_someone_else_made_is_reported_and_its_own_pod_read_now() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = finished(operators_job(run))
    view.apply(JOBS, "ADDED", job)
    # The Job controller adopted her pod, finished as she wrote it; the view has not seen
    # the step's own pod end yet.
    forged = job_pod(job, "forged")
    forged["metadata"]["uid"] = forged["metadata"]["name"] = "hers"
    forged["spec"]["containers"][0]["command"] = ["sh", "-c", "echo forged"]
    view.apply(PODS, "ADDED", forged)
    api.pods = [forged, job_pod(job, "real")]
    (seen,) = adopter(view, api).observe(run)
    assert seen.termination_message == "real"
    (reported,) = api.reports
    assert "pod hers of Job" in reported and "command differs" in reported


def test_a_pod_refusal_is_observed_for_an_active_job_without_pods() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    view.apply(JOBS, "ADDED", job)
    view.apply(
        "events",
        "ADDED",
        {
            "metadata": {"name": "e", "namespace": "default", "uid": "e1"},
            "involvedObject": {"kind": "Job", "uid": job["metadata"]["uid"]},
            "message": 'pods "x" is forbidden: violates PodSecurity "restricted:latest"',
            "lastTimestamp": "t",
        },
    )
    (seen,) = adopter(view, api).observe(run)
    assert seen.pod_refused is not None and "PodSecurity" in seen.pod_refused


def test_jobs_of_no_committed_attempt_are_not_observed() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    stray = operators_job(run, uid="stray")
    stray["metadata"]["name"] = "demo-a-0000000000-7"
    view.apply(JOBS, "ADDED", stray)
    assert adopter(view, api).observe(run) == ()
    assert api.dry_runs == []


def test_a_running_attempt_missing_from_the_view_is_read_before_it_counts_as_lost() -> None:
    run = launched(step("a"))
    assert run.status is not None and run.status.steps
    run.status.steps[0].phase = m.StepPhase.RUNNING
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    api.stored[job["metadata"]["name"]] = job
    (seen,) = adopter(view, api).observe(run)
    assert seen.name_taken is None and len(api.dry_runs) == 1
    api.stored.clear()
    assert adopter(ClusterView(), api).observe(run) == ()


# -- what the core does with them ----------------------------------------------------------------


def test_an_attempt_whose_name_is_taken_fails_with_job_name_taken_and_is_retried() -> None:
    retry = {"limit": 1, "backoff": {"initialSeconds": 1}}
    run = launched(step("a", retry=retry))
    st = run.status.steps[0] if run.status and run.status.steps else None
    assert st is not None and st.job_name
    marker = ObservedJob(st.job_name, "a", 1, JobState.ACTIVE, name_taken="taken: its spec")
    decision = reconcile(run, Observed((marker,)), T0)
    (after,) = [x for x in decision.status.steps or [] if x.name == "a"]
    assert after.phase == m.StepPhase.BACKING_OFF
    assert after.error is not None and after.error.reason == "JobNameTaken"
    assert after.error.message == "taken: its spec" and after.result is None
    assert not [a for a in decision.after_commit if isinstance(a, DeleteJob)]


def test_an_attempt_whose_pod_is_refused_fails_and_its_job_is_deleted() -> None:
    run = launched(step("a"))
    st = run.status.steps[0] if run.status and run.status.steps else None
    assert st is not None and st.job_name
    refused = ObservedJob(st.job_name, "a", 1, JobState.ACTIVE, pod_refused="forbidden: quota")
    decision = reconcile(run, Observed((refused,)), T0)
    (after,) = [x for x in decision.status.steps or [] if x.name == "a"]
    assert after.phase == m.StepPhase.FAILED
    assert after.error is not None and after.error.reason == "PodRefused"
    assert after.error.message == "forbidden: quota"
    deletes = [a for a in decision.after_commit if isinstance(a, DeleteJob)]
    assert [(d.job_name, d.reason) for d in deletes] == [(st.job_name, "PodRefused")]


SA_MISSING = (
    'Error creating: pods "r-a-1-x7k2p" is forbidden: error looking up service account '
    'team/late: serviceaccount "late" not found'
)


def test_a_refusal_that_may_pass_waits_for_the_job_controllers_tries_then_fails() -> None:
    run = launched(step("a", timeoutSeconds=600))
    st = run.status.steps[0] if run.status and run.status.steps else None
    assert st is not None and st.job_name and st.attempt_started_at is not None
    refused = ObservedJob(st.job_name, "a", 1, JobState.ACTIVE, pod_refused=SA_MISSING)
    grace = CoreConfig().refusal_grace_seconds
    due = st.attempt_started_at + timedelta(seconds=grace)

    waiting = reconcile(run, Observed((refused,)), due - timedelta(seconds=1))
    (still,) = [x for x in waiting.status.steps or [] if x.name == "a"]
    assert still.phase == m.StepPhase.LAUNCHING and still.error is None, still
    assert still.message is not None and "FailedCreate" in still.message, still.message
    assert due.isoformat() in still.message, still.message
    assert not [a for a in waiting.after_commit if isinstance(a, DeleteJob)]
    assert waiting.requeue_after is not None and waiting.requeue_after <= 1, waiting.requeue_after
    (warning,) = [a for a in waiting.after_commit if isinstance(a, EmitEvent)]
    assert (warning.type, warning.reason) == ("Warning", "PodRefused"), warning
    assert 'serviceaccount "late" not found' in warning.message, warning.message
    told = run.model_copy(update={"status": waiting.status})  # as committed: told once
    again = reconcile(told, Observed((refused,)), due - timedelta(seconds=1))
    assert not [a for a in again.after_commit if isinstance(a, EmitEvent)]
    assert not again.status_changed(told.status)

    failed = reconcile(run, Observed((refused,)), due)
    (after,) = [x for x in failed.status.steps or [] if x.name == "a"]
    assert after.phase == m.StepPhase.FAILED, after
    assert after.error is not None and after.error.reason == "PodRefused"
    assert after.error.message == SA_MISSING
    deletes = [a for a in failed.after_commit if isinstance(a, DeleteJob)]
    assert [(d.job_name, d.reason) for d in deletes] == [(st.job_name, "PodRefused")]


def test_the_steps_timeout_still_ends_an_attempt_waiting_out_a_refusal() -> None:
    run = launched(step("a", timeoutSeconds=5))
    st = run.status.steps[0] if run.status and run.status.steps else None
    assert st is not None and st.job_name and st.attempt_started_at is not None
    refused = ObservedJob(st.job_name, "a", 1, JobState.ACTIVE, pod_refused=SA_MISSING)
    config = CoreConfig()
    late = st.attempt_started_at + timedelta(seconds=5 + config.step_timeout_grace_seconds)
    decision = reconcile(run, Observed((refused,)), late)
    (after,) = [x for x in decision.status.steps or [] if x.name == "a"]
    assert after.error is not None and after.error.reason == "StepTimeout", after


@pytest.mark.parametrize(
    ("message", "passes"),
    [
        (SA_MISSING, True),
        (
            'pods "r-a-1-abcde" is forbidden: exceeded quota: pods, requested: pods=1, '
            "used: pods=2, limited: pods=2",
            True,
        ),
        ("Timeout: request did not complete within requested timeout - context deadline", True),
        ("etcdserver: request timed out", True),
        ("the server is currently unable to handle the request (post pods)", True),
        ('pods "x" is forbidden: failed quota: q: must specify limits.cpu for: step', False),
        (
            'pods "x" is forbidden: violates PodSecurity "restricted:latest": '
            "allowPrivilegeEscalation != false",
            False,
        ),
        ('pods "x" is forbidden: maximum cpu usage per Container is 1, but limit is 2', False),
        ("forged: pods is forbidden", False),
        (
            'Job.batch "x" is invalid: spec.template.spec.containers[0].env[0].name: Invalid '
            'value: "timeout!"',
            False,
        ),
        ("Too many requests, please try again later.", True),
    ],
)
def test_which_refusals_of_a_pod_may_pass(message: str, passes: bool) -> None:
    assert refusal_may_pass(message) is passes


def test_the_committed_launch_is_what_the_core_issues_and_none_once_the_step_changed() -> None:
    run = launched(step("a"))
    intent = committed_launch(run, "a")
    decision = reconcile(run, Observed(), T0)  # the Job is not there: the create is reissued
    issued = [a for a in decision.after_commit if isinstance(a, CreateJob)]
    assert issued == [intent]
    changed = run.model_copy(deep=True)
    changed.spec.plan.steps[0].container.command = ["sh", "-c", "echo changed"]
    assert committed_launch(changed, "a") is None
    assert committed_launch(run, "missing") is None


# -- proof of creation and labels ---------------------------------------------------------------


def test_the_exact_manifest_built_by_someone_else_holds_the_name_in_vain() -> None:
    # What an edit user makes with jobs.build_job before the operator's create (even before
    # the step's approval): the operator's own spec, owner and labels, but no proof.
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    hers = finished(unsigned(operators_job(run, uid="hers")))
    view.apply(JOBS, "ADDED", hers)
    view.apply(PODS, "ADDED", job_pod(hers, '{"ok":true,"summary":"ran early"}'))
    taker = adopter(view, api)
    (seen,) = taker.observe(run)
    assert seen.name_taken is not None and s.ANNOTATION_PROOF in seen.name_taken
    assert "not created by the operator" in seen.name_taken
    assert seen.termination_message is None and seen.state == JobState.ACTIVE
    assert api.dry_runs == [] and len(api.reports) == 1
    assert taker.deletable(run, hers["metadata"]["name"]) is None


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda job: operators_job(job, uid="hers", key=b"x" * 32), id="other-key"),
    ],
)
def test_a_proof_made_with_another_key_does_not_verify(forge: Any) -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    view.apply(JOBS, "ADDED", forge(run))
    (seen,) = adopter(view, api).observe(run)
    assert seen.name_taken is not None and "does not verify" in seen.name_taken
    assert api.dry_runs == []


def test_a_proof_binds_the_run_step_attempt_name_and_spec() -> None:
    run = launched(step("a"))
    intent = committed_launch(run, "a")
    assert intent is not None
    manifest = jobs.build_job(run, intent)
    proof.sign(KEY, UID, "a", intent.attempt, manifest)
    name = intent.job_name

    def problem(found: dict[str, Any], uid: str = UID, step_: str = "a", n: int = 1) -> Any:
        expected = jobs.build_job(run, intent)
        expected["metadata"]["name"] = found["metadata"]["name"]
        return proof.proof_problem(KEY, uid, step_, n, expected, found)

    assert problem(manifest) is None
    assert problem(manifest, uid="another-run") is not None
    assert problem(manifest, step_="b") is not None
    assert problem(manifest, n=2) is not None
    renamed = copy.deepcopy(manifest)
    renamed["metadata"]["name"] = f"{name}-2"
    assert problem(renamed) is not None
    other_spec = jobs.build_job(run, intent)
    other_spec["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh"]
    signature = manifest["metadata"]["annotations"][s.ANNOTATION_PROOF]
    other_spec["metadata"]["annotations"][s.ANNOTATION_PROOF] = signature
    assert proof.proof_problem(KEY, UID, "a", 1, other_spec, manifest) is not None
    with pytest.raises(ValueError, match="bytes"):
        proof.proof(b"short", UID, "a", 1, manifest)


def _running(run: m.AgentRun) -> m.AgentRun:
    assert run.status is not None and run.status.steps
    run.status.steps[0].phase = m.StepPhase.RUNNING
    return run


@pytest.mark.parametrize("label", ["changed", "removed"])
def test_a_relabelled_job_the_operator_created_is_still_the_attempts(label: str) -> None:
    run = _running(launched(step("a")))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    taker = adopter(view, api)
    taker.created(job)
    view.apply(JOBS, "ADDED", job)
    relabelled = copy.deepcopy(job)
    relabelled["metadata"]["resourceVersion"] = "2"
    labels = relabelled["metadata"]["labels"] = dict(relabelled["metadata"]["labels"])
    if label == "changed":
        labels[s.LABEL_RUN_UID] = "another-run"
        labels[s.LABEL_STEP] = "b"
        view.apply(JOBS, "MODIFIED", relabelled)
    else:
        del labels[s.LABEL_RUN_UID]
        view.apply(JOBS, "DELETED", relabelled)  # what the watch says: no longer selected
        api.stored[job["metadata"]["name"]] = relabelled
    (seen,) = taker.observe(run)
    assert seen.name == job["metadata"]["name"] and seen.name_taken is None
    assert seen.state == JobState.ACTIVE and api.dry_runs == [] and api.reports == []
    assert taker.deletable(run, job["metadata"]["name"]) == job["metadata"]["uid"]
    # The core keeps the attempt: nothing to launch, nothing failed.
    decision = reconcile(run, Observed((seen,)), T0)
    assert not [a for a in decision.after_commit if isinstance(a, CreateJob)]
    (after,) = [x for x in decision.status.steps or [] if x.name == "a"]
    assert after.attempt == 1 and after.phase == m.StepPhase.RUNNING


def test_after_a_restart_a_signed_job_counts_whatever_its_labels_and_owners() -> None:
    run = _running(launched(step("a")))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    labels = {k: v for k, v in job["metadata"]["labels"].items() if k != s.LABEL_RUN_UID}
    job["metadata"]["labels"] = labels  # the Job's own labels, not its template's
    del job["metadata"]["ownerReferences"]
    api.stored[job["metadata"]["name"]] = job
    (seen,) = adopter(view, api).observe(run)
    assert seen.name_taken is None and len(api.dry_runs) == 1


@pytest.mark.parametrize("shard", ["3-of-12", "0-of-1"])
def test_a_job_made_by_a_sharded_replica_counts_for_one_with_any_other_shard_count(
    shard: str,
) -> None:
    """The shard label routes watch events only: a Job a replica made under one shard count is
    the attempt's for an operator restarted with another count, or without shards."""
    run = _running(launched(step("a")))
    intent = committed_launch(run, "a")
    assert intent is not None
    manifest = jobs.with_shard_label(jobs.build_job(run, intent), shard)
    proof.sign(KEY, UID, "a", intent.attempt, manifest)
    job = stored(manifest, intent.job_name, "job-uid")
    assert job["spec"]["template"]["metadata"]["labels"][s.LABEL_SHARD] == shard
    view, api = ClusterView(), FakeApi()
    view.apply(JOBS, "ADDED", job)
    (seen,) = adopter(view, api).observe(run)
    assert seen.name_taken is None and len(api.dry_runs) == 1
    assert s.LABEL_SHARD not in api.dry_runs[0]["spec"]["template"]["metadata"]["labels"]

    # Every other label of the template is still covered by the proof and the comparison.
    forged = copy.deepcopy(job)
    forged["spec"]["template"]["metadata"]["labels"][s.LABEL_STEP] = "b"
    expected = jobs.build_job(run, intent)
    forged_manifest = copy.deepcopy(manifest)
    forged_manifest["spec"]["template"]["metadata"]["labels"][s.LABEL_STEP] = "b"
    assert proof.proof_problem(KEY, UID, "a", 1, forged_manifest, job) is not None
    assert adoption.spec_problem(expected, forged) is not None


def test_a_job_the_watch_lost_is_read_again_so_its_end_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = _running(launched(step("a")))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    clock = [1000.0]
    monkeypatch.setattr(adoption, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    taker = adopter(view, api)
    taker.created(job)
    name = job["metadata"]["name"]
    api.stored[name] = job  # relabelled: the watch no longer has it
    clock[0] += adoption.FRESH_SECONDS + 1  # past what the create's answer stands for
    (seen,) = taker.observe(run)
    assert seen.state == JobState.ACTIVE and api.reads == [name]
    done = finished(job)
    api.stored[name] = done
    view.apply(PODS, "ADDED", job_pod(done, '{"ok":true,"summary":"real"}'))
    clock[0] += adoption.READ_FRESH_SECONDS + 0.1
    (seen,) = taker.observe(run)
    assert seen.state == JobState.SUCCEEDED and api.reads == [name, name]


# -- the cost of a pass: a Job unchanged since the last pass is not checked again -------------


def _versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    changed["metadata"]["resourceVersion"] = version
    return changed


def test_a_job_and_pods_unchanged_since_the_last_pass_are_not_checked_again() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = _versioned(operators_job(run), "5")
    view.apply(JOBS, "ADDED", job)
    view.apply(PODS, "ADDED", _versioned(job_pod(job, None), "6"))
    taker = adopter(view, api)
    with mock.patch.object(jobs, "pod_problem", wraps=jobs.pod_problem) as checked:
        (first,) = taker.observe(run)
        calls = checked.call_count
        assert calls > 0
        (again,) = taker.observe(run)
        assert checked.call_count == calls, "an unchanged Job's pods were checked again"
        assert again == first
        # The Job ends (new versions of both): observed anew, with the pod's outcome.
        done = _versioned(finished(job), "8")
        view.apply(PODS, "MODIFIED", _versioned(job_pod(done, '{"ok":true,"summary":"s"}'), "7"))
        view.apply(JOBS, "MODIFIED", done)
        (seen,) = taker.observe(run)
        assert checked.call_count > calls
        assert seen.termination_message == '{"ok":true,"summary":"s"}'


def test_objects_without_a_version_are_checked_on_every_pass() -> None:
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run)
    view.apply(JOBS, "ADDED", job)
    view.apply(PODS, "ADDED", job_pod(job, None))
    taker = adopter(view, api)
    with mock.patch.object(jobs, "pod_problem", wraps=jobs.pod_problem) as checked:
        taker.observe(run)
        calls = checked.call_count
        taker.observe(run)
        assert checked.call_count == 2 * calls


def _settled_run() -> tuple[m.AgentRun, dict[str, Any]]:
    """A run whose step a has finished, its outcome committed, and its Job as the operator
    leaves it then: ended, its outcome finalizer off, ``ttlSecondsAfterFinished`` set."""
    run = launched(step("a"))
    job = finished(operators_job(run))
    assert jobs.is_held(job)
    job["metadata"]["finalizers"] = []
    job["spec"]["ttlSecondsAfterFinished"] = 30
    assert run.status is not None and run.status.steps
    done = run.status.steps[0].model_copy(update={"phase": m.StepPhase.SUCCEEDED})
    status = run.status.model_copy(update={"steps": [done]})
    return run.model_copy(update={"status": status}), job


def test_a_job_let_go_after_its_outcome_is_not_checked_on_any_pass() -> None:
    run, job = _settled_run()
    view, api = ClusterView(), FakeApi()
    view.apply(JOBS, "ADDED", job)
    view.apply(PODS, "ADDED", job_pod(job, '{"ok":true}'))
    with mock.patch.object(adoption.Adoption, "verdict", wraps=None) as verdict:
        assert adopter(view, api).observe(run) == ()
        verdict.assert_not_called()


def test_a_job_let_go_is_told_so_once_per_version() -> None:
    """A pass of a long run meets a hundred Jobs let go: each is looked at (its pods asked
    for) once, and again only once it changes, when it may no longer be let go."""
    run, settled = _settled_run()
    job = _versioned(settled, "5")
    view, api = ClusterView(), FakeApi()
    view.apply(JOBS, "ADDED", job)
    view.apply(PODS, "ADDED", _versioned(job_pod(job, '{"ok":true}'), "6"))
    taker = adopter(view, api)
    with mock.patch.object(view, "pods_of_job", wraps=view.pods_of_job) as pods_of:
        assert taker.observe(run) == ()
        asked = pods_of.call_count
        assert asked > 0
        assert taker.observe(run) == ()
        assert pods_of.call_count == asked, "a Job let go was looked at again, unchanged"
        kept = _versioned(job, "7")
        kept["spec"].pop("ttlSecondsAfterFinished")  # the operator deletes it after the grace
        view.apply(JOBS, "MODIFIED", kept)
        (seen,) = taker.observe(run)
        assert seen.name == job["metadata"]["name"] and pods_of.call_count > asked


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda job, pod: job["metadata"].update(finalizers=[s.JOB_FINALIZER]),
                     id="still-held"),
        pytest.param(lambda job, pod: job["spec"].pop("ttlSecondsAfterFinished"),
                     id="ttl-removed"),
        pytest.param(lambda job, pod: pod["status"].update(
            phase="Running", containerStatuses=[{"name": "step", "state": {"running": {}}}]),
                     id="pod-still-stopping"),
    ],
)  # fmt: skip
def test_a_job_with_something_left_to_decide_is_still_observed(change: Any) -> None:
    """Held (its release is still to come), its TTL removed (the operator deletes it after
    the grace), or a pod of it still running (the step's next attempt waits for it)."""
    run, job = _settled_run()
    pod = job_pod(job, '{"ok":true}')
    change(job, pod)
    view, api = ClusterView(), FakeApi()
    view.apply(JOBS, "ADDED", job)
    view.apply(PODS, "ADDED", pod)
    (seen,) = adopter(view, api).observe(run)
    assert seen.name == job["metadata"]["name"]


def test_a_released_job_is_seen_released_before_the_view_shows_the_release() -> None:
    """The release's answer (a later version of the same Job) is what a pass sees until the
    view catches up: taken from the view, the Job would still hold its finalizer, and the
    core would release it again (a second patch, refused). Once the view shows a version as
    late, the view's is taken."""
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = _versioned(operators_job(run), "5")
    taker = adopter(view, api)
    taker.created(job)
    view.apply(JOBS, "ADDED", job)
    (seen,) = taker.observe(run)
    assert seen.held
    released = _versioned(job, "7")
    released["metadata"]["generation"] = 2
    released["metadata"]["finalizers"] = []
    released["spec"]["ttlSecondsAfterFinished"] = 30
    taker.created(released)  # the patch's answer; the view still shows version 5
    (seen,) = taker.observe(run)
    assert not seen.held and seen.expires
    caught_up = _versioned(released, "7")
    view.apply(JOBS, "MODIFIED", caught_up)
    (seen,) = taker.observe(run)
    assert not seen.held
    later = _versioned(caught_up, "9")
    later["metadata"]["labels"]["extra"] = "x"
    view.apply(JOBS, "MODIFIED", later)
    current = taker._current_object("default", job["metadata"]["name"])
    assert current is not None and current["metadata"]["resourceVersion"] == "9"


@pytest.mark.parametrize("made_here", [True, False], ids=["created", "verified-after-restart"])
def test_a_job_made_again_under_the_name_with_the_proof_copied_is_not_the_attempts(
    made_here: bool,
) -> None:
    """The mimic of the job-finalizer row: the attempt's Job deleted (its finalizer removed)
    and made again exactly, its proof copied, a new uid. A proof binds the name, not the uid:
    while this process runs, the Job it created or verified under the name is known by uid,
    and the copy holds the name in vain (its pod is never let start)."""
    run = launched(step("a"))
    view, api = ClusterView(), FakeApi()
    job = operators_job(run, uid="first-uid")
    taker = adopter(view, api)
    if made_here:
        taker.created(job)
    view.apply(JOBS, "ADDED", job)
    (seen,) = taker.observe(run)
    assert seen.name_taken is None
    view.apply(JOBS, "DELETED", job)
    copied = operators_job(run, uid="second-uid")  # the same manifest, proof and all
    assert copied["metadata"]["annotations"] == job["metadata"]["annotations"]
    view.apply(JOBS, "ADDED", copied)
    (seen,) = taker.observe(run)
    assert seen.name_taken is not None and "made again under the name" in seen.name_taken
    assert seen.start_pod is None
