"""A sharded replica's own watches of runs, against the real API server
(agentrun/observation/runs.py through ``Informer(runs=...)``, as agentrun/loop/run_watch.py
wires them): it receives the runs of the shards it follows, those labelled with no shard of
its count and every sub-agent child, and no other run; a run labelled into its shard's watch
never leaves what it knows meanwhile, one labelled away leaves it, and a shard given up
takes its runs with it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import shards as sh
from agentrun.core.subagents import LABEL_PARENT_UID
from agentrun.loop.ledger import Ledger
from agentrun.loop.run_watch import RunSources, RunWatch
from agentrun.observation.view import ClusterView, Source
from agentrun.observation.watches import Informer
from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.runs import agentrun, create, step
from tests.support.waiting import assert_holds

pytestmark = pytest.mark.usefixtures("crd_installed")

COUNT = 2


class Delivered:
    """What the view delivered: the runs present now, every DELETED, and the runs taken (as
    :meth:`RunWatch.changed` takes them: whole, while their shard is followed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.present: dict[str, str] = {}
        self.deleted: list[str] = []
        self.taken: set[str] = set()
        self.followed: frozenset[int] = frozenset()

    def wanted(self, namespace: str, name: str) -> bool:
        return sh.shard_of(namespace, name, COUNT) in self.followed

    def deliver(self, event_type: str, body: dict[str, Any], source: Source) -> None:
        meta = body["metadata"]
        with self.lock:
            if event_type == "DELETED":
                self.present.pop(meta["name"], None)
                self.deleted.append(meta["name"])
                self.taken.discard(meta["name"])
                return
            self.present[meta["name"]] = str(meta.get("resourceVersion", ""))
            if "spec" in body and self.wanted(meta["namespace"], meta["name"]):
                self.taken.add(meta["name"])

    def names(self) -> set[str]:
        with self.lock:
            return set(self.present)


def _in_shard(namespace: str, shard: int, prefix: str) -> str:
    return next(
        f"{prefix}-{n}"
        for n in range(1000)
        if sh.shard_of(namespace, f"{prefix}-{n}", COUNT) == shard
    )


@pytest.fixture
def watched(kube: KubeClients, namespace: str) -> Iterator[tuple[Informer, Delivered]]:
    delivered = Delivered()
    watch = SimpleNamespace(
        deliver=delivered.deliver,
        ledger=Ledger(kube.custom),
        bodies=None,
        wanted=delivered.wanted,
    )
    runs = RunSources(
        cast(RunWatch, watch), kube.custom, lambda ns: None, lambda kind: None, lambda r: None
    )
    apis = SimpleNamespace(core=kube.core, batch=kube.batch)
    informer = Informer(
        apis, [namespace], lambda ns, name, uid: None, ClusterView(), shard_count=COUNT, runs=runs
    )
    original = informer.follow

    def follow(shards: frozenset[int]) -> None:
        delivered.followed = shards
        original(shards)

    informer.follow = follow  # type: ignore[method-assign]
    informer.start()
    yield informer, delivered
    informer.stop()


def _labelled(body: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    body["metadata"]["labels"] = {**(body["metadata"].get("labels") or {}), **labels}
    return body


def _wait_names(delivered: Delivered, names: set[str], what: str) -> None:
    wait_for(what, lambda: delivered.names() == names or None, timeout=60)


def test_a_sharded_replica_watches_its_shards_runs_the_strays_and_every_child(
    kube: KubeClients, namespace: str, watched: tuple[Informer, Delivered]
) -> None:
    informer, delivered = watched
    a = _in_shard(namespace, 0, "a")  # labelled with its shard, 0
    b = _in_shard(namespace, 1, "b")  # labelled with its shard, 1
    c = _in_shard(namespace, 0, "c")  # not labelled yet
    d = _in_shard(namespace, 1, "d")  # a child, in shard 1
    for name, labels in (
        (a, {s.LABEL_SHARD: sh.shard_label(0, COUNT)}),
        (b, {s.LABEL_SHARD: sh.shard_label(1, COUNT)}),
        (c, {}),
        (d, {s.LABEL_SHARD: sh.shard_label(1, COUNT), LABEL_PARENT_UID: "parent"}),
    ):
        create(kube, namespace, _labelled(agentrun(name, [step("x")]), labels))

    # Following no shard: the run not labelled yet and the child only.
    _wait_names(delivered, {c, d}, "the stray and the child only")

    assert not delivered.taken
    informer.follow(frozenset({0}))
    _wait_names(delivered, {a, c, d}, "shard 0's runs, the stray and the child")
    # The stray of shard 0, delivered before shard 0 was followed, is read and taken now:
    # its holder must see it to label it (the strays' watch brings nothing new of it).
    wait_for("shard 0's runs taken", lambda: delivered.taken == {a, c} or None, timeout=30)

    # Its holder labels the stray with its shard: it moves from the strays' watch to shard
    # 0's, and is never taken for gone meanwhile.
    kube.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, c,
        {"metadata": {"labels": {s.LABEL_SHARD: sh.shard_label(0, COUNT)}}},
    )  # fmt: skip

    def c_known() -> None:
        assert c in delivered.names(), "the run labelled into its shard was taken for gone"

    assert_holds(c_known, seconds=3)
    assert c not in delivered.deleted

    # Someone who may edit runs labels it into shard 1, not followed here: it leaves.
    kube.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, c,
        {"metadata": {"labels": {s.LABEL_SHARD: sh.shard_label(1, COUNT)}}},
    )  # fmt: skip
    _wait_names(delivered, {a, d}, "the run labelled into shard 1 to leave")

    informer.follow(frozenset({1}))
    _wait_names(delivered, {b, c, d}, "shard 1's runs and the child")
    assert a in delivered.deleted
    # The child, delivered while its shard was not followed, is taken from its shard's watch
    # at the same version; the run of shard 0 labelled into shard 1 is delivered (to be
    # labelled back by whoever finds it there) but not taken.
    wait_for("shard 1's runs taken", lambda: delivered.taken == {b, d} or None, timeout=30)

    kube.custom.delete_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL, b)
    _wait_names(delivered, {c, d}, "the deleted run to go")
    assert informer.troubles() == []
