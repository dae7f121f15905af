"""Step Jobs built from the core's CreateJob, and their outcome read back."""

from __future__ import annotations

from typing import Any

from agentrun import jobs, objects
from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import CreateJob, JobState
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


def _job(conditions: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "labels": {s.LABEL_STEP: "a", s.LABEL_ATTEMPT: "1"}, **meta},
        "status": {"conditions": conditions, "startTime": "2026-11-22T09:00:00Z"},
    }


def _pod(message: str | None, code: int, finished: str = "2026-11-22T09:00:05Z") -> dict[str, Any]:
    return {
        "status": {
            "containerStatuses": [
                {
                    "name": "step",
                    "state": {
                        "terminated": {"exitCode": code, "message": message, "finishedAt": finished}
                    },
                }
            ]
        }
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
