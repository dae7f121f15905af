"""What the operator makes of a model turn that failed, or whose endpoint reported no usage
(docs/agent.md, "When a turn fails" and "Budgets"): each failure of ``agentrun step llm`` keeps
its own reason on the step, its events and the run; usage the endpoint did not report is
counted as estimated, and said on the run with a Warning."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentrun.api import agent_status, names
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_budget
from agentrun.core import context as cx
from agentrun.core.actions import EmitEvent
from tests.support.agent_sim import AgentSim, agent_run, call, tool_envelope
from tests.support.sim import Sim

ONCE = {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"}
RETRIED = {**ONCE, "retry": {"limit": 1, "backoff": {"initialSeconds": 5}}}


class WarningsSim(AgentSim):
    """An AgentSim that also keeps the type of every Event posted."""

    warnings: list[tuple[str, str]]

    def apply(self, action: object) -> None:
        if isinstance(action, EmitEvent) and action.type == "Warning":
            self.warnings.append((action.reason, action.message))
        super().apply(action)


def _sim(run: m.AgentRun) -> WarningsSim:
    sim = WarningsSim(run)
    sim.warnings = []
    return sim


def _fail_model_turn(sim: AgentSim, message: str) -> None:
    sim.settle()
    job = next(j for j in sim.jobs.values() if j.step == "t1-model" and j.state.name == "ACTIVE")
    sim.finish(job.name, False, message)
    sim.settle()


def _condition(sim: Sim) -> m.Condition:
    return next(c for c in sim.status.conditions or [] if c.type == "Succeeded")


@pytest.mark.parametrize("reason", names.TURN_FAILURES)
def test_a_failed_turn_keeps_its_own_reason_on_the_step_the_events_and_the_run(
    reason: str,
) -> None:
    """``agentrun step llm`` begins the one line it fails with with its reason: the attempt,
    its retry, the step and the run carry that reason (not Error), and the message says what
    was wrong, without the reason again or an exit code that adds nothing."""
    said = "the model endpoint http://127.0.0.1:9/v1 said something: do this"
    sim = _sim(agent_run(model=RETRIED))
    _fail_model_turn(sim, f"{reason}: {said}")
    st = sim.step_status("t1-model")
    assert st.phase == SP.BACKING_OFF and st.error is not None
    assert (st.error.reason, st.error.message, st.error.exit_code) == (reason, said, 1)
    (retry,) = [t for t in sim.status.history or [] if t.reason == "RetryScheduled"]
    assert f"attempt 1 failed ({reason}: {said})" in (retry.message or "")
    sim.advance(10)
    _fail_model_turn(sim, f"{reason}: {said}")
    assert sim.status.phase == m.RunPhase.FAILED
    condition = _condition(sim)
    assert condition.reason == reason
    assert condition.message == f"step t1-model failed: {reason}: {said} (after 2 attempts)"
    assert (reason, f"step t1-model: {reason}: {said} (after 2 attempts)") in sim.warnings


@pytest.mark.parametrize(
    "message",
    [
        "the model endpoint http://127.0.0.1:9/v1 cannot be reached",  # an older image's line
        "NoSuchReason: the model endpoint http://127.0.0.1:9/v1 cannot be reached",
        "ModelTimeout:",  # a reason and nothing said
    ],
)
def test_a_turn_line_without_a_known_reason_stays_error(message: str) -> None:
    sim = _sim(agent_run(model=ONCE))
    _fail_model_turn(sim, message)
    assert _condition(sim).reason == "Error"
    assert f"exit code 1: {message}" in (_condition(sim).message or "")


def test_a_plan_step_cannot_take_a_model_turns_reason() -> None:
    """A plan step's container writes its own termination message: a line that begins with a
    model turn's reason is its text, not a reason the operator takes."""
    step = {"name": "probe", "container": {"image": "busybox:1.36", "command": ["probe"]}}
    sim = _sim(agent_run(plan=[step]))
    sim.settle()
    (job,) = sim.jobs.values()
    sim.finish(job.name, False, "ModelTimeout: the model endpoint did not answer")
    sim.settle()
    error = sim.step_status("probe").error
    assert error is not None and error.reason == "Error"
    assert _condition(sim).reason == "Error"


def _turn_envelope(
    content: str,
    calls: tuple[cx.ToolCall, ...],
    prompt: int,
    completion: int,
    unreported: tuple[str, ...],
) -> str:
    """A model turn's termination message as ``agentrun step llm`` writes it when the endpoint
    left ``unreported`` out of its usage (those counts are its estimates)."""
    output = cx.Output(
        content=content,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
        prompt_tokens=prompt,
        completion_tokens=completion,
        unreported=unreported,
    )
    body: dict[str, Any] = {
        "ok": True,
        "summary": cx.output_summary(output),
        "result": cx.output_result(output),
        "usage": {"tokens": prompt + completion},
    }
    return json.dumps(body)


def _answer(sim: AgentSim, envelope: str) -> None:
    sim.settle()
    job = next(
        j for j in sim.jobs.values() if j.step.endswith("-model") and j.state.name == "ACTIVE"
    )
    sim.finish(job.name, True, envelope)
    sim.settle()


def test_usage_the_endpoint_did_not_report_is_counted_as_estimated_with_a_warning() -> None:
    """A turn whose endpoint reported no usage costs the budget what ``agentrun step llm``
    estimated (not 0), and the run says so: a transition and a Warning Event
    UsageNotReported naming the turn and the numbers, ``status.agent.unreportedUsageTurns``,
    and ``usageEstimated`` in the turn's transcript record."""
    sim = _sim(agent_run(model=ONCE, spec={"budget": {"maxTokens": 100_000}}))
    both = ("prompt_tokens", "completion_tokens")
    _answer(sim, _turn_envelope("", (call("search", {"query": "x"}, "c1"),), 812, 40, both))
    assert sim.status.usage is not None and sim.status.usage.tokens == 852
    assert (sim.agent.prompt_tokens, sim.agent.completion_tokens) == (812, 40)
    assert sim.agent.unreported_usage_turns == 1
    (noted,) = [t for t in sim.status.history or [] if t.reason == agent_budget.USAGE_NOT_REPORTED]
    said = (
        "turn 1: the model endpoint reported no usage; counted as estimated at 4 bytes a token "
        "instead (812 prompt + 40 completion tokens against budget.maxTokens)"
    )
    assert (noted.step, noted.message) == ("t1-model", said)
    assert (agent_budget.USAGE_NOT_REPORTED, said) in sim.warnings
    sim.tools_return(lambda job: (True, tool_envelope("found it")))
    assert sim.transcript()[0]["usageEstimated"] == list(both)
    # Turn 2 reports its usage: counted as reported, nothing said.
    _answer(sim, _turn_envelope("done", (), 300, 20, ()))
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.status.usage.tokens == 852 + 320
    assert sim.agent.unreported_usage_turns == 1
    assert [r for r, _ in sim.warnings].count(agent_budget.USAGE_NOT_REPORTED) == 1
    assert "usageEstimated" not in sim.transcript()[1]


def test_a_count_left_out_of_the_usage_is_named() -> None:
    sim = _sim(agent_run(model=ONCE))
    _answer(sim, _turn_envelope("done", (), 120, 3, ("completion_tokens",)))
    assert sim.agent.stage == agent_status.AgentStage.ANSWERED
    (noted,) = [t for t in sim.status.history or [] if t.reason == agent_budget.USAGE_NOT_REPORTED]
    assert (noted.message or "").startswith(
        "turn 1: the model endpoint reported no usage.completion_tokens; counted as estimated"
    )
    assert sim.status.usage is not None and sim.status.usage.tokens == 123


def test_the_docs_say_what_each_reason_means_and_what_to_do() -> None:
    """docs/agent.md's table of a failed turn's reasons names each reason the pod may fail
    with, and no other."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    section = text.split("## When a model turn fails", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z0-9]+)` \| (.+) \| (.+) \|$", section, re.MULTILINE)
    assert [reason for reason, _, _ in rows] == list(names.TURN_FAILURES)
    assert all(what.strip() and todo.strip() for _, what, todo in rows)
