"""HTTP tools end to end (docs/agent.md, "HTTP tools"): the operator as its own process runs an
agent run whose scripted model calls two HTTP tools of ``spec.agent.tools``; each call runs
``agentrun step http`` (this checkout's) on the run's executor, whose pod is a process of the
local node and so reaches an HTTP server the test runs on 127.0.0.1
(tests/support/http_server.py).

Turn 1 calls ``lookup`` (a GET, its Authorization header from a Secret); turn 2 calls
``close_ticket`` (a POST with a body, approval required), which waits for its approval with
nothing sent; once approved it is sent; turn 3 answers. Each request reaches the server once,
with the call's idempotency key and the Secret's value, and each response reaches the model.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator

import pytest

from agentrun.core.http_tool import IDEMPOTENCY_HEADER
from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.agents import agent_run
from tests.support.cluster import StartOperator
from tests.support.http_server import Server, serving
from tests.support.plugin import LLM_COMMAND, kubectl_agentrun
from tests.support.runs import create, launch_messages, status_of, step_status
from tests.support.waiting import wait_phase, wait_step_phase

TOKEN = "Bearer e2e-http-s3cret"
SECRET = "tracker-auth"
PARAMETERS = {
    "type": "object",
    "properties": {"ticket": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["ticket"],
}


@pytest.fixture(autouse=True)
def _local_node_only(cluster: TestCluster) -> None:
    if cluster.external:
        pytest.skip("the steps run `agentrun step http` from this checkout (no step image)")


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as found:
        yield found


@pytest.fixture
def auth_secret(kube: KubeClients, namespace: str, cluster: TestCluster) -> Iterator[str]:
    """The Secret of the Authorization header; and the admission policies, which record the
    run's creator: the operator lets a step read a Secret only on behalf of a creator who may
    (the admin here)."""
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": SECRET}, "stringData": {"token": TOKEN}}
    )
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        yield SECRET


@pytest.fixture
def loop_operator(start_operator: StartOperator) -> OperatorProcess:
    """The operator, with model turns (and so the run's executor) running this checkout."""
    return start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})


def _tools(server: Server) -> list[dict[str, object]]:
    auth = {"name": "Authorization", "secretKeyRef": {"name": SECRET, "key": "token"}}
    allowed = [f"127.0.0.1:{server.port}"]
    lookup: dict[str, object] = {
        "name": "lookup",
        "description": "Read a ticket.",
        "parameters": PARAMETERS,
        "http": {
            "url": f"{server.base}/tickets/{{ticket}}",
            "headers": [auth],
            "allowedHosts": allowed,
        },
    }
    close: dict[str, object] = {
        "name": "close_ticket",
        "description": "Close a ticket.",
        "parameters": PARAMETERS,
        "risk": "external",
        "approval": "required",
        "http": {
            "method": "POST",
            "url": f"{server.base}/tickets/{{ticket}}/close",
            "headers": [auth, {"name": "Accept", "value": "application/json"}],
            "body": {"template": {"reason": "{reason}", "by": "agent"}},
            "allowedHosts": allowed,
        },
    }
    return [lookup, close]


def test_an_agent_calls_http_tools_on_its_executor_once_each_and_a_gated_one_waits(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    server: Server,
    auth_secret: str,
    model: ScriptedModel,
) -> None:
    model.add(
        reply("", [tool_call("lookup", {"ticket": "T-7"}, "c1")]),
        reply("", [tool_call("close_ticket", {"ticket": "T-7", "reason": "fixed"}, "c2")]),
        reply("closed T-7"),
    )
    created = create(kube, namespace, agent_run("http", model, tools=_tools(server)))
    uid = created["metadata"]["uid"]

    # Turn 2's gated call waits for its approval; nothing of it was sent.
    waiting = wait_step_phase(
        kube, namespace, "http", "t2-0-close-ticket", "WaitingForApproval", timeout=240
    )
    gated = step_status(waiting, "t2-0-close-ticket")
    time.sleep(2)  # a request sent despite the gate would have arrived by now
    assert [r.path for r in server.requests()] == ["/tickets/T-7"]
    (looked,) = server.requests()
    assert looked.method == "GET" and looked.headers["authorization"] == TOKEN
    key = looked.headers[IDEMPOTENCY_HEADER.lower()]
    assert re.fullmatch(rf"{uid}:1:c1:[0-9a-f]{{64}}", key), key
    # The response reached the model with turn 2's request.
    answer = json.loads(model.completions()[1].tool_answers["c1"])
    assert answer["status"] == 200
    assert json.loads(answer["body"]) == {"method": "GET", "path": "/tickets/T-7", "body": ""}

    proc = kubectl_agentrun(cluster, "approve", "http", "t2-0-close-ticket", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    run = wait_phase(kube, namespace, "http", "Succeeded", timeout=240)
    assert status_of(run)["agent"]["answer"] == "closed T-7"
    closing = [r for r in server.requests() if r.path == "/tickets/T-7/close"]
    assert len(closing) == 1, "the approved call was sent more or less than once"
    (closed,) = closing
    assert closed.method == "POST"
    # The key of the call that was approved: its argsHash, as the approver saw it.
    assert closed.headers[IDEMPOTENCY_HEADER.lower()] == f"{uid}:2:c2:{gated['argsHash']}"
    assert closed.headers["authorization"] == TOKEN
    assert closed.headers["content-type"] == "application/json"
    assert json.loads(closed.body) == {"reason": "fixed", "by": "agent"}
    answer = json.loads(model.completions()[2].tool_answers["c2"])
    assert answer["status"] == 200
    assert json.loads(answer["body"])["path"] == "/tickets/T-7/close"
    # On the run's executor, as MCP calls are: no Job of their own.
    launched = launch_messages(run)
    assert "on the run's executor" in launched["t2-0-close-ticket"], launched
    jobs = kube.batch.list_namespaced_job(namespace, label_selector=f"agentrun.dev/run-uid={uid}")
    job_steps = {(j.metadata.labels or {}).get("agentrun.dev/step") for j in jobs.items}
    assert "t2-0-close-ticket" not in job_steps
    # The Secret's value is in no status, and the model never saw it.
    assert TOKEN not in json.dumps(run)
    assert all(TOKEN not in json.dumps(c.body) for c in model.completions())
    assert model.refused == [], "the operator sent a request a real server refuses"
