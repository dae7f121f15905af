"""kubectl agentrun for agent runs: the transcript, the agent in status, the answer."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import models as m
from agentrun.clients import forks
from agentrun.clients.plugin import commands, transcript
from agentrun.core import fork_plan as forking
from tests.support.agent_sim import RESTART, SEARCH, AgentSim, agent_run, call
from tests.support.sim import UID


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


def test_a_stopped_runs_transcript_shows_its_last_turn_once_and_promises_no_next_turn() -> None:
    sim = AgentSim(agent_run(maxTurns=2, maxToolCallsPerTurn=1))
    for turn in (1, 2):
        sim.answer("", [call("search", {"query": f"q{turn}"}, f"c{turn}"),
                        call("search", {"query": "more"}, f"d{turn}")])  # fmt: skip
        sim.tools_return()
    assert sim.status.phase == m.RunPhase.FAILED  # MaxTurnsReached after turn 2
    records = transcript.records_of(sim.run, _config_maps(sim))
    lines = transcript.transcript_lines(sim.run, records)
    text = "\n".join(lines)
    assert [line.split(" (")[0] for line in lines if line.startswith("turn ")] == [
        "turn 1",
        "turn 2",
    ]
    assert "in progress" not in text
    # The call refused in turn 1 may be made again in turn 2; the one refused in the last
    # turn may not, and is not told it may.
    (first, last) = [line for line in lines if "maxToolCallsPerTurn" in line]
    assert "call it again next turn" in first
    assert "next turn" not in last and "the last turn (spec.agent.maxTurns 2)" in last
    refused = [t.message or "" for t in sim.status.history or [] if t.reason == "ToolCallRefused"]
    assert "next turn" not in refused[-1]


def test_a_turn_cut_short_by_a_cancel_is_shown_once_as_stopped_not_in_progress() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH, RESTART], maxToolCallsPerTurn=1))
    sim.answer("", [call("search", {"query": "x"}, "c1")])
    sim.tools_return()
    sim.answer("", [call("restart", {"service": "checkout"}, "r1"),  # waits for approval
                    call("search", {"query": "y"}, "c2")])  # fmt: skip
    (refused,) = [c.problem for c in sim.agent.calls if c.problem]
    assert "call it again next turn" in refused  # turn 2 of 20: one was to follow
    sim.spec_update(cancel=True)
    sim.settle()
    assert sim.status.phase == m.RunPhase.CANCELLED
    records = transcript.records_of(sim.run, _config_maps(sim))
    lines = transcript.transcript_lines(sim.run, records)
    text = "\n".join(lines)
    assert [line for line in lines if line.startswith("turn 2")] == [
        "turn 2 (stopped before it closed)"
    ]
    assert "in progress" not in text and "kubectl agentrun approve" not in text
    assert '  -> restart({"service": "checkout"})  [r1]' in lines
    # None did: the refused call is not told to call again.
    assert "next turn" not in text
    assert (
        "     invalid: the model may make at most 1 tool calls a turn "
        "(spec.agent.maxToolCallsPerTurn); this one was not run" in lines
    )


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


# -- kubectl agentrun fork RUN --from TURN ------------------------------------------------------


def _answered_in_three(plan: list[dict[str, Any]] | None = None) -> AgentSim:
    sim = AgentSim(agent_run(name="source", plan=plan or ()))
    if plan:
        sim.settle()
        for job in sim.active():
            sim.finish(job.name, True, "gathered")
    sim.answer("", [call("search", {"query": "a"}, "c1")])
    sim.tools_return()
    sim.answer("", [call("search", {"query": "b"}, "c2")])
    sim.tools_return()
    sim.answer("done")
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    return sim


def _body(sim: AgentSim, **spec: Any) -> dict[str, Any]:
    wire = sim.run.to_wire()
    wire["spec"].update(spec)
    return wire


def test_a_number_is_a_turn_of_an_agent_run_unless_a_plan_step_has_that_name() -> None:
    plan = [{"name": "7", "container": {"image": "busybox:1.36"}}]
    sim = AgentSim(agent_run(plan=plan))
    assert forking.turn_of(sim.run, "2") == 2
    assert forking.turn_of(sim.run, "7") is None  # the plan step
    assert forking.turn_of(sim.run, "gather") is None
    plain = AgentSim(agent_run()).run.model_copy(deep=True)
    plain.spec.agent = None
    assert forking.turn_of(plain, "2") is None


def test_a_fork_from_a_turn_continues_the_conversation_and_carries_the_plan() -> None:
    gather = {"name": "gather", "container": {"image": "busybox:1.36", "command": ["true"]}}
    sim = _answered_in_three([gather])
    plan = forking.plan_turn(sim.run, 2, "source-fork-abcd")
    assert (plan.from_turn, plan.from_step, plan.source_uid) == (2, None, UID)
    assert [c.step for c in plan.carry] == ["gather"] and plan.rerun == []
    approval = {"step": "t1-0-search", "decision": "approve", "argsHash": "a" * 64, "by": "bob"}
    old = _body(sim, approvals=[approval])
    body = forking.new_run(old, plan, [forking.carried_result(plan, c, None) for c in plan.carry])
    assert body["spec"]["agent"]["resumeFrom"] == {"run": "source", "uid": UID, "turn": 2}
    assert "approvals" not in body["spec"]
    assert [c["step"] for c in body["spec"]["carriedResults"]] == ["gather"]
    assert body["metadata"]["annotations"][forking.ANNOTATION_FORKED_FROM] == (
        "default/source at turn 2"
    )
    # It validates as an AgentRun, and what it names is exactly the old run and the turn.
    parsed = m.AgentRun.model_validate(body)
    assert parsed.spec.agent is not None and parsed.spec.agent.resume_from is not None


def test_a_fork_from_a_turn_the_run_did_not_close_says_which_turns_it_can_be() -> None:
    sim = _answered_in_three()
    with pytest.raises(ValueError) as answered:
        forking.plan_turn(sim.run, 3, "x")
    assert str(answered.value) == (
        "cannot fork agentrun/source from turn 3: agentrun/source answered in turn 3: a fork "
        "keeps its goal, so nothing new follows the answer; ask it the next question instead "
        "(kubectl agentrun ask source QUESTION), or fork from an earlier turn (1 to 2)"
    )
    with pytest.raises(ValueError, match="has not closed turn 9: its conversation goes up to"):
        forking.plan_turn(sim.run, 9, "x")


def test_forks_make_a_dry_run_through_the_api_server_and_create_nothing() -> None:
    sim = _answered_in_three()
    calls: list[tuple[str, Any]] = []

    def create_run(body: dict[str, Any], dry: bool) -> dict[str, Any]:
        calls.append(("create", dry))
        return {**body, "metadata": {**body["metadata"], "uid": "new-uid"}}

    api = forks.ForkApi(
        get_config_map=lambda name: None,
        create_run=create_run,
        create_config_map=lambda cm: calls.append(("copy", cm)),
        resume_run=lambda name: calls.append(("resume", name)),
        delete_run=lambda name: calls.append(("delete", name)),
    )
    made = forks.make(api, _body(sim), sim.run, forks.plan(sim.run, "2", "next"), dry_run=True)
    assert calls == [("create", True)]
    assert made.dry_run and "suspend" not in made.run["spec"]
    assert made.run["spec"]["agent"]["resumeFrom"]["turn"] == 2
    assert made.note() == (
        "would fork agentrun/source at turn 2: agentrun/next continues its conversation after "
        "turn 2 (read by the operator from its records); carried plan steps: nothing; approvals "
        "are not carried"
    )
    calls.clear()
    made = forks.make(api, _body(sim), sim.run, forks.plan(sim.run, "1", "next"))
    assert calls == [("create", False), ("resume", "next")]
    assert made.run["spec"]["suspend"] is True  # as created; resume_run returned no body
    with pytest.raises(forks.ForkRefused, match="cannot fork agentrun/source from turn 5"):
        forks.plan(sim.run, "5", "next")


def test_fork_takes_a_turn_and_a_dry_run_flag() -> None:
    args = commands.build_parser().parse_args(["fork", "source", "--from", "2", "--dry-run"])
    assert (args.run, args.start, args.dry_run, args.name) == ("source", "2", True, None)
