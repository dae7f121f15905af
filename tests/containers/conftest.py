"""The container suite: the local control plane with a node that runs pods as real Docker
containers (``--runtime docker``), the operator installed from the Helm chart and the
locally built image, step pods from real images. ``make containers`` runs it.

Session fixtures (their own, so the process-based suites' ``cluster`` is never touched):

* ``images``: a Docker engine (``hack/docker-up.sh``: Debian's docker.io, installed and
  started when the machine allows), the base images ``agentrun/debian:bookworm-slim`` and
  ``busybox:1.36`` (``hack/build-base-images.sh``, from Debian packages), the operator image
  ``agentrun-operator:dev`` (``hack/build-images.sh``, from the repository's Dockerfile) and
  ``agentrun/kubectl:<version>`` for ``helm test`` (``hack/build-kubectl-image.sh``). Each
  script reuses what is current, so a warm run costs seconds.
* ``docker_cluster``: etcd, kube-apiserver and kube-controller-manager as local processes and
  the local node with the docker runtime (fails if the node ends up in any other mode).
* ``dkube`` (API clients), ``dkubectl`` (``kubectl`` against it), ``dhelm`` (helm against it).
* ``dnamespace`` (function): a fresh namespace, deleted afterwards.

The whole suite skips, saying why, when no Docker engine can be had here (not root, no apt,
dockerd does not start: ``hack/docker-up.sh`` exits 3 and its last line is the reason).
``AGENTRUN_REQUIRE_DOCKER=1`` makes that a failure. Any other failure to build an image is a
failure, with the script's output.

A failing test gets the node's log tail, the cluster's pods and the output of the operator's
containers attached to its report.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import pytest

from agentrun_devcluster import binaries
from agentrun_devcluster.dockerapi import DockerEngine, engine_from_env
from agentrun_devcluster.testing import KubeClients, TestCluster, start_test_cluster
from tests.support.cluster import TEST_LABELS, Kubectl, create_namespace, delete_namespace
from tests.support.helm import Helm
from tests.support.paths import REPO_ROOT

HACK = REPO_ROOT / "hack"
NO_DOCKER = 3
"""The scripts' exit code for "no Docker engine can be had here"."""
BUILD_TIMEOUT = 3600
REQUIRE_ENV = "AGENTRUN_REQUIRE_DOCKER"


@dataclass(frozen=True)
class Images:
    """The images the suite runs, all in the local engine."""

    operator: str
    step: str
    kubectl: str

    @property
    def kubectl_repository(self) -> str:
        return self.kubectl.rpartition(":")[0]

    @property
    def kubectl_tag(self) -> str:
        return self.kubectl.rpartition(":")[2]


def _script(name: str, *args: str) -> str:
    """Run ``hack/NAME``; its last stdout line. Skips the suite on "no Docker here" (unless
    required), fails on anything else."""
    proc = subprocess.run(
        [str(HACK / name), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    if proc.returncode == 0:
        lines = proc.stdout.strip().splitlines()
        return lines[-1] if lines else ""
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-8000:]}"
    if proc.returncode == NO_DOCKER:
        said = proc.stderr.strip().splitlines()
        reason = f"container suite: {said[-1] if said else 'no Docker engine'} (hack/{name})"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}\n{output}", pytrace=False)
        pytest.skip(reason)
    pytest.fail(f"hack/{name} exited with {proc.returncode}\n{output}", pytrace=False)


@pytest.fixture(scope="session")
def images() -> Images:
    _script("docker-up.sh")
    operator = _script("build-images.sh", "agentrun-operator:dev")  # base images first
    kubectl = _script("build-kubectl-image.sh")
    assert operator == "agentrun-operator:dev" and kubectl.startswith("agentrun/kubectl:")
    return Images(operator=operator, step="busybox:1.36", kubectl=kubectl)


@pytest.fixture(scope="session")
def engine(images: Images) -> DockerEngine:
    return engine_from_env()


_CLUSTER = pytest.StashKey[TestCluster]()


@pytest.fixture(scope="session")
def docker_cluster(request: pytest.FixtureRequest, images: Images) -> Iterator[TestCluster]:
    tc = start_test_cluster(runtime="docker", external_ok=False)
    request.config.stash[_CLUSTER] = tc
    try:
        assert tc.node is not None
        assert tc.node.runtime_in_use == "docker", (
            f"the local node runs pods with the {tc.node.runtime_in_use!r} runtime, not docker"
            f"\n{tc.logs()}"
        )
        yield tc
    finally:
        tc.stop()


@pytest.fixture(scope="session")
def dkube(docker_cluster: TestCluster) -> Iterator[KubeClients]:
    clients = KubeClients.from_kubeconfig(docker_cluster.kubeconfig)
    yield clients
    clients.close()


@pytest.fixture(scope="session")
def dkubectl(docker_cluster: TestCluster) -> Kubectl:
    return docker_cluster.kubectl


@pytest.fixture(scope="session")
def dhelm(docker_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    home = tmp_path_factory.mktemp("helm-home")
    return Helm(binaries.helm_binary(), home, docker_cluster.kubeconfig)


@pytest.fixture
def dnamespace(request: pytest.FixtureRequest, dkube: KubeClients) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = create_namespace(dkube, f"{base or 't'}-{secrets.token_hex(3)}", labels=TEST_LABELS)
    yield name
    delete_namespace(dkube, name)


# -- reports --------------------------------------------------------------------------------------


def report(tc: TestCluster) -> str:
    """The node's log tail, every pod, and the output of the operator's containers."""
    parts = [tc.logs()]
    proc = tc.kubectl("get", "pods", "-A", "-o", "wide", check=False)
    parts.append(f"--- pods\n{proc.stdout}{proc.stderr}")
    with_labels = {"io.kubernetes.container.name": "operator"}
    try:
        engine = engine_from_env()
        for c in engine.containers(with_labels):
            output = engine.logs(str(c["Id"]), tail=80).decode("utf-8", "replace")
            parts.append(f"--- operator container {c['Names']}\n{output}")
    except Exception as e:
        parts.append(f"--- no container output: {e}")
    state = tc.control_plane.state_dir / "node" / "pods" if tc.control_plane else None
    if state is not None and state.is_dir():
        for log in sorted(state.glob("*/operator.log"))[-2:]:
            tail = log.read_text(errors="replace").splitlines()[-60:]
            parts.append(f"--- {log}\n" + "\n".join(tail))
    return "\n".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    result = yield
    tc = item.config.stash.get(_CLUSTER, None)
    if result.failed and call.when in ("call", "setup") and tc is not None:
        result.sections.append(("container cluster", report(tc)))
    return result
