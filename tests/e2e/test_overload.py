"""An API server that cannot keep up while many runs go.

* Shedding load: API Priority and Fairness puts the operator's user in a priority level of its
  own with the fewest seats there can be and no queue, so that requests beyond them are
  refused at once with 429 Too Many Requests. The throttled passes are tried again after the
  Retry-After the API server asks (``agentrun_throttled_passes_total``), and ``/metrics``
  shows the refusals (``agentrun_api_requests_total{code="429"}``); each retry, the
  operator's or kopf's, is one warning line of the log (``agentrun_api_retries_total``), and
  the log has no traceback.
* A slow API server, three ways (:func:`slowdown`): etcd stopped for 300 ms of every 400 ms
  (:class:`agentrun_devcluster.faults.Stutter`); etcd 50 ms away from the operator's API
  server (a second API server whose link to etcd is delayed); an admission policy (CEL, no
  webhook) that costs CPU on every write. The runs take longer, and the operator passes over
  them about as often per run as at full speed: no storm of passes.

What must hold in all: every run succeeds with every result, no step attempt runs twice and
no Job is created twice. No timing is asserted; the slow leg's figures are printed.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP
from agentrun_devcluster.faults import Stutter
from agentrun_devcluster.forwarder import Forwarder
from agentrun_devcluster.testing import KubeClients, TestCluster, job_creations, wait_for
from tests.support.cluster import StartOperator
from tests.support.jobs import job_manifest
from tests.support.oplogs import assert_retries_quiet
from tests.support.runs import agentrun, create, envelope, get, status_of, step
from tests.support.scraping import scrape, value

pytestmark = pytest.mark.e2e

FLOWCONTROL = ("flowcontrol.apiserver.k8s.io", "v1")
RUNS = 12
SLOW_RUNS = 6
"""Runs of each leg of the slow API server test (at full speed, then slowed)."""
ETCD_PAUSE, ETCD_PERIOD = 0.3, 0.4
"""etcd is stopped for ETCD_PAUSE seconds of every ETCD_PERIOD."""
ETCD_DELAY = 0.05
"""Seconds each chunk between an API server and etcd is held, each way."""
ADMISSION_LOOP, ADMISSION_RULES = 100, 8
"""The heavy policy's rules: ADMISSION_RULES of them, each ADMISSION_LOOP squared steps (within
the API server's cost budget of a request: 150 and 8 pass, 400 and 8 are refused)."""
ADMISSION_PROBE = "agentrun-slow-admission-probe"
"""The Job name the heavy policy refuses: a dry run of it tells that the policy is in force."""
ADMISSION_SAMPLES = 5
"""Dry-run Job creates timed with and without the heavy policy."""
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
    retried = assert_retries_quiet(op)  # each a line of its own, no traceback
    assert retried >= waited, (retried, waited)


@dataclass
class Slowdown:
    """A way to make the API server answer the operator slowly, switched on for a leg."""

    slow: Callable[[], contextlib.AbstractContextManager[object]]
    """The slow leg runs inside it."""
    kubeconfig: Path | None = None
    """The operator's (None: the cluster's admin kubeconfig)."""


@contextlib.contextmanager
def _delayed(link: Forwarder) -> Iterator[object]:
    link.delay = ETCD_DELAY
    try:
        yield link
    finally:
        link.delay = 0.0


def _admission_seconds(kube: KubeClients, namespace: str) -> float:
    """Mean seconds of a dry-run Job create in ``namespace`` (admission included)."""
    began = time.monotonic()
    for i in range(ADMISSION_SAMPLES):
        job = job_manifest(f"agentrun-admission-timing-{i}", ["true"])
        kube.batch.create_namespaced_job(namespace, job, dry_run="All")
    return (time.monotonic() - began) / ADMISSION_SAMPLES


def _denied(kube: KubeClients, namespace: str) -> bool:
    try:
        kube.batch.create_namespaced_job(
            namespace, job_manifest(ADMISSION_PROBE, ["true"]), dry_run="All"
        )
    except ApiException as error:
        # A ValidatingAdmissionPolicy's denial is 422 Invalid by default (403 with reason
        # Forbidden in its validation); either way the body names the policy.
        if error.status in (403, 422) and "agentrun-slow-" in str(error.body):
            return True
        raise
    return False


@contextlib.contextmanager
def _heavy_admission(kube: KubeClients, namespace: str) -> Iterator[object]:
    """A ValidatingAdmissionPolicy (CEL, no webhook) on the namespace's Jobs and runs (their
    status too) whose rules cost the API server real CPU on every create and update; each
    allows everything but a probe Job's name, which tells when the policy is in force."""
    admission = kube_client.AdmissionregistrationV1Api(kube.api_client)
    name = f"agentrun-slow-{secrets.token_hex(3)}"
    numbers = "[" + ",".join(str(i) for i in range(ADMISSION_LOOP)) + "]"
    heavy = f"{numbers}.all(i, {numbers}.all(j, i + j >= 0))"
    policy: Any = {
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["batch"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["jobs"],
                    },
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["agentruns", "agentruns/status"],
                    },
                ]
            },
            "validations": [
                *({"expression": heavy} for _ in range(ADMISSION_RULES)),
                {
                    "expression": f"object.metadata.name != '{ADMISSION_PROBE}'",
                    "message": "the probe of a slow admission policy",
                },
            ],
        },
    }
    binding: Any = {
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    fast = _admission_seconds(kube, namespace)
    admission.create_validating_admission_policy(policy)
    try:
        admission.create_validating_admission_policy_binding(binding)
        try:
            wait_for("the slow admission policy to be in force",
                     partial(_denied, kube, namespace), timeout=60)  # fmt: skip
            slow = _admission_seconds(kube, namespace)
            print(f"admission of a Job: {slow:.3f}s with the policy, {fast:.3f}s without")
            yield policy
        finally:
            admission.delete_validating_admission_policy_binding(name)
    finally:
        admission.delete_validating_admission_policy(name)


@pytest.fixture(params=["etcd-stopped-300-of-400-ms", "etcd-50-ms-away", "admission-cel-heavy"])
def slowdown(
    request: pytest.FixtureRequest, cluster: TestCluster, kube: KubeClients, namespace: str
) -> Iterator[Slowdown]:
    """How the slow leg is slowed:

    * ``etcd-stopped-300-of-400-ms``: etcd itself stalls (:class:`Stutter`), for every client;
    * ``etcd-50-ms-away``: the operator talks to a second API server of the control plane
      whose link to etcd holds every chunk 50 ms each way (a
      :class:`~agentrun_devcluster.forwarder.Forwarder`, as ``tc netem delay`` would on etcd's
      port); the controller manager and the node keep the first, at full speed;
    * ``admission-cel-heavy``: an admission policy that costs CPU on every write of the
      namespace's Jobs and runs (webhook-less: CEL in the API server).
    """
    control_plane = cluster.control_plane
    if control_plane is None:
        pytest.skip("the API server is slowed on the local control plane, not another cluster")
    if request.param == "etcd-stopped-300-of-400-ms":
        etcd_pid = control_plane.pids()["etcd"]
        yield Slowdown(partial(Stutter, etcd_pid, pause=ETCD_PAUSE, period=ETCD_PERIOD))
    elif request.param == "etcd-50-ms-away":
        etcd = urllib.parse.urlsplit(control_plane.etcd_url)
        assert etcd.hostname and etcd.port, control_plane.etcd_url
        with (
            Forwarder("127.0.0.1", (etcd.hostname, etcd.port), delay=0.0) as link,
            control_plane.add_apiserver(f"http://127.0.0.1:{link.port}") as api,
        ):
            yield Slowdown(partial(_delayed, link), api.kubeconfig)
    else:
        yield Slowdown(partial(_heavy_admission, kube, namespace))


def test_a_slow_api_server_slows_the_runs_without_a_storm_of_passes(
    slowdown: Slowdown,
    start_operator: StartOperator,
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    op = start_operator(kubeconfig=slowdown.kubeconfig)
    ledger = tmp_path / "executions.log"
    legs: dict[str, tuple[float, float]] = {}
    everyone: list[str] = []
    for leg in ("fast", "slow"):
        names = [f"{leg}-{i}" for i in range(SLOW_RUNS)]
        everyone += names
        before = value(scrape(op)[0], "agentrun_reconcile_duration_seconds_count")
        began = time.monotonic()
        with slowdown.slow() if leg == "slow" else contextlib.nullcontext():
            for name in names:
                create(kube, namespace, _plan(name, ledger))
            wait_for(f"the {leg} runs to finish", partial(_finished, kube, namespace, names),
                     timeout=300, interval=1)  # fmt: skip
        passes = value(scrape(op)[0], "agentrun_reconcile_duration_seconds_count") - before
        legs[leg] = (time.monotonic() - began, passes / len(names))
    print(
        "slowed: makespan {:.1f}s against {:.1f}s, passes per run {:.1f} against {:.1f}".format(
            legs["slow"][0], legs["fast"][0], legs["slow"][1], legs["fast"][1]
        )
    )
    _all_once(kube, cluster, namespace, everyone, ledger)
    assert legs["slow"][1] <= STORM * legs["fast"][1], f"a storm of passes: {legs}"
    assert op.alive() and op.starts == 1
