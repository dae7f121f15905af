"""The in-memory view of step Jobs, their pods and the refusals of their pods, and what decides
whether a change of them matters to a pass; kept current by the watches of
:mod:`agentrun.observation.watches`, so that a reconcile pass reads memory, not the API server.

What the view holds, of each watched namespace (or of all of them):

* Jobs carrying the label ``agentrun.dev/run-uid`` (step Jobs, and anything made to look
  like one), indexed by the uid of their *controller* owner reference (the run's uid) and by
  namespace/name;
* pods carrying that label (the operator puts it on the pod template), indexed by the uid of
  their controller owner reference (the Job's uid); a pod that merely carries a Job's name in a
  label is not that Job's pod;
* Events with reason ``FailedCreate`` about Jobs (the Job controller posts one when the API
  server refuses a Job's pod: Pod Security admission, a missing ServiceAccount, a quota),
  indexed by the uid of the Job they are about.

Each change the view is fed says whether it can make a pass decide differently
(:func:`matters`): only those wake a run.

A pass must never derive from a view that has not been listed yet: a running step whose Job
is not in the view would be taken for a lost one. :meth:`ClusterView.wait_synced` blocks until
every source has completed its first list. After that, the view may lag the API server by
a moment, which is harmless for decisions that end in a status write (the resourceVersion
fence turns a stale decision into a 409) and is checked with a direct read where it is not
(see :mod:`agentrun.observation.adoption`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun import settings as s
from agentrun.core.subagents import LABEL_PARENT_UID
from agentrun.core.turns import EXECUTOR_STEP, is_model_turn
from agentrun.execution.jobs import (
    has_ttl,
    is_gated,
    is_held,
    job_state,
    pod_essentials,
    step_terminated,
)

JOBS = "jobs"
PODS = "pods"
EVENTS = "events"
KINDS = (JOBS, PODS, EVENTS)
RUNS = "agentruns"
"""AgentRuns, watched by sharded replicas (agentrun/observation/runs.py), not kept here."""

STEP_SELECTOR = s.LABEL_RUN_UID
"""Label selector of the Jobs and pods watched: the run-uid label is present."""
MADE_REMEMBERED = 10_000
"""Creates of this process whose watch event has not arrived yet, newest kept."""

Obj = dict[str, Any]


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked ``controller: true``, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    ref = controller_ref(obj)
    return str(ref["uid"]) if ref is not None and ref.get("uid") else None


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata (empty if it has none)."""
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _owner_key(kind: str, obj: Mapping[str, Any]) -> str | None:
    """What the object is indexed by: its controller's uid, or for an Event its Job's uid."""
    if kind == EVENTS:
        uid = (obj.get("involvedObject") or {}).get("uid")
        return str(uid) if uid else None
    return controller_uid(obj)


def _slim(kind: str, obj: Obj) -> Obj:
    """What the view keeps of an object: Jobs whole (their spec is compared), pods with only
    what tells whether they run their Job's template, Events with what names their Job and
    says what went wrong."""
    meta = dict(metadata(obj))
    meta.pop("managedFields", None)
    if kind == JOBS:
        return {**obj, "metadata": meta}
    if kind == PODS:
        return {"metadata": meta, "spec": pod_essentials(obj), "status": obj.get("status") or {}}
    keep = ("involvedObject", "reason", "message", "type", "count", "lastTimestamp", "eventTime")
    return {"metadata": meta, **{k: obj[k] for k in keep if k in obj}}


@dataclass(frozen=True)
class Source:
    """One reflector's part of the view: a kind in one namespace, or in all (None); with
    shards, only the Jobs, pods or runs of one shard (``shard``: the value of their
    ``agentrun.dev/shard`` label), or those whose label names no shard of this replica's count
    (``others``: every such value; a Job made before Jobs carried the label, or under another
    count, or relabelled; a run not labelled yet), or the runs labelled as some run's
    sub-agent children (``children``). Sources of one kind and scope never cover the same Job
    or pod; a run may be in the children's source and in a shard's."""

    kind: str
    namespace: str | None
    shard: str | None = None
    others: frozenset[str] | None = None
    epoch: int = 0
    """Told apart from an earlier watch of the same shard (given up, then taken again): what
    the earlier one still delivers on its way out is dropped."""
    children: bool = False

    def covers(self, obj: Mapping[str, Any]) -> bool:
        if self.namespace is not None and metadata(obj).get("namespace") != self.namespace:
            return False
        labels = metadata(obj).get("labels") or {}
        if self.children:
            return LABEL_PARENT_UID in labels
        if self.shard is None and self.others is None:
            return True
        value = labels.get(s.LABEL_SHARD)
        if self.shard is not None:
            return bool(value == self.shard)
        return value not in (self.others or ())

    def label_selector(self) -> str:
        """The label selector of the Jobs, pods or runs this source covers."""
        if self.children:
            return LABEL_PARENT_UID
        base = [] if self.kind == RUNS else [STEP_SELECTOR]
        if self.shard is not None:
            return ",".join([*base, f"{s.LABEL_SHARD}={self.shard}"])
        if self.others is not None:
            return ",".join([*base, f"{s.LABEL_SHARD} notin ({','.join(sorted(self.others))})"])
        return ",".join(base)


class ClusterView:
    """The view: thread-safe, fed by :class:`Informer` (or directly, in tests)."""

    def __init__(self, sources: Iterable[Source] = ()) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Obj]] = {k: {} for k in KINDS}
        self._made: OrderedDict[str, str] = OrderedDict()
        """uid -> resourceVersion of the Jobs this process created, as its creates answered,
        until the watch delivers them (:meth:`made`)."""
        self._owned: dict[str, dict[str, set[str]]] = {k: {} for k in KINDS}
        self._job_names: dict[tuple[str, str], str] = {}
        self._expected: set[Source] = set(sources)
        self._listed: set[Source] = set()
        self._retired: set[Source] = set()
        """Sources forgotten (:meth:`forget`) and not expected again: their reflectors may
        still deliver a list or an event on their way out, which is dropped."""
        self._synced = threading.Event()
        if not self._expected:
            self._synced.set()

    # -- feeding -----------------------------------------------------------------------------

    def expect(self, source: Source) -> None:
        """Passes wait until ``source`` has been listed once."""
        with self._lock:
            self._retired.discard(source)
            self._expected.add(source)
            if source not in self._listed:
                self._synced.clear()

    def replace(self, source: Source, items: Iterable[Obj]) -> list[Obj]:
        """The result of a list: the source's objects become exactly ``items``, at once.
        Returns the objects that changed, appeared or vanished (as last known) in a way that
        can matter to a pass (:func:`matters`)."""
        changed: list[Obj] = []
        with self._lock:
            if source in self._retired:
                return changed
            store = self._objects[source.kind]
            old = {uid: o for uid, o in store.items() if source.covers(o)}
            new: dict[str, Obj] = {}
            for item in items:
                uid = metadata(item).get("uid")
                if uid:
                    new[str(uid)] = _slim(source.kind, item)
            for uid, obj in old.items():
                if uid not in new:
                    self._remove(source.kind, uid)
                    if matters(source.kind, obj, None):
                        changed.append(obj)
            for uid, obj in new.items():
                before = old.get(uid)
                if before is None or resource_version(before) != resource_version(obj):
                    self._put(source.kind, obj)
                    if matters(source.kind, before, obj):
                        changed.append(obj)
            self._listed.add(source)
            if self._expected <= self._listed:
                self._synced.set()
        return changed

    def forget(self, source: Source) -> None:
        """``source`` is no longer watched (its shard went to another replica): its objects
        leave the view, passes no longer wait for it, and its late events are dropped."""
        with self._lock:
            self._retired.add(source)
            self._expected.discard(source)
            self._listed.discard(source)
            store = self._objects[source.kind]
            for uid in [uid for uid, obj in store.items() if source.covers(obj)]:
                self._remove(source.kind, uid)
            if self._expected <= self._listed:
                self._synced.set()

    def made(self, job: Obj) -> None:
        """This process created ``job`` (the create's answer): the watch's event of that
        create tells the operator nothing it does not know (its passes take the Job from the
        answer until the view has it), so it wakes no run, unless a pod or an Event of the
        Job came first (:meth:`_early`). Only that version, only once."""
        meta = metadata(job)
        uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        if not uid or not version:
            return
        with self._lock:
            self._made[uid] = version
            while len(self._made) > MADE_REMEMBERED:
                self._made.popitem(last=False)

    def apply(
        self, kind: str, event_type: str, obj: Obj, source: Source | None = None
    ) -> Obj | None:
        """One watch event (ADDED, MODIFIED, DELETED) of ``source`` (if given: nothing of a
        source forgotten, :meth:`forget`, and a DELETED only of an object the
        source covers as stored: one whose labels moved it to another source's watch, which
        delivered it first, stays). Returns the object as stored (for DELETED: as it was last
        seen) when the change can matter to a pass (:func:`matters`), and is not the event of
        a create this process made (:meth:`made`), else None."""
        uid = metadata(obj).get("uid")
        if not uid:
            return None
        slim = _slim(kind, obj)
        with self._lock:
            if source in self._retired:
                return None
            before = self._objects[kind].get(str(uid))
            if event_type == "DELETED":
                if source is not None and before is not None and not source.covers(before):
                    return None
                self._remove(kind, str(uid))
                after = None
            else:
                self._put(kind, slim)
                after = slim
            echo = kind == JOBS and before is None and after is not None and (
                self._made.pop(str(uid), None) == resource_version(after)
            ) and not self._early(str(uid))  # fmt: skip
        return slim if matters(kind, before, after) and not echo else None

    def _early(self, job_uid: str) -> bool:
        """Whether a pod or an Event of Job ``job_uid`` came before the Job (another watch,
        on a connection of its own): it woke no run then, the Job unknown, so the Job's
        arrival must (call with the lock held)."""
        return bool(self._owned[PODS].get(job_uid) or self._owned[EVENTS].get(job_uid))

    def covered_elsewhere(self, source: Source, obj: Obj) -> bool:
        """Whether another source of this view (expected, not forgotten) covers ``obj`` as it
        is now (a step's Job or pod: its run-uid label kept), and ``source`` does not: a watch
        moved it there."""
        with self._lock:
            others = [o for o in self._expected if o not in self._retired and o != source]
        if STEP_SELECTOR not in (metadata(obj).get("labels") or {}):
            return False
        return not source.covers(obj) and any(
            o.kind == source.kind and o.covers(obj) for o in others
        )

    def _put(self, kind: str, obj: Obj) -> None:
        uid = str(metadata(obj)["uid"])
        if uid in self._objects[kind]:
            self._remove(kind, uid)
        self._objects[kind][uid] = obj
        owner = _owner_key(kind, obj)
        if owner:
            self._owned[kind].setdefault(owner, set()).add(uid)
        if kind == JOBS:
            key = (metadata(obj).get("namespace", ""), metadata(obj).get("name", ""))
            self._job_names[key] = uid

    def _remove(self, kind: str, uid: str) -> None:
        obj = self._objects[kind].pop(uid, None)
        if obj is None:
            return
        owner = _owner_key(kind, obj)
        if owner:
            uids = self._owned[kind].get(owner)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._owned[kind][owner]
        if kind == JOBS:
            key = (metadata(obj).get("namespace", ""), metadata(obj).get("name", ""))
            if self._job_names.get(key) == uid:
                del self._job_names[key]

    # -- reading -----------------------------------------------------------------------------

    def size(self) -> int:
        """How many objects the view holds."""
        with self._lock:
            return sum(len(objs) for objs in self._objects.values())

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until every source has been listed once; False on timeout."""
        return self._synced.wait(timeout)

    def _owned_by(self, kind: str, owner: str) -> list[Obj]:
        with self._lock:
            return [self._objects[kind][uid] for uid in self._owned[kind].get(owner, ())]

    def jobs_of_run(self, run_uid: str) -> list[Obj]:
        """Jobs whose controller is the run ``run_uid``."""
        return self._owned_by(JOBS, run_uid)

    def job(self, uid: str) -> Obj | None:
        with self._lock:
            return self._objects[JOBS].get(uid)

    def job_named(self, namespace: str, name: str) -> Obj | None:
        """The watched Job of that name, whoever controls it."""
        with self._lock:
            uid = self._job_names.get((namespace, name))
            return self._objects[JOBS].get(uid) if uid else None

    def pods_of_job(self, job_uid: str) -> list[Obj]:
        """Pods whose controller is the Job ``job_uid``."""
        return self._owned_by(PODS, job_uid)

    def pod_refusal(self, job_uid: str) -> str | None:
        """The message of the latest FailedCreate Event about Job ``job_uid``, if any."""
        events = self._owned_by(EVENTS, job_uid)
        if not events:
            return None
        latest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return str(latest.get("message") or "the API server refused the Job's pod")

    def run_of(self, kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """(namespace, name, uid) of the run an object belongs to, as far as the view knows:
        a Job's controlling run; a pod's or an Event's Job's."""
        if kind != JOBS:
            owner = _owner_key(kind, obj)
            job = self.job(owner) if owner else None
            if job is None:
                return None
            obj = job
        ref = controller_ref(obj)
        if ref is None or ref.get("kind") != "AgentRun" or not ref.get("uid"):
            return None
        return str(metadata(obj).get("namespace", "")), str(ref.get("name", "")), str(ref["uid"])


def matters(kind: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> bool:
    """Whether a change can make a pass decide differently, so is worth waking the run for:
    a Job appearing, vanishing, finishing, being deleted or changing its spec or owner (but
    for the deletion of a Job the operator let go, :func:`_let_go`, and anything that
    happens to a Job once it is released to the TTL controller, :func:`_handed_over`, its
    release included, but for the deletion of a name a turn may wait for); a pod appearing
    held by the operator's gate (it waits to be let start), or going before it ended; a
    pod's step container terminating (its outcome); a model turn's pod starting to run (its
    turn's request goes to it); any pod refusal. (The view adds: not the event of a Job as
    this process created it, :meth:`ClusterView.made`.)
    Other changes (a pod being scheduled, a finalizer removed, counters; a Job's or a plan
    step's pod's start, whose Running note a timer brings) wake nobody."""
    if kind == EVENTS:
        return True
    if kind == PODS:
        if before is None and after is not None and is_gated(after):
            return True  # a new pod waiting for the operator to let it start
        if after is None and before is not None and step_terminated(before) is None:
            return True  # gone before it ended: another pod of its attempt may be let start
        if _turn_pod_running(after) and not _turn_pod_running(before):
            return True
        return step_terminated(after) is not None and step_terminated(before) is None
    if before is None:
        return True
    if after is None:
        return not _let_go(before)
    if _handed_over(after):
        # Its release itself (the operator's own patch), and its finishing or being deleted
        # afterwards: none decides anything, but the deletion of a name a turn may wait for.
        deleting = bool(metadata(before).get("deletionTimestamp"))
        return not _let_go(after) and deleting != bool(metadata(after).get("deletionTimestamp"))
    deletion = not _let_go(before)  # mostly the TTL controller's, after the release
    return _essence(before, deletion) != _essence(after, deletion)


def _let_go(job: Mapping[str, Any]) -> bool:
    """Whether ``job`` is a step Job the operator let go (its outcome finalizer is off: its
    outcome is committed, or it was a stray released after its grace) under a name no run
    waits to see cleared: its being deleted, or gone, can change no decision. A model turn's
    first attempt is not one (its Job may be made ahead of the turn, and a turn whose Job
    ended before it waits for that name to be free), nor a Job without a step's labels."""
    labels = _released_step(job)
    return labels is not None and not (is_model_turn(labels[0]) and labels[1] == "1")


def _handed_over(job: Mapping[str, Any]) -> bool:
    """Whether ``job`` is a step Job released to the TTL controller (the operator's release
    takes its outcome finalizer off and sets ``ttlSecondsAfterFinished`` in one patch, once
    its outcome is committed): how it ends, and when, no longer decides anything. One whose
    TTL someone removed is not (the operator deletes it once the grace is over)."""
    return has_ttl(job) and _released_step(job) is not None


def _released_step(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """The step and attempt labels of a step Job without the operator's outcome finalizer;
    None for one still holding it, or without a step's labels."""
    if is_held(job):
        return None
    labels = metadata(job).get("labels") or {}
    step, attempt = labels.get(s.LABEL_STEP), labels.get(s.LABEL_ATTEMPT)
    if not isinstance(step, str) or not isinstance(attempt, str):
        return None
    return step, attempt


def _turn_pod_running(pod: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` is a model turn's or the run's executor's (by its step label: a label
    only wakes a pass) and runs with an address: a turn's request goes to it, and a first turn
    waits for the executor (``agentrun.core.executor.awaits``) until a pass sees it up."""
    if pod is None:
        return False
    step = (metadata(pod).get("labels") or {}).get(s.LABEL_STEP)
    status = pod.get("status") or {}
    return (
        isinstance(step, str)
        and (is_model_turn(step) or step == EXECUTOR_STEP)
        and status.get("phase") == "Running"
        and bool(status.get("podIP"))
    )


def _essence(job: Mapping[str, Any], deletion: bool = True) -> tuple[Any, ...]:
    """What of a Job can change a decision (``deletion``: whether it is being deleted too)."""
    meta, status = metadata(job), job.get("status") or {}
    return (
        job_state(job),
        deletion and bool(meta.get("deletionTimestamp")),
        status.get("completionTime"),
        meta.get("generation"),
        not has_ttl(job),
        controller_uid(job),
        (meta.get("labels") or {}).get(s.LABEL_RUN_UID),
    )


def resource_version(obj: Mapping[str, Any]) -> str:
    """The object's resourceVersion (empty if it has none)."""
    return str(metadata(obj).get("resourceVersion", ""))
