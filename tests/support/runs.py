"""AgentRuns for tests against a cluster: building them, creating them, reading them.

Steps are ``sh -c`` busybox scripts (run as local processes by the stand-in node, or as real
containers on a real cluster); :func:`envelope` is the script that reports a result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.settings import LABEL_KIND, LABEL_RUN_UID
from agentrun_devcluster.testing import KubeClients

IMAGE = "busybox:1.36"
TIMEOUT = 120.0
"""Seconds a run may take to get somewhere; generous: nothing asserts on speed."""
TERMINAL = ("Succeeded", "Failed", "Cancelled")

Run = dict[str, Any]


# -- building runs --------------------------------------------------------------------------


def envelope(summary: str, result: Any = None, tokens: int | None = None) -> str:
    """A ``sh`` command writing a result envelope to the termination log."""
    data: dict[str, Any] = {"ok": True, "summary": summary}
    if result is not None:
        data["result"] = result
    if tokens is not None:
        data["usage"] = {"tokens": tokens}
    text = json.dumps(data)
    assert "'" not in text, f"the envelope cannot be single-quoted for sh: {text}"
    return f"printf '%s' '{text}' > /dev/termination-log"


def step(
    name: str,
    script: str | None = None,
    *,
    command: Sequence[str] | None = None,
    after: Iterable[str] = (),
    **fields: Any,
) -> dict[str, Any]:
    """A plan step running ``sh -c script`` (or ``command``; neither: the image's own)."""
    container: dict[str, Any] = {"image": IMAGE}
    if script is not None:
        container["command"] = ["sh", "-c", script]
    elif command is not None:
        container["command"] = list(command)
    spec: dict[str, Any] = {"name": name, "container": container, **fields}
    deps = list(after)
    if deps:
        spec["dependsOn"] = deps
    return spec


def agentrun(
    name: str, steps: list[dict[str, Any]], *, goal: str | None = None, **spec: Any
) -> Run:
    """An AgentRun named ``name`` with these plan steps; ``spec`` adds other spec fields."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"goal": goal or f"e2e test {name}", "plan": {"steps": steps}, **spec},
    }


# -- creating, changing and reading runs -------------------------------------------------------


def create(kube: KubeClients, namespace: str, run: Run) -> Run:
    created: Run = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, run
    )
    return created


def get(kube: KubeClients, namespace: str, name: str) -> Run:
    run: Run = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return run


def gone(kube: KubeClients, namespace: str, name: str) -> bool:
    """The run no longer exists (its finalizer released)."""
    try:
        get(kube, namespace, name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def delete(kube: KubeClients, namespace: str, name: str) -> None:
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def patch_spec(kubectl: Callable[..., Any], namespace: str, name: str, **spec: Any) -> None:
    """``kubectl patch --type=merge`` of the run's spec, as a user changes it."""
    kubectl(
        "-n", namespace, "patch", f"agentrun/{name}", "--type=merge",
        "-p", json.dumps({"spec": spec}),
    )  # fmt: skip


def status_of(run: Run) -> dict[str, Any]:
    status: dict[str, Any] = run.get("status") or {}
    return status


def launch_messages(run: Run) -> dict[str, str]:
    """Each step's message when its last attempt was launched, by step (the history's
    Launching transitions, which say where: a Job, or the run's executor)."""
    return {
        str(t["step"]): t.get("message") or ""
        for t in status_of(run).get("history") or []
        if t.get("reason") == "Launching" and t.get("step")
    }


def step_status(run: Run, name: str) -> dict[str, Any]:
    """The status of step ``name`` (empty if the run's status does not list it yet)."""
    for st in status_of(run).get("steps") or []:
        if st["name"] == name:
            found: dict[str, Any] = st
            return found
    return {}


def condition(run: Run, ctype: str = "Succeeded") -> dict[str, Any]:
    for cond in status_of(run).get("conditions") or []:
        if cond["type"] == ctype:
            found: dict[str, Any] = cond
            return found
    return {}


def timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- what a run owns ----------------------------------------------------------------------------


def jobs_of(kube: KubeClients, namespace: str, uid: str) -> list[Any]:
    """The step Jobs of the run with this uid."""
    items: list[Any] = kube.batch.list_namespaced_job(
        namespace, label_selector=f"{LABEL_RUN_UID}={uid}"
    ).items
    return items


def audit_record(kube: KubeClients, namespace: str, uid: str) -> list[Any]:
    """The ConfigMaps of the audit record of the run with this uid."""
    items: list[Any] = kube.core.list_namespaced_config_map(
        namespace, label_selector=f"{LABEL_RUN_UID}={uid},{LABEL_KIND}=audit"
    ).items
    return items


def run_events(kube: KubeClients, namespace: str, name: str) -> list[Any]:
    """The Events about AgentRun ``name``."""
    events = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.involved_object.kind == "AgentRun"]


def event_reasons(kube: KubeClients, namespace: str, name: str) -> set[str]:
    """The reasons of the Events about AgentRun ``name``."""
    return {e.reason for e in run_events(kube, namespace, name)}
