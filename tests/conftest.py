"""Session fixtures shared by the suites that need a real cluster (tests/integration and
tests/e2e share ONE session cluster). Fixtures are lazy: tests/unit never starts a cluster.

* ``cluster`` (session): a :class:`agentrun_devcluster.testing.TestCluster`. Starts the local
  control plane + local node, or uses the cluster of ``$AGENTRUN_TEST_KUBECONFIG`` and
  starts nothing. Sets ``KUBECONFIG`` and puts the kubectl bin dir first on ``PATH`` for
  subprocesses. If the cluster cannot start, every test using it ERRORs with the logs.
* ``kube`` (session): ``KubeClients`` (``.core``, ``.batch``, ``.custom``, ``.apiext``,
  ``.rbac``, ``.api_client``) built from the cluster's kubeconfig.
* ``kubectl`` (session): ``kubectl(*args, input=None, check=True) -> CompletedProcess[str]``.
* ``namespace`` (function): a fresh namespace (its ``default`` ServiceAccount exists),
  deleted afterwards.
* ``crd_installed`` (session): every YAML in ``crds/`` applied, CRDs Established; returns
  the CRD names.
* ``helm_binary`` (session): helm built by ``hack/build-helm.sh``; ``helm`` (session): a
  :class:`tests.support.helm.Helm` with a home of its own and no cluster (lint, template).

A failing test that used ``cluster`` gets the tails of the control-plane and node logs
attached to its report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster import binaries
from agentrun_devcluster.controlplane import wait_established
from agentrun_devcluster.testing import KubeClients, TestCluster, start_test_cluster
from tests.support.cluster import Kubectl, fresh_namespace, kube_clients
from tests.support.docker import DOCKER_MODULES
from tests.support.helm import Helm
from tests.support.paths import CRDS_DIR
from tests.support.schedule import durations_file, load_durations, ranked_groups, save_durations

_TESTS = Path(__file__).resolve().parent


def _group(path: Path) -> str:
    """The pytest-xdist group of a test file: ``docker`` for every test of the Docker engine
    (all of tests/containers, and the modules in :data:`DOCKER_MODULES`), else the file's path
    under tests/."""
    path = path.resolve()
    if _TESTS / "containers" in path.parents or path in DOCKER_MODULES:
        return "docker"
    if not path.is_relative_to(_TESTS):
        return path.as_posix()
    return path.relative_to(_TESTS).as_posix()


_DURATIONS = pytest.StashKey[dict[str, float]]()
_DURATIONS_INPUT = "agentrun_durations"
"""The key under which pytest-xdist's controller hands the recorded times to its workers."""


def _durations(config: pytest.Config) -> dict[str, float]:
    """The recorded times, read once per session: on an xdist worker, as its controller read
    them (every worker must collect in the same order, even if another session writes the
    file meanwhile); else from the file."""
    workerinput = getattr(config, "workerinput", None)
    if isinstance(workerinput, dict) and isinstance(workerinput.get(_DURATIONS_INPUT), dict):
        return dict(workerinput[_DURATIONS_INPUT])
    if _DURATIONS not in config.stash:
        config.stash[_DURATIONS] = load_durations(durations_file())
    return config.stash[_DURATIONS]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, for each worker it starts: hand it the recorded times."""
    node.workerinput[_DURATIONS_INPUT] = _durations(node.config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make test`` runs a worker more than
    the machine has CPUs, each with a session cluster of its own; most e2e time is waiting):
    a module's tests stay on one worker (its module fixtures are built once), and every test
    of the Docker engine on one: they share one engine, whose start installs Debian's
    docker.io on a new machine, and one set of images built from Debian packages; on two
    workers they would build the same images twice at once.

    The groups come longest first, by the last run's times on this machine
    (:mod:`tests.support.schedule`; ``make test`` passes ``--no-loadscope-reorder`` so that
    pytest-xdist hands them out in this order), each module's tests in their own order."""
    group_of: dict[pytest.Item, str] = {}
    for item in items:
        group_of[item] = _group(item.path)
        item.add_marker(pytest.mark.xdist_group(group_of[item]))
    groups = list(dict.fromkeys(group_of.values()))  # in the order first collected
    order = {g: i for i, g in enumerate(ranked_groups(groups, _durations(config)))}
    items.sort(key=lambda item: order[group_of[item]])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, attach the tails of the control-plane and local-node logs."""
    report = yield
    tc = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and call.when == "call" and isinstance(tc, TestCluster):
        logs = tc.logs()
        if logs:
            report.sections.append(("cluster logs", logs))
    return report


SLOWEST_MODULES = 10


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """The slowest test modules, each the sum of its tests' setup, call and teardown (on
    whichever worker ran them): where the suite's time goes, for cutting it. Each group's
    seconds are recorded for the next run's order (:mod:`tests.support.schedule`)."""
    by_module: dict[str, float] = {}
    counted: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            duration = getattr(report, "duration", None)
            if not nodeid or not isinstance(duration, float):
                continue
            module = nodeid.split("::", 1)[0]
            by_module[module] = by_module.get(module, 0.0) + duration
            if getattr(report, "when", "") == "call":
                counted[module] = counted.get(module, 0) + 1
    if not hasattr(config, "workerinput") and by_module:
        by_group: dict[str, float] = {}
        for module, seconds in by_module.items():
            group = _group(config.rootpath / module)
            by_group[group] = by_group.get(group, 0.0) + seconds
        path = durations_file()
        with contextlib.suppress(OSError):  # the order is a speed-up, never a failure
            save_durations(path, by_group, load_durations(path))
    if len(by_module) < 2:
        return
    terminalreporter.write_sep("=", f"slowest {SLOWEST_MODULES} modules")
    ranked = sorted(by_module.items(), key=lambda kv: kv[1], reverse=True)
    for module, seconds in ranked[:SLOWEST_MODULES]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {counted.get(module, 0):4d} tests  {module}")
    terminalreporter.write_line(f"{sum(by_module.values()):8.1f}s  in all {len(by_module)} modules")


@pytest.fixture(scope="session")
def cluster() -> Iterator[TestCluster]:
    tc = start_test_cluster()  # raises with component logs: tests ERROR, never skip
    mp = pytest.MonkeyPatch()
    env = tc.env()
    mp.setenv("KUBECONFIG", env["KUBECONFIG"])
    mp.setenv("PATH", env["PATH"])
    try:
        yield tc
    finally:
        mp.undo()
        tc.stop()


@pytest.fixture(scope="session")
def kube(cluster: TestCluster) -> Iterator[KubeClients]:
    yield from kube_clients(cluster)


@pytest.fixture(scope="session")
def kubectl(cluster: TestCluster) -> Kubectl:
    return cluster.kubectl


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: KubeClients) -> Iterator[str]:
    yield from fresh_namespace(request, kube)


@pytest.fixture(scope="session")
def crd_installed(cluster: TestCluster) -> list[str]:
    files = sorted(p for p in CRDS_DIR.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))
    names: list[str] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    if files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", *(f"-f={p}" for p in files))
    for name in names:
        wait_established(cluster.kubectl_path, cluster.kubeconfig, name)
    return names


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    return binaries.helm_binary()


@pytest.fixture(scope="session")
def helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm without a cluster (lint, template)."""
    return Helm(helm_binary, tmp_path_factory.mktemp("helm-home"))
