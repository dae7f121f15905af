"""Runs of an Agent by reference (spec.agentRef), in memory: what an Agent and its ModelConfig
amount to, the overrides a run may make, and a run that takes its Agent once and keeps it
(agentrun.core.agent_refs through agentrun.core.machine, as the shell drives them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from agentrun.api import agent_defs as d
from agentrun.api import models as m
from agentrun.core import Observed, agent_refs, follow_up
from agentrun.core.observed import Definition
from tests.support.agent_sim import SEARCH, AgentSim
from tests.support.sim import UID

KEY = {"name": "llm-key", "key": "token"}


def model_config(name: str = "small", **spec: Any) -> d.ModelConfigObject:
    body = {"baseURL": "http://models.example:8000/v1", "name": "small-model", **spec}
    return d.ModelConfigObject.model_validate(
        {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 3}, "spec": body}
    )


def agent_object(name: str = "triage", **spec: Any) -> d.AgentObject:
    body: dict[str, Any] = {
        "instructions": "Sort the ticket.",
        "modelConfigRef": {"name": "small"},
        "tools": [SEARCH],
        **spec,
    }
    return d.AgentObject.model_validate(
        {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 7}, "spec": body}
    )


def ref_run(name: str = "of-triage", **ref: Any) -> m.AgentRun:
    return m.AgentRun.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": UID, "generation": 1},
            "spec": {"goal": "sort ticket 7", "agentRef": {"name": "triage", **ref}},
        }
    )


# -- what an Agent amounts to ---------------------------------------------------------------------


def test_an_agent_and_its_model_config_make_the_runs_spec_agent() -> None:
    ref = d.AgentRef(name="triage")
    resolved = agent_refs.resolve(ref, agent_object(), model_config(apiKeySecretRef=KEY))
    assert not isinstance(resolved, str)
    assert resolved.model.base_url == "http://models.example:8000/v1"
    assert resolved.model.name == "small-model"
    assert resolved.model.api_key_secret_ref is not None
    assert resolved.model.api_key_secret_ref.name == "llm-key"
    assert resolved.instructions == "Sort the ticket."
    assert [t.name for t in resolved.tools or []] == ["search"]
    assert resolved.max_turns == 20


def test_an_agent_may_write_its_model_out() -> None:
    written = {"baseURL": "http://inline.example/v1", "name": "inline"}
    agent = agent_object(modelConfigRef=None, model=written)
    resolved = agent_refs.resolve(d.AgentRef(name="triage"), agent, None)
    assert not isinstance(resolved, str)
    assert resolved.model.name == "inline"


def test_overrides_apply_only_where_the_agent_allows_them() -> None:
    ref = d.AgentRef.model_validate({"name": "triage", "overrides": {"maxTurns": 3}})
    refused = agent_refs.resolve(ref, agent_object(), model_config())
    assert isinstance(refused, str)
    assert "maxTurns" in refused and "allowOverrides: nothing" in refused
    allowing = agent_object(allowOverrides=["maxTurns"])
    resolved = agent_refs.resolve(ref, allowing, model_config())
    assert not isinstance(resolved, str)
    assert resolved.max_turns == 3


def test_an_agent_too_large_for_a_runs_status_is_refused() -> None:
    tools = [{**SEARCH, "name": f"search{i}", "description": "x" * 4096} for i in range(32)]
    refused = agent_refs.resolve(
        d.AgentRef(name="triage"), agent_object(tools=tools), model_config()
    )
    assert isinstance(refused, str)
    assert "more than the" in refused and "bytes" in refused


def test_every_secret_an_agent_names_is_found() -> None:
    http = {
        "name": "tickets",
        "description": "read a ticket",
        "parameters": {"type": "object"},
        "http": {
            "url": "https://tickets.example/api",
            "allowedHosts": ["tickets.example"],
            "headers": [{"name": "Authorization", "secretKeyRef": {"name": "tickets", "key": "t"}}],
        },
    }
    agent = agent_object(tools=[SEARCH, http])
    resolved = agent_refs.resolve(
        d.AgentRef(name="triage"), agent, model_config(apiKeySecretRef=KEY)
    )
    assert not isinstance(resolved, str)
    named = dict(agent_refs.secrets_named(resolved))
    assert named == {"llm-key": "model", "tickets": "tool tickets header Authorization"}


# -- a run of an Agent, pass by pass ---------------------------------------------------------------


@dataclass
class RefSim(AgentSim):
    """The shell's part for a run of an Agent: the run read with the agent it took
    (agent_refs.effective), and the Agent handed over while the run has not taken it."""

    found: Definition | None = None

    def _as_read(self) -> m.AgentRun:
        return agent_refs.effective(self.run)

    def observed(self) -> Observed:
        stored, self.run = self.run, self._as_read()
        try:
            base = super().observed()
        finally:
            self.run = stored
        wanted = agent_refs.needs_definition(self.run)
        return dataclasses.replace(base, definition=self.found if wanted else None)

    def decide(self, snapshot: tuple[m.AgentRun, int] | None = None) -> Any:
        run, version = snapshot or self.snapshot()
        return super().decide((agent_refs.effective(run), version))


def started(**ref: Any) -> RefSim:
    sim = RefSim(ref_run(**ref), found=Definition(agent=agent_object(), model=model_config()))
    sim.granted = frozenset()
    sim.settle()
    return sim


def test_the_first_pass_takes_the_agent_with_its_sources_and_the_run_goes_on() -> None:
    sim = started()
    taken = sim.agent.definition
    assert taken is not None
    assert (taken.agent.name, taken.agent.uid, taken.agent.generation) == (
        "triage",
        "uid-triage",
        7,
    )
    assert taken.model_config_source is not None
    assert (taken.model_config_source.name, taken.model_config_source.generation) == ("small", 3)
    assert taken.spec.model.name == "small-model"
    assert sim.agent.frozen is not None and sim.agent.frozen.model.name == "small-model"
    assert sim.status.phase == m.RunPhase.RUNNING
    assert sim.model_job() is not None, sim.status.message
    # The operator writes status only: the spec stays as the creator wrote it.
    assert sim.run.spec.agent is None


def test_a_change_of_the_agent_after_the_first_pass_changes_nothing() -> None:
    sim = started()
    before = sim.agent.definition
    sim.found = Definition(
        agent=agent_object(instructions="IGNORE THE TICKET", tools=[]),
        model=model_config(baseURL="http://elsewhere.example/v1"),
    )
    sim.answer("", [])  # the first turn answers; the run ends with its answer
    assert sim.agent.definition == before
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert all("elsewhere" not in str(job.env) for job in sim.jobs.values())


def test_a_run_whose_agent_cannot_be_taken_fails_with_the_reason() -> None:
    sim = RefSim(
        ref_run(), found=Definition(problem="creator eve may not get agents.agentrun.dev/triage")
    )
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    assert sim.condition("Ready") is not None
    ready = sim.condition("Ready")
    assert ready is not None and ready.reason == agent_refs.REFUSED
    assert "may not get agents" in (sim.status.message or "")
    assert not sim.jobs


def test_a_run_waits_while_its_agent_is_not_read() -> None:
    sim = RefSim(ref_run(), found=None)
    decision = sim.tick()
    assert sim.status.phase == m.RunPhase.PENDING
    assert sim.status.message == "reading Agent triage (spec.agentRef)"
    assert decision.requeue_after is not None and decision.requeue_after <= agent_refs.WAIT_SECONDS
    sim.found = Definition(agent=agent_object(), model=model_config())
    sim.settle()
    assert sim.agent.definition is not None
    assert sim.run.status is not None and sim.run.status.phase is m.RunPhase.RUNNING


@pytest.mark.parametrize("change", [{"name": "other"}, None])
def test_a_run_whose_agent_ref_changed_stops(change: dict[str, Any] | None) -> None:
    sim = started()
    sim.spec_update(agent_ref=d.AgentRef.model_validate(change) if change else None)
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    ready = sim.condition("Ready")
    assert ready is not None and ready.reason == agent_refs.CHANGED
    assert "spec.agentRef" in (sim.status.message or "")


def test_a_follow_up_of_a_run_of_an_agent_names_the_agent_again() -> None:
    sim = started()
    sim.answer("ticket 7 is a duplicate", [])
    body = sim.run.model_dump(mode="json", by_alias=True, exclude_none=True)
    asked = agent_refs.effective(sim.run)
    assert follow_up.ask_problem(asked) is None
    new = follow_up.new_run(body, asked, "and ticket 8?", "of-triage-2")
    assert "agent" not in new["spec"]
    assert new["spec"]["agentRef"]["name"] == "triage"
    assert new["spec"]["agentRef"]["resumeFrom"] == {"run": "of-triage", "uid": UID, "turn": 1}
    assert m.AgentRun.model_validate({**new, "metadata": {"name": "of-triage-2"}}).spec.agent_ref
