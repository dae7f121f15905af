"""The hash-chained audit record."""

from __future__ import annotations

from datetime import UTC, datetime

from agentrun.access import audit
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
    # The chunks an append from entry 'first' to entry 'last' touches, as chunk_name names them.
    assert audit.chunk_names(prefix, 1, audit.CHUNK) == [audit.chunk_name(prefix, 1)]
    assert audit.chunk_names(prefix, audit.CHUNK, audit.CHUNK + 1) == [
        audit.chunk_name(prefix, audit.CHUNK),
        audit.chunk_name(prefix, audit.CHUNK + 1),
    ]
    assert len(audit.chunk_names(prefix, 1, 2 * audit.CHUNK + 1)) == 3


# -- the anchor in status ---------------------------------------------------------------------


def _head(transitions: list[m.Transition]) -> tuple[int, str]:
    head = audit.advance(0, audit.genesis(UID), transitions)
    assert head is not None
    return head


def test_the_anchor_is_the_hash_of_the_chains_last_entry() -> None:
    transitions = _transitions(6)
    entries = audit.extend(transitions, 0, audit.genesis(UID))
    assert _head(transitions) == (6, entries[-1]["hash"])
    first = audit.advance(0, audit.genesis(UID), transitions[:4])
    assert first is not None
    assert audit.advance(*first, transitions) == (6, entries[-1]["hash"])
    assert audit.advance(0, audit.genesis(UID), transitions[1:]) is None, "a gap has no head"


def test_an_intact_record_ends_at_the_anchor() -> None:
    transitions = _transitions(6)
    entries = audit.extend(transitions, 0, audit.genesis(UID))
    assert audit.verify_anchored(entries, transitions[-2:], UID, *_head(transitions)) == []


def test_transitions_committed_but_not_appended_yet_are_taken_from_history() -> None:
    transitions = _transitions(6)
    entries = audit.extend(transitions, 0, audit.genesis(UID))[:4]
    assert audit.verify_anchored(entries, transitions[3:], UID, *_head(transitions)) == []
    assert audit.verify_anchored([], transitions, UID, *_head(transitions)) == []


def test_a_rechained_edit_passes_the_chain_but_not_the_anchor() -> None:
    transitions = _transitions(6)
    head = _head(transitions)
    forged = list(transitions)
    forged[1] = forged[1].model_copy(update={"by": "mallory"})
    rechained = audit.extend(forged, 0, audit.genesis(UID))
    assert audit.verify(rechained, UID) == [], "the chain alone cannot tell"
    problems = audit.verify_anchored(rechained, [], UID, *head)
    assert len(problems) == 1 and "does not end at the head anchored" in problems[0]


def test_a_removed_tail_and_a_forged_extra_entry_are_reported() -> None:
    transitions = _transitions(8)
    entries = audit.extend(transitions, 0, audit.genesis(UID))
    head = _head(transitions[:6])
    past = audit.verify_anchored(entries, [], UID, *head)
    assert past == [
        "entries 7..8 are past the head anchored in status.audit (entry 6): the operator "
        "never committed them"
    ]
    missing = audit.verify_anchored(entries[:3], transitions[5:6], UID, *head)
    assert (
        len(missing) == 1
        and "entry 4 is neither in the record nor in status.history" in (missing[0])
    )


# -- which objects are the record -------------------------------------------------------------


PREFIX = audit.record_prefix("demo", UID)


def _config_map(
    name: str, data: dict[str, str], *, owner: str | None = UID, controller: bool = True
) -> dict[str, object]:
    refs = [{"uid": owner, "controller": controller}] if owner else []
    return {"metadata": {"name": name, "ownerReferences": refs}, "data": data}


def _data(entries: list[dict[str, object]]) -> dict[str, str]:
    import json

    return {audit.key(int(str(e["seq"]))): json.dumps(e) for e in entries}


def test_only_the_runs_own_chunks_and_their_own_entries_are_the_record() -> None:
    entries = audit.extend(_transitions(3), 0, audit.genesis(UID))
    forged = {**entries[0], "seq": 1_000_000}
    chosen = audit.select(
        [
            _config_map(f"{PREFIX}-1", {**_data(entries), audit.key(1_000_000): str(forged)}),
            _config_map("lookalike", _data([forged])),
            _config_map(f"{PREFIX}-2500", _data([forged]), owner="someone-else"),
            _config_map(f"{PREFIX}-2500", _data([forged]), controller=False),
            _config_map(f"{PREFIX}-01", _data(entries)),
        ],
        PREFIX,
        UID,
    )
    assert chosen.entries == entries
    assert list(chosen.maps) == [f"{PREFIX}-1"]
    why = dict(chosen.ignored)
    assert "not entries 1 to 400" in why[f"{PREFIX}-1"]
    assert "not named as a chunk" in why["lookalike"]
    assert "not owned by the run" in why[f"{PREFIX}-2500"]
    assert "not named as a chunk" in why[f"{PREFIX}-01"]
    assert len(chosen.ignored) == 5


def test_an_entry_filed_under_another_key_or_past_the_limit_is_not_the_record() -> None:
    import json

    entries = audit.extend(_transitions(3), 0, audit.genesis(UID))
    misfiled = {audit.key(2): json.dumps(entries[0]), audit.key(1): json.dumps(entries[0])}
    chosen = audit.select([_config_map(f"{PREFIX}-1", misfiled)], PREFIX, UID)
    assert [e["seq"] for e in chosen.entries] == [1]
    limited = audit.select([_config_map(f"{PREFIX}-1", _data(entries))], PREFIX, UID, limit=2)
    assert [e["seq"] for e in limited.entries] == [1, 2]
    assert "past the run's latest transition (2)" in limited.ignored[0][1]


def test_unreadable_entries_never_break_parsing() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    parsed = audit.parse([{"a": deep, "b": '{"seq": "x"}', "c": "[]"}])
    assert len(parsed) == 3 and all(audit.verify([p], UID) for p in parsed)
