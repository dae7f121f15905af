"""Deletions that nobody else finishes: runs being deleted, and step Jobs whose run is gone.

A run's deletion has a task of its own once kopf's watch shows the run's deletionTimestamp
(:meth:`Janitor.finish_deletion`, started by the scheduler). Three
times nobody watches: in a namespace being deleted (kopf's namespace observer drops a
namespace from its watch as soon as the namespace controller has marked it deleted, before
the objects in it are gone), while the operator is down, and after it is uninstalled. Each
left the run's finalizer (``agentrun.dev/cleanup``) and its Jobs' (``agentrun.dev/outcome``)
in place for good, and with them the namespace, Terminating forever.

The janitor depends on no watch. At startup, and then every ``AGENTRUN_JANITOR_SECONDS``, one
:meth:`Janitor.sweep`:

1. lists the step Jobs in scope (label ``agentrun.dev/run-uid``, managed by the operator);
2. lists the AgentRuns in scope;
3. for each run with a deletionTimestamp that still carries the run finalizer: removes what
   it owns (:meth:`Reconciler.cleanup`: Jobs, their finalizers, pods, result objects), then its
   finalizer (a JSON patch guarded by a ``test`` op). When something is left (held by someone
   else's finalizer), it waits as a deletion's task does (:func:`.cleanup.with_patience`):
   the finalizer goes anyway once the deletionTimestamp is ``cleanup_timeout_seconds`` old,
   with a CleanupIncomplete Event. A cleanup that failed is tried again by the next pass,
   under the same patience;
4. for each Job still carrying the Job finalizer whose run is not in the list, or is being
   deleted: releases that finalizer (the garbage collector, or the namespace controller,
   then removes the Job, since its owner is gone).

Jobs are listed before runs: a Job's run exists before the Job, so a Job of the first list
whose run is missing from the second has lost its run; it is not the Job of a run created
between the two lists.

A namespace being deleted needs no rule of its own: the namespace controller deletes every
object in it, so its runs and Jobs carry a deletionTimestamp, and removing finalizers is still
allowed there (creating Events is not: those are skipped).

Cost at rest (no run being deleted): two LIST calls per pass (per watched namespace when the
operator watches a list of namespaces), of metadata only (:data:`METADATA_ONLY`: a run's spec
and status are most of its size, and a sweep reads neither), and no request per run or per
Job. A pass does work only for runs being deleted and for Jobs whose run is gone, and racing
a deletion's own task is harmless: cleanup holds the run's lock and every removal
tolerates "already gone".

:func:`release` is uninstalling on purpose (``agentrun release``, ``kubectl agentrun
release``, the Helm chart's pre-delete hook): it deletes every run in scope and sweeps
without waiting for anything, so no finalizer is left for an operator that will not come back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import EmitEvent
from agentrun.kubeapi import (
    JSON_PATCH,
    METADATA_ONLY,
    Transient,
    finalizer_removal,
    list_items,
    tolerate,
)
from agentrun.loop import memory
from agentrun.loop.cleanup import with_patience
from agentrun.loop.reconciler import Apis, Reconciler
from agentrun.observation.view import controller_uid
from agentrun.telemetry import metrics
from agentrun.telemetry.retries import logged

log = logging.getLogger("agentrun.janitor")

STEP_JOBS = f"{s.LABEL_RUN_UID},{s.LABEL_MANAGED_BY}={s.MANAGED_BY}"
"""Label selector of every step Job the operator made."""

Body = dict[str, Any]


@dataclass
class Sweep:
    """What one pass did, each entry ``namespace/name``."""

    runs_released: list[str] = field(default_factory=list)
    """Runs whose finalizer this pass removed."""
    runs_waiting: list[str] = field(default_factory=list)
    """Runs being deleted whose cleanup left something (with what), finalizer kept for now."""
    jobs_released: list[str] = field(default_factory=list)
    """Jobs whose finalizer this pass removed (their run gone or being deleted)."""
    failures: list[str] = field(default_factory=list)
    """Cleanups or releases that failed, with why (the next pass tries again)."""

    @property
    def acted(self) -> bool:
        return bool(self.runs_released or self.jobs_released)

    def summary(self) -> str:
        parts = [
            f"{len(self.runs_released)} runs released" if self.runs_released else "",
            f"{len(self.jobs_released)} Jobs released" if self.jobs_released else "",
            f"{len(self.runs_waiting)} runs waiting" if self.runs_waiting else "",
            f"{len(self.failures)} failures" if self.failures else "",
        ]
        return ", ".join(p for p in parts if p) or "nothing to do"


def _key(body: Body) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _deleting(body: Body) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def _finalizers(body: Body) -> list[str]:
    return list((body.get("metadata") or {}).get("finalizers") or [])


def _age(stamp: str, now: datetime) -> float:
    """Seconds since an RFC 3339 timestamp of the API server."""
    return (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()


class Janitor:
    """Finishes deletions in ``namespaces`` (every namespace when empty)."""

    def __init__(
        self,
        reconciler: Reconciler,
        namespaces: Sequence[str] = (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.reconciler = reconciler
        self.apis = reconciler.apis
        self.namespaces = tuple(namespaces)
        self.clock = clock
        self.owns: Callable[[str, str], bool] = lambda namespace, name: True
        """Whether this replica decides a run (with shards, agentrun/loop/shards.py): a
        sweep finishes the deletions of those runs only, and releases the Jobs of gone runs
        only when it decides their run's name."""

    @classmethod
    def connect(cls, api_client: Any, namespaces: Sequence[str] = ()) -> Janitor:
        """A janitor of its own over ``api_client`` (``agentrun release`` and the plugin)."""
        from kubernetes import client as kube_client

        apis = Apis(
            core=kube_client.CoreV1Api(api_client),
            batch=kube_client.BatchV1Api(api_client),
            custom=kube_client.CustomObjectsApi(api_client),
        )
        settings = s.Settings(namespaces=tuple(namespaces))
        return cls(Reconciler(apis, settings), namespaces)

    # -- listing --------------------------------------------------------------------------

    def list_runs(self) -> list[Body]:
        """The runs in scope, their metadata only (all a sweep reads of them)."""
        custom = self.apis.custom
        if not self.namespaces:
            return list_items(
                custom.list_cluster_custom_object(
                    m.GROUP, m.VERSION, m.PLURAL, _preload_content=False, _headers=METADATA_ONLY
                )
            )
        return [
            run
            for ns in self.namespaces
            for run in list_items(
                custom.list_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, _preload_content=False,
                    _headers=METADATA_ONLY,
                )
            )
        ]  # fmt: skip

    def list_step_jobs(self) -> list[Body]:
        """The step Jobs in scope, their metadata only."""
        batch = self.apis.batch
        if not self.namespaces:
            return list_items(
                batch.list_job_for_all_namespaces(
                    label_selector=STEP_JOBS, _preload_content=False, _headers=METADATA_ONLY
                )
            )
        return [
            job
            for ns in self.namespaces
            for job in list_items(
                batch.list_namespaced_job(
                    ns, label_selector=STEP_JOBS, _preload_content=False, _headers=METADATA_ONLY
                )
            )
        ]

    # -- one pass -------------------------------------------------------------------------

    def sweep(
        self,
        *,
        patience: float | None = None,
        events: bool = True,
        finalizers: tuple[str, ...] = (s.RUN_FINALIZER,),
    ) -> Sweep:
        """One pass (see the module docstring). ``patience``: how long after its
        deletionTimestamp a run whose cleanup leaves something keeps its finalizer (default:
        the ``cleanup_timeout_seconds`` setting; 0: release at once). ``events``: post a
        CleanupIncomplete Event when releasing anyway. ``finalizers``: those of a run's the
        sweep releases (:func:`release` adds kopf's, which no running kopf will)."""
        if patience is None:
            patience = float(self.reconciler.settings.cleanup_timeout_seconds)
        done = Sweep()
        step_jobs = self.list_step_jobs()  # first: see the module docstring
        runs = self.list_runs()
        live = {str(r["metadata"]["uid"]) for r in runs if not _deleting(r)}
        cleaned: set[str] = set()
        for run in runs:
            if not _deleting(run) or not set(finalizers) & set(_finalizers(run)):
                continue
            if not self.owns(run["metadata"]["namespace"], run["metadata"]["name"]):
                continue
            if self._finish_run(run, patience, events, done, finalizers):
                cleaned.add(str(run["metadata"]["uid"]))
        for job in step_jobs:
            # Its run is its controller: a label anyone who may edit the Job may change.
            labels = (job.get("metadata") or {}).get("labels") or {}
            uid = controller_uid(job) or labels.get(s.LABEL_RUN_UID)
            if uid in live or uid in cleaned or s.JOB_FINALIZER not in _finalizers(job):
                continue
            run_name = labels.get(s.LABEL_RUN)
            if run_name and not self.owns(job["metadata"]["namespace"], str(run_name)):
                continue
            try:
                self.reconciler.release_job(job["metadata"]["namespace"], job["metadata"]["name"])
            except Exception as error:
                done.failures.append(f"Job {_key(job)}: {error}")
                continue
            done.jobs_released.append(_key(job))
        return done

    def finish_deletion(self, run: Mapping[str, Any]) -> bool:
        """Clean up after run ``run`` (as watched: being deleted) and release its finalizer
        when it may go, as a sweep does; the deletion's own task calls it when the watch
        shows the deletion, and again while it returns True: something is left within the
        deletion's patience, or the cleanup or the release failed."""
        done = Sweep()
        patience = float(self.reconciler.settings.cleanup_timeout_seconds)
        self._finish_run(dict(run), patience, True, done, (s.RUN_FINALIZER,))
        return bool(done.runs_waiting or done.failures)

    def _finish_run(
        self, run: Body, patience: float, events: bool, done: Sweep, finalizers: tuple[str, ...]
    ) -> bool:
        """Clean up after one run being deleted and release ``finalizers`` when it may go.
        True when its cleanup ran (its Jobs were seen to)."""
        meta = run["metadata"]
        ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        ctx = {"agentrun": {"run": f"{ns}/{name}"}}
        deletion = with_patience(
            lambda: self.reconciler.cleanup(ns, name, uid),
            lambda: _age(str(meta["deletionTimestamp"]), self.clock()),
            patience,
        )
        if deletion.error is not None:
            done.failures.append(f"run {ns}/{name}: cleanup failed: {deletion.error}")
            log.warning("cleanup of a deleted run failed: %s", deletion.error, extra=ctx)
            if deletion.waits:  # tried again by the next pass, until patience is over
                return False
        if deletion.waits:
            done.runs_waiting.append(f"{ns}/{name} ({deletion.leftovers})")
            return True
        if deletion.forced:
            message = (
                f"released the finalizer {deletion.waited:.0f}s after the run was deleted, "
                f"cleanup incomplete; left behind: {deletion.leftovers}"
            )
            log.warning(message, extra=ctx)
            if events:
                self._post_event(ns, name, uid, EmitEvent("Warning", "CleanupIncomplete", message))
        try:
            released = self.release_run(ns, name, uid, finalizers)
        except Exception as error:
            done.failures.append(f"run {ns}/{name}: finalizer not released: {error}")
            return True
        if released:
            log.info("cleaned up after the run and released its finalizer", extra=ctx)
            done.runs_released.append(f"{ns}/{name}")
        self.reconciler.forget(ns, name)
        return True

    def release_run(
        self,
        namespace: str,
        name: str,
        uid: str,
        finalizers: tuple[str, ...] = (s.RUN_FINALIZER,),
        tries: int = 3,
    ) -> bool:
        """Remove ``finalizers`` (the run finalizer) from run ``uid``, one JSON patch each,
        guarded by a ``test`` op on it, read fresh each try. True when this call removed
        one."""
        custom = self.apis.custom
        released = False
        for _ in range(tries + len(finalizers)):
            with tolerate(404) as gone:
                body: Body = custom.get_namespaced_custom_object(
                    m.GROUP, m.VERSION, namespace, m.PLURAL, name
                )
            if gone or str(body["metadata"].get("uid")) != uid:
                return released
            held = [f for f in finalizers if f in _finalizers(body)]
            patch = finalizer_removal(_finalizers(body), held[0]) if held else None
            if patch is None:
                return released
            with tolerate(404, 409, 422) as moved:
                custom.patch_namespaced_custom_object(
                    m.GROUP, m.VERSION, namespace, m.PLURAL, name, patch, _content_type=JSON_PATCH
                )
            if moved and moved.status == 404:
                return released
            released = released or not moved
        raise RuntimeError(f"the finalizers of agentrun {namespace}/{name} kept changing")

    def _post_event(self, namespace: str, name: str, uid: str, event: EmitEvent) -> None:
        try:
            self.reconciler.post_event(namespace, name, uid, event)
        except ApiException as error:
            # 403: refused in a namespace being deleted, where nobody would read it anyway.
            level = logging.DEBUG if error.status == 403 else logging.WARNING
            log.log(level, "no %s Event posted: HTTP %s", event.reason, error.status)


def _wait(period: float, away: Transient | None) -> float:
    """Seconds until the next sweep after a failed one: the period, or longer when the API
    server asked for a longer wait (a 429's Retry-After)."""
    return max(period, (away.wait if away is not None else None) or 0.0)


async def keep_sweeping(janitor: Janitor, period: float) -> None:
    """Sweep now and then every ``period`` seconds, until cancelled, each time giving memory
    freed since back to the system (:mod:`.memory`). The synchronous client runs in a
    thread; a failed pass is logged and the next one tries again."""
    period = max(1.0, period)
    while True:
        try:
            done = await asyncio.to_thread(janitor.sweep)
            await asyncio.to_thread(memory.give_back)
        except Exception as error:
            # the API server away or shedding load: a line, counted, never a traceback
            away = logged(log, "janitor", "janitor pass", error,
                          lambda away: f"trying again in {_wait(period, away):.0f}s")  # fmt: skip
            if away is not None and away.wait is not None:
                metrics.THROTTLED_SWEEPS.inc()
            await asyncio.sleep(_wait(period, away) - period)
        else:
            if done.acted or done.failures:
                log.info("janitor: %s", done.summary(), extra={"agentrun": asdict(done)})
        await asyncio.sleep(period)


# -- uninstalling ---------------------------------------------------------------------------

RUN_FINALIZERS = (s.RUN_FINALIZER, s.DAEMON_FINALIZER)
"""Every finalizer a run may carry for the operator: its own, and kopf's while a kopf daemon
drives the run (with peering)."""


@dataclass
class Leftovers:
    """What still carries one of the operator's finalizers after :func:`release`."""

    runs: list[str]
    jobs: list[str]

    def __bool__(self) -> bool:
        return bool(self.runs or self.jobs)


def release(
    janitor: Janitor,
    say: Callable[[str], None],
    *,
    max_passes: int = 10,
    interval: float = 1.0,
) -> Leftovers:
    """Delete every run in the janitor's scope and release the finalizers of runs and of
    step Jobs at once, without an operator. Sweeps until a pass finds nothing more to do (an
    operator still running may create a Job in a pass that began before the deletion), at
    least twice, at most ``max_passes`` times. Returns what still carries a finalizer of the
    operator (nothing, normally)."""
    deleted = 0
    for run in janitor.list_runs():
        if _deleting(run):
            continue
        meta = run["metadata"]
        with tolerate(404) as gone:
            janitor.apis.custom.delete_namespaced_custom_object(
                m.GROUP, m.VERSION, meta["namespace"], m.PLURAL, meta["name"]
            )
        if not gone:
            deleted += 1
            say(f"deleted agentrun {_key(run)}")
    runs = jobs = 0
    for attempt in range(max_passes):
        if attempt:
            time.sleep(interval)
        done = janitor.sweep(patience=0, events=False, finalizers=RUN_FINALIZERS)
        for key in done.runs_released:
            say(f"released agentrun {key}")
        for key in done.jobs_released:
            say(f"released Job {key}")
        for failure in done.failures:
            say(f"failed: {failure}")
        runs, jobs = runs + len(done.runs_released), jobs + len(done.jobs_released)
        if attempt >= 1 and not done.acted and not done.failures:
            break
    left = leftovers(janitor)
    scope = ", ".join(janitor.namespaces) or "every namespace"
    say(f"{scope}: deleted {deleted} runs; released {runs} runs and {jobs} step Jobs")
    return left


def leftovers(janitor: Janitor) -> Leftovers:
    """Runs and step Jobs in scope that still carry the operator's finalizer."""
    return Leftovers(
        runs=_holding(janitor.list_runs(), *RUN_FINALIZERS),
        jobs=_holding(janitor.list_step_jobs(), s.JOB_FINALIZER),
    )


def _holding(bodies: Iterable[Body], *finalizers: str) -> list[str]:
    return [_key(b) for b in bodies if set(finalizers) & set(_finalizers(b))]
