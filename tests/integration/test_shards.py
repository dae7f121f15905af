"""Shard Leases against the real API server (agentrun/loop/shards.py): replicas split the
shards, take a dead replica's only a lease duration after its last renewal (and it stops
deciding before that), race for a Lease with one winner (the resourceVersion fence), and give
everything back at a clean stop.

The keepers tick by hand here, on one made-up monotonic clock: each step is one tick of one
replica, so the order of events is the test's, not the scheduler's. After every step no
shard is owned by two keepers at once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as kube_client

from agentrun.api import models as m
from agentrun.core import Observed, reconcile
from agentrun.core import shards as sh
from agentrun.loop.ledger import Conflict, Ledger
from agentrun.loop.shards import LEASE_LABEL, ShardKeeper
from agentrun_devcluster.testing import KubeClients
from tests.support.runs import agentrun, create, get, step

COUNT = 6
DURATION = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def keepers(kube: KubeClients, namespace: str, clock: Clock) -> Iterator[dict[str, ShardKeeper]]:
    api = kube_client.CoordinationV1Api(kube.api_client)
    made = {
        name: ShardKeeper(api, namespace, name, COUNT, DURATION, clock=clock)
        for name in ("a", "b", "c")
    }
    yield made


def leases(kube: KubeClients, namespace: str) -> list[dict[str, Any]]:
    api = kube_client.CoordinationV1Api(kube.api_client)
    answer: Any = api.list_namespaced_lease(
        namespace, label_selector=LEASE_LABEL, _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(answer.data)["items"]
    return items


def holders(kube: KubeClients, namespace: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for lease in leases(kube, namespace):
        shard = sh.shard_from_lease(lease["metadata"]["name"])
        if shard is not None:
            found[shard] = lease["spec"].get("holderIdentity") or ""
    return found


def assert_exclusive(keepers: dict[str, ShardKeeper]) -> dict[str, frozenset[int]]:
    owned = {name: k.owned() for name, k in keepers.items()}
    names = list(owned)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            both = owned[first] & owned[second]
            assert not both, f"shards {sorted(both)} owned by {first} and {second}: {owned}"
    return owned


def test_replicas_split_the_shards_and_a_dead_ones_are_taken_a_lease_duration_later(
    kube: KubeClients, namespace: str, keepers: dict[str, ShardKeeper], clock: Clock
) -> None:
    a, b, c = keepers["a"], keepers["b"], keepers["c"]
    a.tick()
    assert a.owned() == frozenset(range(COUNT)), "a lone replica takes every shard"
    for k in (b, c):
        k.tick()
        assert_exclusive(keepers)
    assert b.owned() == frozenset() and c.owned() == frozenset()
    clock.now += 1
    a.tick()  # three members now: a gives back all over its share
    assert a.owned() == frozenset({0, 1})
    assert_exclusive(keepers)
    for k in (b, c):
        k.tick()
        assert_exclusive(keepers)
    owned = assert_exclusive(keepers)
    assert {len(s) for s in owned.values()} == {2}, owned
    assert set(holders(kube, namespace).values()) == {"a", "b", "c"}

    # a dies: no more ticks. It stops deciding two thirds of a duration after it last
    # *sent* a renewal; b and c take its shards only a whole duration after they saw it.
    a_shards = a.owned()
    died = clock.now
    for _ in (1, 2):
        clock.now += 0.5
        b.tick()
        c.tick()
        assert_exclusive(keepers)
    clock.now = died + DURATION * sh.RENEW_FRACTION + 0.01
    assert a.owned() == frozenset(), "a cut-off replica must stop deciding by itself"
    b.tick()
    c.tick()
    assert "a" in holders(kube, namespace).values()
    assert not (b.owned() | c.owned()) & a_shards, "taken before a lease duration passed"
    clock.now = died + DURATION + 1.1
    for k in (b, c, b, c):
        k.tick()
        assert_exclusive(keepers)
    assert b.owned() | c.owned() == frozenset(range(COUNT))
    assert len(b.owned()) == len(c.owned()) == 3
    assert "a" not in holders(kube, namespace).values()


def test_of_two_replicas_taking_one_lease_at_once_one_wins(
    kube: KubeClients, namespace: str, keepers: dict[str, ShardKeeper], clock: Clock
) -> None:
    a, b = keepers["a"], keepers["b"]
    # Both see shard 0 free (no Lease yet) and both create it: one create is refused (409).
    a._observe(clock.now)
    b._observe(clock.now)
    a._write_shard(0, renew=False)
    b._write_shard(0, renew=False)
    a._tell()
    b._tell()
    assert a.owned() == frozenset({0}) and b.owned() == frozenset()
    # The Lease exists now; a lets it lapse, both see it expired at the same version and
    # both PUT it at that version: the second PUT is refused (409).
    clock.now += DURATION + 1
    a._observe(clock.now)
    b._observe(clock.now)
    b._write_shard(0, renew=False)
    a._write_shard(0, renew=False)
    a._tell()
    b._tell()
    assert b.owned() == frozenset({0}) and a.owned() == frozenset()
    assert holders(kube, namespace) == {0: "b"}


def test_a_clean_stop_gives_every_shard_back_at_once(
    kube: KubeClients, namespace: str, keepers: dict[str, ShardKeeper], clock: Clock
) -> None:
    a, b = keepers["a"], keepers["b"]
    a.tick()
    b.tick()
    assert a.owned() == frozenset(range(COUNT))
    lost: list[frozenset[int]] = []
    a.on_change = lambda gained, gone: lost.append(gone)
    a.stop(release=True)
    assert a.owned() == frozenset() and lost and lost[-1] == frozenset(range(COUNT))
    assert set(holders(kube, namespace).values()) == {""}
    names = {lease["metadata"]["name"] for lease in leases(kube, namespace)}
    assert sh.member_lease("a") not in names
    clock.now += 0.1  # no lease duration to wait
    b.tick()
    assert b.owned() == frozenset(range(COUNT))


def test_a_shard_with_a_pass_in_flight_is_given_back_only_once_it_ended(
    kube: KubeClients, namespace: str, keepers: dict[str, ShardKeeper], clock: Clock
) -> None:
    a, b = keepers["a"], keepers["b"]
    busy = {True}
    a.busy = lambda shards: bool(busy)
    a.tick()
    b.tick()
    clock.now += 1
    a.tick()  # over its share: stops deciding 3..5 at once, but a pass of theirs still runs
    assert a.owned() == frozenset({0, 1, 2})
    assert holders(kube, namespace) == dict.fromkeys(range(COUNT), "a")
    b.tick()
    assert b.owned() == frozenset()
    busy.clear()
    clock.now += 1
    a.tick()
    b.tick()
    assert a.owned() == frozenset({0, 1, 2}) and b.owned() == frozenset({3, 4, 5})


def test_a_replica_that_lost_a_runs_shard_mid_pass_cannot_commit_what_it_read(
    kube: KubeClients,
    namespace: str,
    crd_installed: list[str],
    keepers: dict[str, ShardKeeper],
    clock: Clock,
) -> None:
    """The fence under rebalancing: ``a`` reads a run while it owns the run's shard, then is
    cut off; ``b`` takes the shard a lease duration later and commits; ``a``'s late commit,
    from its stale read, is refused (409, a Conflict) and the run keeps ``b``'s status."""
    a, b = keepers["a"], keepers["b"]
    a.tick()
    b.tick()  # b sees a's Leases from now on; a holds every shard still
    created = create(kube, namespace, agentrun("fenced", [step("a", "true")]))
    assert a.owns(namespace, "fenced")
    read_by_a = get(kube, namespace, "fenced")
    ledger = Ledger(kube.custom)

    clock.now += DURATION + 1  # a renews no more (cut off); b sees its Leases expire
    b.tick()
    assert not a.owns(namespace, "fenced") and b.owns(namespace, "fenced")
    decided = reconcile(m.AgentRun.model_validate(created), Observed(), datetime.now(UTC))
    by_b = {**decided.status.to_wire(), "message": "decided by b"}
    ledger.commit(get(kube, namespace, "fenced"), by_b)
    with pytest.raises(Conflict):
        ledger.commit(read_by_a, {**decided.status.to_wire(), "message": "decided by a"})
    assert get(kube, namespace, "fenced")["status"]["message"] == "decided by b"


def test_replicas_that_disagree_on_the_shard_count_decide_nothing_until_they_agree(
    kube: KubeClients, namespace: str, keepers: dict[str, ShardKeeper], clock: Clock
) -> None:
    """Replicas splitting the runs differently would each decide some runs of the other's
    shards: while a live Lease shows another count, a replica gives back all it holds and
    takes nothing; once the odd one is gone, the others take everything back."""
    a = keepers["a"]
    api = kube_client.CoordinationV1Api(kube.api_client)
    odd = ShardKeeper(api, namespace, "odd", COUNT - 2, DURATION, clock=clock)
    a.tick()
    assert a.owned() == frozenset(range(COUNT))
    odd.tick()
    assert odd.owned() == frozenset(), "a replica with another count took shards"
    clock.now += 1
    a.tick()
    assert a.owned() == frozenset(), "a replica went on deciding beside another count"
    assert set(holders(kube, namespace).values()) == {""}
    odd.tick()  # every shard is free now: still none for a replica that disagrees
    assert odd.owned() == frozenset(), "a replica with another count took free shards"
    odd.stop(release=True)  # the odd one leaves (its member Lease is deleted)
    clock.now += 1
    a.tick()
    assert a.owned() == frozenset(range(COUNT))


class _Watching:
    """Records what a keeper tells ``follow`` and checks, at every write of a shard Lease,
    that the shard was told first: its Jobs and pods are watched before its runs are decided."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.told: frozenset[int] = frozenset()
        self.late: list[str] = []

    def follow(self, shards: frozenset[int]) -> None:
        self.told = shards

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.api, name)
        if name not in ("create_namespaced_lease", "replace_namespaced_lease"):
            return call

        def checked(*args: Any, **kwargs: Any) -> Any:
            body = args[-1] if name == "create_namespaced_lease" else args[2]
            lease = body["metadata"]["name"]
            shard = sh.shard_from_lease(lease)
            holding = (body.get("spec") or {}).get("holderIdentity")
            if shard is not None and holding and shard not in self.told:
                self.late.append(lease)
            return call(*args, **kwargs)

        return checked


def test_a_replica_watches_a_shards_jobs_before_it_takes_the_shard_and_until_it_gave_it_back(
    kube: KubeClients, namespace: str, clock: Clock
) -> None:
    api = kube_client.CoordinationV1Api(kube.api_client)
    watching = {name: _Watching(api) for name in ("a", "b")}
    a, b = (
        ShardKeeper(
            watching[name], namespace, name, COUNT, DURATION, clock=clock,
            follow=watching[name].follow,
        )
        for name in ("a", "b")
    )  # fmt: skip
    a.tick()
    assert a.owned() == watching["a"].told == frozenset(range(COUNT))
    b.tick()
    clock.now += 1
    a.tick()  # over its share: gives three back, and stops watching them once they are given
    assert a.owned() == watching["a"].told == frozenset({0, 1, 2})
    for _ in range(2):
        clock.now += 1
        b.tick()
    assert b.owned() == watching["b"].told == frozenset({3, 4, 5})
    assert watching["a"].late == [] and watching["b"].late == []
    b.stop(release=True)
    assert watching["b"].told == frozenset()
