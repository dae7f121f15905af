"""When each run gets its next pass.

* an unfinished run is driven by a task of its own (:meth:`Scheduler.drive`, started by the
  first event that shows the run unfinished, stopped by its deletion): one reconcile pass,
  then sleep until the next timer, a wake-up (an event on the run, or a change the watches of
  its Jobs, their pods and their pods' refusals report: agentrun/observation/watches.py) or
  the periodic resync, whichever comes first. Not a kopf daemon: kopf keeps the latest body of
  every object of a resource that has a daemon handler, finished runs included, for as long as
  the operator runs (thousands of whole runs at rest). With kopf peering, where kopf must pause
  the driving when another operator takes over, a kopf daemon drives it instead
  (:mod:`.handlers`);
* a finished run costs nothing at rest: its task ends with the pass that finishes it, and
  what it still needs (deleting its Jobs after the grace, deleting itself past its retention
  TTL) runs as a timer at the moment it is due, as does a pass for a change seen later (a Job
  of it being deleted, an edit of its spec). At startup, a finished run is checked in memory
  against the watched Jobs and gets a timer only when something is due;
* no pass runs before those watches have listed once;
* with shards (``AGENTRUN_SHARDS``, agentrun/loop/shards.py), only runs of the shards this
  replica owns get passes, timers and deletions here; of the others it keeps their identity
  and phase (:attr:`Scheduler.known`), to take them up when their shard comes to it.

Everything here runs in the event loop but :class:`Waker` (any thread); passes run in threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.execution import jobs
from agentrun.kubeapi import Transient
from agentrun.loop.reconciler import Outcome, Reconciler
from agentrun.observation.view import ClusterView
from agentrun.telemetry import metrics
from agentrun.telemetry.endpoints import Readiness
from agentrun.telemetry.retries import logged

log = logging.getLogger("agentrun.handlers")
"""The name these lines have always carried (they were the handlers')."""

FINISHED = frozenset(str(p) for p in m.TERMINAL_RUN_PHASES)
SETTLE_SECONDS = 1.0
OWNERSHIP_RECHECK_SECONDS = 1.0
"""With shards: how soon a pass that found its shard's renewal late is tried again."""
DELETION_RETRY_SECONDS = 2.0
"""How soon a deletion whose cleanup left something (or failed) is tried again."""

Owns = Callable[[str, str], bool]
"""Whether this replica decides run ``(namespace, name)`` now."""

Deleter = Callable[[Mapping[str, Any]], bool]
"""Cleans up after a run being deleted and releases its finalizer when it may go; True while
it must be tried again (:meth:`agentrun.loop.janitor.Janitor.finish_deletion`)."""


class Stopped(Protocol):
    """Whether a run's driving must end (kopf's ``DaemonStopped`` is one, :class:`Stop` too)."""

    def __bool__(self) -> bool: ...

    def wait(self) -> Awaitable[Any]: ...


class Stop:
    """The :class:`Stopped` of a run's own task."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def wait(self) -> Awaitable[bool]:
        return self._event.wait()


class Scheduler:
    """Decides when each run's next pass runs, and runs it."""

    def __init__(
        self,
        reconciler: Reconciler,
        view: ClusterView,
        readiness: Readiness,
        delete: Deleter | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.view = view
        self.readiness = readiness
        """Told when the watches have listed (/readyz waits for them too)."""
        self.delete = delete
        """What a run's deletion runs (None: the janitor's sweeps alone finish deletions)."""
        self.deleting: set[tuple[str, str]] = set()
        """Runs whose deletion has a task here (until it ends)."""
        self.wakeups: dict[tuple[str, str], asyncio.Event] = {}
        """One per running daemon (unfinished run)."""
        self.timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        """The next pass of a finished run, when one is due."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.synced: asyncio.Event | None = None
        """Set once the watches have listed (passes wait for it)."""
        self.unchecked: dict[tuple[str, str], dict[str, Any]] = {}
        """Finished runs seen before the watches listed, checked once they have."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self.own_drivers = reconciler.settings.peering is None
        """Whether unfinished runs get a task of their own here (:meth:`run_changed`), rather
        than a kopf daemon each (with kopf peering)."""
        self.drivers: dict[tuple[str, str], Stop] = {}
        """The stop of each unfinished run's task here."""
        self.driving: set[asyncio.Task[None]] = set()
        """Those tasks (until they end)."""
        self.owns: Owns = lambda namespace, name: True
        """Whether this replica decides a run now (with shards: it owns the run's shard, its
        Lease renewed in time); checked before every pass."""
        self.holds: Owns = lambda namespace, name: True
        """Whether this replica means to decide a run (with shards: it holds the run's shard,
        though its renewal may be late): its driver, timers and deletion stay here, and wait
        for :attr:`owns` while it is late, until the shard is told lost
        (:meth:`shards_changed`)."""
        self.known: dict[tuple[str, str], tuple[str | None, dict[str, Any], bool]] = {}
        """With shards, every run of the shards followed here that the watch delivered and
        not seen deleted: its phase, its identity (:func:`_identity`) and whether it may be
        due whatever its Jobs (:func:`_may_be_due`), to take it up when its shard's Lease
        comes here (a shard's runs are watched from just before it is taken)."""
        self.in_flight: Counter[tuple[str, str]] = Counter()
        """Passes running now, per run (a shard is given away only once none of its runs has
        one)."""
        self._flight_lock = threading.Lock()

    def start(self) -> None:
        """In the event loop, before the watches start: passes wait for them to list."""
        self.loop = asyncio.get_running_loop()
        self.synced = asyncio.Event()

    # -- unfinished runs: a task each --------------------------------------------------------

    def start_driving(self, namespace: str, name: str) -> None:
        """A task driving an unfinished run, unless one does already (called in the loop)."""
        key = (namespace, name)
        if key in self.drivers or self.loop is None:
            return
        stop = self.drivers[key] = Stop()

        async def driving() -> None:
            try:
                await self.drive(namespace, name, stop)
            except Exception:
                log.exception("driving the run failed", extra=_ctx(namespace, name))
            finally:
                if self.drivers.get(key) is stop:
                    del self.drivers[key]

        task = asyncio.ensure_future(driving())
        self.driving.add(task)
        task.add_done_callback(self.driving.discard)

    def stop_driving(self, namespace: str, name: str) -> None:
        """End the task driving a run (its deletion began); a pass in flight ends first."""
        stop = self.drivers.pop((namespace, name), None)
        if stop is not None:
            stop.set()
            self.wake(namespace, name)

    async def stop_all(self, timeout: float) -> None:
        """End every run's task, waiting up to ``timeout`` seconds for the passes in flight
        (they run in threads, and cannot be cancelled)."""
        for key in list(self.drivers):
            self.stop_driving(*key)
        if self.driving:
            await asyncio.wait(set(self.driving), timeout=timeout)

    async def drive(self, namespace: str, name: str, stopped: Stopped) -> None:
        """Reconcile one run until it is finished (then timers take over), deleted or
        ``stopped``."""
        wake = self.wakeup(namespace, name)
        self.cancel_timer(namespace, name)
        resync = float(self.reconciler.settings.resync_seconds)
        try:
            if self.synced is not None:
                await self.synced.wait()
            while not stopped:
                wake.clear()
                try:
                    outcome = await self._owned_pass(namespace, name)
                    if outcome is None:
                        if not self.holds(namespace, name):
                            return  # its shard went elsewhere
                        await _sleep(wake, stopped, OWNERSHIP_RECHECK_SECONDS)
                        continue  # the shard's renewal is late: wait for it
                    if outcome.phase in FINISHED:
                        self.after_pass(namespace, name, outcome)
                        return
                    if outcome.gone:
                        return  # deleted, or being deleted: the deletion's task cleans up
                    delay = min(outcome.requeue_after or resync, resync)
                except Exception as error:
                    delay = _failed("reconcile", error, namespace, name)
                await _sleep(wake, stopped, delay)
        finally:
            self.wakeups.pop((namespace, name), None)

    async def _owned_pass(self, namespace: str, name: str) -> Outcome | None:
        """A pass of the run, if this replica decides it now (None if not)."""
        key = (namespace, name)
        with self._flight_lock:
            self.in_flight[key] += 1  # first: a shard given away waits for this pass
        try:
            if not self.owns(namespace, name):
                return None
            due = time.perf_counter()
            return await asyncio.to_thread(_waited, due, self.reconciler, namespace, name)
        finally:
            with self._flight_lock:
                self.in_flight[key] -= 1
                if self.in_flight[key] <= 0:
                    del self.in_flight[key]

    def busy(self, runs: Owns) -> bool:
        """Whether a pass of a run ``runs`` selects is running (any thread)."""
        with self._flight_lock:
            return any(runs(*key) for key in self.in_flight)

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        event = self.wakeups.get((namespace, name))
        if event is not None:
            event.set()

    def run_changed(
        self, namespace: str, name: str, phase: str | None, body: Mapping[str, Any]
    ) -> None:
        """An event on the run: its driver passes now (started first, for an unfinished run
        not driven yet; stopped, for a run being deleted, whose deletion then runs); a
        finished run without one, if due."""
        meta = body.get("metadata") or {}
        if self.sharded:
            self.known[(namespace, name)] = (phase, _identity(body), _may_be_due(body))
            if not self.holds(namespace, name):
                return
        deleting = bool(meta.get("deletionTimestamp"))
        if deleting:
            self.cancel_timer(namespace, name)
            if s.RUN_FINALIZER in (meta.get("finalizers") or []):
                self.start_deletion(namespace, name, body)
        if self.own_drivers and deleting:
            self.stop_driving(namespace, name)
        elif self.own_drivers and phase not in FINISHED:
            self.start_driving(namespace, name)
        self.wake(namespace, name)
        if phase in FINISHED and (namespace, name) not in self.wakeups:
            self.finished_run_seen(body)

    def run_gone(self, namespace: str, name: str) -> None:
        """The watch showed the run deleted."""
        self.known.pop((namespace, name), None)
        self.stop_driving(namespace, name)

    # -- shards: taken up and let go ------------------------------------------------------

    @property
    def sharded(self) -> bool:
        return self.reconciler.settings.shards > 0

    def shards_changed(self, gained: Owns, lost: Owns) -> None:
        """This replica began deciding the runs ``gained`` selects and stopped deciding those
        ``lost`` selects (called in the loop). A run let go keeps nothing here but its
        identity; a pass of it already running ends by itself, and so does its deletion's
        task. A run taken up is handled as if the watch had just delivered it: an unfinished
        one is driven, one being deleted is cleaned up after, a finished one is checked (and
        read) only if its Jobs or its retention ask for it."""
        bodies = self.reconciler.bodies
        for key in [k for k in self.drivers if lost(*k)]:
            self.stop_driving(*key)
        for key in [k for k in self.timers if lost(*k)]:
            self.cancel_timer(*key)
        for key in [k for k in self.known if lost(*k)]:
            if bodies is not None:
                bodies.drop(*key)
        for key, (phase, identity, due) in list(self.known.items()):
            if not gained(*key) or not self.holds(*key):
                continue
            meta = identity["metadata"]
            if meta.get("deletionTimestamp") or phase not in FINISHED:
                self.run_changed(*key, phase, identity)
                continue
            self.spawn(self._take_up_finished(key, identity, due))

    async def _take_up_finished(
        self, key: tuple[str, str], identity: dict[str, Any], due: bool
    ) -> None:
        if self.synced is not None:
            await self.synced.wait()
        found = self.view.jobs_of_run(str(identity["metadata"].get("uid", "")))
        if found or due:
            await self._check_finished(key, identity, found)

    # -- deletion: a task each ----------------------------------------------------------

    def start_deletion(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """Clean up after a run being deleted, in a task of its own, until its finalizer is
        released (unless one does already; called in the loop)."""
        key = (namespace, name)
        if self.delete is None or key in self.deleting or self.loop is None:
            return
        self.deleting.add(key)
        self.spawn(self._deletion(key, dict(body)))

    async def _deletion(self, key: tuple[str, str], body: dict[str, Any]) -> None:
        delete = self.delete
        assert delete is not None
        try:
            while self.holds(*key):
                if not self.owns(*key):  # its shard's renewal is late
                    await asyncio.sleep(OWNERSHIP_RECHECK_SECONDS)
                    continue
                try:
                    again = await asyncio.to_thread(delete, body)
                except Exception as error:
                    logged(log, "deletion", "cleanup after the run's deletion", error,
                           f"retrying in {DELETION_RETRY_SECONDS:.0f}s", _ctx(*key))  # fmt: skip
                    again = True
                if not again:
                    return
                await asyncio.sleep(DELETION_RETRY_SECONDS)
        finally:
            self.deleting.discard(key)

    def observed(self, namespace: str, name: str, uid: str) -> None:
        """A watched object of the run changed (called in the loop)."""
        if not self.holds(namespace, name):
            return
        if (namespace, name) in self.wakeups:
            self.wake(namespace, name)
        elif self.loop is not None and _needs_pass(self.view.jobs_of_run(uid)):
            # A moment later, and only if still so: a Job the operator deletes is seen being
            # deleted before its finalizer, released in the same breath, is seen gone.
            self.loop.call_later(SETTLE_SECONDS, self._recheck, namespace, name, uid)

    def _recheck(self, namespace: str, name: str, uid: str) -> None:
        if _needs_pass(self.view.jobs_of_run(uid)):
            self.schedule_pass(namespace, name, 0.0)

    # -- finished runs: a timer each, when something is due ----------------------------------

    def schedule_pass(self, namespace: str, name: str, delay: float) -> None:
        """A pass of a run without a daemon in ``delay`` seconds (the earliest one wins)."""
        loop = self.loop
        if loop is None:
            return
        key = (namespace, name)
        due = loop.time() + max(delay, 0.0)
        pending = self.timers.get(key)
        if pending is not None and pending.when() <= due:
            return
        if pending is not None:
            pending.cancel()
        self.timers[key] = loop.call_at(due, self._timer_fired, namespace, name)

    def cancel_timer(self, namespace: str, name: str) -> None:
        pending = self.timers.pop((namespace, name), None)
        if pending is not None:
            pending.cancel()

    def cancel_timers(self) -> None:
        for key in list(self.timers):
            self.cancel_timer(*key)

    def _timer_fired(self, namespace: str, name: str) -> None:
        self.timers.pop((namespace, name), None)
        self.spawn(self._timed_pass(namespace, name))

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _timed_pass(self, namespace: str, name: str) -> None:
        if (namespace, name) in self.wakeups:  # a daemon drives it
            self.wake(namespace, name)
            return
        if self.synced is not None:
            await self.synced.wait()
        try:
            outcome = await self._owned_pass(namespace, name)
        except Exception as error:
            self.schedule_pass(namespace, name, _failed("reconcile", error, namespace, name))
            return
        if outcome is not None:
            self.after_pass(namespace, name, outcome)
        elif self.holds(namespace, name):  # its shard's renewal is late: try again soon
            self.schedule_pass(namespace, name, OWNERSHIP_RECHECK_SECONDS)

    def after_pass(self, namespace: str, name: str, outcome: Outcome) -> None:
        """A finished run's next pass is due only at its next timer, if it has one."""
        if outcome.phase in FINISHED and outcome.requeue_after is not None:
            self.schedule_pass(namespace, name, outcome.requeue_after)

    def finished_run_seen(self, body: Mapping[str, Any]) -> None:
        """A finished run was listed or changed: a pass now or at its next timer, if the
        watched Jobs or the run ask for one; otherwise nothing, even when it lacks the run
        finalizer (an older operator's run, or one whose finalizer an editor removed). A
        finished run needs that finalizer only while something of it is left to clean up: a
        Job still running, or still holding its outcome finalizer. Each such Job asks for a
        pass, and a pass adds the finalizer before anything else (:meth:`Reconciler._held`);
        the rest of what a finished run owns goes with it by its owner references (the
        garbage collector), and the janitor releases any Job whose run is gone."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if meta.get("deletionTimestamp"):
            return
        if self.synced is None or not self.synced.is_set():
            # Until the Jobs are listed: the body only if the run itself may be due, else its
            # identity (read again should its Jobs ask for a check). At a start that finds
            # thousands of finished runs, this is most of what it holds meanwhile.
            self.unchecked[key] = dict(body) if _may_be_due(body) else _identity(body)
            return
        jobs_of_run = self.view.jobs_of_run(str(meta.get("uid", "")))
        if not jobs_of_run and not _may_be_due(body):
            return
        self.spawn(self._check_finished(key, dict(body), jobs_of_run))

    async def _check_finished(
        self, key: tuple[str, str], body: dict[str, Any], found: list[dict[str, Any]]
    ) -> None:
        try:
            if "spec" not in body:  # kept as its identity only: read it now
                read = await asyncio.to_thread(self.reconciler.ledger.read, *key)
                if read is None:
                    return
                body = read
            delay = await asyncio.to_thread(self.reconciler.due_in, body, found)
        except Exception as error:
            logged(log, "check", "check of a finished run", error, "passing it", _ctx(*key))
            delay = 0.0
        if delay is not None:
            self.schedule_pass(*key, delay)

    async def watches_listed(self) -> None:
        """Wait for the first list of every watch, then let passes run."""
        await asyncio.to_thread(self.view.wait_synced)
        assert self.synced is not None
        self.synced.set()
        self.readiness.informer_listed()
        log.info("watches of step Jobs, pods and pod refusals listed; %d objects seen",
                 self.view.size())  # fmt: skip
        unchecked, self.unchecked = self.unchecked, {}
        for body in unchecked.values():
            self.finished_run_seen(body)


class Waker:
    """``wake(namespace, name, uid)`` from any thread: hands the change to the loop. Made
    before the :class:`Scheduler` it wakes (the reconciler it drives takes it)."""

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None

    def __call__(self, namespace: str, name: str, uid: str) -> None:
        scheduler = self.scheduler
        loop = scheduler.loop if scheduler is not None else None
        if scheduler is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(scheduler.observed, namespace, name, uid)


def _waited(due: float, reconciler: Reconciler, namespace: str, name: str) -> Outcome:
    """:func:`_pass`, on a worker, counting how long since ``due`` it waited for one
    (agentrun_reconcile_wait_seconds)."""
    metrics.pass_began(due)
    return _pass(reconciler, namespace, name)


def _pass(reconciler: Reconciler, namespace: str, name: str) -> Outcome:
    """One reconcile pass, timed (agentrun_reconcile_duration_seconds)."""
    with metrics.reconcile_pass():
        return reconciler.reconcile(namespace, name)


FAILED_PASS_RETRY_SECONDS = 5.0
"""When a pass that failed is tried again, unless the API server asked for another wait."""


def _failed(what: str, error: Exception, namespace: str, name: str) -> float:
    """Log a failed pass; the seconds until it is tried again: what a 429's Retry-After asks,
    else :data:`FAILED_PASS_RETRY_SECONDS`. The API server away, unavailable or shedding load
    (:func:`agentrun.kubeapi.transient`) is one line, counted
    (:func:`agentrun.telemetry.retries.logged`), no traceback; anything else has its
    traceback."""

    def wait(away: Transient | None) -> float:
        asked = away.wait if away is not None else None
        return FAILED_PASS_RETRY_SECONDS if asked is None else asked

    away = logged(log, "pass", what, error, lambda away: f"retrying in {wait(away):.0f}s",
                  _ctx(namespace, name))  # fmt: skip
    if away is not None and away.wait is not None:
        metrics.THROTTLED_PASSES.inc()
    return wait(away)


def _ctx(namespace: str, name: str) -> dict[str, Any]:
    return {"agentrun": {"run": f"{namespace}/{name}"}}


def _needs_pass(found: list[dict[str, Any]]) -> bool:
    """Whether a change of a finished run's Jobs may ask for a pass: a Job still running (a
    late create, to be deleted) or one being deleted that still holds the outcome finalizer
    (to be released)."""
    for job in found:
        meta = job.get("metadata") or {}
        if (meta.get("deletionTimestamp") and jobs.is_held(job)) or not jobs.is_finished(job):
            return True
    return False


async def _sleep(wake: asyncio.Event, stopped: Stopped, delay: float) -> None:
    async def until_stopped() -> None:
        await stopped.wait()

    tasks = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(until_stopped())}
    try:
        await asyncio.wait(tasks, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


_IDENTITY = ("namespace", "name", "uid", "resourceVersion", "finalizers", "deletionTimestamp")


def _identity(body: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``body``'s metadata identity and version: what a start that finds thousands of
    finished runs keeps of each until the Jobs are listed (read again should one need a
    check), not whole bodies."""
    meta = body.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in _IDENTITY if k in meta}}


def _may_be_due(body: Mapping[str, Any]) -> bool:
    """Whether finished run ``body`` may need a pass whatever its Jobs: it has a retention
    time, or its spec changed since its status was derived."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    retention = (body.get("spec") or {}).get("retention") or {}
    edited = meta.get("generation") != status.get("observedGeneration")
    return retention.get("ttlSecondsAfterFinished") is not None or edited
