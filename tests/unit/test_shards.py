"""Shards: a run's shard, and what a replica takes, keeps and gives (agentrun/core/shards.py).
The keeper's Leases against a real API server: tests/integration/test_shards.py."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrun.core import shards as sh
from agentrun.settings import Settings, sharding_problem

D = 15.0


def held(holder: str, at: float = 0.0) -> sh.Seen:
    return sh.Seen(holder, at)


def test_a_runs_shard_is_stable_and_spreads_runs_evenly() -> None:
    assert sh.shard_of("team-a", "run-1", 12) == sh.shard_of("team-a", "run-1", 12)
    assert sh.shard_of("team-a", "run-1", 1) == 0
    assert sh.shard_of("team-a", "run-1", 0) == 0
    counts = Counter(sh.shard_of("ns", f"run-{i}", 12) for i in range(12_000))
    assert set(counts) == set(range(12))
    assert min(counts.values()) > 800, counts  # 1,000 each on average
    # The namespace is part of the key: the same name elsewhere is another run.
    assert len({sh.shard_of(f"ns-{i}", "run", 12) for i in range(50)}) > 6


def test_lease_names_are_valid_object_names_whatever_the_identity() -> None:
    assert sh.shard_lease(3) == "agentrun-shard-3"
    assert sh.shard_from_lease("agentrun-shard-3") == 3
    assert sh.shard_from_lease("agentrun-member-x") is None
    assert sh.shard_from_lease("agentrun-shard-x") is None
    assert (
        sh.member_lease("agentrun-operator-7d9f-abcde")
        == "agentrun-member-agentrun-operator-7d9f-abcde"
    )
    odd = sh.member_lease("Host_Name.example:1234")
    assert odd.startswith("agentrun-member-host-name-example-1234-")
    assert odd == odd.lower() and len(odd) <= 63
    long = sh.member_lease("x" * 200)
    assert len(long) <= 63 and long != sh.member_lease("x" * 199)


def test_a_lone_replica_takes_every_shard() -> None:
    decided = sh.plan("a", 12, {}, set(), now=100.0, duration=D)
    assert decided.take == tuple(range(12)) and not decided.keep and not decided.give


def test_replicas_split_the_shards_fairly() -> None:
    shards = {i: held("a") for i in range(12)}
    # b and c joined: a gives back all over its share of 4, the highest first.
    decided = sh.plan("a", 12, shards, {"a", "b", "c"}, now=1.0, duration=D)
    assert decided.keep == (0, 1, 2, 3) and decided.give == tuple(range(4, 12))
    assert not decided.take
    # b, with nothing yet, takes only what is free: a still holds the rest.
    shards.update({i: held("", 1.0) for i in range(4, 12)})
    b = sh.plan("b", 12, shards, {"a", "b", "c"}, now=2.0, duration=D)
    assert b.take == (4, 5, 6, 7)
    shards.update({i: held("b", 2.0) for i in b.take})
    c = sh.plan("c", 12, shards, {"a", "b", "c"}, now=2.0, duration=D)
    assert c.take == (8, 9, 10, 11)


def test_a_shard_is_taken_only_a_whole_duration_after_its_last_renewal_was_seen() -> None:
    shards = {0: held("dead", at=10.0), 1: held("b", at=10.0)}
    early = sh.plan("b", 2, shards, {"b"}, now=10.0 + D, duration=D)
    assert early.take == () and early.keep == (1,)
    late = sh.plan("b", 2, shards, {"b"}, now=10.0 + D + 0.1, duration=D)
    assert late.take == (0,)


def test_a_member_judged_alive_that_holds_nothing_does_not_keep_a_shard_undecided() -> None:
    # "ghost" still counts as a member, so each live replica's share is 1 of 3 shards.
    shards = {0: held("a", 50.0), 1: held("b", 50.0), 2: held("", 10.0)}
    members = {"a", "b", "ghost"}
    assert sh.plan("a", 3, shards, members, now=10.0 + D + 1, duration=D).take == ()
    assert sh.plan("a", 3, shards, members, now=10.0 + 2 * D + 1, duration=D).take == (2,)


def test_holders_own_renewal_lapses_before_anyone_else_may_take() -> None:
    assert sh.RENEW_FRACTION < 1
    assert sh.expired(held(""), 0.0, D)
    assert not sh.expired(held("a", 5.0), 5.0 + D, D)
    assert sh.expired(held("a", 5.0), 5.0 + D + 0.01, D)


def test_live_members_are_those_renewed_within_a_duration() -> None:
    leases = {"m-a": held("a", 90.0), "m-b": held("b", 70.0), "m-c": held("", 95.0)}
    assert sh.live_members(leases, now=100.0, duration=D) == {"a"}


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"shards": -1}, "must be 0 or more"),
        ({"shards": 4, "peering": "agentrun"}, "exclude each other"),
        ({"shards": 4, "shard_lease_seconds": 2}, "must be 3 or more"),
        ({"shards": 4}, None),
        ({"shards": 0, "peering": "agentrun"}, None),
    ],
)
def test_sharding_settings_that_cannot_work_are_refused_saying_why(
    env: dict[str, object], problem: str | None
) -> None:
    found = sharding_problem(Settings(**env))  # type: ignore[arg-type]
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
