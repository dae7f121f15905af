"""Only the steps a run was created with use its creator's rights (agentrun.core.frozen).

The operator checks what a step reads (Secrets, ConfigMaps in env) and as whom it runs (the
run's ServiceAccount) against the rights of the run's creator. A step someone else added or
changed would borrow them: an editor who may not read a Secret the creator may read could
have a step print it. So the operator's first pass records each plan step's container and the
run's ServiceAccount (``status.steps[].frozen``), and a step that uses the creator's rights
launches only while it is as recorded; a step added later, or changed, fails before any Job
(reason Forbidden). The admission policy refuses such a change by anyone but the creator too
(rule l); this holds without it.
"""

from __future__ import annotations

from typing import Any

from agentrun.api import models as m
from agentrun.core import frozen
from tests.support.sim import Sim, make_run, step

SP = m.StepPhase
SECRET_ENV = {"name": "S", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}


def _reads_secret(name: str, script: str = "echo hi", *deps: str) -> dict[str, Any]:
    body = step(name, *deps)
    body["container"]["command"] = ["sh", "-c", script]
    body["container"]["env"] = [SECRET_ENV]
    return body


def _plan(*steps: dict[str, Any]) -> m.Plan:
    return m.Plan.model_validate({"steps": list(steps)})


def test_the_first_pass_records_every_plan_step() -> None:
    sim = Sim(make_run([_reads_secret("a"), step("b", "a")]))
    sim.tick()
    for st in sim.status.steps or []:
        spec = next(s for s in sim.run.spec.plan.steps if s.name == st.name)
        assert st.frozen == frozen.step_digest(sim.run, spec)
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED


def test_a_step_added_later_that_reads_a_secret_fails_before_any_job() -> None:
    sim = Sim(make_run([step("wait"), step("b", "wait")]))
    sim.tick()
    annotations = {m.ANNOTATION_MODIFIED_BY: "mallory"}
    sim.run = sim.run.model_copy(
        update={"metadata": sim.run.metadata.model_copy(update={"annotations": annotations})}
    )
    leak = _reads_secret("leak", 'echo "$S"')
    sim.spec_update(plan=_plan(*[s.model_dump(by_alias=True) for s in sim.run.spec.plan.steps],
                               leak))  # fmt: skip
    sim.tick()
    st = sim.step_status("leak")
    assert st.frozen == frozen.ADDED
    assert st.phase == SP.FAILED and st.error is not None and st.error.reason == "Forbidden"
    assert st.error.message == (
        "step leak uses secrets/db with the rights of the run's creator and was added to the "
        "plan after the run started (spec last changed by mallory): only the steps the run was "
        "created with may use its creator's rights; create a new run"
    )
    assert not any(j.step == "leak" for j in sim.jobs.values())


def test_a_step_that_reads_a_secret_changed_later_fails_and_one_that_reads_none_runs() -> None:
    sim = Sim(make_run([step("first"), _reads_secret("uses", "echo hi", "first")]))
    sim.tick()
    changed = _reads_secret("uses", 'echo "$S"', "first")
    sim.spec_update(plan=_plan(step("first"), changed))
    sim.run_to_end()
    st = sim.step_status("uses")
    assert st.phase == SP.FAILED and st.error is not None and st.error.reason == "Forbidden"
    assert "was changed after the run started" in (st.error.message or "")
    assert not any(j.step == "uses" for j in sim.jobs.values())

    # A step that uses nothing of the creator's may be added (or changed) by anyone.
    sim = Sim(make_run([step("first")]))
    sim.tick()
    sim.spec_update(plan=_plan(step("first"), step("plain", "first")))
    sim.run_to_end()
    assert sim.step_status("plain").frozen == frozen.ADDED
    assert sim.status.phase == m.RunPhase.SUCCEEDED


def test_a_run_recorded_before_the_check_is_not_refused() -> None:
    """frozen None: the status of an operator from before; its steps are not checked."""
    run = make_run([_reads_secret("a")])
    refused = frozen.step_refusal(run, run.spec.plan.steps[0], None)
    assert refused is None
    assert frozen.step_refusal(run, run.spec.plan.steps[0], "0" * 32) is not None


def test_what_a_step_uses_of_its_creators_rights() -> None:
    cm = {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}
    body = _reads_secret("a")
    body["container"]["env"].append(cm)
    run = make_run([body, step("b")], stepTemplate={"serviceAccountName": "deployer"})
    a, b = run.spec.plan.steps
    assert frozen.lends(run, a) == ["configmaps/cfg", "secrets/db", "serviceaccounts/deployer"]
    assert frozen.lends(run, b) == ["serviceaccounts/deployer"]
    assert frozen.lends(make_run([step("b")]), b) == []
