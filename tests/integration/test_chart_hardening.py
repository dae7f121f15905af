"""The chart on day one for a platform team (docs/install.md):

* every container of every pod the chart makes (the operator, the uninstall hook Job's, the
  ``helm test`` pod) has requests and limits of cpu, memory and ephemeral-storage, and a
  namespace whose ResourceQuota requires limits admits the hook's pod and the test pod (a
  server dry run on the local control plane);
* with more than one replica: a PodDisruptionBudget and a spread over nodes, both tunable;
* with ``networkPolicy.enabled``: a NetworkPolicy selects every one of those pods;
* the uninstall hook, as rendered (its stop-operator script, then ``agentrun release``), run
  here against the local control plane with a run and a step Job holding the operator's
  finalizers and no operator: nothing is left holding them, and deleting the CRD completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.settings import (
    JOB_FINALIZER,
    LABEL_MANAGED_BY,
    LABEL_RUN_UID,
    MANAGED_BY,
    RUN_FINALIZER,
)
from agentrun_devcluster.controlplane import wait_established
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.helm import Docs, Helm, hooks, one
from tests.support.paths import CRDS_DIR
from tests.support.runs import agentrun, step

RESOURCES = ("cpu", "memory", "ephemeral-storage")
CRD_NAME = "agentruns.agentrun.dev"


def pod_specs(docs: Docs) -> list[tuple[str, dict[str, Any]]]:
    """``(Kind/name, pod spec)`` of every pod the rendered objects make."""
    specs = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "Pod":
            specs.append((where, doc["spec"]))
        elif doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            specs.append((where, doc["spec"]["template"]["spec"]))
    return specs


def pod_labels(doc: dict[str, Any]) -> dict[str, str]:
    if doc["kind"] == "Pod":
        return dict(doc["metadata"].get("labels") or {})
    return dict(doc["spec"]["template"]["metadata"].get("labels") or {})


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions with In) takes ``labels``."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


# -- rendered (no cluster) --------------------------------------------------------------------


NAMESPACED_NO_RBAC = [
    *("--set", "watchNamespaces={team-a}", "--set", "rbac.create=false"),
    *("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=mine"),
]


@pytest.mark.parametrize(
    "values",
    [[], ["--set", "replicas=3"], NAMESPACED_NO_RBAC],
    ids=["default", "replicas-3", "namespaced-no-rbac"],
)
def test_every_container_has_requests_and_limits(helm: Helm, values: list[str]) -> None:
    specs = pod_specs(helm.template(*values))
    assert sorted(w for w, _ in specs) == [
        "Deployment/agentrun-operator",
        "Job/agentrun-operator-release",
        "Pod/agentrun-operator-test",
    ]
    for where, spec in specs:
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        for container in containers:
            resources = container.get("resources") or {}
            for kind in ("requests", "limits"):
                missing = [r for r in RESOURCES if r not in (resources.get(kind) or {})]
                assert not missing, f"{where} container {container['name']}: no {kind} {missing}"


def test_resources_come_from_values(helm: Helm) -> None:
    docs = helm.template(
        "--set", "uninstall.resources.limits.cpu=2", "--set", "tests.resources.limits.memory=1Gi"
    )  # fmt: skip
    job = one(hooks(docs, "pre-delete"), "Job")["spec"]["template"]["spec"]
    for container in [*job["initContainers"], *job["containers"]]:
        assert container["resources"]["limits"]["cpu"] == 2
    test_pod = one(hooks(docs, "test"), "Pod")["spec"]["containers"][0]
    assert test_pod["resources"]["limits"]["memory"] == "1Gi"


def test_disruption_budget_and_spread_with_several_replicas(helm: Helm) -> None:
    one_replica = helm.template()
    assert "PodDisruptionBudget" not in [d["kind"] for d in one_replica]
    assert (
        "topologySpreadConstraints"
        not in one(one_replica, "Deployment")["spec"]["template"]["spec"]
    )
    docs = helm.template("--set", "replicas=3")
    deployment = one(docs, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert deployment["spec"]["template"]["spec"]["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
    ]
    # Tuned, replaced, turned off.
    docs = helm.template("--set", "replicas=3", "--set", "podDisruptionBudget.minAvailable=2")
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    assert "maxUnavailable" not in one(docs, "PodDisruptionBudget")["spec"]
    docs = helm.template("--set", "replicas=3", "--set", "podDisruptionBudget.enabled=false")
    assert "PodDisruptionBudget" not in [d["kind"] for d in docs]
    zone = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": selector},
        }
    ]
    docs = helm.template(
        "--set", "replicas=3", "--set-json", f"topologySpreadConstraints={json.dumps(zone)}"
    )
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"] == zone
    docs = helm.template("--set", "replicas=3", "--set-json", "topologySpreadConstraints=[]")
    assert "topologySpreadConstraints" not in one(docs, "Deployment")["spec"]["template"]["spec"]


def test_network_policies_cover_every_pod(helm: Helm) -> None:
    docs = helm.template("--set", "networkPolicy.enabled=true", "--set", "replicas=3")
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job", "Pod"):
            continue
        chosen = [p for p in policies if selects(p["spec"]["podSelector"], pod_labels(doc))]
        assert len(chosen) == 1, f"{doc['kind']}/{doc['metadata']['name']}: {chosen}"
        spec = chosen[0]["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        if doc["kind"] == "Deployment":
            continue
        # The hook's and the test pod's: the API server only (no DNS), and no ingress.
        assert not spec.get("ingress")
        assert spec["egress"] == [
            {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}
        ]
    # The test pod is not the operator's: its labels say test.
    test_pod = one(hooks(docs, "test"), "Pod")
    assert test_pod["metadata"]["labels"]["app.kubernetes.io/component"] == "test"


# -- against the API server -------------------------------------------------------------------


@pytest.fixture
def limits_quota(kube: KubeClients, namespace: str) -> str:
    """A ResourceQuota in ``namespace`` that requires requests and limits of cpu, memory and
    ephemeral-storage of every pod, once the quota controller has computed its status."""
    hard = {
        f"{kind}.{resource}": "4" if resource == "cpu" else "4Gi"
        for kind in ("requests", "limits")
        for resource in RESOURCES
    }
    kube.core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "needs-limits"}, "spec": {"hard": hard}}
    )

    def computed() -> bool:
        status = kube.core.read_namespaced_resource_quota("needs-limits", namespace).status
        return bool(status and status.hard)

    wait_for("the quota's status", computed, timeout=60)
    return namespace


def _dry_run_create(cluster: TestCluster, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(body), check=False
    )


def test_a_quota_requiring_limits_admits_the_hook_and_the_test_pod(
    cluster: TestCluster, crd_installed: list[str], helm: Helm, limits_quota: str
) -> None:
    namespace = limits_quota
    docs = helm.template("--set", f"fullnameOverride=ar-{namespace}", namespace=namespace)
    accounts = [d for d in docs if d["kind"] == "ServiceAccount"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(accounts))
    job = one(hooks(docs, "pre-delete"), "Job")
    template = job["spec"]["template"]
    hook_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job["metadata"]["name"], "namespace": namespace,
                     "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }  # fmt: skip
    test_pod = one(hooks(docs, "test"), "Pod")
    # The quota is enforced: a pod without limits is refused.
    bare = json.loads(json.dumps(test_pod))
    del bare["spec"]["containers"][0]["resources"]["limits"]
    proc = _dry_run_create(cluster, bare)
    assert proc.returncode != 0 and "must specify" in proc.stderr, proc.stderr
    for pod in (hook_pod, test_pod):
        proc = _dry_run_create(cluster, pod)
        assert proc.returncode == 0, f"{pod['metadata']['name']} refused: {proc.stderr}"
    # The Job itself, too (the Job controller then makes the pod above).
    proc = _dry_run_create(cluster, job)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def crd_restored(cluster: TestCluster, crd_installed: list[str]) -> Iterator[None]:
    """The CRD installed again after the test deleted it (the session's other tests need it)."""
    yield
    files = sorted(CRDS_DIR.glob("*.yaml"))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", *(f"-f={p}" for p in files))
    wait_established(cluster.kubectl_path, cluster.kubeconfig, CRD_NAME)


def _hook_env(container: dict[str, Any], cluster: TestCluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, f"{cmd[:3]} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_uninstall_hook_without_an_operator_lets_the_crd_go(
    cluster: TestCluster, kube: KubeClients, helm: Helm, namespace: str, crd_restored: None
) -> None:
    # A run holding the operator's finalizer, and a step Job of it holding the Job finalizer;
    # no operator anywhere (the Deployment the hook would stop does not exist).
    body = agentrun("held", [step("one", command=["true"])])
    body["metadata"]["finalizers"] = [RUN_FINALIZER]
    run = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    uid = run["metadata"]["uid"]
    kube.batch.create_namespaced_job(
        namespace,
        {
            "metadata": {
                "name": "held-one-1",
                "finalizers": [JOB_FINALIZER],
                "labels": {LABEL_RUN_UID: uid, LABEL_MANAGED_BY: MANAGED_BY},
            },
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "step", "image": "busybox:1.36"}],
                    }
                },
            },
        },
    )

    # The hook as rendered (cluster-wide: every namespace), run here: its stop-operator
    # script under this Python, then `agentrun release` as the image's `agentrun` runs it.
    job = one(hooks(helm.template(namespace=namespace), "pre-delete"), "Job")
    pod = job["spec"]["template"]["spec"]
    (stop,) = pod["initContainers"]
    assert stop["command"][:2] == ["python", "-c"]
    out = _run([sys.executable, *stop["command"][1:]], _hook_env(stop, cluster)).stdout
    assert "not scaled: HTTP 404" in out and "no operator pod left" in out, out
    (release,) = pod["containers"]
    assert release["command"] == ["agentrun"]
    assert release["args"] == ["release", "--all-namespaces"]
    out = _run(
        [sys.executable, "-m", "agentrun.cli", *release["args"]], _hook_env(release, cluster)
    ).stdout
    assert f"released agentrun {namespace}/held" in out, out

    runs = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    assert runs["items"] == []
    jobs = kube.batch.list_namespaced_job(namespace).items
    assert [j.metadata.name for j in jobs if JOB_FINALIZER in (j.metadata.finalizers or [])] == []

    # Then the CRD: nothing holds it Terminating.
    kube.apiext.delete_custom_resource_definition(CRD_NAME)

    def crd_gone() -> bool:
        try:
            kube.apiext.read_custom_resource_definition(CRD_NAME)
        except ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(f"CRD {CRD_NAME} deleted", crd_gone, timeout=60)
