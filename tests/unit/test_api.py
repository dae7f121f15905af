"""The pydantic models and the examples: every example is valid against both the models and
the generated OpenAPI schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agentrun.api import models as m
from agentrun.core.graph import plan_problems
from tests.support.paths import EXAMPLES_DIR
from tests.support.schema import VALIDATOR

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))


def test_there_are_examples_for_each_feature() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"incident-investigation", "dag-with-retries", "approval-gate"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    errors = sorted(VALIDATOR.iter_errors(body), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
    run = m.AgentRun.model_validate(body)
    assert plan_problems(run.spec.plan.steps) == []
    assert run.to_wire()["spec"] == m.AgentRunSpec.model_validate(body["spec"]).to_wire()


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
