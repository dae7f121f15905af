"""Packaging: the Helm chart (charts/agentrun-operator) and the kubectl manifests (manifests/).

* The copies of the CRD that packaging needs (the chart's crds/, manifests/crds/) equal the
  generated crds/ (``hack/helm/sync-crds.sh`` refreshes them); the chart's admission policies
  are manifests/admission itself (a symlink), not a copy. These need no cluster.
* ``helm lint``, ``helm template`` for the default (cluster-wide) and the namespaced mode,
  ``replicas`` (and its older name ``replicaCount``) with ``shards``, bad values refused by
  values.schema.json with a message that names the mistake.
* Every rendered object, and ``kubectl apply -k manifests/``, accepted by the real API server
  (``--dry-run=server``: admission and validation run, nothing is stored).
* ``helm install`` into the cluster, both modes, then ``helm uninstall``. The operator pod is not
  run (``replicaCount=0``), nor the uninstall hook's Job (``uninstall.releaseRuns=false``; its
  command is run in tests/e2e/test_namespace_deletion.py): the local node runs commands, it
  does not pull images; the operator
  under the chart's RBAC is tested in tests/e2e/test_rbac.py. The admission policies are
  cluster-wide, so installs here leave them out (other tests create runs as the admin with
  approvals signed by any name); the dry runs above check them.

Helm is built from its pinned Go module by ``hack/build-helm.sh`` (cached after the first
build, which takes a few minutes).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import TEST_LABELS, create_namespace, delete_namespace, read_or_none
from tests.support.helm import Docs, Helm, hooks, kinds, one, without_hooks
from tests.support.paths import CHART, CRD_FILE, MANIFESTS, REPO_ROOT

CRD_NAME = "agentruns.agentrun.dev"
SYNC_HINT = "run hack/helm/sync-crds.sh (after `make crds`) to refresh the copy"


@pytest.fixture
def cluster_helm(helm_binary: Path, cluster: TestCluster, tmp_path: Path) -> Helm:
    """helm against the test cluster."""
    return Helm(helm_binary, tmp_path / "helm-home", cluster.kubeconfig)


def container_args(docs: Docs) -> list[str]:
    deployment = one(docs, "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


# -- copies and references (no cluster) -------------------------------------------------------


@pytest.mark.parametrize(
    "copy",
    [CHART / "crds" / CRD_FILE.name, MANIFESTS / "crds" / CRD_FILE.name],
    ids=["chart", "manifests"],
)
def test_crd_copy_equals_the_generated_crd(copy: Path) -> None:
    assert copy.is_file(), f"{copy.relative_to(REPO_ROOT)} is missing: {SYNC_HINT}"
    assert copy.read_bytes() == CRD_FILE.read_bytes(), (
        f"{copy.relative_to(REPO_ROOT)} differs from crds/{CRD_FILE.name}: {SYNC_HINT}"
    )
    for directory in (CHART / "crds", MANIFESTS / "crds"):
        names = sorted(p.name for p in directory.iterdir())
        assert names == sorted(p.name for p in CRD_FILE.parent.glob("*.yaml")), SYNC_HINT


def test_chart_admission_policies_are_the_manifests_files() -> None:
    link = CHART / "files" / "admission"
    assert link.is_symlink(), "charts/agentrun-operator/files/admission must link to manifests/"
    assert link.resolve() == (MANIFESTS / "admission").resolve()


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {
        str(p.relative_to(MANIFESTS))
        for p in MANIFESTS.rglob("*.yaml")
        if p.name != "kustomization.yaml"
    }
    assert listed == on_disk, f"kustomization.yaml lists {sorted(listed)}, found {sorted(on_disk)}"


# -- helm lint and template ---------------------------------------------------------------------


def test_helm_lint(helm: Helm) -> None:
    helm.run("lint", "--strict", str(CHART))
    helm.run("lint", "--strict", str(CHART), "--set", "watchNamespaces={team-a,team-b}")
    helm.run("lint", "--strict", str(CHART), "--set", "metrics.serviceMonitor.enabled=true")
    helm.run("lint", "--strict", str(CHART), "--set", "replicas=3")


def test_template_default_is_cluster_wide(helm: Helm) -> None:
    docs = helm.template()
    installed = without_hooks(docs)
    assert sorted(kinds(installed)) == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",  # the key of Jobs' proofs, in the operator's own namespace
            "RoleBinding",
            "Deployment",
            "Service",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    assert container_args(docs) == ["run", "--all-namespaces"]
    binding = one(installed, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentrun-operator", "namespace": "agentrun-system"}
    ]

    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "agentrun-operator:0.1.0"  # the chart's appVersion
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["ports"][0]["containerPort"] == 8080
    assert container["ports"][1] == {"name": "metrics", "containerPort": 8081, "protocol": "TCP"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AGENTRUN_LIVENESS_PORT"] == "8080"
    assert env["AGENTRUN_METRICS_PORT"] == "8081"
    assert "AGENTRUN_SHARDS" not in env  # one replica, not sharded
    (pod_name,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    (pod_ns,) = [e for e in container["env"] if e["name"] == "POD_NAMESPACE"]
    assert pod_ns["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    signing = one(installed, "Role")
    assert signing["metadata"]["namespace"] == "agentrun-system"
    assert signing["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["agentrun-job-signing"],
            "verbs": ["get"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "create", "update", "delete"],
        },
    ]
    assert env["AGENTRUN_RESYNC_SECONDS"] == "30"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"]


def test_template_namespaced_mode_uses_roles(helm: Helm) -> None:
    docs = helm.template("--set", "watchNamespaces={team-a,team-b}")
    installed = without_hooks(docs)
    # Cluster-wide, only kopf's read-only discovery of Namespaces and CRDs.
    discovery = one(installed, "ClusterRole")
    assert discovery["metadata"]["name"] == "agentrun-operator-discovery"
    assert discovery["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
    ]
    assert one(installed, "ClusterRoleBinding")["roleRef"]["name"] == "agentrun-operator-discovery"
    signing = "agentrun-operator-signing"  # the key of Jobs' proofs, in its own namespace
    roles = [d for d in installed if d["kind"] == "Role" and d["metadata"]["name"] != signing]
    bindings = [
        d for d in installed if d["kind"] == "RoleBinding" and d["metadata"]["name"] != signing
    ]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == "agentrun-system"
    assert container_args(docs) == ["run", "--namespace", "team-a", "--namespace", "team-b"]
    # The cluster-wide mode's rules, minus the one cluster-scoped rule (CRDs).
    cluster_rules = one(without_hooks(helm.template()), "ClusterRole")["rules"]
    assert roles[0]["rules"] == [
        r for r in cluster_rules if r["apiGroups"] != ["apiextensions.k8s.io"]
    ]
    # The helm test run goes to a namespace the operator watches.
    run = one(docs, "AgentRun")
    assert run["metadata"]["namespace"] == "team-a"
    # Without kopf's discovery: nothing cluster-scoped at all.
    strict = without_hooks(
        helm.template("--set", "watchNamespaces={team-a}", "--set", "rbac.kopfDiscovery=false")
    )
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(kinds(strict))


def test_template_values_reach_the_deployment(helm: Helm) -> None:
    docs = helm.template(
        "--set",
        "image.repository=registry.example/agentrun",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "image.pullPolicy=Always",
        "--set",
        "replicaCount=0",
        "--set",
        "operator.resyncSeconds=7",
        "--set",
        "nodeSelector.disk=ssd",
        "--set",
        "tolerations[0].key=dedicated",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "admissionPolicies.enabled=false",
    )
    assert "ValidatingAdmissionPolicy" not in kinds(docs)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 0
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "AGENTRUN_SHARDS" not in {e["name"] for e in container["env"]}
    assert container["image"] == "registry.example/agentrun:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert {"name": "AGENTRUN_RESYNC_SECONDS", "value": "7"} in container["env"]
    assert pod["nodeSelector"] == {"disk": "ssd"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]


def _replicas_and_env(docs: Docs) -> tuple[int, str, dict[str, str | None]]:
    """The Deployment's replicas, strategy type and container env (name -> value)."""
    spec = one(docs, "Deployment")["spec"]
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return spec["replicas"], spec["strategy"]["type"], env


@pytest.mark.parametrize(
    ("values", "replicas", "shards"),
    [
        ([], 1, None),
        (["--set", "replicas=3"], 3, "12"),
        (["--set", "replicas=2", "--set", "shards=6"], 2, "6"),
        (["--set", "replicaCount=3"], 3, "12"),  # the older name
        (["--set", "replicaCount=0"], 0, None),
        (["--set", "replicas=1", "--set", "shards=6"], 1, None),  # shards only with > 1
        (["--set", "replicas=4", "--set", "replicaCount=1"], 4, "12"),  # replicas wins
        (["--set", "replicas=0", "--set", "replicaCount=3"], 0, None),  # ... also with 0
    ],
    ids=[
        "default",
        "replicas-3",
        "replicas-2-shards-6",
        "replica-count-3",
        "replica-count-0",
        "replicas-1-shards-6",
        "replicas-wins",
        "replicas-0-wins",
    ],
)
def test_replicas_share_the_runs_by_shards(
    helm: Helm, values: Sequence[str], replicas: int, shards: str | None
) -> None:
    # More than one replica: AGENTRUN_SHARDS on every replica, and a rolling update (each run
    # is decided by one replica at a time). 0 or 1: unsharded and Recreate, as before.
    got_replicas, strategy, env = _replicas_and_env(helm.template(*values))
    assert got_replicas == replicas
    assert env.get("AGENTRUN_SHARDS") == shards
    assert strategy == ("RollingUpdate" if shards else "Recreate")
    # Leases are named after the pod (AGENTRUN_IDENTITY defaults to POD_NAME), set either way.
    assert "POD_NAME" in env


def test_replica_count_from_a_values_file(helm: Helm, tmp_path: Path) -> None:
    # Numbers from a values file reach templates as floats, not as --set's integers.
    values = tmp_path / "values.yaml"
    values.write_text("replicaCount: 0\nshards: 4\n")
    assert _replicas_and_env(helm.template("-f", str(values)))[:2] == (0, "Recreate")
    values.write_text("replicas: 3\nreplicaCount: 1\nshards: 4\n")
    replicas, strategy, env = _replicas_and_env(helm.template("-f", str(values)))
    assert (replicas, strategy, env["AGENTRUN_SHARDS"]) == (3, "RollingUpdate", "4")


def test_the_operator_role_grants_leases_and_nothing_more(helm: Helm) -> None:
    # In the operator's own namespace only, whatever the mode: get, list, create, update,
    # delete on Leases (agentrun/loop/shards.py), no watch, no patch, no deletecollection.
    for values in ([], ["--set", "replicas=3"], ["--set", "watchNamespaces={team-a,team-b}"]):
        docs = without_hooks(helm.template(*values))
        lease_rules = [
            (doc["kind"], doc["metadata"].get("namespace"), rule)
            for doc in docs
            if doc["kind"] in ("Role", "ClusterRole")
            for rule in doc["rules"]
            if "leases" in rule["resources"] or "coordination.k8s.io" in rule["apiGroups"]
        ]
        assert lease_rules == [
            (
                "Role",
                "agentrun-system",
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "list", "create", "update", "delete"],
                },
            )
        ], values
    # The Role is granted even unsharded (scaling with AGENTRUN_SHARDS set needs no new RBAC).
    role = one(without_hooks(helm.template("--set", "replicaCount=0")), "Role")
    assert any(r["resources"] == ["leases"] for r in role["rules"])


def test_manifests_and_chart_grant_the_same_rules(helm: Helm) -> None:
    chart_role = one(without_hooks(helm.template()), "ClusterRole")
    manifest_docs = [
        d for d in yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text()) if isinstance(d, dict)
    ]
    assert one(manifest_docs, "ClusterRole")["rules"] == chart_role["rules"]
    chart_signing = one(without_hooks(helm.template()), "Role")
    assert one(manifest_docs, "Role")["rules"] == chart_signing["rules"]
    assert one(manifest_docs, "Role")["metadata"]["namespace"] == "agentrun-system"
    chart_deployment = one(helm.template(), "Deployment")["spec"]
    manifest_deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())["spec"]
    for key in ("replicas", "strategy"):
        assert manifest_deployment[key] == chart_deployment[key]
    chart_pod = chart_deployment["template"]["spec"]
    manifest_pod = manifest_deployment["template"]["spec"]
    assert manifest_pod["securityContext"] == chart_pod["securityContext"]
    for key in (
        "args",
        "env",
        "livenessProbe",
        "readinessProbe",
        "securityContext",
        "resources",
        "ports",
    ):
        assert manifest_pod["containers"][0][key] == chart_pod["containers"][0][key], key


def test_metrics_service_and_service_monitor(helm: Helm) -> None:
    docs = without_hooks(helm.template())
    service = one(docs, "Service")
    deployment = one(docs, "Deployment")
    assert service["metadata"]["name"] == "agentrun-operator-metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert "ServiceMonitor" not in kinds(docs)  # off by default
    plain = yaml.safe_load((MANIFESTS / "metrics-service.yaml").read_text())
    assert plain["spec"]["ports"] == service["spec"]["ports"]
    assert plain["spec"]["selector"].items() <= (
        yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())["spec"]["template"]["metadata"][
            "labels"
        ].items()
    )

    docs = helm.template(
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.interval=30s",
        "--set", "metrics.serviceMonitor.labels.release=prometheus",
        "--set-string", "metrics.service.annotations.prometheus\\.io/scrape=true",
        "--set", "operator.metricsPort=9100",
        "--set", "metrics.service.port=9200",
    )  # fmt: skip
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    assert service["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert service["spec"]["ports"][0]["port"] == 9200
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "AGENTRUN_METRICS_PORT", "value": "9100"} in container["env"]
    assert container["ports"][1]["containerPort"] == 9100

    assert "Service" not in kinds(helm.template("--set", "metrics.service.enabled=false"))
    proc = helm.run(
        "template", "x", str(CHART), "--set", "metrics.service.enabled=false",
        "--set", "metrics.serviceMonitor.enabled=true", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in proc.stderr


def test_template_uninstall_hook_releases_the_runs(helm: Helm) -> None:
    # Cluster-wide: a ClusterRole of its own, for the ServiceAccount of its own, before the Job.
    hook = hooks(helm.template(), "pre-delete")
    # And a Role (with its binding) in the release's namespace: stop-operator scales the
    # operator's Deployment to 0 and lists its pods.
    assert sorted(kinds(hook)) == [
        "ClusterRole", "ClusterRoleBinding", "Job", "Role", "RoleBinding", "ServiceAccount",
    ]  # fmt: skip
    for doc in hook:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert annotations["helm.sh/hook-weight"] == ("0" if doc["kind"] == "Job" else "-10")
        stop = doc["kind"] in ("Role", "RoleBinding")
        assert doc["metadata"]["name"] == f"agentrun-operator-release{'-stop' if stop else ''}"
    assert one(hook, "Role")["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["agentrun-operator"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    job = one(hook, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentrun-operator-release"
    assert pod["containers"][0]["image"] == "agentrun-operator:0.1.0"
    assert pod["containers"][0]["command"] == ["agentrun"]
    assert pod["containers"][0]["args"] == ["release", "--all-namespaces"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Only what `agentrun release` does: no watch, no create, nothing outside runs, their Jobs,
    # pods and ConfigMaps.
    verbs = {
        (group, resource, verb)
        for rule in one(hook, "ClusterRole")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {v for _, _, v in verbs} <= {"get", "list", "delete", "patch", "deletecollection"}
    assert {(g, r) for g, r, _ in verbs} == {
        ("agentrun.dev", "agentruns"),
        ("batch", "jobs"),
        ("", "pods"),
        ("", "configmaps"),
    }
    # Namespaced: a Role in each watched namespace, and the Job releases just those.
    hook = hooks(helm.template("--set", "watchNamespaces={team-a,team-b}"), "pre-delete")
    assert sorted(
        (r["metadata"]["namespace"], r["metadata"]["name"]) for r in hook if r["kind"] == "Role"
    ) == [
        ("agentrun-system", "agentrun-operator-release-stop"),
        ("team-a", "agentrun-operator-release"),
        ("team-b", "agentrun-operator-release"),
    ]
    assert "ClusterRole" not in kinds(hook)
    assert one(hook, "Job")["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "release", "--namespace", "team-a", "--namespace", "team-b",
    ]  # fmt: skip
    # Without RBAC of the chart's making, the Job runs as the operator's ServiceAccount.
    hook = hooks(helm.template("--set", "rbac.create=false"), "pre-delete")
    assert kinds(hook) == ["Job"]
    assert hook[0]["spec"]["template"]["spec"]["serviceAccountName"] == "agentrun-operator"
    # Turned off: no hook at all.
    assert not hooks(helm.template("--set", "uninstall.releaseRuns=false"), "pre-delete")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set-string", "replicaCount=two"], "at '/replicaCount': got string, want"),
        (["--set-string", "replicas=two"], "at '/replicas': got string, want"),
        (["--set", "replicas=-1"], "at '/replicas': minimum: got -1, want 0"),
        (["--set", "replicaCount=-1"], "at '/replicaCount': minimum: got -1, want 0"),
        (["--set", "shards=0"], "at '/shards': minimum: got 0, want 1"),
        (["--set-string", "shards=12"], "at '/shards': got string, want integer"),
        (["--set", "replicCount=1"], "additional properties 'replicCount' not allowed"),
        (["--set", "image.tga=x"], "at '/image': additional properties 'tga' not allowed"),
        (["--set", "watchNamespaces={Team_A}"], "at '/watchNamespaces/0'"),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (["--set", "operator.resyncSeconds=0"], "at '/operator/resyncSeconds'"),
        (["--set-string", "uninstall.releaseRuns=yes"], "at '/uninstall/releaseRuns'"),
        (["--set", "operator.metricsPort=0"], "at '/operator/metricsPort'"),
        (
            ["--set", "metrics.serviceMonitor.interval=soon"],
            "at '/metrics/serviceMonitor/interval'",
        ),
    ],
    ids=[
        "replica-count-string",
        "replicas-string",
        "replicas-negative",
        "replica-count-negative",
        "shards-zero",
        "shards-string",
        "unknown-key",
        "unknown-nested",
        "bad-namespace",
        "pull-policy",
        "resync-zero",
        "release-runs-string",
        "metrics-port-zero",
        "scrape-interval",
    ],
)
def test_schema_rejects_bad_values(helm: Helm, values: Sequence[str], message: str) -> None:
    proc = helm.run("template", "x", str(CHART), *values, check=False)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_admission_policies_need_kubernetes_1_36(helm: Helm) -> None:
    proc = helm.run("template", "x", str(CHART), "--kube-version", "1.35.0", check=False)
    assert proc.returncode != 0
    assert "admissionPolicies.enabled needs Kubernetes >= 1.36" in proc.stderr, proc.stderr
    helm.run(
        "template",
        "x",
        str(CHART),
        "--kube-version",
        "1.35.0",
        "--set",
        "admissionPolicies.enabled=false",
    )


# -- against the API server -----------------------------------------------------------------


@pytest.fixture
def other_namespace(kube: KubeClients, namespace: str) -> Iterator[str]:
    """A second fresh namespace (deleted afterwards)."""
    name = create_namespace(kube, f"{namespace[:50]}-b{secrets.token_hex(2)}", labels=TEST_LABELS)
    yield name
    delete_namespace(kube, name)


def _dry_run(cluster: TestCluster, docs: Docs) -> str:
    manifest = yaml.safe_dump_all(docs, sort_keys=False)
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert proc.returncode == 0, f"the API server refused:\n{proc.stderr}\n{proc.stdout}"
    return proc.stdout


def _create_service_accounts(cluster: TestCluster, docs: Docs) -> None:
    """Pods are only admitted when their ServiceAccount exists, which a dry run never makes."""
    accounts = [d for d in docs if d["kind"] == "ServiceAccount"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(accounts))


def test_rendered_objects_are_accepted_by_the_api_server(
    cluster: TestCluster, crd_installed: list[str], helm: Helm, namespace: str, other_namespace: str
) -> None:
    for args in (
        [],
        ["--set", f"watchNamespaces={{{namespace},{other_namespace}}}"],
        ["--set", "replicas=3"],
    ):
        docs = helm.template(
            *args, "--set", f"fullnameOverride=ar-{namespace}", namespace=namespace
        )
        _create_service_accounts(cluster, docs)
        out = _dry_run(cluster, docs)
        lines = out.splitlines()
        for doc in docs:
            name = doc["metadata"]["name"]
            assert any(f"/{name} " in line and "(server dry run)" in line for line in lines), (
                f"{doc['kind']} {name} not in:\n{out}"
            )


@pytest.fixture
def system_namespace(kube: KubeClients) -> Iterator[str]:
    """agentrun-system, created for the test unless it exists (then left alone)."""
    name = "agentrun-system"
    created = False
    try:
        kube.core.create_namespace(body={"metadata": {"name": name}})
        created = True
    except ApiException as error:
        if error.status != 409:
            raise
    yield name
    if created:
        delete_namespace(kube, name)


def test_kubectl_apply_k_manifests_dry_run(
    cluster: TestCluster, crd_installed: list[str], system_namespace: str
) -> None:
    # `kubectl apply -k manifests/` as a user runs it (the namespace must exist for a dry run:
    # nothing is stored, so objects in a namespace created by the same dry run are refused).
    proc = cluster.kubectl(
        "apply", "-k", str(MANIFESTS), "--dry-run=server", "--server-side", check=False
    )
    assert proc.returncode == 0, f"the API server refused:\n{proc.stderr}\n{proc.stdout}"
    for expected in (
        "customresourcedefinition.apiextensions.k8s.io/agentruns.agentrun.dev",
        "namespace/agentrun-system",
        "serviceaccount/agentrun-operator",
        "clusterrole.rbac.authorization.k8s.io/agentrun-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/agentrun-operator",
        "deployment.apps/agentrun-operator",
        "service/agentrun-operator-metrics",
        "networkpolicy.networking.k8s.io/agentrun-operator",
        "mutatingadmissionpolicy.admissionregistration.k8s.io/agentrun-identity",
        "validatingadmissionpolicy.admissionregistration.k8s.io/agentrun-approvals",
        "validatingadmissionpolicy.admissionregistration.k8s.io/agentrun-job-pods",
        "validatingadmissionpolicy.admissionregistration.k8s.io/agentrun-pod-doors",
    ):
        assert expected in proc.stdout, proc.stdout
    # Client-side apply (what `kubectl apply -k` does by default) is accepted as well.
    proc = cluster.kubectl("apply", "-k", str(MANIFESTS), "--dry-run=server", check=False)
    assert proc.returncode == 0, f"the API server refused:\n{proc.stderr}\n{proc.stdout}"


def install_without_operator_pod(helm: Helm, release: str, namespace: str, *values: str) -> None:
    """``helm install`` of the chart with no operator pod (the local node runs commands, not
    images), no uninstall hook (its Job runs the operator image too; its command is run in
    tests/e2e/test_namespace_deletion.py) and no admission policies (they are cluster-wide)."""
    helm.install(
        release, namespace, "--set", f"fullnameOverride={release}", "--set", "replicaCount=0",
        "--set", "admissionPolicies.enabled=false", "--set", "uninstall.releaseRuns=false",
        *values,
    )  # fmt: skip


def test_helm_install_cluster_wide(
    cluster: TestCluster,
    kube: KubeClients,
    crd_installed: list[str],
    cluster_helm: Helm,
    namespace: str,
) -> None:
    release = f"ar-{namespace}"[:53]
    install_without_operator_pod(cluster_helm, release, namespace)
    try:
        status = json.loads(
            cluster_helm.run("status", release, "-n", namespace, "-o", "json").stdout
        )
        assert status["info"]["status"] == "deployed"
        assert "get agentruns" in status["info"]["notes"]

        apps = cluster.kubectl("-n", namespace, "get", "deployment", release, "-o", "json")
        spec = json.loads(apps.stdout)["spec"]
        assert spec["replicas"] == 0
        assert spec["strategy"]["type"] == "Recreate"
        assert kube.core.read_namespaced_service_account(release, namespace)
        role = kube.rbac.read_cluster_role(release)
        assert {r.api_groups[0] for r in role.rules} >= {"agentrun.dev", "batch", ""}
        binding = kube.rbac.read_cluster_role_binding(release)
        assert binding.subjects[0].name == release
        assert binding.subjects[0].namespace == namespace
        assert kube.apiext.read_custom_resource_definition(CRD_NAME)
        # Shard Leases: what the operator does with them, in its own namespace only.
        operator = f"system:serviceaccount:{namespace}:{release}"

        def can(verb: str, where: str) -> bool:
            proc = cluster.kubectl(
                "auth", "can-i", verb, "leases.coordination.k8s.io", "-n", where,
                f"--as={operator}", check=False,
            )  # fmt: skip
            return proc.stdout.strip() == "yes"

        # The authorizer learns of new Roles by a watch.
        wait_for("the operator's Role to take effect", lambda: can("get", namespace))
        for verb in ("list", "create", "update", "delete"):
            assert can(verb, namespace), verb
        for verb in ("watch", "patch", "deletecollection"):
            assert not can(verb, namespace), verb
        assert not can("get", "default")
    finally:
        cluster_helm.uninstall(release, namespace)
    assert read_or_none(kube.rbac.read_cluster_role, release) is None
    assert read_or_none(kube.rbac.read_cluster_role_binding, release) is None
    # Helm never deletes the CRDs it installed (nor the runs they hold).
    assert kube.apiext.read_custom_resource_definition(CRD_NAME)


def test_helm_install_namespaced(
    cluster: TestCluster,
    kube: KubeClients,
    crd_installed: list[str],
    cluster_helm: Helm,
    namespace: str,
    other_namespace: str,
) -> None:
    release = f"ar-{namespace}"[:53]
    install_without_operator_pod(
        cluster_helm, release, namespace, "--set", f"watchNamespaces={{{other_namespace}}}"
    )
    try:
        role = kube.rbac.read_namespaced_role(release, other_namespace)
        assert any("agentruns" in r.resources for r in role.rules)
        binding = kube.rbac.read_namespaced_role_binding(release, other_namespace)
        assert binding.subjects[0].namespace == namespace
        assert read_or_none(kube.rbac.read_cluster_role, release) is None
        assert read_or_none(kube.rbac.read_namespaced_role, release, namespace) is None
        discovery = kube.rbac.read_cluster_role(f"{release}-discovery")
        assert {v for r in discovery.rules for v in r.verbs} == {"list", "watch"}
        deployment = json.loads(
            cluster.kubectl("-n", namespace, "get", "deployment", release, "-o", "json").stdout
        )
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args == ["run", "--namespace", other_namespace]
    finally:
        cluster_helm.uninstall(release, namespace)
    assert read_or_none(kube.rbac.read_cluster_role, f"{release}-discovery") is None
    wait_for(
        f"Role {other_namespace}/{release} to be gone",
        lambda: read_or_none(kube.rbac.read_namespaced_role, release, other_namespace) is None,
    )
