"""Fixtures of the end-to-end suite: the operator as a real process against the session
cluster (see tests/conftest.py). Every test under tests/e2e is marked ``e2e``.

* ``start_operator`` (function): ``start_operator(*, namespaces=None, env=None,
  kubeconfig=None, **kwargs) -> OperatorProcess``: starts an ``agentrun run`` process watching
  the test's namespace (or ``namespaces``), as the cluster's admin (or whom ``kubeconfig``
  names), with :data:`tests.support.cluster.OPERATOR_TEST_ENV` plus ``env``,
  logging under ``tmp_path``, and waits until its liveness endpoint answers. At teardown the
  namespace's AgentRuns are deleted while an operator still runs (so it cleans up and releases
  their finalizers), then every process started is stopped, and any finalizer left is
  removed: the namespace can go.
* ``operator`` (function): one such process for the test's ``namespace``.
* ``model`` (function): a scripted OpenAI-compatible model server on 127.0.0.1, for agent runs.

On failure the report gets the tail of every operator log of the test and a dump of the
namespace (AgentRuns, Jobs, pods, ConfigMaps, Events).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun_devcluster.modelserver import ScriptedModel
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import OPERATOR_TEST_ENV, StartOperator, release_finalizers

_HERE = Path(__file__).resolve().parent

_OPERATORS = pytest.StashKey[list[OperatorProcess]]()
_NAMESPACE = pytest.StashKey[str]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, attach the operator log tails and what the test's namespace holds."""
    report = yield
    if not report.failed or call.when not in ("call", "setup"):
        return report
    operators: list[OperatorProcess] = item.stash.get(_OPERATORS, [])
    for i, op in enumerate(operators):
        report.sections.append((f"operator log {i + 1}", op.logs(lines=150)))
    namespace = item.stash.get(_NAMESPACE, None)
    tc = getattr(item, "funcargs", {}).get("cluster")
    if namespace and isinstance(tc, TestCluster):
        report.sections.append((f"namespace {namespace}", _dump_namespace(tc, namespace)))
    return report


def _dump_namespace(tc: TestCluster, namespace: str) -> str:
    parts = []
    for args in (
        ("get", "agentruns,jobs,pods,configmaps", "-o", "wide"),
        ("get", "agentruns", "-o", "yaml"),
        ("get", "events", "--sort-by=.lastTimestamp"),
    ):
        try:
            proc = tc.kubectl("-n", namespace, *args, check=False, timeout=30)
            parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        except Exception as e:  # the dump must never hide the failure itself
            parts.append(f"$ kubectl {' '.join(args)}: {e!r}")
    return "\n".join(parts)


@pytest.fixture
def start_operator(
    request: pytest.FixtureRequest,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    crd_installed: list[str],
    tmp_path: Path,
) -> Iterator[StartOperator]:
    started: list[OperatorProcess] = []
    request.node.stash[_OPERATORS] = started
    request.node.stash[_NAMESPACE] = namespace

    def start(
        *,
        namespaces: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        kubeconfig: Path | None = None,
        **kwargs: Any,
    ) -> OperatorProcess:
        op = OperatorProcess(
            kubeconfig or cluster.kubeconfig,
            namespaces=list(namespaces) if namespaces is not None else [namespace],
            env={**OPERATOR_TEST_ENV, **(env or {})},
            log_path=tmp_path / f"operator-{len(started) + 1}.log",
            **kwargs,
        )
        started.append(op)  # before start: a failed start still shows its log
        op.start()
        return op

    yield start
    try:
        if any(op.alive() for op in started):
            _delete_runs(kube, namespace)
    finally:
        for op in reversed(started):
            op.stop()
        release_finalizers(kube, namespace)


def _delete_runs(kube: KubeClients, namespace: str, timeout: float = 60.0) -> None:
    """Delete the test's runs while an operator still runs, so that it cleans up and releases
    their finalizers (else the namespace would stay Terminating, on a real cluster too)."""
    kube.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    with contextlib.suppress(TimeoutError):
        wait_for(
            f"the AgentRuns in {namespace} to be gone",
            lambda: (
                not kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)[
                    "items"
                ]
            ),
            timeout=timeout,
        )


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    return start_operator()


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    """A scripted OpenAI-compatible model server on 127.0.0.1, for agent runs."""
    with ScriptedModel() as server:
        yield server
