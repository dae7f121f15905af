"""What the operator process shows of itself: /metrics after a real run, /readyz before and after
its watches have listed, and its JSON log lines.

The operator runs as its own process against the session's control plane (the ``operator`` and
``start_operator`` fixtures); /metrics is scraped over HTTP and read with prometheus-client's
own parser. Readiness before the watches are up is shown with an identity that may not list
the Events the operator's informer watches: kopf's watch of runs lists, the informer cannot,
and /readyz names it until the rule is granted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import OPERATOR_TEST_ENV
from tests.support.helm import Helm, without_hooks
from tests.support.runs import agentrun, create, envelope, step
from tests.support.scraping import Samples, http_get, scrape, value
from tests.support.waiting import assert_holds, wait_phase

INFORMER = "the watches of step Jobs, their pods and pod refusals"


def ready(op: OperatorProcess) -> bool:
    code, body = http_get(op.readiness_url)
    assert code in (200, 503), body
    assert json.loads(body)["ready"] is (code == 200)
    return code == 200


def test_metrics_count_a_run_carried_to_succeeded(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    wait_for("/readyz to answer 200", lambda: ready(operator), timeout=60)
    before, _ = scrape(operator)
    assert value(before, "agentrun_step_attempts_started_total") == 0
    tokens = {"collect-evidence": 120, "summarize-evidence": 80}
    run = agentrun(
        "observed-run-7f3a",
        [
            step("collect-evidence", envelope("collected", tokens=tokens["collect-evidence"])),
            step(
                "summarize-evidence",
                envelope("summarized", tokens=tokens["summarize-evidence"]),
                after=["collect-evidence"],
            ),
        ],
    )
    create(kube, namespace, run)
    wait_phase(kube, namespace, "observed-run-7f3a", "Succeeded")

    def succeeded_counted() -> Samples | None:
        samples, _ = scrape(operator)
        return samples if value(samples, "agentrun_runs", phase="Succeeded") == 1 else None

    samples = wait_for("the Succeeded run in agentrun_runs", succeeded_counted, timeout=60)
    _, text = scrape(operator)

    assert value(samples, "agentrun_step_attempts_started_total") == 2
    assert value(samples, "agentrun_step_attempts_succeeded_total") == 2
    assert value(samples, "agentrun_step_attempts_failed_total") == 0
    assert value(samples, "agentrun_step_attempts_cancelled_total") == 0
    assert value(samples, "agentrun_step_retries_total") == 0
    assert value(samples, "agentrun_runs") == 1
    assert value(samples, "agentrun_tokens_total", namespace=namespace) == sum(tokens.values())
    assert value(samples, "agentrun_step_attempt_duration_seconds_count", outcome="succeeded") == 2
    assert value(samples, "agentrun_approval_wait_seconds_count") == 0
    assert value(samples, "agentrun_reconcile_duration_seconds_count") >= 3
    # Every pass the scheduler runs waited for a worker first, if only for no time at all.
    assert value(samples, "agentrun_reconcile_wait_seconds_count") >= 3
    assert ("agentrun_status_conflicts_total", ()) in samples
    # The operator put its finalizer on the run itself, one patch, before the run's first
    # status write, which therefore met no conflict (kopf's patch used to race it).
    assert value(samples, "agentrun_status_conflicts_total") == 0
    assert value(samples, "agentrun_api_requests_total", verb="patch", resource="agentruns") == 1
    # Every request of the operator's client is counted: each step's Job created, the run's
    # status written, the informer's lists and watches.
    assert value(samples, "agentrun_api_requests_total", verb="create", resource="jobs") >= 2
    assert value(samples, "agentrun_api_requests_total", verb="patch", resource="agentruns/status")
    assert value(samples, "agentrun_api_requests_total", verb="watch", resource="pods") >= 1
    # No run or step names in any label: only the namespace, where documented.
    for name in ("observed-run-7f3a", "collect-evidence", "summarize-evidence"):
        assert name not in text
    assert ready(operator)


def test_log_lines_are_json_naming_run_step_and_attempt(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    create(kube, namespace, agentrun("logged-run", [step("only-step", "true")]))
    wait_phase(kube, namespace, "logged-run", "Succeeded")
    lines = [
        json.loads(line)
        for line in operator.log_text().splitlines()
        if line and not line.startswith("--- ")
    ]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    created = [x for x in lines if x["message"].startswith("created Job")]
    assert created, operator.logs()
    assert created[0]["run"] == f"{namespace}/logged-run"
    assert (created[0]["step"], created[0]["attempt"]) == ("only-step", 1)


# -- readiness before the watches are up ------------------------------------------------------


@pytest.fixture
def without_event_watch(
    cluster: TestCluster, helm: Helm, namespace: str
) -> Iterator[tuple[Path, Any]]:
    """The chart's ServiceAccount and ClusterRole, less list and watch of core Events (what the
    informer watches for pod refusals); yields a token kubeconfig of it and a function that
    grants them."""
    release = f"rz-{namespace}"[:50]
    docs = helm.template(
        "--set", f"fullnameOverride={release}", "--set", "admissionPolicies.enabled=false",
        release=release, namespace=namespace,
    )  # fmt: skip
    rbac = [
        d
        for d in without_hooks(docs)
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    role = next(d for d in rbac if d["kind"] == "ClusterRole")
    events = next(
        r for r in role["rules"] if r["apiGroups"] == [""] and r["resources"] == ["events"]
    )
    full = list(events["verbs"])
    events["verbs"] = [v for v in full if v not in ("list", "watch")]
    assert events["verbs"] != full
    # The operator below watches one namespace: the chart then grants kopf's discovery too
    # (rbac.kopfDiscovery), without which kopf retries it for about a minute at its start.
    role["rules"] += [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))

    def grant() -> None:
        events["verbs"] = full
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))

    account = next(d for d in rbac if d["kind"] == "ServiceAccount")["metadata"]["name"]
    try:
        yield cluster.mint_serviceaccount_kubeconfig(namespace, account), grant
    finally:
        for doc in rbac:
            if doc["kind"] != "ServiceAccount":
                cluster.kubectl(
                    "delete", doc["kind"].lower(), doc["metadata"]["name"],
                    "--ignore-not-found", check=False,
                )  # fmt: skip


@pytest.mark.usefixtures("crd_installed")
def test_readyz_waits_for_the_informer_to_list(
    without_event_watch: tuple[Path, Any], namespace: str, tmp_path: Path
) -> None:
    kubeconfig, grant = without_event_watch
    op = OperatorProcess(
        kubeconfig,
        namespaces=[namespace],
        env=OPERATOR_TEST_ENV,
        log_path=tmp_path / "operator.log",
    )
    try:
        op.start()  # /healthz answers: the process is alive

        def waiting_for() -> list[str]:
            code, body = http_get(op.readiness_url)
            answer = json.loads(body)
            assert (code == 200) is answer["ready"]
            return list(answer["waitingFor"])

        # kopf's watch of runs lists; the informer's list of Events is refused.
        wait_for("kopf's watch of runs to list", lambda: waiting_for() == [INFORMER], timeout=60)

        def not_ready() -> None:
            assert waiting_for() == [INFORMER]

        assert_holds(not_ready, seconds=3)
        grant()
        wait_for("/readyz to answer 200 once Events may be listed", lambda: ready(op), timeout=90)
    except BaseException:
        print(op.logs(lines=200))
        raise
    finally:
        op.stop()
