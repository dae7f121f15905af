"""What a committed pass changed (agentrun.telemetry.changes.derive), driven through the real core:
each
committed write is compared with the status it was derived from, as the reconciler does after
a successful commit; a write that meets a conflict is never compared."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

from agentrun.api import models as m
from agentrun.telemetry.changes import (
    APPROVED,
    CANCELLED,
    EXPIRED,
    FAILED,
    REJECTED,
    SUCCEEDED,
    derive,
    new_transitions,
)
from tests.support.recorded import Recorded
from tests.support.sim import T0, Sim, SimJob, make_run, step

SP = m.StepPhase


def ok(tokens: int = 0) -> Callable[[SimJob], tuple[bool, str | None]]:
    envelope = json.dumps({"ok": True, "summary": "done", "usage": {"tokens": tokens}})
    return lambda job: (True, envelope)


def test_a_run_of_two_steps_counts_two_attempts_started_and_succeeded_and_its_end_once() -> None:
    rec = Recorded(Sim(make_run([step("a"), step("b", "a")])))
    rec.run_to_end(ok(tokens=150), step_seconds=7)
    assert rec.started == 2
    assert rec.outcomes() == [("a", 1, SUCCEEDED), ("b", 1, SUCCEEDED)]
    assert [e.duration_seconds for e in rec.ended] == [7.0, 7.0]
    assert [e.tokens for e in rec.ended] == [150, 150]
    assert sum(c.tokens for c in rec.changes) == 300
    ends = [c.run_ended for c in rec.changes if c.run_ended is not None]
    assert len(ends) == 1
    (end,) = ends
    assert end.phase == "Succeeded" and end.tokens == 300 and end.attempts == 2
    assert end.started_at == T0 and end.completed_at == rec.sim.now
    assert not any(c.approvals for c in rec.changes)


def test_a_failed_attempt_then_a_retry_counts_failed_retried_and_succeeded() -> None:
    retry = {"limit": 2, "backoff": {"initialSeconds": 10, "factor": 2, "maxSeconds": 60}}
    rec = Recorded(Sim(make_run([step("a", retry=retry)])))
    failures = iter([True])

    def first_fails(job: SimJob) -> tuple[bool, str | None]:
        return (False, "boom") if next(failures, False) else (True, None)

    rec.run_to_end(first_fails, step_seconds=3)
    assert rec.started == 2
    assert rec.outcomes() == [("a", 1, FAILED), ("a", 2, SUCCEEDED)]
    first, second = rec.ended
    assert first.retried and first.reason == "RetryScheduled"
    assert not second.retried
    assert first.duration_seconds == 3.0 and second.duration_seconds == 3.0


def test_retries_exhausted_count_every_failure_and_the_last_one_is_not_retried() -> None:
    retry = {"limit": 1, "backoff": {"initialSeconds": 0}}
    rec = Recorded(Sim(make_run([step("a", retry=retry)])))
    rec.run_to_end(lambda job: (False, "nope"))
    assert rec.started == 2
    assert [(e.outcome, e.retried) for e in rec.ended] == [(FAILED, True), (FAILED, False)]
    end = next(c.run_ended for c in rec.changes if c.run_ended is not None)
    assert end.phase == "Failed"


def test_a_pass_that_conflicts_counts_nothing_and_its_retry_counts_nothing_twice() -> None:
    sim = Sim(make_run([step("a")]))
    snapshot = sim.snapshot()
    first, version = sim.decide(snapshot)
    second, _ = sim.decide(snapshot)  # a concurrent pass derived from the same read
    assert sim.commit(first, version)
    counted = [derive(snapshot[0].status, first.status)]
    assert not sim.commit(second, version), "the stale pass meets a conflict"
    # It re-reads and re-derives; what it commits now is compared with what it read now.
    again = sim.snapshot()
    decision, version = sim.decide(again)
    assert sim.commit(decision, version)
    counted.append(derive(again[0].status, decision.status))
    assert sum(c.attempts_started for c in counted) == 1
    assert not counted[1]


def test_an_approved_step_records_the_wait_and_its_attempt_carries_it() -> None:
    run = make_run([step("deploy", approval="required")])
    rec = Recorded(Sim(run))
    rec.tick()
    assert rec.sim.step_status("deploy").phase == SP.WAITING_FOR_APPROVAL
    rec.sim.advance(120)
    rec.tick()  # still waiting: nothing decided
    args_hash = rec.sim.step_status("deploy").args_hash or ""
    rec.sim.spec_update(
        approvals=[
            m.Approval(
                step="deploy", decision=m.ApprovalDecision.APPROVE, args_hash=args_hash, by="ann"
            )
        ]
    )
    rec.sim.advance(30)
    rec.run_to_end(ok())
    approvals = [a for c in rec.changes for a in c.approvals]
    assert [(a.step, a.decision, a.wait_seconds, a.by) for a in approvals] == [
        ("deploy", APPROVED, 150.0, "ann")
    ]
    (attempt,) = rec.ended
    assert attempt.outcome == SUCCEEDED and attempt.approval_wait_seconds == 150.0


def test_a_rejection_and_an_expiry_are_decisions_without_an_attempt() -> None:
    rec = Recorded(Sim(make_run([step("deploy", approval="required")])))
    rec.tick()
    rec.sim.advance(45)
    args_hash = rec.sim.step_status("deploy").args_hash or ""
    no = m.Approval(step="deploy", decision=m.ApprovalDecision.REJECT, args_hash=args_hash, by="b")
    rec.sim.spec_update(approvals=[no])
    rec.tick()
    approvals = [a for c in rec.changes for a in c.approvals]
    assert [(a.decision, a.wait_seconds) for a in approvals] == [(REJECTED, 45.0)]
    assert rec.started == 0 and not rec.ended

    expiring = Recorded(
        Sim(make_run([step("deploy", approval="required")], policy={"approvalTimeoutSeconds": 60}))
    )
    expiring.tick()
    expiring.sim.advance(60)
    expiring.tick()
    approvals = [a for c in expiring.changes for a in c.approvals]
    assert [(a.decision, a.wait_seconds) for a in approvals] == [(EXPIRED, 60.0)]


def test_cancelling_a_run_cancels_its_running_attempt() -> None:
    rec = Recorded(Sim(make_run([step("a"), step("b", "a")])))
    rec.tick()
    rec.sim.advance(5)
    rec.sim.spec_update(cancel=True)
    rec.tick()
    assert rec.started == 1
    assert rec.outcomes() == [("a", 1, CANCELLED)]
    assert rec.ended[0].duration_seconds == 5.0
    end = next(c.run_ended for c in rec.changes if c.run_ended is not None)
    assert end.phase == "Cancelled"


def test_a_finished_run_passed_again_changes_nothing() -> None:
    rec = Recorded(Sim(make_run([step("a")])))
    rec.run_to_end(ok())
    before = len(rec.changes)
    rec.sim.advance(3600)
    rec.tick()
    assert len(rec.changes) == before + 1 and not rec.changes[-1]


def test_new_transitions_are_those_past_the_seq_read() -> None:
    rec = Recorded(Sim(make_run([step("a")])))
    rec.tick()
    read = rec.sim.status
    assert new_transitions(read, read) == []
    fresh = new_transitions(None, read)
    assert [t.seq for t in fresh] == list(range(1, (read.history_seq or 0) + 1))
    later = read.model_copy(deep=True)
    later.history = [
        *(read.history or []),
        m.Transition(
            at=T0 + timedelta(seconds=1),
            step="a",
            from_phase="Launching",
            to_phase="Running",
            reason="Started",
            seq=(read.history_seq or 0) + 1,
        ),
    ]
    later.history_seq = (read.history_seq or 0) + 1
    assert [t.reason for t in new_transitions(read, later)] == ["Started"]
