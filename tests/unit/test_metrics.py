"""The Prometheus side: what a committed pass adds to the counters, the verb and resource of API
requests, runs by phase, and the /metrics and /readyz endpoints (a real HTTP server on a free
port; kopf's listing marker fed through the real wrapper)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun.api import models as m
from agentrun.kubeapi import WATCH_SILENCE_SECONDS as SILENT_SECONDS
from agentrun.telemetry import metrics
from agentrun.telemetry.changes import ApprovalDecided, AttemptEnded, Changes
from agentrun.telemetry.endpoints import (
    Endpoints,
    Readiness,
    runs_watched,
    watch_kopf_listings,
)
from tests.support.sim import T0


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_record_counts_what_a_pass_committed() -> None:
    names = [
        "agentrun_step_attempts_started_total",
        "agentrun_step_attempts_succeeded_total",
        "agentrun_step_attempts_failed_total",
        "agentrun_step_attempts_cancelled_total",
        "agentrun_step_retries_total",
    ]
    before = {n: sample(n) for n in names}
    tokens = sample("agentrun_tokens_total", namespace="team-x")
    waits = sample("agentrun_approval_wait_seconds_count", decision="approved")
    wait_sum = sample("agentrun_approval_wait_seconds_sum", decision="approved")
    failed_durations = sample("agentrun_step_attempt_duration_seconds_count", outcome="failed")

    def ended(outcome: str, retried: bool = False) -> AttemptEnded:
        return AttemptEnded("a", 1, outcome, retried, "r", T0, T0 + timedelta(seconds=4), 0, None)

    changes = Changes(
        attempts_started=3,
        attempts_ended=(ended("succeeded"), ended("failed", retried=True), ended("cancelled")),
        approvals=(ApprovalDecided("a", "approved", T0, T0 + timedelta(seconds=90), "ann"),),
        tokens=42,
    )
    metrics.record("team-x", changes)
    after = {n: sample(n) - before[n] for n in names}
    assert after == {
        "agentrun_step_attempts_started_total": 3,
        "agentrun_step_attempts_succeeded_total": 1,
        "agentrun_step_attempts_failed_total": 1,
        "agentrun_step_attempts_cancelled_total": 1,
        "agentrun_step_retries_total": 1,
    }
    assert sample("agentrun_tokens_total", namespace="team-x") - tokens == 42
    assert sample("agentrun_approval_wait_seconds_count", decision="approved") - waits == 1
    assert sample("agentrun_approval_wait_seconds_sum", decision="approved") - wait_sum == 90
    assert (
        sample("agentrun_step_attempt_duration_seconds_count", outcome="failed") - failed_durations
        == 1
    )


def test_a_reconcile_pass_is_timed() -> None:
    count = sample("agentrun_reconcile_duration_seconds_count")
    with metrics.reconcile_pass():
        pass
    with pytest.raises(RuntimeError), metrics.reconcile_pass():
        raise RuntimeError("a failed pass is timed too")
    assert sample("agentrun_reconcile_duration_seconds_count") - count == 2


def test_a_pass_handed_to_the_workers_counts_its_wait() -> None:
    waits = sample("agentrun_reconcile_wait_seconds_count")
    waited = sample("agentrun_reconcile_wait_seconds_sum")
    metrics.pass_began(time.perf_counter() - 0.25)
    metrics.pass_began(time.perf_counter() + 1)  # a clock read late counts no wait, not less
    assert sample("agentrun_reconcile_wait_seconds_count") - waits == 2
    assert 0.25 <= sample("agentrun_reconcile_wait_seconds_sum") - waited < 60


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", "https://h/apis/batch/v1/namespaces/ns/jobs?labelSelector=x", ("list", "jobs")),
        ("GET", "https://h/apis/batch/v1/namespaces/ns/jobs?watch=true&rv=1", ("watch", "jobs")),
        ("GET", "https://h/apis/batch/v1/jobs?watch=True", ("watch", "jobs")),
        ("GET", "https://h/apis/batch/v1/namespaces/ns/jobs/j", ("get", "jobs")),
        ("POST", "https://h/apis/batch/v1/namespaces/ns/jobs?dryRun=All", ("create", "jobs")),
        ("DELETE", "https://h/apis/batch/v1/namespaces/ns/jobs/j", ("delete", "jobs")),
        ("PATCH", "https://h/apis/batch/v1/namespaces/ns/jobs/j", ("patch", "jobs")),
        (
            "PUT",
            "https://h/apis/agentrun.dev/v1alpha1/namespaces/ns/agentruns/r/status",
            ("update", "agentruns/status"),
        ),
        (
            "DELETE",
            "https://h/api/v1/namespaces/ns/pods?labelSelector=x",
            ("deletecollection", "pods"),
        ),
        ("GET", "https://h/api/v1/namespaces/ns/configmaps/c", ("get", "configmaps")),
        ("POST", "https://h/apis/events.k8s.io/v1/namespaces/ns/events", ("create", "events")),
        (
            "POST",
            "https://h/apis/authorization.k8s.io/v1/subjectaccessreviews",
            ("create", "subjectaccessreviews"),
        ),
        ("GET", "https://h/api/v1/namespaces/ns", ("get", "namespaces")),
        ("PUT", "https://h/api/v1/namespaces/ns/finalize", ("update", "namespaces/finalize")),
        ("GET", "https://h/api/v1/namespaces", ("list", "namespaces")),
        ("GET", "https://h/version", ("get", "")),
        ("GET", "https://h/apis", ("get", "")),
    ],
)
def test_request_info_names_verb_and_resource(
    method: str, url: str, expected: tuple[str, str]
) -> None:
    assert metrics.request_info(method, url) == expected


class _Response:
    def __init__(self, status: int) -> None:
        self.status = status


class _Refused(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class _Client:
    """What count_requests needs of an ApiClient: the method every request goes through."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> _Response:
        self.sent.append((method, url))
        if url.endswith("/gone"):
            raise _Refused(404)
        if url.endswith("/down"):
            raise OSError("connection refused")
        return _Response(409 if method == "PUT" else 200)


def test_count_requests_counts_every_request_by_verb_resource_and_code() -> None:
    client = _Client()
    assert metrics.count_requests(client) is client
    metrics.count_requests(client)  # counting twice would count each request twice
    base = "https://h/apis/batch/v1/namespaces/ns/jobs"
    labels = {
        ("create", "200"): sample(
            "agentrun_api_requests_total", verb="create", resource="jobs", code="200"
        ),
        ("update", "409"): sample(
            "agentrun_api_requests_total", verb="update", resource="jobs", code="409"
        ),
        ("get", "404"): sample(
            "agentrun_api_requests_total", verb="get", resource="jobs", code="404"
        ),
        ("get", "error"): sample(
            "agentrun_api_requests_total", verb="get", resource="jobs", code="error"
        ),
    }
    client.call_api("POST", base, None, {"kind": "Job"}, _request_timeout=3)
    client.call_api("PUT", f"{base}/j")
    with pytest.raises(_Refused):
        client.call_api("GET", f"{base}/gone")
    with pytest.raises(OSError):
        client.call_api("GET", f"{base}/down")
    assert len(client.sent) == 4
    for (verb, code), was in labels.items():
        now = sample("agentrun_api_requests_total", verb=verb, resource="jobs", code=code)
        assert now - was == 1, (verb, code)


def test_runs_by_phase_counts_each_run_once_in_its_latest_phase() -> None:
    phases = metrics.RunPhases()
    assert set(phases.counts()) == {str(p) for p in m.RunPhase}
    assert sum(phases.counts().values()) == 0
    phases.seen("a", "r1", None)
    phases.seen("a", "r2", "Running")
    phases.seen("b", "r1", "Running")
    phases.seen("a", "r2", "Succeeded")
    phases.gone("b", "r1")
    counts = phases.counts()
    assert counts["Pending"] == 1 and counts["Succeeded"] == 1 and counts["Running"] == 0


# -- the endpoints --------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[Readiness, str]]:
    readiness = Readiness(("team-a", "team-b"))
    endpoints = Endpoints("127.0.0.1", 0, readiness).start()
    try:
        yield readiness, f"http://127.0.0.1:{endpoints.port}"
    finally:
        endpoints.stop()


def test_readyz_answers_503_until_every_watch_has_listed(served: tuple[Readiness, str]) -> None:
    readiness, url = served
    code, body = get(f"{url}/readyz")
    assert code == 503
    assert json.loads(body) == {
        "ready": False,
        "waitingFor": [
            "kopf's watch of AgentRuns in namespace team-a",
            "kopf's watch of AgentRuns in namespace team-b",
            "the watches of step Jobs, their pods and pod refusals",
        ],
    }
    readiness.runs_listed("team-a")
    readiness.informer_listed()
    code, body = get(f"{url}/readyz")
    assert code == 503 and json.loads(body)["waitingFor"] == [
        "kopf's watch of AgentRuns in namespace team-b"
    ]
    readiness.runs_listed("team-b")
    assert get(f"{url}/readyz") == (200, '{"ready": true, "waitingFor": []}\n')


def test_once_listed_readyz_names_a_dead_watch_until_it_is_heard_again() -> None:
    now = [100.0]
    troubles: list[str] = []
    readiness = Readiness(("team-a",), clock=lambda: now[0])
    readiness.watch_troubles(lambda: list(troubles))
    readiness.runs_listed("team-a")
    readiness.informer_listed()
    assert readiness.ready()
    now[0] += SILENT_SECONDS + 1
    assert readiness.waiting_for() == [
        f"kopf's watch of AgentRuns in namespace team-a: nothing heard for {SILENT_SECONDS + 1}s"
    ]
    readiness.runs_heard("team-a")  # a bookmark
    assert readiness.ready()
    troubles.append("the watch of jobs in team-a failed (timed out); trying again")
    assert readiness.waiting_for() == troubles
    troubles.clear()
    assert readiness.ready()


def test_metrics_are_served_in_the_prometheus_text_format(served: tuple[Readiness, str]) -> None:
    _, url = served
    metrics.RUNS.seen("unit-test-ns", "r", "Suspended")
    try:
        code, body = get(f"{url}/metrics")
    finally:
        metrics.RUNS.gone("unit-test-ns", "r")
    assert code == 200
    lines = body.splitlines()
    assert "# TYPE agentrun_runs gauge" in lines
    assert any(line.startswith('agentrun_runs{phase="Suspended"} ') for line in lines)
    assert "# TYPE agentrun_step_attempts_started_total counter" in lines
    assert "# TYPE agentrun_reconcile_duration_seconds histogram" in lines
    assert get(f"{url}/other")[0] == 404


def test_kopf_listing_of_runs_marks_readiness_and_passes_every_event_on() -> None:
    from kopf._cogs.clients import watching
    from kopf._cogs.structs import references

    listed = watching.Bookmark.LISTED
    events: list[Any] = [{"type": None, "object": {}}, listed, {"type": "ADDED", "object": {}}]

    async def stream(*, resource: Any, namespace: Any, **_: Any) -> AsyncIterator[Any]:
        for event in events:
            yield event

    runs = references.Resource(m.GROUP, m.VERSION, m.PLURAL)
    other = references.Resource("", "v1", "namespaces")
    real = watching.infinite_watch
    watching.infinite_watch = stream
    readiness = Readiness(("ns",))
    undo = watch_kopf_listings(readiness)
    try:

        async def drain(resource: Any, namespace: str | None) -> list[Any]:
            wrapped: Any = watching.infinite_watch  # as kopf's watcher calls it
            return [e async for e in wrapped(resource=resource, namespace=namespace)]

        assert asyncio.run(drain(other, "ns")) == events
        assert readiness.waiting_for()[0] == "kopf's watch of AgentRuns in namespace ns"
        relists = (
            REGISTRY.get_sample_value("agentrun_watch_relists_total", {"resource": m.PLURAL}) or 0.0
        )
        assert asyncio.run(drain(runs, "ns")) == events
        assert readiness.waiting_for() == ["the watches of step Jobs, their pods and pod refusals"]
        events.append(listed)  # kopf listed again (its version had expired)
        assert asyncio.run(drain(runs, "ns")) == events
        after = REGISTRY.get_sample_value("agentrun_watch_relists_total", {"resource": m.PLURAL})
        assert after == relists + 1
    finally:
        undo()
        assert watching.infinite_watch is stream
        watching.infinite_watch = real


def test_the_watch_of_runs_is_told_apart_by_its_url() -> None:
    base = f"/apis/{m.GROUP}/{m.VERSION}"
    assert runs_watched(f"{base}/namespaces/ns/{m.PLURAL}?watch=true&timeoutSeconds=15") == (
        True,
        "ns",
    )
    assert runs_watched(f"{base}/{m.PLURAL}?watch=true") == (True, None)
    assert runs_watched(f"{base}/namespaces/ns/{m.PLURAL}") == (False, None)  # a list
    assert runs_watched("/api/v1/namespaces?watch=true") == (False, None)


def test_a_watch_of_runs_that_the_server_ends_in_order_counts_as_heard_one_that_fails_not() -> None:
    """A quiet namespace's watch of runs hears no event, but the server ends each watch
    request after its timeoutSeconds: that end is heard; a timeout or a broken connection
    (raised by kopf's stream) is not."""
    from kopf._cogs.clients import api

    now = [100.0]
    fail = [False]

    async def stream(url: str, **_: Any) -> AsyncIterator[Any]:
        if fail[0]:
            raise TimeoutError
        lines: list[Any] = []
        for line in lines:
            yield line

    real = api.stream
    api.stream = stream
    readiness = Readiness(("ns",), clock=lambda: now[0])
    readiness.runs_listed("ns")
    readiness.informer_listed()
    undo = watch_kopf_listings(readiness)
    url = f"/apis/{m.GROUP}/{m.VERSION}/namespaces/ns/{m.PLURAL}?watch=true"

    async def watch() -> list[Any]:
        wrapped: Any = api.stream  # as kopf's watch calls it
        return [line async for line in wrapped(url=url)]

    try:
        now[0] += SILENT_SECONDS
        assert asyncio.run(watch()) == []
        now[0] += 1
        assert readiness.ready(), "the end of the watch request was heard"
        fail[0] = True
        with pytest.raises(TimeoutError):
            asyncio.run(watch())
        now[0] += SILENT_SECONDS
        assert not readiness.ready()
    finally:
        undo()
        assert api.stream is stream
        api.stream = real
