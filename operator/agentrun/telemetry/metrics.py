"""Prometheus metrics of the operator (prometheus-client, on its default registry).

Served with /readyz by :mod:`agentrun.telemetry.endpoints`; docs/observability.md lists every
metric.
Labels stay few and bounded: never a run's or a step's name; a namespace only on
``agentrun_tokens_total``.

Where the numbers come from:

* ``agentrun_runs`` (by phase): the runs kopf's watch delivers (:data:`RUNS`, fed by the
  handlers), counted when scraped;
* step attempts, retries, approval waits, step durations and tokens: what each pass
  *committed* (:mod:`agentrun.telemetry.changes` compares the status read with the status written),
  so
  a pass that meets a conflict and re-derives counts once;
* reconcile pass durations: timed around each pass by the handlers;
* status conflicts: counted by the ledger on each 409;
* API requests: every request of the operator's kubernetes client, counted where the client
  sends it (:func:`count_requests`, installed where the client is built). kopf's own requests
  (its watch of runs, its finalizer and annotation patches) go through kopf's HTTP client and
  are not counted.

Nothing here sends a request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentrun.api import models as m

if TYPE_CHECKING:
    from agentrun.telemetry.facts import Changes

STEP_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
APPROVAL_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 7200, 21600, 86400, 259200, 604800)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

ATTEMPTS_STARTED = Counter(
    "agentrun_step_attempts_started", "Step attempts launched (intents committed)."
)
ATTEMPTS_SUCCEEDED = Counter("agentrun_step_attempts_succeeded", "Step attempts that succeeded.")
ATTEMPTS_FAILED = Counter(
    "agentrun_step_attempts_failed",
    "Step attempts that failed, whether retried or not (agentrun_step_retries_total counts "
    "those followed by a retry).",
)
ATTEMPTS_CANCELLED = Counter(
    "agentrun_step_attempts_cancelled",
    "Step attempts stopped before they finished: the run ended (cancelled, failed, over "
    "budget) or the step left the plan or changed before its Job was created.",
)
RETRIES = Counter(
    "agentrun_step_retries", "Failed step attempts after which a retry was scheduled."
)
STEP_SECONDS = Histogram(
    "agentrun_step_attempt_duration_seconds",
    "Seconds from a step attempt's launch to its end, by outcome.",
    ["outcome"],
    buckets=STEP_BUCKETS,
)
APPROVAL_WAIT = Histogram(
    "agentrun_approval_wait_seconds",
    "Seconds a step waited in WaitingForApproval until the pass that committed the decision, "
    "by decision (approved, rejected, expired).",
    ["decision"],
    buckets=APPROVAL_BUCKETS,
)
PASS_SECONDS = Histogram(
    "agentrun_reconcile_duration_seconds",
    "Seconds of one reconcile pass of one run (re-derivations after conflicts included).",
    buckets=PASS_BUCKETS,
)
PASS_WAIT_SECONDS = Histogram(
    "agentrun_reconcile_wait_seconds",
    "Seconds a due reconcile pass waited for a worker (AGENTRUN_WORKERS) before it began.",
    buckets=PASS_BUCKETS,
)
STATUS_CONFLICTS = Counter(
    "agentrun_status_conflicts",
    "Status writes refused with 409 Conflict (the run moved on; the pass re-derives).",
)
API_REQUESTS = Counter(
    "agentrun_api_requests",
    "Requests of the operator's Kubernetes client, by verb, resource[/subresource] and HTTP "
    "status code ('error': no response).",
    ["verb", "resource", "code"],
)
THROTTLED_PASSES = Counter(
    "agentrun_throttled_passes",
    "Reconcile passes cut short by 429 Too Many Requests (API Priority and Fairness shedding "
    "load); each is tried again after the wait its Retry-After asks.",
)
THROTTLED_SWEEPS = Counter(
    "agentrun_throttled_sweeps",
    "Janitor sweeps cut short by 429 Too Many Requests; each is tried again after its period, "
    "or the wait its Retry-After asks if longer.",
)
API_RETRIES = Counter(
    "agentrun_api_retries",
    "Requests to the API server (or what they were part of: a pass, a sweep, a watch) tried "
    "again because the server did not answer (unreachable), said it cannot serve now "
    "(unavailable: 502, 503, 504) or asked for a wait (throttled: 429), by who tried again "
    "(pass, deletion, check, janitor, watch, shards, client: the kubernetes client's own "
    "retry, kopf: kopf's retry of its own requests) and reason. Each is one warning line in "
    "the log, never a traceback.",
    ["by", "reason"],
)
SHARDS_OWNED = Gauge(
    "agentrun_shards_owned",
    "Shards whose runs this replica decides now (with AGENTRUN_SHARDS; 0 otherwise): it holds "
    "their Leases, renewed in time, and is not giving them back.",
)
SHARD_CHANGES = Counter(
    "agentrun_shard_changes",
    "Shards this replica began (gained) or stopped (lost) deciding: taken or given back at a "
    "rebalance, taken from a replica that stopped renewing, or lapsed while its own renewals "
    "failed.",
    ["change"],
)
WATCH_RELISTS = Counter(
    "agentrun_watch_relists",
    "Lists of a watched resource after its first one in a namespace: its watch had to list "
    "again (its version too old, 410 Gone, or a request failed), by resource (agentruns: "
    "kopf's watch of runs; jobs, pods, events: the operator's own).",
    ["resource"],
)
RUN_EVENTS = Counter(
    "agentrun_run_events",
    "Events of the watch of runs (kopf's, or with shards the operator's own), by how they were "
    "decoded: metadata (a MODIFIED event of a run held at that version already, as this "
    "process wrote or read it; with shards also a run of a shard not followed here, and a "
    "DELETED: the rest of the event is not decoded) or whole (but for the run's managedFields, "
    "never decoded).",
    ["decoded"],
)
TOKENS = Counter(
    "agentrun_tokens",
    "Tokens reported by step attempts (model turns, steps that report usage), by the run's "
    "namespace.",
    ["namespace"],
)


def record(namespace: str, changes: Changes) -> None:
    """Count what one committed pass of a run in ``namespace`` changed."""
    if changes.attempts_started:
        ATTEMPTS_STARTED.inc(changes.attempts_started)
    for ended in changes.attempts_ended:
        {
            "succeeded": ATTEMPTS_SUCCEEDED,
            "failed": ATTEMPTS_FAILED,
            "cancelled": ATTEMPTS_CANCELLED,
        }[ended.outcome].inc()
        if ended.retried:
            RETRIES.inc()
        duration = ended.duration_seconds
        if duration is not None:
            STEP_SECONDS.labels(ended.outcome).observe(duration)
    for approval in changes.approvals:
        wait = approval.wait_seconds
        if wait is not None:
            APPROVAL_WAIT.labels(approval.decision).observe(wait)
    if changes.tokens:
        TOKENS.labels(namespace).inc(changes.tokens)


@contextmanager
def reconcile_pass() -> Iterator[None]:
    """Time one reconcile pass (``with metrics.reconcile_pass(): ...``)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        PASS_SECONDS.observe(time.perf_counter() - began)


def pass_began(due: float) -> None:
    """A worker begins a pass handed to the workers at ``due`` (``time.perf_counter()``)."""
    PASS_WAIT_SECONDS.observe(max(time.perf_counter() - due, 0.0))


# -- runs by phase ------------------------------------------------------------------------------


class RunPhases:
    """The phase of every run the operator's watch has delivered, counted when scraped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}

    def seen(self, namespace: str, name: str, phase: str | None) -> None:
        """A run was listed or changed; a run without a phase yet counts as Pending."""
        with self._lock:
            self._phases[(namespace, name)] = phase or str(m.RunPhase.PENDING)

    def gone(self, namespace: str, name: str) -> None:
        with self._lock:
            self._phases.pop((namespace, name), None)

    def counts(self) -> dict[str, int]:
        """Runs by phase; every phase of the API is present, zero or not."""
        counted = {str(phase): 0 for phase in m.RunPhase}
        with self._lock:
            for phase in self._phases.values():
                counted[phase] = counted.get(phase, 0) + 1
        return counted


class _RunPhaseCollector(Collector):
    def __init__(self, phases: RunPhases) -> None:
        self.phases = phases

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily(
            "agentrun_runs",
            "AgentRuns the operator watches, by phase (with shards: those of the shards this "
            "replica follows; the replicas' figures add up to every run).",
            labels=["phase"],
        )
        for phase, count in sorted(self.phases.counts().items()):
            gauge.add_metric([phase], count)
        yield gauge


RUNS = RunPhases()
REGISTRY.register(_RunPhaseCollector(RUNS))


# -- API requests ---------------------------------------------------------------------------------

NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def request_info(method: str, url: str) -> tuple[str, str]:
    """The Kubernetes verb and resource (``resource`` or ``resource/subresource``) of a request,
    as the API server names them (list, watch, get, create, update, patch, delete,
    deletecollection). A path outside /api and /apis has resource ``""``."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if segments[:1] == ["api"] and len(segments) >= 2:
        rest = segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 3:
        rest = segments[3:]
    else:
        return method.lower(), ""
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in NAMESPACE_SUBRESOURCES:
        rest = rest[2:]  # namespaces/{namespace}/{resource}/...
    if not rest:
        return method.lower(), ""
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    method = method.upper()
    if method == "GET":
        watch = parse_qs(parts.query).get("watch", [""])[0].lower() in ("true", "1")
        verb = "watch" if watch else "get" if named else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    return verb, resource


def count_requests(api_client: Any) -> Any:
    """Count every request ``api_client`` (a ``kubernetes.client.ApiClient``) sends, by
    wrapping the one method all of them pass through (``call_api``); returns the client."""
    send: Callable[..., Any] = api_client.call_api
    if getattr(send, "_agentrun_counted", False):
        return api_client

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb, resource = request_info(method, url)
        code = "error"
        try:
            response = send(method, url, *args, **kwargs)
            code = str(getattr(response, "status", "") or "error")
            return response
        except Exception as error:
            status = getattr(error, "status", None)
            code = str(status) if status else "error"
            raise
        finally:
            API_REQUESTS.labels(verb, resource, code).inc()

    counted._agentrun_counted = True  # type: ignore[attr-defined]
    api_client.call_api = counted
    return api_client
