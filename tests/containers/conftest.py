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

from collections.abc import Generator, Iterator

import pytest

from agentrun_devcluster import binaries
from agentrun_devcluster.dockerapi import DockerEngine, engine_from_env
from agentrun_devcluster.testing import KubeClients, TestCluster, start_test_cluster
from tests.support.cluster import Kubectl, fresh_namespace, kube_clients
from tests.support.docker import Images, hack_script
from tests.support.helm import Helm


@pytest.fixture(scope="session")
def images() -> Images:
    hack_script("docker-up.sh")
    operator = hack_script("build-images.sh", "agentrun-operator:dev")  # base images first
    kubectl = hack_script("build-kubectl-image.sh")
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
    yield from kube_clients(docker_cluster)


@pytest.fixture(scope="session")
def dkubectl(docker_cluster: TestCluster) -> Kubectl:
    return docker_cluster.kubectl


@pytest.fixture(scope="session")
def dhelm(docker_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    home = tmp_path_factory.mktemp("helm-home")
    return Helm(binaries.helm_binary(), home, docker_cluster.kubeconfig)


@pytest.fixture
def dnamespace(request: pytest.FixtureRequest, dkube: KubeClients) -> Iterator[str]:
    yield from fresh_namespace(request, dkube)


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
