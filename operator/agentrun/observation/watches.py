"""Observation from watches: an in-memory view of step Jobs, their pods and the refusals of
their pods, kept current by list+watch (an informer), so that a reconcile pass reads memory,
not the API server.

What is watched, in each watched namespace (or in all of them):

* Jobs carrying the label ``agentrun.dev/run-uid`` (step Jobs, and anything made to look
  like one), indexed by the uid of their *controller* owner reference (the run's uid) and by
  namespace/name;
* pods carrying that label (the operator puts it on the pod template), indexed by the uid of
  their controller owner reference (the Job's uid); a pod that merely carries a Job's name in a
  label is not that Job's pod;
* Events with reason ``FailedCreate`` about Jobs (the Job controller posts one when the API
  server refuses a Job's pod: Pod Security admission, a missing ServiceAccount, a quota),
  indexed by the uid of the Job they are about.

Each (kind, namespace) pair has a reflector thread: it lists (in pages), replaces its part of
the view at once, then watches from the list's resourceVersion with bookmarks, resuming from
the last version seen each time the server ends the watch (it asks the server to, after
:data:`WATCH_SECONDS`) or the watch hears nothing for :data:`SILENT_SECONDS` (a connection that
stalled: accepted, never answered), and lists again when that version is too old (410 Gone) or
a request failed. Each failure is one warning line, and those of the API server being away are
counted (``retried(reason)``). Every change wakes the run it belongs
to (``wake(namespace, name, uid)``); a relist wakes the runs whose objects changed, appeared or
vanished. :meth:`Informer.troubles` says which watches are dead now (for /readyz).

A pass must never derive from a view that has not been listed yet: a running step whose Job
is not in the view would be taken for a lost one. :meth:`ClusterView.wait_synced` blocks until
every reflector has completed its first list. After that, the view may lag the API server by
a moment, which is harmless for decisions that end in a status write (the resourceVersion
fence turns a stale decision into a 409) and is checked with a direct read where it is not
(see :mod:`agentrun.observation.adoption`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from urllib3.exceptions import ReadTimeoutError

from agentrun import settings as s
from agentrun.core import shards as sh
from agentrun.core.turns import is_model_turn
from agentrun.execution.jobs import (
    has_ttl,
    is_gated,
    is_held,
    job_state,
    pod_essentials,
    step_terminated,
)
from agentrun.kubeapi import CONNECT_SECONDS, UNREACHABLE, transient, watch_silence
from agentrun.kubeapi import WATCH_SECONDS as WATCH_SECONDS

log = logging.getLogger("agentrun.observer")

JOBS = "jobs"
PODS = "pods"
EVENTS = "events"
KINDS = (JOBS, PODS, EVENTS)

STEP_SELECTOR = s.LABEL_RUN_UID
"""Label selector of the Jobs and pods watched: the run-uid label is present."""
REFUSAL_SELECTOR = "involvedObject.kind=Job,reason=FailedCreate"
"""Field selector of the Events watched: the Job controller could not create a pod."""
MADE_REMEMBERED = 10_000
"""Creates of this process whose watch event has not arrived yet, newest kept."""

Obj = dict[str, Any]
Wake = Callable[[str, str, str], None]
"""``wake(namespace, run name, run uid)``: something of that run changed."""

PAGE = 500
SILENT_SECONDS = watch_silence(WATCH_SECONDS) or WATCH_SECONDS
"""How long a watch (of :data:`WATCH_SECONDS`) may deliver nothing, not even a bookmark or its
end, before it is taken for dead and made again (from the last version seen): its read limit.
kopf's watch of runs waits as long (``settings.watching.inactivity_timeout``)."""
TROUBLE_CHARS = 200
"""How much of a failed request's error /readyz repeats."""
LOG_CONTEXT = "agentrun"
"""The ``extra`` key of the operator's log context (``agentrun.telemetry.logs.CONTEXT``): the
line of a watch tried again carries ``retry`` (``watch``) and ``reason`` there, as every
retry's line does (:mod:`agentrun.telemetry.retries`)."""
RETRY_MAX_SECONDS = 10.0
"""The longest wait before a failed list or watch is tried again (from 1 s, doubling): a
watch that is down leaves steps unrecorded, so it is tried again soon after the API server
answers again (three watches, one request each per try)."""


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked ``controller: true``, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    ref = controller_ref(obj)
    return str(ref["uid"]) if ref is not None and ref.get("uid") else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
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
    meta = dict(_meta(obj))
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
    shards, only the Jobs or pods of one shard (``shard``: the value of their
    ``agentrun.dev/shard`` label), or those whose label names no shard of this replica's count
    (``others``: every such value; a Job made before Jobs carried the label, or under another
    count, or relabelled). Sources of one kind and scope never cover the same object."""

    kind: str
    namespace: str | None
    shard: str | None = None
    others: frozenset[str] | None = None
    epoch: int = 0
    """Told apart from an earlier watch of the same shard (given up, then taken again): what
    the earlier one still delivers on its way out is dropped."""

    def covers(self, obj: Mapping[str, Any]) -> bool:
        if self.namespace is not None and _meta(obj).get("namespace") != self.namespace:
            return False
        if self.shard is None and self.others is None:
            return True
        value = (_meta(obj).get("labels") or {}).get(s.LABEL_SHARD)
        if self.shard is not None:
            return bool(value == self.shard)
        return value not in (self.others or ())

    def label_selector(self) -> str:
        """The label selector of the Jobs or pods this source covers."""
        if self.shard is not None:
            return f"{STEP_SELECTOR},{s.LABEL_SHARD}={self.shard}"
        if self.others is not None:
            return f"{STEP_SELECTOR},{s.LABEL_SHARD} notin ({','.join(sorted(self.others))})"
        return STEP_SELECTOR


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
                uid = _meta(item).get("uid")
                if uid:
                    new[str(uid)] = _slim(source.kind, item)
            for uid, obj in old.items():
                if uid not in new:
                    self._remove(source.kind, uid)
                    if matters(source.kind, obj, None):
                        changed.append(obj)
            for uid, obj in new.items():
                before = old.get(uid)
                if before is None or _version(before) != _version(obj):
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
        meta = _meta(job)
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
        uid = _meta(obj).get("uid")
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
                self._made.pop(str(uid), None) == _version(after)
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
        if STEP_SELECTOR not in (_meta(obj).get("labels") or {}):
            return False
        return not source.covers(obj) and any(
            o.kind == source.kind and o.covers(obj) for o in others
        )

    def _put(self, kind: str, obj: Obj) -> None:
        uid = str(_meta(obj)["uid"])
        if uid in self._objects[kind]:
            self._remove(kind, uid)
        self._objects[kind][uid] = obj
        owner = _owner_key(kind, obj)
        if owner:
            self._owned[kind].setdefault(owner, set()).add(uid)
        if kind == JOBS:
            self._job_names[(_meta(obj).get("namespace", ""), _meta(obj).get("name", ""))] = uid

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
            key = (_meta(obj).get("namespace", ""), _meta(obj).get("name", ""))
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
        return str(_meta(obj).get("namespace", "")), str(ref.get("name", "")), str(ref["uid"])


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
        deleting = bool(_meta(before).get("deletionTimestamp"))
        return not _let_go(after) and deleting != bool(_meta(after).get("deletionTimestamp"))
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
    labels = _meta(job).get("labels") or {}
    step, attempt = labels.get(s.LABEL_STEP), labels.get(s.LABEL_ATTEMPT)
    if not isinstance(step, str) or not isinstance(attempt, str):
        return None
    return step, attempt


def _turn_pod_running(pod: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` is a model turn's (by its step label: a label only wakes a pass) and
    runs with an address."""
    if pod is None:
        return False
    step = (_meta(pod).get("labels") or {}).get(s.LABEL_STEP)
    status = pod.get("status") or {}
    return (
        isinstance(step, str)
        and is_model_turn(step)
        and status.get("phase") == "Running"
        and bool(status.get("podIP"))
    )


def _essence(job: Mapping[str, Any], deletion: bool = True) -> tuple[Any, ...]:
    """What of a Job can change a decision (``deletion``: whether it is being deleted too)."""
    meta, status = _meta(job), job.get("status") or {}
    return (
        job_state(job),
        deletion and bool(meta.get("deletionTimestamp")),
        status.get("completionTime"),
        meta.get("generation"),
        not has_ttl(job),
        controller_uid(job),
        (meta.get("labels") or {}).get(s.LABEL_RUN_UID),
    )


def _version(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("resourceVersion", ""))


# -- the informer ---------------------------------------------------------------------------


class Expired(Exception):
    """The resourceVersion to resume from is too old (410 Gone): list again."""


ListCall = Callable[..., Any]


class Reflector:
    """Keeps one :class:`Source` of the view current: list, then watch, in a thread."""

    def __init__(
        self,
        view: ClusterView,
        source: Source,
        call: ListCall,
        wake: Wake,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_seconds: int = WATCH_SECONDS,
        relisted: Callable[[str], None] = lambda kind: None,
        retried: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """``relisted(kind)`` is told of every list after the first, ``retried(reason)`` of
        every request tried again because the API server was away (a
        :attr:`agentrun.kubeapi.Transient.reason`; for metrics)."""
        self.view = view
        self.source = source
        self.call = call
        self.wake = wake
        self.selectors: dict[str, str] = {}
        if label_selector:
            self.selectors["label_selector"] = label_selector
        if field_selector:
            self.selectors["field_selector"] = field_selector
        self.watch_seconds = watch_seconds
        self.silence = watch_silence(watch_seconds) or float(watch_seconds)
        """How long a watch request may hear nothing before it is taken for dead."""
        self.relisted = relisted
        self.retried = retried
        self.stopping = threading.Event()
        self.lists = 0
        """How many times the source was listed (1 + relists)."""
        self.failing: str | None = None
        """What the last list or watch request failed with, until one is answered again."""
        self.heard = time.monotonic()
        """When the API server last answered this source (a list, a watch's answer, an event
        or a bookmark), by the monotonic clock."""
        self._response: Any = None
        self._thread: threading.Thread | None = None
        view.expect(source)

    def start(self) -> None:
        where = self.source.namespace or "all namespaces"
        self._thread = threading.Thread(
            target=self.run, name=f"watch {self.source.kind} in {where}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        response = self._response
        if response is not None:  # unblock a read in progress
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        backoff = 1.0
        while not self.stopping.is_set():
            try:
                version = self.relist()
                backoff = 1.0
                while not self.stopping.is_set():
                    version = self.watch(version)
            except Expired:
                log.info("%s: resourceVersion expired; listing again", self._name())
            except Exception as error:
                if self.stopping.is_set():
                    return
                self.failing = (str(error) or type(error).__name__)[:TROUBLE_CHARS]
                away = transient(error)
                if away is None:
                    log.warning("%s failed (%s); retrying in %.0fs", self._name(), error, backoff)
                else:
                    self.retried(away.reason)
                    log.warning("%s %s; retrying in %.0fs", self._name(), away.says, backoff,
                                extra=_retry_line(away.reason))  # fmt: skip
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, RETRY_MAX_SECONDS)

    def _name(self) -> str:
        return f"watch of {self.source.kind} in {self.source.namespace or 'all namespaces'}"

    def _answered(self) -> None:
        self.heard = time.monotonic()
        self.failing = None

    def trouble(self, now: float) -> str | None:
        """What is wrong with this watch at ``now`` (monotonic): its last request failed, or
        it has heard nothing for longer than :attr:`silence` (a server that answers ends
        each watch sooner); None while it works."""
        failing, silent = self.failing, now - self.heard
        if failing is not None:
            return f"the {self._name()} failed ({failing}); trying again"
        if silent > self.silence:
            return f"the {self._name()} has heard nothing from the API server for {silent:.0f}s"
        return None

    def relist(self) -> str:
        """List the source (in pages) and replace it in the view; the list's version."""
        items: list[Obj] = []
        token: str | None = None
        version = ""
        while True:
            kwargs: dict[str, Any] = {**self.selectors, "limit": PAGE}
            if token:
                kwargs["_continue"] = token
            try:
                response = self.call(_preload_content=False, **kwargs)
            except Exception as error:
                if getattr(error, "status", None) == 410:
                    raise Expired() from error
                raise
            self.heard = time.monotonic()
            page = json.loads(response.data)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            if not token:
                break
        if self.lists:
            self.relisted(self.source.kind)
        self.lists += 1
        self._answered()
        self._wake_all(self.view.replace(self.source, items))
        return version

    def watch(self, version: str) -> str:
        """One watch request from ``version``; returns the version to resume from."""
        try:
            response = self.call(
                _preload_content=False,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_seconds,
                # A read that waits longer than that for a byte fails: the watch is dead.
                _request_timeout=(CONNECT_SECONDS, self.silence),
                **self.selectors,
            )
        except Exception as error:
            if getattr(error, "status", None) == 410:
                raise Expired() from error
            raise
        self._response = response
        self._answered()
        try:
            for line in self._silent_ends(_lines(response)):
                self.heard = time.monotonic()
                if self.stopping.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = _version(obj) or version
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED" and self._moved(obj):
                    continue  # another watch of this view delivers it (or did)
                stored = self.view.apply(self.source.kind, str(kind), obj, self.source)
                if stored is not None:
                    self._wake_all([stored])
        finally:
            self._response = None
            response.close()
            response.release_conn()
        return version

    def _silent_ends(self, lines: Iterator[str]) -> Iterator[str]:
        """``lines``, ending with one warning line, counted, when a read waited
        :attr:`silence` for nothing (the connection stalled): the watch is made again from the
        last version seen, on a new connection, which fails (and is counted as failing) if the
        API server cannot be reached."""
        try:
            yield from lines
        except ReadTimeoutError:
            self.retried(UNREACHABLE)
            log.warning("%s heard nothing for %.0fs; watching again on a new connection",
                        self._name(), self.silence, extra=_retry_line(UNREACHABLE))  # fmt: skip

    def _moved(self, obj: Obj) -> bool:
        """Whether a DELETED of a shard's watch (or the strays') is the object relabelled out
        of this watch's selector into another watch of this view, not deleted: the API server
        sends that as DELETED with the object as it was before, so it is read again (by name,
        without the label selector). Only an object that shows no deletion is read: one being
        deleted (a deletionTimestamp: every step Job, held by a finalizer) or a pod that ended
        (deleted at once when it goes) is taken as deleted."""
        if self.source.shard is None and self.source.others is None:
            return False
        meta = _meta(obj)
        phase = (obj.get("status") or {}).get("phase")
        if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            return False
        name, namespace = meta.get("name"), meta.get("namespace")
        if not name or not namespace:
            return False
        fields = f"metadata.name={name},metadata.namespace={namespace}"
        try:
            response = self.call(_preload_content=False, field_selector=fields)
        except Exception as error:  # a failed read: take the event as it came
            log.info("%s: could not read %s again (%s)", self._name(), name, error)
            return False
        current = next(iter(json.loads(response.data).get("items") or []), None)
        if current is None or _meta(current).get("uid") != meta.get("uid"):
            return False
        return self.view.covered_elsewhere(self.source, current)

    def _wake_all(self, objs: Sequence[Obj]) -> None:
        runs = {self.view.run_of(self.source.kind, o) for o in objs}
        for run in runs:
            if run is not None:
                try:
                    self.wake(*run)
                except Exception:
                    log.exception("waking run %s/%s failed", run[0], run[1])


def _retry_line(reason: str) -> dict[str, Any]:
    return {LOG_CONTEXT: {"retry": "watch", "reason": reason}}


def _lines(response: Any) -> Iterator[str]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            if line.strip():
                yield line.decode("utf-8", "replace")
    if buffer.strip():
        yield buffer.decode("utf-8", "replace")


class Informer:
    """The reflectors of every watched namespace (or of all namespaces) and one view.

    With ``shard_count`` (replicas sharing the runs, agentrun/loop/shards.py) the Jobs and
    pods watched are those of the shards this replica holds, one watch each per shard and
    scope (:meth:`follow`), and, always, those labelled with no shard of that count (made
    before Jobs carried the label, under another count, or relabelled): a replica's watch
    traffic, memory and decoding follow its shards, not every run's. Events of refused pods
    are watched whole (they are rare)."""

    def __init__(
        self,
        apis: Any,
        namespaces: Sequence[str],
        wake: Wake,
        view: ClusterView | None = None,
        relisted: Callable[[str], None] = lambda kind: None,
        shard_count: int = 0,
        retried: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """``apis``: an object with ``.core`` (CoreV1Api) and ``.batch`` (BatchV1Api);
        ``relisted``, ``retried``: see :class:`Reflector`; ``shard_count``:
        ``AGENTRUN_SHARDS`` (0: not sharded, every step Job and pod is watched)."""
        self.view = view or ClusterView()
        self.apis = apis
        self.wake = wake
        self.relisted = relisted
        self.retried = retried
        self.shard_count = shard_count
        self.scopes: Sequence[str | None] = list(namespaces) or [None]
        self._lock = threading.Lock()
        self._started = False
        self._epoch = 0
        self._sharded: dict[int, list[Reflector]] = {}
        """Shard -> the watches of its Jobs and pods (every scope), while followed."""
        others = (
            frozenset(sh.shard_label(i, shard_count) for i in range(shard_count))
            if shard_count
            else None
        )
        self.reflectors: list[Reflector] = []
        for ns in self.scopes:
            self.reflectors += [
                self._reflector(Source(JOBS, ns, others=others)),
                self._reflector(Source(PODS, ns, others=others)),
                Reflector(
                    self.view,
                    Source(EVENTS, ns),
                    _scoped(apis.core, "event", ns),
                    wake,
                    field_selector=REFUSAL_SELECTOR,
                    relisted=relisted,
                    retried=retried,
                ),
            ]

    def _reflector(self, source: Source) -> Reflector:
        api, kind = (self.apis.batch, "job") if source.kind == JOBS else (self.apis.core, "pod")
        return Reflector(
            self.view,
            source,
            _scoped(api, kind, source.namespace),
            self.wake,
            label_selector=source.label_selector(),
            relisted=self.relisted,
            retried=self.retried,
        )

    def follow(self, shards: frozenset[int]) -> None:
        """Watch the Jobs and pods of exactly ``shards``: a shard new here is expected by the
        view at once (passes wait until it is listed), one no longer here is forgotten (its
        objects leave the view). Called before the replica may decide a shard's runs, and
        after it gave one up."""
        if not self.shard_count:
            return
        with self._lock:
            gone = [self._sharded.pop(i) for i in set(self._sharded) - shards]
            for shard in sorted(shards - set(self._sharded)):
                self._epoch += 1
                label = sh.shard_label(shard, self.shard_count)
                self._sharded[shard] = [
                    self._reflector(Source(kind, ns, shard=label, epoch=self._epoch))
                    for ns in self.scopes
                    for kind in (JOBS, PODS)
                ]
                if self._started:
                    for reflector in self._sharded[shard]:
                        reflector.start()
        for reflectors in gone:
            for reflector in reflectors:
                reflector.stop()
                self.view.forget(reflector.source)

    def followed(self) -> frozenset[int]:
        """The shards whose Jobs and pods are watched."""
        with self._lock:
            return frozenset(self._sharded)

    def _all(self) -> list[Reflector]:
        with self._lock:
            return self.reflectors + [r for rs in self._sharded.values() for r in rs]

    def start(self) -> None:
        with self._lock:
            self._started = True
            reflectors = self.reflectors + [r for rs in self._sharded.values() for r in rs]
        for reflector in reflectors:
            reflector.start()

    def troubles(self) -> list[str]:
        """What is wrong with the watches now (:meth:`Reflector.trouble`), for /readyz."""
        now = time.monotonic()
        return [t for r in self._all() if (t := r.trouble(now)) is not None]

    def stop(self, timeout: float = 5.0) -> None:
        reflectors = self._all()
        for reflector in reflectors:
            reflector.stop()
        for reflector in reflectors:
            reflector.join(timeout)


def _scoped(api: Any, kind: str, namespace: str | None) -> ListCall:
    """The list call of ``kind`` in ``namespace``, or in all namespaces."""
    if namespace is None:
        all_namespaces: ListCall = getattr(api, f"list_{kind}_for_all_namespaces")
        return all_namespaces
    namespaced: ListCall = getattr(api, f"list_namespaced_{kind}")

    def call(**kwargs: Any) -> Any:
        return namespaced(namespace, **kwargs)

    return call
