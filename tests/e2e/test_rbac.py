"""The operator runs with exactly the RBAC the Helm chart grants, and with nothing more.

The chart's ServiceAccount, (Cluster)Role and binding are rendered with ``helm template`` and
applied; the operator process gets a token kubeconfig of that ServiceAccount (never the admin's)
and must carry examples/incident-investigation.yaml to Succeeded, a run with a short retention
to its deletion, and a deleted run through cleanup, without a single 403 in its log. Then the
same identity is shown to be refused what it must not do: read Secrets, create pods, delete
namespaces, create or edit runs' specs and, in namespaced mode, touch anything outside the
namespaces it watches.

One more test runs on a control plane of its own with the OwnerReferencesPermissionEnforcement
admission plugin (on in OpenShift and some hardened clusters): step Jobs and result ConfigMaps
name their run as owner with blockOwnerDeletion, which that plugin only allows with ``update``
on ``agentruns/finalizers``; it shows the chart's rules pass, and fail without that one rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.settings import LABEL_RUN_UID
from agentrun_devcluster.controlplane import ControlPlane, wait_established
from agentrun_devcluster.node import NodeProcess
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import (
    OPERATOR_TEST_ENV,
    TEST_LABELS,
    create_namespace,
    delete_namespace,
    foreign_runs_restored,
)
from tests.support.helm import Docs, Helm, without_hooks
from tests.support.paths import CRDS_DIR, EXAMPLES_DIR
from tests.support.runs import agentrun, get, step
from tests.support.waiting import assert_holds

EXAMPLE = EXAMPLES_DIR / "incident-investigation.yaml"
EXAMPLE_RUN = "investigate-latency"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


# -- the chart's RBAC -------------------------------------------------------------------------


def render_rbac(helm: Helm, release: str, namespace: str, *values: str) -> Docs:
    """The chart's ServiceAccount and RBAC objects for release ``release`` in ``namespace``."""
    docs = helm.template(
        "--set", f"fullnameOverride={release}", "--set", "admissionPolicies.enabled=false",
        *values, release=release, namespace=namespace,
    )  # fmt: skip
    return [d for d in without_hooks(docs) if d["kind"] in RBAC_KINDS]


@dataclass
class Identity:
    """The operator's ServiceAccount, with a token kubeconfig of its own."""

    namespace: str
    name: str
    kubeconfig: Path

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


InstallRbac = Callable[..., Identity]


@pytest.fixture
def install_chart_rbac(cluster: TestCluster, helm: Helm) -> Iterator[InstallRbac]:
    """``install_chart_rbac(release_namespace, *helm_values, edit=None, on=cluster)``: apply the
    chart's RBAC objects (``edit`` may change them first) and return the identity. Cluster-scoped
    objects are deleted afterwards (the namespaced ones go with their namespaces)."""
    applied: list[tuple[TestCluster, Docs]] = []

    def install(
        release_namespace: str,
        *values: str,
        edit: Callable[[Docs], Docs] | None = None,
        on: TestCluster | None = None,
    ) -> Identity:
        target = on or cluster
        release = f"ar-{release_namespace}"[:50]
        docs = render_rbac(helm, release, release_namespace, *values)
        if edit is not None:
            docs = edit(docs)
        target.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        applied.append((target, docs))
        account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
        kubeconfig = target.mint_serviceaccount_kubeconfig(account["namespace"], account["name"])
        return Identity(account["namespace"], account["name"], kubeconfig)

    yield install
    for target, docs in applied:
        for doc in docs:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                target.kubectl(
                    "delete",
                    doc["kind"].lower(),
                    doc["metadata"]["name"],
                    "--ignore-not-found",
                    check=False,
                )


def can_i(cluster: TestCluster, who: Identity, *args: str) -> bool:
    """``kubectl auth can-i`` asked as the ServiceAccount itself (its own token)."""
    proc = cluster.kubectl("auth", "can-i", *args, kubeconfig=who.kubeconfig, check=False)
    answer = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {proc.stderr}"
    return answer == "yes"


#: HTTP 403 as a status code, not inside a port number or a timestamp's milliseconds.
HTTP_403 = re.compile(r"(?<![\w.:+-])403(?!\w)")


def forbidden_in(log: str) -> list[str]:
    """Lines of an operator log that report a refused request."""
    hits = []
    for line in log.splitlines():
        if HTTP_403.search(line) or "orbidden" in line or "Not enough permissions" in line:
            hits.append(line[:600])
    return hits


# -- driving runs -----------------------------------------------------------------------------


def short_lived_run(name: str) -> str:
    """A one-step run that the operator deletes 1 s after it finishes (retention)."""
    run = agentrun(
        name,
        [step("report", "echo done > /dev/termination-log")],
        goal="one step, then deleted by the operator",
        retention={"ttlSecondsAfterFinished": 1},
    )
    return yaml.safe_dump(run)


def exercise_operator(cluster: TestCluster, kube: KubeClients, namespace: str) -> None:
    """Every kind of request the operator makes: the example to Succeeded (Jobs, results,
    audit ConfigMaps, Events, Job deletion), a run deleted by its retention, and deletion
    cleanup of the example."""
    cluster.kubectl("-n", namespace, "apply", "-f", str(EXAMPLE))
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=short_lived_run("short-lived"))
    cluster.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Succeeded",
        f"agentrun/{EXAMPLE_RUN}",
        "--timeout=120s",
        timeout=150,
    )
    cluster.kubectl(
        "-n", namespace, "wait", "--for=delete", "agentrun/short-lived", "--timeout=60s", timeout=90
    )
    uid = get(kube, namespace, EXAMPLE_RUN)["metadata"]["uid"]
    wait_for(
        "the example's finished Jobs to be deleted after their grace period",
        lambda: not kube.batch.list_namespaced_job(namespace, label_selector=LABEL_RUN_UID).items,
        timeout=60,
    )
    cluster.kubectl(
        "-n", namespace, "delete", f"agentrun/{EXAMPLE_RUN}", "--timeout=60s", timeout=90
    )
    selector = f"{LABEL_RUN_UID}={uid}"
    assert not kube.core.list_namespaced_config_map(namespace, label_selector=selector).items
    assert not kube.core.list_namespaced_pod(namespace, label_selector=selector).items


def operator_as(identity: Identity, tmp_path: Path, **kwargs: Any) -> OperatorProcess:
    return OperatorProcess(
        identity.kubeconfig,
        # As the chart's Deployment sets it: the key of Jobs' proofs is kept in its namespace.
        env={**OPERATOR_TEST_ENV, "POD_NAMESPACE": identity.namespace},
        log_path=tmp_path / f"operator-{identity.name}.log",
        **kwargs,
    )


def exercise_as(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """Start ``operator``, :func:`exercise_operator` it, stop it; if anything fails, its log
    tail is printed."""
    try:
        operator.start()
        exercise_operator(cluster, kube, namespace)
    except BaseException:
        print(operator.logs(lines=200))
        raise
    finally:
        operator.stop()


# -- cluster-wide ---------------------------------------------------------------------------


@pytest.mark.usefixtures("crd_installed")
def test_operator_runs_with_the_charts_cluster_role(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    install_chart_rbac: InstallRbac,
    tmp_path: Path,
) -> None:
    identity = install_chart_rbac(namespace)
    operator = operator_as(identity, tmp_path, all_namespaces=True)
    with foreign_runs_restored(kube, namespace):
        exercise_as(operator, cluster, kube, namespace)
    assert forbidden_in(operator.log_text()) == [], operator.logs(lines=200)


@pytest.mark.usefixtures("crd_installed")
def test_charts_cluster_role_grants_nothing_more(
    cluster: TestCluster, namespace: str, install_chart_rbac: InstallRbac
) -> None:
    me = install_chart_rbac(namespace)
    ns = f"--namespace={namespace}"
    # What it needs (a sanity check that the identity is the chart's).
    for args in (
        ("list", "agentruns.agentrun.dev", "--all-namespaces"),
        ("watch", "jobs.batch", "--all-namespaces"),
        ("watch", "pods", "--all-namespaces"),
        ("watch", "events", "--all-namespaces"),
        ("create", "jobs.batch", ns),
        ("create", "events.events.k8s.io", ns),  # the operator's Events (agentrun.telemetry.events)
        ("patch", "agentruns.agentrun.dev", "--subresource=status", ns),  # the ledger's write
        # Asking whether a run's creator may use what its steps reference (agentrun.access.authz).
        ("create", "localsubjectaccessreviews.authorization.k8s.io", ns),
        # A sub-agent's call makes its child run (whose steps act for the parent's creator).
        ("create", "agentruns.agentrun.dev", ns),
    ):
        assert can_i(cluster, me, *args), f"{me.user} should be allowed to {' '.join(args)}"
    # What it must never do.
    for never in (
        ("get", "secrets", ns),
        ("list", "secrets", "--all-namespaces"),
        ("watch", "secrets", ns),
        ("create", "pods", ns),
        ("create", "pods", "--subresource=exec", ns),
        ("delete", "namespaces"),
        ("create", "namespaces"),
        ("update", "agentruns.agentrun.dev", ns),  # the spec belongs to users
        ("update", "agentruns.agentrun.dev", "--subresource=status", ns),  # patched only
        ("create", "serviceaccounts", "--subresource=token", ns),
        ("create", "rolebindings.rbac.authorization.k8s.io", ns),
        ("create", "deployments.apps", ns),
        ("impersonate", "users"),
        ("impersonate", "serviceaccounts", ns),
        ("create", "subjectaccessreviews.authorization.k8s.io"),  # only namespaced reviews
    ):
        assert not can_i(cluster, me, *never), f"{me.user} must not {' '.join(never)}"
    # And the API server refuses the real requests.
    proc = cluster.kubectl("-n", namespace, "get", "secrets", kubeconfig=me.kubeconfig, check=False)
    assert proc.returncode != 0 and "forbidden" in proc.stderr, proc.stderr
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-allowed", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["true"]}]},
    }
    proc = cluster.kubectl(
        "create", "-f", "-", input=yaml.safe_dump(pod), kubeconfig=me.kubeconfig, check=False
    )
    assert proc.returncode != 0 and "forbidden" in proc.stderr, proc.stderr
    proc = cluster.kubectl(
        "delete", "namespace", namespace, "--dry-run=server", kubeconfig=me.kubeconfig, check=False
    )
    assert proc.returncode != 0 and "forbidden" in proc.stderr, proc.stderr


# -- namespaced -----------------------------------------------------------------------------


@pytest.fixture
def home_namespace(kube: KubeClients, namespace: str) -> Iterator[str]:
    """The operator's own namespace in namespaced mode (like agentrun-system), not watched."""
    name = create_namespace(kube, f"{namespace[:50]}-home", labels=TEST_LABELS)
    yield name
    delete_namespace(kube, name)


@pytest.mark.usefixtures("crd_installed")
def test_operator_runs_with_the_charts_namespaced_roles(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    home_namespace: str,
    install_chart_rbac: InstallRbac,
    tmp_path: Path,
) -> None:
    me = install_chart_rbac(home_namespace, "--set", f"watchNamespaces={{{namespace}}}")
    # The API server's authorizer learns of new Roles by a watch: start once they hold.
    wait_for(
        "the chart's Role in the watched namespace to take effect",
        lambda: can_i(cluster, me, "get", "pods", f"--namespace={namespace}"),
        timeout=30,
    )
    operator = operator_as(me, tmp_path, namespaces=[namespace])
    exercise_as(operator, cluster, kube, namespace)
    log = operator.log_text()
    assert forbidden_in(log) == [], operator.logs(lines=200)

    # Only the watched namespace: nothing in its own namespace, nothing cluster-wide.
    watched, elsewhere = f"--namespace={namespace}", f"--namespace={home_namespace}"
    assert can_i(cluster, me, "patch", "agentruns.agentrun.dev", watched)
    assert can_i(cluster, me, "create", "events.events.k8s.io", watched)
    assert can_i(cluster, me, "create", "jobs.batch", watched)
    assert can_i(cluster, me, "create", "localsubjectaccessreviews.authorization.k8s.io", watched)
    # kopf's discovery (rbac.kopfDiscovery): list and watch of Namespaces and CRDs, read-only.
    assert can_i(cluster, me, "watch", "namespaces")
    assert can_i(cluster, me, "list", "customresourcedefinitions.apiextensions.k8s.io")
    for args in (
        ("get", "agentruns.agentrun.dev", elsewhere),
        ("list", "agentruns.agentrun.dev", elsewhere),
        ("patch", "agentruns.agentrun.dev", elsewhere),
        ("delete", "agentruns.agentrun.dev", elsewhere),
        ("list", "agentruns.agentrun.dev", "--all-namespaces"),
        ("create", "events.events.k8s.io", elsewhere),
        ("create", "jobs.batch", elsewhere),
        ("create", "localsubjectaccessreviews.authorization.k8s.io", elsewhere),
        ("create", "subjectaccessreviews.authorization.k8s.io"),
        ("list", "pods", elsewhere),
        ("list", "configmaps", elsewhere),
        ("get", "secrets", watched),
        ("create", "pods", watched),
        ("delete", "namespaces"),
        ("get", "namespaces"),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
        ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ):
        assert not can_i(cluster, me, *args), f"{me.user} must not {' '.join(args)}"
    proc = cluster.kubectl(
        "-n", home_namespace, "get", "agentruns", kubeconfig=me.kubeconfig, check=False
    )
    assert proc.returncode != 0 and "forbidden" in proc.stderr, proc.stderr


# -- OwnerReferencesPermissionEnforcement -------------------------------------------------------


@pytest.fixture
def strict_cluster(cluster: TestCluster, tmp_path: Path) -> Iterator[TestCluster]:
    """A control plane of its own (and a local node) with OwnerReferencesPermissionEnforcement,
    the CRD installed. Local control plane only."""
    if cluster.external or cluster.bin_dir is None:
        pytest.skip("needs the local control plane (starts one with another admission plugin)")
    cp = ControlPlane(
        cluster.bin_dir,
        state_dir=tmp_path / "strict-cp",
        extra_apiserver_args=["--enable-admission-plugins=OwnerReferencesPermissionEnforcement"],
    )
    node: NodeProcess | None = None
    try:
        cp.start()
        node = NodeProcess(
            cp.kubeconfig, state_dir=cp.state_dir / "node", log_path=cp.logs_dir / "node.log"
        ).start()
        strict = TestCluster(
            kubeconfig=cp.kubeconfig,
            kubectl_path=str(cp.kubectl),
            bin_dir=cluster.bin_dir,
            control_plane=cp,
            node=node,
        )
        strict.kubectl("apply", "--server-side", f"-f={CRDS_DIR}")
        wait_established(strict.kubectl_path, strict.kubeconfig, "agentruns.agentrun.dev")
        yield strict
    finally:
        if node is not None:
            node.stop()
        cp.stop()


def _without_finalizers_rule(docs: Docs) -> Docs:
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            doc["rules"] = [r for r in doc["rules"] if "agentruns/finalizers" not in r["resources"]]
    return docs


def test_owner_references_need_the_finalizers_rule(
    strict_cluster: TestCluster, install_chart_rbac: InstallRbac, tmp_path: Path
) -> None:
    kube = KubeClients.from_kubeconfig(strict_cluster.kubeconfig)
    try:
        # The chart's rules: the example succeeds although every Job and ConfigMap the operator
        # creates names the run as a blocking owner.
        ns = create_namespace(kube, "strict-chart-rules")
        me = install_chart_rbac(ns, "--set", f"watchNamespaces={{{ns}}}", on=strict_cluster)
        with operator_as(me, tmp_path, namespaces=[ns]) as operator:
            exercise_operator(strict_cluster, kube, ns)
        assert forbidden_in(operator.log_text()) == []

        # Without `update agentruns/finalizers` the plugin refuses the first step's Job.
        ns = create_namespace(kube, "strict-no-finalizers-rule")
        me = install_chart_rbac(
            ns,
            "--set",
            f"watchNamespaces={{{ns}}}",
            edit=_without_finalizers_rule,
            on=strict_cluster,
        )
        with operator_as(me, tmp_path, namespaces=[ns]) as operator:
            strict_cluster.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
            wait_for(
                "the operator to be refused a blocking owner reference",
                lambda: "cannot set blockOwnerDeletion" in operator.log_text(),
                timeout=60,
            )

            def no_job() -> None:
                jobs = kube.batch.list_namespaced_job(ns).items
                assert not jobs, [j.metadata.name for j in jobs]

            assert_holds(no_job, seconds=2)
            kube.custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, EXAMPLE_RUN, {"metadata": {"finalizers": None}}
            )
    finally:
        kube.close()
