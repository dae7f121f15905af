"""A pass starts from the run as the watch delivered it (agentrun.loop.reconciler.RunBodies): the
newest body wins, whoever offered it; a run is read (a quorum read) only without a body, or at
least once per resync period counted from its first pass. A decision that would delete a Job
is committed even with its status unchanged: that write, with the version read, is its fence."""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import Decision, DeleteJob
from agentrun.loop.act import Actor
from agentrun.loop.commit import AuditRecord, commit
from agentrun.loop.ledger import Conflict
from agentrun.loop.observe import Observer
from agentrun.loop.reconciler import Apis, Reconciler, RunBodies
from agentrun.observation.view import ClusterView
from tests.support.sim import UID, Sim, make_run, step


def body(rv: str, uid: str = UID, name: str = "demo") -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name, "uid": uid, "resourceVersion": rv}}


def test_the_newest_body_wins_whoever_offers_it() -> None:
    bodies = RunBodies()
    bodies.offer(body("10"))
    bodies.offer(body("9"))  # a late watch event
    assert bodies.get("default", "demo") == body("10")
    bodies.offer(body("11"))
    assert bodies.get("default", "demo") == body("11")
    bodies.offer(body("3", uid="another"))  # a new run of that name
    assert bodies.get("default", "demo") == body("3", uid="another")
    bodies.drop("default", "demo")
    assert bodies.get("default", "demo") is None
    bodies.offer(body("12"))
    bodies.offer({**body("13"), "status": {"phase": "Succeeded"}})  # finished: not kept
    assert bodies.get("default", "demo") is None


def _reconciler(bodies: RunBodies, quorum_body: dict[str, Any]) -> tuple[Reconciler, mock.Mock]:
    custom = mock.Mock()
    custom.get_namespaced_custom_object.return_value = quorum_body
    apis = Apis(core=mock.Mock(), batch=mock.Mock(), custom=custom)
    view = ClusterView()
    rec = Reconciler(apis, s.Settings(namespaces=("default",)), view=view, bodies=bodies)
    return rec, custom


def _isolated() -> list[Any]:
    """The pass's reads and writes other than the run's own, out of the way."""
    return [
        mock.patch.object(AuditRecord, "anchor"),
        mock.patch.object(AuditRecord, "flush", return_value=False),
    ]


def _watched() -> tuple[Sim, dict[str, Any], RunBodies, Reconciler, mock.Mock]:
    """A one-step run after its first tick, its body (version 7, held) as the watch delivered
    it, kept, and a reconciler whose quorum read would return that body."""
    sim = Sim(make_run([step("a")]))
    sim.tick()
    run = sim.run.to_wire()
    run["metadata"].update(namespace="default", resourceVersion="7", finalizers=[s.RUN_FINALIZER])
    bodies = RunBodies()
    bodies.offer(run)
    rec, custom = _reconciler(bodies, run)
    return sim, run, bodies, rec, custom


def test_a_pass_starts_from_the_watched_body_and_fences_a_delete_with_a_write() -> None:
    sim, _, _, rec, custom = _watched()
    quiet = Decision(status=sim.status.model_copy(deep=True))
    deleting = Decision(status=sim.status.model_copy(deep=True),
                        after_commit=(DeleteJob("x", "NotCurrentAttempt"),))  # fmt: skip
    for patcher in _isolated():
        patcher.start()
    reads = custom.get_namespaced_custom_object
    clock = mock.patch("agentrun.loop.reconciler.time.monotonic", return_value=1000.0).start()
    with (
        mock.patch("agentrun.loop.decide.reconcile", return_value=quiet),
        mock.patch.object(Observer, "observe", return_value=sim.observed()),
        mock.patch.object(Actor, "act") as act,
    ):
        rec.reconcile("default", "demo")  # the first pass starts from the watched body
        rec.reconcile("default", "demo")
        assert reads.call_count == 0, "read despite the body"
        assert act.call_args_list[-1].args[1] == quiet.after_commit
        # A resync period after the first pass: read once, and the period starts again.
        clock.return_value = 1000.0 + rec.settings.resync_seconds
        rec.reconcile("default", "demo")
        assert reads.call_count == 1, "not read after a resync period"
        rec.reconcile("default", "demo")
        assert reads.call_count == 1, "read twice in one period"
    writes = mock.Mock(return_value="8")
    rec.ledger.send_status = writes
    with (
        mock.patch("agentrun.loop.decide.reconcile", return_value=deleting),
        mock.patch.object(Observer, "observe", return_value=sim.observed()),
        mock.patch.object(Actor, "act") as act,
    ):
        rec.reconcile("default", "demo")
        # Its status unchanged, the decision is written all the same, with the version the
        # watched body had (nothing else in the patch): a run that moved on since answers 409.
        assert writes.call_count == 1, "deleted a Job with no write to fence it"
        ops = writes.call_args.args[6]
        assert ops == [{"op": "replace", "path": "/metadata/resourceVersion", "value": "7"}]
        assert reads.call_count == 1, "read again, as if a read could fence it"
        assert act.call_args_list[-1].args[1] == deleting.after_commit
    mock.patch.stopall()


def test_a_delete_on_a_stale_body_is_not_carried_out() -> None:
    """The fence write answered 409: the decision is dropped (its Job not deleted), and the run
    derived again from a quorum read."""
    sim, _, _, rec, custom = _watched()
    deleting = Decision(status=sim.status.model_copy(deep=True),
                        after_commit=(DeleteJob("x", "NotCurrentAttempt"),))  # fmt: skip
    quiet = Decision(status=sim.status.model_copy(deep=True))
    moved = Conflict("default/demo")
    rec.ledger.commit = mock.Mock(side_effect=[moved])  # type: ignore[method-assign]
    for patcher in _isolated():
        patcher.start()
    with (
        mock.patch("agentrun.loop.decide.reconcile", side_effect=[deleting, quiet]),
        mock.patch.object(Observer, "observe", return_value=sim.observed()),
        mock.patch.object(Actor, "act") as act,
    ):
        outcome = rec.reconcile("default", "demo")
    mock.patch.stopall()
    assert outcome.conflicts == 1
    assert custom.get_namespaced_custom_object.call_count == 1, "not derived from a read"
    acted = [a for c in act.call_args_list for a in c.args[1]]
    assert not any(isinstance(a, DeleteJob) for a in acted), f"deleted on a stale body: {acted}"


def _run_body(rv: str) -> dict[str, Any]:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    run = sim.run.to_wire()
    run["metadata"].update(namespace="default", resourceVersion=rv)
    return run


def test_what_a_pass_derives_from_a_kept_body_is_made_once_per_version() -> None:
    bodies = RunBodies()
    first = _run_body("7")
    bodies.offer(first)
    model = bodies.model(first)
    assert bodies.model(first) is model, "validated again"
    wire = bodies.status_wire(first, model)
    assert wire == model.status.to_wire() if model.status else wire == {}
    assert bodies.status_wire(first, model) is wire
    # The watch event of the write that returned ``first``: the same version, kept as is.
    bodies.offer(copy.deepcopy(first))
    assert bodies.get("default", "demo") is first
    assert bodies.model(first) is model
    # A new version: derived anew; a body not kept is validated every time.
    newer = _run_body("8")
    bodies.offer(newer)
    assert bodies.model(newer) is not model
    assert bodies.model(first) is not bodies.model(first)
    bodies.drop("default", "demo")
    assert bodies.model(newer) is not bodies.model(newer)
    # The wire form of a body not kept is made from its model, not from another validation.
    loose = bodies.model(newer)
    with mock.patch.object(type(loose), "model_validate") as validate:
        assert bodies.status_wire(newer, loose) == (loose.status.to_wire() if loose.status else {})
        validate.assert_not_called()


def test_a_write_whose_watch_event_came_first_keeps_the_model_written() -> None:
    bodies = RunBodies()
    bodies.offer(_run_body("7"))
    written = _run_body("8")
    watched = copy.deepcopy(written)
    bodies.offer(watched)  # the watch event of the write, before the write's answer
    run = m.AgentRun.model_validate(written)
    bodies.offer(written, run)
    assert bodies.get("default", "demo") is watched
    with mock.patch.object(m.AgentRun, "model_validate") as validate:
        assert bodies.model(watched) is run
        validate.assert_not_called()
    assert bodies.status_wire(watched, run) == (run.status.to_wire() if run.status else {})
    # A late answer of an older write keeps nothing of it.
    bodies.offer(_run_body("7"), m.AgentRun.model_validate(_run_body("7")))
    assert bodies.model(watched) is run


def test_a_decision_equal_to_the_status_read_writes_nothing_and_one_that_differs_does() -> None:
    sim = Sim(make_run([step("a")]))
    sim.tick()
    run = sim.run
    assert run.status is not None
    ledger = mock.Mock()
    body = _run_body("7")
    same = Decision(status=run.status.model_copy(deep=True))
    with mock.patch.object(type(run.status), "to_wire") as to_wire:
        assert commit(ledger, lambda _: None, body, run, same) is None
        to_wire.assert_not_called()
    ledger.commit.assert_not_called()
    moved = run.status.model_copy(deep=True)
    moved.message = "something else"
    commit(ledger, lambda _: None, body, run, Decision(status=moved))
    ledger.commit.assert_called_once()
    assert ledger.commit.call_args.args[1]["message"] == "something else"


def test_the_pass_that_levels_a_finished_runs_record_starts_from_its_own_write() -> None:
    sim, run, bodies, rec, custom = _watched()
    done = copy.deepcopy(run)
    done["metadata"]["resourceVersion"] = "8"
    done["status"]["phase"] = "Succeeded"  # a finished run's body is not kept
    seen: list[str] = []

    def decide(run: Any, *_: Any) -> Decision:
        seen.append(run.metadata.resource_version)
        return Decision(status=sim.status.model_copy(deep=True))

    with (
        mock.patch.object(AuditRecord, "anchor"),
        # Appended on the first derivation: the second commits recordedSeq.
        mock.patch.object(AuditRecord, "flush", side_effect=[True, False]),
        mock.patch("agentrun.loop.decide.reconcile", side_effect=decide),
        mock.patch("agentrun.loop.reconciler.commit", side_effect=[done, None]),
        mock.patch.object(Observer, "observe", return_value=sim.observed()),
        mock.patch.object(Actor, "act"),
    ):
        rec.reconcile("default", "demo")
    assert bodies.get("default", "demo") is None
    assert seen == ["7", "8"]
    custom.get_namespaced_custom_object.assert_not_called()
