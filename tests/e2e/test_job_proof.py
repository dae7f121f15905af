"""A step Job counts only if the operator created it, proven by its key (the trust model:
agentrun.execution.proof, agentrun.observation.adoption), and a Job the operator created stays
its attempt's whatever labels someone gives it.

Eve holds the built-in ``edit`` role in the namespace: she may read runs and create and change
Jobs and pods, and she has the operator's code.

* Before a gated step's approval she builds the step's exact Job the way the operator does
  (the core's own decision for the approved run, then ``jobs.build_job``) and creates it: it
  runs the step's command before anyone approved it. That run never counts: until the
  approval the step stays WaitingForApproval; after it, the operator's create meets her Job,
  which carries no proof, so attempt 1 fails with reason JobNameTaken (a Warning Event names
  her Job, which is left alone) and, the step having a retry, attempt 2 runs under a new name
  and is the step's result.
* While a step's Job runs she changes or removes its ``agentrun.dev/run-uid`` label (the label
  the operator's watch finds step Jobs by): the Job stays the attempt's, no second attempt
  starts, and at no moment do two attempts' pods run at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun.api import models as m
from agentrun.core.naming import job_name
from agentrun.settings import ANNOTATION_PROOF, JOB_FINALIZER, LABEL_RUN_UID
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import Kubectl, bind_role, editor, read_or_none, user_subject
from tests.support.jobs import let_pods_start
from tests.support.runs import (
    agentrun,
    create,
    envelope,
    event_reasons,
    get,
    patch_spec,
    status_of,
    step,
    step_status,
)
from tests.support.trust_attacks import operators_manifest
from tests.support.waiting import assert_holds, wait_events, wait_phase, wait_step_phase

EVE = "eve"
RETRY = {"limit": 1, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}


@pytest.fixture
def eve(
    cluster: TestCluster, kube: KubeClients, namespace: str, tmp_path: Path
) -> Iterator[KubeClients]:
    """A user with the built-in ``edit`` role in the namespace, and reading runs (which
    ``edit`` grants where the chart's agentrun-edit role is installed: it aggregates into it)."""
    reads = [{"apiGroups": [m.GROUP], "resources": [m.PLURAL], "verbs": ["get", "list"]}]
    bind_role(kube, namespace, "eve-reads-runs", reads, [user_subject(EVE)])
    clients = editor(cluster, kube, namespace, EVE, tmp_path / "e.kubeconfig")
    yield clients
    clients.close()


def test_a_gated_steps_exact_job_made_before_its_approval_never_counts(
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    eve: KubeClients,
) -> None:
    name = "early"
    gated = step("gated", envelope("the approved step"), after=["first"], retry=RETRY)
    gated["approval"] = "required"
    created = create(kube, namespace, agentrun(name, [step("first", envelope("one")), gated]))
    uid = created["metadata"]["uid"]
    waiting = wait_step_phase(kube, namespace, name, "gated", "WaitingForApproval")
    args_hash = step_status(waiting, "gated")["argsHash"]
    approval = {"step": "gated", "decision": "approve", "argsHash": args_hash, "by": "admin"}

    # Eve's Job: the operator's manifest for the approved attempt, byte for byte.
    body = eve.custom.get_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL, name)
    manifest = operators_manifest(body, "gated", approval)
    taken = job_name(name, uid, "gated", 1)
    assert manifest["metadata"]["name"] == taken
    assert ANNOTATION_PROOF not in manifest["metadata"]["annotations"]
    made = eve.batch.create_namespaced_job(namespace, manifest)
    # Its pod is held by the operator's gate, as the template says; she may let it go herself.
    wait_for("eve's Job's pod", lambda: let_pods_start(eve, namespace, taken), timeout=60)
    wait_for(
        "eve's Job to run the step's command",
        lambda: eve.batch.read_namespaced_job(taken, namespace).status.succeeded,
        timeout=120,
    )

    def still_waiting() -> None:
        run = get(kube, namespace, name)
        assert step_status(run, "gated")["phase"] == "WaitingForApproval", status_of(run)
        assert "JobNameTaken" not in event_reasons(kube, namespace, name)

    # It ran; it is not the step's: no approval, so no attempt, so nothing to count.
    assert_holds(still_waiting, seconds=8)

    patch_spec(kubectl, namespace, name, approvals=[approval])
    run = wait_phase(kube, namespace, name, "Succeeded")
    result = step_status(run, "gated")
    assert result["attempt"] == 2 and result["jobName"] != taken, result
    assert result["summary"] == "the approved step", result
    failures = [
        t
        for t in status_of(run).get("history") or []
        if t.get("step") == "gated" and "JobNameTaken" in (t.get("message") or "")
    ]
    assert failures, status_of(run).get("history")
    assert ANNOTATION_PROOF in failures[0]["message"], failures[0]
    warnings = wait_events(kube, namespace, name, "JobNameTaken")
    assert warnings and warnings[0].type == "Warning"
    assert taken in warnings[0].message and ANNOTATION_PROOF in warnings[0].message
    # Her Job is hers: left alone (it carries the outcome finalizer only because she copied it).
    left = kube.batch.read_namespaced_job(taken, namespace)
    assert left.metadata.uid == made.metadata.uid and left.metadata.deletion_timestamp is None
    assert left.metadata.finalizers == [JOB_FINALIZER], left.metadata.finalizers
    # The attempt that counts is signed by the operator.
    real = kube.batch.read_namespaced_job(result["jobName"], namespace)
    assert (real.metadata.annotations or {}).get(ANNOTATION_PROOF, "").startswith("v1:")


@pytest.mark.parametrize("relabel", ["removed", "changed"])
def test_a_running_job_relabelled_stays_its_attempts_and_no_second_attempt_starts(
    relabel: str,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    eve: KubeClients,
) -> None:
    name = f"relabel-{relabel}"
    command = "sleep 12; " + envelope("the one attempt")
    created = create(kube, namespace, agentrun(name, [step("only", command, retry=RETRY)]))
    uid = created["metadata"]["uid"]
    first, second = job_name(name, uid, "only", 1), job_name(name, uid, "only", 2)
    wait_for(
        "the step's pod to run",
        lambda: [
            p
            for p in kube.core.list_namespaced_pod(
                namespace, label_selector=f"{LABEL_RUN_UID}={uid}"
            ).items
            if p.status.phase == "Running"
        ],
        timeout=120,
    )
    value = None if relabel == "removed" else "0a0a0a0a-0000-0000-0000-000000000000"
    relabelled = {"metadata": {"labels": {LABEL_RUN_UID: value}}}
    eve.batch.patch_namespaced_job(first, namespace, relabelled)

    def one_attempt_at_a_time() -> None:
        assert read_or_none(kube.batch.read_namespaced_job, second, namespace) is None
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_RUN_UID}={uid}")
        running = [p.metadata.name for p in pods.items if p.status.phase in ("Pending", "Running")]
        assert len(running) <= 1, running
        run = get(kube, namespace, name)
        assert step_status(run, "only").get("attempt") == 1, status_of(run)

    assert_holds(one_attempt_at_a_time, seconds=10)
    run = wait_phase(kube, namespace, name, "Succeeded")
    result = step_status(run, "only")
    assert result["attempt"] == 1 and result["jobName"] == first, result
    assert result["summary"] == "the one attempt", result
    assert "JobNameTaken" not in event_reasons(kube, namespace, name)
    assert read_or_none(kube.batch.read_namespaced_job, second, namespace) is None
