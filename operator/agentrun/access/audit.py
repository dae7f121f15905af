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

Anchor. Anyone who may write ConfigMaps in the namespace can edit an entry and recompute every
hash after it: the chain alone then still verifies. So the head of the chain is also kept where
only the operator writes, ``status.audit.headSeq`` and ``headHash`` (:func:`advance`), in the
same status write that commits the transitions it covers. The record is appended only after
that write, so a crash can leave the anchor ahead of the record, never behind it; the
transitions in between are still in ``status.history``, which keeps what the record lacks.
:func:`verify_anchored` recomputes the chain over the record and then those transitions and
requires it to end at the anchored hash: a re-chained edit, a removed tail or a forged extra
entry no longer does.

What counts as the record (:func:`select`): only ConfigMaps whose controller owner reference
is the run and whose name is a chunk name of its prefix (:func:`chunk_name`), and in them only
entries filed under their own key in the chunk their seq belongs to. Anything else carrying the
record's labels is ignored, and described so that it can be reported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrun.api import models as m
from agentrun.core import naming

CHUNK = 400
"""Entries per ConfigMap (each well under 1 KiB, far below the 1 MiB ConfigMap limit)."""


def record_prefix(run_name: str, run_uid: str) -> str:
    """Name prefix of a run's record ConfigMaps (DNS label, room for a chunk suffix)."""
    digest = hashlib.sha256(f"{run_uid}:audit".encode()).hexdigest()[:8]
    return naming.dns_label(f"{run_name}-audit", digest)[:58].rstrip("-")


def _chunk(seq: int) -> int:
    return (seq - 1) // CHUNK + 1


def chunk_name(prefix: str, seq: int) -> str:
    return f"{prefix}-{_chunk(seq)}"


def chunk_names(prefix: str, first: int, last: int) -> list[str]:
    """The chunks holding entries ``first`` to ``last``, in order."""
    return [f"{prefix}-{n}" for n in range(_chunk(first), _chunk(last) + 1)]


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
            except (ValueError, TypeError, RecursionError):
                parsed = {"seq": -1, "unreadable": str(value)[:80]}
            entries.append(parsed if isinstance(parsed, dict) else {"seq": -1})
    return sorted(entries, key=_seq_of)


def _seq_of(e: Mapping[str, Any]) -> int:
    """An entry's seq for ordering; -1 when it has none (an unreadable or forged entry)."""
    seq = e.get("seq")
    return seq if type(seq) is int else -1


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


# -- the anchor in status ---------------------------------------------------------------------


def advance(
    head_seq: int, head_hash: str, transitions: Iterable[m.Transition]
) -> tuple[int, str] | None:
    """The chain's head after the transitions past ``head_seq``, in seq order; None when they
    do not follow it without a gap (then no head can be computed)."""
    seq, digest = head_seq, head_hash
    for t in sorted(transitions, key=lambda t: t.seq):
        if t.seq <= seq:
            continue
        if t.seq != seq + 1:
            return None
        digest = entry(t, digest)["hash"]
        seq = t.seq
    return seq, digest


def verify_anchored(
    entries: Sequence[Mapping[str, Any]],
    history: Iterable[m.Transition],
    run_uid: str,
    head_seq: int,
    head_hash: str,
) -> list[str]:
    """Problems of the record against the head anchored in status, in words.

    The chain is recomputed from genesis over each entry's content (its own ``prev`` and
    ``hash`` are not trusted), taking every seq up to ``head_seq`` from the record, or from
    ``history`` (status.history) for the transitions committed but not yet appended; it must
    end at ``head_hash``. Entries past the head were never committed by the operator.
    """
    problems: list[str] = []
    by_seq: dict[int, Mapping[str, Any]] = {}
    for e in entries:
        seq = e.get("seq")
        if type(seq) is int and seq >= 1:
            by_seq.setdefault(seq, e)
    later = {t.seq: t for t in history}
    past = sorted(s for s in by_seq if s > head_seq)
    if past:
        problems.append(
            f"entries {past[0]}..{past[-1]} are past the head anchored in status.audit "
            f"(entry {head_seq}): the operator never committed them"
        )
    prev = genesis(run_uid)
    for seq in range(1, head_seq + 1):
        stored = by_seq.get(seq)
        if stored is not None:
            body = {k: v for k, v in stored.items() if k not in ("hash", "prev")}
            body["prev"] = prev
            prev = _digest(prev, body)
        elif seq in later:
            prev = entry(later[seq], prev)["hash"]
        else:
            problems.append(
                f"entry {seq} is neither in the record nor in status.history: the chain up to "
                f"the anchored head (entry {head_seq}) cannot be recomputed"
            )
            return problems
    if prev != head_hash:
        problems.append(
            f"the recomputed chain does not end at the head anchored in status.audit (entry "
            f"{head_seq}, hash {head_hash[:12]}): entries were changed after they were written"
        )
    return problems


# -- which objects are the record ---------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The run's record among the ConfigMaps carrying its audit labels."""

    maps: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The run's own chunks, by name (the ConfigMaps as read)."""
    entries: list[dict[str, Any]] = field(default_factory=list)
    """Their entries that belong where they are filed, in seq order."""
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """(ConfigMap name, why it or some of its data is not part of the record)."""


def _controlled_by(item: Mapping[str, Any], run_uid: str) -> bool:
    refs = (item.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") is True and r.get("uid") == run_uid for r in refs)


def _chunk_number(name: str, prefix: str) -> int | None:
    rest = name[len(prefix) + 1 :] if name.startswith(prefix + "-") else ""
    if not rest.isdigit() or rest != str(int(rest)) or int(rest) < 1:
        return None
    return int(rest)


def _keys(keys: Sequence[str]) -> str:
    shown = sorted(keys)
    return (
        "key(s) " + ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
    )


def select(
    items: Iterable[Mapping[str, Any]], prefix: str, run_uid: str, limit: int | None = None
) -> Selection:
    """The record among ``items`` (ConfigMaps labelled as the run's audit record): chunks the
    run controls, named ``<prefix>-<n>``, and in them the entries filed under their own key in
    their own chunk, up to seq ``limit`` when given. The rest is ignored and described."""
    selection = Selection()
    for item in sorted(items, key=lambda i: str((i.get("metadata") or {}).get("name", ""))):
        name = str((item.get("metadata") or {}).get("name", ""))
        number = _chunk_number(name, prefix)
        if not _controlled_by(item, run_uid):
            selection.ignored.append((name, "it is not owned by the run"))
            continue
        if number is None:
            selection.ignored.append(
                (name, f"it is not named as a chunk of the record ({prefix}-N)")
            )
            continue
        selection.maps[name] = dict(item)
        low, high = (number - 1) * CHUNK + 1, number * CHUNK
        misplaced: list[str] = []
        too_late: list[str] = []
        for k, value in (item.get("data") or {}).items():
            parsed = parse([{k: value}])[0]
            seq = parsed.get("seq")
            if type(seq) is not int or key(seq) != k or not low <= seq <= high:
                misplaced.append(k)
            elif limit is not None and seq > limit:
                too_late.append(k)
            else:
                selection.entries.append(parsed)
        if misplaced:
            selection.ignored.append(
                (name, f"{_keys(misplaced)} are not entries {low} to {high} of the run's record")
            )
        if too_late:
            selection.ignored.append(
                (name, f"{_keys(too_late)} are past the run's latest transition ({limit})")
            )
    selection.entries.sort(key=_seq_of)
    return selection
