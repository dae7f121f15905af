"""kopf wiring, and nothing else: every decision lives in the core, every write in the shell.

* a daemon per AgentRun drives it: one reconcile pass, then sleep until the next timer, a wake-up
  (an event on the run or one of its Jobs) or the periodic resync, whichever comes first;
* the deletion handler removes what the run owns, and releases the run's finalizer within
  ``cleanup_timeout_seconds`` even if cleanup keeps failing (with an Event saying what was left);
* the janitor (agentrun/janitor.py), started with the operator, finishes the deletions that no
  watch delivers (a namespace being deleted, runs deleted while the operator was down).

kopf keeps its own bookkeeping in annotations under ``agentrun.dev/`` and never touches
``.status``, which belongs to the ledger.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import kopf
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import EmitEvent
from agentrun.janitor import Janitor, keep_sweeping
from agentrun.reconciler import Apis, Checkpoint, Reconciler

log = logging.getLogger("agentrun.handlers")


@dataclass
class OperatorState:
    """What the handlers share (kopf's memo)."""

    reconciler: Reconciler
    settings: s.Settings
    janitor: Janitor
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    janitor_task: asyncio.Task[None] | None = None

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakeups.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        event = self.wakeups.get((namespace, name))
        if event is not None:
            event.set()


def api_client() -> Any:
    """A client from $KUBECONFIG (or ~/.kube/config), else the in-cluster ServiceAccount."""
    from_file: Callable[..., Any] = kube_config.new_client_from_config
    in_cluster: Callable[[], None] = kube_config.load_incluster_config
    try:
        return from_file()
    except kube_config.ConfigException:
        in_cluster()
        return kube_client.ApiClient()


def make_state(settings: s.Settings, checkpoint: Checkpoint | None = None) -> OperatorState:
    client = api_client()
    apis = Apis(
        core=kube_client.CoreV1Api(client),
        batch=kube_client.BatchV1Api(client),
        custom=kube_client.CustomObjectsApi(client),
    )
    reconciler = (
        Reconciler(apis, settings)
        if checkpoint is None
        else Reconciler(apis, settings, checkpoint=checkpoint)
    )
    return OperatorState(reconciler, settings, Janitor(reconciler, settings.namespaces))


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
    state = _state(memo)
    settings.peering.standalone = state.settings.peering is None
    if state.settings.peering is not None:
        settings.peering.name = state.settings.peering


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


@kopf.daemon(m.GROUP, m.VERSION, m.PLURAL, cancellation_backoff=5.0, cancellation_timeout=30.0)
async def drive_run(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, memo: Any, **_: Any
) -> None:
    """Reconcile one run until it is deleted."""
    assert namespace is not None, "AgentRuns are namespaced"
    state = _state(memo)
    wake = state.wakeup(namespace, name)
    resync = float(state.settings.resync_seconds)
    try:
        while not stopped:
            wake.clear()
            try:
                outcome = await asyncio.to_thread(state.reconciler.reconcile, namespace, name)
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
def run_changed(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    _state(memo).wake(namespace or "", name)


@kopf.on.event("batch", "v1", "jobs", labels={s.LABEL_RUN: kopf.PRESENT})
def job_changed(
    labels: kopf.Labels,
    annotations: kopf.Annotations,
    namespace: str | None,
    memo: Any,
    **_: Any,
) -> None:
    name = annotations.get(s.ANNOTATION_RUN_NAME) or labels[s.LABEL_RUN]
    _state(memo).wake(namespace or "", name)


@kopf.on.delete(m.GROUP, m.VERSION, m.PLURAL, backoff=2.0)
def cleanup(
    name: str, namespace: str | None, uid: str, memo: Any, runtime: timedelta, **_: Any
) -> None:
    """Remove the run's Jobs, pods and result objects, then let the finalizer go."""
    assert namespace is not None, "AgentRuns are namespaced"
    state = _state(memo)
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
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        liveness_endpoint=liveness,
        memo=memo,
    )
