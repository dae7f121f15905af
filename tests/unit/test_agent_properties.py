"""Property-based tests of the agent loop: random model outputs, tool outcomes, approvals and
budgets, through random orders of events, duplicated events, crashes between commit and
action, stale writers and a stalled second operator.

After every event: no Job is created twice, no tool call or model turn runs again once it
succeeded, a gated tool's call never starts without an approval of its exact arguments, a
transcript record or context is never rewritten, every call the model made is answered exactly
once in the next context, the next turn's request is one a strict server takes (the scripted
model's check), and the status stays bounded and valid against the CRD's status schema. A third
of ``AGENTRUN_HYPOTHESIS_EXAMPLES`` examples: each checks the schema after every event.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import CreateJob
from agentrun.core import context as cx
from agentrun_devcluster.modelserver import check_request
from tests.support.agent_sim import (
    RESTART,
    SEARCH,
    AgentSim,
    agent_run,
    call,
    tool_envelope,
    turn_envelope,
)
from tests.support.passes import FAULTS, Passes, assert_approved
from tests.support.schema import VALIDATOR

SP = m.StepPhase
EXAMPLES = int(os.environ.get("AGENTRUN_HYPOTHESIS_EXAMPLES", "300"))
STATUS_BOUND = 64 * 1024
_SCHEMA = VALIDATOR.schema
assert isinstance(_SCHEMA, dict)
STATUS_VALIDATOR = VALIDATOR.evolve(schema=_SCHEMA["properties"]["status"])
"""The status schema of the CRD: what the API server would accept."""


@st.composite
def runs(draw: st.DrawFn) -> m.AgentRun:
    agent: dict[str, Any] = {
        "maxTurns": draw(st.integers(1, 6)),
        "maxToolCallsPerTurn": draw(st.integers(1, 3)),
        "contextBytes": draw(st.sampled_from([a.MIN_CONTEXT_BYTES, 16384, 65536])),
    }
    model: dict[str, Any] = {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"}
    if draw(st.booleans()):
        model["retry"] = {"limit": draw(st.integers(1, 2)), "backoff": {"initialSeconds": 1}}
    model["maxOutputTokens"] = draw(st.sampled_from([50, 500]))
    spec: dict[str, Any] = {}
    if draw(st.integers(0, 2)) == 0:
        spec["budget"] = {"maxTokens": draw(st.integers(600, 3000))}
    plan = []
    if draw(st.integers(0, 3)) == 0:
        plan = [{"name": "gather", "container": {"image": "busybox", "command": ["gather"]}}]
    return agent_run(tools=[SEARCH, RESTART], plan=plan, model=model, spec=spec, **agent)


def _calls(seed: int) -> list[cx.ToolCall]:
    n = seed % 4
    found = []
    for i in range(n):
        kind = (seed // (i + 2)) % 6
        if kind == 0:
            found.append(call("nope", {}, f"c{seed}-{i}"))
        elif kind == 1:
            found.append(call("search", {"limit": 0}, f"c{seed}-{i}"))
        elif kind == 2:
            found.append(call("restart", {"service": f"svc{seed % 3}"}, f"c{seed}-{i}"))
        elif kind == 3 and seed % 2:  # cut off at the output limit
            found.append(call("search", '{"query": "q', f"c{seed}-{i}"))
        else:
            found.append(call("search", {"query": f"q{seed % 7}"}, f"c{seed}-{i}"))
    return found


def _model_output(seed: int, final: bool = False) -> tuple[bool, str]:
    if seed % 11 == 0 and not final:
        return False, "the model endpoint cannot be reached"
    calls = [] if final else _calls(seed)
    return True, turn_envelope(f"turn text {seed}", calls, prompt=seed % 300, completion=20)


def _tool_output(seed: int) -> tuple[bool, str]:
    if seed % 5 == 0:
        return False, f"tool failed {seed}"
    if seed % 7 == 0:
        return True, tool_envelope("z" * (300 + seed % 2000), f"big {seed}")
    return True, tool_envelope(f"result {seed}", f"summary {seed}")


class Checker:
    def __init__(self, sim: AgentSim) -> None:
        self.sim = sim
        self.succeeded: set[str] = set()
        self.max_size = 0

    def check_creates(self, action: CreateJob) -> None:
        sim = self.sim
        if action.job_name in sim.jobs:
            return
        name = action.step.name
        assert name not in self.succeeded, f"{name} launched again after it succeeded"
        assert_approved(sim, action, "gated call")

    def after_event(self) -> None:
        sim = self.sim
        assert all(n == 1 for n in sim.creations.values()), f"duplicate Job: {sim.creations}"
        status = sim.run.status
        if status is None:
            return
        wire = status.to_wire()
        size = len(json.dumps(wire))
        self.max_size = max(self.max_size, size)
        assert size < STATUS_BOUND
        errors = list(STATUS_VALIDATOR.iter_errors(wire))
        assert not errors, f"status the API server would refuse: {errors[0].message}"
        for st_ in status.steps or []:
            if st_.phase == SP.SUCCEEDED:
                self.succeeded.add(st_.name)
        for job in sim.jobs.values():
            if job.state.value == "Succeeded":
                self.succeeded.add(job.step)
        ag = status.agent
        if ag is not None and ag.context is not None and ag.context.name in sim.records:
            ctx = sim.context()
            called = [c["id"] for msg in ctx.messages for c in msg.get("tool_calls") or []]
            answered = [msg["tool_call_id"] for msg in ctx.messages if msg["role"] == "tool"]
            assert sorted(called) == sorted(answered), "a call is not answered exactly once"
            refusal = check_request(sim.request())
            assert refusal is None, f"a server would refuse the next turn: {refusal}"


def _execute(sim: AgentSim, checker: Checker, actions: Any) -> None:
    for action in actions:
        if isinstance(action, CreateJob):
            checker.check_creates(action)
        sim.apply(action)


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "tick",
                "tick",
                "tick",
                "model",
                "model",
                "tool",
                "tool",
                "tool",
                "advance",
                *FAULTS,
                "approve",
                "raise_budget",
                "lose_job",
            ]
        ),
        st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=120,
)


def _finish_one(sim: AgentSim, seed: int, model: bool) -> None:
    jobs = [sim.model_job()] if model else sim.tool_jobs()
    if model and sim.model_job() is None:
        jobs = [j for j in sim.active() if j.step == "gather"]
    jobs = [j for j in jobs if j is not None]
    if not jobs:
        return
    job = jobs[seed % len(jobs)]
    if job.step.endswith("-model"):
        ok, message = _model_output(seed)
    else:
        ok, message = _tool_output(seed)
    sim.finish(job.name, ok, message)


def _approve(sim: AgentSim, seed: int) -> None:
    waiting = [
        s
        for s in (sim.run.status.steps if sim.run.status else None) or []
        if s.phase == SP.WAITING_FOR_APPROVAL and s.args_hash
    ]
    if not waiting:
        return
    target = waiting[seed % len(waiting)]
    decision = m.ApprovalDecision.REJECT if seed % 4 == 0 else m.ApprovalDecision.APPROVE
    approvals = [
        *(sim.run.spec.approvals or []),
        m.Approval(step=target.name, decision=decision, args_hash=target.args_hash or "", by="al"),
    ]
    sim.spec_update(approvals=approvals[-m.MAX_APPROVALS :])


def _raise_budget(sim: AgentSim) -> None:
    budget = sim.run.spec.budget
    if budget is not None and budget.max_tokens is not None:
        sim.spec_update(budget=budget.model_copy(update={"max_tokens": budget.max_tokens + 2000}))


def _run_events(sim: AgentSim, checker: Checker, events: list[tuple[str, int]]) -> None:
    passes = Passes(sim, lambda actions: _execute(sim, checker, actions))
    for kind, seed in events:
        if passes.handle(kind, seed):
            pass  # a pass of the operator, or a stalled one resuming
        elif kind in ("model", "tool"):
            _finish_one(sim, seed, kind == "model")
        elif kind == "advance":
            passes.resume()
            sim.advance(seed % 90)
        elif kind == "approve":
            _approve(sim, seed)
        elif kind == "raise_budget":
            _raise_budget(sim)
        elif kind == "lose_job" and sim.active() and seed % 4 == 0:
            sim.lose(sim.active()[seed % len(sim.active())].name)
        checker.after_event()
    passes.resume()
    checker.after_event()


def _drive_to_end(sim: AgentSim, checker: Checker) -> None:
    """Fair scheduling: approve what waits, raise a budget that pauses, finish what runs;
    after a few turns the model answers."""
    for i in range(400):
        decision = sim.tick()
        checker.after_event()
        if sim.status.phase in m.TERMINAL_RUN_PHASES:
            return
        ag = sim.status.agent
        if ag is not None and ag.stage == agent_status.AgentStage.PAUSED:
            _raise_budget(sim)
        _approve(sim, i * 5 + 1)  # never a multiple of 4: approve
        for job in sim.active():
            if job.step.endswith("-model"):
                final = ag is not None and ag.turn >= 3
                sim.finish(job.name, *_model_output(i * 7 + 1, final=final))
            elif job.step == "gather":
                sim.finish(job.name, True, tool_envelope("gathered"))
            else:
                sim.finish(job.name, *_tool_output(i))
        if decision.requeue_after and not sim.active():
            sim.advance(decision.requeue_after)
    raise AssertionError(f"run never ended: {sim.status.phase}: {sim.status.message}")


@settings(
    max_examples=max(EXAMPLES // 3, 1), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(run=runs(), events=EVENTS)
def test_the_loop_keeps_its_invariants_under_any_order_of_events(
    run: m.AgentRun, events: list[tuple[str, int]]
) -> None:
    sim = AgentSim(run)
    checker = Checker(sim)
    _run_events(sim, checker, events)
    _drive_to_end(sim, checker)
    status = sim.status
    assert status.phase in m.TERMINAL_RUN_PHASES
    for s in status.steps or []:
        assert s.phase in m.TERMINAL_STEP_PHASES, f"{s.name} left in {s.phase}"
    ag = status.agent
    if status.phase == m.RunPhase.SUCCEEDED:
        assert ag is not None and ag.stage == agent_status.AgentStage.ANSWERED
        assert ag.answer is not None or ag.answer_ref is not None
    elif ag is not None:
        assert ag.stage == agent_status.AgentStage.STOPPED
    turns = [r["turn"] for r in sim.transcript()]
    assert turns == sorted(set(turns)), "a turn was recorded twice"
