"""Plain batch/v1 Jobs, for tests of the local node and control plane, and what anyone may do
to a step Job's pods."""

from __future__ import annotations

from typing import Any

from agentrun.settings import POD_GATE
from agentrun_devcluster.testing import KubeClients, wait_for

from .runs import IMAGE

TIMEOUT = 60.0


def job_manifest(
    name: str,
    command: list[str],
    *,
    image: str = IMAGE,
    backoff_limit: int = 0,
    active_deadline: int | None = None,
    env: list[dict[str, Any]] | None = None,
    env_from: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    termination_message_policy: str | None = None,
    labels: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    service_account: str | None = None,
    automount: bool | None = None,
    volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Job of one container ``main`` running ``command``, never restarted."""
    container: dict[str, Any] = {"name": "main", "image": image, "command": command}
    if env:
        container["env"] = env
    if env_from:
        container["envFrom"] = env_from
    if mounts:
        container["volumeMounts"] = mounts
    if termination_message_policy:
        container["terminationMessagePolicy"] = termination_message_policy
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if service_account:
        pod["serviceAccountName"] = service_account
    if automount is not None:
        pod["automountServiceAccountToken"] = automount
    if volumes:
        pod["volumes"] = volumes
    template: dict[str, Any] = {"spec": pod}
    if labels:
        template["metadata"] = {"labels": labels}
    spec: dict[str, Any] = {"backoffLimit": backoff_limit, "template": template}
    if active_deadline is not None:
        spec["activeDeadlineSeconds"] = active_deadline
    metadata: dict[str, Any] = {"name": name}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def job_pods(kube: KubeClients, namespace: str, job: str) -> list[Any]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"job-name={job}")
    return list(pods.items)


def terminated_container(
    kube: KubeClients, namespace: str, job: str, timeout: float = TIMEOUT
) -> tuple[Any, Any]:
    """Wait until a pod of the Job reports its container terminated: (pod, terminated state)."""

    def terminated() -> tuple[Any, Any] | None:
        for pod in job_pods(kube, namespace, job):
            for cs in pod.status.container_statuses or []:
                if cs.state and cs.state.terminated:
                    return pod, cs.state.terminated
        return None

    return wait_for(f"a terminated container of job {job}", terminated, timeout)


def run_job(
    kube: KubeClients, namespace: str, job: dict[str, Any], timeout: float = TIMEOUT
) -> tuple[Any, Any]:
    """Create ``job`` and wait for its container to terminate: (pod, terminated state)."""
    kube.batch.create_namespaced_job(namespace, job)
    return terminated_container(kube, namespace, job["metadata"]["name"], timeout)


def let_pods_start(client: KubeClients, namespace: str, job: str) -> int:
    """Remove the operator's scheduling gate from the pods of Job ``job``, as anyone who may
    patch pods can (the built-in ``edit`` role); how many were let go."""
    let_go = 0
    for pod in job_pods(client, namespace, job):
        gates = [g.name for g in pod.spec.scheduling_gates or []]
        if POD_GATE not in gates:
            continue
        where = gates.index(POD_GATE)
        patch = [
            {"op": "test", "path": f"/spec/schedulingGates/{where}/name", "value": POD_GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{where}"},
        ]
        client.core.patch_namespaced_pod(pod.metadata.name, namespace, patch)
        let_go += 1
    return let_go
