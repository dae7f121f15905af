"""What a model turn calls is fixed at the run's creation (agentrun.core.frozen, docs/agent.md
"Fixed at creation"): the operator's first pass takes spec.agent.model and a digest of the
tools into status.agent.frozen, every turn is built from that copy, and a run whose spec.agent
changed fails closed (reason AgentSpecChanged, naming the field) before anything is launched.

The attack these hold against: while a tool call runs, someone allowed to edit the run (but not
to read the API key's Secret) points spec.agent.model.baseURL at a server of theirs. Before,
the next turn carried the key there."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.base import SecretKeySelector
from agentrun.api.models import StepPhase as SP
from agentrun.clients.plugin import transcript
from agentrun.core import agent_loop as loop
from agentrun.core import fork_plan, frozen, rights
from agentrun.core.launch import committed_launch
from tests.support.agent_sim import RESTART, SEARCH, AgentSim, agent_run, call
from tests.support.sim import make_run

OWN = "http://llm.models.svc:8000/v1"
ATTACKER = "http://attacker.example:8000/v1"
KEYED: dict[str, Any] = {
    "baseURL": OWN,
    "name": "m",
    "apiKeySecretRef": {"name": "llm", "key": "api-key"},
}


def _keyed_sim(**agent: Any) -> AgentSim:
    return AgentSim(agent_run(model=dict(KEYED), tools=[SEARCH, RESTART], **agent))


def _model_update(sim: AgentSim, **fields: Any) -> None:
    agent = sim.run.spec.agent
    assert agent is not None
    model = a.ModelEndpoint.model_validate({**agent.model.to_wire(), **fields})
    sim.spec_update(agent=agent.model_copy(update={"model": model}))


def _tools_update(sim: AgentSim, tools: list[dict[str, Any]]) -> None:
    agent = sim.run.spec.agent
    assert agent is not None
    parsed = [a.AgentTool.model_validate(t) for t in tools]
    sim.spec_update(agent=agent.model_copy(update={"tools": parsed}))


def _base_urls(sim: AgentSim) -> set[str | None]:
    """The endpoint of every model turn Job the operator ever asked for."""
    return {
        e.value
        for create in sim.created_specs.values()
        for e in create.step.container.env or []
        if e.name == loop.ENV_MODEL_BASE_URL
    }


def _model_jobs(sim: AgentSim) -> list[str]:
    return sorted(c.step.name for c in sim.created_specs.values() if c.step.name.endswith("model"))


def _failed_closed(sim: AgentSim, *fields: str) -> str:
    status = sim.status
    assert status.phase == m.RunPhase.FAILED, status.message
    ready = sim.condition("Ready")
    assert ready is not None and ready.reason == loop.SPEC_CHANGED
    message = status.message or ""
    for name in fields:
        assert name in message, message
    assert "fixed at creation" in message
    assert [t.reason for t in status.history or []][-1] == loop.SPEC_CHANGED
    assert any(reason == loop.SPEC_CHANGED for reason, _ in sim.events), sim.events
    assert sim.agent.stage == agent_status.AgentStage.STOPPED
    return message


def test_the_first_pass_freezes_the_model_and_the_tools() -> None:
    sim = _keyed_sim()
    sim.tick()
    fixed = sim.agent.frozen
    agent = sim.run.spec.agent
    assert fixed is not None and agent is not None
    assert fixed.model == agent.model
    assert fixed.tools_digest == frozen.tools_digest(agent.tools)
    assert fixed.generation == 1
    # Nothing else a pass does moves it.
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.tools_return()
    assert sim.agent.frozen == fixed


def test_a_base_url_changed_while_a_tool_call_runs_never_gets_a_turn() -> None:
    """The attack: the patch lands while turn 1's call runs. The run fails at once, the call
    is stopped, and no model turn is ever asked for with the changed endpoint."""
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "latency"}, "c1")])
    (tool_job,) = sim.tool_jobs()
    assert sim.agent.stage == agent_status.AgentStage.ACTING
    _model_update(sim, baseURL=ATTACKER)
    sim.settle()

    message = _failed_closed(sim, "spec.agent.model.baseURL", f"was {OWN}", f"now {ATTACKER}")
    assert message.startswith("spec.agent.model.baseURL changed after the run started")
    assert sim.jobs[tool_job.name].deleting, "the running call was not stopped"
    assert sim.step_status("t1-0-search").phase == SP.CANCELLED
    # However long it goes on, nothing more starts; no Job ever named the attacker's server.
    sim.tools_return()
    sim.advance(60)
    sim.settle()
    assert _model_jobs(sim) == ["t1-model"]
    assert _base_urls(sim) == {OWN}
    assert sim.status.phase == m.RunPhase.FAILED


def test_a_change_between_attempts_of_a_turn_gets_no_retry() -> None:
    sim = AgentSim(
        agent_run(model={**KEYED, "retry": {"limit": 3, "backoff": {"initialSeconds": 5}}})
    )
    sim.settle()
    job = sim.model_job()
    assert job is not None
    sim.finish(job.name, False, f"the model endpoint {OWN} cannot be reached")
    sim.settle()
    assert sim.step_status("t1-model").phase == SP.BACKING_OFF
    _model_update(sim, baseURL=ATTACKER)
    sim.advance(10)
    sim.settle()
    _failed_closed(sim, "spec.agent.model.baseURL")
    assert sim.step_status("t1-model").attempt == 1
    assert _base_urls(sim) == {OWN}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"name": "gpt-4o"}, "spec.agent.model.name"),
        ({"apiKeySecretRef": {"name": "other", "key": "k"}}, "spec.agent.model.apiKeySecretRef"),
        ({"apiKeySecretRef": None}, "spec.agent.model.apiKeySecretRef"),
        ({"temperature": 1.5}, "spec.agent.model.temperature"),
        ({"maxOutputTokens": 99}, "spec.agent.model.maxOutputTokens"),
        ({"timeoutSeconds": 7}, "spec.agent.model.timeoutSeconds"),
        ({"retry": {"limit": 5}}, "spec.agent.model.retry"),
        (
            {
                "fallbacks": [
                    {"baseURL": ATTACKER, "name": "m", "apiKeySecretRef": KEYED["apiKeySecretRef"]}
                ]
            },
            "spec.agent.model.fallbacks",
        ),
    ],
)
def test_every_field_of_the_model_is_fixed(fields: dict[str, Any], named: str) -> None:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    _model_update(sim, **fields)
    sim.settle()
    _failed_closed(sim, named)
    assert _model_jobs(sim) == ["t1-model"]


def test_the_message_shows_the_secret_named_never_a_value() -> None:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    _model_update(sim, apiKeySecretRef={"name": "other", "key": "token"})
    sim.settle()
    assert "apiKeySecretRef was secret llm key api-key, now secret other key token" in (
        sim.status.message or ""
    )


@pytest.mark.parametrize(
    "tools",
    [
        pytest.param([RESTART], id="removed while its call runs"),
        pytest.param([SEARCH, RESTART, {**SEARCH, "name": "search2"}], id="added"),
        pytest.param([{**SEARCH, "description": "Do anything."}, RESTART], id="described anew"),
        pytest.param(
            [{**SEARCH, "container": {"image": "ghcr.io/evil/x:1"}}, RESTART], id="new container"
        ),
        pytest.param([RESTART, SEARCH], id="reordered"),
    ],
)
def test_the_tools_are_fixed(tools: list[dict[str, Any]]) -> None:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    _tools_update(sim, tools)
    sim.settle()
    _failed_closed(sim, "spec.agent.tools")
    assert _model_jobs(sim) == ["t1-model"]
    assert sim.step_status("t1-0-search").phase == SP.CANCELLED


def test_the_same_tools_written_with_their_defaults_are_not_a_change() -> None:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    _tools_update(sim, [{**SEARCH, "risk": "read", "approval": "auto"}, RESTART])
    sim.tools_return()
    assert sim.status.phase == m.RunPhase.RUNNING and sim.agent.turn == 2


def test_other_changes_leave_the_run_going() -> None:
    """The budget, the turn limits, the instructions and approvals are not what decides where
    the key goes: they may change as before."""
    sim = _keyed_sim(maxTurns=5)
    sim.answer("", [call("search", {"query": "x"}, "c")])
    agent = sim.run.spec.agent
    assert agent is not None
    sim.spec_update(
        budget=m.Budget(max_tokens=100_000),
        agent=agent.model_copy(update={"max_turns": 9, "instructions": "Be brief."}),
    )
    sim.tools_return()
    sim.answer("done")
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert _base_urls(sim) == {OWN}


def test_an_agent_removed_after_the_run_started_fails_it() -> None:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.spec_update(agent=None)
    sim.settle()
    message = _failed_closed(sim, "spec.agent was removed after the run started")
    assert message.startswith("spec.agent was removed")


def test_an_agent_added_to_a_plan_run_after_its_first_pass_never_runs() -> None:
    sim = AgentSim(make_run([{"name": "gather", "container": {"image": "busybox"}}]))
    sim.settle()
    assert sim.status.agent is None
    assert sim.status.phase == m.RunPhase.RUNNING, "the plan's step runs"
    added = agent_run(model={**KEYED, "baseURL": ATTACKER}).spec.agent
    sim.spec_update(agent=added)
    sim.settle()
    ended: m.RunPhase | None = sim.status.phase  # (read again: mypy narrowed it above)
    assert ended == m.RunPhase.FAILED
    assert (sim.status.message or "").startswith(
        f"spec.agent was added after the run started (model m at {ATTACKER})"
    )
    assert _model_jobs(sim) == []


def test_the_editor_recorded_at_admission_is_named() -> None:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    _model_update(sim, baseURL=ATTACKER)
    meta = sim.run.metadata.model_copy(update={"annotations": {m.ANNOTATION_MODIFIED_BY: "mal"}})
    sim.run = sim.run.model_copy(update={"metadata": meta})
    sim.settle()
    assert (sim.status.message or "").endswith("(spec last changed by mal)")
    ended = (sim.status.history or [])[-1]
    assert (ended.reason, ended.by) == (loop.SPEC_CHANGED, "mal")


def test_turns_are_built_from_the_frozen_copy_not_the_spec() -> None:
    """By construction: the core's own pass, the shell's check of a Job against its committed
    launch, and the check of the creator's rights all build the model turn from
    status.agent.frozen, whatever the spec says now."""
    sim = _keyed_sim()
    sim.settle()
    assert sim.model_job() is not None
    run = sim.run.model_copy(deep=True)
    agent = run.spec.agent
    assert agent is not None
    changed = agent.model.model_copy(
        update={"base_url": ATTACKER, "api_key_secret_ref": SecretKeySelector(name="x", key="y")}
    )
    run.spec.agent = agent.model_copy(update={"model": changed})
    statuses = {st.name: st for st in run.status.steps or []} if run.status else {}
    (turn,) = loop.dynamic_steps(run, statuses, loop.AgentConfig())
    env = {e.name: e for e in turn.container.env or []}
    assert env[loop.ENV_MODEL_BASE_URL].value == OWN
    key = env[loop.ENV_MODEL_API_KEY].value_from
    assert key is not None and key.secret_key_ref is not None
    assert key.secret_key_ref.name == "llm"
    launch = committed_launch(run, "t1-model")
    assert launch is not None
    assert {e.value for e in launch.step.container.env or [] if e.name.endswith("BASE_URL")} == {
        OWN
    }
    assert [c.name for c in rights.checks_for(run, turn)] == ["llm"]


def test_a_run_an_older_operator_started_is_frozen_as_it_reads_now() -> None:
    """Its status has no frozen copy (there was none before): the next pass takes one and the
    run goes on; from then on it is fixed."""
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    assert sim.run.status is not None and sim.run.status.agent is not None
    old = sim.run.status.agent.model_copy(update={"frozen": None})
    sim.run = sim.run.model_copy(
        update={"status": sim.run.status.model_copy(update={"agent": old})}
    )
    sim.tools_return()
    assert sim.status.phase == m.RunPhase.RUNNING and sim.agent.frozen is not None
    _model_update(sim, baseURL=ATTACKER)
    sim.settle()
    _failed_closed(sim, "spec.agent.model.baseURL")


def test_plan_runs_have_nothing_frozen() -> None:
    sim = AgentSim(make_run([{"name": "only", "container": {"image": "busybox"}}]))
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED and sim.status.agent is None


def test_tools_digest_is_stable_and_order_sensitive() -> None:
    tools = [a.AgentTool.model_validate(t) for t in (SEARCH, RESTART)]
    again = [a.AgentTool.model_validate(t) for t in (SEARCH, RESTART)]
    assert frozen.tools_digest(tools) == frozen.tools_digest(again)
    assert frozen.tools_digest(None) == frozen.tools_digest([])
    assert frozen.tools_digest(tools) != frozen.tools_digest(list(reversed(tools)))
    assert len(frozen.tools_digest(tools)) == 64


# -- what people see and copy ------------------------------------------------------------------


def _changed_after_turn_one() -> AgentSim:
    sim = _keyed_sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.tools_return()
    _model_update(sim, baseURL=ATTACKER)
    sim.settle()
    return sim


def test_kubectl_agentrun_status_shows_the_endpoint_the_turns_used() -> None:
    sim = _changed_after_turn_one()
    assert transcript.agent_status_lines(sim.run)[0] == f"agent: model m at {OWN}"


def test_a_run_whose_agent_changed_cannot_be_forked() -> None:
    """A fork copies the spec: it would send the forking person's key to the changed
    endpoint. Both kinds of fork are refused, saying why."""
    sim = _changed_after_turn_one()
    why = (
        "its spec.agent.model.baseURL changed after it started, so its spec is not what its "
        "turns used and a fork would copy the change; create a new run instead"
    )
    with pytest.raises(ValueError) as from_turn:
        fork_plan.plan_turn(sim.run, 1, "f")
    assert str(from_turn.value) == f"cannot fork agentrun/agent from turn 1: {why}"
    planned = AgentSim(
        agent_run(model=dict(KEYED), plan=[{"name": "gather", "container": {"image": "b"}}])
    )
    planned.settle()
    _model_update(planned, baseURL=ATTACKER)
    with pytest.raises(ValueError) as from_step:
        fork_plan.plan(planned.run, "gather", "f")
    assert str(from_step.value) == f"cannot fork agentrun/agent: {why}"
    # A run whose spec is what its turns used forks as before.
    fine = _keyed_sim()
    fine.answer("", [call("search", {"query": "x"}, "c")])
    fine.tools_return()
    assert fork_plan.plan_turn(fine.run, 1, "f").from_turn == 1


@pytest.mark.parametrize(
    ("before", "after"), [(None, "none"), ("auto", "required"), ("search", None)]
)
def test_the_tool_choice_is_fixed(before: str | None, after: str | None) -> None:
    sim = _keyed_sim(**({"toolChoice": before} if before else {}))
    sim.settle()
    assert sim.agent.frozen is not None and sim.agent.frozen.tool_choice == before
    agent = sim.run.spec.agent
    assert agent is not None
    sim.spec_update(agent=agent.model_copy(update={"tool_choice": after}))
    sim.settle()
    _failed_closed(sim, "spec.agent.toolChoice")


def test_turns_send_the_frozen_tool_choice() -> None:
    sim = _keyed_sim(toolChoice="search")
    sim.settle()
    job = sim.model_job()
    assert job is not None
    run = sim.run.model_copy(deep=True)
    statuses = {st.name: st for st in run.status.steps or []} if run.status else {}
    (turn,) = loop.dynamic_steps(run, statuses, loop.AgentConfig())
    env = {e.name: e.value for e in turn.container.env or []}
    assert env[loop.ENV_MODEL_TOOL_CHOICE] == "search"
    request = sim.request()
    assert request["tool_choice"] == {"type": "function", "function": {"name": "search"}}
