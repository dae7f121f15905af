"""spec.agent and status.agent against a real kube-apiserver: admission (schema and CEL rules),
kubectl explain, and a status with an agent loop written through the status subresource."""

from __future__ import annotations

import copy
import json
from subprocess import CompletedProcess
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import policies_bound_to
from tests.support.cluster import Kubectl
from tests.support.runs import Run, create, step

pytestmark = pytest.mark.usefixtures("crd_installed")


def tool(name: str = "search", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "container": {"image": "busybox:1.36", "command": ["true"]},
    }
    body.update(extra)
    return body


def http_tool(name: str = "fetch", **http: Any) -> dict[str, Any]:
    body = tool(name)
    del body["container"]
    body["http"] = {"url": "https://api.example/items/{q}", "allowedHosts": ["api.example"], **http}
    return body


def agent_run(name: str, *, plan: list[dict[str, Any]] | None = None, **agent: Any) -> Run:
    spec: dict[str, Any] = {
        "goal": "check admission of agent runs",
        "agent": {
            "model": {"baseURL": "http://127.0.0.1:1/v1", "name": "scripted"},
            "tools": [tool()],
            **agent,
        },
    }
    if plan is not None:
        spec["plan"] = {"steps": plan}
    return {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": {"name": name}, "spec": spec}


def test_a_run_with_only_an_agent_is_accepted_and_defaulted(
    kube: KubeClients, namespace: str
) -> None:
    created = create(kube, namespace, agent_run("only-agent"))
    agent = created["spec"]["agent"]
    assert "plan" not in created["spec"]
    assert (agent["maxTurns"], agent["maxToolCallsPerTurn"], agent["contextBytes"]) == (
        20,
        4,
        65536,
    )
    assert agent["model"]["maxOutputTokens"] == 1024
    assert agent["tools"][0]["risk"] == "read"
    # The tool's JSON Schema is kept whole (preserve-unknown-fields), not pruned.
    assert agent["tools"][0]["parameters"]["properties"] == {"q": {"type": "string"}}


def test_a_plan_may_run_before_the_agent(kube: KubeClients, namespace: str) -> None:
    created = create(kube, namespace, agent_run("plan-first", plan=[step("gather")]))
    assert [s["name"] for s in created["spec"]["plan"]["steps"]] == ["gather"]


def _refused(kube: KubeClients, namespace: str, body: Run) -> str:
    with pytest.raises(ApiException) as info:
        create(kube, namespace, body)
    body_text = info.value.body
    assert info.value.status == 422 and body_text, body_text
    said: str = json.loads(body_text)["message"]
    return said


@pytest.mark.parametrize("choice", ["auto", "none", "required", "search"])
def test_a_tool_choice_of_a_mode_or_a_tool_is_accepted(
    kube: KubeClients, namespace: str, choice: str
) -> None:
    created = create(kube, namespace, agent_run(f"choice-{choice}", toolChoice=choice))
    assert created["spec"]["agent"]["toolChoice"] == choice


def test_a_run_needs_a_plan_or_an_agent(kube: KubeClients, namespace: str) -> None:
    body = agent_run("neither")
    del body["spec"]["agent"]
    assert "a run needs spec.plan, spec.agent (or spec.agentRef) or both" in _refused(
        kube, namespace, body
    )


INVALID = [
    ("duplicate-tools", {"tools": [tool(), tool()]}, "Duplicate value"),
    (
        "parameters-not-an-object",
        {"tools": [tool(parameters={"type": "string"})]},
        "parameters must be a JSON Schema of an object (type: object)",
    ),
    (
        "parameters-without-type",
        {"tools": [tool(parameters={"properties": {}})]},
        "parameters must be a JSON Schema of an object (type: object)",
    ),
    (
        "no-parameters",
        {"tools": [{k: v for k, v in tool().items() if k != "parameters"}]},
        "parameters: Required value",
    ),
    ("bad-tool-name", {"tools": [tool("9lives")]}, "should match"),
    ("too-many-calls", {"maxToolCallsPerTurn": 17}, "should be less than or equal to 16"),
    ("zero-turns", {"maxTurns": 0}, "should be greater than or equal to 1"),
    ("small-context", {"contextBytes": 100}, "should be greater than or equal to 4096"),
    (
        "tool-choice-unknown-tool",
        {"toolChoice": "nope"},
        "toolChoice must be auto, none, required or the name of one of the tools of "
        "spec.agent.tools or spec.agent.mcpServers",
    ),
    (
        "tool-choice-required-without-tools",
        {"tools": None, "toolChoice": "required"},
        "toolChoice must be auto, none, required or the name of one of the tools of "
        "spec.agent.tools or spec.agent.mcpServers",
    ),
    ("tool-choice-not-a-name", {"toolChoice": "any tool"}, "should match"),
    (
        "tool-named-like-a-mode",
        {"tools": [tool("auto")]},
        "a tool may not be named auto, none or required",
    ),
    (
        "bad-base-url",
        {"model": {"baseURL": "localhost:8000", "name": "m"}},
        "should match '^https?://",
    ),
    (
        "http-and-container",
        {"tools": [{**tool(), "http": http_tool()["http"]}]},
        "a tool has a container, an agent (a sub-agent) or http (an HTTP request), exactly one",
    ),
    (
        "http-get-with-body",
        {"tools": [http_tool(body={"argument": "q"})]},
        "a GET request has no body",
    ),
    (
        "http-body-argument-and-template",
        {"tools": [http_tool(method="POST", body={"argument": "q", "template": {"a": 1}})]},
        "a body is an argument or a template, exactly one",
    ),
    (
        "http-reserved-header",
        {"tools": [http_tool(headers=[{"name": "Idempotency-KEY", "value": "mine"}])]},
        "a tool may not set the headers Host",
    ),
    (
        "http-header-value-and-secret",
        {
            "tools": [
                http_tool(
                    headers=[
                        {"name": "X-A", "value": "v", "secretKeyRef": {"name": "s", "key": "k"}}
                    ]
                )
            ]
        },
        "a header has a value or a secretKeyRef, exactly one",
    ),
    (
        "http-header-value-with-a-line-break",
        {"tools": [http_tool(headers=[{"name": "X-A", "value": "a\r\nHost: evil"}])]},
        "should match",
    ),
    ("http-allowed-host-with-a-path", {"tools": [http_tool(allowedHosts=["a.b/x"])]}, "match"),
    ("http-allowed-host-userinfo", {"tools": [http_tool(allowedHosts=["u@a.b"])]}, "match"),
    ("http-no-allowed-hosts", {"tools": [http_tool(allowedHosts=[])]}, "should have at least 1"),
    ("http-url-not-http", {"tools": [http_tool(url="ftp://a.b/x")]}, "should match '^https?://"),
    ("http-method", {"tools": [http_tool(method="TRACE")]}, "Unsupported value"),
]


@pytest.mark.parametrize(("case", "agent", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_agents_are_refused_with_a_clear_message(
    kube: KubeClients, namespace: str, case: str, agent: dict[str, Any], message: str
) -> None:
    said = _refused(kube, namespace, agent_run(case, **agent))
    assert message in said, said


def test_an_http_tool_is_accepted_defaulted_and_its_body_template_kept(
    kube: KubeClients, namespace: str
) -> None:
    body = http_tool(
        method="POST",
        headers=[
            {"name": "Accept", "value": "application/json"},
            {"name": "Authorization", "secretKeyRef": {"name": "api", "key": "token"}},
        ],
        body={"template": {"q": "{q}", "nested": {"list": [1, "{q}"]}}},
        allowedHosts=["api.example", "127.0.0.1:8080", "[::1]:9"],
    )
    created = create(kube, namespace, agent_run("http-tool", tools=[body]))
    http = created["spec"]["agent"]["tools"][0]["http"]
    assert http["maxResponseBytes"] == 16384
    assert http["body"]["template"] == {"q": "{q}", "nested": {"list": [1, "{q}"]}}
    assert http["headers"][1]["secretKeyRef"] == {"name": "api", "key": "token"}
    get = create(kube, namespace, agent_run("http-get", tools=[http_tool()]))
    assert get["spec"]["agent"]["tools"][0]["http"]["method"] == "GET"


def test_plan_steps_may_not_take_the_names_of_turns_and_calls(
    kube: KubeClients, namespace: str
) -> None:
    said = _refused(kube, namespace, agent_run("reserved", plan=[step("t1-model")]))
    assert "plan step names may not look like t<number>-..." in said
    # Without an agent the name is an ordinary step name.
    plain = agent_run("plain", plan=[step("t1-model")])
    del plain["spec"]["agent"]
    assert create(kube, namespace, plain)["spec"]["plan"]["steps"][0]["name"] == "t1-model"


RESUME = {"run": "source", "uid": "6c1f0e1e-8a8c-4b55-9d0b-2f6e7c1b9a41", "turn": 2}
BAD_RESUMES = [
    ("resume-other-namespace", {**RESUME, "run": "team-b/source"}, "resumeFrom.run"),
    ("resume-turn-zero", {**RESUME, "turn": 0}, "should be greater than or equal to 1"),
    ("resume-not-a-uid", {**RESUME, "uid": "source"}, "resumeFrom.uid"),
    ("resume-no-uid", {"run": "source", "turn": 1}, "resumeFrom.uid: Required value"),
]


@pytest.mark.parametrize(
    ("case", "resume", "message"), BAD_RESUMES, ids=[c[0] for c in BAD_RESUMES]
)
def test_resume_from_names_a_run_of_this_namespace_its_uid_and_a_turn(
    kube: KubeClients, namespace: str, case: str, resume: dict[str, Any], message: str
) -> None:
    said = _refused(kube, namespace, agent_run(case, resumeFrom=resume))
    assert message in said, said


def test_resume_from_is_fixed_at_creation(
    kube: KubeClients, kubectl: Kubectl, namespace: str
) -> None:
    create(kube, namespace, agent_run("fork", resumeFrom=RESUME))
    create(kube, namespace, agent_run("plain"))
    changes = [
        ("fork", {"agent": {"resumeFrom": {**RESUME, "turn": 1}}}, "resumeFrom cannot change"),
        ("fork", {"agent": {"resumeFrom": None}}, "resumeFrom can only be set when the run is"),
        ("plain", {"agent": {"resumeFrom": RESUME}}, "resumeFrom can only be set when the run is"),
    ]
    for name, spec, message in changes:
        proc = kubectl("-n", namespace, "patch", "agentrun", name, "--type=merge",
                       "-p", json.dumps({"spec": spec}), check=False)  # fmt: skip
        assert proc.returncode != 0 and message in proc.stderr, (name, spec, proc.stderr)
    stored = kube.custom.get_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL,
                                                      "fork")  # fmt: skip
    assert stored["spec"]["agent"]["resumeFrom"] == RESUME


def _of_agent(name: str, **ref: Any) -> Run:
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {"name": name},
        "spec": {"goal": "sort ticket 7", "agentRef": {"name": "triage", **ref}},
    }


def test_agent_ref_is_alone_and_fixed_at_creation(
    kube: KubeClients, kubectl: Kubectl, namespace: str
) -> None:
    both = _of_agent("both")
    both["spec"]["agent"] = agent_run("x")["spec"]["agent"]
    assert "a run has spec.agent or spec.agentRef (an Agent by name), not both" in _refused(
        kube, namespace, both
    )
    create(kube, namespace, _of_agent("of-triage", overrides={"maxTurns": 3}))
    create(kube, namespace, agent_run("plain"))
    changes = [
        ("of-triage", {"agentRef": {"name": "other"}}, "agentRef cannot change"),
        ("of-triage", {"agentRef": None}, "spec.agentRef can only be set when the run is"),
        ("plain", {"agentRef": {"name": "triage"}}, "spec.agentRef can only be set when the"),
    ]
    for name, spec, message in changes:
        proc = kubectl("-n", namespace, "patch", "agentrun", name, "--type=merge",
                       "-p", json.dumps({"spec": spec}), check=False)  # fmt: skip
        assert proc.returncode != 0 and message in proc.stderr, (name, spec, proc.stderr)


def test_explain_teaches_agents_and_model_configs(kubectl: Kubectl) -> None:
    agent = " ".join(kubectl("explain", "agents.spec", "--api-version=agentrun.dev/v1alpha1")
                     .stdout.split())  # fmt: skip
    for field in ("modelConfigRef", "instructions", "tools", "allowOverrides", "maxTurns"):
        assert field in agent, field
    config = " ".join(kubectl("explain", "modelconfigs.spec").stdout.split())
    for field in ("baseURL", "apiKeySecretRef", "fallbacks", "maxOutputTokens"):
        assert field in config, field
    ref = " ".join(kubectl("explain", "agentrun.spec.agentRef").stdout.split())
    assert "status.agent.definition" in ref and "Fixed at creation" in ref
    taken = " ".join(kubectl("explain", "agentrun.status.agent.definition").stdout.split())
    assert "generation" in taken


def test_explain_teaches_the_agent(kubectl: Kubectl) -> None:
    out = kubectl("explain", "agentrun.spec.agent").stdout
    assert "A model that decides the next steps at run time" in out
    for field in ("instructions", "maxTurns", "maxToolCallsPerTurn", "contextBytes", "tools"):
        assert field in out, field
    tools = kubectl("explain", "agentrun.spec.agent.tools").stdout
    assert "AGENTRUN_TOOL_ARGS" in tools and "JSON Schema of the arguments" in tools
    model = kubectl("explain", "agentrun.spec.agent.model.apiKeySecretRef").stdout
    assert "never written to status" in model
    status = kubectl("explain", "agentrun.status.agent").stdout
    assert "transcript" in status and "stage" in status
    resume = " ".join(kubectl("explain", "agentrun.spec.agent.resumeFrom").stdout.split())
    assert "kubectl agentrun fork RUN --from TURN" in resume
    assert "approvals are never carried" in resume
    turn = kubectl("explain", "agentrun.spec.agent.resumeFrom.turn").stdout
    assert "ResumeRefused" in turn
    http = " ".join(kubectl("explain", "agentrun.spec.agent.tools.http").stdout.split())
    assert "Idempotency-Key" in http and "argsHash covers the method, the URL" in http
    for field in ("method", "url", "headers", "body", "allowedHosts", "maxResponseBytes"):
        assert field in http, field
    hosts = " ".join(
        kubectl("explain", "agentrun.spec.agent.tools.http.allowedHosts").stdout.split()
    )
    assert "allowed.example does not allow allowed.example.evil.com" in hosts
    assert "A URL with userinfo (user@host) is never sent" in hosts
    url = " ".join(kubectl("explain", "agentrun.spec.agent.tools.http.url").stdout.split())
    assert "percent-encoded" in url
    secret = kubectl("explain", "agentrun.spec.agent.tools.http.headers.secretKeyRef").stdout
    assert "never into status" in " ".join(secret.split())
    choice = " ".join(kubectl("explain", "agentrun.spec.agent.toolChoice").stdout.split())
    assert "auto (it decides), none (it answers without calling a tool)" in choice
    assert "required (it calls at least one tool), or a tool's name" in choice


def test_a_status_with_an_agent_loop_round_trips(kube: KubeClients, namespace: str) -> None:
    created = create(kube, namespace, agent_run("status"))
    body = copy.deepcopy(created)
    body["status"] = {
        "phase": "Running",
        "agent": {
            "stage": "Acting",
            "turn": 2,
            "context": {
                "turn": 2,
                "name": "status-context-2",
                "parts": 1,
                "digest": "a" * 64,
                "bytes": 900,
                "messages": 5,
                "pagedResults": 1,
                "omittedTurns": 0,
            },
            "calls": [
                {"id": "c1", "tool": "search", "step": "t2-0-search", "arguments": '{"q":"x"}'},
                {"id": "c2", "tool": "nope", "problem": "unknown tool 'nope'"},
            ],
            "toolCalls": 3,
            "invalidToolCalls": 1,
            "recent": [{"turn": 1, "toolCalls": 1, "tokens": 30, "finishReason": "tool_calls"}],
        },
    }
    stored = kube.custom.replace_namespaced_custom_object_status(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "status", body
    )
    # The API server fills in the schema's defaults; nothing else changes.
    written = m.AgentRunStatus.model_validate(body["status"]).to_wire()["agent"]
    assert stored["status"]["agent"] == written
    parsed = m.AgentRun.model_validate(stored)
    assert parsed.status is not None and parsed.status.agent is not None
    assert parsed.status.agent.calls is not None
    assert parsed.status.agent.calls[1].problem == "unknown tool 'nope'"


def test_the_admission_policies_take_agent_runs_and_keep_their_tools_gated(
    cluster: TestCluster, namespace: str
) -> None:
    """The shipped policies accept a run without a plan, and refuse an update that lowers the
    approval a tool's calls need (rule g, for tools)."""

    def kubectl(*args: str, input: str | None = None) -> CompletedProcess[str]:
        return cluster.kubectl(*args, "-n", namespace, input=input, check=False)

    def enforced() -> bool:
        forged = agent_run("probe")
        forged["spec"]["approvals"] = [
            {"step": "t1-0-search", "decision": "approve", "argsHash": "a" * 64, "by": "nobody"}
        ]
        proc = kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(forged))
        return proc.returncode != 0 and "must be signed by the requesting user" in proc.stderr

    gated = agent_run("gated", tools=[tool(approval="required", risk="external")])
    with policies_bound_to(cluster, namespace, enforced):
        created = kubectl("create", "-f", "-", "-o", "json", input=json.dumps(gated))
        assert created.returncode == 0, created.stderr
        assert "agentrun.dev/created-by" in json.loads(created.stdout)["metadata"]["annotations"]
        lowered = [
            {"op": "replace", "path": "/spec/agent/tools/0/approval", "value": "auto"},
            {"op": "replace", "path": "/spec/agent/tools/0/risk", "value": "read"},
        ]
        denied = kubectl("patch", "agentrun/gated", "--type=json", "-p", json.dumps(lowered))
        assert denied.returncode != 0
        assert (
            "spec.agent.tools[search]: cannot go from approval required, risk external to "
            "approval auto, risk read after creation"
        ) in denied.stderr, denied.stderr
        goal = [{"op": "replace", "path": "/spec/goal", "value": "a new goal"}]
        changed = kubectl("patch", "agentrun/gated", "--type=json", "-p", json.dumps(goal))
        assert changed.returncode == 0, changed.stderr
