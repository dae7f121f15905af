"""Who wrote what, and in which order: field managers and Events of a real run.

* managedFields name ``agentrun-operator`` for the operator's writes (the run's status, its
  step Jobs) and ``kubectl-agentrun`` for the plugin's approval; nothing is left to the
  client library's default name (``OpenAPI-Generator``).
* The operator's Events are events.k8s.io/v1: ``reportingController`` the operator,
  ``reportingInstance`` its pod (POD_NAME, set by the chart and manifests from the downward
  API), ``eventTime`` to the microsecond, so Events of one second keep their order; ``kubectl
  get events`` and ``kubectl describe agentrun`` still show them.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from agentrun.api import models as m
from agentrun.api.models import API_VERSION, KIND
from agentrun.core.machine import posts_event
from agentrun.settings import FIELD_MANAGER
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import StartOperator
from tests.support.plugin import kubectl_agentrun, ok
from tests.support.runs import agentrun, create, envelope, jobs_of, status_of, step
from tests.support.waiting import wait_phase, wait_step_phase

POD_NAME = "agentrun-operator-5d8f7c9b4-x7k2q"
PLUGIN_MANAGER = "kubectl-agentrun"


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """managedFields by (manager, subresource)."""
    return {
        (e["manager"], e.get("subresource", "")): e.get("fieldsV1", {})
        for e in obj["metadata"].get("managedFields") or []
    }


def gated_run(cluster: TestCluster, namespace: str, name: str) -> None:
    """Created with kubectl, as a person would (so no write of the test's own Python client
    shows up in managedFields)."""
    run = agentrun(
        name,
        [
            step("fetch", envelope("fetched", tokens=3)),
            step("analyse", envelope("analysed"), after=["fetch"]),
            step("deploy", envelope("deployed"), after=["analyse"], approval="required"),
        ],
    )
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(run))


def test_writes_carry_the_operators_and_the_plugins_field_manager(
    start_operator: StartOperator, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    start_operator()
    name = "managed"
    gated_run(cluster, namespace, name)
    wait_step_phase(kube, namespace, name, "deploy", "WaitingForApproval")
    ok(kubectl_agentrun(cluster, "approve", name, "deploy", "-n", namespace, "--reason", "go"))
    run = wait_phase(kube, namespace, name, "Succeeded")

    fields = managers(run)
    assert (FIELD_MANAGER, "status") in fields, list(fields)
    assert "f:status" in fields[(FIELD_MANAGER, "status")], fields[(FIELD_MANAGER, "status")]
    assert (PLUGIN_MANAGER, "") in fields, list(fields)
    assert "f:approvals" in fields[(PLUGIN_MANAGER, "")].get("f:spec", {}), fields
    names = {manager for manager, _ in fields}
    assert "OpenAPI-Generator" not in names, names

    jobs = jobs_of(kube, namespace, run["metadata"]["uid"])
    assert jobs, "the run's Jobs are gone"
    for job in jobs:
        by = {f.manager for f in job.metadata.managed_fields or []}
        assert FIELD_MANAGER in by and "OpenAPI-Generator" not in by, (job.metadata.name, by)


def events_of(cluster: TestCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The events.k8s.io/v1 Events regarding run ``name``, as the API server returns them."""
    out = cluster.kubectl("-n", namespace, "get", "events.v1.events.k8s.io", "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return [e for e in items if (e.get("regarding") or {}).get("name") == name]


def test_events_name_the_pod_and_keep_their_order_within_a_second(
    start_operator: StartOperator, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    start_operator(env={"POD_NAME": POD_NAME})
    name = "reported"
    create(
        kube,
        namespace,
        agentrun(
            name,
            [step(f"gate-{i}", envelope("done"), approval="required") for i in range(3)],
        ),
    )
    # Three approvals asked for in one pass: at least two of their Events share a second.
    run = wait_phase(kube, namespace, name, "WaitingForApproval")
    history = [t for t in status_of(run)["history"] if posts_event(m.Transition.model_validate(t))]
    assert [t["reason"] for t in history] == ["ApprovalRequested"] * 3, history

    def all_posted() -> list[dict[str, Any]] | None:
        found = events_of(cluster, namespace, name)
        return found if len(found) >= len(history) else None

    posted = wait_for("an Event per notable transition", all_posted, timeout=30)
    for e in posted:
        assert e["reportingController"] == FIELD_MANAGER, e
        assert e["reportingInstance"] == POD_NAME, e
        assert e["action"] == "Reconcile", e
        assert e["regarding"]["kind"] == KIND and e["regarding"]["apiVersion"] == API_VERSION, e
        assert e.get("deprecatedLastTimestamp") is None, e

    stamps = {e["metadata"]["name"]: e["eventTime"] for e in posted}
    assert all(len(s) == len("2026-11-22T09:00:00.000000Z") for s in stamps.values()), stamps
    assert len(set(stamps.values())) == len(stamps), "two Events share a time"
    by_time = sorted(stamps, key=lambda n: stamps[n])
    assert sorted(stamps) == by_time, "names and times order the Events differently"
    seconds = Counter(s[:19] for s in stamps.values())
    assert max(seconds.values()) >= 2, f"no two Events in one second to order: {stamps}"

    # In time order, the Events tell the transitions in the order history records them.
    by_name = {e["metadata"]["name"]: e for e in posted}
    told = [(by_name[n]["reason"], by_name[n]["note"]) for n in by_time]
    transitions = [(t["reason"], t.get("message")) for t in sorted(history, key=lambda t: t["seq"])]
    assert told == transitions
    # kubectl events orders them by that time too.
    out = cluster.kubectl("-n", namespace, "events", "--for", f"agentrun/{name}").stdout
    reasons = [line.split()[2] for line in out.splitlines()[1:] if line.strip()]
    assert reasons == [reason for reason, _ in transitions], out

    # Readers of core/v1 Events see them too.
    expected = {reason for reason, _ in transitions}
    listed = cluster.kubectl("-n", namespace, "get", "events").stdout
    for reason in expected:
        assert reason in listed, listed
    described = cluster.kubectl("-n", namespace, "describe", f"agentrun/{name}").stdout
    section = described[described.index("Events:") :]
    for reason in expected:
        assert reason in section, section
    assert FIELD_MANAGER in section, section  # the From column
    core = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    assert {e.reason for e in core} == expected
    assert all(e.reporting_instance == POD_NAME for e in core if e.reporting_component)
