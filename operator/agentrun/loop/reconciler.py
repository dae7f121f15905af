"""The shell around the core: observe a run's Jobs, ask the core, commit, act.

One :meth:`Reconciler.reconcile` call is one level-triggered pass over one run:

1. take the run as last watched or written (:class:`RunBodies`; a quorum read without one,
   after a conflict, or before deleting a Job on a decision no commit fenced) and its Jobs
   and their pods from the view;
2. ``decision = core.reconcile(run, observed, now)``;
3. run ``decision.before_commit`` (result ConfigMaps);
4. commit ``decision.status`` with the resourceVersion read (409: go back to 1);
5. run ``decision.after_commit`` (create Jobs of committed intents, delete Jobs, Events).

Everything here is synchronous (the official kubernetes client); kopf runs it in a thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.access import audit, authz
from agentrun.api import models as m
from agentrun.core import (
    Action,
    CarriedSource,
    CoreConfig,
    CreateJob,
    Decision,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    Observed,
    ObservedJob,
    ReleaseJob,
    StoreResult,
    naming,
    reconcile,
)
from agentrun.core import agent as agent_loop
from agentrun.core.actions import StoreRecord
from agentrun.execution import jobs, objects
from agentrun.kubeapi import finalizer_removal, list_items, tolerate
from agentrun.loop.ledger import Conflict, Ledger
from agentrun.observation import conversation as resume
from agentrun.observation.adoption import Adoption
from agentrun.observation.watches import ClusterView, Wake, controller_uid
from agentrun.telemetry import changes as telemetry
from agentrun.telemetry import events

log = logging.getLogger("agentrun.reconciler")

CHECKPOINTS = (
    "after-intent-commit",
    "after-job-create",
    "after-result-store",
    "before-result-commit",
    "after-result-commit",
    "before-job-release",
)
"""The named moments of a pass where a crash is most interesting: a :data:`Checkpoint` hook
given to :class:`Reconciler` is called with one of these names each time a pass reaches it."""

Checkpoint = Callable[[str], None]
"""Called with a :data:`CHECKPOINTS` name; the crash tests inject one that kills the process."""


def _no_checkpoint(point: str) -> None:
    return None


@dataclass(frozen=True)
class Apis:
    """The API groups the operator talks to."""

    core: Any  # CoreV1Api
    batch: Any  # BatchV1Api
    custom: Any  # CustomObjectsApi
    authorization: Any = None  # AuthorizationV1Api; made from core's client when not given
    events: Any = None  # EventsV1Api; made from core's client when not given


@dataclass(frozen=True)
class Outcome:
    """What one reconcile pass did."""

    requeue_after: float | None
    phase: str | None
    conflicts: int


def _ctx(run: m.AgentRun, step: str | None = None, attempt: int | None = None) -> dict[str, Any]:
    """Structured log fields naming the run, step and attempt."""
    fields: dict[str, Any] = {"run": f"{run.metadata.namespace}/{run.metadata.name}"}
    if step is not None:
        fields["step"] = step
    if attempt is not None:
        fields["attempt"] = attempt
    return {"agentrun": fields}


class Reconciler:
    """Moves runs forward. Safe to call concurrently for different runs."""

    def __init__(
        self,
        apis: Apis,
        settings: s.Settings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        checkpoint: Checkpoint = _no_checkpoint,
        *,
        view: ClusterView | None = None,
        wake: Wake | None = None,
        bodies: RunBodies | None = None,
    ) -> None:
        self.apis = apis
        self.bodies = bodies
        """The latest body of each run, from the watch or this process's own writes: a pass
        starts from it and reads the run (a quorum read) only without one, after a conflict,
        or before deleting a Job on a decision no commit fenced. None: always read."""
        self.view = view
        """The watched step Jobs, pods and pod refusals (agentrun.observation.watches); a pass waits
        until it is synced. Only deletion cleanup works without one."""
        self.wake = wake
        """Wakes a run's next pass (a create met a Job already holding the name)."""
        self.adoption = Adoption(
            view or ClusterView(),
            self._dry_run_job,
            self._read_job,
            self._list_pods,
            self._report,
        )
        self.checkpoint = checkpoint
        self.settings = settings
        self.ledger = Ledger(apis.custom)
        self.clock = clock
        self.event_clock = events.EventClock()
        self.config = CoreConfig(
            jitter_seed=settings.jitter_seed,
            job_deletion_grace_seconds=settings.job_deletion_grace_seconds,
            running_after_seconds=settings.running_after_seconds,
            agent=agent_loop.AgentConfig(
                llm_image=settings.llm_image, llm_command=settings.llm_command
            ),
        )
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._authorizer: authz.Authorizer | None = None
        self._job_refusals: dict[str, dict[str, str]] = {}
        """Run uid -> Job name -> the API's message refusing its create (fed to the core)."""
        self._reported: set[tuple[str, str, str]] = set()
        """(run uid, ConfigMap, why) of foreign audit objects already reported by an Event."""
        self._read_at: dict[tuple[str, str], float] = {}
        """(namespace, name) -> monotonic time of the run's last quorum read."""
        self._launched: dict[str, set[str]] = {}
        """Run uid -> Jobs of attempts still Launching that this process created or saw: one
        gone without a trace is lost, not to be created again (Observed.vanished)."""
        self._recorded: dict[str, int] = {}
        """Run uid -> the last transition this process found or stored in the run's audit
        record, until a commit carries it into status.audit.recordedSeq."""

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        """One pass at a time per run: deletion cleanup waits for a pass in flight, so a Job
        that pass creates is seen and removed."""
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
            self._read_at.pop((namespace, name), None)
        if self.bodies is not None:
            self.bodies.drop(namespace, name)

    # -- observing ------------------------------------------------------------------------

    def _observe(self, run: m.AgentRun) -> Observed:
        """The run's Jobs, the Jobs of attempts still Launching that vanished, and how far
        its audit record is known to reach (from memory: the record itself is read only when
        transitions are appended to it)."""
        found = self._observe_jobs(run)
        uid = run.metadata.uid
        launching = _launching_jobs(run)
        present = {j.name for j in found}
        with self._locks_guard:
            known = self._launched.get(uid, set()) & launching
            vanished = frozenset(known - present)
            known |= present & launching
            if known:
                self._launched[uid] = known
            else:
                self._launched.pop(uid, None)
            recorded = self._recorded.get(uid)
        if vanished:
            log.warning("Job(s) %s of attempts in flight vanished", ", ".join(sorted(vanished)),
                        extra=_ctx(run))  # fmt: skip
        if recorded is None:
            return Observed(found, vanished=vanished)
        prefix = audit.record_prefix(run.metadata.name, uid)
        return Observed(found, recorded_seq=recorded, record_name=prefix, vanished=vanished)

    def _with_carried_sources(self, run: m.AgentRun, observed: Observed) -> Observed:
        """What each carried result's ``fromRun`` really committed for its step, read from that
        run in the same namespace: the core accepts a carried result only against it. Read
        only while a carried step has no status yet (carried results are decided once)."""
        known = {st.name for st in (run.status.steps if run.status else None) or []}
        pending = [c for c in run.spec.carried_results or [] if c.from_run and c.step not in known]
        if not pending:
            return observed
        runs: dict[str, m.AgentRun | None] = {}
        sources: dict[str, CarriedSource] = {}
        for carried in pending:
            origin = carried.from_run or ""  # "namespace/name", written by kubectl agentrun fork
            namespace, _, name = origin.partition("/")
            if namespace != run.metadata.namespace or not name:
                continue  # the core refuses it, saying why
            if name not in runs:
                runs[name] = self._read_source_run(namespace, name)
            source = runs[name]
            steps = (source.status.steps if source and source.status else None) or []
            for st in steps:
                if st.name == carried.step:
                    found = CarriedSource.from_step_status(origin, st)
                    if found is not None:
                        sources[carried.step] = found
        return dataclasses.replace(observed, carried_sources=sources)

    def _with_resume_source(self, run: m.AgentRun, observed: Observed) -> Observed:
        """The conversation spec.agent.resumeFrom names, read from that run and verified
        (agentrun.observation.conversation), until the run's first turn has taken it."""
        source = resume.read_source(run, self.apis.core, self._read_source_run, self.authorizer)
        return observed if source is None else dataclasses.replace(observed, resume=source)

    def _read_source_run(self, namespace: str, name: str) -> m.AgentRun | None:
        body = self.ledger.read(namespace, name)
        if body is None:
            return None
        try:
            return m.AgentRun.model_validate(body)
        except ValueError:  # not a run this operator can read: nothing to carry from it
            return None

    def _observe_jobs(self, run: m.AgentRun) -> tuple[ObservedJob, ...]:
        """The run's Jobs from the view (agentrun.observation.adoption: only those the operator
        made)."""
        if self.view is None:
            raise RuntimeError("a reconcile pass needs the view of the cluster")
        while not self.view.wait_synced(timeout=30):
            log.warning("waiting for the watches of Jobs and pods to list", extra=_ctx(run))
        return self.adoption.observe(run)

    def _dry_run_job(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        response = self.apis.batch.create_namespaced_job(
            namespace, manifest, dry_run="All", _preload_content=False
        )
        job: dict[str, Any] = json.loads(response.data)
        return job

    def _read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with tolerate(404) as gone:
            response = self.apis.batch.read_namespaced_job(name, namespace, _preload_content=False)
        if gone:
            return None
        job: dict[str, Any] = json.loads(response.data)
        return job

    def _list_pods(self, namespace: str, run_uid: str) -> list[dict[str, Any]]:
        return list_items(
            self.apis.core.list_namespaced_pod(
                namespace, label_selector=objects.owned_by(run_uid), _preload_content=False
            )
        )

    def _report(self, run: m.AgentRun, reason: str, message: str) -> None:
        log.warning(message, extra=_ctx(run))
        self._act(run, (EmitEvent("Warning", reason, message),))

    # -- verdicts fed to the core ------------------------------------------------------------

    @property
    def authorizer(self) -> authz.Authorizer:
        """SubjectAccessReviews on behalf of runs' creators (see :mod:`agentrun.access.authz`)."""
        if self._authorizer is None:
            api = self.apis.authorization
            if api is None:
                from kubernetes import client as kube_client

                api = kube_client.AuthorizationV1Api(self.apis.core.api_client)
            self._authorizer = authz.Authorizer(api, ttl=self.settings.rights_ttl_seconds)
        return self._authorizer

    def _with_verdicts(self, run: m.AgentRun, observed: Observed) -> Observed:
        """``observed`` plus the steps the creator may not have launched and the Jobs the API
        refused (still current: an attempt's refusal is dropped once it is no longer
        Launching)."""
        refusals = self.authorizer.refusals(run)
        launching = _launching_jobs(run)
        with self._locks_guard:
            known = self._job_refusals.get(run.metadata.uid, {})
            job_refusals = {k: v for k, v in known.items() if k in launching}
            if job_refusals:
                self._job_refusals[run.metadata.uid] = dict(job_refusals)
            else:
                self._job_refusals.pop(run.metadata.uid, None)
        if not refusals and not job_refusals:
            return observed
        return dataclasses.replace(observed, refusals=refusals, job_refusals=job_refusals)

    def _refused_now(self, run: m.AgentRun, decision: Decision) -> bool:
        """Whether a Job this pass was to create was refused by the API."""
        with self._locks_guard:
            known = self._job_refusals.get(run.metadata.uid, {})
            return any(
                isinstance(a, CreateJob) and a.job_name in known for a in decision.after_commit
            )

    # -- the audit record -------------------------------------------------------------------

    def _read_record(self, run: m.AgentRun, latest: int) -> _Record:
        """The run's record: its own chunks only (:func:`audit.select`), entries up to the
        latest committed transition (``latest``). Anything else with the record's labels is
        ignored and reported once by a Warning Event; it never moves recordedSeq."""
        selector = objects.owned_by(run.metadata.uid, "audit")
        items = list_items(
            self.apis.core.list_namespaced_config_map(
                run.metadata.namespace, label_selector=selector, _preload_content=False
            )
        )
        prefix = audit.record_prefix(run.metadata.name, run.metadata.uid)
        # Entries up to a chunk past the status as read may be a concurrent pass's appends;
        # further ones cannot be the operator's.
        chosen = audit.select(items, prefix, run.metadata.uid, limit=latest + audit.CHUNK)
        self._report_foreign(run, chosen.ignored)
        return _Record(
            prefix=prefix,
            maps=chosen.maps,
            entries=[e for e in chosen.entries if int(e["seq"]) <= latest],
        )

    def _report_foreign(self, run: m.AgentRun, ignored: list[tuple[str, str]]) -> None:
        for name, why in ignored:
            seen = (run.metadata.uid, name, why)
            with self._locks_guard:
                if seen in self._reported:
                    continue
                if len(self._reported) >= REPORTED_LIMIT:
                    self._reported.clear()
                self._reported.add(seen)
            message = (
                f"ConfigMap {name} carries the labels of this run's audit record but is not "
                f"part of it ({why}): ignored"
            )
            log.warning(message, extra=_ctx(run))
            self._act(run, (EmitEvent("Warning", "ForeignAuditObject", message),))

    def _anchor(self, run: m.AgentRun, status: m.AgentRunStatus) -> None:
        """Advance the chain's head in ``status`` (committed with the transitions it covers)
        over the transitions past the head committed before. A run anchored before continues
        from its anchor; a run from before anchors existed, from its record's last entry."""
        committed = run.status.audit if run.status else None
        latest = (run.status.history_seq if run.status else None) or 0
        base = (0, audit.genesis(run.metadata.uid))
        if committed is not None and committed.head_seq is not None and committed.head_hash:
            base = (committed.head_seq, committed.head_hash)
        elif latest:
            entries = self._read_record(run, latest).entries
            if entries:
                base = (int(entries[-1]["seq"]), str(entries[-1].get("hash", "")))
        head = audit.advance(*base, status.history or [])
        if head is None:
            log.warning(
                "the audit chain cannot be anchored: status.history does not continue entry %d",
                base[0],
                extra=_ctx(run),
            )
            return
        anchor = status.audit or m.AuditStatus()
        anchor.head_seq, anchor.head_hash = head
        status.audit = anchor

    def _flush_record(self, run: m.AgentRun, status: m.AgentRunStatus) -> bool:
        """After a commit: append the committed transitions the audit record lacks, in
        batches. Appended when :data:`AUDIT_BATCH` transitions are waiting, or when the run
        comes to rest (finished, waiting for approval, suspended). Until then they wait in
        status.history, whose ring keeps every transition past recordedSeq (and the anchor in
        status.audit covers them), so none is lost to a crash.

        Returns whether status.audit.recordedSeq lags behind what is now recorded for a run at
        rest: one more commit brings it level (while the run moves, the next commit does)."""
        uid = run.metadata.uid
        latest = status.history_seq or 0
        committed = status.audit.recorded_seq if status.audit else 0
        with self._locks_guard:
            stored = max(committed, self._recorded.get(uid, 0))
        at_rest = status.phase in AT_REST
        waiting = latest - stored
        if waiting > 0 and (at_rest or waiting >= AUDIT_BATCH):
            appended = self._sync_record(run, status, self._read_record(run, latest))
            if appended is not None:
                stored = max(stored, appended)
                with self._locks_guard:
                    self._recorded[uid] = stored
        if at_rest and committed >= stored:
            with self._locks_guard:
                self._recorded.pop(uid, None)  # status says it all: nothing to remember
        return at_rest and committed < stored

    def _sync_record(
        self, run: m.AgentRun, status: m.AgentRunStatus, record: _Record
    ) -> int | None:
        """Append the committed transitions the record lacks (after the status commit, which
        anchored them: a crash in between leaves the anchor ahead, the entries in history).
        Returns the last transition the record then holds, None if another pass moved it on
        meanwhile."""
        last_seq = int(record.entries[-1]["seq"]) if record.entries else 0
        last_hash = (
            str(record.entries[-1]["hash"]) if record.entries else audit.genesis(run.metadata.uid)
        )
        history = status.history or []
        if history and history[0].seq > last_seq + 1:
            log.warning("audit record misses transitions %d to %d", last_seq + 1,
                        history[0].seq - 1, extra=_ctx(run))  # fmt: skip
        new = audit.extend(history, last_seq, last_hash)
        if new:
            last_seq = int(new[-1]["seq"])
        by_chunk: dict[str, dict[str, str]] = {}
        for made in new:
            chunk = audit.chunk_name(record.prefix, int(made["seq"]))
            by_chunk.setdefault(chunk, {})[audit.key(int(made["seq"]))] = naming.canonical_json(
                made
            )
        for chunk, data in by_chunk.items():
            existing = record.maps.get(chunk)
            if existing is not None:
                old = existing.get("data") or {}
                if all(old.get(k) == v for k, v in data.items()):
                    continue
            with tolerate(409) as moved_on:
                if existing is None:
                    body = objects.audit_config_map(objects.RunRef.of(run), chunk, data)
                    self.apis.core.create_namespaced_config_map(run.metadata.namespace, body)
                else:
                    existing["data"] = {**(existing.get("data") or {}), **data}
                    self.apis.core.replace_namespaced_config_map(
                        chunk, run.metadata.namespace, existing
                    )
            if moved_on and existing is None and self._take_over(run, record.prefix, chunk, data):
                continue
            if moved_on:
                log.info("audit record moved on meanwhile; next pass appends", extra=_ctx(run))
                return None
        return last_seq

    def _take_over(self, run: m.AgentRun, prefix: str, chunk: str, data: dict[str, str]) -> bool:
        """A ConfigMap that is not the run's holds a chunk's name: replace it with the chunk
        (it can only be an imitation; the run's own would have been read). False when the
        name is the run's after all (another pass created it meanwhile)."""
        found = list_items(
            self.apis.core.list_namespaced_config_map(
                run.metadata.namespace, field_selector=f"metadata.name={chunk}",
                _preload_content=False,
            )
        )  # fmt: skip
        if not found or audit.select(found, prefix, run.metadata.uid).maps:
            return False
        body = objects.audit_config_map(objects.RunRef.of(run), chunk, data)
        body["metadata"]["resourceVersion"] = found[0]["metadata"].get("resourceVersion")
        with tolerate(409, 404):
            self.apis.core.replace_namespaced_config_map(chunk, run.metadata.namespace, body)
        log.warning("replaced ConfigMap %s, which imitated a chunk of the audit record", chunk,
                    extra=_ctx(run))  # fmt: skip
        return True

    # -- one pass -------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> Outcome:
        """Read, derive, commit, act; re-derive on conflict, up to the configured tries."""
        with self.lock_for(namespace, name):
            return self._reconcile(namespace, name)

    def _reconcile(self, namespace: str, name: str) -> Outcome:
        conflicts = 0
        levelled = False
        key = (namespace, name)
        with self._locks_guard:
            last = self._read_at.get(key)
        # At least one quorum read per resync period, should the watch have missed a change.
        quorum = (
            self.bodies is None
            or last is None
            or (time.monotonic() - last >= self.settings.resync_seconds)
        )
        for _ in range(self.settings.max_conflict_retries):
            body = None if quorum or self.bodies is None else self.bodies.get(namespace, name)
            if body is None:
                quorum = True
                with self._locks_guard:
                    self._read_at[key] = time.monotonic()
                body = self.ledger.read(namespace, name)
                if body is not None and self.bodies is not None:
                    self.bodies.offer(body)
            if body is None:
                return Outcome(None, None, conflicts)
            if (body.get("metadata") or {}).get("deletionTimestamp"):
                return Outcome(None, None, conflicts)  # the deletion handler cleans up
            run = m.AgentRun.model_validate(body)
            observed = self._observe(run)
            observed = self._with_documents(run, observed)
            observed = self._with_verdicts(run, observed)
            observed = self._with_carried_sources(run, observed)
            observed = self._with_resume_source(run, observed)
            decision = reconcile(run, observed, self.clock(), self.config)
            self._anchor(run, decision.status)
            try:
                stored = self._commit(body, run, decision)
            except Conflict:
                conflicts += 1
                quorum = True
                log.info("status conflict: re-reading and re-deriving", extra=_ctx(run))
                continue
            if stored is not None and self.bodies is not None:
                self.bodies.offer(stored)
            elif not quorum and any(isinstance(a, DeleteJob) for a in decision.after_commit):
                # Nothing written, so nothing proved the body current: a Job is deleted only
                # on a decision from a quorum read (or one a commit fenced).
                quorum = True
                continue
            telemetry.observe_commit(run, decision.status)
            self._act(run, decision.after_commit)
            if self._flush_record(run, decision.status) and not levelled:
                levelled = True  # once more: commit recordedSeq, now that the record has it
                continue
            phase = decision.status.phase
            requeue = decision.requeue_after
            if self._refused_now(run, decision):  # the next pass fails the attempt at once
                requeue = min(requeue or REFUSAL_REQUEUE, REFUSAL_REQUEUE)
            return Outcome(requeue, str(phase) if phase else None, conflicts)
        log.warning(
            "gave up after %d conflicts in a row; will retry",
            conflicts,
            extra={"agentrun": {"run": f"{namespace}/{name}"}},
        )
        return Outcome(1.0, None, conflicts)

    def _commit(
        self, body: dict[str, Any], run: m.AgentRun, decision: Decision
    ) -> dict[str, Any] | None:
        """Before-commit actions, then the status write when needed; the run as stored by
        that write (None when nothing was written)."""
        stores = [a for a in decision.before_commit if isinstance(a, StoreResult | StoreRecord)]
        self._act(run, decision.before_commit)
        if stores:
            self.checkpoint("after-result-store")
        changed = decision.status_changed(run.status) and not _only_record_progress(
            run.status, decision.status
        )
        if not changed and not decision.needs_fence:
            return None
        newly_done = _newly_finished(run.status, decision.status)
        if newly_done:
            self.checkpoint("before-result-commit")
        stored = self.ledger.commit(body, decision.status)
        if newly_done:
            self.checkpoint("after-result-commit")
        if any(isinstance(a, CreateJob) for a in decision.after_commit):
            self.checkpoint("after-intent-commit")
        return stored

    # -- acting ---------------------------------------------------------------------------

    def _act(self, run: m.AgentRun, actions: tuple[Action, ...]) -> None:
        for action in actions:
            try:
                self._apply(run, action)
            except ApiException as error:
                if isinstance(action, EmitEvent):  # events are best effort
                    log.warning(
                        "could not post event %s: %s", action.reason, error.reason, extra=_ctx(run)
                    )
                    continue
                raise

    def _apply(self, run: m.AgentRun, action: Action) -> None:
        ns = run.metadata.namespace
        if isinstance(action, CreateJob):
            self._create_job(run, action)
        elif isinstance(action, DeleteJob):
            self.checkpoint("before-job-release")
            uid = self.adoption.deletable(run, action.job_name)
            if uid is None:
                log.info("Job %s is not the operator's (or gone): not deleted", action.job_name,
                         extra=_ctx(run))  # fmt: skip
                return
            self.delete_job(ns, action.job_name, uid, release=action.release)
            log.info("deleted Job %s (%s)", action.job_name, action.reason, extra=_ctx(run))
        elif isinstance(action, ReleaseJob):
            self.checkpoint("before-job-release")
            self._release_to_ttl(run, action)
        elif isinstance(action, StoreResult):
            self._store_result(run, action)
        elif isinstance(action, StoreRecord):
            self._store_record(run, action)
        elif isinstance(action, EmitEvent):
            self._event(run, action)
        elif isinstance(action, DeleteRun):
            log.info("deleting the run: %s", action.reason, extra=_ctx(run))
            with tolerate(404):
                self.apis.custom.delete_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, run.metadata.name
                )

    def _create_job(self, run: m.AgentRun, action: CreateJob) -> None:
        manifest = jobs.build_job(run, action)
        ctx = _ctx(run, action.step.name, action.attempt)
        with tolerate(409, *JOB_REFUSALS) as exists:
            created = self.apis.batch.create_namespaced_job(
                run.metadata.namespace, manifest, _preload_content=False
            )
        if exists.error is not None and exists.status != 409:
            # Refused for good (invalid, forbidden): the same create would be refused again.
            # The core fails the attempt on the next pass, with the API's own words.
            message = _api_message(exists.error)
            log.warning("the API refused Job %s: %s", action.job_name, message, extra=ctx)
            with self._locks_guard:
                self._job_refusals.setdefault(run.metadata.uid, {})[action.job_name] = message
            return
        if exists:
            # Someone made it first (an operator before a crash, another operator, or not an
            # operator at all): it counts only once verified, by the next pass.
            log.info("Job %s already exists; verifying it", action.job_name, extra=ctx)
            self.adoption.read(run.metadata.namespace, action.job_name)
            if self.wake is not None:
                self.wake(run.metadata.namespace, run.metadata.name, run.metadata.uid)
            return
        self.adoption.created(json.loads(created.data))
        with self._locks_guard:
            self._launched.setdefault(run.metadata.uid, set()).add(action.job_name)
        log.info("created Job %s", action.job_name, extra=ctx)
        self.checkpoint("after-job-create")

    def delete_job(
        self, namespace: str, name: str, uid: str | None = None, *, release: bool = True
    ) -> None:
        """Delete a step Job and (with ``release``) remove the operator's finalizer from it;
        with ``uid``, only if the Job of that name is still that one."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        with tolerate(404, 409) as gone:
            self.apis.batch.delete_namespaced_job(name, namespace, body=body)
        if gone or not release:
            return
        self.release_job(namespace, name)

    def release_job(self, namespace: str, name: str) -> None:
        """Remove the operator's finalizer from a Job (a JSON patch guarded by a test op)."""
        with tolerate(404) as gone:
            job = self.apis.batch.read_namespaced_job(name, namespace)
        if gone:
            return
        patch = finalizer_removal(job.metadata.finalizers or [], s.JOB_FINALIZER)
        if patch is None:
            return
        with tolerate(404, 409, 422):
            self.apis.batch.patch_namespaced_job(name, namespace, patch)

    def _release_to_ttl(self, run: m.AgentRun, action: ReleaseJob) -> None:
        """One JSON patch: the operator's finalizer off, ``ttlSecondsAfterFinished`` on,
        guarded by ``test`` ops against the Job as watched (its uid, its finalizers): a Job
        that is another, or changed since, fails the test (422) and nothing changes; its
        next change brings another pass."""
        ns = run.metadata.namespace
        seen = self.view.job_named(ns, action.job_name) if self.view is not None else None
        job = seen or self._read_job(ns, action.job_name)
        meta = (job or {}).get("metadata") or {}
        removal = finalizer_removal(meta.get("finalizers") or [], s.JOB_FINALIZER)
        if removal is None or controller_uid(job or {}) != run.metadata.uid:
            return
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
            *removal,
            {"op": "add", "path": "/spec/ttlSecondsAfterFinished", "value": action.ttl_seconds},
        ]
        with tolerate(404, 409, 422) as refused:
            patched = self.apis.batch.patch_namespaced_job(
                action.job_name, ns, patch, _preload_content=False
            )
        if refused:
            return
        # Still the verified Job (the uid test held): its new generation needs no new check.
        self.adoption.created(json.loads(patched.data))
        log.info("released Job %s to the TTL controller (%ds after it finished)",
                 action.job_name, action.ttl_seconds, extra=_ctx(run))  # fmt: skip

    def _store_result(self, run: m.AgentRun, action: StoreResult) -> None:
        body = objects.result_config_map(
            objects.RunRef.of(run), action.name, action.step, action.attempt, action.data
        )
        with tolerate(409):  # written by an earlier pass from the same Job: same content
            self.apis.core.create_namespaced_config_map(run.metadata.namespace, body)

    def _store_record(self, run: m.AgentRun, action: StoreRecord) -> None:
        """A ConfigMap of an agent run's memory: a turn's transcript record or context."""
        labels = {s.LABEL_KIND: action.kind, s.LABEL_TURN: str(action.turn)}
        body = objects.owned_config_map(objects.RunRef.of(run), action.name, labels, action.data)
        with tolerate(409):  # written by an earlier pass: its name stands for its content
            self.apis.core.create_namespaced_config_map(run.metadata.namespace, body)

    def _with_documents(self, run: m.AgentRun, observed: Observed) -> Observed:
        """The records an agent run's loop asks for (agentrun.core.agent.wanted_documents),
        read from the run's ConfigMaps; one read per ConfigMap, none for other runs. Their
        content is checked by the core against committed digests."""
        wanted = agent_loop.wanted_documents(run)
        if not wanted:
            return observed
        maps: dict[str, dict[str, Any]] = {}
        documents: dict[tuple[str, str], str] = {}
        for name, key in wanted:
            if name not in maps:
                with tolerate(404) as missing:
                    found = self.apis.core.read_namespaced_config_map(
                        name, run.metadata.namespace, _preload_content=False
                    )
                maps[name] = {} if missing else (json.loads(found.data).get("data") or {})
            value = maps[name].get(key)
            if isinstance(value, str):
                documents[(name, key)] = value
        return dataclasses.replace(observed, documents=documents)

    def _event(self, run: m.AgentRun, action: EmitEvent) -> None:
        self.post_event(run.metadata.namespace, run.metadata.name, run.metadata.uid, action)

    def post_event(self, namespace: str, name: str, uid: str, action: EmitEvent) -> None:
        """An events.k8s.io/v1 Event on the run (see :mod:`agentrun.telemetry.events`)."""
        at = self.event_clock.stamp(self.clock())
        body = events.event_body(
            namespace,
            name,
            uid,
            action,
            at,
            controller=s.FIELD_MANAGER,
            instance=self.settings.instance,
        )
        api = self.apis.events
        if api is None:
            from kubernetes import client as kube_client

            api = kube_client.EventsV1Api(self.apis.core.api_client)
        with tolerate(409):
            api.create_namespaced_event(namespace, body)

    # -- deletion -------------------------------------------------------------------------

    def cleanup(self, namespace: str, name: str, uid: str) -> list[str]:
        """Delete everything a run owns; return what is still there (e.g. a Job held by
        someone else's finalizer). Waits for a reconcile pass of the run still in flight."""
        with self.lock_for(namespace, name):
            return self._cleanup(namespace, uid)

    def _cleanup(self, namespace: str, uid: str) -> list[str]:
        selector = objects.owned_by(uid)
        for job in self.apis.batch.list_namespaced_job(namespace, label_selector=selector).items:
            self.delete_job(namespace, job.metadata.name)
        self.apis.core.delete_collection_namespaced_config_map(namespace, label_selector=selector)
        self.apis.core.delete_collection_namespaced_pod(namespace, label_selector=selector)
        left: list[str] = []
        for job in self.apis.batch.list_namespaced_job(namespace, label_selector=selector).items:
            holders = ", ".join(job.metadata.finalizers or []) or "no finalizers"
            left.append(f"Job {job.metadata.name} (finalizers: {holders})")
        return left


JOB_REFUSALS = (400, 403, 404, 422)
"""Statuses of a Job create that fail the attempt (reason JobRefused) instead of being retried:
the request itself is refused (bad request, forbidden, namespace gone, invalid)."""
REPORTED_LIMIT = 10_000
"""Foreign audit objects remembered as reported (then forgotten, and reported again)."""
REFUSAL_REQUEUE = 0.1
"""Seconds until the pass that fails an attempt whose Job the API refused."""


def _api_message(error: ApiException) -> str:
    """The message of the API's Status in a refusal, else its reason."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError, RecursionError):
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    text = message if isinstance(message, str) and message else f"{error.status} {error.reason}"
    return text[:2048]


AUDIT_BATCH = 32
"""Committed transitions that wait in status.history before they are appended to the audit
record together (fewer than status.history's ring keeps: see core._trim_history)."""
AT_REST = frozenset({*m.TERMINAL_RUN_PHASES, m.RunPhase.WAITING_FOR_APPROVAL, m.RunPhase.SUSPENDED})
"""Run phases in which nothing moves until someone acts: the record is completed at once."""


def _only_record_progress(old: m.AgentRunStatus | None, new: m.AgentRunStatus) -> bool:
    """Whether ``new`` differs from ``old`` only in how far the audit record is known to
    reach (status.audit.recordedSeq and .record): not worth a write of its own while the run
    moves, the next commit carries it. A run at rest gets it committed (see _flush_record)."""
    if old is None or new.phase in AT_REST:
        return False
    levelled = new.model_copy(deep=True)
    if old.audit is not None and levelled.audit is not None:
        levelled.audit.recorded_seq = old.audit.recorded_seq
        levelled.audit.record = old.audit.record
    elif old.audit is None and levelled.audit is not None:
        return False
    return old.to_wire() == levelled.to_wire()


class RunBodies:
    """The latest known body of each unfinished run: as kopf's watch delivered it, or as a
    status write of this process returned it, whichever is newer (resourceVersions compared
    as the integers etcd makes them; one that is not taken as newer). Safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[tuple[str, str], dict[str, Any]] = {}

    def offer(self, body: dict[str, Any]) -> None:
        """Keep ``body`` unless a newer one is known. A finished run's is not kept: such a
        run is rarely passed again (and then read), and thousands of them would cost memory."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        finished = (body.get("status") or {}).get("phase") in FINISHED_PHASES
        with self._lock:
            known = self._bodies.get(key)
            if known is not None and _older(body, known):
                return
            if finished:
                self._bodies.pop(key, None)
            else:
                self._bodies[key] = body

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._bodies.get((namespace, name))

    def drop(self, namespace: str, name: str) -> None:
        with self._lock:
            self._bodies.pop((namespace, name), None)


FINISHED_PHASES = frozenset(str(p) for p in m.TERMINAL_RUN_PHASES)


def _older(body: dict[str, Any], than: dict[str, Any]) -> bool:
    def version(b: dict[str, Any]) -> int | None:
        text = str((b.get("metadata") or {}).get("resourceVersion") or "")
        return int(text) if text.isdigit() else None

    mine, theirs = version(body), version(than)
    if (body.get("metadata") or {}).get("uid") != (than.get("metadata") or {}).get("uid"):
        return False  # another run of that name: the newer one
    return mine is not None and theirs is not None and mine < theirs


@dataclass(frozen=True)
class _Record:
    prefix: str
    maps: dict[str, dict[str, Any]]
    entries: list[dict[str, Any]]


def _launching_jobs(run: m.AgentRun) -> set[str]:
    """Job names of the run's attempts committed as Launching."""
    steps = (run.status.steps if run.status else None) or []
    return {st.job_name for st in steps if st.phase == m.StepPhase.LAUNCHING and st.job_name}


def _newly_finished(old: m.AgentRunStatus | None, new: m.AgentRunStatus) -> bool:
    before = {st.name: st.phase for st in (old.steps if old else None) or []}
    return any(
        st.phase in m.TERMINAL_STEP_PHASES and before.get(st.name) != st.phase
        for st in new.steps or []
    )
