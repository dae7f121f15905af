"""kopf wiring, and nothing else: every decision lives in the core, every write in the shell.

* every event on a run (of kopf's watch of runs; with shards, of the operator's own watches
  of its shards' runs, agentrun/loop/run_watch.py) feeds the run's latest body to the
  reconciler and hands the run to the scheduler (agentrun/loop/scheduler.py), which decides
  when each run gets its next pass: while unfinished, in a task of its own, after a timer, a
  wake-up or the periodic resync; once finished, only when something is due. With kopf
  peering (``AGENTRUN_PEERING``), a kopf daemon per unfinished run drives it instead, so that
  kopf pauses it when another operator takes over;
* an event showing a run being deleted starts its deletion's task (the scheduler's), which
  removes what the run owns and releases the run's finalizer, within
  ``cleanup_timeout_seconds`` even if cleanup keeps failing (with an Event saying what was
  left), as the janitor does (agentrun/loop/janitor.py); the janitor, started with the
  operator, also finishes the deletions that no watch delivers (a namespace being deleted,
  runs deleted while the operator was down).

kopf has no deletion handler: the operator puts the run finalizer on runs itself (its first
status write would otherwise race kopf's patch), through its own client and workers. kopf
keeps its own bookkeeping in annotations under ``agentrun.dev/`` and never touches
``.status``, which belongs to the ledger; with peering, its daemons carry a finalizer of
kopf's own (``agentrun.dev/daemon``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as kube_client

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core.shards import shard_of
from agentrun.kubeapi import (
    CONNECT_SECONDS,
    SERVER_REQUEST_SECONDS,
    WATCH_GRACE_SECONDS,
    WATCH_SECONDS,
    WATCH_SILENCE_SECONDS,
    dead_peer_socket,
)
from agentrun.loop import concurrency, memory
from agentrun.loop.janitor import Janitor, keep_sweeping
from agentrun.loop.reconciler import Apis, Checkpoint, Reconciler, RunBodies
from agentrun.loop.run_events import RunEvents
from agentrun.loop.run_watch import RunSources, RunWatch, run_event
from agentrun.loop.scheduler import FINISHED, Scheduler, Waker
from agentrun.loop.shards import ShardKeeper
from agentrun.observation.view import ClusterView
from agentrun.observation.watches import Informer
from agentrun.telemetry import metrics, retries, tracing
from agentrun.telemetry.endpoints import Endpoints, Readiness, watch_kopf_listings

log = logging.getLogger("agentrun.handlers")

KOPF_REQUEST_SECONDS = SERVER_REQUEST_SECONDS + WATCH_GRACE_SECONDS
"""How long one of kopf's own requests that is not a watch may take in all (kopf's limit is
on the whole request, not on each read): the API server's own limit on such a request and a
little more, so that a list of every run the server still serves is never cut short, and a
request on a connection that stalled is given up within about a minute."""


@dataclass
class OperatorState:
    """What the handlers share (kopf's memo)."""

    reconciler: Reconciler
    settings: s.Settings
    janitor: Janitor
    informer: Informer
    scheduler: Scheduler
    readiness: Readiness
    """What /readyz waits for: kopf's watch of runs and the watches below having listed."""
    janitor_task: asyncio.Task[None] | None = None
    shards: ShardKeeper | None = None
    """With ``AGENTRUN_SHARDS``: the Leases of the shards this replica decides."""


def api_client() -> Any:
    """A client from $KUBECONFIG (or ~/.kube/config), else the in-cluster ServiceAccount.

    Every request it sends is counted (agentrun_api_requests_total). Its User-Agent names the
    operator: the API server records a write that names no field
    manager under the User-Agent's first word, so every write of the operator shows in
    managedFields as ``agentrun-operator`` (the ledger also names it on status writes)."""
    from agentrun import __version__
    from agentrun.kubeapi import load_cluster

    # $KUBECONFIG is read now, after `agentrun run --kubeconfig` set it (the kubernetes
    # package's own default was read when it was imported).
    client = load_cluster(fall_back=True).api_client(f"{s.FIELD_MANAGER}/{__version__}")
    return metrics.count_requests(client)


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
    waker = Waker()
    bodies = RunBodies()
    reconciler = (
        Reconciler(apis, settings, view=view, wake=waker, bodies=bodies)
        if checkpoint is None
        else Reconciler(apis, settings, checkpoint=checkpoint, view=view, wake=waker, bodies=bodies)
    )
    readiness = Readiness(settings.namespaces)
    janitor = Janitor(reconciler, settings.namespaces)
    scheduler = Scheduler(reconciler, view, readiness, janitor.finish_deletion)
    waker.scheduler = scheduler

    def relisted(kind: str) -> None:
        metrics.WATCH_RELISTS.labels(kind).inc()

    def retried(reason: str) -> None:
        retries.count("watch", reason)

    runs = None
    if settings.shards:  # its own watches of its shards' runs (agentrun/observation/runs.py)
        watch = RunWatch(
            scheduler, bodies, reconciler.ledger, settings.shards, lambda: informer.followed()
        )
        runs = RunSources(watch, apis.custom, readiness.runs_listed_here, relisted, retried)
    informer = Informer(
        apis,
        settings.namespaces,
        waker,
        view,
        relisted=relisted,
        shard_count=settings.shards,
        retried=retried,
        runs=runs,
    )
    readiness.watch_troubles(informer.troubles)
    keeper = None
    if settings.shards:
        keeper = ShardKeeper(
            kube_client.CoordinationV1Api(client),
            settings.operator_namespace,
            settings.identity,
            settings.shards,
            settings.shard_lease_seconds,
            busy=lambda shards: scheduler.busy(_in_shards(shards, settings.shards)),
            follow=informer.follow,
        )
        scheduler.owns = janitor.owns = keeper.owns
        scheduler.holds = keeper.holds
    return OperatorState(
        reconciler, settings, janitor, informer, scheduler, readiness, shards=keeper
    )


def _in_shards(shards: frozenset[int], count: int) -> Callable[[str, str], bool]:
    return lambda namespace, name: shard_of(namespace, name, count) in shards


def _state(memo: Any) -> OperatorState:
    state: OperatorState = memo.state
    return state


class _NoDiffBase(kopf.DiffBaseStorage):
    """Keep no copy of the spec in an annotation: no handler here reacts to spec diffs (every
    pass reads the whole run), and a copy would double the object's size.
    Nor build one on every event: kopf's own builder deep-copies the whole run (status
    included) to throw most of it away, a cost that grows with the run."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _in_kopf_module(
    module: str, name: str, used: str, replacement: Callable[[Any], Any], missing: str
) -> Callable[[], None]:
    """Give the name ``name`` of kopf's module ``kopf._cogs.clients.<module>`` the value
    ``replacement(original)``; returns the function that undoes it. If kopf no longer has
    that name, or its value lacks the attribute ``used`` (what kopf calls on it), nothing is
    changed and the log says ``missing``."""
    try:
        found = importlib.import_module(f"kopf._cogs.clients.{module}")
        kopf_names = vars(found)
        original = kopf_names[name]
        getattr(original, used)
    except (ImportError, KeyError, AttributeError):
        log.warning(missing)
        return lambda: None
    kopf_names[name] = replacement(original)

    def undo() -> None:
        kopf_names[name] = original

    return undo


class _Aiohttp:
    """aiohttp, as kopf's client module sees it, but for the connector's sockets."""

    def __init__(self, aiohttp: Any) -> None:
        self._aiohttp = aiohttp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aiohttp, name)

    def TCPConnector(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("socket_factory", dead_peer_socket)
        return self._aiohttp.TCPConnector(*args, **kwargs)


def _kopf_detects_dead_peers() -> Callable[[], None]:
    """Give kopf's connections to the API server the operator's own dead-peer socket options
    (:func:`agentrun.kubeapi.dead_peer_options`); returns the function that undoes it.

    kopf's watch of runs reads a stream the API server writes: cut off from the API server
    (packets dropped, no reset), the operator's side sends nothing, so without keepalive the
    watch would wait on a connection nobody answers until one of its timeouts (see
    :func:`configure`) and deliver nothing meanwhile. With the options the connection fails
    within about half a minute, whatever it was doing; kopf watches again from the version
    it had (and, if that version has left the API server's history by then, gets 410 Gone
    and lists again). kopf makes its aiohttp connector in one place; the operator hands that
    place a connector with a socket factory. If kopf no longer has it, the log says so and
    kopf keeps aiohttp's default sockets."""
    return _in_kopf_module(
        "auth",
        "aiohttp",
        "TCPConnector",
        _Aiohttp,
        "this kopf makes its connections elsewhere than expected; its watch of runs may "
        "wait up to its server timeout on a connection the API server no longer answers",
    )


class _Json:
    """json, as kopf's client module sees it, but for ``loads``: ``decoder``'s."""

    def __init__(self, decoder: RunEvents) -> None:
        self.loads = decoder.loads

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def _kopf_reuses_held_runs(bodies: RunBodies) -> Callable[[], None]:
    """Have kopf decode its watch lines with :class:`agentrun.loop.run_events.RunEvents`
    (the event of a run held at its version is decoded only as far as its metadata); returns
    the function that undoes it. kopf decodes each line of a watch with ``json.loads`` in its
    client module; the operator hands that module a ``json`` whose ``loads`` is the
    decoder's. If kopf no longer decodes there, the log says so and kopf decodes every event
    whole, as before."""
    decoder = RunEvents(bodies.get)
    return _in_kopf_module(
        "api",
        "json",
        "loads",
        lambda _: _Json(decoder),
        "this kopf decodes its watch events elsewhere than expected; it decodes every "
        "event of a run whole, the operator's own writes' included",
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = s.DAEMON_FINALIZER  # with peering: see the docstring
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=s.ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = _NoDiffBase()
    settings.posting.level = logging.WARNING
    # kopf's watch of runs is bounded as the operator's own watches are
    # (agentrun.kubeapi.WATCH_SECONDS): the server sends a bookmark about once a minute and
    # ends each watch after WATCH_SECONDS, so a watch that has heard nothing, not even a
    # bookmark, for 75 s is on a connection that stalled (accepted, never answered: keepalive
    # does not find that out) and is given up and made again (inactivity_timeout, reset by
    # every line); client_timeout bounds the whole request a grace past the server's end.
    settings.watching.server_timeout = WATCH_SECONDS
    settings.watching.client_timeout = WATCH_SECONDS + WATCH_GRACE_SECONDS
    settings.watching.inactivity_timeout = WATCH_SILENCE_SECONDS
    # A connection to an API server that cannot be reached is given up after 10 s and tried
    # again (kopf waits five minutes by default), so that kopf's watch of runs is back soon
    # after a partition heals; any other request of kopf's is given up after about a minute.
    settings.networking.connect_timeout = CONNECT_SECONDS
    settings.watching.connect_timeout = CONNECT_SECONDS
    settings.networking.request_timeout = KOPF_REQUEST_SECONDS
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
    state.scheduler.start()
    state.informer.start()
    state.scheduler.spawn(state.scheduler.watches_listed())
    keeper = state.shards
    if keeper is not None:
        loop = asyncio.get_running_loop()
        scheduler, count = state.scheduler, state.settings.shards

        def changed(gained: frozenset[int], lost: frozenset[int]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(
                    scheduler.shards_changed, _in_shards(gained, count), _in_shards(lost, count)
                )

        keeper.on_change = changed
        keeper.start()


@kopf.on.cleanup()
async def stop_watching(memo: kopf.Memo, **_: Any) -> None:
    state = _state(memo)
    state.scheduler.cancel_timers()
    await state.scheduler.stop_all(STOP_TIMEOUT_SECONDS)
    if state.shards is not None:  # after the passes in flight: the others take over now
        await asyncio.to_thread(state.shards.stop)
    await asyncio.to_thread(state.informer.stop)


STOP_TIMEOUT_SECONDS = 30.0
"""How long stopping waits for the passes in flight (as kopf waits for its daemons)."""


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


async def drive_run(
    name: str, namespace: str | None, stopped: kopf.DaemonStopped, memo: Any, **_: Any
) -> None:
    """Reconcile one run until it is finished (then timers take over) or deleted: the kopf
    daemon of a run, with peering only (see the module docstring)."""
    assert namespace is not None, "AgentRuns are namespaced"
    await _state(memo).scheduler.drive(namespace, name, stopped)


def _drive_with_daemons() -> None:
    kopf.daemon(
        m.GROUP,
        m.VERSION,
        m.PLURAL,
        when=_unfinished,
        cancellation_backoff=5.0,
        cancellation_timeout=30.0,
    )(drive_run)


async def run_changed(
    body: kopf.Body,
    memo: Any,
    type: str | None = None,
    **_: Any,
) -> None:
    """An event of kopf's watch of runs (not sharded: every run)."""
    state = _state(memo)
    run_event(state.scheduler, state.reconciler.bodies, type, body)


def _watch_runs_with_kopf() -> None:
    kopf.on.event(m.GROUP, m.VERSION, m.PLURAL)(run_changed)


def run_operator(
    settings: s.Settings,
    *,
    liveness_host: str = "0.0.0.0",
    checkpoint: Checkpoint | None = None,
) -> None:
    """Run the operator in the foreground until SIGINT or SIGTERM. ``checkpoint`` is called
    at the reconciler's named checkpoints (fault injection in tests; none in production)."""
    state = make_state(settings, checkpoint)
    if not settings.shards:  # with shards the operator watches its shards' runs itself
        _watch_runs_with_kopf()
    if not state.scheduler.own_drivers:
        _drive_with_daemons()
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
    unwatch = watch_kopf_listings(state.readiness) if not settings.shards else lambda: None
    undo_sockets = _kopf_detects_dead_peers()
    undo_decoding = (
        _kopf_reuses_held_runs(state.reconciler.bodies)
        if state.reconciler.bodies is not None and not settings.shards
        else lambda: None
    )
    tracing.install(settings)
    memory.freeze_startup()
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
        undo_decoding()
        undo_sockets()
        unwatch()
        if endpoints is not None:
            endpoints.stop()
