"""Deleting a run never hangs: the finalizer is released within a bounded time even when
something the run owns cannot be removed, and an Event says what was left."""

from __future__ import annotations

from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.cluster import StartOperator
from tests.support.runs import agentrun, create, delete, gone, jobs_of, step

FOREIGN = "example.com/hold"


def test_finalizer_is_released_when_cleanup_keeps_failing(
    kube: KubeClients, namespace: str, start_operator: StartOperator
) -> None:
    start_operator(env={"AGENTRUN_CLEANUP_TIMEOUT_SECONDS": "5"})
    run = create(kube, namespace, agentrun("held", [step("wait", "sleep 60")], goal="be deleted"))
    uid = run["metadata"]["uid"]

    def job_name() -> str | None:
        items = jobs_of(kube, namespace, uid)
        return items[0].metadata.name if items else None

    name = wait_for("the step Job", job_name, timeout=90)
    assert name is not None
    job = kube.batch.read_namespaced_job(name, namespace)
    kube.batch.patch_namespaced_job(
        name, namespace, {"metadata": {"finalizers": [*job.metadata.finalizers, FOREIGN]}}
    )
    try:
        delete(kube, namespace, "held")
        wait_for("the run's finalizer to be released", lambda: gone(kube, namespace, "held"), 90)

        def warning() -> str | None:
            for event in kube.core.list_namespaced_event(namespace).items:
                if event.reason == "CleanupIncomplete":
                    return str(event.message)
            return None

        message = wait_for("a CleanupIncomplete event", warning, timeout=30)
        assert message is not None and name in message and FOREIGN in message
    finally:
        kube.batch.patch_namespaced_job(name, namespace, {"metadata": {"finalizers": []}})
