"""The shell around the core: one pass over a run is observe, decide, commit, act.

One :meth:`Reconciler.reconcile` call is one level-triggered pass over one run:

1. take the run as last watched or written (:class:`RunBodies`; a quorum read without one,
   after a conflict, and once per resync period counted from the run's first pass), and
   observe its Jobs and their pods from the view, and what else the core is given
   (:mod:`.observe`);
2. ``decision = core.reconcile(run, observed, now)`` (:mod:`.decide`);
3. run ``decision.before_commit`` (result ConfigMaps: :mod:`.act`);
4. commit ``decision.status`` with the resourceVersion read (409: go back to 1), its audit
   chain anchored in it, and append the committed transitions to the audit record
   (:mod:`.commit`); a decision that creates a Job or a child run, or stops a Job, is
   committed even when its status is unchanged (:attr:`~agentrun.core.Decision.needs_fence`);
5. run ``decision.after_commit`` (create Jobs of committed intents, delete Jobs, Events:
   :mod:`.act`).

Deleting a run removes what it owns (:mod:`.cleanup`), one pass at a time per run as well.
Everything here is synchronous (the official kubernetes client); kopf runs it in a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import EmitEvent, agent_refs
from agentrun.core.shards import run_shard_label
from agentrun.loop import cleanup
from agentrun.loop.act import Actor, Events
from agentrun.loop.commit import AuditRecord, commit
from agentrun.loop.common import CHECKPOINTS, Apis, Checkpoint, log, no_checkpoint, run_fields
from agentrun.loop.decide import Decider, requeue_after
from agentrun.loop.ledger import Conflict, Ledger
from agentrun.loop.observe import Observer
from agentrun.loop.run_bodies import RunBodies
from agentrun.observation.view import ClusterView
from agentrun.observation.watches import Wake
from agentrun.telemetry import changes as telemetry

__all__ = ["CHECKPOINTS", "Apis", "Checkpoint", "Outcome", "Reconciler", "RunBodies"]


@dataclass(frozen=True)
class Outcome:
    """What one reconcile pass did."""

    requeue_after: float | None
    phase: str | None
    conflicts: int

    @property
    def gone(self) -> bool:
        """The run was gone, or being deleted: the pass did nothing."""
        return self.phase is None and self.requeue_after is None


class Reconciler:
    """Moves runs forward. Safe to call concurrently for different runs."""

    def __init__(
        self,
        apis: Apis,
        settings: s.Settings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        checkpoint: Checkpoint = no_checkpoint,
        *,
        view: ClusterView | None = None,
        wake: Wake | None = None,
        bodies: RunBodies | None = None,
    ) -> None:
        self.apis = apis
        self.settings = settings
        self.clock = clock
        self.checkpoint = checkpoint
        self.bodies = bodies
        """The latest body of each run, from the watch or this process's own writes: a pass
        starts from it and reads the run (a quorum read) only without one, or after a
        conflict. None: always read."""
        self.ledger = Ledger(apis.custom)
        # One lock guards the caches of every part, as when they were all this class's: each
        # holds it briefly, and none while another does.
        self._guard = threading.Lock()
        self.events = Events(apis, settings, clock)
        self.observer = Observer(apis, settings, self.ledger, view, self.events.report, self._guard)
        self.decider = Decider(settings, clock)
        self.record = AuditRecord(apis, self.observer, self.events.report, self._guard)
        self.actor = Actor(
            apis, self.observer, self.events, checkpoint, wake, shard_count=settings.shards
        )
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._read_at: dict[tuple[str, str], float] = {}
        """(namespace, name) -> monotonic time of the run's last quorum read."""

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        """One pass at a time per run: deletion cleanup waits for a pass in flight, so a Job
        that pass creates is seen and removed."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._locks.pop((namespace, name), None)
            self._read_at.pop((namespace, name), None)
        if self.bodies is not None:
            self.bodies.drop(namespace, name)

    # -- one pass -------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> Outcome:
        """Read, derive, commit, act; re-derive on conflict, up to the configured tries."""
        with self.lock_for(namespace, name):
            return self._reconcile(namespace, name)

    def _reconcile(self, namespace: str, name: str) -> Outcome:
        conflicts = 0
        levelled = False
        written: dict[str, Any] | None = None  # the run as this pass's own write left it
        now = time.monotonic()
        with self._guard:
            # The first pass starts the period: a body the watch delivered (its list at a
            # start, or an event since) is as current as a read would be, and a stale one
            # fails its commit as any other does.
            last = self._read_at.setdefault((namespace, name), now)
        # At least one quorum read per resync period, should the watch have missed a change.
        quorum = self.bodies is None or now - last >= self.settings.resync_seconds
        for _ in range(self.settings.max_conflict_retries):
            body, quorum = self._run_body(namespace, name, quorum, written)
            if body is None:
                return Outcome(None, None, conflicts)
            if (body.get("metadata") or {}).get("deletionTimestamp"):
                return Outcome(None, None, conflicts)  # the deletion's own task cleans up
            try:
                held = self._held(body)
            except Conflict:
                conflicts += 1
                quorum = True
                continue
            if held is None:
                return Outcome(None, None, conflicts)
            body = held
            if self.bodies is not None:
                run = self.bodies.model(body)
            else:
                run = m.AgentRun.model_validate(body)
            # A run of an Agent (spec.agentRef) is read with the agent it took: every part of
            # the pass but the commit sees spec.agent (agentrun.core.agent_refs).
            view = agent_refs.effective(run)
            observed = self.observer.observe(view)
            decision = self.decider.decide(view, observed)
            view = agent_refs.as_decided(view, decision.status)  # a first pass took the Agent
            self.record.anchor(run, decision.status)
            if not self.actor.before_commit(view, decision.before_commit):
                quorum = True  # a result could not be stored: derive again, failing it
                continue
            try:
                old = self.bodies.status_wire(body, run) if self.bodies is not None else None
                stored = commit(self.ledger, self.checkpoint, body, run, decision, old)
            except Conflict:
                conflicts += 1
                quorum = True
                log.info("status conflict: re-reading and re-deriving", extra=run_fields(run))
                continue
            if stored is not None and self.bodies is not None:
                self.bodies.offer(stored, _as_written(run, decision.status, stored))
            telemetry.observe_commit(run, decision.status)
            self.actor.act(view, decision.after_commit)
            if self.record.flush(run, decision.status) and not levelled:
                levelled = True  # once more: commit recordedSeq, now that the record has it
                written = stored
                continue
            phase = decision.status.phase
            # A Job the API refused: the next pass fails the attempt at once.
            requeue = requeue_after(decision, self.observer.refusals_of(run.metadata.uid))
            return Outcome(requeue, str(phase) if phase else None, conflicts)
        log.warning(
            "gave up after %d conflicts in a row; will retry",
            conflicts,
            extra={"agentrun": {"run": f"{namespace}/{name}"}},
        )
        return Outcome(1.0, None, conflicts)

    def _run_body(
        self, namespace: str, name: str, quorum: bool, written: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any] | None, bool]:
        """The run as last watched or written, unless ``quorum`` (or none is known): then as
        stored now (None when it is gone). Returns it and whether it came from a quorum read.
        ``written``: the run as this pass's own write left it, for a run whose body is not
        kept (a finished one, levelling its audit record)."""
        body = None
        if not quorum and self.bodies is not None:
            body = self.bodies.get(namespace, name) or written
        if body is not None:
            return body, quorum
        with self._guard:
            self._read_at[(namespace, name)] = time.monotonic()
        body = self.ledger.read(namespace, name)
        if body is not None and self.bodies is not None:
            self.bodies.offer(body)
        return body, True

    def _held(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """``body`` with the run finalizer on it (:meth:`Ledger.hold`), and with shards its
        shard's label (agentrun/observation/runs.py), before anything is written or made for
        the run; None when the run is gone."""
        meta = body["metadata"]
        shard = (
            run_shard_label(meta["namespace"], meta["name"], self.settings.shards)
            if self.settings.shards
            else None
        )
        held = self.ledger.hold(body, shard)  # ``body`` itself when it has both already
        if held is not None and held is not body and self.bodies is not None:
            self.bodies.offer(held)
        return held

    def due_in(self, body: dict[str, Any], found: list[dict[str, Any]]) -> float | None:
        """Seconds until finished run ``body`` with Jobs ``found`` needs a pass (0: now),
        None if never (see :meth:`~agentrun.loop.decide.Decider.due_in`)."""
        return self.decider.due_in(body, found)

    # -- deletion and the janitor -----------------------------------------------------------

    def cleanup(self, namespace: str, name: str, uid: str) -> list[str]:
        """Delete everything a run owns; return what is still there (e.g. a Job held by
        someone else's finalizer). Waits for a reconcile pass of the run still in flight."""
        with self.lock_for(namespace, name):
            return cleanup.remove_owned(self.apis, self.actor, namespace, uid)

    def release_job(self, namespace: str, name: str) -> None:
        """Remove the operator's finalizer from a Job."""
        self.actor.release_job(namespace, name)

    def post_event(self, namespace: str, name: str, uid: str, action: EmitEvent) -> None:
        """An events.k8s.io/v1 Event on the run (see :mod:`agentrun.telemetry.events`)."""
        self.events.post(namespace, name, uid, action)


def _as_written(run: m.AgentRun, status: m.AgentRunStatus, stored: dict[str, Any]) -> m.AgentRun:
    """Run ``run`` as its status write ``stored`` it: with ``status`` (the model the write's
    wire form was made from: it comes back equal from that form) and the version the write
    made, not validated again from the body. Nothing else of a run changes with a status
    write that its resourceVersion fenced."""
    version = str(stored["metadata"].get("resourceVersion") or "")
    metadata = run.metadata.model_copy(update={"resource_version": version})
    return run.model_copy(update={"metadata": metadata, "status": status})
