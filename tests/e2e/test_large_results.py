"""Results larger than the termination message: ``agentrun step`` stores them in a ConfigMap
through the API with the step pod's ServiceAccount, and a later step reads one field of it.

Runs on the local node, which gives pods with a ServiceAccount token the API access the
step runner needs (see :mod:`agentrun_devcluster.node`). The producing step runs
``agentrun step`` on this machine, so on an external cluster these tests are skipped until a
step image with ``agentrun`` exists.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.core.envelope import result_object_data
from agentrun.core.naming import idempotency_key, result_object_name, sha256_text
from agentrun.pod import runner
from agentrun.settings import (
    ENV_ATTEMPT,
    ENV_IDEMPOTENCY_KEY,
    ENV_NAMESPACE,
    ENV_RUN,
    ENV_RUN_UID,
    ENV_STEP,
    LABEL_RUN_UID,
)
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.cluster import (
    Kubectl,
    bind_role,
    mint_user,
    service_account_subject,
    user_subject,
)
from tests.support.runs import (
    Run,
    agentrun,
    create,
    jobs_of,
    patch_spec,
    step,
    step_status,
)
from tests.support.waiting import wait_events, wait_phase, wait_step_phase

ROWS = 10_000
SERVICE_ACCOUNT = "agent-steps"

#: ``agentrun step --`` as the node's processes can run it.
AGENTRUN_STEP = (
    ["agentrun", "step", "--"]
    if shutil.which("agentrun")
    else [sys.executable, "-m", "agentrun.cli", "step", "--"]
)
PRODUCE = [
    *AGENTRUN_STEP,
    "python3",
    "-c",
    f"import json; print(json.dumps({{'rows': 'x' * {ROWS}, 'count': 3}}))",
]
CONSUME = 'echo "{\\"ok\\": true, \\"result\\": {\\"length\\": ${#ROWS}}}" > /dev/termination-log'


@pytest.fixture(autouse=True)
def _local_node_only(cluster: TestCluster) -> None:
    if cluster.external:
        pytest.skip("the produce step runs `agentrun step` from this checkout (no step image)")


def large_result_run(name: str, **spec: Any) -> Run:
    """``produce`` prints a 10 KB result through ``agentrun step``; ``consume`` reads its
    ``rows`` field."""
    steps = [
        step("produce", command=PRODUCE),
        step(
            "consume",
            CONSUME,
            after=["produce"],
            inputs=[{"name": "ROWS", "fromStep": "produce", "key": "rows"}],
        ),
    ]
    goal = f"e2e test {name}: a result too large for the termination message"
    return agentrun(name, steps, goal=goal, **spec)


def create_step_account(kube: KubeClients, namespace: str) -> None:
    """ServiceAccount ``agent-steps``, allowed to create, get and list ConfigMaps."""
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list"]}]
    bind_role(
        kube,
        namespace,
        SERVICE_ACCOUNT,
        rules,
        [service_account_subject(SERVICE_ACCOUNT, namespace)],
    )


def test_large_result_goes_through_a_configmap_to_the_next_step(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    create_step_account(kube, namespace)
    name = "large-result"
    template = {"serviceAccountName": SERVICE_ACCOUNT}
    # The steps run as a ServiceAccount, which the operator allows only on behalf of a
    # creator who may impersonate it: the admission policies record the creator (the admin).
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        created = create(kube, namespace, large_result_run(name, stepTemplate=template))
    uid = created["metadata"]["uid"]

    run = wait_phase(kube, namespace, name, "Succeeded")

    produce = step_status(run, "produce")
    assert produce["phase"] == "Succeeded", produce
    assert "result" not in produce, "a 10 KB result was kept inline"
    ref = produce["resultRef"]
    assert ref["key"] == "result"
    assert produce["resultDigest"]

    cm = kube.core.read_namespaced_config_map(ref["name"], namespace)
    data = cm.data or {}
    assert data["field.rows"] == "x" * ROWS
    assert data["field.count"] == "3"
    assert json.loads(data["result"]) == {"rows": "x" * ROWS, "count": 3}
    assert produce["resultDigest"] == sha256_text(data["result"])
    owners = [(o.kind, o.name, o.uid) for o in cm.metadata.owner_references or []]
    assert ("AgentRun", name, uid) in owners, owners

    consume = step_status(run, "consume")
    assert consume["phase"] == "Succeeded", consume
    assert json.loads(consume["result"]) == {"length": ROWS}


def test_large_result_without_a_serviceaccount_fails_naming_the_fix(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    name = "large-result-no-sa"
    create(kube, namespace, large_result_run(name))

    run = wait_phase(kube, namespace, name, "Failed")
    produce = step_status(run, "produce")
    assert produce["phase"] == "Failed", produce
    error = produce.get("error") or {}
    assert "stepTemplate.serviceAccountName" in error.get("message", ""), produce
    assert step_status(run, "consume")["phase"] == "Skipped"
    # No result was stored: the pod had no API access (the run's audit record is there).
    left = kube.core.list_namespaced_config_map(
        namespace,
        label_selector=f"{LABEL_RUN_UID}={run['metadata']['uid']},agentrun.dev/object=result",
    ).items
    assert not left, [c.metadata.name for c in left]


# -- attacks on results by reference -------------------------------------------------------------

EDITOR = "eve"
"""A user with the built-in ``edit`` role in the namespace (may change any ConfigMap)."""
RUNNER = "rita"
"""A user who may only create and read AgentRuns."""
#: Reports what it was given: ``ran: <first 6 characters of ROWS>``.
REPORT = 'printf \'{"ok": true, "result": "ran: %s"}\' "$(printf %s "$ROWS" | cut -c1-6)" ' + (
    "> /dev/termination-log"
)
FORGED_ROWS = "FORGED" + "y" * 100


def _client(cluster: TestCluster, user: str, to: Path) -> KubeClients:
    return KubeClients.from_kubeconfig(mint_user(cluster, user, [], to))


@pytest.fixture
def eve(
    cluster: TestCluster, kube: KubeClients, namespace: str, tmp_path: Path
) -> Iterator[KubeClients]:
    """A client of the user with the built-in ``edit`` role in the namespace."""
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "eve-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "edit"},
            "subjects": [user_subject(EDITOR)],
        },
    )  # fmt: skip
    clients = _client(cluster, EDITOR, tmp_path / "eve.kubeconfig")
    yield clients
    clients.close()


def _gated_run(name: str, gate: str) -> Run:
    """``produce`` (10 KB, by reference) then ``consume`` (reports the input it ran with);
    step ``gate`` needs an approval, which gives the attacker time."""
    steps = [
        step("produce", command=PRODUCE),
        step("consume", REPORT, after=["produce"],
             inputs=[{"name": "ROWS", "fromStep": "produce", "key": "rows"}]),
    ]  # fmt: skip
    for s in steps:
        if s["name"] == gate:
            s["approval"] = "required"
    template = {"serviceAccountName": SERVICE_ACCOUNT}
    return agentrun(name, steps, goal=f"e2e test {name}", stepTemplate=template)


def _create_gated(
    cluster: TestCluster, kube: KubeClients, namespace: str, name: str, gate: str
) -> Run:
    create_step_account(kube, namespace)
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        return create(kube, namespace, _gated_run(name, gate))


def _approve(kubectl: Kubectl, namespace: str, name: str, run: Run, step_name: str) -> None:
    shown = step_status(run, step_name)["argsHash"]
    approval = {"step": step_name, "decision": "approve", "argsHash": shown, "by": "admin",
                "reason": "looked at it"}  # fmt: skip
    patch_spec(kubectl, namespace, name, approvals=[approval])


def _forged_result(name: str, run: Run, **extra: Any) -> dict[str, Any]:
    """Eve's ConfigMap under a result's name: forged content, claiming the run as owner."""
    meta = run["metadata"]
    owner = {"apiVersion": run["apiVersion"], "kind": "AgentRun", "name": meta["name"],
             "uid": meta["uid"], "controller": True}  # fmt: skip
    data = dict(result_object_data(json.dumps({"rows": FORGED_ROWS, "count": 3})))
    return {"metadata": {"name": name, "ownerReferences": [owner]}, "data": data, **extra}


def _assert_never_ran_forged(kube: KubeClients, namespace: str, run: Run) -> None:
    """``consume`` never ran, and nothing the run shows carries the forged input."""
    assert step_status(run, "consume").get("result") is None, step_status(run, "consume")
    jobs = jobs_of(kube, namespace, run["metadata"]["uid"])
    consumers = [j for j in jobs if j.metadata.labels.get("agentrun.dev/step") == "consume"]
    assert not consumers, [j.metadata.name for j in consumers]
    assert "FORGED" not in json.dumps(run.get("status")), "forged input shown in status"


def test_a_result_changed_after_its_commit_is_refused_and_one_recreated_never_runs(
    operator: OperatorProcess,
    cluster: TestCluster,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    eve: KubeClients,
) -> None:
    name = "tamper-after-commit"
    _create_gated(cluster, kube, namespace, name, gate="consume")
    run = wait_step_phase(kube, namespace, name, "consume", "WaitingForApproval")
    ref = step_status(run, "produce")["resultRef"]["name"]

    # An edit: the result object is immutable.
    with pytest.raises(ApiException) as refused:
        eve.core.patch_namespaced_config_map(ref, namespace, {"data": {"field.rows": FORGED_ROWS}})
    assert refused.value.status == 422, refused.value
    # Delete and create again under the name, owner reference and all, even immutable.
    eve.core.delete_namespaced_config_map(ref, namespace)
    eve.core.create_namespaced_config_map(namespace, _forged_result(ref, run, immutable=True))

    # The approver approves the argsHash shown (it covers the committed digest).
    _approve(kubectl, namespace, name, run, "consume")
    run = wait_phase(kube, namespace, name, "Failed")
    consume = step_status(run, "consume")
    assert consume["phase"] == "Failed", consume
    assert consume["error"]["reason"] == "ResultTampered", consume
    assert "digest" in consume["error"]["message"], consume
    _assert_never_ran_forged(kube, namespace, run)
    wait_events(kube, namespace, name, "ResultTampered")


def test_a_result_object_created_before_the_step_wrote_it_fails_the_step(
    operator: OperatorProcess,
    cluster: TestCluster,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    eve: KubeClients,
) -> None:
    name = "tamper-before-write"
    created = _create_gated(cluster, kube, namespace, name, gate="produce")
    run = wait_step_phase(kube, namespace, name, "produce", "WaitingForApproval")
    meta = created["metadata"]
    ref = result_object_name(meta["name"], meta["uid"], "produce", 1)
    eve.core.create_namespaced_config_map(namespace, _forged_result(ref, created))

    _approve(kubectl, namespace, name, run, "produce")
    run = wait_phase(kube, namespace, name, "Failed")
    produce = step_status(run, "produce")
    assert produce["phase"] == "Failed", produce
    assert produce["error"]["reason"] == "ResultTampered", produce
    assert "already existed" in produce["error"]["message"], produce
    assert "resultRef" not in produce, produce
    assert step_status(run, "consume")["phase"] == "Skipped"
    _assert_never_ran_forged(kube, namespace, run)
    wait_events(kube, namespace, name, "ResultTampered", warning=True)


def _as_the_runner_stores(created: Run, step_name: str, args_hash: str, result: str) -> Any:
    """The exact ConfigMap the step runner would store for attempt 1 of ``step_name`` holding
    ``result``: its name, labels (the idempotency key's hash), annotations, owner and
    immutability, as computed from the run's status and the code's own naming."""
    meta = created["metadata"]
    image = next(x for x in created["spec"]["plan"]["steps"] if x["name"] == step_name)
    key = idempotency_key(meta["uid"], step_name, image["container"]["image"], args_hash)
    env = {ENV_RUN: meta["name"], ENV_NAMESPACE: meta["namespace"], ENV_RUN_UID: meta["uid"],
           ENV_STEP: step_name, ENV_ATTEMPT: "1", ENV_IDEMPOTENCY_KEY: key}  # fmt: skip

    class Capture:
        body: Any = None

        def create_namespaced_config_map(self, namespace: str, body: Any) -> None:
            Capture.body = body

    runner.ResultStore(Capture(), runner.StepIdentity(env)).store(result, "forged")
    return Capture.body


def test_the_runners_exact_result_object_made_first_is_never_a_replay(
    operator: OperatorProcess,
    cluster: TestCluster,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    eve: KubeClients,
    tmp_path: Path,
) -> None:
    """The mimic of a step's result object: before the approved step's first attempt, eve
    (edit) creates under the attempt's result name exactly what the step runner would store
    (a completed result, its labels, annotations, owner and immutability), with her content.
    The step's ServiceAccount may list ConfigMaps. The command still runs, its own result
    cannot be stored under the taken name, and the attempt fails ResultTampered: nothing of
    hers is committed, and the next step never runs."""
    name = "mimic-before-write"
    ledger = tmp_path / "ran"
    produce = [*AGENTRUN_STEP, "sh", "-c", f"echo ran >> {ledger}; " + shlex.join(PRODUCE[-3:])]
    create_step_account(kube, namespace)
    body = _gated_run(name, gate="produce")
    body["spec"]["plan"]["steps"][0]["container"]["command"] = produce
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        created = create(kube, namespace, body)
    run = wait_step_phase(kube, namespace, name, "produce", "WaitingForApproval")
    shown = step_status(run, "produce")["argsHash"]
    forged = json.dumps({"rows": FORGED_ROWS, "count": 3}) + " " * 4000
    mimic = _as_the_runner_stores(created, "produce", shown, forged)
    assert mimic["metadata"]["name"] == result_object_name(name, created["metadata"]["uid"],
                                                           "produce", 1)  # fmt: skip
    eve.core.create_namespaced_config_map(namespace, mimic)

    _approve(kubectl, namespace, name, run, "produce")
    run = wait_phase(kube, namespace, name, "Failed")
    produce_status = step_status(run, "produce")
    assert produce_status["error"]["reason"] == "ResultTampered", produce_status
    assert "resultRef" not in produce_status, produce_status
    assert ledger.read_text().splitlines() == ["ran"], "the approved command did not run once"
    assert step_status(run, "consume")["phase"] == "Skipped"
    _assert_never_ran_forged(kube, namespace, run)
    wait_events(kube, namespace, name, "ResultTampered", warning=True)


def test_a_result_ref_to_a_configmap_the_creator_may_not_read_is_never_read(
    operator: OperatorProcess,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    token = "team-token-" + sha256_text(namespace)[:12]
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "team-config"}, "data": {"token": token}}
    )
    rules = [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get", "list"]}]
    bind_role(kube, namespace, "run-maker", rules, [user_subject(RUNNER)])
    rita = _client(cluster, RUNNER, tmp_path / "rita.kubeconfig")
    with pytest.raises(ApiException) as refused:
        rita.core.read_namespaced_config_map("team-config", namespace)
    assert refused.value.status == 403, "rita must not be able to read the ConfigMap"

    report = {"ok": True, "summary": "s", "resultRef": {"name": "team-config", "key": "token"},
              "resultDigest": sha256_text(token)}  # fmt: skip
    steps = [
        step("produce", f"printf '%s' '{json.dumps(report)}' > /dev/termination-log"),
        step("consume", REPORT.replace("ROWS", "TOKEN"), after=["produce"],
             inputs=[{"name": "TOKEN", "fromStep": "produce"}]),
    ]  # fmt: skip
    name = "foreign-ref"
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        rita.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, agentrun(name, steps)
        )
    rita.close()

    run = wait_phase(kube, namespace, name, "Failed")
    produce = step_status(run, "produce")
    assert produce["phase"] == "Failed", produce
    assert produce["error"]["reason"] == "ResultRefRefused", produce
    assert "team-config" in produce["error"]["message"], produce
    assert "resultRef" not in produce, produce
    assert step_status(run, "consume")["phase"] == "Skipped"
    jobs = jobs_of(kube, namespace, run["metadata"]["uid"])
    assert "consume" not in [j.metadata.labels.get("agentrun.dev/step") for j in jobs]
    assert token not in json.dumps(run.get("status")), "the ConfigMap's value reached status"
