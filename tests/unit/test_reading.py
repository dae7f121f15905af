"""Reading a run as the typed client and the plugin both read it: a step's result or the
answer, the history from the audit record, waiting for a phase. The API calls are fakes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.access import audit
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.clients import reading
from agentrun.core import naming
from agentrun.execution import objects
from tests.support.sim import Sim, make_run, step

BIG = "x" * (m.MAX_INLINE_RESULT + 100)


def finished() -> Sim:
    """small (inline) -> large (kept in a ConfigMap) -> failing (no result)."""
    sim = Sim(make_run([step("small"), step("large", "small"), step("failing", "large")]))

    def outcome(job: Any) -> tuple[bool, str]:
        if job.step == "large":
            return True, json.dumps({"ok": True, "summary": "large", "result": BIG})
        return job.step == "small", f"{job.step} out"

    sim.run_to_end(outcome)
    return sim


def config_maps(sim: Sim) -> reading.GetConfigMap:
    def get(name: str) -> dict[str, Any] | None:
        data = sim.results.get(name)
        return None if data is None else {"metadata": {"name": name}, "data": dict(data)}

    return get


def refusing(status: int) -> reading.GetConfigMap:
    def get(name: str) -> dict[str, Any] | None:
        raise ApiException(status=status, reason="x", body=json.dumps({"message": "no, thanks"}))

    return get


def test_a_result_is_read_inline_or_from_its_config_map_with_its_digest() -> None:
    sim = finished()
    small = reading.step_result(sim.run, "small", config_maps(sim))
    assert (small.content, small.ref) == ("small out", None) and small.intact
    large = reading.step_result(sim.run, "large", config_maps(sim))
    assert large.content == BIG and large.intact
    assert large.ref == sim.step_status("large").result_ref
    assert large.digest == naming.sha256_text(BIG)
    changed = reading.Stored("forged", large.digest, large.ref)
    assert not changed.intact
    assert reading.Stored("anything", None).intact  # committed without a digest


def test_a_step_without_a_result_says_where_it_stands() -> None:
    sim = finished()
    with pytest.raises(reading.NotAStep) as unknown:
        reading.step_result(sim.run, "nope", config_maps(sim))
    assert unknown.value.steps == ["small", "large", "failing"]
    assert str(unknown.value) == (
        "step 'nope' is not a step of agentrun/demo in namespace 'default' "
        "(its steps: small, large, failing)"
    )
    with pytest.raises(reading.NoResult) as none:
        reading.step_result(sim.run, "failing", config_maps(sim))
    assert none.value.phase in {str(p) for p in m.StepPhase}
    assert str(none.value).startswith("step 'failing' of agentrun/demo has no result (phase ")
    fresh = make_run([step("a")])
    with pytest.raises(reading.NoResult, match=r"\(phase not evaluated yet\)$"):
        reading.step_result(fresh, "a", config_maps(sim))


def test_a_result_kept_in_a_config_map_that_is_gone_or_refused_says_so() -> None:
    sim = finished()
    ref = sim.step_status("large").result_ref
    assert ref is not None
    where = f"ConfigMap '{ref.name}' (key {ref.key})"
    with pytest.raises(reading.Unreadable) as gone:
        reading.step_result(sim.run, "large", lambda name: None)
    assert gone.value.status == 404
    assert str(gone.value) == (
        f"the result of step 'large' of agentrun/demo is kept in {where}, which does not "
        "exist in namespace 'default'"
    )
    with pytest.raises(reading.Unreadable) as refused:
        reading.step_result(sim.run, "large", refusing(403))
    assert refused.value.status == 403
    assert str(refused.value) == f"cannot read the result of step 'large' from {where}: no, thanks"
    with pytest.raises(reading.Unreadable, match=rf"has no key '{ref.key}' \(keys: other\)"):
        reading.step_result(sim.run, "large", lambda name: {"data": {"other": "x"}})


def test_the_answer_of_an_agent_run_or_why_there_is_none() -> None:
    run = make_run([step("a")])
    with pytest.raises(reading.Unreadable, match=r"^agentrun/demo has no answer \(yet\): phase"):
        reading.answer(run, lambda name: None)
    answered = run.model_copy(
        update={
            "status": m.AgentRunStatus(
                phase=m.RunPhase.SUCCEEDED,
                agent=agent_status.AgentStatus(answer="42", answer_digest=naming.sha256_text("42")),
            )
        }
    )
    stored = reading.answer(answered, lambda name: None)
    assert (stored.content, stored.intact) == ("42", True)


def test_the_history_is_the_record_then_what_only_status_holds() -> None:
    sim = finished()
    run = sim.run
    transitions = sim.status.history or []
    assert len(transitions) > 3
    entries = audit.extend(
        [t for t in transitions if t.seq <= 3], 0, audit.genesis(run.metadata.uid)
    )
    prefix = audit.record_prefix(run.metadata.name, run.metadata.uid)
    data = {audit.key(int(e["seq"])): naming.canonical_json(e) for e in entries}
    chunk = objects.audit_config_map(objects.RunRef.of(run), audit.chunk_name(prefix, 1), data)
    imitation = {"metadata": {"name": f"{prefix}-2"}, "data": {}}
    selectors: list[str] = []
    reads: list[int] = []

    def read() -> m.AgentRun:
        reads.append(1)
        return run

    def listed(selector: str) -> list[dict[str, Any]]:
        selectors.append(selector)
        return [chunk, imitation]

    told = reading.history(read, listed)
    assert len(reads) == 2  # again after the record
    assert selectors == [objects.owned_by(run.metadata.uid, "audit")]
    assert told.record == entries
    assert told.ignored == [(f"{prefix}-2", "it is not owned by the run")]
    assert [e["seq"] for e in told.timeline] == [t.seq for t in transitions]
    assert told.problems() == []
    assert [e["seq"] for e in reading.history(read, lambda s: []).timeline] == [
        t.seq for t in transitions
    ]


def test_a_wait_ends_at_a_phase_asked_for_at_the_end_of_the_run_or_when_time_is_up() -> None:
    run = make_run([step("a")])

    def in_phase(phase: m.RunPhase | None) -> m.AgentRun:
        return run.model_copy(update={"status": m.AgentRunStatus(phase=phase)})

    phases = iter([None, m.RunPhase.RUNNING, m.RunPhase.WAITING_FOR_APPROVAL])
    waited = reading.wait(
        lambda: in_phase(next(phases)), {m.RunPhase.WAITING_FOR_APPROVAL}, 30, 0.001
    )
    assert (waited.phase, waited.timed_out) == (m.RunPhase.WAITING_FOR_APPROVAL, False)
    failed = reading.wait(lambda: in_phase(m.RunPhase.FAILED), {m.RunPhase.RUNNING}, 30, 0.001)
    assert (failed.phase, failed.timed_out) == (m.RunPhase.FAILED, False)
    stuck = reading.wait(lambda: in_phase(m.RunPhase.RUNNING), m.TERMINAL_RUN_PHASES, 0.01, 0.001)
    assert (stuck.phase, stuck.timed_out) == (m.RunPhase.RUNNING, True)
