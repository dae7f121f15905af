"""The admission policies of manifests/admission against the real API server: who created a
run (user and groups) and who last changed it is recorded from the authenticated identity;
approvals are append-only, signed by the requesting user, limited to policy.approverGroups and,
with requireSecondPerson, never by the creator; approval requirements of a step only get
stricter after creation, and what the steps run as (spec.stepTemplate), the results carried
into the run (spec.carriedResults) and an agent's model and tools (where its API key is sent)
are fixed at creation.

Other tests of the session create runs as the admin user and sign approvals with any name, so
the shipped policies are never bound cluster-wide here: each test binds copies of its own to its
namespace only (:func:`tests.support.admission.policies_bound_to`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from agentrun.api import models as m
from agentrun_devcluster.testing import TestCluster, wait_for
from tests.support import runs
from tests.support.admission import (
    APPROVERS,
    SCOPE_LABEL,
    policies_bound_to,
    shipped_policies,
)
from tests.support.cluster import mint_user
from tests.support.paths import ADMISSION_DIR

HASH = "a" * 64
ANNOTATION_CREATED_BY_GROUPS = "agentrun.dev/created-by-groups"
"""The creator's groups, as a JSON array of strings (manifests/admission/mutating-policy.yaml)."""
pytestmark = pytest.mark.usefixtures("crd_installed")


def _run(name: str, **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", None)
    body = runs.agentrun(name, [runs.step("deploy")], goal="check approvals at admission", **spec)
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def _step(name: str, risk: str = "read", approval: str = "auto", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "risk": risk,
        "approval": approval,
        "container": {"image": "busybox:1.36", "args": ["echo", name]},
        **extra,
    }


def _plan(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"steps": list(steps)}


def _approval(by: str, decision: str = "approve", reason: str = "looks right") -> dict[str, Any]:
    return {"step": "deploy", "decision": decision, "argsHash": HASH, "by": by, "reason": reason}


def _denial(proc: CompletedProcess[str]) -> str:
    """The message of a request denied by the agentrun-approvals policy."""
    assert proc.returncode != 0, f"expected a denial, got: {proc.stdout}"
    assert "ValidatingAdmissionPolicy 'agentrun-approvals-" in proc.stderr, proc.stderr
    return proc.stderr.split("denied request: ", 1)[1].strip()


def _key(annotation: str) -> str:
    """The JSON patch path of an annotation."""
    return "/metadata/annotations/" + annotation.replace("/", "~1")


@dataclass
class Admission:
    """The policies bound to one namespace, and kubectl as alice, bob and carol there."""

    cluster: TestCluster
    namespace: str
    users: dict[str, Path]

    def kubectl(self, user: str, *args: str, input: str | None = None) -> CompletedProcess[str]:
        kubeconfig = None if user == "admin" else self.users[user]
        return self.cluster.kubectl(
            *args, "-n", self.namespace, input=input, check=False, kubeconfig=kubeconfig
        )

    def create(
        self, user: str, body: dict[str, Any], *extra: str
    ) -> tuple[CompletedProcess[str], dict[str, Any]]:
        proc = self.kubectl(user, "create", "-f", "-", "-o", "json", *extra, input=json.dumps(body))
        return proc, json.loads(proc.stdout) if proc.returncode == 0 else {}

    def created(self, user: str, body: dict[str, Any]) -> dict[str, Any]:
        proc, obj = self.create(user, body)
        assert proc.returncode == 0, proc.stderr
        return obj

    def patch(self, user: str, name: str, ops: list[dict[str, Any]]) -> CompletedProcess[str]:
        return self.kubectl(
            user, "patch", f"agentrun/{name}", "--type=json", "-p", json.dumps(ops), "-o", "json"
        )

    def patched(self, user: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        proc = self.patch(user, name, ops)
        assert proc.returncode == 0, proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    def append(self, user: str, name: str, approval: dict[str, Any]) -> CompletedProcess[str]:
        return self.patch(
            user, name, [{"op": "add", "path": "/spec/approvals/-", "value": approval}]
        )

    def get(self, name: str) -> dict[str, Any]:
        proc = self.kubectl("admin", "get", f"agentrun/{name}", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    def dry_run_create(self, user: str, body: dict[str, Any]) -> CompletedProcess[str]:
        return self.kubectl(
            user, "create", "--dry-run=server", "-f", "-", "-o", "json", input=json.dumps(body)
        )

    def enforced(self) -> bool:
        """Both policies act on this namespace: a dry-run create by alice gets her name
        recorded, and one with an approval signed by someone else is denied."""
        ok = self.dry_run_create("alice", _run("probe"))
        if ok.returncode != 0:
            return False
        annotations = json.loads(ok.stdout)["metadata"].get("annotations") or {}
        bad = self.dry_run_create("alice", _run("probe", approvals=[_approval("nobody")]))
        return (
            annotations.get(m.ANNOTATION_CREATED_BY) == "alice"
            and bad.returncode != 0
            and "must be signed by the requesting user alice" in bad.stderr
        )

    def not_enforced(self) -> bool:
        bad = self.dry_run_create("alice", _run("probe", approvals=[_approval("nobody")]))
        return bad.returncode == 0

    def groups_of(self, user: str) -> list[str]:
        """The groups the API server authenticates ``user`` with (kubectl auth whoami)."""
        proc = self.kubectl(user, "auth", "whoami", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        groups: list[str] = json.loads(proc.stdout)["status"]["userInfo"]["groups"]
        return groups

    def with_user(self, user: str, groups: list[str], directory: Path) -> Admission:
        """The same namespace with one more user, minted in ``groups`` and allowed to edit runs
        there. The kubeconfig is copied to ``directory`` (minting the name again overwrites)."""
        path = mint_user(self.cluster, user, groups, directory / f"{user}.kubeconfig")
        self.cluster.kubectl(
            "create",
            "rolebinding",
            f"agentrun-editor-{user}",
            "-n",
            self.namespace,
            "--role=agentrun-editor",
            f"--user={user}",
        )
        return Admission(self.cluster, self.namespace, {**self.users, user: path})


@pytest.fixture(scope="module")
def users(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Client-certificate kubeconfigs: alice and bob are approvers, carol is not. Copied away
    at once: minting the same user name again (another test) overwrites the minted file."""
    groups = {"alice": [APPROVERS], "bob": [APPROVERS, "sre"], "carol": ["dev"]}
    out = tmp_path_factory.mktemp("users")
    return {
        user: mint_user(cluster, user, user_groups, out / f"{user}.kubeconfig")
        for user, user_groups in groups.items()
    }


@pytest.fixture
def admission(cluster: TestCluster, namespace: str, users: dict[str, Path]) -> Iterator[Admission]:
    kubectl = cluster.kubectl
    kubectl(
        "create",
        "role",
        "agentrun-editor",
        "-n",
        namespace,
        "--verb=get,list,watch,create,update,patch",
        "--resource=agentruns.agentrun.dev",
    )
    kubectl(
        "create",
        "rolebinding",
        "agentrun-editor",
        "-n",
        namespace,
        "--role=agentrun-editor",
        *(f"--user={u}" for u in users),
    )
    adm = Admission(cluster, namespace, users)
    with policies_bound_to(cluster, namespace, adm.enforced):
        yield adm


# ---------------------------------------------------------------------------------------------
# The shipped files
# ---------------------------------------------------------------------------------------------


def test_shipped_manifests_are_accepted_by_the_api_server(cluster: TestCluster) -> None:
    out = cluster.kubectl("apply", "--dry-run=server", "-f", str(ADMISSION_DIR)).stdout
    for doc in shipped_policies():
        assert doc["metadata"]["name"] in (
            "agentrun-identity",
            "agentrun-approvals",
            "agentrun-job-pods",
            "agentrun-pod-doors",
        )
        if doc["kind"].endswith("Binding"):
            assert "matchResources" not in doc["spec"], "the shipped bindings are cluster-wide"
        ref = f"{doc['kind'].lower()}.admissionregistration.k8s.io/{doc['metadata']['name']}"
        assert re.search(
            rf"^{re.escape(ref)} (created|configured|unchanged) \(server dry run\)$", out, re.M
        ), out
    kinds = sorted(d["kind"] for d in shipped_policies())
    assert kinds == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]


def test_validating_policy_type_checks_against_the_crd(admission: Admission) -> None:
    name = f"agentrun-approvals-{admission.namespace}"

    def checked() -> dict[str, Any] | None:
        vap = json.loads(
            admission.cluster.kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout
        )
        status = vap.get("status") or {}
        done = status.get("observedGeneration") == vap["metadata"]["generation"]
        return status if done and "typeChecking" in status else None

    status = wait_for(f"type checking of {name}", checked, timeout=60)
    assert status["typeChecking"].get("expressionWarnings") is None, status


# ---------------------------------------------------------------------------------------------
# created-by and last-modified-by
# ---------------------------------------------------------------------------------------------


def test_creator_is_recorded_and_a_forged_creator_is_overwritten(admission: Admission) -> None:
    run = admission.created("alice", _run("plain"))
    assert run["metadata"]["annotations"][m.ANNOTATION_CREATED_BY] == "alice"
    assert m.ANNOTATION_MODIFIED_BY not in run["metadata"]["annotations"]

    # A forged creator on CREATE is not denied: the mutating policy overwrites it with the
    # authenticated user before validation.
    forged = admission.created(
        "bob", _run("forged", annotations={m.ANNOTATION_CREATED_BY: "alice"})
    )
    assert forged["metadata"]["annotations"][m.ANNOTATION_CREATED_BY] == "bob"

    # Afterwards nobody, not even the creator or a cluster admin, can change or remove it.
    key = "/metadata/annotations/" + m.ANNOTATION_CREATED_BY.replace("/", "~1")
    expected = (
        "metadata.annotations[agentrun.dev/created-by] cannot change: "
        "it records who created the run (alice)"
    )
    for user in ("carol", "alice", "admin"):
        op = {"op": "replace", "path": key, "value": "mallory"}
        proc = admission.patch(user, "plain", [op])
        assert _denial(proc) == expected
    assert _denial(admission.patch("bob", "plain", [{"op": "remove", "path": key}])) == expected
    assert admission.get("plain")["metadata"]["annotations"][m.ANNOTATION_CREATED_BY] == "alice"


def test_last_modified_by_records_who_changed_the_spec(admission: Admission) -> None:
    admission.created("alice", _run("r"))
    run = admission.patched("bob", "r", [{"op": "add", "path": "/spec/cancel", "value": True}])
    annotations = run["metadata"]["annotations"]
    assert annotations[m.ANNOTATION_MODIFIED_BY] == "bob"
    assert annotations[m.ANNOTATION_CREATED_BY] == "alice"

    # A metadata-only change (a label, kopf's bookkeeping) does not move it.
    admission.patched(
        "carol", "r", [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]
    )
    assert admission.get("r")["metadata"]["annotations"][m.ANNOTATION_MODIFIED_BY] == "bob"

    # A spec change by carol does.
    run = admission.patched("carol", "r", [{"op": "add", "path": "/spec/suspend", "value": True}])
    assert run["metadata"]["annotations"][m.ANNOTATION_MODIFIED_BY] == "carol"

    # It cannot be written by hand, neither on its own nor when creating a run.
    key = "/metadata/annotations/" + m.ANNOTATION_MODIFIED_BY.replace("/", "~1")
    proc = admission.patch("bob", "r", [{"op": "replace", "path": key, "value": "alice"}])
    assert _denial(proc) == (
        "metadata.annotations[agentrun.dev/last-modified-by] is written by the API server when "
        "the spec changes and cannot be set by hand (to 'alice')"
    )
    proc, _ = admission.create("bob", _run("f", annotations={m.ANNOTATION_MODIFIED_BY: "alice"}))
    assert _denial(proc) == (
        "metadata.annotations[agentrun.dev/last-modified-by] is written by the API server when "
        "the spec changes and cannot be set by hand (to 'alice')"
    )


def test_creator_groups_are_recorded_and_cannot_be_forged_or_changed(
    admission: Admission,
) -> None:
    run = admission.created("alice", _run("plain"))
    recorded = run["metadata"]["annotations"][ANNOTATION_CREATED_BY_GROUPS]
    # The O= fields of alice's certificate, and the group of every authenticated user, in the
    # order the API server gives them, as a JSON array.
    assert recorded == '["agentrun-approvers","system:authenticated"]'
    assert json.loads(recorded) == admission.groups_of("alice")

    # A forged value on CREATE is replaced with the real groups.
    forged = admission.created(
        "carol", _run("forged", annotations={ANNOTATION_CREATED_BY_GROUPS: '["system:masters"]'})
    )
    forged_groups = forged["metadata"]["annotations"][ANNOTATION_CREATED_BY_GROUPS]
    assert json.loads(forged_groups) == ["dev", "system:authenticated"]
    assert json.loads(forged_groups) == admission.groups_of("carol")

    # Afterwards nobody, not even the creator or a cluster admin, can change or remove it.
    expected = (
        "metadata.annotations[agentrun.dev/created-by-groups] cannot change: it records the "
        'groups of the user who created the run (["agentrun-approvers","system:authenticated"])'
    )
    key = _key(ANNOTATION_CREATED_BY_GROUPS)
    for user in ("carol", "alice", "admin"):
        op = {"op": "replace", "path": key, "value": '["system:masters"]'}
        assert _denial(admission.patch(user, "plain", [op])) == expected
    assert _denial(admission.patch("alice", "plain", [{"op": "remove", "path": key}])) == expected
    assert admission.get("plain")["metadata"]["annotations"][ANNOTATION_CREATED_BY_GROUPS] == (
        recorded
    )


def test_creator_groups_are_json_whatever_the_group_names(
    admission: Admission, tmp_path: Path
) -> None:
    """Group names are free text (an LDAP DN has commas): each is a JSON string, so the list
    reads back exactly. A name with a control character has no such string and is refused."""
    groups = ["cn=ops,ou=groups,dc=example,dc=org", 'say "hi" \\ twice', "équipe"]
    dave = admission.with_user("dave", groups, tmp_path)
    run = dave.created("dave", _run("r"))
    recorded = json.loads(run["metadata"]["annotations"][ANNOTATION_CREATED_BY_GROUPS])
    assert recorded == [*groups, "system:authenticated"]
    assert recorded == dave.groups_of("dave")

    erin = admission.with_user("erin", ["bell\x07"], tmp_path)
    proc, _ = erin.create("erin", _run("r2"))
    assert _denial(proc) == (
        "metadata.annotations[agentrun.dev/created-by-groups] cannot record the groups of erin: "
        "a group name has a control character"
    )


# ---------------------------------------------------------------------------------------------
# Approvals
# ---------------------------------------------------------------------------------------------


def test_approval_must_be_signed_by_the_requesting_user(admission: Admission) -> None:
    admission.created("alice", _run("r", approvals=[]))

    proc = admission.append("bob", "r", _approval("alice"))
    assert _denial(proc) == (
        "approval for step deploy must be signed by the requesting user bob, not alice"
    )

    run = json.loads(admission.append("alice", "r", _approval("alice")).stdout)
    assert run["spec"]["approvals"] == [_approval("alice")]
    run = json.loads(admission.append("bob", "r", _approval("bob", "reject")).stdout)
    assert [a["by"] for a in run["spec"]["approvals"]] == ["alice", "bob"]

    # Also on CREATE: every entry is new there.
    proc, _ = admission.create("carol", _run("pre-approved", approvals=[_approval("alice")]))
    assert _denial(proc) == (
        "approval for step deploy must be signed by the requesting user carol, not alice"
    )


def test_only_members_of_approver_groups_can_approve(admission: Admission) -> None:
    admission.created("carol", _run("r", policy={"approverGroups": ["sre", APPROVERS]}))

    proc = admission.patch(
        "carol", "r", [{"op": "add", "path": "/spec/approvals", "value": [_approval("carol")]}]
    )
    assert _denial(proc) == (
        "carol may not approve or reject steps of this run: "
        "policy.approverGroups allows only members of sre, agentrun-approvers"
    )
    run = admission.patched(
        "bob", "r", [{"op": "add", "path": "/spec/approvals", "value": [_approval("bob")]}]
    )
    assert run["spec"]["approvals"] == [_approval("bob")]

    # Users outside the groups can still change the rest of the spec.
    run = admission.patched("carol", "r", [{"op": "add", "path": "/spec/suspend", "value": True}])
    assert run["spec"]["suspend"] is True


def test_require_second_person_keeps_the_creator_from_approving(admission: Admission) -> None:
    policy = {"approverGroups": [APPROVERS], "requireSecondPerson": True}
    admission.created("alice", _run("r", policy=policy, approvals=[]))
    expected = (
        "policy.requireSecondPerson: alice created this run and cannot approve or reject its "
        "steps; another person must"
    )
    assert _denial(admission.append("alice", "r", _approval("alice"))) == expected
    assert _denial(admission.append("alice", "r", _approval("alice", "reject"))) == expected

    run = json.loads(admission.append("bob", "r", _approval("bob")).stdout)
    assert run["spec"]["approvals"] == [_approval("bob")]

    # Nor can the creator approve up front, in the create itself.
    proc, _ = admission.create("alice", _run("r2", policy=policy, approvals=[_approval("alice")]))
    assert _denial(proc) == expected


def test_require_second_person_fails_closed_without_a_recorded_creator(
    admission: Admission,
) -> None:
    """A run created before the policies were in force has no created-by: with
    requireSecondPerson nobody can approve it, and the annotation cannot be added later."""
    kubectl = admission.cluster.kubectl
    ns = admission.namespace
    kubectl("label", "namespace", ns, f"{SCOPE_LABEL}-")
    try:
        wait_for("the policies to stop acting on the namespace", admission.not_enforced)
        admission.created("alice", _run("old", policy={"requireSecondPerson": True}, approvals=[]))
    finally:
        kubectl("label", "namespace", ns, f"{SCOPE_LABEL}={ns}")
    wait_for("the policies to act on the namespace again", admission.enforced)
    assert m.ANNOTATION_CREATED_BY not in (
        admission.get("old")["metadata"].get("annotations") or {}
    )

    assert _denial(admission.append("bob", "old", _approval("bob"))) == (
        "policy.requireSecondPerson: the run has no agentrun.dev/created-by annotation (it was "
        "created before the agentrun-identity policy), so a second person cannot be verified"
    )
    key = "/metadata/annotations"
    proc = admission.patch(
        "alice", "old", [{"op": "add", "path": key, "value": {m.ANNOTATION_CREATED_BY: "alice"}}]
    )
    assert _denial(proc) == (
        "metadata.annotations[agentrun.dev/created-by] cannot change: "
        "it records who created the run (nobody recorded)"
    )
    groups = {ANNOTATION_CREATED_BY_GROUPS: '["agentrun-approvers"]'}
    proc = admission.patch("alice", "old", [{"op": "add", "path": key, "value": groups}])
    assert _denial(proc) == (
        "metadata.annotations[agentrun.dev/created-by-groups] cannot change: it records the "
        "groups of the user who created the run (nothing recorded)"
    )
    # Changes that add no decision still go through.
    admission.patched("bob", "old", [{"op": "add", "path": "/spec/suspend", "value": True}])


def test_existing_approvals_cannot_be_edited_or_removed(admission: Admission) -> None:
    admission.created("alice", _run("r", approvals=[]))
    assert admission.append("bob", "r", _approval("bob")).returncode == 0

    changed = (
        "spec.approvals is append-only: existing entries cannot be changed or reordered "
        "(the entry for step deploy by bob was changed)"
    )
    for field, value in (("reason", "changed my mind"), ("decision", "reject")):
        op = {"op": "replace", "path": f"/spec/approvals/0/{field}", "value": value}
        assert _denial(admission.patch("bob", "r", [op])) == changed

    removed = "spec.approvals is append-only: entries cannot be removed (it had 1, now 0)"
    for user in ("bob", "admin"):
        proc = admission.patch(user, "r", [{"op": "remove", "path": "/spec/approvals/0"}])
        assert _denial(proc) == removed
    proc = admission.patch("alice", "r", [{"op": "remove", "path": "/spec/approvals"}])
    assert _denial(proc) == removed

    # Swapping an entry for a new one of one's own is a change, not an append.
    proc = admission.patch(
        "alice", "r", [{"op": "replace", "path": "/spec/approvals/0", "value": _approval("alice")}]
    )
    assert _denial(proc) == changed

    # New entries go at the end; inserting before an existing one reorders the list.
    proc = admission.patch(
        "alice", "r", [{"op": "add", "path": "/spec/approvals/0", "value": _approval("alice")}]
    )
    assert (
        _denial(proc)
        == "spec.approvals is append-only: existing entries cannot be changed or reordered"
    )
    assert admission.append("alice", "r", _approval("alice", "reject")).returncode == 0
    assert admission.get("r")["spec"]["approvals"] == [
        _approval("bob"),
        _approval("alice", "reject"),
    ]


def test_policy_cannot_change_after_creation(admission: Admission) -> None:
    admission.created("alice", _run("r", policy={"approverGroups": [APPROVERS]}))

    # Dropping approverGroups in the same update that adds carol's approval does not help:
    # the groups of the stored run decide.
    proc = admission.patch(
        "carol",
        "r",
        [
            {"op": "remove", "path": "/spec/policy"},
            {"op": "add", "path": "/spec/approvals", "value": [_approval("carol")]},
        ],
    )
    assert _denial(proc) == (
        "carol may not approve or reject steps of this run: "
        "policy.approverGroups allows only members of agentrun-approvers"
    )
    expected = "spec.policy cannot change after the run is created"
    proc = admission.patch("carol", "r", [{"op": "remove", "path": "/spec/policy"}])
    assert _denial(proc) == expected
    for user in ("alice", "admin"):
        op = {"op": "add", "path": "/spec/policy/requireSecondPerson", "value": True}
        assert _denial(admission.patch(user, "r", [op])) == expected

    # A run created without a policy cannot get one either.
    admission.created("alice", _run("open"))
    proc = admission.patch(
        "alice", "open", [{"op": "add", "path": "/spec/policy", "value": {"approverGroups": ["x"]}}]
    )
    assert _denial(proc) == expected


# ---------------------------------------------------------------------------------------------
# Approval requirements, step template and carried results after creation
# ---------------------------------------------------------------------------------------------


def _replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def test_approval_cannot_be_lowered_after_creation(admission: Admission) -> None:
    policy = {"approverGroups": [APPROVERS], "requireSecondPerson": True}
    plan = _plan(_step("deploy", "external", "required"), _step("check"))
    admission.created("alice", _run("r", policy=policy, plan=plan, approvals=[]))

    expected = (
        "spec.plan.steps[deploy].approval: cannot be lowered from required to auto after creation"
    )
    for user in ("alice", "bob", "admin"):
        proc = admission.patch(user, "r", [_replace("/spec/plan/steps/0/approval", "auto")])
        assert _denial(proc) == expected

    # Removing the step and adding it back under its name, weaker, in one update is the same.
    weaker = [_step("check"), _step("deploy", "external", "auto")]
    assert _denial(admission.patch("alice", "r", [_replace("/spec/plan/steps", weaker)])) == (
        expected
    )

    # Raising is allowed, and then holds like any other requirement.
    run = admission.patched("alice", "r", [_replace("/spec/plan/steps/1/approval", "required")])
    assert [s["approval"] for s in run["spec"]["plan"]["steps"]] == ["required", "required"]
    proc = admission.patch(
        "alice",
        "r",
        [
            _replace("/spec/plan/steps/0/approval", "auto"),
            _replace("/spec/plan/steps/1/approval", "auto"),
        ],
    )
    assert _denial(proc) == (
        "spec.plan.steps[deploy].approval: cannot be lowered from required to auto after "
        "creation; spec.plan.steps[check].approval: cannot be lowered from required to auto "
        "after creation"
    )

    # A step added after creation is judged on its own (its approval, the policy's risks).
    step = _step("report")
    run = admission.patched(
        "alice", "r", [{"op": "add", "path": "/spec/plan/steps/-", "value": step}]
    )
    assert [s["name"] for s in run["spec"]["plan"]["steps"]] == ["deploy", "check", "report"]
    assert [s["approval"] for s in admission.get("r")["spec"]["plan"]["steps"]] == [
        "required",
        "required",
        "auto",
    ]


def test_risk_cannot_be_lowered_or_leave_the_gated_risks(admission: Admission) -> None:
    policy = {"approvalRequiredFor": ["write"], "requireSecondPerson": True}
    plan = _plan(_step("migrate", "write"), _step("deploy", "external", "required"), _step("check"))
    admission.created("alice", _run("r", policy=policy, plan=plan))

    def risk(index: int, value: str) -> dict[str, Any]:
        return _replace(f"/spec/plan/steps/{index}/risk", value)

    proc = admission.patch("alice", "r", [risk(0, "read")])
    assert _denial(proc) == (
        "spec.plan.steps[migrate].risk: cannot be lowered from write to read after creation"
    )
    proc = admission.patch("admin", "r", [risk(1, "write")])
    assert _denial(proc) == (
        "spec.plan.steps[deploy].risk: cannot be lowered from external to write after creation"
    )
    # Raising migrate to a risk the policy does not gate would let it run without approval...
    proc = admission.patch("alice", "r", [risk(0, "external")])
    assert _denial(proc) == (
        "spec.plan.steps[migrate].risk: cannot change from write to external after creation: "
        "policy.approvalRequiredFor gates write but not external, so the step would no longer "
        "wait for approval"
    )
    # ... unless the same update makes the step require approval itself.
    run = admission.patched(
        "alice", "r", [risk(0, "external"), _replace("/spec/plan/steps/0/approval", "required")]
    )
    assert [(s["risk"], s["approval"]) for s in run["spec"]["plan"]["steps"]] == [
        ("external", "required"),
        ("external", "required"),
        ("read", "auto"),
    ]
    # Raising an ungated step into a gated risk is allowed.
    run = admission.patched("alice", "r", [risk(2, "write")])
    assert [s["risk"] for s in run["spec"]["plan"]["steps"]] == ["external", "external", "write"]


def test_step_template_cannot_change_after_creation(admission: Admission) -> None:
    admission.created("alice", _run("r", stepTemplate={"serviceAccountName": "step-runner"}))
    why = (
        ": cannot change after creation: the step template decides as whom and with what the "
        "steps run"
    )

    op = _replace("/spec/stepTemplate/serviceAccountName", "deployer")
    for user in ("alice", "bob", "admin"):
        assert _denial(admission.patch(user, "r", [op])) == (
            "spec.stepTemplate.serviceAccountName" + why
        )
    ops = [
        {"op": "add", "path": "/spec/stepTemplate/securityContext", "value": {"runAsUser": 0}},
        {"op": "add", "path": "/spec/stepTemplate/resources", "value": {"limits": {"cpu": "8"}}},
    ]
    assert _denial(admission.patch("alice", "r", ops)) == (
        "spec.stepTemplate.securityContext, spec.stepTemplate.resources" + why
    )
    op = {
        "op": "add",
        "path": "/spec/stepTemplate/containerSecurityContext",
        "value": {"privileged": True},
    }
    assert _denial(admission.patch("alice", "r", [op])) == (
        "spec.stepTemplate.containerSecurityContext" + why
    )
    proc = admission.patch("alice", "r", [{"op": "remove", "path": "/spec/stepTemplate"}])
    assert _denial(proc) == "spec.stepTemplate.serviceAccountName" + why

    # A run created without one cannot get one either.
    admission.created("alice", _run("plain"))
    op = {"op": "add", "path": "/spec/stepTemplate", "value": {"serviceAccountName": "deployer"}}
    assert _denial(admission.patch("alice", "plain", [op])) == (
        "spec.stepTemplate.serviceAccountName" + why
    )

    # The rest of the spec can still change.
    run = admission.patched("alice", "r", [{"op": "add", "path": "/spec/suspend", "value": True}])
    assert run["spec"]["stepTemplate"] == {"serviceAccountName": "step-runner"}


def test_only_the_creator_adds_or_changes_a_step_that_uses_the_creators_rights(
    admission: Admission,
) -> None:
    """Rule l: steps read Secrets and ConfigMaps, and act as the run's ServiceAccount, with the
    creator's rights; nobody else may make a step do so."""
    ref = {"name": "S", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
    container: dict[str, Any] = {"image": "busybox:1.36", "env": [ref]}
    uses = {"name": "uses", "container": container}
    admission.created("carol", _run("r", plan=_plan(_step("read"), uses)))
    why = (
        ": only the run's creator (carol) may add or change a step that uses a Secret, a "
        "ConfigMap or the run's ServiceAccount, which steps use with the creator's rights"
    )
    leak = {"name": "leak", "container": {**container, "args": ["env"]}}
    add = {"op": "add", "path": "/spec/plan/steps/-", "value": leak}
    for user in ("alice", "bob", "admin"):
        assert _denial(admission.patch(user, "r", [add])) == "spec.plan.steps[leak]" + why
    changed = _replace("/spec/plan/steps/1/container/args", ["env"])
    assert _denial(admission.patch("bob", "r", [changed])) == "spec.plan.steps[uses]" + why
    # A step that uses nothing of the creator's may change; the creator may change any.
    run = admission.patched("bob", "r", [_replace("/spec/plan/steps/0/container/args", ["x"])])
    assert run["spec"]["plan"]["steps"][0]["container"]["args"] == ["x"]
    run = admission.patched("carol", "r", [add, changed])
    assert [s["name"] for s in run["spec"]["plan"]["steps"]] == ["read", "uses", "leak"]

    # With a ServiceAccount, every step acts as it.
    admission.created("carol", _run("sa", stepTemplate={"serviceAccountName": "step-runner"}))
    added = {"op": "add", "path": "/spec/plan/steps/-", "value": _step("mine")}
    assert _denial(admission.patch("bob", "sa", [added])) == "spec.plan.steps[mine]" + why
    admission.patched("carol", "sa", [added])


def test_carried_results_cannot_be_added_after_creation(admission: Admission) -> None:
    """Carried results mark steps Succeeded without running them: they come only with the
    run's creation (kubectl agentrun fork). The CRD's own rule answers first (schema validation
    runs before validating admission); the policy's rule i holds the same line."""
    plan = _plan(_step("deploy", "external", "required"))
    admission.created("alice", _run("r", policy={"requireSecondPerson": True}, plan=plan))
    carried = [{"step": "deploy", "fromRun": f"{admission.namespace}/earlier", "result": "{}"}]
    for user in ("alice", "admin"):
        proc = admission.patch(
            user, "r", [{"op": "add", "path": "/spec/carriedResults", "value": carried}]
        )
        assert proc.returncode != 0, proc.stdout
        assert "carriedResults can only be set when the run is created" in proc.stderr
    assert "carriedResults" not in admission.get("r")["spec"]


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "container": {"image": "busybox:1.36", "command": ["true"]},
        **extra,
    }


def _agent_run(name: str, agent_extra: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = _run(name, **spec)
    body["spec"]["agent"] = {
        "model": {
            "baseURL": "http://llm.models.svc:8000/v1",
            "name": "m",
            "apiKeySecretRef": {"name": "llm", "key": "api-key"},
        },
        "tools": [_tool("search"), _tool("restart", risk="external", approval="required")],
        **(agent_extra or {}),
    }
    return body


def test_the_agents_model_and_tools_cannot_change_after_creation(admission: Admission) -> None:
    """Rule k: where the API key is sent (and which key), the model and the tools are fixed at
    creation, for everyone: the attack it stops is an editor, who may not read the key's
    Secret, pointing the next model turn at a server of theirs."""
    admission.created("alice", _agent_run("r"))
    why = (
        " after creation: the model endpoint, its API key Secret, the tools and the MCP servers "
        "decide where the run's Secrets are sent and what the model may call, so they are fixed "
        "when the run is created"
    )
    changed = ": cannot change" + why
    attacker = _replace("/spec/agent/model/baseURL", "http://attacker.example/v1")
    for user in ("alice", "carol", "admin"):
        assert _denial(admission.patch(user, "r", [attacker])) == (
            "spec.agent.model.baseURL" + changed
        )
    assert _denial(
        admission.patch("carol", "r", [_replace("/spec/agent/model/apiKeySecretRef/name", "x")])
    ) == ("spec.agent.model.apiKeySecretRef" + changed)
    proc = admission.patch(
        "carol", "r", [{"op": "remove", "path": "/spec/agent/model/apiKeySecretRef"}]
    )
    assert _denial(proc) == "spec.agent.model.apiKeySecretRef" + changed
    proc = admission.patch(
        "carol",
        "r",
        [
            _replace("/spec/agent/model/name", "gpt-4o"),
            {"op": "add", "path": "/spec/agent/model/temperature", "value": 1.5},
            attacker,
        ],
    )
    assert _denial(proc) == (
        "spec.agent.model.baseURL, spec.agent.model.name, spec.agent.model.temperature" + changed
    )
    # The fallbacks: where further keys are sent.
    fallback = {"baseURL": "http://attacker.example/v1", "name": "m",
                "apiKeySecretRef": {"name": "llm", "key": "api-key"}}  # fmt: skip
    added_fallback = {"op": "add", "path": "/spec/agent/model/fallbacks", "value": [fallback]}
    assert _denial(admission.patch("carol", "r", [added_fallback])) == (
        "spec.agent.model.fallbacks" + changed
    )
    # The tools: changed, added or removed, by name; reordered, as a whole.
    proc = admission.patch("carol", "r", [_replace("/spec/agent/tools/0/description", "any")])
    assert _denial(proc) == "spec.agent.tools[search]" + changed
    new = {"op": "add", "path": "/spec/agent/tools/-", "value": _tool("shell")}
    assert _denial(admission.patch("carol", "r", [new])) == "spec.agent.tools[shell]" + changed
    gone = {"op": "remove", "path": "/spec/agent/tools/0"}
    assert _denial(admission.patch("carol", "r", [gone])) == "spec.agent.tools[search]" + changed
    tools = admission.get("r")["spec"]["agent"]["tools"]
    swapped = _replace("/spec/agent/tools", list(reversed(tools)))
    assert _denial(admission.patch("carol", "r", [swapped])) == "spec.agent.tools" + changed
    # The tool choice: set, changed or removed.
    choice = {"op": "add", "path": "/spec/agent/toolChoice", "value": "required"}
    assert _denial(admission.patch("carol", "r", [choice])) == "spec.agent.toolChoice" + changed
    both = [choice, _replace("/spec/agent/model/name", "gpt-4o")]
    assert _denial(admission.patch("carol", "r", both)) == (
        "spec.agent.model.name, spec.agent.toolChoice" + changed
    )
    # The MCP servers: added, changed (where header Secrets go) or removed.
    server = {"name": "tools", "url": "http://tools.team.svc:8000/mcp", "tools": [{"name": "s"}]}
    added = {"op": "add", "path": "/spec/agent/mcpServers", "value": [server]}
    assert _denial(admission.patch("carol", "r", [added])) == "spec.agent.mcpServers" + changed
    admission.created("alice", _agent_run("served", agent_extra={"mcpServers": [server]}))
    moved = _replace("/spec/agent/mcpServers/0/url", "http://attacker.example/mcp")
    assert _denial(admission.patch("carol", "served", [moved])) == (
        "spec.agent.mcpServers" + changed
    )
    dropped = {"op": "remove", "path": "/spec/agent/mcpServers"}
    assert _denial(admission.patch("carol", "served", [dropped])) == (
        "spec.agent.mcpServers" + changed
    )
    # An HTTP tool: where its request goes and which hosts it may reach.
    fetch = {k: v for k, v in _tool("fetch").items() if k != "container"}
    fetch["http"] = {"url": "https://api.example/{q}", "allowedHosts": ["api.example"]}
    admission.created("alice", _agent_run("fetching", agent_extra={"tools": [fetch]}))
    elsewhere = [
        _replace("/spec/agent/tools/0/http/url", "https://attacker.example/{q}"),
        _replace("/spec/agent/tools/0/http/allowedHosts", ["attacker.example"]),
    ]
    assert _denial(admission.patch("carol", "fetching", elsewhere)) == (
        "spec.agent.tools[fetch]" + changed
    )
    admission.created("alice", _agent_run("chosen", agent_extra={"toolChoice": "auto"}))
    unset = {"op": "remove", "path": "/spec/agent/toolChoice"}
    assert _denial(admission.patch("carol", "chosen", [unset])) == (
        "spec.agent.toolChoice" + changed
    )
    # Rule g speaks first for a tool an update would gate less.
    lowered = _replace("/spec/agent/tools/1/approval", "auto")
    assert "spec.agent.tools[restart]: cannot go from approval required" in _denial(
        admission.patch("carol", "r", [lowered])
    )
    # The agent can be neither removed nor added.
    proc = admission.patch("carol", "r", [{"op": "remove", "path": "/spec/agent"}])
    assert _denial(proc) == "spec.agent: cannot be removed" + why
    admission.created("alice", _run("plan-only"))
    agent = _agent_run("x")["spec"]["agent"]
    proc = admission.patch("carol", "plan-only", [{"op": "add", "path": "/spec/agent",
                                                   "value": agent}])  # fmt: skip
    assert _denial(proc) == "spec.agent: cannot be added" + why
    # The rest of the agent and of the spec can change, by whoever may edit the run.
    run = admission.patched(
        "carol",
        "r",
        [
            {"op": "add", "path": "/spec/agent/maxTurns", "value": 3},
            {"op": "add", "path": "/spec/agent/instructions", "value": "Be brief."},
            {"op": "add", "path": "/spec/budget", "value": {"maxTokens": 1000}},
        ],
    )
    assert run["spec"]["agent"]["maxTurns"] == 3
    assert run["spec"]["agent"]["model"]["baseURL"] == "http://llm.models.svc:8000/v1"


def test_a_128_step_plan_is_checked_within_the_cost_limits(admission: Admission) -> None:
    """The largest plan the CRD allows (128 steps, each depending on earlier ones): an update
    that changes every step is admitted, and one that lowers the last step's approval is
    refused with its message, not with a CEL cost error."""
    names = [f"step-{i:03d}" for i in range(m.MAX_STEPS)]

    def steps(approval: str) -> list[dict[str, Any]]:
        return [
            _step(
                name,
                "write",
                approval,
                **({"dependsOn": names[max(0, i - 4) : i]} if i else {}),
            )
            for i, name in enumerate(names)
        ]

    policy = {
        "approvalRequiredFor": ["write", "external"],
        "approverGroups": [APPROVERS],
        "requireSecondPerson": True,
    }
    admission.created("alice", _run("big", policy=policy, plan=_plan(*steps("auto")), approvals=[]))

    raised = steps("required")
    for step in raised:
        step["risk"] = "external"
        step["container"]["args"].append("--raised")
    run = admission.patched(
        "bob",
        "big",
        [
            _replace("/spec/plan/steps", raised),
            {"op": "add", "path": "/spec/approvals/-", "value": _approval("bob")},
        ],
    )
    assert [s["approval"] for s in run["spec"]["plan"]["steps"]] == ["required"] * m.MAX_STEPS
    assert run["metadata"]["annotations"][m.ANNOTATION_MODIFIED_BY] == "bob"

    last = m.MAX_STEPS - 1
    proc = admission.patch("bob", "big", [_replace(f"/spec/plan/steps/{last}/approval", "auto")])
    assert _denial(proc) == (
        f"spec.plan.steps[{names[last]}].approval: cannot be lowered from required to auto "
        "after creation"
    )
    proc = admission.patch("bob", "big", [_replace("/spec/plan/steps", steps("auto"))])
    # Five steps named, the rest counted: a message longer than 5 KiB would be dropped.
    message = _denial(proc)
    assert message.startswith(
        "spec.plan.steps[step-000].approval: cannot be lowered from required to auto after "
        "creation; spec.plan.steps[step-001].approval"
    ), message
    assert message.endswith(
        "; spec.plan.steps[step-004].approval: cannot be lowered from required to auto after "
        f"creation (and {m.MAX_STEPS - 5} more steps)"
    ), message
