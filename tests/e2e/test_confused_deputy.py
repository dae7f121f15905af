"""The operator acts with the rights of a run's creator, never with its own.

With the shipped admission policies bound to the namespace (they record who created a run), a
user allowed to create AgentRuns but not to read a Secret or act as a ServiceAccount cannot
get either through a step: the step fails ``Forbidden`` naming the missing permission, no Job
is ever created (the API server's audit log shows no create at all), and the Secret's value
appears nowhere. A user granted those permissions (by name, one through a group) gets the step
run.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun.api.models import GROUP, PLURAL
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, audit_events
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.cluster import bind_role, mint_user, user_subject
from tests.support.runs import (
    Run,
    agentrun,
    condition,
    get,
    jobs_of,
    status_of,
    step,
    step_status,
)
from tests.support.waiting import assert_holds, wait_events, wait_phase

SECRET = "db-password"
ACCOUNT = "deployer"
DEPLOYERS = "deployers"
"""A group whose members may act as the ServiceAccount ``deployer``."""


@dataclass
class Namespace:
    """The test's namespace with the admission policies bound, a Secret, a ServiceAccount,
    and kubectl as mallory (may create runs, nothing more) and carol (may also read the
    Secret, and act as the ServiceAccount through her group)."""

    cluster: TestCluster
    kube: KubeClients
    name: str
    secret_value: str
    users: dict[str, Path]

    def create(self, user: str, run: Run) -> Run:
        proc = self.cluster.kubectl(
            "-n", self.name, "create", "-o", "json", "-f", "-",
            input=json.dumps(run), kubeconfig=self.users[user], check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        created: Run = json.loads(proc.stdout)
        return created


@pytest.fixture
def ns(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> Iterator[Namespace]:
    value = f"value-{secrets.token_hex(8)}"
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": SECRET}, "stringData": {"password": value}}
    )
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": ACCOUNT}})
    users: dict[str, Path] = {}
    run_rules = [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get", "list", "watch"]}
    ]
    for user, groups in (("mallory", []), ("carol", [DEPLOYERS])):
        to = cluster.kubeconfig.with_name(f"{namespace}-{user}.kubeconfig")
        users[user] = mint_user(cluster, user, groups, to)
        bind_role(kube, namespace, f"{user}-runs", run_rules, [user_subject(user)])
    bind_role(
        kube,
        namespace,
        "carol-reads-the-secret",
        [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get"],
                "resourceNames": [SECRET],
            }
        ],
        [user_subject("carol")],
    )
    bind_role(
        kube,
        namespace,
        "deployers-act-as-deployer",
        [
            {
                "apiGroups": [""],
                "resources": ["serviceaccounts"],
                "verbs": ["impersonate"],
                "resourceNames": [ACCOUNT],
            }
        ],
        [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DEPLOYERS}],
    )
    with policies_bound_to(
        cluster, namespace, creator_recorded(cluster, namespace, users["carol"])
    ):
        yield Namespace(cluster, kube, namespace, value, users)


def reads_the_secret(name: str, **spec: Any) -> Run:
    """One step with the Secret in its env; it reports only the value's length."""
    report = 'echo "{\\"ok\\": true, \\"summary\\": \\"length ${#DB_PASSWORD}\\"}"'
    reader = step("read", f"{report} > /dev/termination-log")
    reader["container"]["env"] = [
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "password"}}}
    ]
    return agentrun(name, [reader], **spec)


def acts_as_the_account(name: str) -> Run:
    return agentrun(
        name,
        [step("act", "echo acting > /dev/termination-log")],
        stepTemplate={"serviceAccountName": ACCOUNT},
    )


def job_creates(ns: Namespace) -> list[dict[str, Any]]:
    """Every Job create the API server received in the namespace, allowed or not."""
    return audit_events(ns.cluster, verb="create", resource="jobs", namespace=ns.name)


def assert_refused_without_a_job(ns: Namespace, name: str, step_name: str, missing: str) -> Run:
    run = wait_phase(ns.kube, ns.name, name, "Failed")
    st = step_status(run, step_name)
    error = st.get("error") or {}
    assert st["phase"] == "Failed" and error.get("reason") == "Forbidden", st
    assert f"creator mallory may not {missing} in {ns.name}" in error["message"], error
    assert st.get("attempt", 0) == 0 and not st.get("jobName"), st
    assert condition(run)["reason"] == "Forbidden", status_of(run)

    warnings = [e.message for e in wait_events(ns.kube, ns.name, name, "Forbidden", warning=True)]
    assert any(missing in w for w in warnings), warnings

    def no_job() -> None:
        assert not jobs_of(ns.kube, ns.name, run["metadata"]["uid"])
        if not ns.cluster.external:
            assert job_creates(ns) == [], "the operator asked for a Job"

    assert_holds(no_job, seconds=3)
    return run


def test_a_step_cannot_read_a_secret_its_creator_may_not_read(
    ns: Namespace, operator: OperatorProcess
) -> None:
    created = ns.create("mallory", reads_the_secret("steal"))
    annotations = created["metadata"].get("annotations") or {}
    assert annotations.get("agentrun.dev/created-by") == "mallory", annotations

    run = assert_refused_without_a_job(ns, "steal", "read", f"get secrets/{SECRET}")

    # The value is nowhere: not in the run, its Events, or the operator's log.
    events = ns.kube.core.list_namespaced_event(ns.name).items
    seen = json.dumps(run) + json.dumps([e.message for e in events]) + operator.log_text()
    assert ns.secret_value not in seen


def test_a_step_cannot_run_as_a_serviceaccount_its_creator_may_not_act_as(
    ns: Namespace,
) -> None:
    ns.create("mallory", acts_as_the_account("borrow"))
    assert_refused_without_a_job(ns, "borrow", "act", f"impersonate serviceaccounts/{ACCOUNT}")


def test_a_creator_with_the_rights_gets_the_step_run(ns: Namespace) -> None:
    run = reads_the_secret(
        "allowed", stepTemplate={"serviceAccountName": ACCOUNT}, retention={"keepJobs": "all"}
    )
    created = ns.create("carol", run)
    done = wait_phase(ns.kube, ns.name, "allowed", "Succeeded")
    read = step_status(done, "read")
    assert read["summary"] == f"length {len(ns.secret_value)}", read
    assert ns.secret_value not in json.dumps(get(ns.kube, ns.name, "allowed"))
    [job] = jobs_of(ns.kube, ns.name, created["metadata"]["uid"]) or [None]
    assert job is not None and job.spec.template.spec.service_account_name == ACCOUNT
