"""The audit record's appends (agentrun/loop/commit.py, ``AuditRecord``) over a run of many
transitions: while the run moves, an append reads only the chunks it needs, by name; at
rest, every chunk is listed (objects imitating the record are reported then); a chunk that
does not hold the last entry recorded sends the append back to the list. The record made
so is the whole chain, intact. Against a real API server: tests/e2e/test_audit_tamper.py."""

from __future__ import annotations

import copy
import json
import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.access import audit
from agentrun.api import models as m
from agentrun.loop.commit import AuditRecord
from agentrun.loop.common import Apis
from agentrun.loop.observe import Observer
from tests.support.sim import UID, Sim, make_run, step

CHUNK = 40
"""Entries per chunk in these tests (fewer than the operator's, so that a plan's record
spans several)."""


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "CHUNK", CHUNK)


class ConfigMaps:
    """The ConfigMaps of a namespace as the record uses them; counts lists and reads."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.lists = 0
        self.reads = 0
        self.version = 0

    def list_namespaced_config_map(self, namespace: str, **options: Any) -> Any:
        self.lists += 1
        return SimpleNamespace(data=json.dumps({"items": list(self.maps.values())}).encode())

    def read_namespaced_config_map(self, name: str, namespace: str, **options: Any) -> Any:
        self.reads += 1
        if name not in self.maps:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps({"kind": "ConfigMap", **self.maps[name]}).encode())

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if name in self.maps:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(copy.deepcopy(body))

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any) -> None:
        stored = self.maps[name]["metadata"]["resourceVersion"]
        if body["metadata"].get("resourceVersion") != stored:
            raise ApiException(status=409, reason="Conflict")
        self._store(copy.deepcopy(body))

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.maps[body["metadata"]["name"]] = body


class Recorded:
    """The observer's memory of how far each record reaches (``Observer``'s part of it)."""

    def __init__(self) -> None:
        self.seqs: dict[str, int] = {}

    def recorded(self, run_uid: str) -> int | None:
        return self.seqs.get(run_uid)

    def note_recorded(self, run_uid: str, seq: int) -> None:
        self.seqs[run_uid] = max(seq, self.seqs.get(run_uid, 0))

    def drop_recorded(self, run_uid: str) -> None:
        self.seqs.pop(run_uid, None)


def drive(steps: int, maps: ConfigMaps, meddle: Any = None) -> Sim:
    """A sequential plan of ``steps`` driven to its end as the reconciler drives it: the
    chain's head anchored before each status write, the record appended to after it.
    ``meddle(maps, recorded)`` runs after each pass."""
    plan = [step(f"s{i:03d}", *([f"s{i - 1:03d}"] if i else [])) for i in range(steps)]
    sim = Sim(make_run(plan, name="long"))
    memory = Recorded()
    record = AuditRecord(
        Apis(core=maps, batch=None, custom=None),
        cast(Observer, memory),
        lambda run, reason, message: None,
        threading.Lock(),
    )
    for _ in range(6 * steps):
        decision, version = sim.decide()
        record.anchor(sim.run, decision.status)
        assert sim.commit(decision, version)
        for action in decision.after_commit:
            sim.apply(action)
        levelled = record.flush(sim.run, decision.status)
        if meddle is not None:
            meddle(maps, memory)
        if sim.status.phase in m.TERMINAL_RUN_PHASES and not levelled:
            break
        for job in sim.active():
            sim.finish(job.name, True, json.dumps({"ok": True, "summary": "done"}))
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    return sim


def whole_record(maps: ConfigMaps, sim: Sim) -> list[dict[str, Any]]:
    prefix = audit.record_prefix(sim.run.metadata.name, UID)
    chosen = audit.select(maps.maps.values(), prefix, UID)
    assert not chosen.ignored
    return chosen.entries


def test_appends_while_the_run_moves_read_only_the_chunks_they_need() -> None:
    maps = ConfigMaps()
    sim = drive(100, maps)
    entries = whole_record(maps, sim)
    assert sim.status.history_seq is not None and sim.status.history_seq > 4 * CHUNK
    assert len(maps.maps) >= 5, "the record spans chunks"
    assert [e["seq"] for e in entries] == list(range(1, sim.status.history_seq + 1))
    assert audit.verify(entries, UID) == []
    assert sim.status.audit is not None
    assert (sim.status.audit.head_seq, sim.status.audit.head_hash) == (
        entries[-1]["seq"],
        entries[-1]["hash"],
    )
    # Every append while the run moved read one or two chunks by name; only the run's end,
    # at rest, listed them all.
    appends = sim.status.history_seq // 32
    assert maps.lists == 1
    assert appends <= maps.reads <= 2 * appends


def test_a_chunk_that_lost_the_last_entry_recorded_sends_the_append_back_to_the_list() -> None:
    maps = ConfigMaps()
    meddled: list[int] = []

    def drop_last_recorded(maps: ConfigMaps, memory: Recorded) -> None:
        stored = memory.recorded(UID)
        if meddled or stored is None or stored < 32:
            return
        chunk = maps.maps[audit.chunk_name(audit.record_prefix("long", UID), stored)]
        chunk["data"].pop(audit.key(stored))
        meddled.append(stored)

    sim = drive(60, maps, drop_last_recorded)
    assert meddled, "the record was changed while the run moved"
    assert maps.lists >= 2, "the append after the change listed every chunk"
    # As a list finds it: the record continues from its last entry, so the lost one is
    # appended again and the chain is whole.
    entries = whole_record(maps, sim)
    assert [e["seq"] for e in entries] == list(range(1, (sim.status.history_seq or 0) + 1))
    assert audit.verify(entries, UID) == []
