"""The chart as a platform team installs it, with the locally built images."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrun_devcluster.ports import PortLease, lease_ports
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import create_namespace, delete_namespace
from tests.support.docker import Images
from tests.support.helm import Helm
from tests.support.paths import CHART, EXAMPLES_DIR
from tests.support.pods import Pod, as_dict, condition

RELEASE = "agentrun"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
RESTRICTED_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))


def values(images: Images, ports: PortLease) -> list[str]:
    """``--set`` flags: the local images (never pulled), the healthz and metrics ports on the
    two leased ports of the host (pods share the node's network here), and step Jobs kept long
    enough to look at their pods."""
    liveness, metrics = ports.ports
    settings = {
        "image.repository": images.operator.rpartition(":")[0],
        "image.tag": images.operator.rpartition(":")[2],
        "image.pullPolicy": "Never",
        "tests.image.repository": images.kubectl_repository,
        "tests.image.tag": images.kubectl_tag,
        "tests.image.pullPolicy": "Never",
        "tests.stepImage": images.step,
        "operator.livenessPort": str(liveness),
        "operator.metricsPort": str(metrics),
        "operator.resyncSeconds": "10",
        "operator.jobDeletionGraceSeconds": "600",
    }
    return [f for key, value in settings.items() for f in ("--set", f"{key}={value}")]


@dataclass
class Release:
    helm: Helm
    namespace: str
    images: Images

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.helm.run(*args, "-n", self.namespace, check=check)


@contextmanager
def installed(helm: Helm, kube: KubeClients, images: Images, namespace: str) -> Iterator[Release]:
    """``helm install --wait`` into ``namespace`` (labelled enforce=restricted: the operator's
    own pods pass the restricted standard too); ``helm uninstall`` afterwards if still there."""
    create_namespace(kube, namespace, labels=RESTRICTED_LABELS)
    release = Release(helm, namespace, images)
    ports = lease_ports(2)  # held while the operator's pod may listen on them
    try:
        install = ("install", RELEASE, str(CHART), "--wait", "--timeout", "5m")
        release.run(*install, *values(images, ports))
        yield release
    finally:
        if release.run("status", RELEASE, check=False).returncode == 0:
            release.run("uninstall", RELEASE, "--wait", "--timeout", "5m", check=False)
        delete_namespace(kube, namespace)
        ports.release()


def operator_pods(kube: KubeClients, namespace: str) -> list[Pod]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=OPERATOR_SELECTOR).items
    return [as_dict(kube, p) for p in pods]


def ready_operator_pod(kube: KubeClients, namespace: str, timeout: float = 180.0) -> Pod:
    """The one operator pod, once it is Ready and no other is left."""

    def one_ready() -> Pod | None:
        pods = operator_pods(kube, namespace)
        if len(pods) == 1 and condition(pods[0], "Ready") == "True":
            return pods[0]
        return None

    return wait_for(f"one Ready operator pod in {namespace}", one_ready, timeout=timeout)


def apply(cluster: TestCluster, namespace: str, path: Path, model_url: str = "") -> str:
    """``kubectl apply`` a manifest (one object, or several in order: the ModelConfig and
    Agent a run by reference names, then the run); the name of the AgentRun it made (of the
    one object, when it holds no AgentRun). With ``model_url``, every model endpoint it
    defines is that one: an agent's ``spec.agent.model.baseURL``, an Agent's
    ``spec.model.baseURL``, a ModelConfig's ``spec.baseURL``."""
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    if model_url:
        for body in docs:
            _point_models(body, model_url)
    proc = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", "-o", "name", input=yaml.safe_dump_all(docs)
    )
    made = proc.stdout.split()
    runs = [name for name in made if name.startswith("agentrun.agentrun.dev/")]
    (chosen,) = runs or made
    return chosen.rpartition("/")[2]


def _point_models(body: dict[str, Any], model_url: str) -> None:
    """Point the model endpoint ``body`` defines, if any, at ``model_url``."""
    spec = body.get("spec") or {}
    kind = body.get("kind")
    if kind == "ModelConfig":
        endpoint = spec
    elif kind == "Agent":
        endpoint = spec.get("model")
    else:
        endpoint = (spec.get("agent") or {}).get("model")
    if not endpoint:
        return
    endpoint["baseURL"] = model_url


def waiting_steps(run: dict[str, Any]) -> list[str]:
    """The steps of a run waiting for approval."""
    steps = (run.get("status") or {}).get("steps") or []
    return [s["name"] for s in steps if s.get("phase") == "WaitingForApproval"]
