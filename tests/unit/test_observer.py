"""The watched view of step Jobs, their pods and their pods' refusals
(agentrun.observation.view, agentrun.observation.watches):
indexing by controller, atomic relists, what wakes a run, and the reflector's list+watch loop
(pages, resumption, 410 Gone) against a fake API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from urllib3.exceptions import ReadTimeoutError

from agentrun import settings as s
from agentrun.core.turns import EXECUTOR_STEP
from agentrun.kubeapi import WATCH_SILENCE_SECONDS as SILENT_SECONDS
from agentrun.observation.view import EVENTS, JOBS, PODS, ClusterView, Source, matters
from agentrun.observation.watches import WATCH_SECONDS, Informer, Reflector

RUN_UID = "run-uid-1"
OTHER_RUN = "run-uid-2"


def run_ref(uid: str = RUN_UID, name: str = "demo") -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "name": name,
        "uid": uid,
        "controller": True,
    }


def job(
    name: str,
    uid: str,
    *,
    owner: dict[str, Any] | None = None,
    ns: str = "ns",
    version: str = "1",
    conditions: list[dict[str, Any]] | None = None,
    **status: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": uid,
        "resourceVersion": version,
        "labels": {s.LABEL_RUN_UID: RUN_UID},
        "managedFields": [{"manager": "x"}],
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": {"x": 1}, "status": {"conditions": conditions, **status}}


def pod(
    name: str,
    uid: str,
    *,
    job_uid: str | None,
    job_name: str = "j1",
    ns: str = "ns",
    terminated: bool = False,
    version: str = "1",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": uid,
        "resourceVersion": version,
        "labels": {s.LABEL_RUN_UID: RUN_UID, "batch.kubernetes.io/job-name": job_name},
    }
    if job_uid is not None:
        meta["ownerReferences"] = [{"kind": "Job", "uid": job_uid, "controller": True}]
    state = {"terminated": {"exitCode": 0, "message": "{}"}} if terminated else {"running": {}}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "step"}]},
        "status": {"containerStatuses": [{"name": "step", "state": state}]},
    }


def refusal(uid: str, job_uid: str, message: str, at: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"e-{uid}", "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "involvedObject": {"kind": "Job", "uid": job_uid, "name": "j1"},
        "reason": "FailedCreate",
        "message": message,
        "lastTimestamp": at,
    }


def synced_view() -> ClusterView:
    return ClusterView()  # no sources expected: synced from the start


# -- indexing ------------------------------------------------------------------------------


def test_jobs_are_indexed_by_their_controlling_run_and_by_name() -> None:
    view = synced_view()
    view.apply(JOBS, "ADDED", job("j1", "u1", owner=run_ref()))
    view.apply(JOBS, "ADDED", job("j2", "u2", owner=run_ref(OTHER_RUN)))
    not_controller = {**run_ref(), "controller": False}
    view.apply(JOBS, "ADDED", job("j3", "u3", owner=not_controller))
    view.apply(JOBS, "ADDED", job("j4", "u4"))  # no owner at all

    assert [j["metadata"]["name"] for j in view.jobs_of_run(RUN_UID)] == ["j1"]
    assert [j["metadata"]["name"] for j in view.jobs_of_run(OTHER_RUN)] == ["j2"]
    found = view.job_named("ns", "j4")
    assert found is not None and found["metadata"]["uid"] == "u4"
    assert view.job_named("other-ns", "j4") is None
    assert "managedFields" not in found["metadata"]


def test_pods_belong_to_the_job_that_controls_them_not_to_the_one_their_label_names() -> None:
    view = synced_view()
    view.apply(JOBS, "ADDED", job("j1", "u1", owner=run_ref()))
    view.apply(PODS, "ADDED", pod("p1", "pu1", job_uid="u1"))
    view.apply(PODS, "ADDED", pod("forged", "pu2", job_uid=None, job_name="j1"))
    view.apply(PODS, "ADDED", pod("other", "pu3", job_uid="u9", job_name="j1"))

    assert [p["metadata"]["name"] for p in view.pods_of_job("u1")] == ["p1"]
    # Pods are kept with only what tells whether they run their Job's template.
    assert view.pods_of_job("u1")[0]["spec"] == {"containers": [{"name": "step"}]}


def test_a_pod_refusal_is_the_latest_failed_create_event_of_the_job() -> None:
    view = synced_view()
    assert view.pod_refusal("u1") is None
    view.apply(EVENTS, "ADDED", refusal("e1", "u1", "older", "2026-11-22T09:00:00Z"))
    view.apply(EVENTS, "ADDED", refusal("e2", "u1", "newer", "2026-11-22T09:00:05Z"))
    view.apply(EVENTS, "ADDED", refusal("e3", "u2", "another Job's", "2026-11-22T09:00:09Z"))
    assert view.pod_refusal("u1") == "newer"
    view.apply(EVENTS, "DELETED", refusal("e2", "u1", "newer", "2026-11-22T09:00:05Z"))
    assert view.pod_refusal("u1") == "older"


def test_deleting_removes_an_object_from_every_index() -> None:
    view = synced_view()
    view.apply(JOBS, "ADDED", job("j1", "u1", owner=run_ref()))
    view.apply(PODS, "ADDED", pod("p1", "pu1", job_uid="u1"))
    view.apply(JOBS, "DELETED", job("j1", "u1", owner=run_ref()))
    view.apply(PODS, "DELETED", pod("p1", "pu1", job_uid="u1"))
    assert view.jobs_of_run(RUN_UID) == [] and view.job_named("ns", "j1") is None
    assert view.pods_of_job("u1") == [] and view.size() == 0


def test_a_job_recreated_under_the_same_name_keeps_the_name_when_the_old_one_goes() -> None:
    view = synced_view()
    view.apply(JOBS, "ADDED", job("j1", "old", owner=run_ref()))
    view.apply(JOBS, "ADDED", job("j1", "new", owner=run_ref()))
    view.apply(JOBS, "DELETED", job("j1", "old", owner=run_ref()))
    found = view.job_named("ns", "j1")
    assert found is not None and found["metadata"]["uid"] == "new"


def test_a_controller_reference_changed_moves_the_job_to_its_new_run() -> None:
    view = synced_view()
    view.apply(JOBS, "ADDED", job("j1", "u1", owner=run_ref()))
    view.apply(JOBS, "MODIFIED", job("j1", "u1", owner=run_ref(OTHER_RUN), version="2"))
    assert view.jobs_of_run(RUN_UID) == []
    assert len(view.jobs_of_run(OTHER_RUN)) == 1


def test_the_run_of_a_job_pod_or_refusal_is_the_jobs_controlling_run() -> None:
    view = synced_view()
    view.apply(JOBS, "ADDED", job("j1", "u1", owner=run_ref()))
    assert view.run_of(JOBS, job("j1", "u1", owner=run_ref())) == ("ns", "demo", RUN_UID)
    assert view.run_of(PODS, pod("p1", "pu1", job_uid="u1")) == ("ns", "demo", RUN_UID)
    assert view.run_of(EVENTS, refusal("e1", "u1", "no", "t")) == ("ns", "demo", RUN_UID)
    assert view.run_of(PODS, pod("p2", "pu2", job_uid="unknown")) is None
    assert view.run_of(JOBS, job("j9", "u9")) is None


# -- relisting -----------------------------------------------------------------------------


def test_a_relist_replaces_its_source_at_once_and_reports_what_changed() -> None:
    view = synced_view()
    source = Source(JOBS, "ns")
    first = [job("j1", "u1", owner=run_ref()), job("j2", "u2", owner=run_ref())]
    assert len(view.replace(source, first)) == 2
    view.apply(JOBS, "ADDED", job("elsewhere", "u9", owner=run_ref(), ns="other"))

    unchanged = job("j1", "u1", owner=run_ref())
    finished = job("j3", "u3", owner=run_ref(), conditions=[{"type": "Complete", "status": "True"}])
    changed = view.replace(source, [unchanged, finished])

    names = {j["metadata"]["name"] for j in view.jobs_of_run(RUN_UID)}
    assert names == {"j1", "j3", "elsewhere"}, "j2 vanished; the other namespace is not touched"
    assert {c["metadata"]["name"] for c in changed} == {"j2", "j3"}


def test_passes_wait_until_every_source_has_been_listed() -> None:
    jobs_source, pods_source = Source(JOBS, None), Source(PODS, None)
    view = ClusterView([jobs_source, pods_source])
    assert not view.synced and not view.wait_synced(timeout=0.01)
    view.replace(jobs_source, [])
    assert not view.synced
    view.replace(pods_source, [])
    assert view.synced and view.wait_synced(timeout=0)


# -- shards: sources of one kind split by the shard label -------------------------------------


def _labelled(obj: dict[str, Any], shard: str | None) -> dict[str, Any]:
    labels = {k: v for k, v in obj["metadata"]["labels"].items() if k != s.LABEL_SHARD}
    if shard is not None:
        labels[s.LABEL_SHARD] = shard
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


OTHERS = frozenset({"0-of-2", "1-of-2"})


def test_a_shards_source_selects_its_label_and_the_strays_source_every_other() -> None:
    mine, strays = Source(JOBS, "ns", shard="0-of-2"), Source(JOBS, "ns", others=OTHERS)
    assert mine.label_selector() == f"{s.LABEL_RUN_UID},{s.LABEL_SHARD}=0-of-2"
    assert strays.label_selector() == f"{s.LABEL_RUN_UID},{s.LABEL_SHARD} notin (0-of-2,1-of-2)"
    assert Source(JOBS, "ns").label_selector() == s.LABEL_RUN_UID
    j = job("j1", "u1", owner=run_ref())
    for shard, covered_by_mine, covered_by_strays in (
        ("0-of-2", True, False),
        ("1-of-2", False, False),
        (None, False, True),
        ("0-of-3", False, True),
    ):
        labelled = _labelled(j, shard)
        assert mine.covers(labelled) is covered_by_mine, shard
        assert strays.covers(labelled) is covered_by_strays, shard
    assert not mine.covers(_labelled(job("j1", "u1", ns="other"), "0-of-2"))


@pytest.mark.parametrize("strays_first", [True, False])
def test_a_job_relabelled_from_a_shard_to_the_strays_never_leaves_the_view(
    strays_first: bool,
) -> None:
    mine, strays = Source(JOBS, "ns", shard="0-of-2"), Source(JOBS, "ns", others=OTHERS)
    view = ClusterView([mine, strays])
    before = _labelled(job("j1", "u1", owner=run_ref()), "0-of-2")
    view.replace(mine, [before])
    view.replace(strays, [])
    after = _labelled(job("j1", "u1", owner=run_ref(), version="2"), None)
    # The API server ends the object's life in one watch (DELETED: it no longer matches) and
    # begins it in the other (ADDED); the two watches' threads deliver in either order.
    events = [(strays, "ADDED"), (mine, "DELETED")]
    for source, kind in events if strays_first else reversed(events):
        view.apply(JOBS, kind, after, source)
    stored = view.job("u1")
    assert stored is not None and stored["metadata"]["resourceVersion"] == "2"
    assert view.jobs_of_run(RUN_UID) == [stored]


@pytest.mark.parametrize(
    ("now", "moved"),
    [
        ("strays", True),  # relabelled into the strays' watch: that watch delivers it
        ("gone", False),  # deleted
        ("other shard", False),  # relabelled into a shard this replica does not hold
        ("no run label", False),  # no longer a step's Job: no watch of this view has it
    ],
)
def test_a_shards_deleted_event_is_read_again_to_tell_a_relabel_from_a_deletion(
    now: str, moved: bool
) -> None:
    """The API server ends an object's life in a watch whose selector it left with DELETED and
    the object as it was (its old labels, the new version): the shard's watch reads it again
    by name before letting it leave the view."""
    mine, strays = Source(JOBS, "ns", shard="0-of-2"), Source(JOBS, "ns", others=OTHERS)
    view = ClusterView([mine, strays])
    before = _labelled(job("j1", "u1", owner=run_ref()), "0-of-2")
    current = {
        "strays": _labelled(before, None),
        "gone": None,
        "other shard": _labelled(before, "1-of-2"),
        "no run label": {
            **before,
            "metadata": {**before["metadata"], "labels": {s.LABEL_SHARD: "0-of-3"}},
        },
    }[now]
    asked: list[dict[str, Any]] = []

    def call(**kwargs: Any) -> SimpleNamespace:
        asked.append(kwargs)
        return SimpleNamespace(data=json.dumps({"items": [current] if current else []}))

    reflector = Reflector(view, mine, call, lambda *run: None)
    view.replace(mine, [before])
    view.replace(strays, [])
    event = {**before, "metadata": {**before["metadata"], "resourceVersion": "2"}}
    assert reflector._moved(event) is moved
    assert asked == [
        {"_preload_content": False, "field_selector": "metadata.name=j1,metadata.namespace=ns"}
    ]
    # Being deleted, or not a shard's watch: taken as it came, nothing read.
    deleting = {
        **event,
        "metadata": {**event["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"},
    }
    assert not reflector._moved(deleting)
    assert not Reflector(view, Source(JOBS, "ns"), call, lambda *run: None)._moved(event)
    assert len(asked) == 1


def test_a_forgotten_shard_leaves_the_view_and_its_late_events_are_dropped() -> None:
    mine = Source(JOBS, "ns", shard="0-of-2", epoch=1)
    strays = Source(JOBS, "ns", others=OTHERS)
    view = ClusterView([strays])
    view.replace(strays, [_labelled(job("stray", "u9", owner=run_ref()), None)])
    assert view.synced

    view.expect(mine)
    assert not view.synced, "a pass of the shard's runs waits until its Jobs are listed"
    view.replace(mine, [_labelled(job("j1", "u1", owner=run_ref()), "0-of-2")])
    assert view.synced and view.job("u1") is not None

    view.forget(mine)
    assert view.synced and view.job("u1") is None and view.job("u9") is not None
    late = _labelled(job("j2", "u2", owner=run_ref()), "0-of-2")
    assert view.apply(JOBS, "ADDED", late, mine) is None
    assert view.replace(mine, [late]) == []
    assert view.job("u2") is None, "the watch given up still delivered on its way out"

    # Taken again later: a new watch (another epoch) of the same shard.
    again = Source(JOBS, "ns", shard="0-of-2", epoch=2)
    view.expect(again)
    view.replace(again, [late])
    assert view.job("u2") is not None
    assert view.apply(JOBS, "DELETED", late, mine) is None
    assert view.job("u2") is not None, "the earlier watch's last events change nothing"


def test_an_unsharded_informer_watches_every_step_job_and_pod() -> None:
    calls: list[dict[str, Any]] = []

    class Api:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: calls.append({"call": name, **kwargs})

    apis = SimpleNamespace(core=Api(), batch=Api())
    plain = Informer(apis, ["ns"], lambda *_: None)
    plain.follow(frozenset({0}))
    assert plain.followed() == frozenset()
    assert [r.selectors for r in plain.reflectors] == [
        {"label_selector": s.LABEL_RUN_UID},
        {"label_selector": s.LABEL_RUN_UID},
        {"field_selector": "involvedObject.kind=Job,reason=FailedCreate"},
    ]
    sharded = Informer(apis, ["ns"], lambda *_: None, shard_count=2)
    strays = f"{s.LABEL_RUN_UID},{s.LABEL_SHARD} notin (0-of-2,1-of-2)"
    assert [r.selectors.get("label_selector") for r in sharded.reflectors[:2]] == [strays] * 2
    for reflector in sharded.reflectors:
        sharded.view.replace(reflector.source, [])
    assert sharded.view.synced
    sharded.follow(frozenset({1}))
    assert sharded.followed() == frozenset({1})
    assert not sharded.view.synced, "passes wait for the new shard's list"
    sharded.follow(frozenset())
    assert sharded.followed() == frozenset() and sharded.view.synced


# -- what wakes a run ------------------------------------------------------------------------


def test_only_changes_that_can_move_a_run_wake_it() -> None:
    running = job("j1", "u1", owner=run_ref(), startTime="t0", active=1)
    counted = job("j1", "u1", owner=run_ref(), startTime="t0", active=1, ready=1, version="2")
    done = job(
        "j1",
        "u1",
        owner=run_ref(),
        startTime="t0",
        conditions=[{"type": "Complete", "status": "True"}],
        version="3",
    )
    assert matters(JOBS, None, running) and matters(JOBS, running, None)
    assert not matters(JOBS, running, counted)
    new = job("j1", "u1", owner=run_ref())
    assert not matters(JOBS, new, running), "a Job's start: its Running note comes by a timer"
    assert matters(JOBS, counted, done)
    deleting = json.loads(json.dumps(done))
    deleting["metadata"]["deletionTimestamp"] = "t9"
    assert matters(JOBS, done, deleting)

    started = pod("p1", "pu1", job_uid="u1")
    ended = pod("p1", "pu1", job_uid="u1", terminated=True, version="2")
    assert not matters(PODS, None, started)
    held = pod("p2", "pu2", job_uid="u1")
    held["spec"]["schedulingGates"] = [{"name": s.POD_GATE}]
    assert matters(PODS, None, held), "a pod waiting to be let start wakes its run"
    assert matters(PODS, held, None), "so does one gone before it ended"
    assert matters(PODS, started, ended)
    assert not matters(PODS, ended, None)
    assert matters(EVENTS, None, refusal("e1", "u1", "no", "t"))
    # A model turn's pod starting to run wakes its run (its request goes to it), and so does
    # the run's executor's (the first turn waits for it); a plan step's does not (its Running
    # note comes by a timer).
    for step_name, wakes in (("t3-model", True), (EXECUTOR_STEP, True), ("build", False)):
        pending = pod("p3", "pu3", job_uid="u1")
        pending["metadata"].setdefault("labels", {})[s.LABEL_STEP] = step_name
        pending["status"] = {"phase": "Pending", "podIP": "10.0.0.9"}
        up = json.loads(json.dumps(pending))
        up["status"]["phase"] = "Running"
        assert matters(PODS, pending, up) is wakes, step_name
        assert not matters(PODS, up, json.loads(json.dumps(up)))


def test_the_watch_event_of_a_create_this_process_made_wakes_nobody() -> None:
    """Its passes take a Job it created from the create's answer: the watch delivering the
    same version is no news. Any other version, or a Job it did not create, wakes."""
    view = ClusterView()
    mine = job("j1", "u1", owner=run_ref(), version="7")
    view.made(mine)
    assert view.apply(JOBS, "ADDED", mine) is None
    assert view.job("u1") is not None, "kept in the view all the same"
    later = job("j1", "u1", owner=run_ref(), version="8",
                conditions=[{"type": "Complete", "status": "True"}])  # fmt: skip
    assert view.apply(JOBS, "MODIFIED", later) is not None
    other = job("j2", "u2", owner=run_ref(), version="9")
    view.made(job("j2", "u2", owner=run_ref(), version="5"))
    assert view.apply(JOBS, "ADDED", other) is not None, "not the version created"
    third = job("j3", "u3", owner=run_ref(), version="3")
    assert view.apply(JOBS, "ADDED", third) is not None, "not created here"


@pytest.mark.parametrize("first", [PODS, EVENTS])
def test_a_created_job_whose_pod_or_refusal_came_first_wakes_its_run(first: str) -> None:
    """The Job controller makes a Job's pod within milliseconds of the create, and the watch
    of pods may deliver it before the watch of Jobs delivers the Job: the pod then names no
    run the view knows, and woke none. The Job's arrival wakes the run instead, even as the
    echo of this process's create (else the pod waited for its gate to be lifted until a
    timer, 2 s later)."""
    view = ClusterView()
    mine = job("j1", "u1", owner=run_ref(), version="7")
    view.made(mine)
    early = (
        pod("p1", "pu1", job_uid="u1")
        if first == PODS
        else refusal("e1", "u1", "forbidden", "2024-01-01T00:00:00Z")
    )
    view.apply(first, "ADDED", early)
    assert view.run_of(first, early) is None, "the Job is not known yet"
    woken = view.apply(JOBS, "ADDED", mine)
    assert woken is not None
    assert view.run_of(JOBS, woken) == ("ns", "demo", RUN_UID)


def test_the_deletion_of_a_job_the_operator_let_go_wakes_nobody() -> None:
    """A finished step Job released to the TTL controller (its outcome committed, the
    outcome finalizer off) is deleted a grace later: that decides nothing, unless its name is
    one a run may wait to see cleared (a model turn's first attempt, made ahead of its turn).
    A Job still holding the finalizer wakes its run when deleted or gone, as before."""

    def step_job(step: str, attempt: str, *, held: bool) -> dict[str, Any]:
        done = job("j1", "u1", owner=run_ref(), startTime="t0",
                   conditions=[{"type": "Complete", "status": "True"}])  # fmt: skip
        done["metadata"]["labels"].update({s.LABEL_STEP: step, s.LABEL_ATTEMPT: attempt})
        done["metadata"]["finalizers"] = [s.JOB_FINALIZER] if held else []
        return done

    for step_name, attempt, held, wakes in (
        ("build", "1", False, False),
        ("t3-0-search", "1", False, False),
        ("t3-model", "2", False, False),
        ("t3-model", "1", False, True),
        ("build", "1", True, True),
    ):
        before = step_job(step_name, attempt, held=held)
        deleting = json.loads(json.dumps(before))
        deleting["metadata"]["deletionTimestamp"] = "t9"
        deleting["metadata"]["resourceVersion"] = "5"
        case = (step_name, attempt, held)
        assert matters(JOBS, before, deleting) is wakes, case
        assert matters(JOBS, deleting, None) is wakes, case
        # Whatever else changes still counts: here, its controller.
        moved = json.loads(json.dumps(before))
        moved["metadata"]["ownerReferences"] = []
        assert matters(JOBS, before, moved), case


def test_what_happens_to_a_job_released_to_the_ttl_controller_wakes_nobody() -> None:
    """The release (outcome finalizer off, ``ttlSecondsAfterFinished`` on, in one patch once
    the outcome is committed) and the Job's end after it decide nothing: no pass for them.
    Its deletion still wakes a run for a model turn's first attempt (a name a turn may wait
    to see cleared), and a TTL someone removed wakes (the operator deletes the Job itself)."""

    def step_job(step: str, attempt: str) -> dict[str, Any]:
        held = job("j1", "u1", owner=run_ref(), startTime="t0")
        held["metadata"]["labels"].update({s.LABEL_STEP: step, s.LABEL_ATTEMPT: attempt})
        held["metadata"]["finalizers"] = [s.JOB_FINALIZER]
        return held

    def changed(obj: dict[str, Any], version: str, change: Any) -> dict[str, Any]:
        copied: dict[str, Any] = json.loads(json.dumps(obj))
        copied["metadata"]["resourceVersion"] = version
        change(copied)
        return copied

    def release(j: dict[str, Any]) -> None:
        j["metadata"]["finalizers"] = []
        j["spec"]["ttlSecondsAfterFinished"] = 30
        j["metadata"]["generation"] = 2

    def finish(j: dict[str, Any]) -> None:
        j["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
        j["status"]["completionTime"] = "t5"

    for step_name, attempt, deletion_wakes in (
        ("build", "1", False),
        ("t3-0-search", "1", False),
        ("t3-model", "1", True),
    ):
        case = (step_name, attempt)
        held = step_job(step_name, attempt)
        released = changed(held, "3", release)
        assert not matters(JOBS, held, released), case
        ended = changed(released, "4", finish)
        assert not matters(JOBS, released, ended), case
        going = changed(ended, "5", lambda j: j["metadata"].update(deletionTimestamp="t9"))
        assert matters(JOBS, ended, going) is deletion_wakes, case
        assert matters(JOBS, going, None) is deletion_wakes, case
        untimed = changed(ended, "6", lambda j: j["spec"].pop("ttlSecondsAfterFinished"))
        assert matters(JOBS, ended, untimed), case
        # Still held, its end wakes as before (its outcome is what the pass takes).
        assert matters(JOBS, held, changed(held, "7", finish)), case


# -- the reflector against a fake API ---------------------------------------------------------


class FakeResponse:
    def __init__(
        self,
        data: bytes = b"",
        lines: list[dict[str, Any]] | None = None,
        then: Exception | None = None,
    ) -> None:
        self.data = data
        self.lines = lines or []
        self.then = then
        """Raised once the lines are read (a read that timed out, a connection reset)."""
        self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        text = "".join(json.dumps(line) + "\n" for line in self.lines).encode()
        for i in range(0, len(text), 7):  # split lines across chunks
            yield text[i : i + 7]
        if self.then is not None:
            raise self.then

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class FakeApi:
    """Answers list and watch calls from scripted responses, recording each call."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[dict[str, Any]] = []
        self.done = threading.Event()

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if not self.answers:
            self.done.set()
            raise RuntimeError("no more answers")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def page(items: list[dict[str, Any]], version: str, token: str | None = None) -> FakeResponse:
    meta: dict[str, Any] = {"resourceVersion": version}
    if token:
        meta["continue"] = token
    return FakeResponse(json.dumps({"items": items, "metadata": meta}).encode())


class Gone(Exception):
    status = 410


def test_the_reflector_lists_in_pages_watches_from_the_lists_version_and_relists_on_410() -> None:
    j1, j2 = job("j1", "u1", owner=run_ref()), job("j2", "u2", owner=run_ref())
    j1_done = job(
        "j1",
        "u1",
        owner=run_ref(),
        version="12",
        conditions=[{"type": "Complete", "status": "True"}],
    )
    answers: list[Any] = [
        page([j1], "10", token="more"),
        page([j2], "10"),
        FakeResponse(
            lines=[
                {"type": "MODIFIED", "object": j1_done},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            ]
        ),
        Gone(),  # resuming from 15 is too old
        page([j1_done], "20"),  # j2 went meanwhile
        FakeResponse(lines=[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]),
        page([j1_done], "30"),
    ]
    api = FakeApi(answers)
    woken: list[tuple[str, str, str]] = []
    view = ClusterView()
    relisted: list[str] = []
    reflector = Reflector(
        view,
        Source(JOBS, "ns"),
        api,
        lambda *run: woken.append(run),
        label_selector=s.LABEL_RUN_UID,
        relisted=relisted.append,
    )
    assert not view.synced
    reflector.start()
    assert api.done.wait(10), "the reflector did not use up its answers"
    reflector.stop()
    reflector.join(5)

    lists = [c for c in api.calls if not c.get("watch")]
    watches = [c for c in api.calls if c.get("watch")]
    assert lists[1]["_continue"] == "more" and all(c["limit"] == 500 for c in lists)
    assert all(c["label_selector"] == s.LABEL_RUN_UID for c in api.calls)
    assert [w["resource_version"] for w in watches[:3]] == ["10", "15", "20"]
    assert reflector.lists == 3 and relisted == [JOBS, JOBS]
    assert view.synced
    assert [j["metadata"]["name"] for j in view.jobs_of_run(RUN_UID)] == ["j1"]
    assert ("ns", "demo", RUN_UID) in woken


@pytest.mark.parametrize("failure", [RuntimeError("connection reset"), Gone()])
def test_a_failed_first_list_is_retried_and_the_view_stays_unsynced_until_then(
    failure: Exception,
) -> None:
    api = FakeApi([failure, page([], "1")])
    view = ClusterView()
    reflector = Reflector(view, Source(PODS, None), api, lambda *run: None)
    reflector.start()
    assert view.wait_synced(timeout=10)
    reflector.stop()
    reflector.join(5)
    assert reflector.lists == 1


def test_a_watch_silent_for_too_long_is_made_again_from_its_last_version_without_a_relist() -> None:
    silent = ReadTimeoutError(None, "/apis/batch/v1/jobs", "Read timed out.")  # type: ignore[arg-type]
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}
    api = FakeApi([page([], "10"), FakeResponse(lines=[bookmark], then=silent), FakeResponse()])
    retried: list[str] = []
    reflector = Reflector(
        ClusterView(), Source(JOBS, "ns"), api, lambda *run: None, retried=retried.append
    )
    reflector.start()
    assert api.done.wait(10), "the reflector did not use up its answers"
    reflector.stop()
    reflector.join(5)
    watches = [c["resource_version"] for c in api.calls if c.get("watch")]
    assert watches[:2] == ["10", "15"] and reflector.lists >= 1
    assert api.calls[1]["timeout_seconds"] == WATCH_SECONDS
    assert api.calls[1]["_request_timeout"] == (10, SILENT_SECONDS)
    assert min(WATCH_SECONDS, 60) + 15 == SILENT_SECONDS, "past a bookmark's interval"
    assert retried[:1] == ["unreachable"], "a watch that went silent is a retry, counted"


def test_a_watch_is_trouble_while_its_requests_fail_or_it_hears_nothing() -> None:
    api = FakeApi([page([], "10"), FakeResponse()])  # then every request fails
    reflector = Reflector(ClusterView(), Source(PODS, "ns"), api, lambda *run: None)
    reflector.start()
    assert api.done.wait(10)
    failed = reflector.trouble(reflector.heard)
    reflector.stop()
    reflector.join(5)
    assert failed == "the watch of pods in ns failed (no more answers); trying again"

    answered = Reflector(ClusterView(), Source(JOBS, None), FakeApi([]), lambda *run: None)
    assert answered.trouble(answered.heard + SILENT_SECONDS) is None
    assert answered.trouble(answered.heard + SILENT_SECONDS + 5) == (
        f"the watch of jobs in all namespaces has heard nothing from the API server for "
        f"{SILENT_SECONDS + 5}s"
    )
