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

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.core.naming import sha256_text
from agentrun.settings import LABEL_RUN_UID
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for

IMAGE = "busybox:1.36"  # ignored by the local node
TIMEOUT = 120.0
TERMINAL = ("Succeeded", "Failed", "Cancelled")
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
CONSUME = [
    "sh",
    "-c",
    'echo "{\\"ok\\": true, \\"result\\": {\\"length\\": ${#ROWS}}}" > /dev/termination-log',
]

Run = dict[str, Any]


@pytest.fixture(autouse=True)
def _local_node_only(cluster: TestCluster) -> None:
    if cluster.external:
        pytest.skip("the produce step runs `agentrun step` from this checkout (no step image)")


def agentrun(name: str, **spec: Any) -> Run:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": f"e2e test {name}: a result too large for the termination message",
            "plan": {
                "steps": [
                    {"name": "produce", "container": {"image": IMAGE, "command": PRODUCE}},
                    {
                        "name": "consume",
                        "dependsOn": ["produce"],
                        "inputs": [{"name": "ROWS", "fromStep": "produce", "key": "rows"}],
                        "container": {"image": IMAGE, "command": CONSUME},
                    },
                ]
            },
            **spec,
        },
    }


def create_step_account(kube: KubeClients, namespace: str) -> None:
    """ServiceAccount ``agent-steps``, allowed to create, get and list ConfigMaps."""
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
    kube.rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": SERVICE_ACCOUNT},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["create", "get", "list"],
                }
            ],
        },
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": SERVICE_ACCOUNT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SERVICE_ACCOUNT,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}
            ],
        },
    )


def create(kube: KubeClients, namespace: str, run: Run) -> Run:
    created: Run = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, run
    )
    return created


def wait_terminal(kube: KubeClients, namespace: str, name: str) -> Run:
    last: dict[str, Any] = {}

    def check() -> Run | None:
        run: Run = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        status = run.get("status") or {}
        last.update(phase=status.get("phase"), message=status.get("message"))
        return run if status.get("phase") in TERMINAL else None

    try:
        return wait_for(f"{name} to finish", check, timeout=TIMEOUT)
    except TimeoutError as e:
        raise AssertionError(f"{e}; last status: {last}") from None


def step_status(run: Run, name: str) -> dict[str, Any]:
    for st in (run.get("status") or {}).get("steps") or []:
        if st["name"] == name:
            found: dict[str, Any] = st
            return found
    return {}


def test_large_result_goes_through_a_configmap_to_the_next_step(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    create_step_account(kube, namespace)
    name = "large-result"
    created = create(
        kube, namespace, agentrun(name, stepTemplate={"serviceAccountName": SERVICE_ACCOUNT})
    )
    uid = created["metadata"]["uid"]

    run = wait_terminal(kube, namespace, name)
    status = run["status"]
    assert status["phase"] == "Succeeded", status.get("message")

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
    create(kube, namespace, agentrun(name))

    run = wait_terminal(kube, namespace, name)
    status = run["status"]
    assert status["phase"] == "Failed", status.get("message")
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
