"""Waiting for a run to get somewhere, and asserting that something holds over a window.

Waiters poll with generous timeouts (:func:`agentrun_devcluster.testing.wait_for` underneath)
and fail with the run's last phase and message. "Nothing happens" is never a bare sleep:
:func:`assert_holds` checks it again and again for the whole window and fails at the first
violation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentrun.access import audit
from agentrun_devcluster.testing import KubeClients, wait_for

from .runs import TERMINAL, TIMEOUT, Run, audit_record, get, run_events, status_of, step_status

# The operator posts an Event after the status write it reports: a test that saw the write
# waits this long for the Event.
EVENT_TIMEOUT = 30.0


def wait_until(
    kube: KubeClients,
    namespace: str,
    name: str,
    what: str,
    predicate: Callable[[Run], bool],
    timeout: float = TIMEOUT,
) -> Run:
    """Poll the run until ``predicate`` holds; the error shows the last phase and message."""
    last: dict[str, Any] = {}

    def check() -> Run | None:
        run = get(kube, namespace, name)
        last["status"] = {
            k: status_of(run).get(k) for k in ("phase", "message", "progress", "currentStep")
        }
        return run if predicate(run) else None

    try:
        return wait_for(f"{name}: {what}", check, timeout=timeout)
    except TimeoutError as e:
        raise AssertionError(f"{e}; last status: {last.get('status')}") from None


def wait_phase(
    kube: KubeClients, namespace: str, name: str, *phases: str, timeout: float = TIMEOUT
) -> Run:
    """Wait until the run is in one of ``phases``; fail at once if it ends in another."""
    run = wait_until(
        kube,
        namespace,
        name,
        f"phase in {phases}",
        lambda r: status_of(r).get("phase") in phases or status_of(r).get("phase") in TERMINAL,
        timeout,
    )
    phase = status_of(run).get("phase")
    assert phase in phases, f"{name} ended {phase}: {status_of(run).get('message')}"
    return run


def wait_step_phase(
    kube: KubeClients,
    namespace: str,
    name: str,
    step_name: str,
    *phases: str,
    timeout: float = TIMEOUT,
) -> Run:
    """Wait until step ``step_name`` is in one of ``phases``; fail at once if the run ends
    with the step elsewhere."""
    run = wait_until(
        kube,
        namespace,
        name,
        f"step {step_name} in {phases}",
        lambda r: (
            step_status(r, step_name).get("phase") in phases
            or status_of(r).get("phase") in TERMINAL
        ),
        timeout,
    )
    step_phase = step_status(run, step_name).get("phase")
    assert step_phase in phases, (
        f"{name} ended {status_of(run).get('phase')} with step {step_name} {step_phase}: "
        f"{status_of(run).get('message')}"
    )
    return run


def wait_events(
    kube: KubeClients,
    namespace: str,
    name: str,
    reason: str,
    *,
    warning: bool = False,
    timeout: float = EVENT_TIMEOUT,
) -> list[Any]:
    """The Events with ``reason`` about AgentRun ``name`` (only Warnings if ``warning``), once
    there is one."""

    def found() -> list[Any] | None:
        matching = [
            e
            for e in run_events(kube, namespace, name)
            if e.reason == reason and (e.type == "Warning" or not warning)
        ]
        return matching or None

    kind = "Warning Event" if warning else "Event"
    events: list[Any] = wait_for(f"a {reason} {kind} on {name}", found, timeout=timeout)
    return events


def wait_recorded(
    kube: KubeClients, namespace: str, name: str, uid: str, timeout: float = 60.0
) -> list[Any]:
    """The ConfigMaps of run ``name``'s audit record, once they hold every transition its
    status counts (``historySeq``): a run at rest has its record appended after the status
    write that brought it there."""

    def settled() -> list[Any] | None:
        seq = status_of(get(kube, namespace, name)).get("historySeq")
        maps = audit_record(kube, namespace, uid)
        entries = audit.parse(m.data or {} for m in maps)
        return maps if entries and entries[-1]["seq"] == seq else None

    maps: list[Any] = wait_for(
        f"the audit record of {name} to hold every transition", settled, timeout=timeout
    )
    return maps


def assert_holds(check: Callable[[], None], *, seconds: float, interval: float = 0.5) -> int:
    """Run ``check`` (which asserts) at once, then every ``interval`` seconds until ``seconds``
    have passed, the last time at the end of the window. The first failure is raised with a
    note of when in the window it came; returns how many times ``check`` held."""
    start = time.monotonic()
    end = start + seconds
    held = 0
    while True:
        try:
            check()
        except AssertionError as e:
            into = time.monotonic() - start
            e.add_note(f"held {held} times, then failed {into:.1f}s into a {seconds:g}s window")
            raise
        held += 1
        now = time.monotonic()
        if now >= end:
            return held
        time.sleep(min(interval, end - now))
