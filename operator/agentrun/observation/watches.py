"""The watches that keep :mod:`agentrun.observation.view` current: list+watch (an informer) of
step Jobs, their pods and the refusals of their pods, in each watched namespace (or in all of
them), waking the run a change belongs to.

Each (kind, namespace) pair has a reflector thread: it lists (in pages), replaces its part of
the view at once, then watches from the list's resourceVersion with bookmarks, resuming from
the last version seen each time the server ends the watch (it asks the server to, after
:data:`WATCH_SECONDS`) or the watch hears nothing for
:data:`~agentrun.kubeapi.WATCH_SILENCE_SECONDS` (a connection that
stalled: accepted, never answered), and lists again when that version is too old (410 Gone) or
a request failed. Each failure is one warning line, and those of the API server being away are
counted (``retried(reason)``). Every change that matters
(:func:`agentrun.observation.view.matters`) wakes the run it belongs to
(``wake(namespace, name, uid)``); a relist wakes the runs whose objects changed, appeared or
vanished. :meth:`Informer.troubles` says which watches are dead now (for /readyz), and the view
says when every reflector has completed its first list
(:meth:`~agentrun.observation.view.ClusterView.wait_synced`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from urllib3.exceptions import ReadTimeoutError

from agentrun.core import shards as sh
from agentrun.kubeapi import CONNECT_SECONDS, UNREACHABLE, transient, watch_silence
from agentrun.kubeapi import WATCH_SECONDS as WATCH_SECONDS
from agentrun.observation.view import (
    EVENTS,
    JOBS,
    PODS,
    RUNS,
    ClusterView,
    Obj,
    Source,
    metadata,
    resource_version,
)

log = logging.getLogger("agentrun.observer")

REFUSAL_SELECTOR = "involvedObject.kind=Job,reason=FailedCreate"
"""Field selector of the Events watched: the Job controller could not create a pod."""

Wake = Callable[[str, str, str], None]
"""``wake(namespace, run name, run uid)``: something of that run changed."""

PAGE = 500
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


class Expired(Exception):
    """The resourceVersion to resume from is too old (410 Gone): list again."""


ListCall = Callable[..., Any]
Loads = Callable[[str], Any]
"""How a watch line is decoded (``json.loads``, or the run watch's decoder)."""


class Part(Protocol):
    """What a reflector keeps current: :class:`~agentrun.observation.view.ClusterView`, or the
    runs a sharded replica watches (:class:`agentrun.observation.runs.RunView`)."""

    def expect(self, source: Source) -> None: ...

    def replace(self, source: Source, items: Iterable[Obj]) -> list[Obj]: ...

    def apply(
        self, kind: str, event_type: str, obj: Obj, source: Source | None = None
    ) -> Obj | None: ...

    def run_of(self, kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str] | None: ...

    def covered_elsewhere(self, source: Source, obj: Obj) -> bool: ...

    def forget(self, source: Source) -> None: ...


class Runs(Protocol):
    """With shards, the runs watched beside the Jobs and pods
    (:func:`agentrun.loop.run_watch.run_reflectors`)."""

    def reflector(self, source: Source) -> Reflector:
        """The reflector of a source of runs."""
        ...

    def followed(self) -> None:
        """The shards followed changed (called after their watches started)."""
        ...


class Reflector:
    """Keeps one :class:`Source` of the view current: list, then watch, in a thread."""

    def __init__(
        self,
        view: Part,
        source: Source,
        call: ListCall,
        wake: Wake,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_seconds: int = WATCH_SECONDS,
        relisted: Callable[[str], None] = lambda kind: None,
        retried: Callable[[str], None] = lambda reason: None,
        loads: Loads = json.loads,
    ) -> None:
        """``relisted(kind)`` is told of every list after the first, ``retried(reason)`` of
        every request tried again because the API server was away (a
        :attr:`agentrun.kubeapi.Transient.reason`; for metrics); ``loads`` decodes each line
        of a watch."""
        self.view = view
        self.loads = loads
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
                event = self.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = resource_version(obj) or version
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
        meta = metadata(obj)
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
        if current is None or metadata(current).get("uid") != meta.get("uid"):
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
        runs: Runs | None = None,
    ) -> None:
        """``apis``: an object with ``.core`` (CoreV1Api) and ``.batch`` (BatchV1Api);
        ``relisted``, ``retried``: see :class:`Reflector`; ``shard_count``:
        ``AGENTRUN_SHARDS`` (0: not sharded, every step Job and pod is watched); ``runs``:
        with shards, the reflector of a source of runs (agentrun/observation/runs.py): then
        the runs of the shards followed, those labelled with no shard of this count and
        every sub-agent child are watched too, beside the Jobs and pods."""
        self.view = view or ClusterView()
        self.apis = apis
        self.wake = wake
        self.relisted = relisted
        self.retried = retried
        self.shard_count = shard_count
        self.runs = runs if shard_count else None
        self.scopes: Sequence[str | None] = list(namespaces) or [None]
        self._lock = threading.Lock()
        self._started = False
        self._epoch = 0
        self._following: frozenset[int] = frozenset()
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
            if self.runs is not None:
                self.reflectors += [
                    self.runs.reflector(Source(RUNS, ns, others=others)),
                    self.runs.reflector(Source(RUNS, ns, children=True)),
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
        """Watch the Jobs and pods (and runs) of exactly ``shards``: a shard new here is
        expected by the view at once (passes wait until it is listed), one no longer here is
        forgotten (its objects leave the view). Called before the replica may decide a shard's
        runs, and after it gave one up."""
        if not self.shard_count:
            return
        with self._lock:
            self._following = frozenset(shards)
            gone = [self._sharded.pop(i) for i in set(self._sharded) - shards]
            added = sorted(shards - set(self._sharded))
            for shard in added:
                self._epoch += 1
                label = sh.shard_label(shard, self.shard_count)
                self._sharded[shard] = [
                    self._reflector(Source(kind, ns, shard=label, epoch=self._epoch))
                    for ns in self.scopes
                    for kind in (JOBS, PODS)
                ]
                if self.runs is not None:
                    self._sharded[shard] += [
                        self.runs.reflector(Source(RUNS, ns, shard=label, epoch=self._epoch))
                        for ns in self.scopes
                    ]
                if self._started:
                    for reflector in self._sharded[shard]:
                        reflector.start()
        for reflectors in gone:
            for reflector in reflectors:
                reflector.stop()
                reflector.view.forget(reflector.source)
        if self.runs is not None and added:
            self.runs.followed()

    def followed(self) -> frozenset[int]:
        """The shards whose Jobs and pods (and runs) are watched. Without the lock: the run
        watches ask while they hold their view's, which :meth:`follow` takes under this
        one's (a frozenset, replaced whole)."""
        return self._following

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
