"""A Job the API server refuses (invalid, forbidden) fails its attempt, reason JobRefused, with
the API's message and a Warning Event; the step's retry policy applies, so retries end."""

from __future__ import annotations

from agentrun.api import models as m
from agentrun.core import EmitEvent, Observed
from tests.support.sim import Sim, make_run, step

SP = m.StepPhase


def _refused_job(sim: Sim, message: str) -> None:
    """The shell's part: the create of every Launching attempt's Job is refused."""
    launching = {st.job_name for st in sim.status.steps or [] if st.phase == SP.LAUNCHING}
    for name in launching:
        assert name is not None
        sim.jobs.pop(name, None)
    sim.observed = lambda: Observed(  # type: ignore[method-assign]
        tuple(Sim.observed(sim).jobs), job_refusals={n: message for n in launching if n}
    )


def test_a_job_the_api_refuses_fails_the_attempt_with_the_apis_message() -> None:
    sim = Sim(make_run([step("bad")]))
    sim.tick()
    message = 'Job.batch "x" is invalid: spec.template.spec.containers[0].resources.requests'
    _refused_job(sim, message)
    decision = sim.tick()
    bad = sim.step_status("bad")
    assert bad.phase == SP.FAILED and bad.error is not None
    assert bad.error.reason == "JobRefused" and bad.error.message == message
    assert sim.status.phase == m.RunPhase.FAILED
    assert any(
        isinstance(a, EmitEvent) and a.type == "Warning" and a.reason == "JobRefused"
        for a in decision.after_commit
    )


def test_a_refused_job_counts_as_a_failed_attempt_and_retries_end() -> None:
    retry = {"limit": 2, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
    sim = Sim(make_run([step("bad", retry=retry)]))
    names = []
    for attempt in (1, 2, 3):
        sim.tick()
        assert sim.step_status("bad").phase == SP.LAUNCHING
        names.append(sim.step_status("bad").job_name)
        _refused_job(sim, "invalid")
        decision = sim.tick()
        assert any(
            isinstance(a, EmitEvent) and a.type == "Warning" and a.reason == "JobRefused"
            for a in decision.after_commit
        ), f"attempt {attempt} was refused without a Warning Event"
        expected = SP.BACKING_OFF if attempt < 3 else SP.FAILED
        assert sim.step_status("bad").phase == expected
        sim.advance(2)
    bad = sim.step_status("bad")
    assert bad.attempt == 3 and len(set(names)) == 3
    assert bad.error is not None and bad.error.reason == "JobRefused"
    sim.advance(60)
    sim.tick()
    assert sim.step_status("bad").attempt == 3, "retries ended"
