"""RBAC for people: the ClusterRoles agentrun-view, agentrun-edit, agentrun-define and
agentrun-approve of manifests/user-roles.yaml (and the chart's userRoles.create), against the
real API server.

Users are minted with client certificates and bound, by RoleBindings in a test namespace, to
the built-in ``view`` and ``edit`` ClusterRoles (which the real clusterrole-aggregation
controller of the local kube-controller-manager fills from the aggregated roles), or to
``agentrun-approve``. Every check is a real request as that user:

* view reads runs and nothing more; edit also creates, changes and deletes them; neither
  writes agentruns/status (only the operator does);
* Agents and ModelConfigs: view and edit read them, neither writes them; the namespace's
  admins (agentrun-define, aggregated into admin) define them;
* agentrun-approve records decisions (with the Python client, as ``kubectl agentrun`` does)
  and cannot create or delete runs;
* the truth about approving: RBAC cannot tell an approval from any other patch, so ``edit``
  may approve as well; ``spec.policy.approverGroups``, enforced by the admission policies, is
  what limits who approves a run.

The ClusterRoles are cluster-wide: the module installs them and deletes them afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml

from agentrun.api import models as m
from agentrun.clients.typed import AgentRunClient, DecisionError
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.admission import APPROVERS, policies_bound_to
from tests.support.cluster import mint_user, read_or_none, user_subject
from tests.support.helm import Docs, Helm
from tests.support.paths import MANIFESTS
from tests.support.runs import agentrun

pytestmark = pytest.mark.usefixtures("crd_installed")

ROLES_FILE = MANIFESTS / "user-roles.yaml"
ROLE_NAMES = ("agentrun-view", "agentrun-edit", "agentrun-define", "agentrun-approve")
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
HASH = "b" * 64
FORBIDDEN = "Forbidden"
SUSPEND = json.dumps({"spec": {"suspend": True}})
DEPLOY = {
    "name": "deploy",
    "risk": "external",
    "approval": "required",
    "container": {"image": "busybox:1.36"},
}


def shipped_roles() -> Docs:
    return [d for d in yaml.safe_load_all(ROLES_FILE.read_text()) if isinstance(d, dict)]


def aggregated_into(role: dict[str, Any]) -> set[str]:
    labels = role["metadata"].get("labels") or {}
    return {
        key.removeprefix(AGGREGATE)
        for key, value in labels.items()
        if key.startswith(AGGREGATE) and value == "true"
    }


def grants(role: dict[str, Any]) -> set[tuple[str, str]]:
    """(resource, verb) pairs of a role's rules on agentrun.dev."""
    return {
        (resource, verb)
        for rule in role.get("rules") or []
        if "agentrun.dev" in (rule.get("apiGroups") or [])
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }


# -- what the files say (no cluster) ------------------------------------------------------------


def test_the_roles_grant_what_their_names_say() -> None:
    roles = {r["metadata"]["name"]: r for r in shipped_roles()}
    assert sorted(roles) == sorted(ROLE_NAMES)
    readable = ("agentruns", "agentruns/status", "agents", "modelconfigs")
    reads = {(r, v) for r in readable for v in ("get", "list", "watch")}
    writes = {("agentruns", v) for v in ("create", "update", "patch", "delete")}
    assert grants(roles["agentrun-view"]) == reads
    assert grants(roles["agentrun-edit"]) == reads | writes  # Agents: read, never written
    assert grants(roles["agentrun-define"]) == {
        (r, v)
        for r in ("agents", "modelconfigs")
        for v in ("get", "list", "watch", "create", "update", "patch", "delete")
    }
    assert grants(roles["agentrun-approve"]) == {
        ("agentruns", v) for v in ("get", "list", "watch", "patch", "update")
    }
    for role in roles.values():  # status is the operator's alone
        assert not {v for r, v in grants(role) if r == "agentruns/status"} - {
            "get",
            "list",
            "watch",
        }
    assert aggregated_into(roles["agentrun-view"]) == {"view"}
    assert aggregated_into(roles["agentrun-edit"]) == {"edit", "admin"}
    assert aggregated_into(roles["agentrun-define"]) == {"admin"}
    assert aggregated_into(roles["agentrun-approve"]) == set()


def test_the_chart_renders_the_same_roles(helm: Helm) -> None:
    assert not [d for d in helm.template() if d["metadata"]["name"] in ROLE_NAMES]  # off by default
    rendered = {
        d["metadata"]["name"]: d
        for d in helm.template("--set", "userRoles.create=true")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] in ROLE_NAMES
    }
    shipped = {r["metadata"]["name"]: r for r in shipped_roles()}
    assert sorted(rendered) == sorted(shipped)
    for name, role in shipped.items():
        assert rendered[name]["rules"] == role["rules"], name
        assert aggregated_into(rendered[name]) == aggregated_into(role), name


# -- against the API server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def roles_installed(cluster: TestCluster, kube: KubeClients) -> Iterator[None]:
    """manifests/user-roles.yaml applied, and aggregated into the built-in roles."""
    cluster.kubectl("apply", "-f", str(ROLES_FILE))

    def built_in(name: str) -> set[tuple[str, str]]:
        return grants(kube.api_client.sanitize_for_serialization(kube.rbac.read_cluster_role(name)))

    def aggregated() -> bool:
        return (
            ("agentruns", "list") in built_in("view")
            and ("agentruns", "create") in built_in("edit")
            and ("agentruns", "delete") in built_in("admin")
            and ("agents", "get") in built_in("view")
            and ("modelconfigs", "get") in built_in("edit")
            and ("agents", "create") in built_in("admin")
        )

    try:
        wait_for("the clusterrole-aggregation controller to fill view, edit and admin", aggregated)
        yield
    finally:
        cluster.kubectl("delete", "-f", str(ROLES_FILE), "--ignore-not-found")
        for name in ROLE_NAMES:
            assert read_or_none(kube.rbac.read_cluster_role, name) is None, name


@pytest.fixture(scope="module")
def people(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """vera (to be bound to view), eddie (edit), abby (agentrun-approve, in the approvers'
    group). Kubeconfigs copied away at once: minting a name again overwrites the file."""
    groups = {"vera": ["readers"], "eddie": ["developers"], "abby": [APPROVERS]}
    out = tmp_path_factory.mktemp("people")
    return {u: mint_user(cluster, u, g, out / f"{u}.kubeconfig") for u, g in groups.items()}


@dataclass
class Team:
    """A namespace where vera views, eddie edits and abby approves."""

    cluster: TestCluster
    kube: KubeClients
    namespace: str
    people: dict[str, Path]
    clients: dict[str, KubeClients] = field(default_factory=dict)

    def kubectl(self, user: str, *args: str, input: str | None = None) -> CompletedProcess[str]:
        kubeconfig = None if user == "admin" else self.people[user]
        return self.cluster.kubectl(
            "-n", self.namespace, *args, input=input, check=False, kubeconfig=kubeconfig
        )

    def client(self, user: str) -> AgentRunClient:
        """The Python client, as ``user``."""
        if user not in self.clients:
            self.clients[user] = KubeClients.from_kubeconfig(self.people[user])
        return AgentRunClient(self.clients[user].api_client, namespace=self.namespace)

    def close(self) -> None:
        for clients in self.clients.values():
            clients.close()

    def create(self, user: str, name: str, **spec: Any) -> CompletedProcess[str]:
        return self.kubectl(user, "create", "-f", "-", input=json.dumps(run_body(name, **spec)))

    def set_waiting(self, name: str) -> None:
        """The status the operator writes when step deploy waits for approval of HASH."""
        status = {
            "phase": "WaitingForApproval",
            "steps": [{"name": "deploy", "phase": "WaitingForApproval", "argsHash": HASH}],
        }
        self.cluster.kubectl(
            "-n", self.namespace, "patch", "agentrun", name, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def approvals(self, name: str) -> list[dict[str, Any]]:
        body = self.kube.custom.get_namespaced_custom_object(
            m.GROUP, m.VERSION, self.namespace, m.PLURAL, name
        )
        found: list[dict[str, Any]] = body["spec"].get("approvals") or []
        return found


def run_body(name: str, **spec: Any) -> dict[str, Any]:
    return agentrun(name, [DEPLOY], goal="check who may do what", **spec)


def forbidden(proc: CompletedProcess[str]) -> str:
    assert proc.returncode != 0, f"expected a refusal, got: {proc.stdout}"
    assert FORBIDDEN in proc.stderr, proc.stderr
    return proc.stderr


def allowed(proc: CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def team(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    people: dict[str, Path],
    roles_installed: None,
) -> Iterator[Team]:
    for user, role in (("vera", "view"), ("eddie", "edit"), ("abby", "agentrun-approve")):
        kube.rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": f"{user}-{role}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [user_subject(user)],
            },
        )
    team = Team(cluster, kube, namespace, people)
    yield team
    team.close()


def test_view_reads_runs_and_nothing_more(team: Team) -> None:
    allowed(team.create("admin", "seen"))
    assert "seen" in allowed(team.kubectl("vera", "get", "agentruns", "-o", "name"))
    assert allowed(team.kubectl("vera", "get", "agentrun", "seen", "-o", "name")).strip() == (
        "agentrun.agentrun.dev/seen"
    )
    assert team.client("vera").get("seen").spec.goal == "check who may do what"

    forbidden(team.create("vera", "mine"))
    forbidden(team.kubectl("vera", "patch", "agentrun", "seen", "--type=merge", "-p", SUSPEND))
    forbidden(team.kubectl("vera", "delete", "agentrun", "seen"))
    # Nor can a viewer approve.
    team.set_waiting("seen")
    with pytest.raises(DecisionError, match="forbidden") as refused:
        team.client("vera").approve("seen", "deploy")
    assert refused.value.status == 403
    assert team.approvals("seen") == []


def test_edit_creates_changes_and_deletes_runs(team: Team) -> None:
    allowed(team.create("eddie", "mine"))
    allowed(team.kubectl("eddie", "patch", "agentrun", "mine", "--type=merge", "-p", SUSPEND))
    assert team.client("eddie").get("mine").spec.suspend is True
    allowed(team.kubectl("eddie", "delete", "agentrun", "mine", "--wait=false"))


@pytest.mark.parametrize("user", ["vera", "eddie", "abby"])
def test_nobody_but_the_operator_writes_status(team: Team, user: str) -> None:
    allowed(team.create("admin", "status-is-ours"))
    patch = json.dumps({"status": {"phase": "Succeeded", "message": f"says {user}"}})
    forbidden(
        team.kubectl(
            user, "patch", "agentrun", "status-is-ours", "--subresource=status", "--type=merge",
            "-p", patch,
        )
    )  # fmt: skip
    run = json.loads(allowed(team.kubectl("admin", "get", "agentrun", "status-is-ours", "-o=json")))
    body = json.dumps({**run, "status": {"phase": "Succeeded"}})
    forbidden(team.kubectl(user, "replace", "--subresource=status", "-f", "-", input=body))
    assert "status" not in json.loads(
        allowed(team.kubectl("admin", "get", "agentrun", "status-is-ours", "-o", "json"))
    )


def test_approve_records_decisions_and_cannot_create_or_delete(team: Team) -> None:
    allowed(team.create("admin", "gated"))
    team.set_waiting("gated")
    entry = team.client("abby").approve("gated", "deploy", reason="looked at the diff")
    assert (entry.by, entry.args_hash) == ("abby", HASH)
    assert team.approvals("gated") == [entry.to_wire()]

    assert "gated" in allowed(team.kubectl("abby", "get", "agentruns", "-o", "name"))
    forbidden(team.create("abby", "my-own"))
    forbidden(team.kubectl("abby", "delete", "agentrun", "gated"))
    running = json.dumps({"status": {"phase": "Running"}})
    forbidden(
        team.kubectl(
            "abby", "patch", "agentrun", "gated", "--subresource=status", "--type=merge",
            "-p", running,
        )
    )  # fmt: skip


def test_edit_may_approve_unless_approver_groups_say_otherwise(team: Team) -> None:
    """RBAC cannot tell an approval from another patch: an editor approves a run without
    policy.approverGroups, signed with their own name. With approverGroups, the admission
    policies refuse the editor and accept a member of the group."""

    forged = {"step": "deploy", "decision": "approve", "argsHash": HASH, "by": "nobody"}

    def enforced() -> bool:
        probe = json.dumps(run_body("probe", approvals=[forged]))
        proc = team.kubectl("eddie", "create", "--dry-run=server", "-f", "-", input=probe)
        return proc.returncode != 0 and "must be signed by the requesting user eddie" in proc.stderr

    with policies_bound_to(team.cluster, team.namespace, enforced):
        allowed(team.create("eddie", "open"))
        team.set_waiting("open")
        entry = team.client("eddie").approve("open", "deploy")
        assert entry.by == "eddie"
        assert team.approvals("open") == [entry.to_wire()]

        allowed(team.create("eddie", "guarded", policy={"approverGroups": [APPROVERS]}))
        team.set_waiting("guarded")
        only_approvers = f"policy.approverGroups allows only members of {APPROVERS}"
        with pytest.raises(DecisionError, match=only_approvers):
            team.client("eddie").approve("guarded", "deploy")
        assert team.approvals("guarded") == []
        approved = team.client("abby").approve("guarded", "deploy")
        assert team.approvals("guarded") == [approved.to_wire()]


AGENT: dict[str, Any] = {
    "apiVersion": f"{m.GROUP}/{m.VERSION}",
    "kind": "Agent",
    "metadata": {"name": "triage"},
    "spec": {"instructions": "Sort the ticket.", "modelConfigRef": {"name": "small"}},
}
MODEL_CONFIG: dict[str, Any] = {
    "apiVersion": f"{m.GROUP}/{m.VERSION}",
    "kind": "ModelConfig",
    "metadata": {"name": "small"},
    "spec": {"baseURL": "http://models.example:8000/v1", "name": "small-model"},
}


def test_edit_runs_agents_and_only_admins_define_them(team: Team) -> None:
    for body in (AGENT, MODEL_CONFIG):
        kind = body["kind"].lower()
        for user in ("vera", "eddie"):
            forbidden(team.kubectl(user, "create", "-f", "-", input=json.dumps(body)))
        allowed(team.kubectl("admin", "create", "-f", "-", input=json.dumps(body)))
        for user in ("vera", "eddie"):
            allowed(team.kubectl(user, "get", kind, body["metadata"]["name"]))
            forbidden(team.kubectl(user, "delete", kind, body["metadata"]["name"]))
            forbidden(
                team.kubectl(
                    user, "patch", kind, body["metadata"]["name"], "--type=merge",
                    "-p", json.dumps({"metadata": {"labels": {"changed": "yes"}}}),
                )
            )  # fmt: skip
    # edit starts runs of it: agentRef is theirs to write.
    run = {
        "apiVersion": f"{m.GROUP}/{m.VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": "of-triage"},
        "spec": {"goal": "sort ticket 7", "agentRef": {"name": "triage"}},
    }
    allowed(team.kubectl("eddie", "create", "-f", "-", input=json.dumps(run)))
