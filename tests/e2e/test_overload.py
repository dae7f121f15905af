"""An API server that cannot keep up while many runs go.

* Shedding load: API Priority and Fairness puts the operator's user in a priority level of its
  own with the fewest seats there can be and no queue, so that requests beyond them are
  refused at once with 429 Too Many Requests. The throttled passes are tried again after the
  Retry-After the API server asks (``agentrun_throttled_passes_total``), and ``/metrics``
  shows the refusals (``agentrun_api_requests_total{code="429"}``).
* A slow etcd: stopped for 300 ms of every 400 ms (:class:`agentrun_devcluster.faults.Stutter`),
  so that every write waits. The runs take longer, and the operator passes over them about as
  often per step as with etcd at full speed: no storm of passes.

What must hold in both: every run succeeds with every result, no step attempt runs twice and
no Job is created twice. No timing is asserted; the slow leg's figures are printed.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun_devcluster.faults import Stutter
from agentrun_devcluster.testing import KubeClients, TestCluster, job_creations, wait_for
from tests.support.cluster import StartOperator
from tests.support.runs import agentrun, create, envelope, get, status_of, step
from tests.support.scraping import scrape, value

pytestmark = pytest.mark.e2e

FLOWCONTROL = ("flowcontrol.apiserver.k8s.io", "v1")
RUNS = 12
SLOW_RUNS = 6
"""Runs of each leg of the slow-etcd test (at full speed, then slowed)."""
STORM = 3.0
"""How many times as many passes per run the slow leg may take as the fast one: more would
be passes that wake one another, not the runs' own steps."""
BRANCHES = 3
"""Steps of a run that go at once, then one that joins them."""


@pytest.fixture
def throttled(kube: KubeClients, cluster: TestCluster) -> Iterator[Path]:
    """A kubeconfig of a user with cluster-admin rights whose requests APF gives one
    share of the API server's seats (about 3 of 600) and no queue: what does not fit is refused
    with 429."""
    if cluster.control_plane is None:
        pytest.skip("the priority level is made on the local control plane, not another cluster")
    user = f"agentrun-throttled-{secrets.token_hex(3)}"
    kubeconfig = cluster.mint_user_kubeconfig(user)
    group, version = FLOWCONTROL
    level: dict[str, Any] = {
        "apiVersion": f"{group}/{version}",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": user},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 1,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            },
        },
    }
    schema: dict[str, Any] = {
        "apiVersion": f"{group}/{version}",
        "kind": "FlowSchema",
        "metadata": {"name": user},
        "spec": {
            "priorityLevelConfiguration": {"name": user},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [{"kind": "User", "user": {"name": user}}],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "clusterScope": True,
                            "namespaces": ["*"],
                        }
                    ],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }
    binding = {
        "metadata": {"name": user},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    kube.rbac.create_cluster_role_binding(binding)
    made: list[tuple[str, str]] = []
    try:
        for obj, kind_plural in ((level, "prioritylevelconfigurations"), (schema, "flowschemas")):
            kube.custom.create_cluster_custom_object(group, version, kind_plural, obj)
            made.append((kind_plural, obj["metadata"]["name"]))
        yield kubeconfig
    finally:
        for kind_plural, name in reversed(made):
            try:
                kube.custom.delete_cluster_custom_object(group, version, kind_plural, name)
            except ApiException as error:
                if error.status != 404:
                    raise
        kube.rbac.delete_cluster_role_binding(user)


def _plan(name: str, ledger: Path) -> dict[str, Any]:
    record = f'echo "$AGENTRUN_RUN/$AGENTRUN_STEP/$AGENTRUN_ATTEMPT" >> {shlex.quote(str(ledger))}'
    branches = [
        step(f"b{i}", f"{record}; {envelope(f'branch {i}', {'branch': i})}")
        for i in range(BRANCHES)
    ]
    join = step("join", f"{record}; {envelope('joined')}", after=[b["name"] for b in branches])
    return agentrun(name, [*branches, join])


def _finished(kube: KubeClients, namespace: str, names: list[str]) -> bool:
    phases = [status_of(get(kube, namespace, n)).get("phase") for n in names]
    return all(p in ("Succeeded", "Failed", "Cancelled") for p in phases)


def _all_once(
    kube: KubeClients, cluster: TestCluster, namespace: str, names: list[str], ledger: Path
) -> None:
    """Every run succeeded with every branch's result; every step ran once, in one Job."""
    steps = [*(f"b{i}" for i in range(BRANCHES)), "join"]
    for name in names:
        run = get(kube, namespace, name)
        assert status_of(run).get("phase") == "Succeeded", status_of(run)
        results = {s["name"]: s.get("result") for s in status_of(run).get("steps") or []}
        assert {k: json.loads(v) for k, v in results.items() if k != "join"} == {
            f"b{i}": {"branch": i} for i in range(BRANCHES)
        }
    ran = Counter(ledger.read_text().split())
    assert set(ran) == {f"{n}/{s}/1" for n in names for s in steps}, ran
    assert max(ran.values()) == 1, ran
    created = job_creations(cluster, namespace)
    assert len(created) == len(ran) and max(created.values()) == 1, created


def test_a_throttled_operator_waits_as_asked_and_loses_nothing(
    throttled: Path,
    start_operator: StartOperator,
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    op = start_operator(kubeconfig=throttled)
    ledger = tmp_path / "executions.log"
    names = [f"busy-{i}" for i in range(RUNS)]
    for name in names:
        create(kube, namespace, _plan(name, ledger))
    wait_for("every run to finish", lambda: _finished(kube, namespace, names), timeout=300)
    samples, _ = scrape(op)
    refused = value(samples, "agentrun_api_requests_total", code="429")
    waited = value(samples, "agentrun_throttled_passes_total")
    print(f"throttled: {refused:.0f} requests refused with 429, {waited:.0f} passes waited")
    _all_once(kube, cluster, namespace, names, ledger)
    assert refused >= 1, "the API server refused none of the operator's requests: no overload"
    assert op.alive() and op.starts == 1


def test_a_slow_etcd_slows_the_runs_without_a_storm_of_passes(
    start_operator: StartOperator,
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    if cluster.control_plane is None:
        pytest.skip("etcd is slowed on the local control plane, not another cluster's")
    op = start_operator()
    ledger = tmp_path / "executions.log"
    legs: dict[str, tuple[float, float]] = {}
    everyone: list[str] = []
    for leg in ("fast", "slow"):
        names = [f"{leg}-{i}" for i in range(SLOW_RUNS)]
        everyone += names
        before = value(scrape(op)[0], "agentrun_reconcile_duration_seconds_count")
        began = time.monotonic()
        with contextlib.ExitStack() as slowed:
            if leg == "slow":
                etcd = cluster.control_plane.pids()["etcd"]
                slowed.enter_context(Stutter(etcd, pause=0.3, period=0.4))
            for name in names:
                create(kube, namespace, _plan(name, ledger))
            wait_for(f"the {leg} runs to finish", partial(_finished, kube, namespace, names),
                     timeout=300, interval=1)  # fmt: skip
        passes = value(scrape(op)[0], "agentrun_reconcile_duration_seconds_count") - before
        legs[leg] = (time.monotonic() - began, passes / len(names))
    print(
        "slow etcd: makespan {:.1f}s against {:.1f}s, passes per run {:.1f} against {:.1f}".format(
            legs["slow"][0], legs["fast"][0], legs["slow"][1], legs["fast"][1]
        )
    )
    _all_once(kube, cluster, namespace, everyone, ledger)
    assert legs["slow"][1] <= STORM * legs["fast"][1], f"a storm of passes: {legs}"
