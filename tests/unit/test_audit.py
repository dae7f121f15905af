"""The hash-chained audit record."""

from __future__ import annotations

from datetime import UTC, datetime

from agentrun import audit
from agentrun.api import models as m

UID = "uid-1"


def _transitions(n: int) -> list[m.Transition]:
    at = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    return [
        m.Transition(
            at=at,
            step="s",
            from_phase="A",
            to_phase="B",
            reason="R",
            seq=i,
            by="alice" if i % 2 else None,
        )
        for i in range(1, n + 1)
    ]


def test_a_chain_built_from_transitions_verifies() -> None:
    entries = audit.extend(_transitions(5), 0, audit.genesis(UID))
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5]
    assert audit.verify(entries, UID) == []
    assert entries[0]["by"] == "alice" and "by" not in entries[1]


def test_extending_continues_the_chain() -> None:
    first = audit.extend(_transitions(3), 0, audit.genesis(UID))
    rest = audit.extend(_transitions(6), 3, first[-1]["hash"])
    assert [e["seq"] for e in rest] == [4, 5, 6]
    assert audit.verify([*first, *rest], UID) == []


def test_an_edited_entry_is_detected() -> None:
    entries = audit.extend(_transitions(4), 0, audit.genesis(UID))
    entries[1] = {**entries[1], "by": "mallory"}
    assert audit.verify(entries, UID) == ["entry 2 was changed after it was written"]


def test_a_removed_entry_is_detected() -> None:
    entries = audit.extend(_transitions(4), 0, audit.genesis(UID))
    del entries[2]
    problems = audit.verify(entries, UID)
    assert "gap: entry 4 follows entry 2" in problems
    assert "entry 4 does not chain to the entry before it" in problems


def test_a_record_of_another_run_does_not_verify() -> None:
    entries = audit.extend(_transitions(2), 0, audit.genesis("other"))
    assert audit.verify(entries, UID)


def test_parse_orders_entries_across_chunks() -> None:
    entries = audit.extend(_transitions(3), 0, audit.genesis(UID))
    import json

    maps = [
        {audit.key(3): json.dumps(entries[2])},
        {audit.key(1): json.dumps(entries[0]), audit.key(2): json.dumps(entries[1])},
    ]
    assert audit.parse(maps) == entries


def test_names_are_dns_labels_with_room_for_chunks() -> None:
    prefix = audit.record_prefix("a" * 80, UID)
    assert len(audit.chunk_name(prefix, 10_000)) <= 63
    assert audit.chunk_name(prefix, 1).endswith("-1")
    assert audit.chunk_name(prefix, audit.CHUNK + 1).endswith("-2")
