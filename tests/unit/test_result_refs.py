"""Results by reference: a step may reference only its own result object, and an input by
reference is passed on only as the content committed for it (owner uid and digest)."""

from __future__ import annotations

import copy
import json
from typing import Any
from unittest import mock

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import CreateJob, EmitEvent, StoreResult, naming
from agentrun.core.envelope import result_object_data
from agentrun.core.machine import committed_launch
from agentrun.execution import inputs, objects, proof
from agentrun.loop.act import Actor
from agentrun.loop.common import Apis
from tests.support.sim import Sim, make_run, step

SP = m.StepPhase
ROWS = "x" * 5000
KEY = bytes(32)
"""The operator's key in these tests (the Actor's observer hands it out)."""


def _sim() -> Sim:
    consume = step("b", "a", inputs=[{"name": "ROWS", "fromStep": "a", "key": "rows"}])
    return Sim(make_run([step("a"), consume]))


def _own_name(sim: Sim, step_name: str = "a", attempt: int = 1) -> str:
    meta = sim.run.metadata
    return naming.result_object_name(meta.name, meta.uid, step_name, attempt)


def _by_reference(name: str, digest: str | None = "d" * 64, key: str = "result") -> str:
    envelope: dict[str, Any] = {"ok": True, "summary": "s", "resultRef": {"name": name, "key": key}}
    if digest is not None:
        envelope["resultDigest"] = digest
    return json.dumps(envelope)


@pytest.mark.parametrize(
    ("ref", "key", "digest", "why"),
    [
        ("team-config", "token", "d" * 64, "not the step's own result object"),
        ("own", "token", "d" * 64, "not the step's own result object"),
        ("own-attempt-2", "result", "d" * 64, "not the step's own result object"),
        ("own", "result", None, "without a resultDigest"),
    ],
    ids=["foreign", "other-key", "later-attempt", "no-digest"],
)
def test_a_result_ref_to_anything_but_the_steps_own_result_fails_closed(
    ref: str, key: str, digest: str | None, why: str
) -> None:
    sim = _sim()
    sim.tick()
    names = {"own": _own_name(sim), "own-attempt-2": _own_name(sim, attempt=2)}
    sim.finish(sim.job_of("a").name, message=_by_reference(names.get(ref, ref), digest, key))
    decision = sim.tick()
    a = sim.step_status("a")
    assert a.phase == SP.FAILED and a.error is not None, a
    assert a.error.reason == "ResultRefRefused" and why in a.error.message
    assert a.result_ref is None and a.result is None
    assert not [x for x in decision.before_commit if isinstance(x, StoreResult)]
    warnings = [x for x in decision.after_commit if isinstance(x, EmitEvent)]
    assert any(w.type == "Warning" and w.reason == "ResultRefRefused" for w in warnings)
    sim.tick()
    assert sim.step_status("b").phase == SP.SKIPPED
    assert "b" not in {j.step for j in sim.jobs.values()}, "the consumer never ran"


def test_a_result_ref_to_the_steps_own_result_object_is_committed() -> None:
    sim = _sim()
    sim.tick()
    sim.finish(sim.job_of("a").name, message=_by_reference(_own_name(sim)))
    sim.tick()
    a = sim.step_status("a")
    assert a.phase == SP.SUCCEEDED and a.result_ref is not None
    assert (a.result_ref.name, a.result_digest) == (_own_name(sim), "d" * 64)


def test_an_earlier_attempts_result_is_never_referenced_as_a_replay() -> None:
    """Nothing found is a replay: attempt 2 may reference only its own result object, not
    attempt 1's (which anyone who may create ConfigMaps could have written first)."""
    consume = step("b", "a", inputs=[{"name": "ROWS", "fromStep": "a"}])
    sim = Sim(make_run([step("a", retry={"limit": 1}), consume]))
    sim.tick()
    sim.finish(sim.job_of("a").name, ok=False)
    sim.tick()
    sim.advance(3600)
    sim.tick()
    assert sim.step_status("a").attempt == 2
    sim.finish(sim.step_status("a").job_name or "", message=_by_reference(_own_name(sim)))
    sim.tick()
    a = sim.step_status("a")
    assert a.phase == SP.FAILED and a.error is not None and a.error.reason == "ResultRefRefused"


def test_an_attempt_whose_result_or_input_was_tampered_with_fails_closed() -> None:
    sim = _sim()
    sim.tick()
    job = sim.job_of("a").name
    sim.finish(job, message=json.dumps({"ok": True, "result": {"rows": ROWS}}))
    sim.tampered[job] = "the content of ConfigMap x does not have the digest committed for it"
    decision = sim.tick()
    a = sim.step_status("a")
    assert a.phase == SP.FAILED and a.error is not None
    assert a.error.reason == "ResultTampered" and "digest" in a.error.message
    assert a.result_ref is None
    assert not [x for x in decision.before_commit if isinstance(x, StoreResult)]
    assert any(
        isinstance(x, EmitEvent) and x.reason == "ResultTampered" for x in decision.after_commit
    )


# -- binding an input by reference at launch ------------------------------------------------


def _launched() -> tuple[Sim, CreateJob, dict[str, Any]]:
    """``a`` succeeded with a large result (stored by the operator), ``b`` is launching: its
    CreateJob and the result object as the API would return it."""
    sim = _sim()
    sim.tick()
    result = json.dumps({"ok": True, "result": {"rows": ROWS, "n": 3}})
    sim.finish(sim.job_of("a").name, message=result)
    sim.tick()
    sim.tick()
    create = sim.created_specs[sim.step_status("b").job_name or ""]
    ref = sim.step_status("a").result_ref
    assert ref is not None
    body = objects.result_config_map(
        objects.RunRef.of(sim.run), ref.name, "a", 1, sim.results[ref.name]
    )
    body["metadata"]["ownerReferences"][0]["uid"] = sim.run.metadata.uid
    return sim, create, body


def _reader(found: dict[str, Any] | None) -> inputs.ReadConfigMap:
    return lambda namespace, name: found


def test_an_input_by_reference_is_passed_as_its_verified_value() -> None:
    sim, create, body = _launched()
    (var,) = create.input_env
    assert var.value_from is not None, "the core names the object; the shell binds it"
    bound = inputs.bind_inputs(sim.run, create, _reader(body))
    assert isinstance(bound, CreateJob)
    assert [(e.name, e.value, e.value_from) for e in bound.input_env] == [("ROWS", ROWS, None)]


def _forged_entry(body: dict[str, Any]) -> None:
    body["data"]["field.rows"] = "FORGED"  # the digest covers `result`, which is unchanged


def _forged_result(body: dict[str, Any]) -> None:
    body["data"] = dict(result_object_data(json.dumps({"rows": "FORGED"})))


def _recreated(body: dict[str, Any]) -> None:  # deleted, created again by a user: no owner
    body["metadata"]["ownerReferences"] = []
    body["data"] = dict(result_object_data(json.dumps({"rows": "FORGED"})))


def _recreated_with_owner(body: dict[str, Any]) -> None:  # a user may name the run as owner
    body["data"] = dict(result_object_data(json.dumps({"rows": "FORGED"})))
    body.pop("immutable")


def test_a_field_is_derived_from_the_verified_result_never_read_from_its_entry() -> None:
    sim, create, body = _launched()
    _forged_entry(body)
    bound = inputs.bind_inputs(sim.run, create, _reader(body))
    assert isinstance(bound, CreateJob) and bound.input_env[0].value == ROWS


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_forged_result, "does not have the digest committed"),
        (_recreated, "not owned by the run"),
        (_recreated_with_owner, "does not have the digest committed"),
        (None, "is gone"),
    ],
    ids=["changed", "recreated", "recreated-with-owner", "deleted"],
)
def test_an_input_whose_object_is_not_the_committed_result_is_never_passed_on(
    change: Any, why: str
) -> None:
    sim, create, body = _launched()
    found = None if change is None else copy.deepcopy(body)
    if change is not None and found is not None:
        change(found)
    problem = inputs.bind_inputs(sim.run, create, _reader(found))
    assert isinstance(problem, str) and why in problem and "ROWS" in problem


def test_the_args_hash_covers_the_digest_of_an_input_by_reference() -> None:
    sim, create, _ = _launched()
    assert committed_launch(sim.run, "b") == create
    changed = sim.run.model_copy(deep=True)
    a = next(s for s in (changed.status.steps if changed.status else None) or [] if s.name == "a")
    a.result_digest = naming.sha256_text("FORGED")
    # Another digest gives another args hash: the committed (and approved) one no longer holds.
    assert committed_launch(changed, "b") is None


def test_the_operator_stores_results_immutable_and_checks_one_found_under_the_name() -> None:
    sim, _, body = _launched()
    uid = sim.run.metadata.uid
    digest = naming.sha256_text(body["data"]["result"])
    assert body["immutable"] is True
    assert objects.result_problem(uid, body, digest, stored=True) is None
    mutable = {**body, "immutable": None}
    assert "not immutable" in (objects.result_problem(uid, mutable, digest, stored=True) or "")
    foreign = copy.deepcopy(body)
    foreign["metadata"]["ownerReferences"][0]["controller"] = False
    assert "not controlled" in (objects.result_problem(uid, foreign, digest, stored=True) or "")


# -- the shell: storing a result, creating a Job with inputs by reference -----------------------


class FakeObserver:
    """What the Actor tells the observer, and the ConfigMap it reads back."""

    def __init__(self, found: dict[str, Any] | None) -> None:
        self.adoption = mock.Mock()
        self.job_key = mock.Mock(**{"get.return_value": KEY})  # signs the Jobs created
        self.found = found
        self.tampered: dict[str, str] = {}

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.found

    def note_tampered(self, run_uid: str, job_name: str, message: str) -> None:
        self.tampered[job_name] = message

    def note_launched(self, run_uid: str, job_name: str) -> None:
        pass


def _actor(found: dict[str, Any] | None, *, exists: bool) -> tuple[Actor, Any, FakeObserver]:
    core, batch = mock.Mock(), mock.Mock()
    if exists:
        core.create_namespaced_config_map.side_effect = ApiException(status=409)
    observer = FakeObserver(found)
    as_observer: Any = observer  # the part of an Observer the Actor uses
    apis = Apis(core=core, batch=batch, custom=mock.Mock())
    actor = Actor(apis, as_observer, mock.Mock(), lambda point: None)
    return actor, batch, observer


def _storing() -> tuple[Sim, Any, StoreResult, dict[str, Any]]:
    """``a`` finished with a large result: the pass's run, its StoreResult, and the object the
    operator would store."""
    sim = _sim()
    sim.tick()
    sim.finish(sim.job_of("a").name, message=json.dumps({"ok": True, "result": {"rows": ROWS}}))
    decision, _ = sim.decide()
    (store,) = [x for x in decision.before_commit if isinstance(x, StoreResult)]
    digest = naming.sha256_text(dict(store.data)["result"])
    signed = proof.object_proof(KEY, "result", sim.run.metadata.uid, store.name, "a", "1", digest)
    body = objects.result_config_map(
        objects.RunRef.of(sim.run),
        store.name,
        "a",
        1,
        store.data,
        annotations={s.ANNOTATION_PROOF: signed},
    )
    return sim, decision, store, body


def _unsigned(found: dict[str, Any]) -> None:
    """The mimic: the exact object the operator would store, made by someone else first."""
    found["metadata"]["annotations"].pop(s.ANNOTATION_PROOF)


def _signed_by_another_key(found: dict[str, Any]) -> None:
    name = found["metadata"]["name"]
    digest = naming.sha256_text(found["data"]["result"])
    forged = proof.object_proof(b"x" * 32, "result", found["metadata"]["ownerReferences"][0]["uid"],
                                name, "a", "1", digest)  # fmt: skip
    found["metadata"]["annotations"][s.ANNOTATION_PROOF] = forged


@pytest.mark.parametrize(
    ("change", "stored"),
    [
        (None, True),
        (_forged_result, False),
        (_recreated_with_owner, False),
        (_recreated, False),
        (_unsigned, False),
        (_signed_by_another_key, False),
    ],
    ids=["own", "other-content", "mutable", "not-the-runs", "mimic", "another-key"],
)
def test_a_result_name_held_by_another_object_is_never_committed(change: Any, stored: bool) -> None:
    sim, decision, _, body = _storing()
    found = copy.deepcopy(body)
    if change is not None:
        change(found)
    actor, _, observer = _actor(found, exists=True)
    assert actor.before_commit(sim.run, decision.before_commit) is stored
    job = sim.step_status("a").job_name or ""
    if stored:
        assert not observer.tampered
    else:
        assert "could not be stored" in observer.tampered[job], observer.tampered
        sim.tampered = dict(observer.tampered)  # the next pass fails the attempt
        sim.tick()
        a = sim.step_status("a")
        assert a.error is not None and a.error.reason == "ResultTampered" and a.result_ref is None


def test_a_job_is_created_with_its_inputs_verified_or_not_at_all() -> None:
    sim, create, body = _launched()
    actor, batch, observer = _actor(body, exists=False)
    batch.create_namespaced_job.return_value = mock.Mock(data=json.dumps({"metadata": {}}))
    actor.act(sim.run, (create,))
    manifest = batch.create_namespaced_job.call_args.args[1]
    env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "ROWS", "value": ROWS} in env
    assert not any("valueFrom" in e for e in env)

    forged = copy.deepcopy(body)
    _forged_result(forged)
    actor, batch, observer = _actor(forged, exists=False)
    actor.act(sim.run, (create,))
    batch.create_namespaced_job.assert_not_called()
    assert "does not have the digest" in observer.tampered[create.job_name]


@pytest.mark.parametrize(
    "message",
    [
        # The step runner's envelope (exit code 1).
        json.dumps({"ok": False, "summary": "ResultTampered: the result object x already existed"}),
        # A model turn's or MCP call's one line (exit code 1).
        "ResultTampered: the result object x already existed before this attempt stored it",
    ],
    ids=["runner", "turn"],
)
def test_a_step_that_found_its_result_name_taken_fails_result_tampered_with_a_warning(
    message: str,
) -> None:
    sim = _sim()
    sim.tick()
    sim.finish(sim.job_of("a").name, ok=False, message=message)
    decision = sim.tick()
    a = sim.step_status("a")
    assert a.phase == SP.FAILED and a.error is not None
    assert a.error.reason == "ResultTampered", a.error
    assert "already existed" in a.error.message
    assert any(
        isinstance(x, EmitEvent) and x.type == "Warning" and x.reason == "ResultTampered"
        for x in decision.after_commit
    )


def test_a_succeeded_step_whose_result_says_result_tampered_is_still_a_success() -> None:
    """Only a failure's report is read for the word: a step may print anything it likes."""
    sim = _sim()
    sim.tick()
    sim.finish(sim.job_of("a").name, message="ResultTampered: just text a step printed")
    sim.tick()
    assert sim.step_status("a").phase == SP.SUCCEEDED
