"""Deleting a run never hangs: the finalizer is released within a bounded time even when
something the run owns cannot be removed, and an Event says what was left."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.settings import LABEL_RUN_UID
from agentrun_devcluster.testing import wait_for

FOREIGN = "example.com/hold"


def test_finalizer_is_released_when_cleanup_keeps_failing(
    kube: Any, namespace: str, start_operator: Any
) -> None:
    start_operator(env={"AGENTRUN_CLEANUP_TIMEOUT_SECONDS": "5"})
    body = {
        "apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": {"name": "held"},
        "spec": {"goal": "be deleted", "plan": {"steps": [{
            "name": "wait", "container": {"image": "busybox:1.36",
                                          "command": ["sh", "-c", "sleep 60"]}}]}},
    }  # fmt: skip
    run = kube.custom.create_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL,
                                                      body)  # fmt: skip
    selector = f"{LABEL_RUN_UID}={run['metadata']['uid']}"

    def job_name() -> str | None:
        items = kube.batch.list_namespaced_job(namespace, label_selector=selector).items
        return items[0].metadata.name if items else None

    name = wait_for("the step Job", job_name, timeout=90)
    assert name is not None
    job = kube.batch.read_namespaced_job(name, namespace)
    kube.batch.patch_namespaced_job(
        name, namespace, {"metadata": {"finalizers": [*job.metadata.finalizers, FOREIGN]}}
    )
    try:
        kube.custom.delete_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL,
                                                    "held")  # fmt: skip

        def run_gone() -> bool:
            try:
                kube.custom.get_namespaced_custom_object(m.GROUP, m.VERSION, namespace,
                                                         m.PLURAL, "held")  # fmt: skip
            except ApiException as error:
                return error.status == 404
            return False

        wait_for("the run's finalizer to be released", run_gone, timeout=90)

        def warning() -> str | None:
            for event in kube.core.list_namespaced_event(namespace).items:
                if event.reason == "CleanupIncomplete":
                    return str(event.message)
            return None

        message = wait_for("a CleanupIncomplete event", warning, timeout=30)
        assert message is not None and name in message and FOREIGN in message
    finally:
        kube.batch.patch_namespaced_job(name, namespace, {"metadata": {"finalizers": []}})
