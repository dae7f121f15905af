"""Commit: the status write of a pass, fenced by the resourceVersion it was derived from
(:func:`commit`, through :class:`~agentrun.loop.ledger.Ledger`), and the run's audit record
around it (:class:`AuditRecord`): the chain's head anchored in the status before the write,
the committed transitions appended to the record's ConfigMaps after it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from agentrun.access import audit
from agentrun.api import models as m
from agentrun.core import CreateJob, Decision, naming
from agentrun.execution import objects
from agentrun.kubeapi import list_items, tolerate
from agentrun.loop.common import Apis, Checkpoint, log, run_fields
from agentrun.loop.ledger import Ledger
from agentrun.loop.observe import Observer, Report

AUDIT_BATCH = 32
"""Committed transitions that wait in status.history before they are appended to the audit
record together (fewer than status.history's ring keeps: see core._trim_history)."""
AT_REST = frozenset({*m.TERMINAL_RUN_PHASES, m.RunPhase.WAITING_FOR_APPROVAL, m.RunPhase.SUSPENDED})
"""Run phases in which nothing moves until someone acts: the record is completed at once."""
REPORTED_LIMIT = 10_000
"""Foreign audit objects remembered as reported (then forgotten, and reported again)."""


def commit(
    ledger: Ledger,
    checkpoint: Checkpoint,
    body: dict[str, Any],
    run: m.AgentRun,
    decision: Decision,
    old: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The status write when needed, onto the run read as ``body``; the run as stored by
    that write (None when nothing was written). ``old``: ``run.status`` in wire form, when
    known. Raises :class:`~agentrun.loop.ledger.Conflict` when the run moved on since it was
    read."""
    # Turning a status into its wire form is most of what deciding whether to write costs on
    # a run of many steps: a decision equal to the status read needs neither, and each status
    # is turned into it once at most.
    if decision.status == run.status and not decision.needs_fence:
        return None
    if old is None:
        old = run.status.to_wire() if run.status is not None else {}
    new = wire_of(decision.status, run.status, old)
    changed = old != new and not _only_record_progress(old, new, decision.status.phase)
    if not changed and not decision.needs_fence:
        return None
    newly_done = _newly_finished(run.status, decision.status)
    if newly_done:
        checkpoint("before-result-commit")
    stored = ledger.commit(body, new)
    if newly_done:
        checkpoint("after-result-commit")
    if any(isinstance(a, CreateJob) for a in decision.after_commit):
        checkpoint("after-intent-commit")
    return stored


def wire_of(
    status: m.AgentRunStatus, read: m.AgentRunStatus | None, read_wire: dict[str, Any]
) -> dict[str, Any]:
    """``status.to_wire()``, made from ``read_wire`` (``read.to_wire()``) for the steps equal
    to those of ``read`` and the transitions it shares with it: a pass changes a step or two
    of a run, and writing every step's timestamps anew is most of what its status costs to
    turn into JSON on a run of many steps (comparing them is a fraction of it)."""
    read_steps, read_history = read.steps if read else None, read.history if read else None
    wire_steps, wire_history = read_wire.get("steps") or [], read_wire.get("history") or []
    if (
        read is None
        or len(read_steps or []) != len(wire_steps)
        or len(read_history or []) != len(wire_history)
    ):
        return status.to_wire()  # not the wire form of the status read
    wire = status.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"steps", "history"}
    )
    if status.steps is not None:
        known = {st.name: (st, w) for st, w in zip(read_steps or [], wire_steps, strict=True)}
        wire["steps"] = [_step_wire(st, known.get(st.name)) for st in status.steps]
    if status.history is not None:
        shared = {id(t): w for t, w in zip(read_history or [], wire_history, strict=True)}
        wire["history"] = [shared.get(id(t)) or t.to_wire() for t in status.history]
    return wire


def _step_wire(
    st: m.StepStatus, read: tuple[m.StepStatus, dict[str, Any]] | None
) -> dict[str, Any]:
    if read is not None and read[0] == st:
        return read[1]
    return st.to_wire()


def _only_record_progress(
    old: dict[str, Any], new: dict[str, Any], phase: m.RunPhase | None
) -> bool:
    """Whether ``new`` differs from ``old`` (both status in wire form, ``phase`` that of
    ``new``) only in how far the audit record is known to reach (status.audit.recordedSeq and
    .record): not worth a write of its own while the run moves, the next commit carries it.
    A run at rest gets it committed (see :meth:`AuditRecord.flush`)."""
    if not old or phase in AT_REST:
        return False
    old_audit, new_audit = old.get("audit"), new.get("audit")
    if new_audit is not None and old_audit is None:
        return False
    if old_audit is not None and new_audit is not None:
        kept = {k: v for k, v in new_audit.items() if k not in _RECORD_PROGRESS}
        kept.update({k: v for k, v in old_audit.items() if k in _RECORD_PROGRESS})
        new = {**new, "audit": kept}
    return old == new


_RECORD_PROGRESS = ("recordedSeq", "record")
"""The keys of status.audit that say how far the audit record reaches."""


def _newly_finished(old: m.AgentRunStatus | None, new: m.AgentRunStatus) -> bool:
    before = {st.name: st.phase for st in (old.steps if old else None) or []}
    return any(
        st.phase in m.TERMINAL_STEP_PHASES and before.get(st.name) != st.phase
        for st in new.steps or []
    )


@dataclass(frozen=True)
class _Record:
    prefix: str
    maps: dict[str, dict[str, Any]]
    entries: list[dict[str, Any]]


class AuditRecord:
    """Runs' audit records: ConfigMaps of chained entries, one per committed transition.
    How far each record is known to reach is kept by the :class:`Observer`, which feeds it to
    the core; the foreign objects already reported, here."""

    def __init__(
        self, apis: Apis, observer: Observer, report: Report, guard: threading.Lock
    ) -> None:
        self.apis = apis
        self.observer = observer
        self.report = report
        self._guard = guard
        self._reported: set[tuple[str, str, str]] = set()
        """(run uid, ConfigMap, why) of foreign audit objects already reported by an Event."""

    def _read(self, run: m.AgentRun, latest: int) -> _Record:
        """The run's record: its own chunks only (:func:`audit.select`), entries up to the
        latest committed transition (``latest``). Anything else with the record's labels is
        ignored and reported once by a Warning Event; it never moves recordedSeq."""
        selector = objects.owned_by(run.metadata.uid, "audit")
        items = list_items(
            self.apis.core.list_namespaced_config_map(
                run.metadata.namespace, label_selector=selector, _preload_content=False
            )
        )
        return self._record(run, items, latest)

    def _read_tail(self, run: m.AgentRun, latest: int, stored: int) -> _Record | None:
        """The record as :meth:`_read` gives it, from only the chunks an append needs: the one
        holding entry ``stored`` (the last known recorded) to the one entry ``latest`` falls
        in, each read by its name (a chunk holds :data:`~agentrun.access.audit.CHUNK` entries:
        one read, two when the batch crosses into the next chunk). Entries before ``stored``
        are not read: the append continues from the last entry up to ``latest``, which is
        entry ``stored`` or past it. None, for :meth:`_read` to list every chunk, when those
        chunks do not hold entry ``stored`` (a chunk deleted or changed since) or more than
        two would be read."""
        prefix = audit.record_prefix(run.metadata.name, run.metadata.uid)
        names = audit.chunk_names(prefix, max(stored, 1), max(latest, 1))
        if len(names) > 2:
            return None
        items = []
        for name in names:
            with tolerate(404):
                response = self.apis.core.read_namespaced_config_map(
                    name, run.metadata.namespace, _preload_content=False
                )
                items.append(json.loads(response.data))
        record = self._record(run, items, latest)
        if stored > 0 and not any(int(e["seq"]) == stored for e in record.entries):
            return None
        return record

    def _record(self, run: m.AgentRun, items: list[dict[str, Any]], latest: int) -> _Record:
        """The record among ``items`` (ConfigMaps with the record's labels or names), entries
        up to ``latest``; the rest reported (:meth:`_report_foreign`)."""
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
            with self._guard:
                if seen in self._reported:
                    continue
                if len(self._reported) >= REPORTED_LIMIT:
                    self._reported.clear()
                self._reported.add(seen)
            message = (
                f"ConfigMap {name} carries the labels of this run's audit record but is not "
                f"part of it ({why}): ignored"
            )
            self.report(run, "ForeignAuditObject", message)

    def anchor(self, run: m.AgentRun, status: m.AgentRunStatus) -> None:
        """Advance the chain's head in ``status`` (committed with the transitions it covers)
        over the transitions past the head committed before. A run anchored before continues
        from its anchor; a run from before anchors existed, from its record's last entry."""
        committed = run.status.audit if run.status else None
        latest = (run.status.history_seq if run.status else None) or 0
        base = (0, audit.genesis(run.metadata.uid))
        if committed is not None and committed.head_seq is not None and committed.head_hash:
            base = (committed.head_seq, committed.head_hash)
        elif latest:
            entries = self._read(run, latest).entries
            if entries:
                base = (int(entries[-1]["seq"]), str(entries[-1].get("hash", "")))
        head = audit.advance(*base, status.history or [])
        if head is None:
            log.warning(
                "the audit chain cannot be anchored: status.history does not continue entry %d",
                base[0],
                extra=run_fields(run),
            )
            return
        anchor = status.audit or m.AuditStatus()
        anchor.head_seq, anchor.head_hash = head
        status.audit = anchor

    def flush(self, run: m.AgentRun, status: m.AgentRunStatus) -> bool:
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
        stored = max(committed, self.observer.recorded(uid) or 0)
        at_rest = status.phase in AT_REST
        waiting = latest - stored
        if waiting > 0 and (at_rest or waiting >= AUDIT_BATCH):
            # While the run moves, only the chunks being appended to are read (a list of every
            # chunk grows with the run: 18 of them after 1,000 agent turns); at rest, every
            # chunk, so that objects imitating the record are reported once the run stops.
            record = None if at_rest else self._read_tail(run, latest, stored)
            if record is None:
                record = self._read(run, latest)
            appended = self._sync(run, status, record)
            if appended is not None:
                stored = max(stored, appended)
                self.observer.note_recorded(uid, stored)
        if at_rest and committed >= stored:
            self.observer.drop_recorded(uid)  # status says it all: nothing to remember
        return at_rest and committed < stored

    def _sync(self, run: m.AgentRun, status: m.AgentRunStatus, record: _Record) -> int | None:
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
                        history[0].seq - 1, extra=run_fields(run))  # fmt: skip
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
                log.info("audit record moved on meanwhile; next pass appends",
                         extra=run_fields(run))  # fmt: skip
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
                    extra=run_fields(run))  # fmt: skip
        return True
