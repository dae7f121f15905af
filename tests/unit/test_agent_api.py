"""The agent loop's API: spec.agent and status.agent, as models and in the generated CRD."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agentrun.api import agent as a
from agentrun.api import agent_status, crd
from agentrun.api import models as m
from tests.support.paths import CRD_FILE
from tests.support.schema import VALIDATOR


def tool(name: str = "search", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "description": f"the {name} tool",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
        "container": {"image": "ghcr.io/acme/tools:1", "command": ["search"]},
    }
    body.update(extra)
    return body


def agent_spec(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "goal": "find out why checkout is slow",
        "agent": {
            "model": {"baseURL": "http://127.0.0.1:8000/v1", "name": "scripted"},
            "instructions": "You are an SRE.",
            "tools": [tool()],
        },
    }
    body.update(extra)
    return body


def _errors(body: dict[str, Any]) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(body)]


def _wire(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": {"name": "r"}, "spec": spec}


def test_a_run_with_only_an_agent_reads_as_an_empty_plan_and_keeps_none_on_the_wire() -> None:
    spec = m.AgentRunSpec.model_validate(agent_spec())
    assert spec.plan.steps == []
    assert spec.agent is not None and spec.agent.tools is not None
    wire = spec.to_wire()
    assert "plan" not in wire
    assert wire["agent"]["model"]["baseURL"] == "http://127.0.0.1:8000/v1"
    assert m.AgentRunSpec.model_validate(wire).to_wire() == wire
    assert not _errors(_wire(wire))


def test_defaults_of_the_loop() -> None:
    agent = m.AgentRunSpec.model_validate(agent_spec()).agent
    assert agent is not None
    assert (agent.max_turns, agent.max_tool_calls_per_turn) == (20, 4)
    assert agent.context_bytes == a.DEFAULT_CONTEXT_BYTES
    assert agent.model.max_output_tokens == 1024
    (only,) = agent.tools or []
    assert (only.risk, only.approval) == (m.Risk.READ, m.ApprovalMode.AUTO)


def test_a_plan_may_come_first() -> None:
    spec = m.AgentRunSpec.model_validate(
        agent_spec(plan={"steps": [{"name": "gather", "container": {"image": "busybox"}}]})
    )
    assert [s.name for s in spec.plan.steps] == ["gather"]
    assert spec.to_wire()["plan"]["steps"][0]["name"] == "gather"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "9lives"}, "String should match pattern"),
        ({"name": "has space"}, "String should match pattern"),
        ({"name": "x" * 49}, "at most 48 characters"),
        ({"description": ""}, "at least 1 character"),
        ({"risk": "dangerous"}, "Input should be 'read', 'write' or 'external'"),
        ({"timeoutSeconds": 0}, "greater than or equal to 1"),
    ],
)
def test_invalid_tools_are_refused_by_the_models(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        m.AgentRunSpec.model_validate(
            agent_spec(agent={**agent_spec()["agent"], "tools": [tool(**change)]})
        )
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"maxTurns": 0}, "greater than or equal to 1"),
        ({"maxTurns": a.MAX_TURNS + 1}, f"less than or equal to {a.MAX_TURNS}"),
        ({"maxToolCallsPerTurn": a.MAX_CALLS_PER_TURN + 1}, "less than or equal to 16"),
        ({"contextBytes": a.MIN_CONTEXT_BYTES - 1}, "greater than or equal to 4096"),
        ({"contextBytes": a.MAX_CONTEXT_BYTES + 1}, "less than or equal to 262144"),
        ({"model": {"baseURL": "ftp://x", "name": "m"}}, "String should match pattern"),
        ({"model": {"baseURL": "http://x/v1", "name": "m", "temperature": 3}}, "less than"),
    ],
)
def test_invalid_limits_are_refused_by_the_models(agent: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        m.AgentRunSpec.model_validate(agent_spec(agent={**agent_spec()["agent"], **agent}))
    assert message in str(info.value)


def _spec_schema() -> dict[str, Any]:
    body = yaml.safe_load(CRD_FILE.read_text())
    spec: dict[str, Any] = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    return spec


def test_the_crd_makes_plan_optional_next_to_an_agent() -> None:
    spec = _spec_schema()
    assert spec["required"] == ["goal"]
    rules = {r["message"]: r["rule"] for r in spec["x-kubernetes-validations"]}
    assert rules["a run needs spec.plan, spec.agent (or spec.agentRef) or both"] == (
        "has(self.plan) || has(self.agent) || has(self.agentRef)"
    )
    assert rules["a run has spec.agent or spec.agentRef (an Agent by name), not both"]
    reserved = next(r for msg, r in rules.items() if "t<number>-" in msg)
    assert "'^t[0-9]+-'" in reserved
    assert crd.openapi_schema()["properties"]["spec"] == spec


def test_the_crd_keys_tools_by_name_and_keeps_their_schema_whole() -> None:
    tools = _spec_schema()["properties"]["agent"]["properties"]["tools"]
    assert tools["x-kubernetes-list-type"] == "map"
    assert tools["x-kubernetes-list-map-keys"] == ["name"]
    assert tools["maxItems"] == a.MAX_TOOLS
    item = tools["items"]
    assert item["properties"]["parameters"]["x-kubernetes-preserve-unknown-fields"] is True
    assert item["properties"]["parameters"]["type"] == "object"
    assert "parameters" in item["required"]
    rules = [r["rule"] for r in item["x-kubernetes-validations"]]
    kinds = " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in ("container", "agent", "http"))
    assert rules == [
        "has(self.parameters.type) && self.parameters.type == 'object'",
        f"{kinds} == 1",
    ]
    assert "container" not in item["required"]  # a sub-agent tool has an agent instead
    assert item["properties"]["http"]["properties"]["body"]["properties"]["template"][
        "x-kubernetes-preserve-unknown-fields"
    ]


def test_the_openapi_schema_accepts_an_agent_run_and_refuses_a_run_of_neither() -> None:
    assert not _errors(_wire(agent_spec()))
    missing_params = agent_spec()
    del missing_params["agent"]["tools"][0]["parameters"]
    assert any("'parameters' is a required property" in e for e in _errors(_wire(missing_params)))


def test_status_agent_round_trips() -> None:
    status = m.AgentRunStatus.model_validate(
        {
            "phase": "Running",
            "agent": {
                "stage": "Acting",
                "turn": 3,
                "context": {
                    "turn": 3,
                    "name": "r-context-3",
                    "parts": 1,
                    "digest": "d" * 64,
                    "bytes": 1200,
                    "messages": 7,
                },
                "calls": [
                    {"id": "call_1", "tool": "search", "step": "t3-0-search", "arguments": "{}"},
                    {"id": "call_2", "tool": "nope", "problem": "unknown tool 'nope'"},
                ],
                "recent": [{"turn": 2, "toolCalls": 1, "tokens": 40, "finishReason": "tool_calls"}],
            },
        }
    )
    assert status.agent is not None and status.agent.stage == agent_status.AgentStage.ACTING
    wire = status.to_wire()
    assert wire["agent"]["calls"][1]["problem"] == "unknown tool 'nope'"
    assert m.AgentRunStatus.model_validate(wire).to_wire() == wire
