"""Behaviour of the pure run state machine, one behaviour per test."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from pydantic import ValidationError

from agentrun.api import models as m
from agentrun.core import (
    CreateJob,
    Decision,
    DeleteJob,
    DeleteRun,
    PodRef,
    ReleaseJob,
    StartPod,
    StoreResult,
    naming,
    reconcile,
)
from agentrun.core import fork_plan as fork
from agentrun.core.actions import Action, CreateChild
from agentrun.core.backoff import backoff_seconds
from agentrun.core.graph import plan_problems
from agentrun.core.naming import sha256_text
from agentrun.core.observed import CarriedSource, Observed
from tests.support.sim import T0, Sim, SimJob, make_run, step

SP = m.StepPhase


def test_first_reconcile_commits_intent_before_any_job_exists() -> None:
    run = make_run([step("a"), step("b", "a")])
    decision = reconcile(run, Observed(), T0)
    a = next(s for s in decision.status.steps or [] if s.name == "a")
    assert a.phase == SP.LAUNCHING and a.attempt == 1 and a.job_name
    creates = [x for x in decision.after_commit if isinstance(x, CreateJob)]
    assert [c.job_name for c in creates] == [a.job_name]
    assert not decision.before_commit, "creating a Job must wait for the intent commit"
    assert decision.needs_fence


def test_sequential_plan_runs_in_dependency_order_and_succeeds() -> None:
    sim = Sim(make_run([step("c", "b"), step("a"), step("b", "a")]))
    order: list[str] = []

    def record(job: SimJob) -> tuple[bool, str]:
        order.append(job.step)
        return True, f"{job.step} ok"

    sim.run_to_end(record)
    assert order == ["a", "b", "c"]
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.status.progress == "3/3"
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.status == m.ConditionStatus.TRUE
    assert cond.reason == "Succeeded"
    assert sim.status.completed_at is not None
    assert all(n == 1 for n in sim.creations.values())


def test_parallel_branches_launch_together_and_join_waits_for_both() -> None:
    sim = Sim(
        make_run([step("fetch"), step("x", "fetch"), step("y", "fetch"), step("join", "x", "y")])
    )
    sim.tick()
    sim.finish(sim.job_of("fetch").name)
    sim.tick()
    assert {j.step for j in sim.active()} == {"x", "y"}
    assert sim.status.current_step == "x, y"
    sim.finish(sim.job_of("x").name)
    sim.tick()
    assert sim.step_status("join").phase == SP.PENDING
    sim.finish(sim.job_of("y").name)
    sim.tick()
    assert sim.step_status("join").phase == SP.LAUNCHING


def test_reconcile_is_a_fixed_point_when_nothing_changes() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    sim.tick()  # observes the Job: Running
    before = sim.status.to_wire()
    decision, _ = sim.decide()
    assert not decision.status_changed(sim.run.status)
    assert decision.status.to_wire() == before
    assert not [a for a in decision.after_commit if isinstance(a, CreateJob)]


def test_committed_intent_without_job_is_created_again_with_the_same_name() -> None:
    sim = Sim(make_run([step("a")]))
    decision, version = sim.decide()
    assert sim.commit(decision, version)  # crash: the after-commit create never happens
    name = sim.step_status("a").job_name
    assert name is not None and not sim.jobs
    sim.tick()
    assert list(sim.creations) == [name] and sim.creations[name] == 1


def test_a_repeated_create_is_adopted_not_duplicated() -> None:
    sim = Sim(make_run([step("a")]))
    decision = sim.tick()
    for action in decision.after_commit:  # the shell retries the same actions
        sim.apply(action)
    assert sum(sim.creations.values()) == 1


def test_stale_writer_cannot_commit_and_creates_nothing() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    stale = sim.snapshot()
    sim.tick()
    sim.tick()
    sim.finish(sim.job_of("a").name, message="result of a")
    sim.tick()
    committed = sim.step_status("a").model_copy()
    decision, version = sim.decide(stale)
    assert not sim.commit(decision, version)
    assert sim.step_status("a") == committed


def test_failed_attempt_is_retried_with_backoff_then_succeeds() -> None:
    retry = {"limit": 2, "backoff": {"initialSeconds": 10, "factor": 2, "maxSeconds": 60}}
    sim = Sim(make_run([step("a", retry=retry)]))
    sim.tick()
    first = sim.job_of("a").name
    sim.finish(first, ok=False, message="connection refused", exit_code=7)
    decision = sim.tick()
    st = sim.step_status("a")
    assert st.phase == SP.BACKING_OFF
    assert st.error is not None and st.error.exit_code == 7
    assert "connection refused" in st.error.message
    expected = backoff_seconds(
        m.Backoff(initial_seconds=10, factor=2, max_seconds=60),
        1,
        seed=0,
        run_uid=sim.run.metadata.uid,
        step="a",
    )
    assert st.next_attempt_at == T0 + __import__("datetime").timedelta(seconds=expected)
    assert decision.requeue_after == expected
    sim.advance(expected - 1)
    sim.tick()
    assert sim.step_status("a").phase == SP.BACKING_OFF, "no attempt before nextAttemptAt"
    sim.advance(1)
    sim.tick()
    st = sim.step_status("a")
    assert st.phase == SP.LAUNCHING and st.attempt == 2 and st.job_name != first
    sim.finish(st.job_name or "")
    sim.tick()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.step_status("a").error is None


def test_a_later_attempts_job_seen_from_a_stale_read_is_stopped_only_behind_a_fence() -> None:
    """A pass read the run while its step was backing off; another pass (another operator's)
    then committed attempt 2 and created its Job, which this pass sees before it decides. To it
    that Job is a stray, still running: stopping it is part of a decision whose status did not
    change, so that decision must be written all the same, and its write, with the stale
    version, is refused; the Job is never deleted."""
    retry = {"limit": 2, "backoff": {"initialSeconds": 1}}
    sim = Sim(make_run([step("a", retry=retry)]))
    sim.tick()
    sim.finish(sim.job_of("a").name, ok=False, exit_code=3)
    sim.tick()
    assert sim.step_status("a").phase == SP.BACKING_OFF
    sim.advance(2)
    stale = sim.snapshot()  # read while attempt 2 is due, not yet committed
    sim.tick()  # the other pass: attempt 2 committed, its Job created
    second = sim.job_of("a")
    assert second.attempt == 2
    seen = dataclasses.replace(sim.observed(), running=frozenset({second.name}))
    decision = reconcile(stale[0], seen, sim.now, sim.config)
    assert not decision.status_changed(stale[0].status)
    stops = [a for a in decision.after_commit if isinstance(a, DeleteJob)]
    assert [a.job_name for a in stops] == [second.name]
    assert decision.needs_fence, "a Job stopped on a decision nothing fences"
    assert not sim.commit(decision, stale[1]), "the stale decision was committed"


def test_what_a_decision_must_write_even_with_its_status_unchanged() -> None:
    """Creating a Job or a child run, and stopping a Job, need the fence write; releasing a Job
    already being deleted, letting a pod start or handing a Job to the TTL controller do not."""
    status = m.AgentRunStatus()
    plan = make_run([step("a")]).spec.plan
    assert plan is not None
    fenced: list[Action] = [
        CreateJob(plan.steps[0], 1, "j", "k", "h"),
        CreateChild("t1-0-researcher", {"metadata": {"name": "child"}}),
        DeleteJob("j", "NotCurrentAttempt"),
    ]
    free: list[Action] = [
        DeleteJob("j", "Deleted", release=True),
        StartPod("j", PodRef("p", "u")),
        ReleaseJob("j", 1),
    ]
    for action in fenced:
        assert Decision(status, after_commit=(action,)).needs_fence, action
    for action in free:
        assert not Decision(status, after_commit=(action,)).needs_fence, action


def test_retries_keep_the_idempotency_key() -> None:
    sim = Sim(make_run([step("a", retry={"limit": 1, "backoff": {"initialSeconds": 0}})]))
    sim.tick()
    key1 = sim.step_status("a").idempotency_key
    sim.finish(sim.job_of("a").name, ok=False)
    sim.tick()
    sim.tick()
    assert sim.step_status("a").attempt == 2
    assert sim.step_status("a").idempotency_key == key1
    assert key1 and key1.startswith(f"{sim.run.metadata.uid}:a:busybox:1.36:")


def test_exhausted_retries_fail_the_run_with_the_step_reason() -> None:
    sim = Sim(
        make_run([step("a", retry={"limit": 1, "backoff": {"initialSeconds": 0}}), step("b", "a")])
    )
    sim.run_to_end(lambda job: (False, "disk full"))
    assert sim.status.phase == m.RunPhase.FAILED
    assert sim.step_status("a").phase == SP.FAILED and sim.step_status("a").attempt == 2
    assert sim.step_status("b").phase == SP.SKIPPED
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.status == m.ConditionStatus.FALSE
    assert cond.reason == "Error" and "disk full" in cond.message
    assert "after 2 attempts" in (sim.status.message or "")


def test_independent_running_step_finishes_before_the_run_fails() -> None:
    sim = Sim(make_run([step("a"), step("b")]))
    sim.tick()
    sim.finish(sim.job_of("a").name, ok=False, message="boom")
    sim.tick()
    stopping = sim.status
    assert stopping.phase == m.RunPhase.RUNNING and "stopping" in (stopping.message or "")
    sim.finish(sim.job_of("b").name, message="b result")
    sim.tick()
    assert sim.status.phase == m.RunPhase.FAILED
    assert sim.step_status("b").phase == SP.SUCCEEDED
    assert sim.step_status("b").result == "b result"


def test_step_reporting_ok_false_fails_even_with_exit_code_zero() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    sim.finish(sim.job_of("a").name, message=json.dumps({"ok": False, "summary": "no data"}))
    sim.tick()
    st = sim.step_status("a")
    assert st.phase == SP.FAILED and st.error is not None
    assert st.error.reason == "StepReportedFailure" and st.error.message == "no data"


def test_job_deadline_becomes_step_timeout() -> None:
    sim = Sim(make_run([step("a", timeoutSeconds=5)]))
    sim.tick()
    sim.finish(sim.job_of("a").name, ok=False, reason="DeadlineExceeded")
    sim.tick()
    st = sim.step_status("a")
    assert st.error is not None and st.error.reason == "StepTimeout"
    assert sim.status.phase == m.RunPhase.FAILED


def test_core_stops_waiting_when_the_job_deadline_never_fires() -> None:
    sim = Sim(make_run([step("a", timeoutSeconds=5)]))
    sim.tick()
    sim.tick()
    sim.advance(5 + sim.config.step_timeout_grace_seconds)
    decision = sim.tick()
    assert DeleteJob(sim.step_status("a").job_name or "", "StepTimeout") in decision.after_commit
    assert sim.step_status("a").error is not None
    assert sim.status.phase == m.RunPhase.FAILED


def test_run_deadline_stops_running_steps_and_fails_the_run() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")], budget={"maxWallTimeSeconds": 60}))
    decision = sim.tick()
    assert decision.requeue_after == 60
    sim.advance(60)
    decision = sim.tick()
    assert sim.status.phase == m.RunPhase.FAILED
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.reason == "DeadlineExceeded"
    assert any(isinstance(a, DeleteJob) for a in decision.after_commit)
    assert sim.step_status("a").phase == SP.CANCELLED
    assert sim.step_status("b").phase == SP.SKIPPED
    assert sim.status.usage is not None and sim.status.usage.wall_time_seconds == 60


def test_a_launch_whose_create_was_lost_is_not_created_once_the_deadline_passed() -> None:
    sim = Sim(make_run([step("a")], budget={"maxWallTimeSeconds": 30}))
    decision, version = sim.decide()
    assert sim.commit(decision, version)  # the intent, then the operator died: no Job
    assert sim.step_status("a").phase == SP.LAUNCHING and not sim.jobs
    sim.advance(30)
    decision = sim.tick()
    assert sim.status.phase == m.RunPhase.FAILED
    assert not [a for a in decision.after_commit if isinstance(a, CreateJob)]
    assert sim.step_status("a").phase == SP.CANCELLED and not sim.jobs


def test_max_steps_budget_stops_before_the_extra_step() -> None:
    sim = Sim(make_run([step("a"), step("b", "a"), step("c", "b")], budget={"maxSteps": 2}))
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.FAILED
    assert sim.step_status("c").phase == SP.SKIPPED
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.reason == "BudgetExceeded"
    assert "maxSteps" in cond.message
    assert len(sim.creations) == 2


def test_max_attempts_budget_counts_retries() -> None:
    retry = {"limit": 5, "backoff": {"initialSeconds": 0}}
    sim = Sim(make_run([step("a", retry=retry)], budget={"maxAttempts": 3}))
    sim.run_to_end(lambda job: (False, "nope"))
    assert sum(sim.creations.values()) == 3
    assert sim.status.phase == m.RunPhase.FAILED
    error = sim.step_status("a").error
    assert error is not None
    assert error.reason == "BudgetExceeded"


def test_token_budget_stops_launching_more_steps() -> None:
    envelope = json.dumps({"ok": True, "summary": "s", "usage": {"tokens": 700}})
    sim = Sim(make_run([step("a"), step("b", "a"), step("c", "b")], budget={"maxTokens": 1000}))
    sim.run_to_end(lambda job: (True, envelope))
    assert sim.status.usage is not None and sim.status.usage.tokens == 1400
    assert sim.step_status("c").phase == SP.SKIPPED
    assert sim.status.phase == m.RunPhase.FAILED


def test_approval_gate_waits_then_launches_on_a_matching_approval() -> None:
    sim = Sim(
        make_run([step("deploy", risk="external")], policy={"approvalRequiredFor": ["external"]})
    )
    sim.tick()
    st = sim.step_status("deploy")
    assert st.phase == SP.WAITING_FOR_APPROVAL and st.args_hash
    assert sim.status.phase == m.RunPhase.WAITING_FOR_APPROVAL
    cond = sim.condition("ApprovalPending")
    assert cond is not None and cond.status == m.ConditionStatus.TRUE
    assert st.args_hash in cond.message and not sim.jobs
    wrong = m.Approval(
        step="deploy", decision=m.ApprovalDecision.APPROVE, args_hash="0" * 64, by="alice"
    )
    sim.spec_update(approvals=[wrong])
    sim.tick()
    assert not sim.jobs, "an approval of other arguments does not count"
    right = wrong.model_copy(update={"args_hash": st.args_hash})
    sim.spec_update(approvals=[wrong, right])
    sim.tick()
    assert sim.step_status("deploy").phase == SP.LAUNCHING and len(sim.jobs) == 1
    cond = sim.condition("ApprovalPending")
    assert cond is not None and cond.status == m.ConditionStatus.FALSE


def test_rejection_ends_the_step_and_the_run_with_the_reason() -> None:
    sim = Sim(make_run([step("deploy", approval="required")]))
    sim.tick()
    h = sim.step_status("deploy").args_hash or ""
    sim.spec_update(
        approvals=[
            m.Approval(
                step="deploy",
                decision=m.ApprovalDecision.REJECT,
                args_hash=h,
                by="bob",
                reason="not during the freeze",
            )
        ]
    )
    sim.tick()
    assert sim.status.phase == m.RunPhase.FAILED
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.reason == "Rejected"
    assert "bob" in cond.message and "not during the freeze" in cond.message
    assert not sim.creations


def test_changing_a_gated_step_needs_a_new_approval() -> None:
    steps = [step("deploy", approval="required")]
    sim = Sim(make_run(steps))
    sim.tick()
    h = sim.step_status("deploy").args_hash or ""
    changed = step("deploy", approval="required")
    changed["container"]["args"] = ["--force"]
    sim.spec_update(
        plan=m.Plan.model_validate({"steps": [changed]}),
        approvals=[
            m.Approval(step="deploy", decision=m.ApprovalDecision.APPROVE, args_hash=h, by="a")
        ],
    )
    sim.tick()
    st = sim.step_status("deploy")
    assert st.phase == SP.WAITING_FOR_APPROVAL and st.args_hash != h and not sim.jobs


def test_suspend_starts_nothing_and_resume_continues() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    sim.spec_update(suspend=True)
    sim.finish(sim.job_of("a").name)
    sim.tick()
    suspended = sim.status
    assert suspended.phase == m.RunPhase.SUSPENDED
    assert sim.step_status("a").phase == SP.SUCCEEDED, "a running step finishes while suspended"
    assert sim.step_status("b").phase == SP.PENDING and len(sim.jobs) == 1
    sim.spec_update(suspend=False)
    sim.tick()
    assert sim.step_status("b").phase == SP.LAUNCHING
    assert sim.status.phase == m.RunPhase.RUNNING


def test_cancel_stops_running_steps_and_keeps_finished_results() -> None:
    sim = Sim(make_run([step("a"), step("b"), step("c", "a", "b")]))
    sim.tick()
    sim.finish(sim.job_of("a").name, message="a result")
    sim.spec_update(cancel=True)
    decision = sim.tick()
    assert sim.status.phase == m.RunPhase.CANCELLED
    assert sim.step_status("a").phase == SP.SUCCEEDED and sim.step_status("a").result == "a result"
    assert sim.step_status("b").phase == SP.CANCELLED
    assert sim.step_status("c").phase == SP.SKIPPED
    assert DeleteJob(sim.step_status("b").job_name or "", "Cancelled") in decision.after_commit
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.status == m.ConditionStatus.FALSE
    assert cond.reason == "Cancelled"


def test_dependency_cycle_ends_the_run_naming_the_cycle() -> None:
    sim = Sim(make_run([step("a", "c"), step("b", "a"), step("c", "b"), step("d")]))
    sim.tick()
    assert sim.status.phase == m.RunPhase.FAILED
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.reason == "InvalidPlan"
    assert "dependency cycle: a -> b -> c -> a" in cond.message
    assert not sim.creations


def test_the_plan_is_checked_once_per_generation_of_the_spec() -> None:
    """A pass walks the whole plan to check it only for a spec no pass has checked yet: a run
    of many steps would otherwise pay for it on each of its passes."""
    sim = Sim(make_run([step("a"), step("b", "a")]))
    with mock.patch("agentrun.core.machine.plan_problems", wraps=plan_problems) as checked:
        sim.tick()
        sim.tick()
        sim.finish(sim.job_of("a").name)
        sim.tick()
        assert checked.call_count == 1
        assert sim.step_status("b").phase == SP.LAUNCHING
        cycle = m.Plan.model_validate({"steps": [step("a", "b"), step("b", "a")]})
        sim.spec_update(plan=cycle)  # past admission's CEL rules (an older CRD, say)
        sim.tick()
        assert checked.call_count == 2
    cond = sim.condition("Succeeded")
    assert sim.status.phase == m.RunPhase.FAILED
    assert cond is not None and cond.reason == "InvalidPlan"


def test_missing_dependency_is_reported_like_admission_would() -> None:
    sim = Sim(make_run([step("deploy", "build")]))
    sim.tick()
    assert "step 'deploy' dependsOn 'build' which is not a step of this plan" in (
        sim.status.message or ""
    )


def test_large_results_are_kept_by_reference_and_stored_before_commit() -> None:
    big = json.dumps({"ok": True, "summary": "big", "result": {"rows": "x" * 2000, "n": 3}})
    sim = Sim(
        make_run([step("a"), step("b", "a", inputs=[{"name": "N", "fromStep": "a", "key": "n"}])])
    )
    sim.tick()
    sim.finish(sim.job_of("a").name, message=big)
    decision, version = sim.decide()
    stores = [x for x in decision.before_commit if isinstance(x, StoreResult)]
    assert len(stores) == 1
    st = next(s for s in decision.status.steps or [] if s.name == "a")
    assert st.result is None and st.result_ref is not None
    assert st.result_ref.name == stores[0].name and st.result_digest
    assert dict(stores[0].data)["field.n"] == "3"
    assert sim.commit(decision, version)
    for action in decision.after_commit:
        sim.apply(action)
    sim.tick()
    create = sim.created_specs[sim.step_status("b").job_name or ""]
    (env,) = create.input_env
    assert env.value_from is not None and env.value_from.config_map_key_ref is not None
    assert env.value_from.config_map_key_ref.key == "field.n"


def test_small_results_stay_inline_and_feed_inputs_by_value() -> None:
    envelope = json.dumps({"ok": True, "summary": "found", "result": {"suspect": "v2.14"}})
    sim = Sim(
        make_run(
            [step("a"), step("b", "a", inputs=[{"name": "S", "fromStep": "a", "key": "suspect"}])]
        )
    )
    sim.tick()
    sim.finish(sim.job_of("a").name, message=envelope)
    sim.tick()
    assert sim.step_status("a").result == '{"suspect":"v2.14"}'
    assert sim.step_status("a").summary == "found"
    assert sim.job_of("b").env == {"S": "v2.14"}


def test_missing_input_field_fails_the_step_clearly() -> None:
    sim = Sim(
        make_run(
            [step("a"), step("b", "a", inputs=[{"name": "S", "fromStep": "a", "key": "nope"}])]
        )
    )
    sim.tick()
    sim.finish(sim.job_of("a").name, message='{"ok": true, "result": {"x": 1}}')
    sim.tick()
    st = sim.step_status("b")
    assert st.phase == SP.FAILED and st.error is not None and st.error.reason == "InputMissing"
    assert "has no field 'nope'" in st.error.message


def test_image_policy_rejects_other_images() -> None:
    sim = Sim(make_run([step("a")], policy={"allowedImages": ["ghcr.io/acme/"]}))
    sim.tick()
    assert sim.status.phase == m.RunPhase.FAILED
    error = sim.step_status("a").error
    assert error is not None
    assert error.reason == "ImageNotAllowed"
    assert not sim.creations


def test_lost_job_counts_as_a_failed_attempt() -> None:
    sim = Sim(make_run([step("a", retry={"limit": 1, "backoff": {"initialSeconds": 0}})]))
    sim.tick()
    sim.tick()
    first = sim.step_status("a").job_name or ""
    del sim.jobs[first]  # gone without trace (finalizer removed by hand)
    sim.tick()
    st = sim.step_status("a")
    assert st.error is not None and st.error.reason == "JobLost"
    sim.tick()
    assert sim.step_status("a").attempt == 2 and sim.creations[first] == 1


def test_job_deleted_before_it_was_observed_is_not_created_again() -> None:
    sim = Sim(make_run([step("a", retry={"limit": 1, "backoff": {"initialSeconds": 0}})]))
    sim.tick()
    first = sim.step_status("a").job_name or ""
    sim.lose(first)  # deleted while Launching: the finalizer keeps it visible
    decision = sim.tick()
    error = sim.step_status("a").error
    assert error is not None
    assert error.reason == "JobLost"
    assert sim.creations[first] == 1
    decision = sim.tick()
    # Released only once it has been deleting for the grace: a create stalled since before
    # the deletion cannot outlast it, so it meets the Job (AlreadyExists), not a free name.
    grace = sim.config.job_deletion_grace_seconds
    assert not [a for a in decision.after_commit if isinstance(a, DeleteJob)]
    assert decision.requeue_after is not None and decision.requeue_after <= grace
    sim.advance(grace)
    decision = sim.tick()
    assert DeleteJob(first, "Deleted", release=True) in decision.after_commit
    assert first not in sim.jobs and sim.step_status("a").attempt == 2


def test_finished_jobs_are_released_to_the_ttl_controller_once_their_outcome_commits() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    name = sim.job_of("a").name
    sim.finish(name)
    before = sim.status.model_copy(deep=True)
    decision, version = sim.decide()
    grace = sim.config.job_deletion_grace_seconds
    # Released after the commit that records the outcome (after_commit), never before it.
    assert ReleaseJob(name, grace) in decision.after_commit
    assert not [a for a in decision.before_commit if isinstance(a, ReleaseJob | DeleteJob)]
    assert decision.status_changed(before)
    assert sim.commit(decision, version)
    for action in decision.after_commit:
        sim.apply(action)
    assert not [a for a in sim.tick().after_commit if isinstance(a, ReleaseJob | DeleteJob)]
    sim.advance(grace - 1)
    assert name in sim.jobs, "deleted before its grace"
    sim.advance(1)
    assert name not in sim.jobs


def test_a_released_job_that_lost_its_ttl_is_deleted_after_the_grace() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    name = sim.job_of("a").name
    sim.finish(name)
    sim.tick()
    sim.jobs[name].ttl = None  # someone removed it (and the finalizer is gone)
    observed = sim.observed()
    lost = tuple(dataclasses.replace(j, held=False, expires=False) for j in observed.jobs)
    decision = reconcile(sim.run, dataclasses.replace(observed, jobs=lost), sim.now, sim.config)
    assert not [a for a in decision.after_commit if isinstance(a, DeleteJob)]
    later = sim.now + timedelta(seconds=sim.config.job_deletion_grace_seconds)
    decision = reconcile(sim.run, dataclasses.replace(observed, jobs=lost), later, sim.config)
    assert DeleteJob(name, "Retention") in decision.after_commit


def test_a_pass_leaves_the_status_it_read_as_it_was_sharing_only_its_frozen_transitions() -> None:
    sim = Sim(make_run([step(f"s{i}", *([f"s{i - 1}"] if i else [])) for i in range(3)]))
    sim.tick()
    sim.finish(sim.job_of("s0").name)
    run = sim.run
    assert run.status is not None and run.status.history
    before = run.status.to_wire()
    decision = reconcile(run, sim.observed(), sim.now, sim.config)
    assert run.status.to_wire() == before
    read, derived = run.status.history, decision.status.history
    assert derived is not None and len(derived) > len(read)  # the pass's own appended
    assert all(x is y for x, y in zip(read, derived, strict=False))
    with pytest.raises(ValidationError):
        read[0].reason = "Changed"  # type: ignore[misc]


def test_failed_jobs_are_kept_by_default_and_all_deleted_with_keep_none() -> None:
    for keep, kept in (("failed", True), ("none", False)):
        sim = Sim(make_run([step("a")], retention={"keepJobs": keep}))
        sim.tick()
        name = sim.job_of("a").name
        sim.finish(name, ok=False)
        sim.tick()
        sim.advance(60)
        sim.tick()
        assert (name in sim.jobs) is kept


def test_ttl_after_finished_deletes_the_run() -> None:
    sim = Sim(make_run([step("a")], retention={"ttlSecondsAfterFinished": 120}))
    sim.run_to_end()
    decision = sim.tick()
    assert decision.requeue_after is not None
    assert not any(isinstance(a, DeleteRun) for a in decision.after_commit)
    sim.advance(120)
    sim.tick()
    assert sim.deleted


def test_history_records_transitions_and_stays_bounded() -> None:
    steps = [step(f"s{i}", *([f"s{i - 1}"] if i else [])) for i in range(40)]
    sim = Sim(make_run(steps))
    sim.run_to_end()
    history = sim.status.history or []
    assert len(history) == m.MAX_HISTORY
    assert history[-1].to_phase == m.RunPhase.SUCCEEDED and history[-1].step is None
    assert history[0].at <= history[-1].at


def test_observed_generation_follows_the_spec() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    assert sim.status.observed_generation == 1
    sim.spec_update(suspend=True)
    sim.tick()
    assert sim.status.observed_generation == 2
    cond = sim.condition("Succeeded")
    assert cond is not None and cond.observed_generation == 2


def test_events_mark_what_a_person_acts_on_and_history_keeps_every_transition() -> None:
    sim = Sim(make_run([step("a")]))
    sim.run_to_end()
    assert [r for r, _ in sim.events] == ["Succeeded"], "routine transitions post no Event"
    reasons = [t.reason for t in sim.status.history or []]
    for expected in ("Accepted", "Launching", "StepSucceeded", "Succeeded"):
        assert expected in reasons

    flaky = Sim(make_run([step("a", retry={"limit": 1}), step("gate", "a", approval="required")]))
    flaky.tick()
    flaky.finish(flaky.job_of("a").name, ok=False)
    flaky.tick()
    assert flaky.events[-1][0] == "RetryScheduled", "a failed attempt is worth an Event"
    flaky.advance(3600)
    flaky.tick()
    flaky.finish(flaky.job_of("a").name)
    flaky.tick()
    assert flaky.events[-1][0] == "ApprovalRequested"
    assert "StepSucceeded" not in [r for r, _ in flaky.events]


@pytest.mark.parametrize("phase", [m.RunPhase.SUCCEEDED, m.RunPhase.FAILED])
def test_finished_runs_never_launch_again(phase: m.RunPhase) -> None:
    sim = Sim(make_run([step("a")]))
    sim.run_to_end(lambda job: (phase == m.RunPhase.SUCCEEDED, "x"))
    assert sim.status.phase == phase
    created = sum(sim.creations.values())
    sim.jobs.clear()
    for _ in range(3):
        sim.advance(3600)
        sim.tick()
    assert sum(sim.creations.values()) == created


def test_pending_approval_expires_with_a_clear_reason() -> None:
    sim = Sim(
        make_run([step("deploy", approval="required")], policy={"approvalTimeoutSeconds": 600})
    )
    decision = sim.tick()
    assert sim.step_status("deploy").approval_requested_at == T0
    assert decision.requeue_after == 600
    sim.advance(600)
    sim.tick()
    st = sim.step_status("deploy")
    assert st.phase == SP.FAILED and st.error is not None
    assert st.error.reason == "ApprovalExpired" and "600s" in st.error.message
    assert sim.status.phase == m.RunPhase.FAILED and not sim.creations


def test_rejection_can_skip_the_step_and_let_the_rest_run() -> None:
    sim = Sim(
        make_run(
            [
                step("check"),
                step("deploy", "check", approval="required", onRejection="skipStep"),
                step("notify", "deploy"),
                step("report", "check"),
            ]
        )
    )
    sim.tick()
    sim.finish(sim.job_of("check").name)
    sim.tick()
    h = sim.step_status("deploy").args_hash or ""
    sim.spec_update(
        approvals=[
            m.Approval(
                step="deploy",
                decision=m.ApprovalDecision.REJECT,
                args_hash=h,
                by="bob",
                reason="not today",
            )
        ]
    )
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.step_status("deploy").phase == SP.SKIPPED
    assert sim.step_status("deploy").decided_by == "bob"
    assert sim.step_status("notify").phase == SP.SKIPPED
    assert sim.step_status("report").phase == SP.SUCCEEDED
    assert "skipped after a rejection" in (sim.status.message or "")
    rejected = [t for t in sim.status.history or [] if t.reason == "Rejected"]
    assert rejected and rejected[0].by == "bob"


def test_approver_is_recorded_on_the_launch() -> None:
    sim = Sim(make_run([step("deploy", approval="required")]))
    sim.tick()
    h = sim.step_status("deploy").args_hash or ""
    sim.spec_update(
        approvals=[
            m.Approval(step="deploy", decision=m.ApprovalDecision.APPROVE, args_hash=h, by="alice")
        ]
    )
    sim.tick()
    assert sim.step_status("deploy").decided_by == "alice"
    launch = [t for t in sim.status.history or [] if t.to_phase == SP.LAUNCHING]
    assert launch[-1].by == "alice" and "approved by alice" in (launch[-1].message or "")


def plain_hash(body: dict[str, Any]) -> str:
    """The args hash of a plan step that has no env, inputs or pod settings."""
    c = body["container"]
    return naming.args_hash(c["image"], c.get("command", []), c.get("args", []), [], {})


def test_carried_results_count_as_succeeded_and_do_not_run() -> None:
    a_hash = plain_hash(step("a"))
    sim = Sim(
        make_run(
            [step("a"), step("b", "a", inputs=[{"name": "A", "fromStep": "a"}])],
            carriedResults=[
                {
                    "step": "a",
                    "result": "earlier",
                    "summary": "s",
                    "fromRun": "default/old",
                    "argsHash": a_hash,
                }
            ],
        )
    )
    sim.carried_sources["a"] = CarriedSource("default/old", a_hash, sha256_text("earlier"), "s")
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    a = sim.step_status("a")
    assert a.result == "earlier" and a.attempt == 0
    assert [spec.step.name for spec in sim.created_specs.values()] == ["b"]
    assert sim.created_specs[sim.step_status("b").job_name or ""].input_env[0].value == "earlier"


def test_transitions_are_numbered_and_cancel_names_who() -> None:
    run = make_run([step("a")])
    run.metadata.annotations = {m.ANNOTATION_MODIFIED_BY: "carol"}
    sim = Sim(run)
    sim.tick()
    sim.spec_update(cancel=True)
    sim.tick()
    history = sim.status.history or []
    assert [t.seq for t in history] == list(range(1, len(history) + 1))
    assert sim.status.history_seq == len(history)
    assert history[-1].to_phase == m.RunPhase.CANCELLED and history[-1].by == "carol"


def test_history_keeps_what_the_audit_record_has_not_stored() -> None:
    from agentrun.core import Observed, reconcile

    steps = [step(f"s{i}", *([f"s{i - 1}"] if i else [])) for i in range(40)]
    sim = Sim(make_run(steps))
    sim.run_to_end()
    total = sim.status.history_seq or 0
    assert total > m.MAX_HISTORY
    run = sim.run
    # Nothing recorded yet: the ring keeps everything (up to the hard cap).
    decision = reconcile(run, Observed((), recorded_seq=0, record_name="r"), sim.now)
    assert [t.seq for t in decision.status.history or []][:1] == [(sim.status.history or [])[0].seq]
    # A status whose history was never trimmed, once all is recorded, trims to the ring.
    long = run.model_copy(deep=True)
    assert long.status is not None
    long.status.history = [
        m.Transition(at=T0, to_phase="X", reason="R", seq=i) for i in range(1, 200)
    ]
    keep = reconcile(long, Observed((), recorded_seq=10, record_name="r"), sim.now)
    assert (keep.status.history or [])[0].seq == 11
    done = reconcile(long, Observed((), recorded_seq=199, record_name="r"), sim.now)
    assert len(done.status.history or []) == m.MAX_HISTORY
    assert done.status.audit is not None and done.status.audit.recorded_seq == 199


# -- approvals cover what runs and as whom ----------------------------------------------------


def test_args_hash_covers_pod_settings_and_keeps_plain_steps_unchanged() -> None:
    args: tuple[str, list[str], list[str], list[dict[str, Any]], dict[str, str]] = (
        "img",
        ["sh"],
        ["-c", "x"],
        [{"name": "A", "value": "1"}],
        {"I": "d"},
    )
    plain = naming.args_hash(*args)
    payload = {
        "image": "img",
        "command": ["sh"],
        "args": ["-c", "x"],
        "env": ['{"name":"A","value":"1"}'],
        "inputs": {"I": "d"},
    }
    assert plain == sha256_text(naming.canonical_json(payload)), "plain steps keep their hash"
    variants = [
        naming.args_hash(*args, working_dir="/tmp"),
        naming.args_hash(*args, resources={"limits": {"cpu": "1"}}),
        naming.args_hash(*args, service_account_name="deployer"),
        naming.args_hash(*args, security_context={"runAsUser": 0}),
        naming.args_hash(*args, container_security_context={"privileged": True}),
    ]
    assert len({plain, *variants}) == 6


def test_a_step_template_change_changes_the_args_hash_of_every_step() -> None:
    sim = Sim(make_run([step("a", approval="required")]))
    sim.tick()
    before = sim.step_status("a").args_hash
    sim.spec_update(step_template=m.StepTemplate(security_context={"runAsUser": 1000}))
    sim.tick()
    after = sim.step_status("a").args_hash
    assert before and after and before != after
    changed = [t for t in sim.status.history or [] if t.reason == "ArgsChanged"]
    assert len(changed) == 1 and f"{before[:12]} -> {after[:12]}" in (changed[0].message or "")


def approve(sim: Sim, name: str, by: str = "alice") -> str:
    """Append an approval of the step's current args hash; returns the hash."""
    h = sim.step_status(name).args_hash or ""
    approval = m.Approval(step=name, decision=m.ApprovalDecision.APPROVE, args_hash=h, by=by)
    sim.spec_update(approvals=[*(sim.run.spec.approvals or []), approval])
    return h


def test_a_retry_as_another_user_needs_a_new_approval() -> None:
    sim = Sim(make_run([step("deploy", approval="required", retry={"limit": 2})]))
    sim.tick()
    first = approve(sim, "deploy")
    sim.tick()
    key = sim.step_status("deploy").idempotency_key
    sim.finish(sim.job_of("deploy").name, ok=False)
    sim.tick()
    assert sim.step_status("deploy").phase == SP.BACKING_OFF
    sim.spec_update(step_template=m.StepTemplate(security_context={"runAsUser": 0}))
    sim.advance(3600)
    sim.tick()
    st = sim.step_status("deploy")
    assert st.phase == SP.WAITING_FOR_APPROVAL and st.attempt == 1
    assert st.args_hash != first and len(sim.creations) == 1, "no retry on the old approval"
    second = approve(sim, "deploy", by="bob")
    sim.tick()
    st = sim.step_status("deploy")
    assert st.phase == SP.LAUNCHING and st.attempt == 2 and st.args_hash == second
    assert st.idempotency_key != key and second in (st.idempotency_key or "")
    assert sim.created_specs[st.job_name or ""].args_hash == second


def test_a_retry_as_a_service_account_the_run_was_not_created_with_fails() -> None:
    """A step acting as a ServiceAccount acts with its creator's rights: only the steps the run
    was created with may (agentrun.core.frozen), whoever approves."""
    sim = Sim(make_run([step("deploy", approval="required", retry={"limit": 2})]))
    sim.tick()
    approve(sim, "deploy")
    sim.tick()
    sim.finish(sim.job_of("deploy").name, ok=False)
    sim.tick()
    sim.spec_update(step_template=m.StepTemplate(service_account_name="cluster-admin"))
    sim.advance(3600)
    sim.tick()
    st = sim.step_status("deploy")
    assert st.phase == SP.FAILED and st.error is not None and st.error.reason == "Forbidden"
    assert st.error.message.startswith(
        "step deploy uses serviceaccounts/cluster-admin with the rights of the run's creator "
        "and was changed after the run started"
    ), st.error.message
    assert len(sim.creations) == 1 and sim.status.phase == m.RunPhase.FAILED


def test_a_retry_in_another_working_directory_needs_a_new_approval() -> None:
    sim = Sim(make_run([step("deploy", approval="required", retry={"limit": 1})]))
    sim.tick()
    approve(sim, "deploy")
    sim.tick()
    sim.finish(sim.job_of("deploy").name, ok=False)
    sim.tick()
    moved = step("deploy", approval="required", retry={"limit": 1})
    moved["container"]["workingDir"] = "/etc"
    sim.spec_update(plan=m.Plan.model_validate({"steps": [moved]}))
    sim.advance(3600)
    sim.tick()
    assert sim.step_status("deploy").phase == SP.WAITING_FOR_APPROVAL
    assert len(sim.creations) == 1


def test_an_intent_whose_step_changed_before_its_job_was_created_is_dropped() -> None:
    sim = Sim(make_run([step("deploy", approval="required")]))
    sim.tick()
    approved = approve(sim, "deploy")
    decision, version = sim.decide()
    assert sim.commit(decision, version)  # crash: the Job of the intent is never created
    old_job = sim.step_status("deploy").job_name
    sim.spec_update(step_template=m.StepTemplate(security_context={"runAsUser": 0}))
    decision = sim.tick()
    assert not sim.creations, "the Job must not be created from a spec nobody approved"
    st = sim.step_status("deploy")
    assert st.phase == SP.WAITING_FOR_APPROVAL and st.args_hash != approved
    assert any(t.reason == "IntentDropped" for t in sim.status.history or [])
    approve(sim, "deploy")
    sim.tick()
    st = sim.step_status("deploy")
    assert st.attempt == 2 and st.job_name != old_job and list(sim.creations) == [st.job_name]


def test_an_unchanged_intent_is_still_created_after_a_crash() -> None:
    sim = Sim(make_run([step("a")]))
    decision, version = sim.decide()
    assert sim.commit(decision, version)
    sim.spec_update(goal="another goal")  # not covered by the hash
    sim.tick()
    assert list(sim.creations) == [sim.step_status("a").job_name]


# -- carried results ---------------------------------------------------------------------------


def forked(
    steps: list[dict[str, Any]], from_step: str, approvals: list[m.Approval] | None = None
) -> tuple[Sim, Sim]:
    """Run ``steps`` to the end in a source run, then fork it at ``from_step`` the way
    ``kubectl agentrun fork`` does, with the sources the shell would read."""
    source = Sim(make_run(steps, name="old"))
    source.run_to_end(lambda job: (True, json.dumps({"ok": True, "summary": job.step})))
    plan = fork.plan(source.run, from_step, "new")
    carried = [fork.carried_result(plan, c, None) for c in plan.carry]
    new = Sim(make_run(steps, name="new", carriedResults=carried, approvals=approvals))
    for c in plan.carry:
        found = CarriedSource.from_step_status(plan.source, c.status)
        assert found is not None
        new.carried_sources[c.step] = found
    return source, new


def refusal(sim: Sim, name: str) -> str:
    found = [t for t in sim.status.history or [] if t.reason == "CarriedResultRefused"]
    mine = [t for t in found if t.step == name]
    assert len(mine) == 1, found
    return mine[0].message or ""


def test_a_fork_carries_what_its_source_committed_for_the_same_args() -> None:
    steps = [step("a"), step("b", "a", inputs=[{"name": "A", "fromStep": "a"}]), step("c", "b")]
    _, new = forked(steps, "c")
    new.run_to_end()
    assert new.status.phase == m.RunPhase.SUCCEEDED
    assert [s.step.name for s in new.created_specs.values()] == ["c"]
    assert new.step_status("b").args_hash, "a carried step shows the args it was carried for"


def test_a_carried_result_for_other_args_is_refused_and_the_step_runs() -> None:
    source = Sim(make_run([step("a")], name="old"))
    source.run_to_end()
    plan = fork.plan(source.run, "a", "new")
    entry = fork.carried_result(plan, fork.Carry("a", source.step_status("a")), None)
    changed = step("a")
    changed["container"]["args"] = ["--other"]
    sim = Sim(make_run([changed], name="new", carriedResults=[entry]))
    sim.carried_sources["a"] = CarriedSource("default/old", entry["argsHash"], None, None)
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.step_status("a").attempt == 1 and len(sim.creations) == 1
    assert "the step now has args" in refusal(sim, "a")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"argsHash": None}, "no argsHash"),
        ({"fromRun": "other-namespace/old"}, "namespace default"),
        ({"fromRun": None}, "namespace default"),
        ({"result": "forged"}, "not the result"),
        ({"summary": "forged"}, "not the result"),
        ({"resultDigest": "0" * 64}, "resultDigest is not the digest of result"),
    ],
)
def test_a_carried_result_that_is_not_what_its_source_committed_is_refused(
    change: dict[str, Any], why: str
) -> None:
    a_hash = plain_hash(step("a"))
    entry: dict[str, Any] = {
        "step": "a",
        "fromRun": "default/old",
        "argsHash": a_hash,
        "summary": "s",
        "result": "r",
    }
    entry.update(change)
    sim = Sim(make_run([step("a")], carriedResults=[entry]))
    sim.carried_sources["a"] = CarriedSource("default/old", a_hash, sha256_text("r"), "s")
    decision = sim.tick()
    st = sim.step_status("a")
    assert st.phase == SP.LAUNCHING and st.attempt == 1, "refused: the step runs instead"
    assert st.error is None and sim.status.phase == m.RunPhase.RUNNING
    assert why in refusal(sim, "a")
    assert any(
        getattr(x, "reason", "") == "CarriedResultRefused" and getattr(x, "type", "") == "Warning"
        for x in decision.after_commit
    )


def test_a_carried_result_whose_source_was_not_verified_is_refused() -> None:
    _, new = forked([step("a"), step("b", "a")], "b")
    new.carried_sources.clear()  # the shell found no such run, or it committed nothing there
    new.tick()
    assert new.step_status("a").phase == SP.LAUNCHING
    assert "default/old has no committed result" in refusal(new, "a")


def test_a_source_that_committed_other_args_is_refused() -> None:
    _, new = forked([step("a"), step("b", "a")], "b")
    source = new.carried_sources["a"]
    new.carried_sources["a"] = CarriedSource(source.run, "1" * 64, source.result_digest, None)
    new.tick()
    assert "committed it for other args" in refusal(new, "a")


def test_a_gated_step_is_carried_only_when_this_run_approves_its_args() -> None:
    steps = [step("deploy", approval="required"), step("report", "deploy")]
    source = Sim(make_run(steps, name="old"))
    source.tick()
    approve(source, "deploy")
    source.run_to_end()
    assert source.status.phase == m.RunPhase.SUCCEEDED

    def fork_with(approvals: list[m.Approval] | None) -> Sim:
        plan = fork.plan(source.run, "report", "new")
        carried = [fork.carried_result(plan, c, None) for c in plan.carry]
        sim = Sim(make_run(steps, name="new", carriedResults=carried, approvals=approvals))
        for c in plan.carry:
            found = CarriedSource.from_step_status(plan.source, c.status)
            assert found is not None
            sim.carried_sources[c.step] = found
        return sim

    unapproved = fork_with(None)
    unapproved.tick()
    assert unapproved.step_status("deploy").phase == SP.WAITING_FOR_APPROVAL
    assert "needs approval" in refusal(unapproved, "deploy") and not unapproved.creations

    h = source.step_status("deploy").args_hash or ""
    rejected = fork_with(
        [m.Approval(step="deploy", decision=m.ApprovalDecision.REJECT, args_hash=h, by="bob")]
    )
    rejected.tick()
    assert "needs approval" in refusal(rejected, "deploy")

    approved = fork_with(
        [m.Approval(step="deploy", decision=m.ApprovalDecision.APPROVE, args_hash=h, by="bob")]
    )
    approved.run_to_end()
    assert approved.status.phase == m.RunPhase.SUCCEEDED
    assert [s.step.name for s in approved.created_specs.values()] == ["report"]


def test_a_step_whose_dependency_was_refused_runs_too() -> None:
    steps = [step("a"), step("b", "a", inputs=[{"name": "A", "fromStep": "a"}]), step("c", "b")]
    _, new = forked(steps, "c")
    del new.carried_sources["a"]
    new.run_to_end()
    assert new.status.phase == m.RunPhase.SUCCEEDED
    assert "dependency a was not carried" in refusal(new, "b")
    assert [s.step.name for s in new.created_specs.values()] == ["a", "b", "c"]


# -- removing a step and adding it back -------------------------------------------------------


def test_a_step_removed_and_added_back_starts_again_as_a_new_attempt() -> None:
    steps = [step("a"), step("b")]
    sim = Sim(make_run(steps))
    sim.tick()
    first_job = sim.step_status("b").job_name
    sim.spec_update(plan=m.Plan.model_validate({"steps": steps[:1]}))
    sim.tick()
    assert sim.step_status("b").phase == SP.CANCELLED
    assert first_job is not None and sim.jobs[first_job].deleting  # held for the grace
    sim.spec_update(plan=m.Plan.model_validate({"steps": steps}))
    sim.tick()
    st = sim.step_status("b")
    assert st.phase == SP.LAUNCHING and st.attempt == 2 and st.job_name != first_job
    back = [t for t in sim.status.history or [] if t.reason == "ReAddedToPlan"]
    assert len(back) == 1 and back[0].from_phase == SP.CANCELLED
    assert back[0].to_phase == SP.PENDING and "attempt 2" in (back[0].message or "")
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED and sim.status.progress == "2/2"
    assert sim.creations[st.job_name or ""] == 1


def test_a_pending_step_removed_and_added_back_runs_once() -> None:
    steps = [step("a"), step("b", "a")]
    sim = Sim(make_run(steps))
    sim.tick()
    sim.spec_update(plan=m.Plan.model_validate({"steps": steps[:1]}))
    sim.tick()
    sim.spec_update(plan=m.Plan.model_validate({"steps": steps}))
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.step_status("b").attempt == 1 and len(sim.creations) == 2


# -- bad step output ---------------------------------------------------------------------------


def test_an_invalid_envelope_fails_the_attempt_with_the_reason() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    sim.finish(sim.job_of("a").name, True, json.dumps({"ok": True, "usage": {"tokens": -5}}))
    sim.tick()
    st = sim.step_status("a")
    assert st.phase == SP.FAILED and st.error is not None
    assert st.error.reason == "InvalidEnvelope" and "usage.tokens" in st.error.message
    assert sim.status.phase == m.RunPhase.FAILED


def test_token_counts_are_clamped_so_status_stays_writable() -> None:
    sim = Sim(make_run([step("a"), step("b")]))
    sim.tick()
    for name in ("a", "b"):
        sim.finish(
            sim.job_of(name).name, True, json.dumps({"ok": True, "usage": {"tokens": 10**30}})
        )
    sim.tick()
    usage = sim.status.usage
    assert usage is not None and usage.tokens == m.MAX_TOKENS
    assert (sim.step_status("a").usage or m.StepUsage()).tokens == m.MAX_TOKENS


def test_a_gated_step_removed_and_added_back_weaker_still_needs_approval() -> None:
    gated = step("b", "a", approval="required")
    sim = Sim(make_run([step("a"), gated]))
    sim.tick()
    assert sim.step_status("b").gated is True
    sim.spec_update(plan=m.Plan.model_validate({"steps": [step("a")]}))
    sim.tick()
    weaker = step("b", "a", approval="auto")
    sim.spec_update(plan=m.Plan.model_validate({"steps": [step("a"), weaker]}))
    with pytest.raises(AssertionError, match="WaitingForApproval"):
        sim.run_to_end()
    st = sim.step_status("b")
    assert st.phase == SP.WAITING_FOR_APPROVAL and st.gated is True
    assert "b" not in [s.step.name for s in sim.created_specs.values()]


def test_a_step_shows_running_once_its_command_has_run_a_while_and_short_ones_skip_it() -> None:
    sim = Sim(make_run([step("slow"), step("quick"), step("unstarted")]))
    sim.tick()
    sim.jobs[sim.job_of("unstarted").name].running_since = None  # its pod is still starting
    decision = sim.tick()  # the other Jobs' commands run (the sim's start when created)
    assert sim.step_status("slow").phase == m.StepPhase.LAUNCHING
    assert decision.requeue_after == sim.config.running_after_seconds
    sim.finish(sim.job_of("quick").name)
    sim.advance(sim.config.running_after_seconds * 10)
    sim.tick()
    assert sim.step_status("slow").phase == m.StepPhase.RUNNING
    # However long a pod takes to start, the step is Launching until its command runs.
    assert sim.step_status("unstarted").phase == m.StepPhase.LAUNCHING
    quick = [(t.from_phase, t.to_phase) for t in sim.status.history or [] if t.step == "quick"]
    assert (m.StepPhase.LAUNCHING, m.StepPhase.SUCCEEDED) in quick and m.StepPhase.RUNNING not in {
        p for _, p in quick
    }


def test_while_no_pod_runs_the_command_the_next_look_comes_twice_as_late() -> None:
    """A pod's start wakes no pass: a Job whose command does not run yet is looked at again
    when it has waited twice as long, and its step shows Running ``running_after_seconds``
    after its command started."""
    sim = Sim(make_run([step("slow")]))
    sim.tick()
    job = sim.jobs[sim.job_of("slow").name]
    job.running_since = None
    after = sim.config.running_after_seconds
    looks = []
    for _ in range(4):
        decision = sim.tick()
        assert decision.requeue_after is not None
        looks.append(decision.requeue_after)
        sim.advance(decision.requeue_after)
    assert looks == [after, after, 2 * after, 4 * after]
    assert sim.step_status("slow").phase == m.StepPhase.LAUNCHING
    job.running_since = sim.now
    assert sim.tick().requeue_after == after
    sim.advance(after)
    sim.tick()
    assert sim.step_status("slow").phase == m.StepPhase.RUNNING


def test_a_launching_job_that_vanished_is_lost_and_one_never_seen_is_created_again() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    name = sim.job_of("a").name
    del sim.jobs[name]
    observed = sim.observed()
    again = reconcile(sim.run, dataclasses.replace(observed, vanished=frozenset()), sim.now)
    assert [a.job_name for a in again.after_commit if isinstance(a, CreateJob)] == [name]
    lost = reconcile(sim.run, observed, sim.now)
    st = next(s for s in lost.status.steps or [] if s.name == "a")
    assert st.error is not None and st.error.reason == "JobLost"
    assert not [a for a in lost.after_commit if isinstance(a, CreateJob)]


def _with_pod_to_start(sim: Sim, job_name: str) -> Observed:
    observed = sim.observed()
    jobs = tuple(
        dataclasses.replace(j, start_pod=PodRef("p-1", "uid-p-1")) if j.name == job_name else j
        for j in observed.jobs
    )
    return dataclasses.replace(observed, jobs=jobs)


def test_the_one_pod_of_a_running_attempt_is_let_start() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    name = sim.step_status("a").job_name
    assert name is not None
    decision = reconcile(sim.run, _with_pod_to_start(sim, name), sim.now, sim.config)
    assert StartPod(name, PodRef("p-1", "uid-p-1")) in decision.after_commit
    # Nothing observed to start: nothing let go.
    assert not any(isinstance(a, StartPod) for a in sim.decide()[0].after_commit)


def test_no_pod_of_a_job_being_deleted_is_let_start() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    name = sim.step_status("a").job_name
    assert name is not None
    sim.spec_update(cancel=True)
    decision = reconcile(sim.run, _with_pod_to_start(sim, name), sim.now, sim.config)
    assert any(isinstance(a, DeleteJob) and a.job_name == name for a in decision.after_commit)
    assert not any(isinstance(a, StartPod) for a in decision.after_commit)
