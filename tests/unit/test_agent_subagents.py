"""Sub-agents in the agent loop (docs/agent.md, "Sub-agents"): a call of a tool with ``agent``
is a step whose launch creates a child AgentRun, named from the call's idempotency key and
built from what the intent committed; the child is adopted by controller uid and spec, its
answer is the call's result, its tokens count against the parent, and the parent's cancel and
suspend reach it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from agentrun.api import agent as a
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.clients.plugin import commands
from agentrun.core import CoreConfig, Observed, refusals
from agentrun.core import subagents as sa
from agentrun.core.actions import CreateChild
from tests.support.agent_sim import SEARCH, AgentSim, agent_run, call
from tests.support.sim import UID

RESEARCHER: dict[str, Any] = {
    "name": "researcher",
    "description": "Hands a question to a researcher, who answers it.",
    "parameters": {
        "type": "object",
        "properties": {"goal": {"type": "string"}},
        "required": ["goal"],
    },
    "agent": {
        "instructions": "You research one question.",
        "preamble": "Answer in one line.",
        "tools": ["search"],
        "maxTurns": 5,
        "maxTokens": 20000,
    },
}


def _sim(budget: int | None = 100_000, **spec: Any) -> AgentSim:
    body = {"budget": {"maxTokens": budget}} if budget is not None else {}
    return AgentSim(agent_run(tools=[SEARCH, RESEARCHER], spec={**body, **spec}))


def _reason(sim: AgentSim) -> str | None:
    ready = sim.condition("Ready")
    return ready.reason if ready is not None else None


def _delegated(sim: AgentSim, goal: str = "why is the cache cold?", cid: str = "r1") -> str:
    sim.answer("", [call("researcher", {"goal": goal}, cid)])
    (name,) = sim.children
    return name


def test_a_call_creates_one_child_named_from_its_key_with_the_declared_spec() -> None:
    sim = _sim()
    name = _delegated(sim)
    st = sim.step_status("t1-0-researcher")
    assert st.idempotency_key == f"{UID}:1:r1:{st.args_hash}"
    assert name == sa.child_name("agent", st.idempotency_key) == st.job_name
    assert sim.jobs.keys().isdisjoint({name})  # a child run, never a Job
    child = sim.children[name]
    owner = child["metadata"]["ownerReferences"][0]
    assert (owner["uid"], owner["controller"], owner["kind"]) == (UID, True, "AgentRun")
    spec = child["spec"]
    assert spec["goal"] == "Answer in one line.\n\nwhy is the cache cold?"
    assert spec["agent"]["instructions"] == "You research one question."
    assert [t["name"] for t in spec["agent"]["tools"]] == ["search"]
    assert spec["agent"]["maxTurns"] == 5
    model = sim.agent.frozen.model
    assert spec["agent"]["model"]["baseURL"] == model.base_url  # the parent's frozen model
    assert spec["agent"]["model"]["name"] == model.name
    assert spec["budget"] == {"maxTokens": 20000}
    assert "approvals" not in spec  # its approvals are its own
    call_status = sim.agent.calls[0]
    assert call_status.child.name == name and call_status.child.tokens == 20000
    assert sim.agent.children_started == 1
    # Passes while it runs create it again only until it is adopted: AlreadyExists.
    assert sim.child_creates[0] == name and set(sim.child_creates) == {name}
    assert st.phase == SP.RUNNING and sim.agent.calls[0].child.uid == "child-uid-0"


def test_the_childs_answer_is_the_calls_result_and_its_tokens_count_for_the_parent() -> None:
    sim = _sim()
    name = _delegated(sim)
    before = sim.status.usage.tokens  # type: ignore[union-attr]
    sim.child_ends(name, "Running", tokens=700)
    assert sim.status.usage.tokens == before + 700  # type: ignore[union-attr]
    sim.child_ends(name, "Succeeded", answer="the cache was flushed at 9:00", tokens=1200)
    assert sim.status.usage.tokens == before + 1200  # type: ignore[union-attr]
    assert sim.agent.turn == 2
    record = sim.transcript()[0]["toolCalls"][0]
    assert record["outcome"] == "Succeeded"
    assert record["result"] == "the cache was flushed at 9:00"
    sim.answer("the cache was flushed")
    assert sim.status.phase == m.RunPhase.SUCCEEDED


def test_a_child_counts_at_most_its_carved_budget_and_never_less_than_before() -> None:
    sim = _sim()
    name = _delegated(sim)
    before = sim.status.usage.tokens  # type: ignore[union-attr]
    sim.child_ends(name, "Running", tokens=10**9)  # its budget raised by an editor
    assert sim.status.usage.tokens == before + 20000  # type: ignore[union-attr]
    # Over its carved budget: cancelled.
    assert sim.children[name]["spec"].get("cancel") is True
    sim.child_ends(name, "Running", tokens=5)
    assert sim.status.usage.tokens == before + 20000  # type: ignore[union-attr]


def test_a_failed_child_is_an_error_the_model_reads_and_the_run_goes_on() -> None:
    sim = _sim()
    name = _delegated(sim)
    sim.child_ends(name, "Failed")
    assert sim.agent.turn == 2 and sim.status.phase == m.RunPhase.RUNNING
    record = sim.transcript()[0]["toolCalls"][0]
    assert record["outcome"] == "Failed"
    assert "the sub-agent's run" in record["error"] and "the child failed" in record["error"]


def test_a_run_under_the_childs_name_that_is_not_its_child_is_left_alone() -> None:
    probe = _sim()
    name = _delegated(probe)  # the name the call's child gets
    sim = _sim()
    # Someone made an AgentRun under that name first, not controlled by the parent.
    sim.children[name] = {
        "metadata": {"name": name, "uid": "other", "ownerReferences": []},
        "spec": {"goal": "x"},
    }
    sim.answer("", [call("researcher", {"goal": "why is the cache cold?"}, "r1")])
    record = sim.transcript()[0]["toolCalls"][0]
    assert record["outcome"] == "Failed" and sa.CHILD_NAME_TAKEN in record["error"]
    assert sim.children[name]["metadata"]["uid"] == "other"  # left alone
    assert sim.children[name]["spec"] == {"goal": "x"}


def test_a_call_without_a_goal_or_over_the_limits_is_answered_not_run() -> None:
    sim = AgentSim(
        agent_run(
            tools=[SEARCH, RESEARCHER],
            maxToolCallsPerTurn=8,
            spec={"budget": {"maxTokens": 10**6}},
        )
    )
    sim.answer(
        "",
        [call("researcher", {"goal": f"question {i}"}, f"r{i}") for i in range(5)]
        + [call("researcher", {"goal": "  "}, "blank"), call("researcher", {}, "nogoal")],
    )
    calls = {c.id: c for c in sim.agent.calls or []}
    assert "needs the argument goal: a string" in (calls["blank"].problem or "")
    assert "'goal' is a required property" in (calls["nogoal"].problem or "")
    assert "at most 4 sub-agents may be started in one turn" in (calls["r4"].problem or "")
    assert len(sim.children) == 4


def test_a_child_is_refused_when_the_budget_cannot_cover_it() -> None:
    sim = _sim(budget=6000)
    sim.answer("", [call("researcher", {"goal": "x"}, "r1")])
    (only,) = sim.transcript()[0]["toolCalls"]
    assert only["outcome"] == "Invalid" and "token budget leaves" in only["problem"]
    assert sim.children == {}


def test_no_child_deeper_than_the_limit() -> None:
    sim = _sim()
    sim.depth = sa.DEFAULT_MAX_DEPTH
    sim.answer("", [call("researcher", {"goal": "x"}, "r1")])
    (only,) = sim.transcript()[0]["toolCalls"]
    assert "deeper than the 2 allowed" in only["problem"]
    assert sim.children == {}


def test_cancelling_the_parent_cancels_its_running_children() -> None:
    sim = _sim()
    name = _delegated(sim)
    sim.spec_update(cancel=True)
    sim.settle()
    assert sim.status.phase == m.RunPhase.CANCELLED
    assert sim.children[name]["spec"]["cancel"] is True


def test_cancelling_the_parent_cancels_a_child_made_but_not_adopted_yet() -> None:
    sim = _sim()
    sim.answer("", [call("researcher", {"goal": "x"}, "r1")])
    (name,) = sim.children
    # The create was carried out, and the run cancelled before a pass adopted the child.
    sim.agent.calls[0].child.uid = None
    sim.step_status("t1-0-researcher").phase = SP.LAUNCHING
    sim.spec_update(cancel=True)
    sim.settle()
    assert sim.status.phase == m.RunPhase.CANCELLED
    assert sim.children[name]["spec"]["cancel"] is True


def test_suspending_the_parent_suspends_its_children_and_resuming_resumes_them() -> None:
    sim = _sim()
    name = _delegated(sim)
    sim.spec_update(suspend=True)
    sim.settle()
    assert sim.children[name]["spec"]["suspend"] is True
    sim.spec_update(suspend=False)
    sim.settle()
    assert sim.children[name]["spec"]["suspend"] is False


def test_a_gated_sub_agent_waits_for_an_approval_of_its_arguments_before_any_child() -> None:
    gated = {**RESEARCHER, "approval": "required", "risk": "external"}
    sim = AgentSim(agent_run(tools=[SEARCH, gated], spec={"budget": {"maxTokens": 100_000}}))
    sim.answer("", [call("researcher", {"goal": "x"}, "r1")])
    st = sim.step_status("t1-0-researcher")
    assert st.phase == SP.WAITING_FOR_APPROVAL and sim.children == {}
    ok = m.Approval(step=st.name, decision="approve", args_hash=st.args_hash, by="alice")
    sim.spec_update(approvals=[ok])
    sim.settle()
    assert len(sim.children) == 1


def test_a_sub_agent_tool_naming_a_tool_there_is_not_fails_the_run_at_once() -> None:
    broken = {**RESEARCHER, "agent": {**RESEARCHER["agent"], "tools": ["nowhere"]}}
    sim = AgentSim(agent_run(tools=[SEARCH, broken]))
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED and _reason(sim) == "InvalidAgent"
    assert "names tools spec.agent.tools does not have: nowhere" in (sim.status.message or "")


def test_a_tool_has_a_container_or_an_agent() -> None:
    tool = a.AgentTool.model_validate(RESEARCHER)
    assert tool.container is None and tool.agent is not None
    assert json.loads(json.dumps(tool.to_wire()))["agent"]["maxTurns"] == 5


CHILD_QUOTA = (
    'agentruns.agentrun.dev "x" is forbidden: exceeded quota: runs, requested: '
    "count/agentruns.agentrun.dev=1, used: count/agentruns.agentrun.dev=3, limited: "
    "count/agentruns.agentrun.dev=3"
)


def _refusing(sim: AgentSim, refused: dict[str, str]) -> None:
    """The API server refuses every child's create with ``CHILD_QUOTA`` while ``refused`` is
    not empty of the key ``"on"``; the shell tells the core so (Observed.job_refusals)."""
    apply, observed = sim.apply, sim.observed

    def refusing_apply(action: object) -> None:
        if isinstance(action, CreateChild) and "on" in refused:
            name = str(action.manifest["metadata"]["name"])
            sim.child_creates.append(name)
            refused[name] = CHILD_QUOTA
            return
        apply(action)

    def refusing_observed() -> Observed:
        notes = {k: v for k, v in refused.items() if k != "on"}
        return dataclasses.replace(observed(), job_refusals=notes)

    sim.apply = refusing_apply  # type: ignore[method-assign]
    sim.observed = refusing_observed  # type: ignore[method-assign]


def test_a_child_refused_by_a_quota_is_created_again_once_the_quota_allows() -> None:
    sim = _sim()
    refused = {"on": ""}
    _refusing(sim, refused)
    sim.answer("", [call("researcher", {"goal": "why?"}, "r1")])
    st = sim.step_status("t1-0-researcher")
    assert st.phase == SP.LAUNCHING and st.error is None, st
    assert st.message is not None and "exceeded quota: runs)" in st.message, st.message
    assert not sim.children and sim.child_creates

    refused.clear()  # the quota allows it: the next try creates it
    sim.advance(refusals.CREATE_RETRY_SECONDS)
    sim.tick()  # creates it (the status unchanged)
    sim.settle()  # adopts it
    st = sim.step_status("t1-0-researcher")
    assert st.phase == SP.RUNNING and st.error is None, st
    assert list(sim.children) == [st.job_name]


def test_a_child_refused_by_a_quota_past_the_grace_fails_the_call() -> None:
    sim = _sim()
    _refusing(sim, {"on": ""})
    sim.answer("", [call("researcher", {"goal": "why?"}, "r1")])
    sim.advance(CoreConfig().refusal_grace_seconds)
    sim.settle()
    (failed,) = [t for t in sim.status.history or [] if t.reason == "ChildRefused"]
    assert failed.step == "t1-0-researcher" and failed.to_phase == SP.FAILED, failed
    assert failed.message is not None and "exceeded quota" in failed.message
    assert not sim.children


class _Family:
    """The runs of a namespace as ``kubectl agentrun tree`` reads them: the parent as its
    operator left it and its children as the API server holds them."""

    namespace = "default"

    def __init__(self, sim: AgentSim) -> None:
        self.bodies = [sim.run.to_wire(), *sim.children.values()]

    def get_run_body(self, name: str) -> dict[str, Any]:
        return next(b for b in self.bodies if b["metadata"]["name"] == name)

    def list_runs(self) -> list[dict[str, Any]]:
        return self.bodies


def test_tree_counts_a_childs_tokens_once_the_parents_usage_already_holds_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = _sim()
    name = _delegated(sim)
    sim.child_ends(name, "Succeeded", answer="the cache was flushed at 9:00", tokens=1200)
    sim.answer("the cache was flushed")
    own = sum(t.tokens for t in sim.agent.recent)  # the parent's own two turns
    assert sim.status.usage.tokens == own + 1200  # type: ignore[union-attr]
    spent = own + 1200  # what the family used: the parent's turns and the child's
    args = commands.build_parser().parse_args(["tree", "agent"])
    assert commands.cmd_tree(_Family(sim), args) == 0  # type: ignore[arg-type]
    header, top, child = capsys.readouterr().out.splitlines()
    assert top.split()[-1] == str(spent)  # the family's total, the child's tokens once
    assert top.split() == ["agent", "Succeeded", str(spent)]
    assert header.split()[2:] == ["TOKENS", "(WITH", "SUB-AGENTS)"]  # what a figure holds
    assert child.split() == [name, "Succeeded", "1200"]
    args = commands.build_parser().parse_args(["tree", "agent", "-o", "json"])
    assert commands.cmd_tree(_Family(sim), args) == 0  # type: ignore[arg-type]
    family = json.loads(capsys.readouterr().out)
    assert family["tokens"] == spent and "familyTokens" not in family
    assert [(c["name"], c["tokens"]) for c in family["children"]] == [(name, 1200)]
