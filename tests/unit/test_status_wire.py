"""The wire form of a pass's status (agentrun.loop.commit.wire_of), made from the wire form of
the status read for what did not change: always exactly ``to_wire()`` of the new status."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.api import models as m
from agentrun.core import Observed, reconcile
from agentrun.loop.commit import wire_of
from tests.support.sim import T0, Sim, make_run, step

SP = m.StepPhase


def _check(new: m.AgentRunStatus, read: m.AgentRunStatus | None) -> None:
    read_wire = read.to_wire() if read is not None else {}
    assert wire_of(new, read, read_wire) == new.to_wire()


def test_every_pass_of_a_run_to_its_end() -> None:
    """Steps launched, running, failed and retried, succeeded."""
    retry = {"limit": 1, "backoff": {"initialSeconds": 1}}
    sim = Sim(
        make_run([step(f"s{i}", *([f"s{i - 1}"] if i else []), retry=retry) for i in range(6)])
    )
    passes = 0
    while passes < 200 and (
        sim.run.status is None or sim.status.phase not in m.TERMINAL_RUN_PHASES
    ):
        read = sim.run.status
        decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
        _check(decision.status, read)
        sim.tick()
        for job in sim.active():
            failed_once = job.step == "s2" and job.attempt == 1
            sim.finish(job.name, ok=not failed_once, message=f"{job.step} done")
        sim.advance(30)
        passes += 1
    assert sim.status.phase == m.RunPhase.SUCCEEDED, sim.status.message
    assert sim.step_status("s2").attempt == 2


FIELDS = st.sampled_from(["phase", "message", "started_at", "result", "summary", "attempt"])


def _edit(status: m.AgentRunStatus, field: str, index: int) -> None:
    steps = status.steps or []
    if not steps:
        return
    target = steps[index % len(steps)]
    value: Any = {
        "phase": SP.FAILED,
        "message": "changed",
        "started_at": T0 + timedelta(seconds=index + 1),
        "result": '{"x": 1}',
        "summary": None,
        "attempt": target.attempt + 1,
    }[field]
    setattr(target, field, value)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(FIELDS, st.integers(0, 20)), max_size=6),
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
)
def test_any_edit_of_the_steps_and_history(
    edits: list[tuple[str, int]], dropped: int, reorder: bool, new_step: bool
) -> None:
    sim = Sim(make_run([step("a"), step("b", "a"), step("c"), step("d", "c")]))
    sim.tick()
    sim.tick()
    read = sim.run.status
    assert read is not None
    decision = reconcile(sim.run, Observed(), T0)
    new = decision.status
    for field, index in edits:
        _edit(new, field, index)
    new.steps = (new.steps or [])[dropped:]
    if reorder:
        new.steps.reverse()
    if new_step:
        new.steps.append(m.StepStatus(name="e", phase=SP.PENDING))
    new.history = (new.history or [])[dropped:]
    _check(new, read)


def test_a_wire_form_not_of_the_status_read_is_not_used() -> None:
    sim = Sim(make_run([step("a"), step("b")]))
    sim.tick()
    read = sim.run.status
    assert read is not None and read.steps
    stale = read.to_wire()
    stale["steps"] = stale["steps"][:1]
    new = read.model_copy(deep=True)
    assert wire_of(new, read, stale) == new.to_wire()
    assert wire_of(new, None, {}) == new.to_wire()
