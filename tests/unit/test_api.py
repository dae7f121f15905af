"""The pydantic models and the examples: every object of every example (an AgentRun, and the
Agent and ModelConfig a run by reference names) is valid against both the models and the
generated OpenAPI schema of its kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agentrun.api import agent_defs as d
from agentrun.api import crd
from agentrun.api import models as m
from agentrun.core import agent_refs
from agentrun.core.graph import plan_problems
from agentrun.core.machine import agent_problems
from tests.support.paths import EXAMPLES_DIR
from tests.support.schema import VALIDATORS

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    """The objects of an example file: one, or several separated by ``---``."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


DEFINING = [p for p in EXAMPLES if any(doc.get("kind") != m.KIND for doc in documents(p))]
"""Examples that define an Agent (and its ModelConfig) beside the run of it."""


def test_there_are_examples_for_each_feature() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"incident-investigation", "dag-with-retries", "approval-gate", "agent-ref"} <= names
    assert "agent-ref" in {p.stem for p in DEFINING}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    docs = documents(path)
    kinds = [doc.get("kind") for doc in docs]
    assert set(kinds) <= {kind.kind for kind in crd.KINDS}, kinds
    assert kinds.count(m.KIND) == 1, f"one AgentRun per example: {kinds}"
    for body in docs:
        assert body.get("apiVersion") == m.API_VERSION, body.get("apiVersion")
        errors = sorted(VALIDATORS[body["kind"]].iter_errors(body), key=lambda e: list(e.path))
        where = f"{body['kind']} {body['metadata']['name']}"
        assert not errors, f"{where}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
    (body,) = [doc for doc in docs if doc["kind"] == m.KIND]
    run = m.AgentRun.model_validate(body)
    assert plan_problems(run.spec.plan.steps) == []
    assert run.to_wire()["spec"] == m.AgentRunSpec.model_validate(body["spec"]).to_wire()


@pytest.mark.parametrize("path", DEFINING, ids=lambda p: p.name)
def test_an_example_that_defines_an_agent_holds_all_its_run_needs(path: Path) -> None:
    """The run names an Agent of the same file, whose ModelConfig is there too, and the two
    with the run's overrides amount to a valid agent (as the run's first pass resolves it)."""
    docs = documents(path)
    agents = {
        doc["metadata"]["name"]: d.AgentObject.model_validate(doc)
        for doc in docs
        if doc["kind"] == d.AGENT_KIND
    }
    configs = {
        doc["metadata"]["name"]: d.ModelConfigObject.model_validate(doc)
        for doc in docs
        if doc["kind"] == d.MODEL_CONFIG_KIND
    }
    (body,) = [doc for doc in docs if doc["kind"] == m.KIND]
    ref = m.AgentRun.model_validate(body).spec.agent_ref
    assert ref is not None, "a file that defines an Agent runs it (spec.agentRef)"
    assert ref.name in agents, f"spec.agentRef names {ref.name}, not an Agent of {path.name}"
    agent = agents[ref.name]
    config_ref = agent.spec.model_config_ref
    if config_ref is not None:
        assert config_ref.name in configs, f"modelConfigRef {config_ref.name} is not in the file"
    model = configs[config_ref.name] if config_ref is not None else None
    resolved = agent_refs.resolve(ref, agent, model)
    assert not isinstance(resolved, str), resolved
    assert agent_problems(resolved) == []


def test_wire_format_is_camel_case_and_round_trips() -> None:
    spec = m.AgentRunSpec.model_validate(
        {
            "goal": "g",
            "plan": {
                "steps": [
                    {"name": "a", "dependsOn": [], "timeoutSeconds": 5, "container": {"image": "i"}}
                ]
            },
        }
    )
    wire = spec.to_wire()
    assert wire["plan"]["steps"][0]["timeoutSeconds"] == 5
    assert m.AgentRunSpec.model_validate(wire) == spec


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": "Bad_Name", "container": {"image": "i"}}, "name"),
        ({"name": "a", "container": {"image": "i"}, "retry": {"limit": -1}}, "limit"),
        ({"name": "a", "container": {"image": "i"}, "risk": "dangerous"}, "risk"),
        ({"name": "a", "container": {"image": "i"}, "timeoutSeconds": 0}, "timeoutSeconds"),
        ({"name": "a", "container": {"image": "i"}, "colour": "red"}, "colour"),
    ],
)
def test_models_reject_bad_steps(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        m.Step.model_validate(body)
    assert fragment in str(info.value)


def test_timestamps_serialize_like_kubernetes() -> None:
    from datetime import UTC, datetime

    t = m.Transition(
        at=datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=UTC), to_phase="Running", reason="R"
    )
    assert t.to_wire()["at"] == "2026-01-02T03:04:05Z"
    assert t.to_wire()["to"] == "Running"
