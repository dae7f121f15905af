"""Results larger than the termination message: ``agentrun step`` stores them in a ConfigMap
through the API with the step pod's ServiceAccount, and a later step reads one field of it.

Runs on the local node, which gives pods with a ServiceAccount token the API access the
step runner needs (see :mod:`agentrun_devcluster.node`). The producing step runs
``agentrun step`` on this machine, so on an external cluster these tests are skipped until a
step image with ``agentrun`` exists.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import pytest

from agentrun.core.naming import sha256_text
from agentrun.settings import LABEL_RUN_UID
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.cluster import bind_role, service_account_subject
from tests.support.runs import Run, agentrun, create, step, step_status
from tests.support.waiting import wait_phase

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
