"""Property-based tests: random plans through random orders of events, duplicated events,
crashes between commit and action, stale writers and a stalled second operator.

After every event the invariants of docs/design.md that hold at the core level are checked:
no step attempt's Job is created twice, a finished step never runs again, a committed result
is never lost or changed, a gated step never starts without a matching approval, budgets and
deadlines hold, and the status stays bounded.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.api import models as m
from agentrun.core import CreateJob
from tests.support.passes import FAULTS, Passes, assert_approved
from tests.support.sim import Sim, make_run, step

SP = m.StepPhase
EXAMPLES = int(os.environ.get("AGENTRUN_HYPOTHESIS_EXAMPLES", "300"))
"""Examples per property; raise it (e.g. 5000) for a thorough local run."""
STATUS_BOUND = 256 * 1024  # bytes of status JSON for plans of up to 8 steps; far below 1.5 MiB


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 7))
    steps = []
    for i in range(n):
        deps = sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 3)))) if i else []
        extra: dict[str, Any] = {}
        limit = draw(st.integers(0, 2))
        if limit:
            extra["retry"] = {
                "limit": limit,
                "backoff": {
                    "initialSeconds": draw(st.sampled_from([0, 1, 5, 30])),
                    "factor": 2,
                    "maxSeconds": 60,
                },
            }
        if draw(st.integers(0, 4)) == 0:
            extra["approval"] = "required"
        if draw(st.booleans()):
            extra["timeoutSeconds"] = draw(st.sampled_from([5, 60]))
        steps.append(step(f"s{i}", *[f"s{d}" for d in deps], **extra))
    spec: dict[str, Any] = {}
    budget: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        budget["maxAttempts"] = draw(st.integers(1, 10))
    if draw(st.integers(0, 3)) == 0:
        budget["maxSteps"] = draw(st.integers(1, n))
    if draw(st.integers(0, 3)) == 0:
        budget["maxWallTimeSeconds"] = draw(st.integers(30, 600))
    if budget:
        spec["budget"] = budget
    if draw(st.booleans()):
        spec["retention"] = {"keepJobs": draw(st.sampled_from(["none", "failed", "all"]))}
    return {"steps": steps, "spec": spec}


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "tick",
                "tick",
                "tick",
                "finish",
                "finish",
                "finish",
                "advance",
                *FAULTS,
                "approve",
                "lose_job",
                "suspend",
                "resume_run",
            ]
        ),
        st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=120,
)


class Checker:
    """Watches a simulation and fails on the first broken invariant."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.results: dict[str, tuple[Any, ...]] = {}
        self.finished: set[str] = set()
        self.launched_steps: set[str] = set()
        self.max_size = 0
        self.deadline_at: Any = None

    def check_creates(self, action: CreateJob) -> None:
        sim = self.sim
        if action.job_name in sim.jobs:
            return  # AlreadyExists: adopted, nothing new runs
        name = action.step.name
        assert name not in self.finished, f"finished step {name} launched again"
        assert_approved(sim, action, "gated step")
        if self.deadline_at is not None:
            assert sim.now < self.deadline_at, "a Job was created after the run deadline"

    def after_event(self) -> None:
        sim = self.sim
        assert all(n == 1 for n in sim.creations.values()), f"duplicate Job: {sim.creations}"
        budget = sim.run.spec.budget
        if budget and budget.max_attempts is not None:
            assert sum(sim.creations.values()) <= budget.max_attempts
        steps_created = {spec.step.name for spec in sim.created_specs.values()}
        if budget and budget.max_steps is not None:
            assert len(steps_created) <= budget.max_steps
        status = sim.run.status
        if status is None:
            return
        if budget and budget.max_wall_time_seconds and status.started_at:
            self.deadline_at = status.started_at + timedelta(seconds=budget.max_wall_time_seconds)
        size = len(json.dumps(status.to_wire()))
        self.max_size = max(self.max_size, size)
        assert size < STATUS_BOUND
        for st_ in status.steps or []:
            if st_.name in self.results:
                assert st_.phase == SP.SUCCEEDED, f"committed success of {st_.name} lost"
                assert self.results[st_.name] == (
                    st_.result,
                    st_.result_ref,
                    st_.result_digest,
                    st_.attempt,
                ), f"committed result of {st_.name} changed"
            elif st_.phase == SP.SUCCEEDED:
                self.results[st_.name] = (
                    st_.result,
                    st_.result_ref,
                    st_.result_digest,
                    st_.attempt,
                )
            if st_.phase in m.TERMINAL_STEP_PHASES:
                self.finished.add(st_.name)
        assert len(status.history or []) <= m.MAX_HISTORY


def _outcome(sim: Sim, seed: int) -> tuple[bool, str]:
    ok = seed % 3 != 0
    if seed % 7 == 0:
        return ok, json.dumps({"ok": ok, "summary": "big", "result": "x" * (500 + seed % 3000)})
    return ok, f"result {seed}"


def _execute(sim: Sim, checker: Checker, actions: Any) -> None:
    for action in actions:
        if isinstance(action, CreateJob):
            checker.check_creates(action)
        sim.apply(action)


def _run_events(sim: Sim, checker: Checker, events: list[tuple[str, int]]) -> None:
    passes = Passes(sim, lambda actions: _execute(sim, checker, actions))
    for kind, seed in events:
        if passes.handle(kind, seed):
            pass  # a pass of the operator, or a stalled one resuming
        elif kind == "finish" and sim.active():
            job = sim.active()[seed % len(sim.active())]
            ok, message = _outcome(sim, seed)
            sim.finish(job.name, ok, message)
        elif kind == "advance":
            # A stalled operator resumes before the clock moves on: the documented bound on
            # how long an operator may stall between its fence write and its Job creation.
            passes.resume()
            sim.advance(seed % 90)
        elif kind == "approve":
            waiting = [
                s
                for s in (sim.run.status.steps if sim.run.status else None) or []
                if s.phase == SP.WAITING_FOR_APPROVAL and s.args_hash
            ]
            if waiting:
                target = waiting[seed % len(waiting)]
                decision_kind = (
                    m.ApprovalDecision.REJECT if seed % 5 == 0 else m.ApprovalDecision.APPROVE
                )
                approvals = [
                    *(sim.run.spec.approvals or []),
                    m.Approval(
                        step=target.name,
                        decision=decision_kind,
                        args_hash=target.args_hash or "",
                        by="alice",
                        reason="checked",
                    ),
                ]
                sim.spec_update(approvals=approvals)
        elif kind == "lose_job" and sim.active() and seed % 4 == 0:
            sim.lose(sim.active()[seed % len(sim.active())].name)
        elif kind == "suspend":
            sim.spec_update(suspend=True)
        elif kind == "resume_run":
            sim.spec_update(suspend=False)
        checker.after_event()
    passes.resume()
    checker.after_event()


def _drive_to_end(sim: Sim, checker: Checker) -> None:
    """Fair scheduling after the chaos: approve what waits, finish what runs, let time pass."""
    sim.spec_update(suspend=False)
    for i in range(400):
        decision = sim.tick()
        checker.after_event()
        if sim.status.phase in m.TERMINAL_RUN_PHASES:
            return
        waiting = [s for s in sim.status.steps or [] if s.phase == SP.WAITING_FOR_APPROVAL]
        if waiting:
            sim.spec_update(
                approvals=[
                    *(sim.run.spec.approvals or []),
                    *[
                        m.Approval(
                            step=s.name,
                            decision=m.ApprovalDecision.APPROVE,
                            args_hash=s.args_hash or "",
                            by="alice",
                        )
                        for s in waiting
                    ],
                ]
            )
        for job in sim.active():
            sim.finish(job.name, *_outcome(sim, i))
        if decision.requeue_after and not sim.active():
            sim.advance(decision.requeue_after)
    raise AssertionError(f"run never ended: {sim.status.phase}: {sim.status.message}")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), events=EVENTS)
def test_invariants_hold_under_any_order_of_events(
    plan: dict[str, Any], events: list[tuple[str, int]]
) -> None:
    sim = Sim(make_run(plan["steps"], **plan["spec"]))
    checker = Checker(sim)
    _run_events(sim, checker, events)
    _drive_to_end(sim, checker)
    status = sim.status
    assert status.phase in m.TERMINAL_RUN_PHASES
    cond = next(c for c in status.conditions or [] if c.type == "Succeeded")
    assert (cond.status == m.ConditionStatus.TRUE) == (status.phase == m.RunPhase.SUCCEEDED)
    if status.phase == m.RunPhase.SUCCEEDED:
        assert all(s.phase == SP.SUCCEEDED for s in status.steps or [])
    for s in status.steps or []:
        assert s.phase in m.TERMINAL_STEP_PHASES, f"{s.name} left in {s.phase}"


@settings(max_examples=max(EXAMPLES // 3, 1), deadline=None)
@given(plan=plans(), cut=st.integers(0, 60), seed=st.integers(0, 10_000))
def test_restart_from_any_committed_status_resumes_without_rerunning(
    plan: dict[str, Any], cut: int, seed: int
) -> None:
    """Run a while, then start a fresh "operator" from the committed status alone: finished
    steps stay finished and nothing is created twice."""
    sim = Sim(make_run(plan["steps"], **plan["spec"]))
    checker = Checker(sim)
    for i in range(cut):
        sim.tick()
        checker.after_event()
        if sim.status.phase in m.TERMINAL_RUN_PHASES:
            break
        if sim.active() and (seed + i) % 2:
            job = sim.active()[0]
            sim.finish(job.name, *_outcome(sim, seed + i))
        sim.advance((seed + i) % 40)
    restarted = Sim(
        sim.run.model_copy(deep=True),
        now=sim.now,
        jobs=sim.jobs,
        creations=sim.creations,
        created_specs=sim.created_specs,
        results=sim.results,
        version=sim.version,
    )
    checker.sim = restarted
    _drive_to_end(restarted, checker)
