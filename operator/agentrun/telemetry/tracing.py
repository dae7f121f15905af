"""OpenTelemetry traces of runs and step attempts: optional, and off unless configured.

Tracing is on when the standard OpenTelemetry variables ask for an OTLP export
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; see
``Settings.tracing``) and the ``otel`` extra is installed (``agentrun-operator[otel]``:
opentelemetry-sdk and the OTLP/HTTP exporter). Otherwise :func:`record` returns at once and
nothing of OpenTelemetry is imported.

Spans are made from what a pass commits (:mod:`agentrun.telemetry.changes`), after the fact, with
the
start and end times the committed status records, so no span is held open between passes:

* ``agentrun.step_attempt``: one per step attempt, emitted by the pass that commits its end;
* ``agentrun.approval``: one per decision on a step waiting for approval, from the step
  entering WaitingForApproval to the pass that commits the decision;
* ``agentrun.run``: one per run, emitted by the pass that commits its end.

Each run is one trace. Its trace id and its run span's id are derived from the run's uid, so
the attempt and approval spans emitted earlier, by this operator process or a previous one,
are children of the run span emitted last. Span ids of attempts and approvals are derived
too: a pass repeated after a crash re-emits the same span, not another one.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agentrun.api import models as m

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    from agentrun.settings import Settings
    from agentrun.telemetry.facts import Changes

log = logging.getLogger("agentrun.tracing")

SERVICE_NAME = "agentrun-operator"
RUN_SPAN = "agentrun.run"
ATTEMPT_SPAN = "agentrun.step_attempt"
APPROVAL_SPAN = "agentrun.approval"

_tracer: _RunTracer | None = None


def install(settings: Settings) -> bool:
    """Export spans over OTLP/HTTP if ``settings`` ask for it and OpenTelemetry is installed;
    whether tracing is now on."""
    if not settings.tracing:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "tracing is configured (OTEL_EXPORTER_OTLP_ENDPOINT) but OpenTelemetry is not "
            "installed: install agentrun-operator[otel]; no spans are exported"
        )
        return False
    start(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("exporting traces of runs and step attempts over OTLP")
    return True


def start(processor: SpanProcessor) -> TracerProvider:
    """Make spans from now on and hand them to ``processor`` (tests pass an in-memory one)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    global _tracer
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": SERVICE_NAME})
    provider = TracerProvider(resource=resource, id_generator=_run_ids())
    provider.add_span_processor(processor)
    _tracer = _RunTracer(provider)
    return provider


def shutdown() -> None:
    """Flush the spans not exported yet and stop tracing."""
    global _tracer
    tracer, _tracer = _tracer, None
    if tracer is not None:
        tracer.provider.shutdown()


def enabled() -> bool:
    return _tracer is not None


def record(run: m.AgentRun, changes: Changes) -> None:
    """Emit the spans of what one pass committed (nothing when tracing is off)."""
    if _tracer is not None:
        _tracer.record(run, changes)


# -- ids --------------------------------------------------------------------------------------


def _derived(*parts: str, bits: int) -> int:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[: bits // 8], "big") or 1


def trace_id_of(run_uid: str) -> int:
    """The trace id of a run (128 bits, from its uid)."""
    return _derived("agentrun-trace", run_uid, bits=128)


def run_span_id_of(run_uid: str) -> int:
    """The span id of a run's span (64 bits, from its uid)."""
    return _derived("agentrun-run", run_uid, bits=64)


_chosen: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "agentrun_span_ids", default=None
)


@contextmanager
def _ids(trace_id: int, span_id: int) -> Iterator[None]:
    """The next span started here gets these ids (the trace id only when it has no parent)."""
    token = _chosen.set((trace_id, span_id))
    try:
        yield
    finally:
        _chosen.reset(token)


def _run_ids() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        """Random ids, except where :func:`_ids` chose them."""

        def generate_span_id(self) -> int:
            chosen = _chosen.get()
            return chosen[1] if chosen is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            chosen = _chosen.get()
            return chosen[0] if chosen is not None else super().generate_trace_id()

    return RunIds()


def _ns(at: datetime) -> int:
    return round(at.timestamp() * 1_000_000) * 1000


# -- spans ------------------------------------------------------------------------------------


class _RunTracer:
    def __init__(self, provider: TracerProvider) -> None:
        from agentrun import __version__

        self.provider = provider
        self.tracer = provider.get_tracer("agentrun", __version__)

    def record(self, run: m.AgentRun, changes: Changes) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        uid = run.metadata.uid
        trace_id = trace_id_of(uid)
        parent = trace.set_span_in_context(
            NonRecordingSpan(
                SpanContext(
                    trace_id,
                    run_span_id_of(uid),
                    is_remote=True,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED),
                )
            )
        )
        base = {
            "agentrun.run.namespace": run.metadata.namespace,
            "agentrun.run.name": run.metadata.name,
            "agentrun.run.uid": uid,
        }
        for approval in changes.approvals:
            attributes: dict[str, Any] = {
                **base,
                "agentrun.step": approval.step,
                "agentrun.decision": approval.decision,
            }
            if approval.wait_seconds is not None:
                attributes["agentrun.approval_wait_seconds"] = approval.wait_seconds
            if approval.by:
                attributes["agentrun.decided_by"] = approval.by
            at = approval.requested_at or approval.decided_at
            self._span(
                APPROVAL_SPAN,
                (trace_id, _derived("approval", uid, approval.step, at.isoformat(), bits=64)),
                parent,
                at,
                approval.decided_at,
                attributes,
                error=None,
            )
        for ended in changes.attempts_ended:
            attributes = {
                **base,
                "agentrun.step": ended.step,
                "agentrun.attempt": ended.attempt,
                "agentrun.outcome": ended.outcome,
                "agentrun.reason": ended.reason,
                "agentrun.retried": ended.retried,
                "agentrun.tokens": ended.tokens,
            }
            if ended.approval_wait_seconds is not None:
                attributes["agentrun.approval_wait_seconds"] = ended.approval_wait_seconds
            self._span(
                ATTEMPT_SPAN,
                (trace_id, _derived("attempt", uid, ended.step, str(ended.attempt), bits=64)),
                parent,
                ended.started_at or ended.ended_at,
                ended.ended_at,
                attributes,
                error=ended.reason if ended.outcome == "failed" else None,
            )
        end = changes.run_ended
        if end is not None:
            completed = end.completed_at or datetime.now(UTC)
            self._span(
                RUN_SPAN,
                (trace_id, run_span_id_of(uid)),
                None,
                end.started_at or completed,
                completed,
                {
                    **base,
                    "agentrun.outcome": end.phase,
                    "agentrun.reason": end.reason,
                    "agentrun.tokens": end.tokens,
                    "agentrun.attempts": end.attempts,
                    "agentrun.steps": end.steps,
                },
                error=end.reason if end.phase == m.RunPhase.FAILED else None,
                ok=end.phase == m.RunPhase.SUCCEEDED,
            )

    def _span(
        self,
        name: str,
        ids: tuple[int, int],
        parent: Any,
        start: datetime,
        end: datetime,
        attributes: dict[str, Any],
        *,
        error: str | None,
        ok: bool = False,
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        with _ids(*ids):
            span = self.tracer.start_span(
                name, context=parent, start_time=_ns(start), attributes=attributes
            )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        elif ok:
            span.set_status(Status(StatusCode.OK))
        span.end(end_time=_ns(max(end, start)))
