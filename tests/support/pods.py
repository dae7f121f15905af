"""Plain pods for the container suite: create one, wait for what its status says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun_devcluster.testing import KubeClients, wait_for

Pod = dict[str, Any]

#: The restricted Pod Security Standard, as a container's securityContext.
RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def container(name: str, image: str, script: str | None = None, **fields: Any) -> dict[str, Any]:
    """A container running ``sh -c script`` (or the image's own command)."""
    spec: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": "Never", **fields}
    if script is not None:
        spec["command"] = ["sh", "-c", script]
    return spec


def create_pod(
    kube: KubeClients,
    namespace: str,
    name: str,
    containers: list[dict[str, Any]],
    **spec: Any,
) -> Pod:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": containers, **spec},
    }
    return as_dict(kube, kube.core.create_namespaced_pod(namespace, body))


def as_dict(kube: KubeClients, obj: Any) -> dict[str, Any]:
    """An object of the typed client as the API's JSON."""
    data: dict[str, Any] = kube.api_client.sanitize_for_serialization(obj)
    return data


def read_pod(kube: KubeClients, namespace: str, name: str) -> Pod:
    return as_dict(kube, kube.core.read_namespaced_pod(name, namespace))


def wait_pod(
    kube: KubeClients,
    namespace: str,
    name: str,
    what: str,
    check: Callable[[Pod], bool],
    timeout: float = 90.0,
) -> Pod:
    """The pod, once ``check`` holds for it."""

    def ready() -> Pod | None:
        pod = read_pod(kube, namespace, name)
        return pod if check(pod) else None

    return wait_for(f"pod {namespace}/{name}: {what}", ready, timeout=timeout)


def finished(kube: KubeClients, namespace: str, name: str, timeout: float = 90.0) -> Pod:
    """The pod once it has Succeeded or Failed."""
    return wait_pod(
        kube,
        namespace,
        name,
        "Succeeded or Failed",
        lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        timeout,
    )


def status_of(pod: Pod, name: str, *, init: bool = False) -> dict[str, Any]:
    """The status of container ``name`` (empty if not reported yet)."""
    key = "initContainerStatuses" if init else "containerStatuses"
    for status in (pod.get("status") or {}).get(key) or []:
        if status["name"] == name:
            found: dict[str, Any] = status
            return found
    return {}


def terminated(pod: Pod, name: str, *, init: bool = False) -> dict[str, Any]:
    """``state.terminated`` of container ``name`` (empty if it has not terminated)."""
    state: dict[str, Any] = status_of(pod, name, init=init).get("state") or {}
    found: dict[str, Any] = state.get("terminated") or {}
    return found


def waiting(pod: Pod, name: str) -> dict[str, Any]:
    """``state.waiting`` of container ``name`` (empty if it is not waiting)."""
    state: dict[str, Any] = status_of(pod, name).get("state") or {}
    found: dict[str, Any] = state.get("waiting") or {}
    return found


def condition(pod: Pod, ctype: str) -> str:
    """The status (``True``/``False``) of the pod's condition ``ctype``, or ``""``."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return str(cond["status"])
    return ""
