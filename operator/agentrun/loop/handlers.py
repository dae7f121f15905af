"""kopf wiring, and nothing else: every decision lives in the core, every write in the shell.

* a daemon per unfinished AgentRun drives it: one reconcile pass, then sleep until the next
  timer, a wake-up (an event on the run, or a change the watches of its Jobs, their pods and
  their pods' refusals report: agentrun/observation/watches.py) or the periodic resync, whichever
  comes
  first. No pass runs before those watches have listed once;
* a finished run costs nothing at rest: its daemon ends with the pass that finishes it, and
  what it still needs (deleting its Jobs after the grace, deleting itself past its retention
  TTL) runs as a timer at the moment it is due, as does a pass for a change seen later (a Job
  of it being deleted, an edit of its spec). At startup, a finished run is checked in memory
  against the watched Jobs and gets a timer only when something is due;
* the deletion handler removes what the run owns, and releases the run's finalizer within
  ``cleanup_timeout_seconds`` even if cleanup keeps failing (with an Event saying what was left);
* the janitor (agentrun/loop/janitor.py), started with the operator, finishes the deletions that no
  watch delivers (a namespace being deleted, runs deleted while the operator was down).

kopf keeps its own bookkeeping in annotations under ``agentrun.dev/`` and never touches
``.status``, which belongs to the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import kopf
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import EmitEvent
from agentrun.execution import jobs
from agentrun.loop import concurrency
from agentrun.loop.janitor import Janitor, keep_sweeping
from agentrun.loop.reconciler import Apis, Checkpoint, Outcome, Reconciler, RunBodies
from agentrun.observation.watches import ClusterView, Informer
from agentrun.telemetry import metrics, tracing
from agentrun.telemetry.endpoints import Endpoints, Readiness, watch_kopf_listings

log = logging.getLogger("agentrun.handlers")


@dataclass
class OperatorState:
    """What the handlers share (kopf's memo)."""

    reconciler: Reconciler
    settings: s.Settings
    janitor: Janitor
    informer: Informer
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    """One per running daemon (unfinished run)."""
    timers: dict[tuple[str, str], asyncio.TimerHandle] = field(default_factory=dict)
    """The next pass of a finished run, when one is due."""
    janitor_task: asyncio.Task[None] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    synced: asyncio.Event | None = None
    """Set once the watches have listed (passes wait for it)."""
    unchecked: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """Finished runs seen before the watches listed, checked once they have."""
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    readiness: Readiness = field(default_factory=Readiness)
    """What /readyz waits for: kopf's watch of runs and the watches below having listed."""

    @property
    def view(self) -> ClusterView:
        return self.informer.view

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        event = self.wakeups.get((namespace, name))
        if event is not None:
            event.set()

    def observed(self, namespace: str, name: str, uid: str) -> None:
        """A watched object of the run changed (called in the loop)."""
        if (namespace, name) in self.wakeups:
            self.wake(namespace, name)
        elif self.loop is not None and _needs_pass(self.view.jobs_of_run(uid)):
            # A moment later, and only if still so: a Job the operator deletes is seen being
            # deleted before its finalizer, released in the same breath, is seen gone.
            self.loop.call_later(SETTLE_SECONDS, self._recheck, namespace, name, uid)

    def _recheck(self, namespace: str, name: str, uid: str) -> None:
        if _needs_pass(self.view.jobs_of_run(uid)):
            self.schedule_pass(namespace, name, 0.0)

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
            outcome = await asyncio.to_thread(_pass, self.reconciler, namespace, name)
        except Exception:
            log.exception("reconcile failed; retrying", extra=_ctx(namespace, name))
            self.schedule_pass(namespace, name, 5.0)
            return
        self.after_pass(namespace, name, outcome)

    def after_pass(self, namespace: str, name: str, outcome: Outcome) -> None:
        """A finished run's next pass is due only at its next timer, if it has one."""
        if outcome.phase in FINISHED and outcome.requeue_after is not None:
            self.schedule_pass(namespace, name, outcome.requeue_after)

    def finished_run_seen(self, body: Mapping[str, Any]) -> None:
        """A finished run was listed or changed: a pass now or at its next timer, if the
        watched Jobs or the run ask for one; otherwise nothing."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if self.synced is None or not self.synced.is_set():
            self.unchecked[key] = dict(body)
            return
        if meta.get("deletionTimestamp"):
            return
        jobs_of_run = self.view.jobs_of_run(str(meta.get("uid", "")))
        status = body.get("status") or {}
        retention = (body.get("spec") or {}).get("retention") or {}
        edited = meta.get("generation") != status.get("observedGeneration")
        if not jobs_of_run and retention.get("ttlSecondsAfterFinished") is None and not edited:
            return
        self.spawn(self._check_finished(key, dict(body), jobs_of_run))

    async def _check_finished(
        self, key: tuple[str, str], body: dict[str, Any], found: list[dict[str, Any]]
    ) -> None:
        try:
            delay = await asyncio.to_thread(_due_in, body, found, self.reconciler)
        except Exception:
            log.exception("could not check a finished run; passing it", extra=_ctx(*key))
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


FINISHED = frozenset(str(p) for p in m.TERMINAL_RUN_PHASES)
SETTLE_SECONDS = 1.0


def _pass(reconciler: Reconciler, namespace: str, name: str) -> Outcome:
    """One reconcile pass, timed (agentrun_reconcile_duration_seconds)."""
    with metrics.reconcile_pass():
        return reconciler.reconcile(namespace, name)


def _ctx(namespace: str, name: str) -> dict[str, Any]:
    return {"agentrun": {"run": f"{namespace}/{name}"}}


def _needs_pass(found: list[dict[str, Any]]) -> bool:
    """Whether a change of a finished run's Jobs may ask for a pass: a Job still running (a
    late create, to be deleted) or one being deleted that still holds the outcome finalizer
    (to be released)."""
    for job in found:
        meta = job.get("metadata") or {}
        held = s.JOB_FINALIZER in (meta.get("finalizers") or [])
        if (meta.get("deletionTimestamp") and held) or not jobs.is_finished(job):
            return True
    return False


def _due_in(body: dict[str, Any], found: list[dict[str, Any]], rec: Reconciler) -> float | None:
    """In memory: seconds until a finished run needs a pass (0: now), None if never. The
    core is asked what it would do with the run and its watched Jobs (unverified: a pass
    verifies them before acting)."""
    return rec.due_in(body, found)


def api_client() -> Any:
    """A client from $KUBECONFIG (or ~/.kube/config), else the in-cluster ServiceAccount.

    Every request it sends is counted (agentrun_api_requests_total). Its User-Agent names the
    operator: the API server records a write that names no field
    manager under the User-Agent's first word, so every write of the operator shows in
    managedFields as ``agentrun-operator`` (the ledger also names it on status writes)."""
    from agentrun import __version__

    from_file: Callable[..., Any] = kube_config.new_client_from_config
    in_cluster: Callable[[], None] = kube_config.load_incluster_config
    try:
        # Named here: the client's own default was read from $KUBECONFIG when it was imported,
        # before `agentrun run --kubeconfig` set it.
        client = from_file(config_file=os.environ.get("KUBECONFIG") or None)
    except kube_config.ConfigException:
        in_cluster()
        client = kube_client.ApiClient()
    client.user_agent = f"{s.FIELD_MANAGER}/{__version__}"
    return metrics.count_requests(client)


class _Waker:
    """``wake(namespace, name, uid)`` from any thread: hands the change to the loop."""

    def __init__(self) -> None:
        self.state: OperatorState | None = None

    def __call__(self, namespace: str, name: str, uid: str) -> None:
        state = self.state
        if state is not None and state.loop is not None and not state.loop.is_closed():
            state.loop.call_soon_threadsafe(state.observed, namespace, name, uid)


def make_state(settings: s.Settings, checkpoint: Checkpoint | None = None) -> OperatorState:
    client = api_client()
    concurrency.size_connection_pool(
        client, concurrency.connections_for(settings.workers, len(settings.namespaces))
    )
    apis = Apis(
        core=kube_client.CoreV1Api(client),
        batch=kube_client.BatchV1Api(client),
        custom=kube_client.CustomObjectsApi(client),
    )
    view = ClusterView()
    waker = _Waker()
    bodies = RunBodies()
    reconciler = (
        Reconciler(apis, settings, view=view, wake=waker, bodies=bodies)
        if checkpoint is None
        else Reconciler(apis, settings, checkpoint=checkpoint, view=view, wake=waker, bodies=bodies)
    )
    informer = Informer(apis, settings.namespaces, waker, view)
    state = OperatorState(
        reconciler,
        settings,
        Janitor(reconciler, settings.namespaces),
        informer,
        readiness=Readiness(settings.namespaces),
    )
    waker.state = state
    return state


def _state(memo: Any) -> OperatorState:
    state: OperatorState = memo.state
    return state


class _NoDiffBase(kopf.DiffBaseStorage):
    """Keep no copy of the spec in an annotation: no handler here reacts to spec diffs (the
    daemon re-reads the whole run every pass), and a copy would double the object's size."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = s.RUN_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=s.ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = _NoDiffBase()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # A run's daemon ends by itself with the pass that finishes the run; that pass may still
    # be writing when the finished run's own event tells kopf to stop the daemon. Waiting up
    # to a second for it spares kopf's delayed re-check, which costs a patch of the run.
    settings.background.instant_exit_timeout = 1.0
    state = _state(memo)
    settings.peering.standalone = state.settings.peering is None
    if state.settings.peering is not None:
        settings.peering.name = state.settings.peering


@kopf.on.startup()
async def bound_concurrency(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Passes and sweeps (``asyncio.to_thread``: the loop's default executor) and kopf's own
    sync handlers (deletion cleanup) each run on ``workers`` threads (agentrun/loop/concurrency.py).
    """
    workers = _state(memo).settings.workers
    asyncio.get_running_loop().set_default_executor(concurrency.pass_executor(workers))
    settings.execution.max_workers = workers


@kopf.on.startup()
async def start_watching(memo: kopf.Memo, **_: Any) -> None:
    """The watches of step Jobs, their pods and their refusals (threads of their own)."""
    state = _state(memo)
    state.loop = asyncio.get_running_loop()
    state.synced = asyncio.Event()
    state.informer.start()
    state.spawn(state.watches_listed())


@kopf.on.cleanup()
async def stop_watching(memo: kopf.Memo, **_: Any) -> None:
    state = _state(memo)
    for key in list(state.timers):
        state.cancel_timer(*key)
    await asyncio.to_thread(state.informer.stop)


@kopf.on.startup()
async def start_janitor(memo: kopf.Memo, **_: Any) -> None:
    """Sweep now (runs deleted while the operator was down) and then periodically."""
    state = _state(memo)
    state.janitor_task = asyncio.create_task(
        keep_sweeping(state.janitor, float(state.settings.janitor_seconds)), name="janitor"
    )


@kopf.on.cleanup()
async def stop_janitor(memo: kopf.Memo, **_: Any) -> None:
    task = _state(memo).janitor_task
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
    return info


def _unfinished(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") not in FINISHED


@kopf.daemon(
    m.GROUP,
    m.VERSION,
    m.PLURAL,
    when=_unfinished,
    cancellation_backoff=5.0,
    cancellation_timeout=30.0,
)
async def drive_run(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, memo: Any, **_: Any
) -> None:
    """Reconcile one run until it is finished (then timers take over) or deleted."""
    assert namespace is not None, "AgentRuns are namespaced"
    state = _state(memo)
    wake = state.wakeup(namespace, name)
    state.cancel_timer(namespace, name)
    resync = float(state.settings.resync_seconds)
    try:
        if state.synced is not None:
            await state.synced.wait()
        while not stopped:
            wake.clear()
            try:
                outcome = await asyncio.to_thread(_pass, state.reconciler, namespace, name)
                if outcome.phase in FINISHED:
                    state.after_pass(namespace, name, outcome)
                    return
                delay = min(outcome.requeue_after or resync, resync)
            except Exception:
                log.exception(
                    "reconcile failed; retrying", extra={"agentrun": {"run": f"{namespace}/{name}"}}
                )
                delay = 5.0
            await _sleep(wake, stopped, delay)
    finally:
        state.wakeups.pop((namespace, name), None)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> None:
    async def until_stopped() -> None:
        await stopped.wait()

    tasks = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(until_stopped())}
    try:
        await asyncio.wait(tasks, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


@kopf.on.event(m.GROUP, m.VERSION, m.PLURAL)
async def run_changed(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    status: kopf.Status,
    memo: Any,
    type: str | None = None,
    **_: Any,
) -> None:
    if type == "DELETED":
        metrics.RUNS.gone(namespace or "", name)
    else:
        metrics.RUNS.seen(namespace or "", name, status.get("phase"))
    state = _state(memo)
    bodies = state.reconciler.bodies
    if bodies is not None:
        if type == "DELETED":
            bodies.drop(namespace or "", name)
        else:
            bodies.offer(dict(body))  # before the wake: the pass starts from it
    state.wake(namespace or "", name)
    if status.get("phase") in FINISHED and (namespace or "", name) not in state.wakeups:
        state.finished_run_seen(body)


@kopf.on.delete(m.GROUP, m.VERSION, m.PLURAL, backoff=2.0)
def cleanup(
    name: str, namespace: str | None, uid: str, memo: Any, runtime: timedelta, **_: Any
) -> None:
    """Remove the run's Jobs, pods and result objects, then let the finalizer go."""
    assert namespace is not None, "AgentRuns are namespaced"
    state = _state(memo)
    loop = state.loop
    if loop is not None:
        loop.call_soon_threadsafe(state.cancel_timer, namespace, name)
    try:
        left = state.reconciler.cleanup(namespace, name, uid)
        error = None
    except Exception as exc:  # cleanup must never hang the deletion forever
        left, error = [f"cleanup failed: {exc}"], exc
    if not left:
        log.info("cleaned up", extra={"agentrun": {"run": f"{namespace}/{name}"}})
        state.reconciler.forget(namespace, name)
        return
    if runtime.total_seconds() < state.settings.cleanup_timeout_seconds:
        raise kopf.TemporaryError(f"still there: {', '.join(left)}", delay=2.0) from error
    message = (
        f"released the finalizer after {state.settings.cleanup_timeout_seconds}s of failed "
        f"cleanup; left behind: {', '.join(left)}"
    )
    log.warning(message, extra={"agentrun": {"run": f"{namespace}/{name}"}})
    state.reconciler.forget(namespace, name)
    try:
        state.reconciler.post_event(
            namespace, name, uid, EmitEvent("Warning", "CleanupIncomplete", message)
        )
    except Exception:
        log.exception("could not post the CleanupIncomplete event")


def run_operator(
    settings: s.Settings,
    *,
    liveness_host: str = "0.0.0.0",
    checkpoint: Checkpoint | None = None,
) -> None:
    """Run the operator in the foreground until SIGINT or SIGTERM. ``checkpoint`` is called
    at the reconciler's named checkpoints (fault injection in tests; none in production)."""
    state = make_state(settings, checkpoint)
    memo = kopf.Memo(state=state)
    liveness = (
        f"http://{liveness_host}:{settings.liveness_port}/healthz"
        if settings.liveness_port
        else None
    )
    endpoints = None
    if settings.metrics_port:
        try:
            endpoints = Endpoints(settings.metrics_host, settings.metrics_port, state.readiness)
        except OSError as error:
            raise SystemExit(
                f"agentrun run: cannot serve /metrics and /readyz on "
                f"{settings.metrics_host}:{settings.metrics_port}: {error.strerror or error}; "
                "choose another --metrics-port (AGENTRUN_METRICS_PORT), or 0 to turn them off"
            ) from error
        endpoints.start()
    unwatch = watch_kopf_listings(state.readiness)
    tracing.install(settings)
    try:
        kopf.run(
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=settings.peering is None,
            peering_name=settings.peering,
            liveness_endpoint=liveness,
            memo=memo,
        )
    finally:
        tracing.shutdown()
        unwatch()
        if endpoints is not None:
            endpoints.stop()
