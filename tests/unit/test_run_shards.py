"""A sharded replica's own watches of runs (agentrun/observation/runs.py, agentrun/loop/
run_watch.py), their pure parts: each change of a run is delivered once whichever of its
watches brings it first, a run leaving one watch for another is not taken for deleted, the
events of runs of other shards are decoded only as far as their metadata, and a run is
labelled with its shard where no pass will. Against the API server:
tests/integration/test_run_watches.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import REGISTRY

from agentrun import settings as s
from agentrun.core import shards as sh
from agentrun.loop.ledger import Ledger
from agentrun.loop.run_events import RunEvents
from agentrun.loop.run_watch import RunWatch
from agentrun.loop.scheduler import Scheduler
from agentrun.observation.runs import RunView
from agentrun.observation.view import RUNS, Source
from agentrun_devcluster.testing import wait_for

COUNT = 3
STRAYS = Source(RUNS, "team", others=frozenset(sh.shard_label(i, COUNT) for i in range(COUNT)))
CHILDREN = Source(RUNS, "team", children=True)


def _shard(name: str) -> Source:
    return Source(RUNS, "team", shard=sh.run_shard_label("team", name, COUNT))


def _run(name: str, version: int, *, uid: str = "u1", label: str | None = None,
         phase: str | None = None, deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {
        "namespace": "team",
        "name": name,
        "uid": uid,
        "resourceVersion": str(version),
    }
    if label is not None:
        meta["labels"] = {s.LABEL_SHARD: label}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    body: dict[str, Any] = {"metadata": meta, "spec": {"goal": "g"}}
    if phase is not None:
        body["status"] = {"phase": phase}
    return body


class Seen:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.reads: list[str] = []
        self.stored: dict[str, dict[str, Any]] = {}

    def deliver(self, event_type: str, body: dict[str, Any], source: Source) -> None:
        meta = body["metadata"]
        self.events.append((event_type, meta["name"], str(meta.get("resourceVersion", ""))))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(name)
        return self.stored.get(name)


def _view(seen: Seen, wanted: Callable[[str, str], bool] = lambda ns, n: True) -> RunView:
    view = RunView(seen.deliver, seen.read, wanted)
    for source in (STRAYS, CHILDREN, _shard("a")):
        view.expect(source)
    return view


def test_a_run_in_two_watches_is_delivered_once_per_version() -> None:
    seen = Seen()
    view = _view(seen)
    view.apply(RUNS, "ADDED", _run("a", 5), CHILDREN)
    view.apply(RUNS, "ADDED", _run("a", 5), _shard("a"))
    view.apply(RUNS, "MODIFIED", _run("a", 7), _shard("a"))
    view.apply(RUNS, "MODIFIED", _run("a", 7), CHILDREN)
    view.apply(RUNS, "MODIFIED", _run("a", 6), CHILDREN)  # late, older: nothing new
    assert seen.events == [("ADDED", "a", "5"), ("MODIFIED", "a", "7")]


def test_a_run_labelled_out_of_the_strays_into_its_shard_is_not_deleted() -> None:
    """Its shard's ADDED came first: the strays' DELETED is its leaving, not read."""
    seen = Seen()
    view = _view(seen)
    label = sh.run_shard_label("team", "a", COUNT)
    view.apply(RUNS, "ADDED", _run("a", 5), STRAYS)
    view.apply(RUNS, "ADDED", _run("a", 6, label=label), _shard("a"))
    view.apply(RUNS, "DELETED", _run("a", 6), STRAYS)
    assert seen.events == [("ADDED", "a", "5"), ("ADDED", "a", "6")]
    assert seen.reads == []


def test_a_strays_deleted_before_its_shards_added_reads_the_run_and_waits() -> None:
    """The strays' DELETED came first: the run is read, found, and left to its shard's
    watch; delivered as deleted only when the read finds it gone."""
    seen = Seen()
    view = _view(seen)
    label = sh.run_shard_label("team", "a", COUNT)
    view.apply(RUNS, "ADDED", _run("a", 5), STRAYS)
    seen.stored["a"] = _run("a", 6, label=label)
    view.apply(RUNS, "DELETED", _run("a", 6), STRAYS)
    assert seen.reads == ["a"]
    view.apply(RUNS, "ADDED", _run("a", 6, label=label), _shard("a"))
    assert seen.events == [("ADDED", "a", "5"), ("ADDED", "a", "6")]

    view.apply(RUNS, "ADDED", _run("b", 8), STRAYS)
    view.apply(RUNS, "DELETED", _run("b", 9), STRAYS)  # deleted before any label: gone
    view.apply(RUNS, "ADDED", _run("c", 10, uid="old"), STRAYS)
    seen.stored["c"] = _run("c", 12, uid="new")  # deleted and made again under the name
    view.apply(RUNS, "DELETED", _run("c", 11, uid="old"), STRAYS)
    assert seen.events[2:] == [
        ("ADDED", "b", "8"),
        ("DELETED", "b", "9"),
        ("ADDED", "c", "10"),
        ("DELETED", "c", "11"),
    ]


def test_only_a_leaving_that_may_be_a_move_here_is_read() -> None:
    """A shard's DELETED, one showing the run's deletion, or one of a run whose shard is
    not followed here is delivered as it came, without a read."""
    seen = Seen()
    view = _view(seen, wanted=lambda ns, name: name != "other")
    view.apply(RUNS, "ADDED", _run("a", 5, label="x"), _shard("a"))
    view.apply(RUNS, "DELETED", _run("a", 6, label="x"), _shard("a"))
    view.apply(RUNS, "ADDED", _run("d", 7), STRAYS)
    view.apply(RUNS, "DELETED", _run("d", 8, deleting=True), STRAYS)
    view.apply(RUNS, "ADDED", _run("other", 9), STRAYS)
    view.apply(RUNS, "DELETED", _run("other", 10), STRAYS)
    assert seen.reads == []
    assert [e[0] for e in seen.events] == ["ADDED", "DELETED"] * 3


def test_a_relist_and_a_forgotten_watch_deliver_the_runs_gone_from_every_watch() -> None:
    seen = Seen()
    view = _view(seen)
    view.replace(_shard("a"), [_run("a", 5), _run("b", 6)])
    view.replace(CHILDREN, [_run("b", 6)])
    view.replace(_shard("a"), [_run("a", 5)])  # b left the shard's watch, still a child
    assert seen.events == [("ADDED", "a", "5"), ("ADDED", "b", "6")]
    view.forget(_shard("a"))
    view.apply(RUNS, "MODIFIED", _run("a", 9), _shard("a"))  # late, from the forgotten one
    assert seen.events[2:] == [("DELETED", "a", "")]
    assert view.size() == 1


def test_a_run_delivered_before_its_shard_was_followed_is_taken_once_it_is() -> None:
    """A stray listed before its shard was followed here is read and delivered again once it
    is; a child delivered only as far as its metadata is delivered whole by its shard's
    watch at the same version."""
    seen = Seen()
    followed: set[str] = set()
    view = _view(seen, wanted=lambda ns, name: name in followed)
    view.replace(STRAYS, [_run("s", 5)])
    view.apply(RUNS, "ADDED", {"metadata": _run("a", 6)["metadata"]}, CHILDREN)
    view.apply(RUNS, "ADDED", _run("a", 6), _shard("a"))  # not followed yet: not taken
    view.apply(RUNS, "MODIFIED", _run("a", 6), CHILDREN)
    assert seen.events == [("ADDED", "s", "5"), ("ADDED", "a", "6")]
    followed.update({"s", "a"})
    seen.stored["s"] = _run("s", 5)
    view.followed()
    wait_for("the stray read again", lambda: len(seen.events) == 3 or None, timeout=10)
    assert seen.reads == ["s"]
    view.apply(RUNS, "MODIFIED", _run("a", 6), _shard("a"))
    view.apply(RUNS, "MODIFIED", _run("a", 6), CHILDREN)  # taken already
    assert seen.events[2:] == [("ADDED", "s", "5"), ("MODIFIED", "a", "6")]


def test_the_strays_first_list_says_the_runs_are_listed() -> None:
    listed: list[str | None] = []
    view = RunView(lambda *a: None, lambda ns, n: None, lambda ns, n: True, listed.append)
    view.expect(STRAYS)
    view.expect(_shard("a"))
    view.replace(_shard("a"), [])
    assert listed == []
    view.replace(STRAYS, [])
    assert listed == ["team"]


def _decoded(kind: str) -> float:
    return REGISTRY.get_sample_value("agentrun_run_events_total", {"decoded": kind}) or 0.0


def _line(body: dict[str, Any], kind: str) -> str:
    full = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", **body}
    obj = json.dumps(full, separators=(",", ":"), sort_keys=True)
    return '{"type":' + json.dumps(kind) + ',"object":' + obj + "}"


def test_events_of_other_shards_runs_and_deletions_are_decoded_as_far_as_the_metadata() -> None:
    decoder = RunEvents(lambda ns, n: None, lambda ns, name: name == "mine")
    metadata, whole = _decoded("metadata"), _decoded("whole")
    event = decoder.loads(_line(_run("mine", 5, phase="Running"), "MODIFIED"))
    assert event["object"]["status"] == {"phase": "Running"}
    assert _decoded("whole") == whole + 1
    for name, kind in (("theirs", "MODIFIED"), ("theirs", "ADDED"), ("mine", "DELETED")):
        event = decoder.loads(_line(_run(name, 6, phase="Running"), kind))
        assert event["type"] == kind
        assert event["object"]["metadata"]["name"] == name
        assert "spec" not in event["object"] and "status" not in event["object"]
    assert _decoded("metadata") == metadata + 3
    assert _decoded("whole") == whole + 1


class FakeScheduler:
    def __init__(self, holds: bool) -> None:
        self.held = holds
        self.loop = None
        self.spawned: list[Any] = []
        self.changed: list[str] = []

    def holds(self, namespace: str, name: str) -> bool:
        return self.held

    def spawn(self, coro: Any) -> None:
        self.spawned.append(coro)
        coro.close()

    def run_changed(self, namespace: str, name: str, phase: Any, body: Any) -> None:
        self.changed.append(name)

    def run_gone(self, namespace: str, name: str) -> None:
        self.changed.append(f"-{name}")

    def wake(self, namespace: str, name: str) -> None:
        self.changed.append(f"wake {name}")


def _watch(holds: bool, wanted: bool = True) -> tuple[RunWatch, FakeScheduler]:
    scheduler = FakeScheduler(holds)
    shard = sh.shard_of("team", "a", COUNT)
    followed = frozenset({shard}) if wanted else frozenset()
    ledger = cast(Ledger, SimpleNamespace())
    watch = RunWatch(cast(Scheduler, scheduler), None, ledger, COUNT, lambda: followed)
    return watch, scheduler


def test_a_run_is_labelled_with_its_shard_where_no_pass_will() -> None:
    label = sh.run_shard_label("team", "a", COUNT)
    other = sh.shard_label((sh.shard_of("team", "a", COUNT) + 1) % COUNT, COUNT)
    cases = [
        # (holds, wanted, the run as found, its watch, labelled here)
        (True, True, _run("a", 1), STRAYS, False),  # new: its pass labels it
        (True, True, _run("a", 1, phase="Succeeded"), STRAYS, True),  # finished stray
        (False, False, _run("a", 1, phase="Succeeded"), STRAYS, False),  # not followed here
        (False, True, _run("a", 1, phase="Succeeded"), STRAYS, True),  # followed, not held yet
        (True, True, _run("a", 1, label=label, phase="Succeeded"), _shard("a"), False),
        (False, False, _run("a", 1, label=other), Source(RUNS, "team", shard=other), True),
        (True, True, _run("a", 1, phase="Succeeded", deleting=True), STRAYS, False),
    ]
    for holds, wanted, body, source, labelled in cases:
        watch, scheduler = _watch(holds, wanted)
        watch.changed("MODIFIED", body, source)
        assert bool(scheduler.spawned) is labelled, (holds, wanted, body, source)
        assert (scheduler.changed == ["a"]) is wanted, scheduler.changed


def test_a_pass_holds_a_run_and_labels_it_in_one_patch() -> None:
    sent: list[Any] = []

    class Custom:
        def patch_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            sent.append(args[5])
            return {"metadata": {"resourceVersion": "2"}}

    ledger = Ledger(Custom())
    body = _run("a", 1)
    ledger.hold(body, "1-of-3")
    ledger.hold({**body, "metadata": {**body["metadata"], "finalizers": [s.RUN_FINALIZER]}},
                "1-of-3")  # fmt: skip
    held = {
        **body["metadata"],
        "finalizers": [s.RUN_FINALIZER],
        "labels": {s.LABEL_SHARD: "1-of-3"},
    }
    assert ledger.hold({**body, "metadata": held}, "1-of-3") is not None
    assert sent == [
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "add", "path": "/metadata/finalizers", "value": [s.RUN_FINALIZER]},
            {"op": "add", "path": "/metadata/labels", "value": {s.LABEL_SHARD: "1-of-3"}},
        ],
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "add", "path": "/metadata/labels", "value": {s.LABEL_SHARD: "1-of-3"}},
        ],
    ]
