"""Step Jobs: build them from the core's CreateJob, and read their outcome back.

Pure functions over plain dicts (the JSON the API server speaks), so they are tested without a
cluster; the reconciler does the I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import CreateJob, JobState, ObservedJob, PodRef
from agentrun.core.turns import EXECUTOR_STEP, is_model_turn
from agentrun.execution import proof
from agentrun.execution.objects import RunRef, owner_reference, run_labels

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


def _env(run: m.AgentRun, action: CreateJob, token_sha256: str | None) -> list[dict[str, Any]]:
    identity: dict[str, str] = {
        s.ENV_RUN: run.metadata.name,
        s.ENV_NAMESPACE: run.metadata.namespace,
        s.ENV_RUN_UID: run.metadata.uid,
        s.ENV_STEP: action.step.name,
        s.ENV_ATTEMPT: str(action.attempt),
        s.ENV_IDEMPOTENCY_KEY: action.idempotency_key,
    }
    if token_sha256 is not None:  # a model turn: its key comes with its request
        del identity[s.ENV_IDEMPOTENCY_KEY]
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in identity.items()]
    env += [e.to_wire() for e in action.step.container.env or []]
    env += [e.to_wire() for e in action.input_env]
    if token_sha256 is not None:
        token_env = (
            s.ENV_EXECUTOR_TOKEN_SHA256
            if action.step.name == EXECUTOR_STEP
            else s.ENV_TURN_TOKEN_SHA256
        )
        env += [
            {"name": token_env, "value": token_sha256},
            {
                "name": s.ENV_POD_IP,
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
            },
        ]
    return env


def takes_request(run: m.AgentRun, step: str) -> bool:
    """Whether the step's pod takes its input by request: an agent run's model turn, or its
    executor."""
    return run.spec.agent is not None and (is_model_turn(step) or step == EXECUTOR_STEP)


def step_job(run: m.AgentRun, action: CreateJob, key: bytes) -> dict[str, Any]:
    """The Job of one step attempt as the operator creates it: :func:`build_job`, with the
    sha256 of the turn's one-time token for a model turn, or of the executor's token for a
    run's executor (:func:`takes_request`)."""
    token = None
    if takes_request(run, action.step.name):
        make = proof.executor_token if action.step.name == EXECUTOR_STEP else proof.turn_token
        token = hashlib.sha256(make(key, run.metadata.uid, action.job_name).encode()).hexdigest()
    return build_job(run, action, token)


def build_job(
    run: m.AgentRun, action: CreateJob, token_sha256: str | None = None
) -> dict[str, Any]:
    """The Job of one step attempt. ``token_sha256``: a model turn's, whose pod waits on its
    address for a request carrying the token (:mod:`agentrun.pod.llm`)."""
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
        "env": _env(run, action, token_sha256),
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
    # Held until the operator lets one pod of the attempt start (choose_pod): a second pod the
    # Job controller makes for the same attempt (a pod create it lost the answer to) never runs.
    pod_spec["schedulingGates"] = [{"name": s.POD_GATE}]
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


def with_shard_label(manifest: dict[str, Any], value: str) -> dict[str, Any]:
    """``manifest`` (a step Job's, changed in place) labelled ``agentrun.dev/shard`` ``value``,
    the Job and its pod template: replicas that share the runs watch only their shards' Jobs
    and pods by it. No proof or check covers it (:func:`proof.without_shard_label`)."""
    manifest["metadata"]["labels"] = {**manifest["metadata"]["labels"], s.LABEL_SHARD: value}
    template_meta = manifest["spec"]["template"]["metadata"]
    template_meta["labels"] = {**template_meta["labels"], s.LABEL_SHARD: value}
    return manifest


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


def is_held(job: Mapping[str, Any]) -> bool:
    """Whether the Job still holds the operator's outcome finalizer (not released yet)."""
    return s.JOB_FINALIZER in ((job.get("metadata") or {}).get("finalizers") or ())


def has_ttl(job: Mapping[str, Any]) -> bool:
    """Whether the Job has ``ttlSecondsAfterFinished`` (the TTL controller deletes it that long
    after it finished: set by the operator's release)."""
    return (job.get("spec") or {}).get("ttlSecondsAfterFinished") is not None


def pod_ended(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has ended (Succeeded or Failed) or its step container terminated."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or step_terminated(pod) is not None


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


DUPLICATE_POD = "DuplicatePod"
"""The reason of the Warning about a second pod of one attempt, held and never started."""
UNTRUSTED_POD = "UntrustedPod"
"""The reason of an attempt whose Job finished by a pod that does not run its template."""

_HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace")


def _containers(spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("name")): c for c in spec.get("containers") or []}


def _image_matches(wanted: Any, found: Any) -> bool:
    """The same image, or the same tag pinned to a digest (as image-verifying admission
    webhooks rewrite it)."""
    return found == wanted or (isinstance(found, str) and found.startswith(f"{wanted}@sha256:"))


def _holds(wanted: Any, found: Any) -> bool:
    """Every field ``wanted`` sets is in ``found`` with the same value; ``found`` may set more
    (admission that adds security settings, e.g. an SELinux context or a group)."""
    if wanted is None:
        return True
    if isinstance(wanted, Mapping):
        given = found if isinstance(found, Mapping) else {}
        return all(_holds(value, given.get(key)) for key, value in wanted.items())
    return bool(wanted == found)


def _env_problem(wanted: list[Mapping[str, Any]], found: list[Mapping[str, Any]]) -> str | None:
    """Every variable of the template is there, once, with its value; others may be added
    (admission webhooks add some, e.g. for workload identity)."""
    for var in wanted:
        same_name = [e for e in found if e.get("name") == var.get("name")]
        if same_name != [var]:
            return f"its environment variable {var.get('name')} differs from the Job's template"
    return None


_POD_FIELDS = (
    "serviceAccountName",
    "securityContext",
    *_HOST_NAMESPACES,
    "schedulingGates",
    "nodeName",
)
_STEP_FIELDS = ("name", "image", "command", "args", "workingDir", "securityContext", "env")


def pod_essentials(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod's spec that :func:`pod_problem` reads (what a watch cache keeps)."""
    spec = pod.get("spec") or {}
    found = _containers(spec).get(CONTAINER_NAME)
    kept: dict[str, Any] = {k: spec[k] for k in _POD_FIELDS if k in spec}
    if found is not None:
        kept["containers"] = [{k: found[k] for k in _STEP_FIELDS if k in found}]
    return kept


def pod_problem(job: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """Why a pod the Job controls does not run the Job's template, None when it does.

    The Job controller counts every pod that carries the Job's selector labels, and adopts one
    made by someone else (who may create pods, or add labels to their own). Such a pod runs
    whatever its maker chose, so its outcome must not stand for the step's. A pod counts when
    its step container runs the template's image, command, arguments and working directory,
    with the template's environment variables and security settings, and the pod runs as the
    template's ServiceAccount with its pod security settings, sharing no host namespace. What
    admission adds to pods (a ServiceAccount token volume, default resources, variables and
    volumes of workload identity, security settings the template leaves open) is allowed."""
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    spec = pod.get("spec") or {}
    wanted = _containers(template).get(CONTAINER_NAME)
    if wanted is None:
        return "its Job has no step container to compare it with"
    found = _containers(spec).get(CONTAINER_NAME)
    if found is None:
        return f"it has no container named {CONTAINER_NAME}"
    if not _image_matches(wanted.get("image"), found.get("image")):
        return f"it runs image {found.get('image')}, not the Job's {wanted.get('image')}"
    for key in ("command", "args", "workingDir"):
        if found.get(key) != wanted.get(key):
            return f"its step container's {key} differs from the Job's template"
    if not _holds(wanted.get("securityContext"), found.get("securityContext")):
        return "its step container's securityContext differs from the Job's template"
    env_problem = _env_problem(wanted.get("env") or [], found.get("env") or [])
    if env_problem:
        return env_problem
    account = spec.get("serviceAccountName") or "default"
    if account != (template.get("serviceAccountName") or "default"):
        return f"it runs as ServiceAccount {account}, not the Job's"
    if not _holds(template.get("securityContext"), spec.get("securityContext")):
        return "its pod securityContext differs from the Job's template"
    shared = [key for key in _HOST_NAMESPACES if spec.get(key)]
    if shared:
        return f"it sets {', '.join(shared)}"
    return None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still waits for the operator to let it start (its ``schedulingGates``
    hold :data:`agentrun.settings.POD_GATE` and no node was given to it)."""
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    return not spec.get("nodeName") and any(g.get("name") == s.POD_GATE for g in gates)


@dataclass(frozen=True)
class PodChoice:
    """Which pod of an attempt's Job may start, and which are held for good."""

    start: PodRef | None = None
    """The pod to let start; None when one has started already, or none may."""
    held: tuple[str, ...] = ()
    """Names of the Job's other pods that run its template and wait: duplicates of the
    attempt (the Job controller made a second pod), never started."""


def _ended_pods(job: Mapping[str, Any]) -> bool:
    """Whether the Job controller counted a pod of the Job as ended (it may have run)."""
    status = job.get("status") or {}
    uncounted = status.get("uncountedTerminatedPods") or {}
    return bool(status.get("succeeded") or status.get("failed") or any(uncounted.values()))


def _created(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def choose_pod(
    job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], started: str | None = None
) -> PodChoice:
    """The one pod of an attempt that may run its command. Every step pod is created gated
    (:data:`agentrun.settings.POD_GATE`); the operator lets the oldest waiting pod that runs
    the Job's template start, and only while no pod of the Job has been let start and the
    Job counts none as ended. ``started``: the uid of a pod this process let start (the view
    may not show so yet, or show it gone before the Job's count of it, which a watch of Jobs
    brings apart from the pods'): then no other pod starts, even if that one is gone. Pure."""
    if is_finished(job):
        return PodChoice()
    present = [p for p in pods if pod_problem(job, p) is None]
    waiting = sorted(
        (
            p
            for p in present
            if is_gated(p)
            and not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("metadata") or {}).get("uid") != started
        ),
        key=_created,
    )
    begun = started is not None or any(not is_gated(p) for p in present)
    held = tuple(_created(p)[1] for p in waiting)
    if begun or _ended_pods(job) or not waiting:
        return PodChoice(None, held)
    first = waiting[0]
    meta = first.get("metadata") or {}
    return PodChoice(PodRef(str(meta.get("name") or ""), str(meta.get("uid") or "")), held[1:])


POD_LOST = "PodLost"
"""The reason of an attempt whose Job reports success that none of its own pods confirms."""


def _own_outcome(
    job: Mapping[str, Any], pods: list[Mapping[str, Any]] | None
) -> tuple[JobState, str | None, str | None, Mapping[str, Any] | None]:
    """State, reason, message and terminated step container of a Job. A success counts only
    when one of the Job's pods that run its template (:func:`pod_problem`) ended with exit
    code 0: a pod someone else made and the Job controller counted can end a Job, and a Job's
    end stops its own pod. ``pods`` None: the pods were not looked at, the conditions tell."""
    state, reason, message = _terminal_condition(job)
    if pods is None:
        return state, reason, message, None
    if state == JobState.ACTIVE:
        return _ended_early(job, pods)
    checked = [(p, pod_problem(job, p)) for p in pods]
    foreign = [(p, problem) for p, problem in checked if problem is not None]
    terminated = _terminated([p for p, problem in checked if problem is None])
    if terminated is not None:
        ok = terminated.get("exitCode") == 0
        if not foreign and ok == (state == JobState.SUCCEEDED):
            return state, reason, message, terminated
        return (JobState.SUCCEEDED if ok else JobState.FAILED), None, None, terminated
    if foreign:
        pod, problem = foreign[0]
        name = (pod.get("metadata") or {}).get("name", "")
        text = (
            f"the Job ended by pod {name}, which does not run the step ({problem}); "
            "no pod of the step's own ran to its end"
        )
        return JobState.FAILED, UNTRUSTED_POD, text, None
    if state == JobState.SUCCEEDED:
        text = (
            "the Job reports success, but none of its own pods is seen to have ended: they were "
            "deleted, or a pod someone else made ended the Job and left again"
        )
        return JobState.FAILED, POD_LOST, text, None
    return state, reason, message, None


def _ended_early(
    job: Mapping[str, Any], pods: list[Mapping[str, Any]]
) -> tuple[JobState, str | None, str | None, Mapping[str, Any] | None]:
    """The success of a Job the Job controller has not marked Complete yet, from its own pod.

    A step Job has one pod that may run (``backoffLimit`` 0, ``restartPolicy`` Never, every
    other pod held by the scheduling gate), so once that pod has succeeded, the Job's end is
    decided: the Job controller only writes it down, after batching pod updates for up to a
    second. The step succeeded when its own pod (one that runs the Job's template,
    :func:`pod_problem`) is Succeeded with exit code 0. Failures wait for the Job's own
    condition (which says why: a deadline, a deletion), and so does every Job with a pod
    someone else made or a condition that it is failing (``FailureTarget``)."""
    succeeded = next(
        (
            terminated
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Succeeded"
            and not is_gated(pod)
            and (terminated := step_terminated(pod)) is not None
            and terminated.get("exitCode") == 0
        ),
        None,
    )
    if succeeded is None:  # the common case while it runs: no pod compared with the template
        return JobState.ACTIVE, None, None, None
    failing = any(
        cond.get("type") == "FailureTarget" and cond.get("status") == "True"
        for cond in (job.get("status") or {}).get("conditions") or []
    )
    if failing or any(pod_problem(job, p) is not None for p in pods):
        return JobState.ACTIVE, None, None, None
    return JobState.SUCCEEDED, None, None, succeeded


def _running_pod(job: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The Job's own pod that was let start and runs, or an empty mapping."""
    for pod in pods:
        status = pod.get("status") or {}
        if (
            status.get("phase") == "Running"
            and not is_gated(pod)
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and pod_problem(job, pod) is None
        ):
            return pod
    return {}


def _step_running_since(pod_status: Mapping[str, Any]) -> datetime | None:
    """When the step container of a running pod started running (the kubelet's clock)."""
    for cs in pod_status.get("containerStatuses") or []:
        if cs.get("name") == CONTAINER_NAME:
            return _time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    return None


def _pod_lost(pods: list[Mapping[str, Any]], started: str | None) -> bool:
    """Whether the pod with uid ``started`` (the one let start) has ended, is being deleted
    or is no longer there."""
    if started is None:
        return False
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("uid") == started:
            phase = (pod.get("status") or {}).get("phase")
            return bool(meta.get("deletionTimestamp")) or phase in ("Succeeded", "Failed")
    return True


def observe_job(
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]] | None,
    *,
    pod_refused: str | None = None,
    started: str | None = None,
) -> ObservedJob | None:
    """What the core needs to know of a step Job; None for a Job that is not a step Job.
    ``pods`` must be the Job's (controlled by it); only those that run its template tell the
    outcome (:func:`pod_problem`); None when they were not looked at (the Job's conditions
    alone, for a guess). ``pod_refused``: why the API server refused its pod, if it
    did and the Job has none. ``started``: the uid of the pod this process let start, if any
    (:func:`choose_pod`)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        step = labels[s.LABEL_STEP]
        attempt = int(labels[s.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
    listed = None if pods is None else list(pods)
    state, reason, message, terminated = _own_outcome(job, listed)
    choice = choose_pod(job, listed, started) if listed is not None else PodChoice()
    status = job.get("status") or {}
    pod = _running_pod(job, listed) if state == JobState.ACTIVE and listed else {}
    running = pod.get("status") or {}
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
        held=is_held(job),
        expires=has_ttl(job),
        deleting=bool(meta.get("deletionTimestamp")),
        deleted_at=_time(meta.get("deletionTimestamp")),
        pod_refused=pod_refused if state == JobState.ACTIVE else None,
        start_pod=choice.start if state == JobState.ACTIVE else None,
        address=str(running["podIP"]) if running.get("podIP") else None,
        pod_uid=str((pod.get("metadata") or {}).get("uid") or "") or None,
        running_since=_step_running_since(running),
        held_pods=choice.held,
        pod_lost=state == JobState.ACTIVE and listed is not None and _pod_lost(listed, started),
    )
