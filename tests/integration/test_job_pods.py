"""Pods a step Job counts: only those the Job controller made from the Job's template.

The Job controller counts every pod that carries a Job's selector label and adopts one that
nothing controls. Two defences, each checked against the real API server and Job controller:

* the operator reads an outcome only from pods that run the Job's template
  (``agentrun.execution.jobs.pod_problem``): a pod the Job controller really made from a step Job
  passes,
  as the API server admitted it and as the operator's watch cache keeps it;
* the agentrun-job-pods admission policy (manifests/admission/job-pods-policy.yaml) lets only
  the Job controller create a pod with that label, or set or change it, while Jobs still run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.core import CreateJob
from agentrun.execution import jobs
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.admission import policies_bound_to
from tests.support.cluster import bind_role, mint_user, user_subject
from tests.support.jobs import job_manifest
from tests.support.sim import make_run, step

SELECTOR_LABEL = "batch.kubernetes.io/controller-uid"
POD_MAKER = "pod-maker"


def _step_job(namespace: str, **template: Any) -> dict[str, Any]:
    """The Job the operator builds for attempt 1 of a one-step run (``template``: the run's
    stepTemplate), without the owner reference (no run exists here) or finalizer."""
    spec: dict[str, Any] = {"stepTemplate": template} if template else {}
    run = make_run([step("a")], **spec)
    found = run.step("a")
    assert found is not None
    job = jobs.build_job(run, CreateJob(found, 1, "step-a-1", "key", "hash"))
    job["metadata"]["namespace"] = namespace
    for key in ("ownerReferences", "finalizers"):
        job["metadata"].pop(key)
    return job


def _pod_of(kube: KubeClients, namespace: str, job_uid: str) -> dict[str, Any]:
    def made() -> dict[str, Any] | None:
        pods = kube.core.list_namespaced_pod(
            namespace, label_selector=f"{SELECTOR_LABEL}={job_uid}"
        ).items
        return kube.core.api_client.sanitize_for_serialization(pods[0]) if pods else None

    return wait_for("the Job controller to make the Job's pod", made, timeout=60)


def test_a_pod_the_job_controller_made_runs_the_step_jobs_template(
    kube: KubeClients, namespace: str
) -> None:
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    for template in ({}, {"serviceAccountName": "agent", "securityContext": {"runAsUser": 1000}}):
        manifest = _step_job(namespace, **template)
        manifest["metadata"]["name"] = f"step-{len(template)}"
        created = kube.batch.create_namespaced_job(namespace, manifest)
        job = kube.core.api_client.sanitize_for_serialization(created)
        pod = _pod_of(kube, namespace, job["metadata"]["uid"])
        assert jobs.pod_problem(job, pod) is None, pod["spec"]
        # As the operator's watch cache keeps it.
        slim = {"metadata": pod["metadata"], "spec": jobs.pod_essentials(pod)}
        assert jobs.pod_problem(job, slim) is None
        # The same pod running another command is not the step's.
        forged = copy.deepcopy(pod)
        forged["spec"]["containers"][0]["command"] = ["sh", "-c", "echo forged"]
        assert jobs.pod_problem(job, forged) == (
            "its step container's command differs from the Job's template"
        )


# -- the admission policy ---------------------------------------------------------------------


@pytest.fixture
def pod_maker(
    cluster: TestCluster, kube: KubeClients, namespace: str, tmp_path: Path
) -> Iterator[KubeClients]:
    """A user who may create and change pods in the namespace (as the edit role allows), with
    the shipped admission policies bound to it."""
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "patch"]}]
    bind_role(kube, namespace, POD_MAKER, rules, [user_subject(POD_MAKER)])
    clients = KubeClients.from_kubeconfig(mint_user(cluster, POD_MAKER, [], tmp_path / "k"))

    def enforced() -> bool:
        try:
            clients.core.create_namespaced_pod(
                namespace, _pod("probe", {SELECTOR_LABEL: "0"}), dry_run="All"
            )
        except ApiException as refused:
            return refused.status == 403 and "agentrun-job-pods" in str(refused.body)
        return False

    with policies_bound_to(cluster, namespace, enforced):
        yield clients
    clients.close()


def _pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulingGates": [{"name": "never-scheduled"}],  # nothing runs it
            "restartPolicy": "Never",
            "containers": [{"name": "step", "image": "busybox:1.36", "command": ["true"]}],
        },
    }


def _refused(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def test_only_the_job_controller_makes_pods_with_a_jobs_selector_label(
    kube: KubeClients, namespace: str, pod_maker: KubeClients
) -> None:
    # A Job still gets its pod, made and labelled by the Job controller, and completes.
    kube.batch.create_namespaced_job(namespace, job_manifest("counted", ["true"]))
    job = kube.batch.read_namespaced_job("counted", namespace)
    pod = _pod_of(kube, namespace, job.metadata.uid)
    assert pod["metadata"]["labels"][SELECTOR_LABEL] == job.metadata.uid

    def complete() -> bool:
        done = kube.batch.read_namespaced_job("counted", namespace).status.succeeded
        return bool(done)

    wait_for("the Job to complete", complete, timeout=90)

    # Nobody else makes a pod the Job would count: not with the label, not the legacy one.
    for label in (SELECTOR_LABEL, "controller-uid"):
        forged = _pod("forged", {label: job.metadata.uid})
        said = _refused(lambda: pod_maker.core.create_namespaced_pod(namespace, forged))  # noqa: B023
        assert "only the Job controller may create a pod with the label" in said, said
    # Nor labels one of their own so, nor changes the label of a Job's pod.
    pod_maker.core.create_namespaced_pod(namespace, _pod("own", {"app": "mine"}))
    said = _refused(
        lambda: pod_maker.core.patch_namespaced_pod(
            "own", namespace, {"metadata": {"labels": {SELECTOR_LABEL: job.metadata.uid}}}
        )
    )
    assert "only the Job controller may set or change the label" in said, said
    name = pod["metadata"]["name"]
    _refused(
        lambda: pod_maker.core.patch_namespaced_pod(
            name, namespace, {"metadata": {"labels": {SELECTOR_LABEL: "other"}}}
        )
    )
    # Other changes to a Job's pod are someone's to make.
    pod_maker.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {"seen": "yes"}}})
    assert kube.core.read_namespaced_pod(name, namespace).metadata.labels["seen"] == "yes"
