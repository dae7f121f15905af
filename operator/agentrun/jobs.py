"""Step Jobs: build them from the core's CreateJob, and read their outcome back.

Pure functions over plain dicts (the JSON the API server speaks), so they are tested without a
cluster; the reconciler does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import CreateJob, JobState, ObservedJob
from agentrun.objects import RunRef, owner_reference, run_labels

CONTAINER_NAME = "step"
DEFAULT_USER = 65532
"""Step pods run as this non-root user unless stepTemplate says otherwise."""

RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": DEFAULT_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The restricted Pod Security Standard, pod level."""
RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The restricted Pod Security Standard, container level."""


def _env(run: m.AgentRun, action: CreateJob) -> list[dict[str, Any]]:
    identity = {
        s.ENV_RUN: run.metadata.name,
        s.ENV_NAMESPACE: run.metadata.namespace,
        s.ENV_RUN_UID: run.metadata.uid,
        s.ENV_STEP: action.step.name,
        s.ENV_ATTEMPT: str(action.attempt),
        s.ENV_IDEMPOTENCY_KEY: action.idempotency_key,
    }
    env = [{"name": k, "value": v} for k, v in identity.items()]
    env += [e.to_wire() for e in action.step.container.env or []]
    env += [e.to_wire() for e in action.input_env]
    return env


def build_job(run: m.AgentRun, action: CreateJob) -> dict[str, Any]:
    """The Job of one step attempt."""
    step = action.step
    template = run.spec.step_template or m.StepTemplate()
    resources = step.container.resources or template.resources
    labels = {
        **run_labels(RunRef.of(run)),
        s.LABEL_STEP: step.name,
        s.LABEL_ATTEMPT: str(action.attempt),
        s.LABEL_KIND: "step-job",
    }
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": step.container.image,
        "env": _env(run, action),
        "securityContext": template.container_security_context or RESTRICTED_CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if step.container.command:
        container["command"] = list(step.container.command)
    if step.container.args:
        container["args"] = list(step.container.args)
    if step.container.working_dir:
        container["workingDir"] = step.container.working_dir
    if resources is not None:
        container["resources"] = resources.to_wire()
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "securityContext": template.security_context or RESTRICTED_POD_SECURITY,
        "automountServiceAccountToken": template.service_account_name is not None,
    }
    if template.service_account_name:
        pod_spec["serviceAccountName"] = template.service_account_name
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,  # retries are the operator's: each attempt is its own Job
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if step.timeout_seconds:
        job_spec["activeDeadlineSeconds"] = step.timeout_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": action.job_name,
            "namespace": run.metadata.namespace,
            "labels": labels,
            "annotations": {
                s.ANNOTATION_RUN_NAME: run.metadata.name,
                f"{s.ANNOTATION_PREFIX}/idempotency-key": action.idempotency_key,
                f"{s.ANNOTATION_PREFIX}/args-hash": action.args_hash,
            },
            "finalizers": [s.JOB_FINALIZER],
            "ownerReferences": [owner_reference(RunRef.of(run))],
        },
        "spec": job_spec,
    }


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def _terminal_condition(job: Mapping[str, Any]) -> tuple[JobState, str | None, str | None]:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return JobState.SUCCEEDED, cond.get("reason"), cond.get("message")
        if cond.get("type") == "Failed":
            return JobState.FAILED, cond.get("reason"), cond.get("message")
    return JobState.ACTIVE, None, None


def job_state(job: Mapping[str, Any]) -> JobState:
    """Active, or how the Job ended (its True Complete or Failed condition)."""
    return _terminal_condition(job)[0]


def is_finished(job: Mapping[str, Any]) -> bool:
    """Whether the Job has ended (a True Complete or Failed condition)."""
    return job_state(job) != JobState.ACTIVE


def step_terminated(pod: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The terminated state of a pod's step container, None while it has not terminated."""
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER_NAME:
            terminated: Mapping[str, Any] | None = (cs.get("state") or {}).get("terminated")
            return terminated or None
    return None


def _terminated(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The terminated state of the step container of the newest finished pod."""
    best: tuple[str, Mapping[str, Any]] | None = None
    for pod in pods:
        terminated = step_terminated(pod)
        if terminated:
            stamp = str(terminated.get("finishedAt") or "")
            if best is None or stamp > best[0]:
                best = (stamp, terminated)
    return best[1] if best else None


def observe_job(
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    *,
    pod_refused: str | None = None,
) -> ObservedJob | None:
    """What the core needs to know of a step Job; None for a Job that is not a step Job.
    ``pods`` must be the Job's own (controlled by it); ``pod_refused``: why the API server
    refused its pod, if it did and the Job has none."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        step = labels[s.LABEL_STEP]
        attempt = int(labels[s.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
    state, reason, message = _terminal_condition(job)
    status = job.get("status") or {}
    terminated = _terminated(pods) if state != JobState.ACTIVE else None
    return ObservedJob(
        name=meta.get("name", ""),
        step=step,
        attempt=attempt,
        state=state,
        termination_message=(terminated or {}).get("message"),
        exit_code=(terminated or {}).get("exitCode"),
        reason=reason,
        message=message,
        started_at=_time(status.get("startTime")),
        finished_at=_time(status.get("completionTime"))
        or _time((terminated or {}).get("finishedAt")),
        held=s.JOB_FINALIZER in (meta.get("finalizers") or []),
        expires=(job.get("spec") or {}).get("ttlSecondsAfterFinished") is not None,
        deleting=bool(meta.get("deletionTimestamp")),
        deleted_at=_time(meta.get("deletionTimestamp")),
        pod_refused=pod_refused if state == JobState.ACTIVE else None,
    )
