"""Model turns' Jobs made ahead of their turn (PrepareTurn) and their requests (SendTurn), as
the core decides them."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import (
    AheadJob,
    CreateJob,
    Decision,
    JobState,
    Observed,
    ObservedJob,
    PodRef,
    PrepareTurn,
    SendTurn,
    StartPod,
    StrayJob,
    naming,
    reconcile,
    rights,
    turn_steps,
    turns,
)
from agentrun.core import agent_loop as loop
from tests.support.agent_sim import AgentSim, agent_run, call


def _name(sim: AgentSim, turn: int) -> str:
    return naming.job_name(sim.run.metadata.name, sim.run.metadata.uid, loop.model_step(turn), 1)


def _decide(sim: AgentSim, observed: Observed | None = None) -> Decision:
    return reconcile(sim.run, observed or sim.observed(), sim.now, sim.config)


def _actions(sim: AgentSim, observed: Observed | None = None) -> list[Any]:
    return list(_decide(sim, observed).after_commit)


KEYED = {"baseURL": "http://127.0.0.1:9/v1", "name": "m",
         "apiKeySecretRef": {"name": "llm-key", "key": "token"}}  # fmt: skip
"""A model whose turns use a Secret of the creator's: a new turn's launch waits until the
turn is committed and the shell checked that right (none is granted in these runs)."""
BOTH = pytest.mark.parametrize("keyed", [False, True], ids=["in-the-closing-pass", "committed"])
"""A new turn's launch is decided in the pass that closes the turn before it when the model
uses nothing of the creator's, else once the new turn is committed: both ways."""


def _next_turn_sim(keyed: bool) -> AgentSim:
    """Turn 1 called the search and it returned. ``keyed``: the run goes on until turn 2 has
    begun (its model step committed, not launched yet); else the next pass is the one that
    closes turn 1, begins turn 2 and decides its launch."""
    sim = AgentSim(agent_run(model=KEYED if keyed else None))
    sim.answer("", [call("search", {"query": "db"})])
    for job in sim.tool_jobs():
        sim.finish(job.name, True, "found it")
    if not keyed:
        assert sim.agent.turn == 1
        return sim
    for _ in range(10):
        if sim.status.agent is not None and sim.status.agent.turn == 2:
            break
        sim.tick()
    assert sim.step_status("t2-model").attempt == 0
    return sim


def _not_launched(decision: Decision) -> bool:
    """Whether turn 2 began in ``decision`` (or before) with its model step not launched."""
    st = next(s for s in decision.status.steps or [] if s.name == "t2-model")
    return st.attempt == 0 and st.phase == m.StepPhase.PENDING


def _ahead(sim: AgentSim, turn: int, **job: Any) -> AheadJob:
    fields: dict[str, Any] = {"state": JobState.ACTIVE, **job}
    observed = ObservedJob(_name(sim, turn), loop.model_step(turn), 1, **fields)
    return AheadJob(observed, trusted=True)


def _turns_ahead(sim: AgentSim, n: int) -> AgentSim:
    sim.config = dataclasses.replace(
        sim.config, agent=dataclasses.replace(sim.config.agent, turns_ahead=n)
    )
    return sim


def test_while_a_turn_runs_the_next_turns_jobs_are_made() -> None:
    one = _turns_ahead(AgentSim(agent_run()), 1)
    one.answer("", [call("search", {"query": "db"})])
    assert [p.job_name for p in _actions(one) if isinstance(p, PrepareTurn)] == [_name(one, 2)]
    sim = _turns_ahead(AgentSim(agent_run()), 2)
    sim.settle()
    # The first turn's model call makes the second turn's only: the run may answer at once.
    first = [p for p in _actions(sim) if isinstance(p, PrepareTurn)]
    assert [p.job_name for p in first] == [_name(sim, 2)]
    sim.answer("", [call("search", {"query": "db"})])
    prepared = [a for a in _actions(sim) if isinstance(a, PrepareTurn)]
    assert [p.job_name for p in prepared] == [_name(sim, 2), _name(sim, 3)]
    # Each is the Job the turn's first attempt will commit, built as that attempt's is.
    assert [p.step.name for p in prepared] == ["t2-model", "t3-model"]
    assert prepared[0].step.container.env is not None
    assert not any(e.name.startswith("AGENTRUN_CONTEXT") for e in prepared[0].step.container.env)


def test_a_first_turn_that_can_only_answer_makes_none() -> None:
    for run in (agent_run(tools=()), agent_run(toolChoice="none")):
        sim = _turns_ahead(AgentSim(run), 2)
        sim.settle()
        assert sim.status.agent is not None and sim.status.agent.turn == 1
        assert not [p for p in _actions(sim) if isinstance(p, PrepareTurn)]


def test_none_past_the_last_turn_nor_when_turned_off_or_held() -> None:
    last = _turns_ahead(AgentSim(agent_run(maxTurns=2)), 2)
    last.answer("", [call("search", {"query": "db"})])
    assert [p.job_name for p in _actions(last) if isinstance(p, PrepareTurn)] == [_name(last, 2)]
    off = _turns_ahead(AgentSim(agent_run()), 0)
    off.answer("", [call("search", {"query": "db"})])
    assert not [p for p in _actions(off) if isinstance(p, PrepareTurn)]
    held = AgentSim(agent_run())
    held.answer("", [call("search", {"query": "db"})])
    held.spec_update(suspend=True)
    assert not [p for p in _actions(held) if isinstance(p, PrepareTurn)]


def test_a_job_made_here_has_its_pod_started_and_no_second_create() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "db"})])
    pod = ("t2-pod", "t2-pod-uid")
    ahead = (_ahead(sim, 2, start_pod=PodRef(*pod)), _ahead(sim, 3))
    actions = _actions(sim, dataclasses.replace(sim.observed(), ahead=ahead))
    assert not [p for p in actions if isinstance(p, PrepareTurn)]
    starts = [s for s in actions if isinstance(s, StartPod)]
    assert [(s.job_name, s.pod.uid) for s in starts] == [(_name(sim, 2), "t2-pod-uid")]


@BOTH
def test_the_turn_uses_the_job_made_ahead_and_sends_its_request_once_committed(
    keyed: bool,
) -> None:
    sim = _next_turn_sim(keyed)
    observed = dataclasses.replace(
        sim.observed(), ahead=(_ahead(sim, 2, address="10.0.0.7"), _ahead(sim, 3))
    )
    decision = reconcile(sim.run, observed, sim.now, sim.config)
    creates = [c for c in decision.after_commit if isinstance(c, CreateJob)]
    assert _name(sim, 2) not in [c.job_name for c in creates]
    (send,) = [s for s in decision.after_commit if isinstance(s, SendTurn)]
    status = decision.status
    assert status.agent is not None and status.agent.context is not None
    st = next(s for s in status.steps or [] if s.name == "t2-model")
    assert (send.job_name, send.attempt, send.address) == (_name(sim, 2), 1, "10.0.0.7")
    assert send.digest == status.agent.context.digest
    assert send.idempotency_key == st.idempotency_key and st.job_name == _name(sim, 2)


@BOTH
def test_a_job_made_ahead_that_ended_before_its_turn_is_deleted_and_the_turn_waits(
    keyed: bool,
) -> None:
    sim = _next_turn_sim(keyed)
    ended = StrayJob(_name(sim, 2), "t2-model", 1, JobState.FAILED)
    decision = _decide(sim, dataclasses.replace(sim.observed(), strays=(ended,)))
    actions = decision.after_commit
    assert _name(sim, 2) not in [c.job_name for c in actions if isinstance(c, CreateJob)]
    deletes = [d for d in actions if getattr(d, "job_name", None) == _name(sim, 2)]
    assert [type(d).__name__ for d in deletes] == ["DeleteJob"]
    assert _not_launched(decision)


def test_which_jobs_count_as_made_ahead() -> None:
    sim = AgentSim(agent_run())
    sim.settle()
    run = sim.run
    assert turns.made_ahead(run, _name(sim, 2), "t2-model")
    assert turns.made_ahead(run, _name(sim, 4), "t4-model")
    assert not turns.made_ahead(run, "someone-elses", "t2-model")  # not the attempt's name
    assert not turns.made_ahead(run, _name(sim, 1), "t1-model")  # the turn's, launched
    assert turns.ahead_names(run) == [_name(sim, 2), _name(sim, 3), _name(sim, 4), _name(sim, 5)]
    status = run.status
    assert status is not None and status.agent is not None
    answered = status.model_copy(
        update={
            "agent": status.agent.model_copy(update={"stage": agent_status.AgentStage.ANSWERED})
        }
    )
    done = run.model_copy(update={"status": answered})
    assert not turns.made_ahead(done, _name(sim, 2), "t2-model")
    assert turns.ahead_names(done) == []
    finished = run.model_copy(
        update={"status": status.model_copy(update={"phase": m.RunPhase.SUCCEEDED})}
    )
    assert not turns.made_ahead(finished, _name(sim, 2), "t2-model")


@BOTH
def test_a_job_made_ahead_whose_pod_went_is_not_used_but_deleted_and_the_turn_waits(
    keyed: bool,
) -> None:
    # Its waiting pod was deleted; the Job controller has not failed the Job yet. A turn
    # begun in it would fail: it is deleted and the turn waits for its name.
    sim = _next_turn_sim(keyed)
    lost = _ahead(sim, 2, pod_lost=True)
    decision = _decide(sim, dataclasses.replace(sim.observed(), ahead=(lost,)))
    actions = decision.after_commit
    assert not [s for s in actions if isinstance(s, SendTurn)]
    assert _name(sim, 2) not in [c.job_name for c in actions if isinstance(c, CreateJob)]
    deletes = [d for d in actions if getattr(d, "job_name", None) == _name(sim, 2)]
    assert [type(d).__name__ for d in deletes] == ["DeleteJob"]
    assert _not_launched(decision)
    # Once it is being deleted, it is not deleted again; the turn still waits.
    going = _ahead(sim, 2, pod_lost=True, deleting=True)
    decision = _decide(sim, dataclasses.replace(sim.observed(), ahead=(going,)))
    assert not [d for d in decision.after_commit if getattr(d, "job_name", None) == _name(sim, 2)]
    assert _not_launched(decision)


def test_while_the_tools_run_a_job_made_ahead_whose_pod_went_is_deleted() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "db"})])
    lost = _ahead(sim, 2, pod_lost=True)
    actions = _actions(sim, dataclasses.replace(sim.observed(), ahead=(lost,)))
    deletes = [d for d in actions if getattr(d, "job_name", None) == _name(sim, 2)]
    assert [type(d).__name__ for d in deletes] == ["DeleteJob"]


@BOTH
def test_a_job_made_ahead_still_going_holds_its_name_whoever_made_it(keyed: bool) -> None:
    # Let go by the operator's finalizer, a deleted Job stays while its pods go, and its
    # deletion gave it a generation this process did not create: the turn still waits.
    sim = _next_turn_sim(keyed)
    going = AheadJob(
        ObservedJob(_name(sim, 2), "t2-model", 1, JobState.FAILED, deleting=True),
        trusted=False,
    )
    decision = _decide(sim, dataclasses.replace(sim.observed(), ahead=(going,)))
    actions = decision.after_commit
    assert _name(sim, 2) not in [c.job_name for c in actions if isinstance(c, CreateJob)]
    assert not [d for d in actions if getattr(d, "job_name", None) == _name(sim, 2)]
    assert _not_launched(decision)


def test_a_turn_in_a_pod_made_ahead_shows_running_only_once_it_ran_that_long_since_its_intent() -> (
    None
):
    """The pod of a Job made ahead runs its command (waiting for the turn's request) long
    before the turn: the turn runs from its intent, and a quick turn skips Running (a status
    write fewer per turn)."""
    sim = AgentSim(agent_run())
    sim.tick()
    job = sim.model_job()
    assert job is not None and sim.step_status("t1-model").phase == m.StepPhase.LAUNCHING
    job.running_since = sim.now - timedelta(seconds=60)  # waiting since it was made
    sim.advance(1)
    sim.tick()
    assert sim.step_status("t1-model").phase == m.StepPhase.LAUNCHING
    sim.advance(sim.config.running_after_seconds)
    sim.tick()
    assert sim.step_status("t1-model").phase == m.StepPhase.RUNNING


def test_the_pass_that_begins_a_turn_makes_the_jobs_after_it() -> None:
    # Not a pass later: the write that begins turn 2 comes first (Jobs are made after it),
    # and the names are within the turns the run as read counts as ahead.
    sim = _turns_ahead(_next_turn_sim(keyed=False), 2)
    decision = _decide(sim)
    assert decision.status.agent is not None and decision.status.agent.turn == 2
    prepared = [p.job_name for p in decision.after_commit if isinstance(p, PrepareTurn)]
    assert prepared == [_name(sim, 3), _name(sim, 4)]
    # Observed as made ahead (never as strays) by a pass that reads the run as it was.
    assert set(prepared) <= set(turns.ahead_names(sim.run))
    # Made after what turn 2 waits for (here its Job's create; its request, when its Job was
    # made ahead), which is not held up by two creates for later turns.
    kinds = [type(x) for x in decision.after_commit]
    assert kinds.index(CreateJob) < kinds.index(PrepareTurn)


def test_a_keyed_models_turns_are_made_ahead_only_while_its_rights_are_confirmed() -> None:
    """A turn's pod holds the model's API key Secret of the run's creator: its Job is made
    ahead (and its pod let start) only while the shell found the creator allowed to use it
    within the rights TTL, as the turn's own launch is."""
    sim = _turns_ahead(AgentSim(agent_run(model=KEYED)), 2)
    sim.answer("", [call("search", {"query": "db"})])
    assert not [p for p in _actions(sim) if isinstance(p, PrepareTurn)]
    step = turn_steps.model_turn_step(sim.run, sim.agent, 2, sim.config.agent)
    granted = frozenset(c.permission for c in rights.checks_for(sim.run, step))
    assert granted, "the keyed model's turn uses a Secret of its creator"
    confirmed = dataclasses.replace(sim.observed(), granted=granted)
    prepared = [p.job_name for p in _actions(sim, confirmed) if isinstance(p, PrepareTurn)]
    assert prepared == [_name(sim, 2), _name(sim, 3)]
    # A Job made earlier, its pod waiting at the gate, is not let start without them either.
    ahead = (_ahead(sim, 2, start_pod=PodRef("t2-pod", "t2-pod-uid")),)
    held = dataclasses.replace(sim.observed(), ahead=ahead)
    assert not [s for s in _actions(sim, held) if isinstance(s, StartPod)]
    let = dataclasses.replace(held, granted=granted)
    assert [s.job_name for s in _actions(sim, let) if isinstance(s, StartPod)] == [_name(sim, 2)]
