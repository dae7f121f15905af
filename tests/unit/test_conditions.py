"""The run's conditions in each phase: Succeeded and ApprovalPending for ``kubectl wait`` and
people, Ready, Reconciling and Stalled for kstatus (tests/integration/test_kstatus.py runs
kstatus itself over the same runs)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentrun.api import models as m
from agentrun.core import Observed, reconcile
from tests.support.agent_sim import AgentSim
from tests.support.phases import EXPECTED, PHASES, condition_status
from tests.support.sim import Sim, make_run, step


@pytest.mark.parametrize("case", sorted(PHASES))
def test_conditions_follow_the_phase(case: str) -> None:
    sim = PHASES[case](Sim, AgentSim)
    want = EXPECTED[case]
    run = sim.run
    assert sim.status.phase == want.phase, sim.status.message
    assert condition_status(run, "Ready") == want.ready
    assert condition_status(run, "Reconciling") == want.reconciling
    assert condition_status(run, "Stalled") == want.stalled
    succeeded = {m.RunPhase.SUCCEEDED: "True", m.RunPhase.FAILED: "False"}
    succeeded[m.RunPhase.CANCELLED] = "False"
    assert condition_status(run, "Succeeded") == succeeded.get(want.phase, "Unknown")
    generation = run.metadata.generation
    assert sim.status.observed_generation == generation
    for cond in sim.status.conditions or []:
        assert cond.observed_generation == generation, cond
        if cond.status == m.ConditionStatus.TRUE and cond.type != "Ready":
            assert cond.message, f"{cond.type} is True without saying why"


def test_stalled_and_ready_name_the_reason_the_run_ended_with() -> None:
    sim = PHASES["failed"](Sim, AgentSim)
    stalled, ready, done = (sim.condition(t) for t in ("Stalled", "Ready", "Succeeded"))
    assert stalled is not None and ready is not None and done is not None
    assert stalled.reason == ready.reason == done.reason
    assert stalled.reason != "Succeeded"
    assert stalled.message == sim.status.message


def test_a_suspended_run_that_resumes_is_reconciling_again() -> None:
    sim = PHASES["suspended"](Sim, AgentSim)
    reconciling = sim.condition("Reconciling")
    assert reconciling is not None and reconciling.reason == "Suspended"
    since = reconciling.last_transition_time
    sim.advance(5)
    sim.spec_update(suspend=False)
    sim.tick()
    reconciling = sim.condition("Reconciling")
    assert reconciling is not None and reconciling.status == m.ConditionStatus.TRUE
    assert reconciling.last_transition_time == since + timedelta(seconds=5)


def test_a_run_that_finished_before_ready_existed_gets_it_once() -> None:
    sim = Sim(make_run([step("a")]))
    sim.run_to_end()
    status = sim.status.model_copy(deep=True)
    status.conditions = [c for c in status.conditions or [] if c.type == "Succeeded"]
    old = sim.run.model_copy(update={"status": status})
    decision = reconcile(old, Observed(), sim.now)
    types = {c.type: str(c.status) for c in decision.status.conditions or []}
    assert types == {
        "Succeeded": "True",
        "Ready": "True",
        "Reconciling": "False",
        "Stalled": "False",
    }
    again = old.model_copy(update={"status": decision.status})
    assert not reconcile(again, Observed(), sim.now).status_changed(decision.status)
