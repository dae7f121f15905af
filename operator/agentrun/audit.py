"""The audit record: every transition of a run, append-only and hash-chained.

``status.history`` is a bounded ring; the record keeps the whole trail. It lives in ConfigMaps
owned by the run (``<prefix>-1``, ``<prefix>-2``, ... of at most :data:`CHUNK` entries), one
data key per transition (``%08d`` of its seq), each entry a JSON object carrying the hash of the
entry before it:

    hash = sha256(prev + canonical JSON of the entry without "hash")

The first entry's ``prev`` is :func:`genesis` of the run's uid. :func:`verify` walks the chain:
a missing entry (a gap in seq), an edited entry (its hash no longer matches) or a reordered one
(its ``prev`` is not the hash before it) is reported.

Entries are a pure function of the committed history, so two operators appending at once write
the same bytes; writes are guarded by the ConfigMap's resourceVersion anyway.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentrun.api import models as m
from agentrun.core import naming

CHUNK = 400
"""Entries per ConfigMap (each well under 1 KiB, far below the 1 MiB ConfigMap limit)."""


def record_prefix(run_name: str, run_uid: str) -> str:
    """Name prefix of a run's record ConfigMaps (DNS label, room for a chunk suffix)."""
    digest = hashlib.sha256(f"{run_uid}:audit".encode()).hexdigest()[:8]
    return naming.dns_label(f"{run_name}-audit", digest)[:58].rstrip("-")


def chunk_name(prefix: str, seq: int) -> str:
    return f"{prefix}-{(seq - 1) // CHUNK + 1}"


def key(seq: int) -> str:
    return f"{seq:08d}"


def genesis(run_uid: str) -> str:
    return hashlib.sha256(f"agentrun.dev/audit/{run_uid}".encode()).hexdigest()


def _digest(prev: str, body: Mapping[str, Any]) -> str:
    return hashlib.sha256((prev + naming.canonical_json(dict(body))).encode()).hexdigest()


def entry(transition: m.Transition, prev: str) -> dict[str, Any]:
    """The record entry of one transition, chained to the hash ``prev``."""
    body = {k: v for k, v in transition.to_wire().items() if v is not None}
    body["prev"] = prev
    body["hash"] = _digest(prev, body)
    return body


def extend(
    transitions: Iterable[m.Transition], last_seq: int, last_hash: str
) -> list[dict[str, Any]]:
    """Entries for the transitions after ``last_seq``, in order, chained on ``last_hash``."""
    out: list[dict[str, Any]] = []
    prev = last_hash
    for t in sorted(transitions, key=lambda t: t.seq):
        if t.seq <= last_seq:
            continue
        made = entry(t, prev)
        out.append(made)
        prev = made["hash"]
    return out


def parse(data_maps: Iterable[Mapping[str, str]]) -> list[dict[str, Any]]:
    """All entries of a record (the ``data`` of its ConfigMaps), in seq order."""
    entries: list[dict[str, Any]] = []
    for data in data_maps:
        for value in (data or {}).values():
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = {"seq": -1, "unreadable": value[:80]}
            entries.append(parsed if isinstance(parsed, dict) else {"seq": -1})
    return sorted(entries, key=lambda e: int(e.get("seq", -1)))


def verify(entries: Sequence[Mapping[str, Any]], run_uid: str) -> list[str]:
    """Problems of the chain, in words; empty when it is intact from its first entry."""
    problems: list[str] = []
    prev = genesis(run_uid)
    expected_seq = 1
    for e in entries:
        seq = e.get("seq")
        if not isinstance(seq, int) or seq < 1:
            problems.append(f"unreadable entry: {dict(e)}")
            continue
        if seq != expected_seq:
            problems.append(f"gap: entry {seq} follows entry {expected_seq - 1}")
        body = {k: v for k, v in e.items() if k != "hash"}
        if e.get("prev") != prev:
            problems.append(f"entry {seq} does not chain to the entry before it")
        if _digest(str(e.get("prev", "")), body) != e.get("hash"):
            problems.append(f"entry {seq} was changed after it was written")
        prev = str(e.get("hash", ""))
        expected_seq = seq + 1
    return problems
