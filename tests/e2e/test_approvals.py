"""Approval gates and the audit record, with the operator as its own process."""

from __future__ import annotations

import json
from typing import Any

from agentrun.access import audit
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients
from tests.support.cluster import Kubectl
from tests.support.runs import (
    Run,
    agentrun,
    audit_record,
    condition,
    create,
    envelope,
    jobs_of,
    patch_spec,
    status_of,
    step,
    step_status,
)
from tests.support.waiting import wait_phase, wait_recorded, wait_step_phase, wait_until


def _approval(step_name: str, args_hash: str, decision: str = "approve") -> dict[str, Any]:
    return {"step": step_name, "decision": decision, "argsHash": args_hash, "by": "admin",
            "reason": "looked at it"}  # fmt: skip


def test_changing_a_step_after_its_approval_needs_a_new_approval(
    kube: KubeClients, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    gated = step("deploy", envelope("deployed"), approval="required")
    created = create(kube, namespace, agentrun("gate", [gated]))
    run = wait_step_phase(kube, namespace, "gate", "deploy", "WaitingForApproval")
    first_hash = step_status(run, "deploy")["argsHash"]
    assert status_of(run)["phase"] == "WaitingForApproval"
    pending = condition(run, "ApprovalPending")
    assert pending["status"] == "True" and first_hash in pending["message"]

    # Suspend, approve the current arguments, then change the step before resuming.
    patch_spec(kubectl, namespace, "gate", suspend=True)
    wait_phase(kube, namespace, "gate", "Suspended")
    changed = step("deploy", envelope("deployed with --force"), approval="required")
    patch_spec(kubectl, namespace, "gate", approvals=[_approval("deploy", first_hash)],
               plan={"steps": [changed]})  # fmt: skip
    patch_spec(kubectl, namespace, "gate", suspend=False)

    def rehashed(r: Run) -> bool:
        st = step_status(r, "deploy")
        return st.get("phase") == "WaitingForApproval" and st.get("argsHash") != first_hash

    run = wait_until(kube, namespace, "gate", "a new argsHash awaiting approval", rehashed)
    new_hash = step_status(run, "deploy")["argsHash"]
    uid = created["metadata"]["uid"]
    assert not jobs_of(kube, namespace, uid), "the old approval launched the step"

    patch_spec(
        kubectl,
        namespace,
        "gate",
        approvals=[_approval("deploy", first_hash), _approval("deploy", new_hash)],
    )
    run = wait_phase(kube, namespace, "gate", "Succeeded")
    assert step_status(run, "deploy")["decidedBy"] == "admin"
    assert step_status(run, "deploy")["summary"] == "deployed with --force"


def test_rejection_ends_the_run_with_the_rejecters_reason(
    kube: KubeClients, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    create(
        kube,
        namespace,
        agentrun(
            "reject",
            [step("deploy", envelope("x"), risk="external")],
            policy={"approvalRequiredFor": ["external"]},
        ),
    )
    run = wait_step_phase(kube, namespace, "reject", "deploy", "WaitingForApproval")
    h = step_status(run, "deploy")["argsHash"]
    patch_spec(
        kubectl,
        namespace,
        "reject",
        approvals=[{**_approval("deploy", h, "reject"), "reason": "change freeze until Monday"}],
    )
    run = wait_phase(kube, namespace, "reject", "Failed")
    cond = condition(run)
    assert cond["reason"] == "Rejected"
    assert "rejected by admin: change freeze until Monday" in cond["message"]


def test_audit_record_chain_verifies_and_a_tampered_entry_is_detected(
    kube: KubeClients, namespace: str, operator: OperatorProcess
) -> None:
    created = create(
        kube,
        namespace,
        agentrun(
            "audited", [step("a", envelope("a done")), step("b", envelope("b done"), after=["a"])]
        ),
    )
    uid = created["metadata"]["uid"]
    run = wait_phase(kube, namespace, "audited", "Succeeded")
    maps = wait_recorded(kube, namespace, "audited", uid)
    entries = audit.parse(m.data or {} for m in maps)
    assert audit.verify(entries, uid) == []
    seqs = [t["seq"] for t in status_of(run)["history"]]
    assert [e["seq"] for e in entries][-len(seqs) :] == seqs

    # Someone edits an entry in place: the chain shows it.
    target = maps[0]
    key = sorted(target.data)[1]
    tampered = json.loads(target.data[key])
    tampered["reason"] = "NothingToSeeHere"
    target.data[key] = json.dumps(tampered)
    kube.core.replace_namespaced_config_map(target.metadata.name, namespace, target)
    reread = audit.parse(m.data or {} for m in audit_record(kube, namespace, uid))
    problems = audit.verify(reread, uid)
    assert f"entry {tampered['seq']} was changed after it was written" in problems
