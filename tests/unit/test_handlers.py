"""Finished runs cost nothing at rest (agentrun.loop.scheduler): which finished runs get a pass,
when, and that a run with nothing due gets neither a pass nor a timer, at startup or later."""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from prometheus_client import REGISTRY

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.loop import handlers, scheduler
from agentrun.loop.reconciler import Apis, Outcome, Reconciler
from agentrun.loop.scheduler import Scheduler
from agentrun.observation.view import ClusterView
from agentrun.observation.watches import Informer
from agentrun.telemetry.endpoints import Readiness
from tests.support.sim import T0, UID, Sim, make_run, step


def finished_run(**spec: Any) -> tuple[dict[str, Any], str]:
    """A Succeeded one-step run as the API server holds it, and its Job's name."""
    sim = Sim(make_run([step("a")], **spec))
    sim.run_to_end()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    body = sim.run.to_wire()
    body["metadata"]["namespace"], body["metadata"]["name"] = "default", "demo"
    body["metadata"]["finalizers"] = [s.RUN_FINALIZER]
    job_name = sim.step_status("a").job_name
    assert job_name is not None
    return body, job_name


def job(
    name: str,
    *,
    failed: bool = False,
    deleting: bool = False,
    held: bool = True,
    ttl: int | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": {s.LABEL_RUN_UID: UID, s.LABEL_STEP: "a", s.LABEL_ATTEMPT: "1"},
        "ownerReferences": [{"kind": "AgentRun", "name": "demo", "uid": UID, "controller": True}],
        "finalizers": [s.JOB_FINALIZER] if held else [],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T09:00:00Z"
    kind = "Failed" if failed else "Complete"
    status = {
        "conditions": [{"type": kind, "status": "True"}],
        "completionTime": T0.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    spec = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    return {"metadata": meta, "spec": spec, "status": status}


def reconciler(now_after_finish: float) -> Reconciler:
    settings = s.Settings(namespaces=("default",), job_deletion_grace_seconds=30)
    apis = Apis(core=mock.Mock(), batch=mock.Mock(), custom=mock.Mock())
    return Reconciler(apis, settings, clock=lambda: T0 + timedelta(seconds=now_after_finish))


def test_a_finished_run_with_nothing_left_needs_no_pass() -> None:
    body, _ = finished_run()
    assert reconciler(3600).due_in(body, []) is None


def test_a_finished_run_passes_to_release_a_job_still_held_and_not_for_a_released_one() -> None:
    body, name = finished_run()
    # Its outcome is committed: released at once, to the TTL controller, grace or not.
    assert reconciler(5).due_in(body, [job(name)]) == 0.0
    assert reconciler(5).due_in(body, [job(name, held=False, ttl=30)]) is None
    assert reconciler(3600).due_in(body, [job(name, held=False, ttl=30)]) is None


def test_a_released_job_without_a_ttl_is_deleted_when_its_grace_is_over() -> None:
    body, name = finished_run()
    due = reconciler(5).due_in(body, [job(name, held=False)])
    assert due is not None and 0 < due <= 30
    assert reconciler(3600).due_in(body, [job(name, held=False)]) == 0.0


def test_a_kept_failed_job_asks_for_nothing() -> None:
    body, name = finished_run(retention={"keepJobs": "failed"})
    assert reconciler(3600).due_in(body, [job(name, failed=True)]) is None


def test_a_finished_run_passes_when_its_ttl_is_due() -> None:
    body, _ = finished_run(retention={"ttlSecondsAfterFinished": 600})
    due = reconciler(60).due_in(body, [])
    assert due is not None and 500 < due <= 600


def test_only_running_jobs_and_jobs_held_while_deleted_ask_a_finished_run_for_a_pass() -> None:
    assert not scheduler._needs_pass([job("j")])
    running = job("j")
    running["status"] = {}
    assert scheduler._needs_pass([running])
    assert scheduler._needs_pass([job("j", deleting=True)])
    assert not scheduler._needs_pass([job("j", deleting=True, held=False)])


async def until(done: Callable[[], bool], seconds: float) -> None:
    """Let the loop run until ``done()`` or for ``seconds``, whichever comes first (the test
    then asserts what it expects)."""
    for _ in range(round(seconds / 0.01)):
        await asyncio.sleep(0.01)
        if done():
            return


def make_scheduler(view: ClusterView, rec: Reconciler) -> tuple[Scheduler, Informer]:
    informer = Informer(mock.Mock(), ("default",), lambda *run: None, view)
    return Scheduler(rec, view, Readiness()), informer


@pytest.mark.parametrize("listed_first", [True, False])
def test_at_startup_only_finished_runs_with_something_due_get_a_timer(listed_first: bool) -> None:
    quiet, _ = finished_run()
    timed, _ = finished_run(retention={"ttlSecondsAfterFinished": 600})
    timed["metadata"]["name"] = "timed"

    async def main() -> Scheduler:
        view = ClusterView()
        # The informer's reflectors are expected, not started.
        sched, informer = make_scheduler(view, reconciler(60))

        def list_all() -> None:
            for reflector in informer.reflectors:
                view.replace(reflector.source, [])

        sched.start()
        assert sched.synced is not None
        sched.spawn(sched.watches_listed())
        if listed_first:
            list_all()
            await asyncio.wait_for(sched.synced.wait(), 5)
        tasks = len(sched.tasks)
        for _ in range(1000):  # thousands of finished runs with nothing due
            sched.finished_run_seen(quiet)
        assert len(sched.tasks) == tasks, "work was started for a run with nothing due"
        sched.finished_run_seen(timed)
        if not listed_first:
            assert not sched.timers and len(sched.unchecked) == 2
            list_all()
            await asyncio.wait_for(sched.synced.wait(), 5)
        await until(lambda: not sched.tasks, 0.5)
        return sched

    sched = asyncio.run(main())
    assert list(sched.timers) == [("default", "timed")]
    assert not sched.unchecked


def test_before_the_jobs_are_listed_a_quiet_finished_run_is_kept_as_its_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a start that finds thousands of finished runs, those that are not due by
    themselves wait for the Jobs' list as their identity only; one whose Job then asks for a
    pass (held still: it must be released) is read again, and gets its pass."""
    quiet, job_name = finished_run()
    other = copy.deepcopy(quiet)
    other["metadata"]["name"] = "other"
    other["metadata"]["uid"] = "uid-other"
    passes: list[str] = []

    def fake_pass(rec: Reconciler, namespace: str, name: str) -> Outcome:
        passes.append(name)
        return Outcome(None, "Succeeded", 0)

    monkeypatch.setattr(scheduler, "_pass", fake_pass)

    async def main() -> tuple[Scheduler, mock.Mock]:
        view = ClusterView()
        rec = reconciler(5)
        rec.ledger.read = mock.Mock(return_value=quiet)  # type: ignore[method-assign]
        sched, informer = make_scheduler(view, rec)
        sched.start()
        assert sched.synced is not None
        sched.spawn(sched.watches_listed())
        sched.finished_run_seen(quiet)
        sched.finished_run_seen(other)
        kept = sched.unchecked[("default", "demo")]
        assert set(kept) == {"metadata"} and kept["metadata"]["uid"] == UID
        for reflector in informer.reflectors:
            view.replace(
                reflector.source, [job(job_name)] if reflector.source.kind == "jobs" else []
            )
        await asyncio.wait_for(sched.synced.wait(), 5)
        await until(lambda: not sched.tasks, 0.5)
        return sched, rec.ledger.read

    sched, read = asyncio.run(main())
    read.assert_called_once_with("default", "demo")  # its Job asked; the other run is quiet
    assert passes == ["demo"]
    assert not sched.unchecked


def new_run_body(finalized: bool, version: str) -> dict[str, Any]:
    body = make_run([step("a")]).to_wire()
    meta = body["metadata"]
    meta["namespace"], meta["name"], meta["resourceVersion"] = "default", "demo", version
    meta["finalizers"] = [s.RUN_FINALIZER] if finalized else []
    return body


def test_a_deletion_event_starts_one_task_that_tries_again_until_the_run_may_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deletion's own task (kopf has no deletion handler): started by the first event
    showing the run being deleted with the run finalizer, however many follow, and tried
    again while the cleanup leaves something; none for a run without the finalizer."""
    monkeypatch.setattr(scheduler, "DELETION_RETRY_SECONDS", 0.01)
    answers = [True, True, False]
    calls: list[str] = []

    def delete(body: Any) -> bool:
        calls.append(body["metadata"]["name"])
        return answers.pop(0)

    async def main() -> Scheduler:
        sched = Scheduler(reconciler(0), ClusterView(), Readiness(), delete)
        sched.start()
        body, _ = finished_run()
        body["metadata"]["deletionTimestamp"] = "2026-11-22T09:00:00Z"
        for _ in range(3):
            sched.run_changed("default", "demo", "Succeeded", body)
        released = {**body, "metadata": {**body["metadata"], "finalizers": []}}
        other = {**released, "metadata": {**released["metadata"], "name": "other"}}
        sched.run_changed("default", "other", "Succeeded", other)
        await until(lambda: not sched.tasks, 5)
        return sched

    sched = asyncio.run(main())
    assert calls == ["demo", "demo", "demo"]
    assert not sched.deleting and not sched.tasks


def test_a_finished_run_without_the_run_finalizer_gets_it_only_from_a_pass_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finished run found without the run finalizer is left as it is when nothing of it is
    left to clean up (no request at all: a start that finds thousands of them writes nothing);
    one whose Job still holds its outcome finalizer gets a pass, and that pass adds the run
    finalizer before anything else (``Reconciler._held``)."""
    passes: list[str] = []

    def fake_pass(rec: Reconciler, namespace: str, name: str) -> Outcome:
        passes.append(name)
        return Outcome(None, "Succeeded", 0)

    monkeypatch.setattr(scheduler, "_pass", fake_pass)
    bare, job_name = finished_run()
    bare["metadata"].update(finalizers=[], resourceVersion="5")
    held = copy.deepcopy(bare)
    held["metadata"].update(name="held", uid="uid-held")
    held_job = job("held-job")
    held_job["metadata"]["labels"][s.LABEL_RUN_UID] = "uid-held"
    held_job["metadata"]["ownerReferences"][0].update(name="held", uid="uid-held")
    rec = reconciler(3600)

    async def main() -> Scheduler:
        view = ClusterView()
        sched, informer = make_scheduler(view, rec)
        sched.start()
        assert sched.synced is not None
        sched.spawn(sched.watches_listed())
        for reflector in informer.reflectors:
            jobs = [job(job_name, held=False, ttl=30), held_job]
            view.replace(reflector.source, jobs if reflector.source.kind == "jobs" else [])
        await asyncio.wait_for(sched.synced.wait(), 5)
        for _ in range(100):
            sched.finished_run_seen(bare)
        sched.finished_run_seen(held)
        await until(lambda: passes == ["held"] and not sched.tasks, 5)
        return sched

    sched = asyncio.run(main())
    assert passes == ["held"]
    assert not sched.timers and not sched.tasks
    custom = rec.apis.custom
    assert isinstance(custom, mock.Mock)
    assert not custom.method_calls, "a request was made for a run with nothing to clean up"


def passes_waited() -> float:
    """Passes counted in agentrun_reconcile_wait_seconds so far."""
    return REGISTRY.get_sample_value("agentrun_reconcile_wait_seconds_count") or 0.0


def test_an_unfinished_run_gets_one_task_of_its_own_which_its_deletion_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without kopf daemons (which keep every run's latest body for good), each unfinished
    run is driven by one task: started by its events, however many, ended when the run is
    being deleted; a finished run gets none."""
    passes: list[str] = []

    def fake_pass(rec: Reconciler, namespace: str, name: str) -> Outcome:
        passes.append(name)
        return Outcome(3600.0, "Running", 0)

    monkeypatch.setattr(scheduler, "_pass", fake_pass)
    waited_before = passes_waited()

    async def main() -> Scheduler:
        sched, _ = make_scheduler(ClusterView(), reconciler(3600))
        sched.own_drivers = True
        sched.start()
        assert sched.synced is not None
        sched.synced.set()
        body = new_run_body(True, "1")
        for _ in range(5):
            sched.run_changed("default", "demo", "Running", body)
        done, _ = finished_run()
        done["metadata"]["name"] = "done"
        sched.run_changed("default", "done", "Succeeded", done)
        await until(lambda: bool(passes), 1.0)
        assert list(sched.drivers) == [("default", "demo")], "one task, for the unfinished run"
        deleting = new_run_body(True, "2")
        deleting["metadata"]["deletionTimestamp"] = "2026-11-22T09:00:00Z"
        sched.run_changed("default", "demo", "Running", deleting)
        await until(lambda: not sched.driving, 1.0)
        return sched

    sched = asyncio.run(main())
    assert not sched.drivers and not sched.driving, "the deleted run's task did not end"
    assert passes == ["demo"], passes
    assert passes_waited() - waited_before == 1, "the pass's wait for a worker was not counted"


def test_with_shards_a_run_is_driven_only_while_its_shard_is_held_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of a shard held elsewhere is only remembered; its shard coming here starts its
    driver; a late renewal (owns False, holds True) pauses its passes without ending the
    driver, which goes on once the renewal is in; its shard told lost ends it."""
    monkeypatch.setattr(scheduler, "OWNERSHIP_RECHECK_SECONDS", 0.02)
    passes: list[str] = []
    state = {"holds": False, "owns": False}

    def fake_pass(rec: Reconciler, namespace: str, name: str) -> Outcome:
        passes.append(name)
        return Outcome(3600.0, "Running", 0)

    monkeypatch.setattr(scheduler, "_pass", fake_pass)
    rec = reconciler(3600)
    rec.settings = s.Settings(namespaces=("default",), shards=4)

    async def main() -> Scheduler:
        sched, _ = make_scheduler(ClusterView(), rec)
        sched.own_drivers = True
        sched.owns = lambda namespace, name: state["owns"]
        sched.holds = lambda namespace, name: state["holds"]
        sched.start()
        assert sched.synced is not None
        sched.synced.set()
        sched.run_changed("default", "demo", "Running", new_run_body(True, "1"))
        await until(lambda: bool(passes), 0.2)
        assert not passes and not sched.drivers, "a run of a shard held elsewhere was driven"
        assert ("default", "demo") in sched.known

        state.update(holds=True, owns=True)
        sched.shards_changed(lambda namespace, name: True, lambda namespace, name: False)
        await until(lambda: bool(passes), 1.0)
        assert passes == ["demo"] and list(sched.drivers) == [("default", "demo")]

        state["owns"] = False  # the renewal is late
        sched.wake("default", "demo")
        await until(lambda: False, 0.2)
        assert passes == ["demo"], "a pass ran while the shard's renewal was late"
        assert list(sched.drivers) == [("default", "demo")], "a late renewal ended the driver"
        state["owns"] = True
        await until(lambda: len(passes) > 1, 1.0)
        assert passes == ["demo", "demo"], "the pass did not come back with the renewal"

        state.update(holds=False, owns=False)
        sched.shards_changed(lambda namespace, name: False, lambda namespace, name: True)
        await until(lambda: not sched.driving, 1.0)
        return sched

    sched = asyncio.run(main())
    assert not sched.drivers and not sched.driving, "the driver of a run let go did not end"


def test_kopfs_connections_to_the_api_server_give_up_on_a_silent_peer() -> None:
    """A request kopf makes goes over a socket with the operator's dead-peer options, and the
    undo gives kopf back aiohttp as it was."""
    import aiohttp
    from kopf._cogs.clients import auth
    from kopf._cogs.structs.credentials import ConnectionInfo

    from agentrun.kubeapi import UNACKNOWLEDGED_SECONDS

    async def user_timeout_of_a_request() -> int:
        looked = asyncio.Event()  # the body waits for it: the connection is held till then

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            await writer.drain()
            await looked.wait()
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        context = auth.APIContext(ConnectionInfo(server=f"http://127.0.0.1:{port}"))
        try:
            async with context.session.get(f"http://127.0.0.1:{port}/") as response:
                assert response.connection is not None
                transport = response.connection.transport
                assert transport is not None
                sock = transport.get_extra_info("socket")
                value: int = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                looked.set()
                assert await response.text() == "ok"
                return value
        finally:
            await context.close()
            server.close()

    undo = handlers._kopf_detects_dead_peers()
    try:
        assert asyncio.run(user_timeout_of_a_request()) == UNACKNOWLEDGED_SECONDS * 1000
    finally:
        undo()
    assert vars(auth)["aiohttp"] is aiohttp
    assert asyncio.run(user_timeout_of_a_request()) == 0  # the kernel's default


def test_kopfs_watch_of_runs_and_its_requests_wait_within_the_operators_bounds() -> None:
    """kopf's watch of runs asks the server to end it when the operator's own watches do, and
    is given up after as long a silence; kopf's other requests are given up after about a
    minute (a connection that stalled is never answered)."""
    from types import SimpleNamespace

    import kopf

    from agentrun.kubeapi import (
        CONNECT_SECONDS,
        SERVER_REQUEST_SECONDS,
        WATCH_GRACE_SECONDS,
        WATCH_SECONDS,
    )

    settings = kopf.OperatorSettings()
    memo = SimpleNamespace(state=SimpleNamespace(settings=SimpleNamespace(peering=None)))
    configure: Any = handlers.configure  # as kopf calls it, with what it needs
    configure(settings=settings, memo=memo)
    # the server ends a watch after WATCH_SECONDS; kopf gives it up after a bookmark's
    # interval of silence, and in any case a grace after the server should have ended it
    assert settings.watching.server_timeout == WATCH_SECONDS
    assert settings.watching.client_timeout == WATCH_SECONDS + WATCH_GRACE_SECONDS
    assert settings.watching.inactivity_timeout == min(WATCH_SECONDS, 60) + WATCH_GRACE_SECONDS
    assert settings.watching.connect_timeout == settings.networking.connect_timeout
    assert settings.networking.connect_timeout == CONNECT_SECONDS
    assert settings.networking.request_timeout == SERVER_REQUEST_SECONDS + WATCH_GRACE_SECONDS
