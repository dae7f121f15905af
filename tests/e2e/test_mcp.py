"""Tools from MCP servers, end to end: the operator as its own process launches
``agentrun step mcp discover|call`` as step Jobs in the run's namespace; on the local node
their pods reach a real MCP server (tests/support/mcp_server.py, made with the official SDK)
over streamable HTTP on a leased port of 127.0.0.1; the server runs as a pod on the same
local node (a process with the node's network, as the steps are).

The first tests run the two commands as plan steps (the server entry and the pinned tool in
the environment, a header's value from a Secret, the step's own idempotency key); the last ones
run an agent run whose scripted model calls the server's tools through ``spec.agent.mcpServers``,
the way the loop runs them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrun.access import audit
from agentrun.api.mcp import McpServer
from agentrun.core.mcp import tool_digest
from agentrun.core.naming import sha256_text
from agentrun.pod.mcp import connect_http, list_tools
from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.ports import lease_ports
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.agents import agent_run
from tests.support.cluster import (
    StartOperator,
    bind_role,
    mint_user,
    service_account_subject,
    user_subject,
)
from tests.support.mcp_pods import TOKEN, Server, create_auth_secret
from tests.support.mcp_pods import entry as server_entry
from tests.support.plugin import LLM_COMMAND, kubectl_agentrun
from tests.support.runs import (
    Run,
    agentrun,
    create,
    get,
    launch_messages,
    status_of,
    step,
    step_status,
)
from tests.support.waiting import wait_phase, wait_recorded, wait_step_phase

STEP_MCP = [*LLM_COMMAND[:-1], "mcp"]
"""``agentrun step mcp`` as the local node's processes can run it."""


@pytest.fixture(autouse=True)
def _local_node_only(cluster: TestCluster) -> None:
    if cluster.external:
        pytest.skip("the steps run `agentrun step mcp` from this checkout (no step image)")


@pytest.fixture
def server(kube: KubeClients, namespace: str, tmp_path: Path) -> Iterator[Server]:
    with lease_ports(1) as lease:
        found = Server(kube, namespace, lease, tmp_path / "calls.jsonl")
        found.start()
        try:
            yield found
        finally:
            found.stop()


@pytest.fixture
def auth_secret(kube: KubeClients, namespace: str, cluster: TestCluster) -> Iterator[str]:
    """The Secret of the Authorization header; and the admission policies, which record a
    run's creator: the operator lets a step read a Secret only on behalf of a creator who may
    (the admin here)."""
    name = create_auth_secret(kube, namespace)
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        yield name


def _mcp_step(name: str, action: str, entry: dict[str, Any], **env: str) -> dict[str, Any]:
    variables: list[dict[str, Any]] = [
        {"name": "AGENTRUN_MCP_SERVER", "value": json.dumps(entry)},
        {
            "name": "AGENTRUN_MCP_HEADER_0",
            "valueFrom": {"secretKeyRef": {"name": "mcp-auth", "key": "token"}},
        },
        *({"name": k, "value": v} for k, v in env.items()),
    ]
    found = step(name, command=[*STEP_MCP, action])
    found["container"]["env"] = variables
    return found


def _call(name: str, entry: dict[str, Any], pinned: dict[str, Any], args: Any) -> dict[str, Any]:
    return _mcp_step(
        name,
        "call",
        entry,
        AGENTRUN_MCP_PINNED=json.dumps(pinned),
        AGENTRUN_TOOL_ARGS=json.dumps(args),
    )


def _result(kube: KubeClients, namespace: str, st: dict[str, Any]) -> Any:
    ref = st.get("resultRef")
    if ref is None:
        return json.loads(st["result"])
    data = kube.core.read_namespaced_config_map(ref["name"], namespace).data
    return json.loads(data[ref["key"]])


def _discover(
    kube: KubeClients, namespace: str, entry: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Run a discovery step; the pinned tools by name."""
    create(kube, namespace, agentrun("discover", [_mcp_step("discover", "discover", entry)]))
    run = wait_phase(kube, namespace, "discover", "Succeeded")
    found = _result(kube, namespace, step_status(run, "discover"))
    assert found["problems"] == []
    return {
        t["name"]: {"server": "tools", "name": t["name"], "digest": t["digest"]}
        for t in found["tools"]
    }


def _failure(run: Run, name: str) -> str:
    return json.dumps(step_status(run, name))


def test_discovery_pins_only_the_allowed_tools_and_calls_record_their_results(
    kube: KubeClients, namespace: str, operator: OperatorProcess, server: Server, auth_secret: str
) -> None:
    entry = server_entry(server, "add", "fail")
    pinned = _discover(kube, namespace, entry)
    assert sorted(pinned) == ["add", "fail"]  # rm is listed by the server, never pinned
    create(kube, namespace, agentrun("discover-again", [_mcp_step("d", "discover", entry)]))
    again = wait_phase(kube, namespace, "discover-again", "Succeeded")
    tools = _result(kube, namespace, step_status(again, "d"))["tools"]
    for tool in tools:
        assert tool["digest"] == tool_digest(tool) == pinned[tool["name"]]["digest"]

    steps = [
        _call("add", entry, pinned["add"], {"a": 2, "b": 3}),
        _call("fail", entry, pinned["fail"], {"path": "/nowhere"}),
    ]
    create(kube, namespace, agentrun("calls", steps))
    run = wait_phase(kube, namespace, "calls", "Succeeded")
    add, fail = step_status(run, "add"), step_status(run, "fail")
    assert _result(kube, namespace, add) == {
        "isError": False,
        "content": [{"type": "text", "text": "5"}],
        "structuredContent": {"result": 5},
    }
    failed = _result(kube, namespace, fail)
    assert failed["isError"] is True
    assert fail["summary"].startswith("error: ")
    # Each call reached the server once, with its step's idempotency key in _meta and the
    # header's value from the Secret.
    reached = sorted(server.calls(), key=lambda c: str(c["tool"]))
    assert reached == [
        {"tool": "add", "key": add["idempotencyKey"], "authorization": TOKEN},
        {"tool": "fail", "key": fail["idempotencyKey"], "authorization": TOKEN},
    ]
    assert TOKEN not in json.dumps(run)


def test_a_tool_the_entry_does_not_allow_is_refused_unsent(
    kube: KubeClients, namespace: str, operator: OperatorProcess, server: Server, auth_secret: str
) -> None:
    entry = server_entry(server, "add")
    rm = {"server": "tools", "name": "rm", "digest": "0" * 64}
    create(kube, namespace, agentrun("unlisted", [_call("rm", entry, rm, {"path": "/"})]))
    run = wait_phase(kube, namespace, "unlisted", "Failed")
    assert "the tool rm is not allowed by the server entry tools" in _failure(run, "rm")
    assert [c for c in server.calls() if c["tool"] == "rm"] == []


def test_a_tool_whose_schema_changed_mid_run_is_refused_unsent(
    kube: KubeClients, namespace: str, operator: OperatorProcess, server: Server, auth_secret: str
) -> None:
    entry = server_entry(server, "add")
    pinned = _discover(kube, namespace, entry)
    server.stop()
    server.start(wide=True)  # the same tool, another input schema
    create(
        kube, namespace, agentrun("changed", [_call("add", entry, pinned["add"], {"a": 1, "b": 2})])
    )
    run = wait_phase(kube, namespace, "changed", "Failed")
    assert "changed the tool add since it was discovered" in _failure(run, "add")
    assert [c for c in server.calls() if c["tool"] == "add"] == []


def test_a_call_to_a_server_that_is_down_is_retried_with_the_same_key(
    kube: KubeClients, namespace: str, operator: OperatorProcess, server: Server, auth_secret: str
) -> None:
    entry = server_entry(server, "add")
    pinned = _discover(kube, namespace, entry)
    server.stop()
    call = _call("add", entry, pinned["add"], {"a": 20, "b": 22})
    call["retry"] = {"limit": 3, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
    create(kube, namespace, agentrun("down", [call]))
    failed = wait_for(
        "the first attempt of the call to fail",
        lambda: step_status(get(kube, namespace, "down"), "add").get("error"),
        timeout=120,
    )
    assert "the MCP call failed: ConnectError" in json.dumps(failed)
    server.start()
    run = wait_phase(kube, namespace, "down", "Succeeded")
    add = step_status(run, "add")
    assert add["attempt"] >= 2
    assert _result(kube, namespace, add)["structuredContent"] == {"result": 42}
    assert [c["key"] for c in server.calls() if c["tool"] == "add"] == [add["idempotencyKey"]]


def test_a_large_result_goes_to_a_config_map_of_the_run(
    kube: KubeClients,
    namespace: str,
    cluster: TestCluster,
    operator: OperatorProcess,
    server: Server,
    auth_secret: str,
) -> None:
    """With a ServiceAccount that may create ConfigMaps, as for `agentrun step --`."""
    account = "mcp-steps"
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list"]}]
    bind_role(kube, namespace, account, rules, [service_account_subject(account, namespace)])
    entry = server_entry(server, "echo")
    pinned = _discover(kube, namespace, entry)
    text = "0123456789 " * 1100  # 12,100 bytes
    call = _call("echo", entry, pinned["echo"], {"text": "0123456789 ", "times": 1100})
    # Steps run as a ServiceAccount only on behalf of a creator who may impersonate it (the
    # admin, recorded by the admission policies).
    create(kube, namespace, agentrun("large", [call], stepTemplate={"serviceAccountName": account}))
    run = wait_phase(kube, namespace, "large", "Succeeded")
    echo = step_status(run, "echo")
    assert "result" not in echo, "a 12 KB result was kept inline"
    ref = echo["resultRef"]
    stored = kube.core.read_namespaced_config_map(ref["name"], namespace).data[ref["key"]]
    assert echo["resultDigest"] == sha256_text(stored)
    assert json.loads(stored)["structuredContent"] == {"result": text}


# -- through the agent loop: spec.agent.mcpServers ---------------------------------------------


@pytest.fixture
def loop_operator(start_operator: StartOperator) -> OperatorProcess:
    """The operator, with model turns (and so MCP steps) running this checkout's agentrun."""
    return start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})


def _listed(server: Server) -> list[dict[str, Any]]:
    """The tools the server lists now, read with the SDK as a discovery step reads them."""

    async def listing() -> list[dict[str, Any]]:
        entry = McpServer.model_validate(server_entry(server, "add"))
        async with connect_http(entry, {"Authorization": TOKEN}) as client:
            return await list_tools(client)

    return anyio.run(listing)


def _launches(run: Run) -> dict[str, int]:
    found: dict[str, int] = {}
    for t in status_of(run).get("history") or []:
        if t.get("reason") == "Launching" and t.get("step"):
            found[t["step"]] = found.get(t["step"], 0) + 1
    return found


def test_an_agent_calls_the_allowed_tools_of_an_mcp_server_as_steps(
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    server: Server,
    auth_secret: str,
    model: ScriptedModel,
) -> None:
    model.add(
        reply(
            "",
            [
                tool_call("add", {"a": 2, "b": 3}, "c1"),
                tool_call("fail", {"path": "/nowhere"}, "c2"),
                tool_call("rm", {"path": "/"}, "c3"),
                tool_call("add", {"a": "two", "b": 3}, "c4"),
            ],
        ),
        reply("2 + 3 = 5"),
    )
    body = agent_run("mcp", model, agent={"mcpServers": [server_entry(server, "add", "fail")]})
    created = create(kube, namespace, body)
    run = wait_phase(kube, namespace, "mcp", "Succeeded")
    agent = status_of(run)["agent"]
    assert agent["answer"] == "2 + 3 = 5"
    # Discovery pinned the allowed tools; the model was offered them beside spec.agent.tools.
    pins = {p["name"]: p for p in agent["mcpTools"]}
    assert sorted(pins) == ["add", "fail"]
    first, second = model.completions()
    offered = {t["function"]["name"]: t["function"] for t in first.body["tools"]}
    assert sorted(offered) == ["add", "fail", "search"]  # never rm, which the entry omits
    listed = {t["name"]: t for t in _listed(server)}
    assert offered["add"]["parameters"] == listed["add"]["inputSchema"]
    assert {n: p["digest"] for n, p in pins.items()} == {
        n: tool_digest(listed[n]) for n in ("add", "fail")
    }
    # Each valid call ran once as a step; the invalid ones never reached the server.
    answers = second.tool_answers
    assert json.loads(answers["c1"])["structuredContent"] == {"result": 5}
    assert json.loads(answers["c2"])["isError"] is True
    assert answers["c3"] == (
        "error: the call was not run: there is no tool 'rm' (the tools: add, fail, search)"
    )
    assert "a: 'two' is not of type 'integer'" in answers["c4"]
    assert _launches(run) == {
        "t0-mcp-tools": 1,
        "t1-model": 1,
        "t1-0-add": 1,
        "t1-1-fail": 1,
        "t2-model": 1,
    }
    uid = created["metadata"]["uid"]
    reached = sorted(server.calls(), key=lambda c: str(c["tool"]))
    assert [(c["tool"], c["authorization"]) for c in reached] == [("add", TOKEN), ("fail", TOKEN)]
    assert reached[0]["key"].startswith(f"{uid}:1:c1:")
    assert reached[1]["key"].startswith(f"{uid}:1:c2:")
    assert TOKEN not in json.dumps(run)
    assert model.refused == [], "the operator sent a request a real server refuses"


def test_an_agents_mcp_calls_run_on_its_executor_once_each(
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    server: Server,
    auth_secret: str,
    model: ScriptedModel,
) -> None:
    """With the run's executor running (docs/agent.md, "The run's executor"), a call of an MCP
    server's tool is sent to it instead of a Job of its own: the executor sends the header's
    value from the Secret its Job takes, and each call reaches the server once. The
    discovery of the server's tools before the first turn waited for the executor and ran
    on it too."""
    calls = 3
    for turn in range(1, calls + 1):
        model.add(reply("", [tool_call("add", {"a": turn, "b": 10}, f"c{turn}")]))
    model.add(reply("done"))
    body = agent_run("mcp-executor", model, agent={"mcpServers": [server_entry(server, "add")]})
    created = create(kube, namespace, body)
    run = wait_phase(kube, namespace, "mcp-executor", "Succeeded", timeout=240)
    uid = created["metadata"]["uid"]
    sent = model.completions()
    for turn in range(1, calls + 1):
        answer = json.loads(sent[turn].tool_answers[f"c{turn}"])
        assert answer["structuredContent"] == {"result": turn + 10}, answer
    reached = server.calls()
    assert sorted(c["key"].split(":")[2] for c in reached) == [f"c{t}" for t in range(1, 4)]
    assert {c["authorization"] for c in reached} == {TOKEN}
    launched = {
        n: said for n, said in launch_messages(run).items() if n.endswith(("-add", "-model"))
    }
    on_executor = sorted(n for n, said in launched.items() if "on the run's executor" in said)
    print("launched on the executor:", on_executor, "of", sorted(launched))
    launched = {n: said for n, said in launched.items() if n.endswith("-add")}
    on_executor = [n for n in on_executor if n in launched]
    assert on_executor, f"no MCP call ran on the run's executor: {launched}"
    jobs = kube.batch.list_namespaced_job(namespace, label_selector=f"agentrun.dev/run-uid={uid}")
    job_steps = {(j.metadata.labels or {}).get("agentrun.dev/step") for j in jobs.items}
    assert not job_steps & set(on_executor), "a call sent to the executor had a Job too"
    assert TOKEN not in json.dumps(run)
    # The whole trail (the history ring may have dropped the discovery's transitions).
    maps = wait_recorded(kube, namespace, "mcp-executor", uid)
    entries = audit.parse(m.data or {} for m in maps)
    discovery = [e for e in entries if e.get("step") == "t0-mcp-tools"]
    launches = [str(e.get("message")) for e in discovery if e.get("reason") == "Launching"]
    assert len(launches) == 1 and "on the run's executor" in launches[0], discovery
    assert "t0-mcp-tools" not in job_steps, "the discovery sent to the executor had a Job too"


def test_a_gated_mcp_call_approved_after_the_server_changed_the_tool_is_refused_unsent(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    server: Server,
    auth_secret: str,
    model: ScriptedModel,
) -> None:
    model.add(reply("", [tool_call("add", {"a": 1, "b": 2}, "c1")]), reply("could not add"))
    entry = server_entry(server, "add")
    entry["tools"] = [{"name": "add", "risk": "external", "approval": "required"}]
    create(kube, namespace, agent_run("gated-mcp", model, agent={"mcpServers": [entry]}))
    wait_step_phase(kube, namespace, "gated-mcp", "t1-0-add", "WaitingForApproval")
    assert server.calls() == []
    server.stop()
    server.start(wide=True)  # the same tool, another input schema, while the call waits
    proc = kubectl_agentrun(cluster, "approve", "gated-mcp", "t1-0-add", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    run = wait_phase(kube, namespace, "gated-mcp", "Succeeded")
    answer = model.completions()[1].tool_answers["c1"]
    assert answer.startswith("error: the tool failed")
    assert "changed the tool add since it was discovered" in answer
    assert server.calls() == []
    assert _launches(run)["t1-0-add"] == 1


def test_a_header_secret_the_runs_creator_may_not_read_is_never_sent(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    server: Server,
    auth_secret: str,
    model: ScriptedModel,
) -> None:
    """mallory may create runs but not read the header's Secret: her run's discovery step is
    refused (Forbidden) before any Job, so nothing reaches the server, and no turn runs."""
    to = cluster.kubeconfig.with_name(f"{namespace}-mallory.kubeconfig")
    kubeconfig = mint_user(cluster, "mallory", [], to)
    rules = [{"apiGroups": ["agentrun.dev"], "resources": ["agentruns"],
              "verbs": ["create", "get", "list", "watch"]}]  # fmt: skip
    bind_role(kube, namespace, "mallory-runs", rules, [user_subject("mallory")])
    body = agent_run("borrowed-header", model, agent={"mcpServers": [server_entry(server, "add")]})
    proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body),
                           kubeconfig=kubeconfig, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run = wait_phase(kube, namespace, "borrowed-header", "Failed")
    discovery = step_status(run, "t0-mcp-tools")
    assert (discovery.get("error") or {}).get("reason") == "Forbidden", discovery
    assert f"creator mallory may not get secrets/{auth_secret}" in discovery["error"]["message"]
    assert not discovery.get("jobName"), "a Job was made for a refused discovery"
    assert model.completions() == [] and server.calls() == []
