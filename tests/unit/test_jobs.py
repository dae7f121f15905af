"""Step Jobs built from the core's CreateJob, and their outcome read back."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import CreateJob, JobState
from agentrun.execution import jobs, objects
from tests.support.sim import UID, make_run, step


def _create(run: m.AgentRun, name: str = "a", attempt: int = 2) -> CreateJob:
    found = run.step(name)
    assert found is not None
    return CreateJob(
        found,
        attempt,
        f"demo-{name}-x-{attempt}",
        "key",
        "hash",
        (m.EnvVar(name="INPUT", value="v"),),
    )


def test_job_is_one_attempt_with_identity_ownership_and_restricted_defaults() -> None:
    run = make_run([step("a", timeoutSeconds=30)])
    job = jobs.build_job(run, _create(run))
    meta, spec = job["metadata"], job["spec"]
    assert meta["finalizers"] == [s.JOB_FINALIZER]
    assert meta["ownerReferences"][0]["uid"] == UID
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"][s.LABEL_STEP] == "a" and meta["labels"][s.LABEL_ATTEMPT] == "2"
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 30
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[s.ENV_IDEMPOTENCY_KEY] == "key" and env[s.ENV_ATTEMPT] == "2"
    assert env[s.ENV_RUN_UID] == UID and env["INPUT"] == "v"
    assert spec["template"]["metadata"]["labels"][s.LABEL_RUN_UID] == UID


def test_step_template_overrides_security_and_service_account() -> None:
    run = make_run(
        [step("a")],
        stepTemplate={
            "serviceAccountName": "agent",
            "securityContext": {"runAsUser": 1000},
            "resources": {"limits": {"memory": "128Mi"}},
        },
    )
    pod = jobs.build_job(run, _create(run))["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agent" and pod["automountServiceAccountToken"] is True
    assert pod["securityContext"] == {"runAsUser": 1000}
    assert pod["containers"][0]["resources"] == {"limits": {"memory": "128Mi"}}


def test_secret_env_is_passed_by_reference() -> None:
    body = step("a")
    body["container"]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
    ]
    run = make_run([body])
    env = jobs.build_job(run, _create(run))["spec"]["template"]["spec"]["containers"][0]["env"]
    token = next(e for e in env if e["name"] == "TOKEN")
    assert token == {
        "name": "TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
    }


_RUN = make_run([step("a")])
_TEMPLATE: dict[str, Any] = jobs.build_job(_RUN, _create(_RUN))["spec"]["template"]


def _job(conditions: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "labels": {s.LABEL_STEP: "a", s.LABEL_ATTEMPT: "1"}, **meta},
        "spec": {"template": copy.deepcopy(_TEMPLATE)},
        "status": {"conditions": conditions, "startTime": "2026-11-22T09:00:00Z"},
    }


def _pod(
    message: str | None,
    code: int,
    finished: str = "2026-11-22T09:00:05Z",
    name: str = "j-abcde",
    **spec: Any,
) -> dict[str, Any]:
    """A pod of :func:`_job`, made from its template (``spec`` changes its spec) and
    terminated with ``code`` and ``message``."""
    pod_spec = copy.deepcopy(_TEMPLATE["spec"])
    pod_spec["serviceAccountName"] = "default"  # as the API server admits it
    pod_spec.update(spec)
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": pod_spec,
        "status": {
            "containerStatuses": [
                {
                    "name": "step",
                    "state": {
                        "terminated": {"exitCode": code, "message": message, "finishedAt": finished}
                    },
                }
            ]
        },
    }


def test_outcome_of_a_complete_job_comes_from_its_pod() -> None:
    observed = jobs.observe_job(
        _job([{"type": "Complete", "status": "True"}]),
        [_pod("old", 1, "2026-11-22T09:00:01Z"), _pod("done", 0)],
    )
    assert observed is not None
    assert observed.state == JobState.SUCCEEDED
    assert observed.termination_message == "done" and observed.exit_code == 0


def test_failed_job_keeps_reason_and_exit_code() -> None:
    observed = jobs.observe_job(
        _job(
            [
                {"type": "FailureTarget", "status": "True"},
                {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"},
            ]
        ),
        [_pod(None, 137)],
    )
    assert observed is not None
    assert observed.state == JobState.FAILED and observed.reason == "DeadlineExceeded"
    assert observed.exit_code == 137


def _ended(code: int, phase: str, **spec: Any) -> dict[str, Any]:
    pod = _pod("out", code, schedulingGates=[], nodeName="node", **spec)
    pod["status"]["phase"] = phase
    return pod


def test_success_of_the_own_pod_ends_the_job_before_the_job_controller_says_so() -> None:
    early = jobs.observe_job(_job([]), [_ended(0, "Succeeded")])
    assert early is not None and early.state == JobState.SUCCEEDED
    assert early.termination_message == "out" and early.exit_code == 0
    assert early.start_pod is None


def test_failures_and_doubtful_jobs_wait_for_the_job_controller() -> None:
    failed = jobs.observe_job(_job([]), [_ended(1, "Failed")])
    assert failed is not None and failed.state == JobState.ACTIVE
    failing = jobs.observe_job(
        _job([{"type": "FailureTarget", "status": "True"}]), [_ended(0, "Succeeded")]
    )
    assert failing is not None and failing.state == JobState.ACTIVE
    foreign = _ended(0, "Succeeded", containers=[{"name": "step", "image": "evil"}])
    beside = jobs.observe_job(_job([]), [_ended(0, "Succeeded"), foreign])
    assert beside is not None and beside.state == JobState.ACTIVE
    gated = _pod("out", 0)
    gated["status"]["phase"] = "Succeeded"
    held = jobs.observe_job(_job([]), [gated])
    assert held is not None and held.state == JobState.ACTIVE


def test_a_job_runs_its_step_from_the_moment_its_own_pods_step_container_runs() -> None:
    """``running_since`` (what the Running note waits on) is the step container's start in
    the attempt's own running pod: not the Job's startTime, not a pod still held, starting,
    being deleted or running something else."""
    started = "2026-11-22T09:00:07Z"
    running = _pod(None, 0, schedulingGates=[], nodeName="node")
    running["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.7",
        "containerStatuses": [{"name": "step", "state": {"running": {"startedAt": started}}}],
    }
    seen = jobs.observe_job(_job([]), [running])
    assert seen is not None and seen.running_since == datetime(2026, 11, 22, 9, 0, 7, tzinfo=UTC)
    waiting = copy.deepcopy(running)
    waiting["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "Pulling"}}
    held = _pod(None, 0)  # still behind the scheduling gate
    held["status"] = copy.deepcopy(running["status"])
    going = copy.deepcopy(running)
    going["metadata"]["deletionTimestamp"] = "2026-11-22T09:01:00Z"
    foreign = copy.deepcopy(running)
    foreign["spec"]["containers"][0]["image"] = "evil"
    for pods in ([], [waiting], [held], [going], [foreign]):
        observed = jobs.observe_job(_job([]), pods)
        assert observed is not None and observed.running_since is None, pods
    done = jobs.observe_job(_job([{"type": "Complete", "status": "True"}]), [running])
    assert done is not None and done.running_since is None


def test_a_started_pod_that_ended_or_went_while_the_job_runs_is_lost() -> None:
    started = "uid-j-abcde"
    running = _pod(None, 0, schedulingGates=[], nodeName="node")
    running["status"] = {"phase": "Running", "podIP": "10.0.0.7"}
    alive = jobs.observe_job(_job([]), [running], started=started)
    assert alive is not None and not alive.pod_lost and alive.address == "10.0.0.7"
    going = copy.deepcopy(running)
    going["metadata"]["deletionTimestamp"] = "2026-11-22T09:01:00Z"
    failed = _ended(1, "Failed")
    for pods in ([going], [failed], []):
        lost = jobs.observe_job(_job([]), pods, started=started)
        assert lost is not None and lost.state == JobState.ACTIVE and lost.pod_lost, pods
    # Not known without the pod this process started, nor once the Job has ended.
    unknown = jobs.observe_job(_job([]), [], started=None)
    assert unknown is not None and not unknown.pod_lost
    done = jobs.observe_job(_job([{"type": "Failed", "status": "True"}]), [failed], started=started)
    assert done is not None and done.state == JobState.FAILED and not done.pod_lost


def test_running_and_deleting_jobs() -> None:
    running = jobs.observe_job(_job([]), [])
    assert running is not None and running.state == JobState.ACTIVE and not running.deleting
    deleting = jobs.observe_job(_job([], deletionTimestamp="2026-11-22T09:01:00Z"), [])
    assert deleting is not None and deleting.deleting


def test_jobs_without_step_labels_are_ignored() -> None:
    assert jobs.observe_job({"metadata": {"name": "x", "labels": {}}}, []) is None


def test_long_run_names_fit_in_labels_and_stay_in_an_annotation() -> None:
    run = make_run([step("a")], name="r" * 80)
    job = jobs.build_job(run, _create(run))
    label = job["metadata"]["labels"][s.LABEL_RUN]
    assert len(label) <= 63 and label.startswith("r" * 50)
    assert label != objects.label_value("r" * 81)
    assert job["metadata"]["annotations"][s.ANNOTATION_RUN_NAME] == "r" * 80
    assert objects.label_value("short") == "short"


def test_a_job_is_finished_once_complete_or_failed_is_true() -> None:
    assert jobs.is_finished(_job([{"type": "Complete", "status": "True"}]))
    assert jobs.is_finished(_job([{"type": "Failed", "status": "True"}]))
    assert not jobs.is_finished(_job([{"type": "Failed", "status": "False"}]))
    assert not jobs.is_finished(_job([{"type": "FailureTarget", "status": "True"}]))
    assert not jobs.is_finished({"metadata": {"name": "j"}})


def test_a_pod_refusal_counts_only_while_the_job_is_active() -> None:
    active = {"metadata": {"name": "j", "labels": {s.LABEL_STEP: "a", s.LABEL_ATTEMPT: "1"}}}
    seen = jobs.observe_job(active, [], pod_refused="forbidden: violates PodSecurity")
    assert seen is not None and seen.pod_refused == "forbidden: violates PodSecurity"
    done = {**active, "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    seen = jobs.observe_job(done, [], pod_refused="forbidden")
    assert seen is not None and seen.state == JobState.FAILED and seen.pod_refused is None


def _step_container(**changes: Any) -> list[dict[str, Any]]:
    container = copy.deepcopy(_TEMPLATE["spec"]["containers"][0])
    container.update(changes)
    return [container]


def test_a_pod_made_from_the_jobs_template_runs_it() -> None:
    job = _job([])
    assert jobs.pod_problem(job, _pod(None, 0)) is None
    # What admission adds to every pod does not matter: a token volume and its mount,
    # default resources, workload identity variables, an image pinned to its digest.
    env = [*_TEMPLATE["spec"]["containers"][0]["env"], {"name": "AWS_REGION", "value": "x"}]
    mount = {"name": "kube-api-access-x", "mountPath": "/var/run/secrets"}
    image = f"{_TEMPLATE['spec']['containers'][0]['image']}@sha256:{'0' * 64}"
    added = _step_container(
        env=env, volumeMounts=[mount], resources={"limits": {"cpu": "1"}}, image=image
    )
    assert jobs.pod_problem(job, _pod(None, 0, containers=added)) is None
    # Security settings the template leaves open, set by admission.
    pod_security = {**_TEMPLATE["spec"]["securityContext"], "fsGroup": 1000}
    container_security = {
        **_TEMPLATE["spec"]["containers"][0]["securityContext"],
        "seLinuxOptions": {"level": "s0:c1"},
    }
    tightened = _pod(
        None,
        0,
        securityContext=pod_security,
        containers=_step_container(securityContext=container_security),
    )
    assert jobs.pod_problem(job, tightened) is None


def test_a_pod_that_runs_anything_else_is_not_the_steps() -> None:
    job = _job([])
    env = _TEMPLATE["spec"]["containers"][0]["env"]
    changed = {
        "image": _step_container(image="evil:1"),
        "command": _step_container(command=["sh", "-c", "echo forged"]),
        "args": _step_container(args=["--forge"]),
        "workingDir": _step_container(workingDir="/tmp"),
        "securityContext": _step_container(securityContext={"privileged": True}),
        "environment": _step_container(env=[{**env[0], "value": "other"}, *env[1:]]),
        "twice": _step_container(env=[*env, {**env[0], "value": "other"}]),
        "missing": _step_container(env=env[1:]),
        "renamed": [{**_step_container()[0], "name": "main"}],
    }
    for what, containers in changed.items():
        assert jobs.pod_problem(job, _pod(None, 0, containers=containers)), what
    assert "ServiceAccount" in (jobs.pod_problem(job, _pod(None, 0, serviceAccountName="ci")) or "")
    assert jobs.pod_problem(job, _pod(None, 0, securityContext={"runAsUser": 0}))
    loosened = {**_TEMPLATE["spec"]["securityContext"], "runAsNonRoot": False}
    assert jobs.pod_problem(job, _pod(None, 0, securityContext=loosened))
    lowered = {
        **_TEMPLATE["spec"]["containers"][0]["securityContext"],
        "capabilities": {"drop": []},
    }
    assert jobs.pod_problem(job, _pod(None, 0, containers=_step_container(securityContext=lowered)))
    assert "hostPID" in (jobs.pod_problem(job, _pod(None, 0, hostPID=True)) or "")


def test_a_job_ended_by_a_pod_that_is_not_the_steps_fails_without_its_outcome() -> None:
    forged = _pod('{"ok": true, "summary": "forged"}', 0, name="forged", hostIPC=True)
    # Its own pod never ran to its end (the Job controller stopped it, or never made it).
    for killed in ([], [_pod(None, 137, name="own")]):
        pods = [forged, *killed]
        ended = jobs.observe_job(_job([{"type": "Complete", "status": "True"}]), pods)
        assert ended is not None and ended.state == JobState.FAILED, killed
        if killed:
            assert ended.exit_code == 137
        else:
            assert ended.reason == jobs.UNTRUSTED_POD and "forged" in (ended.message or "")
        assert (
            ended.termination_message
            != forged["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        )
    # Its own pod ran to its end: that is the outcome, whatever the Job's conditions say.
    own = _pod('{"ok": true, "summary": "real"}', 0, name="own", finished="2026-11-22T09:00:01Z")
    ended = jobs.observe_job(_job([{"type": "Failed", "status": "True"}]), [forged, own])
    assert ended is not None and ended.state == JobState.SUCCEEDED
    assert ended.termination_message == '{"ok": true, "summary": "real"}'
    # While the Job runs, nothing is read from any pod.
    running = jobs.observe_job(_job([]), [forged])
    assert running is not None and running.state == JobState.ACTIVE


def test_a_success_no_pod_of_the_jobs_own_confirms_fails_the_attempt() -> None:
    complete = _job([{"type": "Complete", "status": "True"}])
    lost = jobs.observe_job(complete, [])
    assert lost is not None and lost.state == JobState.FAILED and lost.reason == jobs.POD_LOST
    # Its own pod says otherwise: the pod tells.
    failed = jobs.observe_job(complete, [_pod("boom", 2)])
    assert failed is not None and failed.state == JobState.FAILED and failed.exit_code == 2
    # A failure stands as the Job reports it, pods or not.
    job_failed = jobs.observe_job(_job([{"type": "Failed", "status": "True", "reason": "X"}]), [])
    assert job_failed is not None and job_failed.state == JobState.FAILED
    assert job_failed.reason == "X"
    # Pods not looked at: the conditions alone.
    guessed = jobs.observe_job(complete, None)
    assert guessed is not None and guessed.state == JobState.SUCCEEDED


# -- one pod per attempt -----------------------------------------------------------------------


def _waiting(name: str, created: str, **spec: Any) -> dict[str, Any]:
    """A pod of :func:`_job` as the Job controller makes it: held by the operator's gate."""
    pod = _pod(None, 0, name=name, **spec)
    pod["metadata"]["creationTimestamp"] = created
    pod["status"] = {"phase": "Pending"}
    return pod


def _let_go(pod: dict[str, Any], node: str = "node-1") -> dict[str, Any]:
    started = copy.deepcopy(pod)
    started["spec"].pop("schedulingGates", None)
    started["spec"]["nodeName"] = node
    return started


def test_every_step_pod_is_created_held_by_the_operators_gate() -> None:
    assert _TEMPLATE["spec"]["schedulingGates"] == [{"name": s.POD_GATE}]
    assert jobs.is_gated(_waiting("p", "2026-11-22T09:00:00Z"))
    assert not jobs.is_gated(_let_go(_waiting("p", "2026-11-22T09:00:00Z")))
    # A node given to a pod starts it, whatever its gates say.
    assert not jobs.is_gated(_waiting("p", "2026-11-22T09:00:00Z", nodeName="n"))


def test_the_oldest_pod_of_an_attempt_is_the_one_let_start() -> None:
    older = _waiting("p-older", "2026-11-22T09:00:00Z")
    newer = _waiting("p-newer", "2026-11-22T09:00:01Z")
    choice = jobs.choose_pod(_job([]), [newer, older])
    assert choice.start is not None and choice.start.name == "p-older"
    assert choice.start.uid == "uid-p-older"
    assert choice.held == ("p-newer",)
    observed = jobs.observe_job(_job([]), [newer, older])
    assert observed is not None and observed.start_pod == choice.start
    assert observed.held_pods == ("p-newer",)


def test_no_second_pod_starts_once_one_has() -> None:
    running = _let_go(_waiting("p-first", "2026-11-22T09:00:01Z"))
    second = _waiting("p-second", "2026-11-22T09:00:00Z")  # older, but the other runs
    choice = jobs.choose_pod(_job([]), [running, second])
    assert choice.start is None and choice.held == ("p-second",)
    # Let start by this process, not yet in the view: still none other.
    first = _waiting("p-first", "2026-11-22T09:00:00Z")
    again = jobs.choose_pod(_job([]), [first, second], started="uid-p-first")
    assert again.start is None and again.held == ("p-second",)
    # That pod being deleted: it may be running; no other starts.
    going = _let_go(first)
    going["metadata"]["deletionTimestamp"] = "2026-11-22T09:00:09Z"
    assert jobs.choose_pod(_job([]), [going, second]).start is None
    # Gone, and the Job counts it as ended: it may have run; no other starts.
    job = _job([])
    job["status"]["failed"] = 1
    assert jobs.choose_pod(job, [second]).start is None
    job["status"] = {"uncountedTerminatedPods": {"failed": ["uid-x"]}}
    assert jobs.choose_pod(job, [second]).start is None
    # Gone, and the Job's count of it not seen yet (Jobs and pods come by two watches): this
    # process let it start, so no other starts.
    after = jobs.choose_pod(_job([]), [second], started="uid-p-first")
    assert after.start is None and after.held == ("p-second",)


def test_only_a_pod_that_runs_the_template_is_let_start() -> None:
    other = _waiting("p-other", "2026-11-22T09:00:00Z", hostPID=True)
    own = _waiting("p-own", "2026-11-22T09:00:01Z")
    choice = jobs.choose_pod(_job([]), [other, own])
    assert choice.start is not None and choice.start.name == "p-own"
    assert jobs.choose_pod(_job([]), [other]).start is None
    deleting = _waiting("p-going", "2026-11-22T09:00:00Z")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-22T09:00:02Z"
    assert jobs.choose_pod(_job([]), [deleting]).start is None
    finished = _job([{"type": "Complete", "status": "True"}])
    assert jobs.choose_pod(finished, [own]) == jobs.PodChoice()


def test_the_view_keeps_what_tells_whether_a_pod_was_let_start() -> None:
    kept = jobs.pod_essentials(_let_go(_waiting("p", "2026-11-22T09:00:00Z")))
    assert kept["nodeName"] == "node-1" and "schedulingGates" not in kept
    held = jobs.pod_essentials(_waiting("p", "2026-11-22T09:00:00Z"))
    assert held["schedulingGates"] == [{"name": s.POD_GATE}]
