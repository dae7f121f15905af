"""Forged step Jobs and pods never stand for a step (the trust model:
agentrun.observation.adoption).

Mallory may create Jobs and pods in the namespace and read runs, but not create or change
AgentRuns. A step Job's name is a function of (run name, run uid, step, attempt), so she can
compute the name of a step's next Job and create it first, running her own command, with or
without an owner reference naming the run as its controller, with or without the labels of a
step Job. The operator's create then meets AlreadyExists; it must not take her Job for the
step's:

* the attempt fails with reason JobNameTaken (the step has a retry, so attempt 2 runs under a
  new name, with the real command, and its result is the step's);
* a Warning Event on the run says that a Job not created by the operator holds the name;
* her Job is left alone: not deleted, no outcome finalizer;
* her command's output appears nowhere: not in status, not in the run's ConfigMaps (results,
  audit record).

The same holds for a step behind an approval. And a pod that only carries a real step Job's
name in its labels (and a finished status she wrote herself) is never read as that Job's pod;
nor is one that the Job controller adopted and counted because she gave it the Job's selector
label (without the agentrun-job-pods admission policy, which is not bound here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.core.naming import job_name
from agentrun.execution import jobs
from agentrun.settings import (
    JOB_FINALIZER,
    LABEL_ATTEMPT,
    LABEL_KIND,
    LABEL_MANAGED_BY,
    LABEL_RUN,
    LABEL_RUN_UID,
    LABEL_STEP,
    MANAGED_BY,
)
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import Kubectl, bind_role, mint_user, read_or_none, user_subject
from tests.support.runs import (
    IMAGE,
    Run,
    agentrun,
    create,
    envelope,
    patch_spec,
    status_of,
    step,
    step_status,
)
from tests.support.waiting import wait_events, wait_phase, wait_step_phase

MALLORY = "mallory"
MARK = "FORGED-BY-MALLORY"
RETRY = {"limit": 1, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}


@pytest.fixture
def mallory(
    cluster: TestCluster, kube: KubeClients, namespace: str, tmp_path: Path
) -> Iterator[KubeClients]:
    """A user who may create Jobs, create and change pods (and write pod status) and read runs,
    nothing more."""
    rules = [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]},
    ]
    bind_role(kube, namespace, "job-maker", rules, [user_subject(MALLORY)])
    clients = KubeClients.from_kubeconfig(
        mint_user(cluster, MALLORY, [], tmp_path / "m.kubeconfig")
    )
    run = agentrun("mallorys-own", [step("x", envelope("x"))])
    with pytest.raises(ApiException) as refused:
        clients.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run)
    assert refused.value.status == 403, "mallory must not be able to create runs"
    yield clients
    clients.close()


def forged_job(
    name: str, run: str, uid: str, step_name: str, *, labelled: bool, owned: bool
) -> dict[str, Any]:
    """Mallory's Job under a step attempt's name, running her own command."""
    labels = (
        {
            LABEL_RUN: run,
            LABEL_RUN_UID: uid,
            LABEL_STEP: step_name,
            LABEL_ATTEMPT: "1",
            LABEL_KIND: "step-job",
            LABEL_MANAGED_BY: MANAGED_BY,
        }
        if labelled
        else {}
    )
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentRun",
                "name": run,
                "uid": uid,
                "controller": True,
            }
        ]
    container = {
        "name": "step",
        "image": IMAGE,
        "command": ["sh", "-c", envelope(MARK, {"forged": MARK})],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def assert_nothing_forged(kube: KubeClients, namespace: str, run: Run) -> None:
    """Mallory's output is nowhere in the run: not in status, not in its ConfigMaps."""
    assert MARK not in json.dumps(status_of(run)), status_of(run)
    uid = run["metadata"]["uid"]
    for cm in kube.core.list_namespaced_config_map(
        namespace, label_selector=f"{LABEL_RUN_UID}={uid}"
    ).items:
        assert MARK not in json.dumps(cm.data or {}), (
            f"ConfigMap {cm.metadata.name} holds the forgery"
        )


def forge_finished_pod(
    mallory: KubeClients, namespace: str, name: str, metadata: dict[str, Any]
) -> None:
    """Her pod ``name`` (with ``metadata``), never scheduled (nothing runs it), with a status
    she writes herself: finished, with her envelope, later than any real pod."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {
            "schedulingGates": [{"name": "never-scheduled"}],
            "restartPolicy": "Never",
            "containers": [{"name": "step", "image": IMAGE, "command": ["true"]}],
        },
    }
    mallory.core.create_namespaced_pod(namespace, pod)
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "message": json.dumps({"ok": True, "summary": MARK}),
        "startedAt": "2099-01-01T00:00:00Z",
        "finishedAt": "2099-01-01T00:00:01Z",
    }
    status = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "step",
                "image": IMAGE,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
    mallory.core.patch_namespaced_pod_status(name, namespace, {"status": status})


CASES = {
    "plain-unlabelled": (False, False, False),
    "plain-owned": (False, True, True),
    "gated-labelled": (True, True, False),
    "gated-owned": (True, True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_made_first_under_a_steps_name_never_counts_as_the_step(
    case: str,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    mallory: KubeClients,
) -> None:
    gated, labelled, owned = CASES[case]
    name = f"forge-{case}"
    target = step("next", envelope("the real next step"), after=["first"], retry=RETRY)
    if gated:
        target["approval"] = "required"
    steps = [step("first", envelope("first done")), target]
    extra: dict[str, Any] = {} if gated else {"suspend": True}  # held until forged
    created = create(kube, namespace, agentrun(name, steps, **extra))
    uid = created["metadata"]["uid"]
    if gated:  # the gate holds the step; the run is otherwise under way
        waiting = wait_step_phase(kube, namespace, name, "next", "WaitingForApproval")
        args_hash = step_status(waiting, "next")["argsHash"]

    taken = job_name(name, uid, "next", 1)
    forged = forged_job(taken, name, uid, "next", labelled=labelled, owned=owned)
    made = mallory.batch.create_namespaced_job(namespace, forged)
    wait_for(
        "mallory's Job to finish",
        lambda: mallory.batch.read_namespaced_job(taken, namespace).status.succeeded,
        timeout=120,
    )
    if gated:
        approval = {"step": "next", "decision": "approve", "argsHash": args_hash, "by": "admin"}
        patch_spec(kubectl, namespace, name, approvals=[approval])
    else:
        patch_spec(kubectl, namespace, name, suspend=False)

    run = wait_phase(kube, namespace, name, "Succeeded")
    result = step_status(run, "next")
    assert result["attempt"] == 2 and result["jobName"] != taken, result
    assert result["summary"] == "the real next step", result
    failures = [
        t
        for t in status_of(run).get("history") or []
        if t.get("step") == "next" and "JobNameTaken" in (t.get("message") or "")
    ]
    assert failures, status_of(run).get("history")
    assert "not created by the operator" in failures[0]["message"]

    warnings = wait_events(kube, namespace, name, "JobNameTaken")
    assert warnings and warnings[0].type == "Warning", [e.reason for e in warnings]
    assert taken in warnings[0].message and "not created by the operator" in warnings[0].message

    left = kube.batch.read_namespaced_job(taken, namespace)
    assert left.metadata.uid == made.metadata.uid and left.metadata.deletion_timestamp is None
    assert JOB_FINALIZER not in (left.metadata.finalizers or []), "the operator marked her Job"
    assert_nothing_forged(kube, namespace, run)


def test_a_pod_that_only_names_a_steps_job_in_its_labels_is_ignored(
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    mallory: KubeClients,
) -> None:
    created = create(
        kube,
        namespace,
        agentrun("podforge", [step("only", envelope("the real step"))], suspend=True),
    )
    uid = created["metadata"]["uid"]
    taken = job_name("podforge", uid, "only", 1)
    labels = {
        LABEL_RUN_UID: uid,
        LABEL_STEP: "only",
        LABEL_ATTEMPT: "1",
        "job-name": taken,
        "batch.kubernetes.io/job-name": taken,
    }
    forge_finished_pod(mallory, namespace, "forged-step-pod", {"labels": labels})
    patch_spec(kubectl, namespace, "podforge", suspend=False)

    run = wait_phase(kube, namespace, "podforge", "Succeeded")
    assert step_status(run, "only")["summary"] == "the real step"
    assert_nothing_forged(kube, namespace, run)
    forged = kube.core.read_namespaced_pod("forged-step-pod", namespace)
    assert forged.status.phase == "Succeeded", "the forged pod was not in place"


def test_a_pod_the_job_controller_adopted_from_someone_else_never_tells_the_outcome(
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    mallory: KubeClients,
) -> None:
    real = "sleep 8; " + envelope("the real step")
    created = create(
        kube,
        namespace,
        agentrun("adopted", [step("only", real, retry=RETRY)], suspend=True),
    )
    uid = created["metadata"]["uid"]
    taken = job_name("adopted", uid, "only", 1)
    patch_spec(kubectl, namespace, "adopted", suspend=False)
    job = wait_for(
        "the step's Job", lambda: read_or_none(mallory.batch.read_namespaced_job, taken, namespace)
    )
    # Her pod: finished as she says (she may write pod status), carrying the Job controller's
    # tracking finalizer, and then labelled with the Job's selector: the Job controller adopts
    # it, counts its success, ends the Job and stops the step's own pod.
    tracked = {"finalizers": ["batch.kubernetes.io/job-tracking"]}
    forge_finished_pod(mallory, namespace, "adopted-forgery", tracked)
    selector = {"batch.kubernetes.io/controller-uid": job.metadata.uid, "job-name": taken}
    mallory.core.patch_namespaced_pod(
        "adopted-forgery", namespace, {"metadata": {"labels": selector}}
    )

    def adopted() -> bool:
        found = kube.core.read_namespaced_pod("adopted-forgery", namespace)
        return any(ref.uid == job.metadata.uid for ref in found.metadata.owner_references or [])

    wait_for("the Job controller to adopt her pod", adopted)
    run = wait_phase(kube, namespace, "adopted", "Succeeded")
    assert step_status(run, "only").get("summary") == "the real step", status_of(run)
    assert_nothing_forged(kube, namespace, run)
    # Attempt 1 failed: her pod does not run the step, and its own pod never ended (the Job
    # controller stopped it when her pod completed the Job). Attempt 2 ran the step.
    history = status_of(run).get("history") or []
    failures = [
        t
        for t in history
        if t.get("step") == "only"
        and any(
            f"attempt 1 failed ({r}:" in t.get("message", "")
            for r in (jobs.POD_LOST, jobs.UNTRUSTED_POD)
        )
    ]
    assert failures, json.dumps(history, indent=1)
    assert step_status(run, "only")["attempt"] == 2
