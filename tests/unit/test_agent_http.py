"""HTTP tools in the agent loop (docs/agent.md, "HTTP tools"): every valid call a step of its
own in the operator's image (``agentrun step http``), checked before it becomes one, bound by
its argsHash to the method, the URL, the headers' Secret references and the body, gated like
any tool, fixed at creation, and sent to the run's executor, which holds the header Secrets,
as MCP calls are."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import SendTurn, reconcile, turn_steps, turns
from agentrun.core import agent_loop as loop
from agentrun.core import executor as ex
from agentrun.core import http_tool as h
from agentrun.core.arguments import args_hash
from agentrun.core.pod_env import ENV_HTTP_HEADER, ENV_HTTP_TOOL
from tests.support.agent_sim import SEARCH, AgentSim, agent_run, call, tool_envelope
from tests.support.executor_sim import ExecutorSim
from tests.support.sim import UID

SECRET = {"name": "api-token", "key": "token"}
LOOKUP: dict[str, Any] = {
    "name": "lookup",
    "description": "Look a user up.",
    "parameters": {
        "type": "object",
        "properties": {"user": {"type": "string", "maxLength": 32}, "note": {"type": "string"}},
        "required": ["user"],
        "additionalProperties": False,
    },
    "http": {
        "method": "POST",
        "url": "https://users.example/v1/users/{user}",
        "headers": [
            {"name": "Accept", "value": "application/json"},
            {"name": "Authorization", "secretKeyRef": SECRET},
        ],
        "body": {"template": {"note": "{note}"}},
        "allowedHosts": ["users.example"],
    },
}
GATED = {**LOOKUP, "name": "delete_user", "risk": "external", "approval": "required"}
SECRET_CHECK = ("get", "secrets", "api-token")


def _sim(*tools: dict[str, Any], **spec: Any) -> AgentSim:
    return AgentSim(agent_run(tools=[SEARCH, *(tools or (LOOKUP,))], **spec))


def _env(sim: AgentSim, step: str) -> dict[str, m.EnvVar]:
    create = next(c for c in sim.created_specs.values() if c.step.name == step)
    return {e.name: e for e in create.step.container.env or []}


def test_a_call_is_a_step_of_the_operators_program_with_the_header_secret_by_reference() -> None:
    sim = _sim()
    sim.answer("", [call("lookup", {"user": "ann", "note": "hi"}, "c1")])
    (job,) = sim.tool_jobs()
    assert job.step == "t1-0-lookup"
    create = sim.created_specs[job.name]
    assert create.step.container.image == loop.AgentConfig().llm_image
    assert create.step.container.command == ["agentrun", "step", "http"]
    env = _env(sim, "t1-0-lookup")
    entry = json.loads(env[ENV_HTTP_TOOL].value or "")
    assert entry["http"]["url"] == LOOKUP["http"]["url"]
    assert entry["http"]["headers"][1] == {"name": "Authorization", "secretKeyRef": SECRET}
    header = env[f"{ENV_HTTP_HEADER}1"].value_from
    assert header is not None and header.secret_key_ref is not None
    assert header.secret_key_ref.to_wire() == SECRET
    assert f"{ENV_HTTP_HEADER}0" not in env  # a literal value is in the entry, not a variable
    assert json.loads(env[loop.ENV_TOOL_ARGS].value or "") == {"user": "ann", "note": "hi"}
    st = sim.step_status("t1-0-lookup")
    assert st.idempotency_key == f"{UID}:1:c1:{st.args_hash}"
    # Its response, whatever its status, is the result the model reads.
    record = h.response_record(404, "Not Found", "text/plain", b"no user ann", False, {}, "u")
    envelope = tool_envelope(json.dumps(record), h.result_summary(record))
    sim.tools_return(lambda j: (True, envelope))
    assert sim.agent.turn == 2
    (outcome,) = sim.transcript()[0]["toolCalls"]
    assert outcome["outcome"] == "Succeeded"
    assert json.loads(outcome["result"])["error"] == "the server answered HTTP 404 Not Found"
    assert sim.run.status is not None
    assert "api-token" not in json.dumps([c.arguments for c in sim.agent.calls or []])


def _hash(tool: dict[str, Any]) -> str | None:
    """The argsHash of the call ``c1`` of ``tool`` with the same arguments."""
    run = agent_run(tools=[tool])
    status = agent_status.AgentStatus(turn=1, stage=agent_status.AgentStage.ACTING)
    arguments = json.dumps({"user": "ann", "note": "hi"})
    made = agent_status.ToolCallStatus(
        id="c1", tool=tool["name"], step="t1-0-lookup", arguments=arguments
    )
    declared = a.AgentTool.model_validate(tool)
    step = turn_steps.http_call_step(1, made, declared, status, turns.AgentConfig())
    return args_hash(run, step, {})


def _changed(**http: Any) -> dict[str, Any]:
    return {**LOOKUP, "http": {**LOOKUP["http"], **http}}


@pytest.mark.parametrize(
    ("what", "tool"),
    [
        ("the method", _changed(method="PUT")),
        ("the URL", _changed(url="https://users.example/v2/users/{user}")),
        ("the allowed hosts", _changed(allowedHosts=["users.example", "other.example"])),
        (
            "a header's Secret",
            _changed(headers=[{"name": "Authorization", "secretKeyRef": {**SECRET, "key": "k2"}}]),
        ),
        ("a literal header", _changed(headers=[{"name": "Accept", "value": "text/plain"}])),
        ("the body", _changed(body={"argument": "note"})),
        ("the response limit", _changed(maxResponseBytes=10)),
    ],
)
def test_the_args_hash_covers_every_field_of_the_request(what: str, tool: dict[str, Any]) -> None:
    assert _hash(LOOKUP) is not None
    assert _hash(tool) != _hash(LOOKUP), what


def test_calls_that_cannot_be_made_are_answered_as_invalid_before_any_step() -> None:
    sim = _sim(_changed(url="https://{user}/v1"))
    sim.answer(
        "",
        [
            call("lookup", {"user": 5}, "type"),
            call("lookup", {"user": "x", "extra": 1}, "extra"),
            call("lookup", {"user": "users.example.evil.com"}, "host"),
            call("lookup", {"user": "users.example"}, "good"),
        ],
    )
    calls = {c.id: c for c in sim.agent.calls or []}
    assert "user: 5 is not of type 'string'" in (calls["type"].problem or "")
    assert "Additional properties are not allowed" in (calls["extra"].problem or "")
    assert calls["host"].problem == (
        "the URL's host users.example.evil.com:443 is not among the tool's allowedHosts "
        "(users.example): the request was not sent"
    )
    assert [c.step for c in calls.values()] == [None, None, None, "t1-3-lookup"]
    assert [j.step for j in sim.tool_jobs()] == ["t1-3-lookup"]


def test_a_gated_http_tool_waits_for_an_approval_of_its_args_hash() -> None:
    sim = _sim(GATED)
    sim.answer("", [call("delete_user", {"user": "ann"}, "d1")])
    st = sim.step_status("t1-0-delete-user")
    assert st.phase == SP.WAITING_FOR_APPROVAL and sim.tool_jobs() == []
    stale = m.Approval(step=st.name, decision="approve", args_hash="0" * 64, by="alice")
    sim.spec_update(approvals=[stale])
    sim.settle()
    assert sim.tool_jobs() == []
    ok = m.Approval(step=st.name, decision="approve", args_hash=st.args_hash, by="alice")
    sim.spec_update(approvals=[stale, ok])
    sim.settle()
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-delete-user"]


def test_http_calls_run_the_operators_image_whatever_policy_allowed_images_says() -> None:
    sim = _sim(spec={"policy": {"allowedImages": ["ghcr.io/"]}})
    sim.answer("", [call("lookup", {"user": "ann"}, "c")])
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-lookup"]


def test_a_declaration_that_cannot_work_fails_the_run_before_anything_runs() -> None:
    sim = _sim(_changed(url="https://elsewhere.example/{who}"))
    sim.settle()
    ready = sim.condition("Ready")
    assert sim.status.phase == m.RunPhase.FAILED and ready is not None
    assert ready.reason == "InvalidAgent"
    assert "the HTTP tool lookup takes the arguments who" in (sim.status.message or "")
    assert "elsewhere.example:443 is not among the tool's allowedHosts" in (
        sim.status.message or ""
    )
    assert sim.jobs == {}


@pytest.mark.parametrize(
    "change",
    [
        {"url": "https://attacker.example/{user}", "allowedHosts": ["attacker.example"]},
        {"allowedHosts": ["users.example", "attacker.example"]},
        {"headers": [{"name": "Authorization", "secretKeyRef": {"name": "other", "key": "k"}}]},
    ],
)
def test_changing_an_http_tool_after_the_run_started_fails_it_closed(
    change: dict[str, Any],
) -> None:
    sim = _sim()
    sim.answer("", [call("lookup", {"user": "ann"}, "c1")])
    agent = sim.run.spec.agent
    assert agent is not None
    moved = a.AgentTool.model_validate(_changed(**change))
    tools = [*(agent.tools or [])[:1], moved]
    sim.spec_update(agent=agent.model_copy(update={"tools": tools}))
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    ready = sim.condition("Ready")
    assert ready is not None and ready.reason == loop.SPEC_CHANGED
    assert "spec.agent.tools changed after the run started" in (sim.status.message or "")
    entries = [
        e.value or ""
        for c in sim.created_specs.values()
        for e in c.step.container.env or []
        if e.name == ENV_HTTP_TOOL
    ]
    assert entries and all("attacker" not in e and "other" not in e for e in entries)


# -- on the run's executor -------------------------------------------------------------------


def _executor_sim(granted: bool = True) -> ExecutorSim:
    sim = ExecutorSim(agent_run(tools=[SEARCH, LOOKUP]))
    if granted:
        sim.granted = frozenset({SECRET_CHECK})
    sim.settle()
    return sim


def test_a_call_goes_to_the_executor_which_holds_the_header_secret() -> None:
    sim = _executor_sim()
    executor_job = turns.executor_name(sim.run, 1)
    assert sim.executors[executor_job].started
    step = turn_steps.executor_step(sim.run, sim.agent, sim.config.agent)
    ref = m.SecretKeySelector(name="api-token", key="token")
    held = next(e for e in step.container.env or [] if e.name == turns.executor_secret_env(ref))
    assert held.value_from is not None and held.value_from.secret_key_ref == ref
    sim.executor_answers("", [call("lookup", {"user": "ann"}, "c1")])
    st = sim.step_status("t1-0-lookup")
    assert st.executor_pod == "executor-pod-1" and st.job_name not in sim.jobs
    (sent,) = {s for s in sim.sent if s.step == "t1-0-lookup"}
    assert (sent.program, sent.executor, sent.parts) == (ex.HTTP_CALL, executor_job, 0)
    env = dict(sent.env)
    assert json.loads(env[ENV_HTTP_TOOL])["name"] == "lookup"
    assert dict(sent.secret_env) == {f"{ENV_HTTP_HEADER}1": turns.executor_secret_env(ref)}
    assert sent.digest == ex.call_digest(dict(sent.env), dict(sent.secret_env))
    assert sent.idempotency_key == st.idempotency_key
    # Asked again on every pass until it answers; its answer settles the call.
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    again = [s for s in decision.after_commit if isinstance(s, SendTurn)]
    assert [(s.job_name, s.program) for s in again] == [(st.job_name, ex.HTTP_CALL)]
    record = h.response_record(200, "OK", "application/json", b'{"id": 7}', False, {}, "u")
    sim.answers[st.job_name or ""] = (0, tool_envelope(json.dumps(record), "HTTP 200 OK"))
    sim.settle()
    assert sim.agent.turn == 2
    (outcome,) = sim.transcript()[0]["toolCalls"]
    assert json.loads(outcome["result"])["body"] == '{"id": 7}'
    assert not [name for name in sim.creations if "lookup" in name]


def test_without_the_header_secret_confirmed_there_is_no_executor_and_calls_are_jobs() -> None:
    sim = _executor_sim(granted=False)
    assert sim.agent.executor is None and not sim.executors
    sim.answer("", [call("lookup", {"user": "ann"}, "c1")])
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-lookup"]
    assert sim.step_status("t1-0-lookup").executor_pod is None
