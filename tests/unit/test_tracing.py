"""Traces of runs and step attempts, made from what passes commit (the real core), caught by the
OpenTelemetry SDK's in-memory exporter; and tracing staying off unless configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agentrun.api import models as m
from agentrun.settings import Settings, _tracing_configured
from agentrun.telemetry import tracing
from agentrun.telemetry.changes import Changes
from tests.support.recorded import Recorded
from tests.support.sim import T0, UID, Sim, make_run, step


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.start(SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        tracing.shutdown()


def traced(rec: Recorded) -> None:
    for changes in rec.changes:
        tracing.record(rec.sim.run, changes)


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_a_run_is_one_trace_with_a_span_per_attempt_under_the_run_span(
    exporter: InMemorySpanExporter,
) -> None:
    retry = {"limit": 1, "backoff": {"initialSeconds": 10}}
    rec = Recorded(Sim(make_run([step("a", retry=retry), step("b", "a")])))
    failures = iter([True])
    envelope = json.dumps({"ok": True, "summary": "s", "usage": {"tokens": 64}})
    rec.run_to_end(
        lambda job: (False, "boom") if next(failures, False) else (True, envelope),
        step_seconds=4,
    )
    traced(rec)
    spans = exporter.get_finished_spans()
    (run,) = by_name(spans, tracing.RUN_SPAN)
    attempts = by_name(spans, tracing.ATTEMPT_SPAN)
    assert run.context is not None and run.parent is None
    assert run.context.trace_id == tracing.trace_id_of(UID)
    assert run.context.span_id == tracing.run_span_id_of(UID)
    assert run.attributes is not None
    assert run.attributes["agentrun.outcome"] == "Succeeded"
    assert run.attributes["agentrun.tokens"] == 128
    assert run.attributes["agentrun.attempts"] == 3
    assert run.attributes["agentrun.run.name"] == "demo"
    assert run.status.status_code == StatusCode.OK
    assert run.start_time == tracing._ns(T0) and run.end_time == tracing._ns(rec.sim.now)

    summary = [
        (
            s.attributes["agentrun.step"],
            s.attributes["agentrun.attempt"],
            s.attributes["agentrun.outcome"],
            s.attributes["agentrun.tokens"],
        )
        for s in attempts
        if s.attributes is not None
    ]
    assert summary == [("a", 1, "failed", 0), ("a", 2, "succeeded", 64), ("b", 1, "succeeded", 64)]
    for span in attempts:
        assert span.parent is not None and span.parent.span_id == run.context.span_id
        assert span.context is not None and span.context.trace_id == run.context.trace_id
        assert span.end_time is not None and span.start_time is not None
        assert span.end_time - span.start_time == 4 * 10**9
    assert attempts[0].status.status_code == StatusCode.ERROR
    assert len({s.context.span_id for s in attempts if s.context is not None}) == 3


def test_an_approval_is_a_span_and_the_attempt_it_launched_carries_the_wait(
    exporter: InMemorySpanExporter,
) -> None:
    rec = Recorded(Sim(make_run([step("deploy", approval="required")])))
    rec.tick()
    rec.sim.advance(300)
    args_hash = rec.sim.step_status("deploy").args_hash or ""
    rec.sim.spec_update(
        approvals=[
            m.Approval(
                step="deploy", decision=m.ApprovalDecision.APPROVE, args_hash=args_hash, by="ann"
            )
        ]
    )
    rec.run_to_end(lambda job: (True, None))
    traced(rec)
    spans = exporter.get_finished_spans()
    (approval,) = by_name(spans, tracing.APPROVAL_SPAN)
    (attempt,) = by_name(spans, tracing.ATTEMPT_SPAN)
    assert approval.attributes is not None and attempt.attributes is not None
    assert approval.attributes["agentrun.decision"] == "approved"
    assert approval.attributes["agentrun.approval_wait_seconds"] == 300.0
    assert approval.attributes["agentrun.decided_by"] == "ann"
    assert attempt.attributes["agentrun.approval_wait_seconds"] == 300.0
    assert attempt.attributes["agentrun.attempt"] == 1


def test_the_same_commit_traced_again_makes_the_same_span_ids(
    exporter: InMemorySpanExporter,
) -> None:
    rec = Recorded(Sim(make_run([step("a")])))
    rec.run_to_end(lambda job: (True, None))
    traced(rec)
    traced(rec)  # e.g. a pass repeated by an operator restarted before it acted
    ids = [(s.name, s.context.span_id) for s in exporter.get_finished_spans() if s.context]
    assert len(ids) == 4 and len(set(ids)) == 2


def test_tracing_is_off_unless_configured() -> None:
    assert not tracing.enabled()
    run = make_run([step("a")])
    tracing.record(run, Changes(attempts_started=1))  # a no-op, not an error
    assert not tracing.install(Settings(tracing=False))
    assert not tracing.enabled()
    assert not _tracing_configured({})
    assert _tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert _tracing_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not _tracing_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    )
    assert not _tracing_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}
    )


def test_configured_tracing_installs_the_otlp_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    settings = Settings()
    assert settings.tracing
    assert tracing.install(settings)
    try:
        assert tracing.enabled()
        assert tracing._tracer is not None
        resource = tracing._tracer.provider.resource
        assert resource.attributes["service.name"] == "agentrun-operator"
    finally:
        tracing.shutdown()  # nothing was recorded: nothing to send
    assert not tracing.enabled()


def test_without_opentelemetry_configured_tracing_is_off_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    assert not tracing.install(Settings(tracing=True))
    assert not tracing.enabled()
    assert "install agentrun-operator[otel]" in caplog.text


def test_the_operator_imports_nothing_of_opentelemetry_while_tracing_is_off() -> None:
    code = (
        "import sys\n"
        "from agentrun.loop import handlers\nfrom agentrun.telemetry import changes, tracing\n"
        "from agentrun.settings import Settings\n"
        "assert not tracing.install(Settings(tracing=False))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
