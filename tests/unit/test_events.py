"""Events on runs: events.k8s.io/v1, ordered to the microsecond, naming the reporting pod."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from agentrun.core import EmitEvent
from agentrun.telemetry import events

NOW = datetime(2026, 11, 22, 9, 0, 0, 999_999, tzinfo=UTC)


def test_times_of_one_process_strictly_increase_even_from_a_stuck_clock() -> None:
    clock = events.EventClock()
    stamps = [clock.stamp(NOW) for _ in range(3)]
    assert stamps == [NOW, NOW + timedelta(microseconds=1), NOW + timedelta(microseconds=2)]
    assert clock.stamp(NOW + timedelta(seconds=1)) == NOW + timedelta(seconds=1)
    assert clock.stamp(NOW) == NOW + timedelta(seconds=1, microseconds=1)  # the clock went back


def test_times_are_unique_across_threads() -> None:
    clock = events.EventClock()
    seen: list[datetime] = []
    lock = threading.Lock()

    def stamp_many() -> None:
        for _ in range(200):
            at = clock.stamp(NOW)
            with lock:
                seen.append(at)

    threads = [threading.Thread(target=stamp_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == len(seen) == 800


def test_names_and_times_order_events_as_they_happened() -> None:
    times = [NOW + timedelta(microseconds=i) for i in (0, 1, 10, 999_999, 1_000_000)]
    names = [events.event_name("run", t) for t in times]
    assert names == sorted(names) and len(set(names)) == len(names)
    stamps = [events.micro_time(t) for t in times]
    assert stamps == sorted(stamps)
    assert stamps[0] == "2026-11-22T09:00:00.999999Z"
    assert stamps[1] == "2026-11-22T09:00:01.000000Z"


def test_the_body_is_an_events_k8s_io_v1_event_regarding_the_run() -> None:
    event = EmitEvent("Warning", "StepFailed", "step a: boom " + "é" * 2000)
    body = events.event_body(
        "ns", "run", "uid-1", event, NOW, controller="agentrun-operator", instance="op-7d9-x2"
    )
    assert body["apiVersion"] == "events.k8s.io/v1" and body["kind"] == "Event"
    assert body["metadata"] == {"name": events.event_name("run", NOW), "namespace": "ns"}
    assert body["eventTime"] == "2026-11-22T09:00:00.999999Z"
    assert body["reportingController"] == "agentrun-operator"
    assert body["reportingInstance"] == "op-7d9-x2"
    assert body["action"] == "Reconcile"
    assert (body["type"], body["reason"]) == ("Warning", "StepFailed")
    assert body["regarding"] == {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "name": "run",
        "namespace": "ns",
        "uid": "uid-1",
    }
    note = body["note"].encode()
    assert len(note) <= events.NOTE_LIMIT and body["note"].startswith("step a: boom é")
    for legacy in ("firstTimestamp", "lastTimestamp", "count", "source", "message"):
        assert legacy not in body  # the API refuses them on events.k8s.io/v1
    cleanup = EmitEvent("Warning", "CleanupIncomplete", "left behind: Job x")
    body = events.event_body("ns", "run", "u", cleanup, NOW, controller="c", instance="i")
    assert body["action"] == "Cleanup"
