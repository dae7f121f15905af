"""``kubectl agentrun logs RUN STEP``: which pod holds the log of a step attempt. Pure: the
command reads the run, the Job and the pods, and these choose.

A step attempt runs as a Job of its own, named in ``status.steps[].jobName`` for the current
attempt and by :func:`agentrun.core.naming.job_name` for earlier ones; its pod carries the
Job's ``batch.kubernetes.io/controller-uid`` label. A model turn of an agent run sent to the
run's executor (``status.steps[].executorPod``: the executor pod's uid) has no Job: it ran on
the executor's pod, whose log holds every turn that pod served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.api import models as m
from agentrun.core.naming import job_name

JOB_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
"""The labels the Job controller puts the Job's uid in on its pods (the second before 1.27)."""
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
STEP_CONTAINER = "step"
"""The container of a step's pod (:data:`agentrun.execution.jobs.CONTAINER_NAME`)."""


class NoLog(Exception):
    """Why there is no log to show, in words a person can act on."""


@dataclass(frozen=True)
class Source:
    """Where one step attempt ran."""

    step: str
    attempt: int
    job_name: str
    """The attempt's Job (for an attempt on the executor: the attempt's own name)."""
    executor_uid: str | None = None
    """The uid of the executor pod the attempt ran on; None: it ran as a Job of its own."""


def source(run: m.AgentRun, step: str, attempt: int | None) -> Source:
    """Where attempt ``attempt`` (default: the current or last one) of ``step`` ran."""
    ref = f"agentrun/{run.metadata.name}"
    steps = {st.name: st for st in (run.status.steps if run.status else None) or []}
    st = steps.get(step)
    if st is None:
        planned = [s.name for s in run.spec.plan.steps]
        if step in planned:
            raise NoLog(f"step '{step}' of {ref} has not started yet: it has no log")
        known = ", ".join([*planned, *(n for n in steps if n not in planned)]) or "none"
        raise NoLog(f"step '{step}' is not a step of {ref} (steps: {known})")
    if not st.attempt:
        raise NoLog(f"step '{step}' of {ref} has not started yet (phase {st.phase}): no log")
    wanted = st.attempt if attempt is None else attempt
    if not 1 <= wanted <= st.attempt:
        raise NoLog(
            f"step '{step}' of {ref} has no attempt {wanted}: its attempts are 1 to {st.attempt}"
        )
    if wanted == st.attempt:
        name = st.job_name or job_name(run.metadata.name, run.metadata.uid, step, wanted)
        return Source(step, wanted, name, st.executor_pod)
    return Source(step, wanted, job_name(run.metadata.name, run.metadata.uid, step, wanted))


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def newest(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod created last (a Job that retried its pod has several)."""
    return max(pods, key=_created, default=None)


def pods_of_job(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The pods among ``pods`` that the Job controls: by its uid label, else by its name."""
    meta = job.get("metadata") or {}
    uid, name = meta.get("uid"), meta.get("name")

    def labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
        return (pod.get("metadata") or {}).get("labels") or {}

    by_uid = [p for p in pods if uid and any(labels(p).get(k) == uid for k in JOB_UID_LABELS)]
    return by_uid or [p for p in pods if any(labels(p).get(k) == name for k in JOB_NAME_LABELS)]


def pod_with_uid(pods: Sequence[Mapping[str, Any]], uid: str) -> Mapping[str, Any] | None:
    return next((p for p in pods if (p.get("metadata") or {}).get("uid") == uid), None)


def container(pod: Mapping[str, Any], wanted: str | None) -> str | None:
    """The container to read: ``wanted``, else the step's, else the only (or first) one."""
    names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or []]
    if wanted is not None:
        if names and wanted not in names:
            pod_name = (pod.get("metadata") or {}).get("name")
            raise NoLog(
                f"pod {pod_name} has no container '{wanted}' (containers: {', '.join(names)})"
            )
        return wanted
    if STEP_CONTAINER in names:
        return STEP_CONTAINER
    return names[0] if names else None


def phase_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")
