"""The operator's HTTP endpoints beside kopf's liveness endpoint (/healthz): ``/metrics``
(Prometheus' text format, :mod:`agentrun.telemetry.metrics`) and ``/readyz``, on one port
(``AGENTRUN_METRICS_PORT``), served from a thread of their own so that a busy event loop
never delays a scrape.

``/readyz`` answers 200 once the operator's watches have listed what they watch, and 503
before, with a JSON body naming what it still waits for:

* kopf's watch of AgentRuns, in each watched namespace (or cluster-wide): kopf lists the runs
  and then watches from the list's resourceVersion; the end of that listing is marked only
  inside kopf's watch stream (``kopf._cogs.clients.watching``, a ``Bookmark.LISTED`` in the
  stream of events). :func:`watch_kopf_listings` wraps that stream, the one place kopf says
  it, and passes every event on unchanged;
* the operator's own watches of step Jobs, their pods and pod refusals
  (:mod:`agentrun.observation.watches`), once each has completed its first list.

Once everything has listed, ``/readyz`` goes on answering 503 while a watch is dead, naming it:
one of the operator's own watches whose last request failed (until one is answered again) or
that has heard nothing for :data:`~agentrun.kubeapi.WATCH_SILENCE_SECONDS`, and kopf's watch of
runs in a namespace when it has heard nothing for as long: no event, no bookmark, and no end of
a watch request (the server ends each after :data:`agentrun.kubeapi.WATCH_SECONDS`, so a watch
that works hears at least that often; :func:`watch_kopf_listings` also sees those ends). So a
partition from the API server, or a path to it that accepts connections and answers nothing,
shows as not ready within that time (75 s), and ready again once the watches are answered; the
operator itself needs no restart (its liveness endpoint is kopf's and stays up), and it goes on
working from what it has seen meanwhile.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing
from socketserver import ThreadingMixIn
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app

from agentrun.api import models as m
from agentrun.kubeapi import WATCH_SILENCE_SECONDS
from agentrun.telemetry import metrics

log = logging.getLogger("agentrun.endpoints")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Readiness:
    """What the operator waits for before it is ready; thread-safe."""

    def __init__(
        self,
        namespaces: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._runs_unlisted: set[str | None] = set(namespaces) if namespaces else {None}
        self._informer_listed = False
        self._clock = clock
        self._runs_heard: dict[str | None, float] = {}
        """When kopf's watch of runs in each namespace last delivered something."""
        self._troubles: Callable[[], list[str]] = list
        """What is wrong with the operator's own watches now."""

    def watch_troubles(self, troubles: Callable[[], list[str]]) -> None:
        """Ask ``troubles`` what is wrong with the operator's own watches at each question
        (:meth:`agentrun.observation.watches.Informer.troubles`)."""
        self._troubles = troubles

    def runs_heard(self, namespace: str | None) -> None:
        """kopf's watch of AgentRuns in ``namespace`` delivered an event or a bookmark."""
        now = self._clock()
        with self._lock:
            self._runs_heard[namespace] = now

    def runs_listed(self, namespace: str | None) -> None:
        """kopf's watch of AgentRuns in ``namespace`` (None: cluster-wide) has listed them."""
        now = self._clock()
        with self._lock:
            self._runs_unlisted.discard(namespace)
            self._runs_heard[namespace] = now

    def runs_listed_here(self, namespace: str | None) -> None:
        """The operator's own watch of AgentRuns in ``namespace`` (with shards: those not yet
        labelled with one) has listed them; whether it still hears is one of its own
        watches' troubles (:meth:`watch_troubles`)."""
        with self._lock:
            self._runs_unlisted.discard(namespace)

    def runs_listed_everywhere(self) -> None:
        with self._lock:
            self._runs_unlisted.clear()

    def informer_listed(self) -> None:
        """The watches of step Jobs, pods and pod refusals have all listed once."""
        with self._lock:
            self._informer_listed = True

    def waiting_for(self) -> list[str]:
        """What is not listed yet, or listed but dead now; empty when ready."""
        now = self._clock()
        with self._lock:
            waiting = [_runs_watch(ns) for ns in sorted(self._runs_unlisted, key=lambda n: n or "")]
            waiting += [
                f"{_runs_watch(ns)}: nothing heard for {now - heard:.0f}s"
                for ns, heard in sorted(self._runs_heard.items(), key=lambda i: i[0] or "")
                if now - heard > WATCH_SILENCE_SECONDS
            ]
            listed = self._informer_listed
        if not listed:
            waiting.append("the watches of step Jobs, their pods and pod refusals")
        else:
            waiting += self._troubles()
        return waiting

    def ready(self) -> bool:
        return not self.waiting_for()


def _runs_watch(namespace: str | None) -> str:
    if namespace is None:
        return "kopf's watch of AgentRuns (all namespaces)"
    return f"kopf's watch of AgentRuns in namespace {namespace}"


def runs_watched(url: str) -> tuple[bool, str | None]:
    """Whether ``url`` (a path and query, as kopf streams it) is a watch of AgentRuns, and in
    which namespace (None: all)."""
    parts = urlsplit(url)
    watch = parse_qs(parts.query).get("watch", [""])[-1].lower() in ("true", "1")
    segments = [s for s in parts.path.split("/") if s]
    if not watch or segments[:3] != ["apis", m.GROUP, m.VERSION] or segments[-1:] != [m.PLURAL]:
        return False, None
    scope = segments[3:-1]
    if len(scope) == 2 and scope[0] == "namespaces":
        return True, scope[1]
    return not scope, None


def _kopf_stream_ends(readiness: Readiness) -> Callable[[], None]:
    """Tell ``readiness`` each time one of kopf's watch requests of AgentRuns ends as the API
    server ends it (the stream closed in order: no error, no timeout of kopf's); returns the
    function that undoes it. kopf streams every watch through ``api.stream`` in its client
    module; if it no longer does, the log says so and only events count as heard."""
    try:
        from kopf._cogs.clients import api

        original = api.stream
    except (ImportError, AttributeError):
        log.warning(
            "this kopf streams its watches elsewhere than expected; /readyz may name a quiet "
            "namespace's watch of runs as dead"
        )
        return lambda: None

    async def stream(url: str, **kwargs: Any) -> AsyncIterator[Any]:
        runs, namespace = runs_watched(url)
        lines = cast(AsyncGenerator[Any, None], original(url, **kwargs))
        async with aclosing(lines) as each:
            async for line in each:
                yield line
        if runs:  # an error or a timeout would have been raised
            readiness.runs_heard(namespace)

    api.stream = stream

    def undo() -> None:
        api.stream = original

    return undo


def watch_kopf_listings(readiness: Readiness) -> Callable[[], None]:
    """Tell ``readiness`` when kopf's watch of AgentRuns has listed them, and each time it
    delivers something or a watch request of it ends in order (see the module docstring);
    returns the function that undoes it. If kopf no longer has the stream this relies on,
    readiness says so in the log and counts kopf's watch as listed at once."""
    try:
        from kopf._cogs.clients import watching

        original = watching.infinite_watch
        listed = watching.Bookmark.LISTED
    except (ImportError, AttributeError):
        log.warning(
            "this kopf does not mark the end of its listing where expected; /readyz reports "
            "the operator's own watches only"
        )
        readiness.runs_listed_everywhere()
        return lambda: None
    undo_ends = _kopf_stream_ends(readiness)

    async def infinite_watch(*, resource: Any, namespace: Any, **kwargs: Any) -> AsyncIterator[Any]:
        runs = getattr(resource, "group", None) == m.GROUP and (
            getattr(resource, "plural", None) == m.PLURAL
        )
        events = cast(
            AsyncGenerator[Any, None],
            original(resource=resource, namespace=namespace, **kwargs),
        )
        lists = 0
        async with aclosing(events) as stream:
            async for event in stream:
                if runs:
                    if event is listed:
                        readiness.runs_listed(namespace)
                        if lists:
                            metrics.WATCH_RELISTS.labels(m.PLURAL).inc()
                        lists += 1
                    else:
                        readiness.runs_heard(namespace)
                yield event

    watching.infinite_watch = infinite_watch

    def undo() -> None:
        watching.infinite_watch = original
        undo_ends()

    return undo


# -- the server -----------------------------------------------------------------------------------


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds
        return None


def application(readiness: Readiness) -> WSGIApp:
    """The WSGI application of /metrics and /readyz."""
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/readyz":
            waiting = readiness.waiting_for()
            body = json.dumps({"ready": not waiting, "waitingFor": waiting}).encode() + b"\n"
            status = "200 OK" if not waiting else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [body]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: the operator serves /metrics and /readyz here\n"]

    return app


class Endpoints:
    """/metrics and /readyz on ``host:port``, served by a daemon thread."""

    def __init__(self, host: str, port: int, readiness: Readiness) -> None:
        server_class = _Server6 if ":" in host else _Server
        self.server = make_server(
            host, port, application(readiness), server_class, handler_class=_QuietHandler
        )
        self.port: int = self.server.server_port
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="metrics-endpoint", daemon=True
        )

    def start(self) -> Endpoints:
        self.thread.start()
        log.info("serving /metrics and /readyz on port %d", self.port)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
