"""The AgentRun CRD against a real kube-apiserver: admission, printer columns, explain,
the status subresource and optimistic concurrency."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun_devcluster.testing import KubeClients
from tests.support.cluster import Kubectl
from tests.support.paths import EXAMPLES_DIR
from tests.support.runs import Run, agentrun, create, step

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
pytestmark = pytest.mark.usefixtures("crd_installed")


def _run(name: str = "r", steps: list[dict[str, Any]] | None = None, **spec: Any) -> Run:
    plan = steps if steps is not None else [step("a")]
    return agentrun(name, plan, goal="check admission", **spec)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_by_kubectl_apply(
    path: Path, kubectl: Kubectl, namespace: str
) -> None:
    out = kubectl("apply", "-n", namespace, "-f", str(path))
    # Every object of the file: the run, and the Agent and ModelConfig a run by reference names.
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    for doc in docs:
        made = f"{doc['kind'].lower()}.{m.GROUP}/{doc['metadata']['name']}"
        assert f"{made} created" in out.stdout, out.stdout
    (name,) = [doc["metadata"]["name"] for doc in docs if doc["kind"] == m.KIND]
    got = json.loads(kubectl("get", "agentrun", name, "-n", namespace, "-o", "json").stdout)
    # Structural defaulting filled in what the user left out: each step's and tool's risk.
    spec = got["spec"]
    defaulted = [
        *(spec.get("plan") or {}).get("steps", []),
        *(spec.get("agent") or {}).get("tools", []),
    ]
    assert all(s["risk"] in ("read", "write", "external") for s in defaulted), defaulted


INVALID = [
    ("duplicate-step-names", [step("a"), step("a")], {}, "Duplicate value"),
    (
        "missing-dependency",
        [step("deploy", after=["build"])],
        {},
        "every dependsOn entry must name a step of this plan",
    ),
    ("self-dependency", [step("a", after=["a"])], {}, "a step cannot depend on itself"),
    ("bad-step-name", [step("Build_Image")], {}, "should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"),
    (
        "negative-retry-limit",
        [step("a", retry={"limit": -1})],
        {},
        "should be greater than or equal to 0",
    ),
    (
        "unknown-risk",
        [step("a", risk="dangerous")],
        {},
        'supported values: "read", "write", "external"',
    ),
    (
        "input-not-a-dependency",
        [step("a"), step("b", inputs=[{"name": "X", "fromStep": "a"}])],
        {},
        "every inputs[].fromStep must be listed in dependsOn",
    ),
    (
        "env-value-and-valueFrom",
        [
            step(
                "a",
                container={
                    "image": "i",
                    "env": [
                        {
                            "name": "A",
                            "value": "1",
                            "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                        }
                    ],
                },
            )
        ],
        {},
        "an env var sets exactly one of value and valueFrom",
    ),
    ("no-steps", [], {}, "should have at least 1 items"),
    ("zero-timeout", [step("a", timeoutSeconds=0)], {}, "should be greater than or equal to 1"),
    (
        "bad-args-hash",
        None,
        {"approvals": [{"step": "a", "decision": "approve", "argsHash": "abc", "by": "alice"}]},
        "should match '^[a-f0-9]{64}$'",
    ),
    ("bad-budget", None, {"budget": {"maxSteps": 0}}, "should be greater than or equal to 1"),
]


@pytest.mark.parametrize(("case", "steps", "spec", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_runs_are_rejected_at_admission_with_a_clear_message(
    kube: KubeClients,
    namespace: str,
    case: str,
    steps: list[dict[str, Any]] | None,
    spec: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(ApiException) as info:
        create(kube, namespace, _run(case, steps, **spec))
    body = info.value.body
    assert info.value.status == 422 and body, body
    said = json.loads(body)["message"]
    assert message in said, said


def test_a_plan_changed_to_depend_on_a_missing_step_is_rejected_at_admission(
    kube: KubeClients, namespace: str
) -> None:
    """The dependsOn rule is not evaluated again for a plan a write leaves as it was (a status
    write, a label), but it is for one a write changes."""
    create(kube, namespace, _run("edited", [step("build"), step("deploy", after=["build"])]))
    kube.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "edited", {"metadata": {"labels": {"x": "y"}}}
    )
    with pytest.raises(ApiException) as info:
        kube.custom.patch_namespaced_custom_object(
            m.GROUP, m.VERSION, namespace, m.PLURAL, "edited",
            {"spec": {"plan": {"steps": [step("deploy", after=["build"])]}}},
        )  # fmt: skip
    body = info.value.body
    assert info.value.status == 422 and body, body
    said = json.loads(body)["message"]
    assert "every dependsOn entry must name a step of this plan" in said, said


def test_missing_goal_is_rejected_by_kubectl_with_the_field_named(
    kubectl: Kubectl, namespace: str
) -> None:
    body = _run("no-goal")
    del body["spec"]["goal"]
    out = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=False)
    assert out.returncode != 0
    assert "spec.goal: Required value" in out.stderr


def test_unknown_fields_are_refused_by_kubectl(kubectl: Kubectl, namespace: str) -> None:
    body = _run("typo")
    body["spec"]["plan"]["steps"][0]["dependson"] = ["x"]
    out = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=False)
    assert out.returncode != 0
    assert 'unknown field "spec.plan.steps[0].dependson"' in out.stderr


def test_get_shows_the_printer_columns_and_short_names(
    kube: KubeClients, kubectl: Kubectl, namespace: str
) -> None:
    body = create(kube, namespace, _run("columns"))
    status = {
        "phase": "Running",
        "progress": "1/3",
        "currentStep": "collect",
        "message": "running collect",
    }
    kube.custom.patch_namespaced_custom_object_status(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "columns", {"status": status}
    )
    for resource in ("agentruns", "agentrun", "ar"):  # agentrun: the category too
        out = kubectl("get", resource, "-n", namespace).stdout
        header, row = out.splitlines()[:2]
        assert header.split() == ["NAME", "PHASE", "PROGRESS", "STEP", "AGE", "MESSAGE"], resource
        assert row.split()[:4] == ["columns", "Running", "1/3", "collect"]
        assert row.endswith("running collect")
    assert body["metadata"]["generation"] == 1


def test_explain_teaches_the_api(kubectl: Kubectl) -> None:
    out = kubectl("explain", "agentrun.spec.plan.steps").stdout
    assert "One step of the plan" in out
    assert "dependsOn" in out and "Names of steps that must succeed before this one starts" in out
    assert "risk" in out and "approval" in out
    status = kubectl("explain", "agentrun.status.conditions").stdout
    assert "Succeeded (Unknown, True or False with a reason)" in status


def test_status_writes_cannot_change_spec_and_spec_writes_cannot_change_status(
    kube: KubeClients, namespace: str
) -> None:
    created = create(kube, namespace, _run("split"))
    body = copy.deepcopy(created)
    body["spec"]["goal"] = "changed through /status"
    body["status"] = {"phase": "Running", "message": "from status"}
    after_status = kube.custom.replace_namespaced_custom_object_status(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "split", body
    )
    assert after_status["spec"]["goal"] == "check admission"
    assert after_status["status"]["phase"] == "Running"
    assert after_status["metadata"]["generation"] == 1

    body = copy.deepcopy(after_status)
    body["spec"]["goal"] = "changed through the main resource"
    body["status"] = {"phase": "Succeeded", "message": "forged"}
    after_spec = kube.custom.replace_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "split", body
    )
    assert after_spec["spec"]["goal"] == "changed through the main resource"
    assert after_spec["status"]["phase"] == "Running"
    assert after_spec["metadata"]["generation"] == 2


def test_status_update_with_a_stale_resource_version_gets_409(
    kube: KubeClients, namespace: str
) -> None:
    created = create(kube, namespace, _run("occ"))
    stale = copy.deepcopy(created)
    fresh = copy.deepcopy(created)
    fresh["status"] = {"phase": "Running", "message": "first writer"}
    kube.custom.replace_namespaced_custom_object_status(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "occ", fresh
    )
    stale["status"] = {"phase": "Failed", "message": "stale writer"}
    with pytest.raises(ApiException) as info:
        kube.custom.replace_namespaced_custom_object_status(
            m.GROUP, m.VERSION, namespace, m.PLURAL, "occ", stale
        )
    assert info.value.status == 409
    current = kube.custom.get_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "occ"
    )
    assert current["status"]["message"] == "first writer"


def test_status_written_by_the_core_is_accepted_by_the_schema(
    kube: KubeClients, namespace: str
) -> None:
    """A status derived by the state machine round-trips through the API server unchanged."""
    from datetime import UTC, datetime

    from agentrun.core import Observed, reconcile

    created = create(kube, namespace, _run("core", [step("a"), step("b", after=["a"])]))
    run = m.AgentRun.model_validate(created)
    decision = reconcile(run, Observed(), datetime.now(UTC))
    body = copy.deepcopy(created)
    body["status"] = decision.status.to_wire()
    stored = kube.custom.replace_namespaced_custom_object_status(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "core", body
    )
    assert stored["status"] == decision.status.to_wire()


def test_the_ledgers_status_patch_is_fenced_and_stores_exactly_the_status_it_was_given(
    kube: KubeClients, namespace: str
) -> None:
    """The ledger writes a status as a JSON patch of what changed, fenced by the version
    read: the API server refuses it from a stale read (409, a Conflict) even when it changes
    nothing, stores exactly the status given (keys removed, list elements changed, a ring's
    oldest entries dropped), and answers with the version written, as the ledger says."""
    from datetime import UTC, datetime, timedelta

    from agentrun.core import Observed, reconcile
    from agentrun.loop.ledger import Conflict, Ledger

    def read() -> dict[str, Any]:
        got: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            m.GROUP, m.VERSION, namespace, m.PLURAL, "patched"
        )
        return got

    ledger = Ledger(kube.custom)
    created = create(kube, namespace, _run("patched", [step("a"), step("b", after=["a"])]))
    first = reconcile(m.AgentRun.model_validate(created), Observed(), datetime.now(UTC))
    stored = ledger.commit(created, first.status.to_wire())
    current = read()
    assert stored["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    assert stored["status"] == current["status"] == first.status.to_wire()
    assert stored["spec"] == current["spec"]

    with pytest.raises(Conflict):  # from the version before that write, even unchanged
        ledger.commit(created, first.status.to_wire())

    second = copy.deepcopy(first.status.to_wire())
    second["steps"][0]["phase"] = "Running"
    second["steps"][1]["message"] = "waits for a"
    second["message"] = "changed"
    second.pop("progress", None)
    history = second.get("history") or []
    later = [{**history[-1], "seq": history[-1]["seq"] + i, "reason": f"Later{i}"} for i in (1, 2)]
    second["history"] = [*history[1:], *later]
    stored = ledger.commit(stored, second)
    current = read()
    assert current["status"] == second == stored["status"]
    assert stored["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    # status.steps is atomic: managedFields hold it as one field, not each entry's fields.
    (entry,) = [e for e in current["metadata"]["managedFields"] if e.get("subresource") == "status"]
    assert entry["fieldsV1"]["f:status"]["f:steps"] == {}, entry["fieldsV1"]["f:status"]

    # The answer the ledger asks for is the version written only, not the run nor its metadata
    # (whose managedFields grow with the run).
    from agentrun.kubeapi import patch_status

    fence = {"op": "replace", "path": "/metadata/resourceVersion"}
    api_client = kube.custom.api_client
    answers: list[Any] = []
    send = api_client.call_api

    def recorded(*request: Any, **options: Any) -> Any:
        answers.append(send(*request, **options))
        return answers[-1]

    change = {"op": "replace", "path": "/status/message", "value": "answered"}
    with mock.patch.object(api_client, "call_api", recorded):
        written = patch_status(
            kube.custom, m.GROUP, m.VERSION, m.PLURAL, namespace, "patched",
            [{**fence, "value": stored["metadata"]["resourceVersion"]}, change],
            "agentrun-operator",
        )  # fmt: skip
    assert written == read()["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]
    table = json.loads(answers[-1].data)
    assert table["kind"] == "Table" and table["rows"]
    assert all(row.get("object") is None for row in table["rows"]), table["rows"]
    with pytest.raises(ApiException) as stale:
        patch_status(
            kube.custom, m.GROUP, m.VERSION, m.PLURAL, namespace, "patched",
            [{**fence, "value": stored["metadata"]["resourceVersion"]}], "agentrun-operator",
        )  # fmt: skip
    assert stale.value.status == 409
    stored = read()
    second = stored["status"]

    # A status read with a field the API server does not hold (pruned) is written whole.
    drifted = {**stored, "status": {**stored["status"], "pruned": {"x": 1}}}
    third = {**second, "message": "third", "startedAt": (
        datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}  # fmt: skip
    stored = ledger.commit(drifted, third)
    assert read()["status"] == third == stored["status"]
