"""kubectl agentrun for agent runs: the transcript, the agent in status, the answer."""

from __future__ import annotations

from typing import Any

from agentrun.api import models as m
from agentrun.plugin import transcript
from tests.support.agent_sim import RESTART, SEARCH, AgentSim, agent_run, call


def _config_maps(sim: AgentSim, owner_uid: str | None = None) -> list[dict[str, Any]]:
    uid = owner_uid or sim.run.metadata.uid
    return [
        {
            "metadata": {"name": name, "ownerReferences": [{"uid": uid, "controller": True}]},
            "data": data,
        }
        for name, data in sim.records.items()
        if sim.record_kinds[name] == "transcript"
    ]


def test_the_transcript_shows_each_turn_its_calls_outcomes_and_tokens() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH, RESTART]))
    sim.answer(
        "looking",
        [call("search", {"query": "latency"}, "c1"), call("nope", {}, "c2")],
        prompt=120,
        completion=30,
    )
    sim.tools_return()
    sim.answer("", [call("restart", {"service": "checkout"}, "r1")])
    records = transcript.records_of(sim.run, _config_maps(sim))
    lines = transcript.transcript_lines(sim.run, records)
    text = "\n".join(lines)
    assert lines[0].startswith("turn 1 (step t1-model; 120 prompt + 30 completion tokens")
    assert "  model: looking" in lines
    assert '  -> search({"query": "latency"})  [c1]' in lines
    assert "     Succeeded as step t1-0-search" in lines
    assert "     result: result of t1-0-search" in lines
    assert "     invalid: there is no tool 'nope' (the tools: restart, search)" in lines
    # The turn in progress, waiting for approval, says how to give it.
    assert "turn 2 (acting, in progress)" in lines
    assert "kubectl agentrun approve agent t2-0-restart" in text


def test_records_not_owned_by_the_run_are_left_out() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c1")])
    sim.tools_return()
    assert transcript.records_of(sim.run, _config_maps(sim, owner_uid="someone-else")) == []
    assert len(transcript.records_of(sim.run, _config_maps(sim))) == 1


def test_status_shows_the_agent_and_its_answer() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c1")])
    sim.tools_return()
    sim.answer("the cache is cold")
    lines = transcript.agent_status_lines(sim.run)
    assert lines[0] == "agent: model scripted at http://127.0.0.1:9/v1"
    assert lines[1].startswith("  answered, turn 2 of 20; 1 tool calls (0 invalid)")
    assert lines[-1] == "  answer: the cache is cold"
    plain = m.AgentRun.model_validate(
        {"metadata": {"name": "p"}, "spec": {"goal": "g", "plan": {"steps": [
            {"name": "a", "container": {"image": "i"}}]}}}
    )  # fmt: skip
    assert transcript.agent_status_lines(plain) == []
