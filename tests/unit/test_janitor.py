"""The janitor's rules on an in-memory cluster: which runs and Jobs a pass finishes, which it
leaves alone, what it costs at rest, and ``release`` (uninstalling without an operator)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.loop import janitor
from agentrun.loop.cleanup import with_patience
from agentrun.loop.reconciler import Apis, Reconciler
from agentrun.telemetry import metrics

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
Body = dict[str, Any]


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeCluster:
    """AgentRuns, Jobs and ConfigMaps in memory, with the calls the janitor and
    ``Reconciler.cleanup`` make; ``calls`` counts them by name."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], Body] = {}
        self.jobs: dict[tuple[str, str], Body] = {}
        self.calls: list[str] = []
        self.events: list[Body] = []
        self.on_list_runs: Callable[[], None] = lambda: None

    # -- building -----------------------------------------------------------------------------

    def add_run(
        self, ns: str, name: str, *, deleted_ago: float | None = None, finalizers: Any = None
    ) -> str:
        uid = f"uid-{ns}-{name}"
        meta: Body = {
            "namespace": ns,
            "name": name,
            "uid": uid,
            "finalizers": [s.RUN_FINALIZER] if finalizers is None else list(finalizers),
        }
        if deleted_ago is not None:
            meta["deletionTimestamp"] = stamp(deleted_ago)
        self.runs[(ns, name)] = {"metadata": meta}
        return uid

    def add_job(self, ns: str, name: str, run_uid: str, *, finalizers: Any = None) -> None:
        self.jobs[(ns, name)] = {
            "metadata": {
                "namespace": ns,
                "name": name,
                "labels": {s.LABEL_RUN_UID: run_uid, s.LABEL_MANAGED_BY: s.MANAGED_BY},
                "finalizers": [s.JOB_FINALIZER] if finalizers is None else list(finalizers),
            }
        }

    def _gone_if_free(self, store: dict[tuple[str, str], Body], key: tuple[str, str]) -> None:
        meta = store[key]["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del store[key]

    # -- the APIs -----------------------------------------------------------------------------

    @staticmethod
    def _response(items: list[Body]) -> Any:
        return SimpleNamespace(data=json.dumps({"items": items}).encode())

    def list_cluster_custom_object(self, *_: Any, **__: Any) -> Any:
        self.calls.append("list runs")
        response = self._response(list(self.runs.values()))
        self.on_list_runs()  # what happens right after the list was answered
        return response

    def list_namespaced_custom_object(self, g: str, v: str, ns: str, p: str, **_: Any) -> Any:
        self.calls.append("list runs")
        response = self._response([r for (n, _), r in self.runs.items() if n == ns])
        self.on_list_runs()
        return response

    def get_namespaced_custom_object(self, g: str, v: str, ns: str, p: str, name: str) -> Body:
        self.calls.append("get run")
        if (ns, name) not in self.runs:
            raise ApiException(status=404)
        copy: Body = json.loads(json.dumps(self.runs[(ns, name)]))
        return copy

    def patch_namespaced_custom_object(
        self, g: str, v: str, ns: str, p: str, name: str, patch: list[Body], **_: Any
    ) -> None:
        self.calls.append("patch run")
        self._json_patch(self.runs, (ns, name), patch)

    def delete_namespaced_custom_object(self, g: str, v: str, ns: str, p: str, name: str) -> None:
        self.calls.append("delete run")
        if (ns, name) not in self.runs:
            raise ApiException(status=404)
        self.runs[(ns, name)]["metadata"].setdefault("deletionTimestamp", stamp(0))
        self._gone_if_free(self.runs, (ns, name))

    def _jobs_of(self, ns: str | None, selector: str) -> list[Body]:
        wanted = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
        keys = [kv for kv in selector.split(",") if "=" not in kv]
        found = []
        for (n, _), job in self.jobs.items():
            labels = job["metadata"]["labels"]
            if ns is not None and n != ns:
                continue
            if all(labels.get(k) == v for k, v in wanted.items()) and all(
                k in labels for k in keys
            ):
                found.append(job)
        return found

    def list_job_for_all_namespaces(self, label_selector: str, **_: Any) -> Any:
        self.calls.append("list jobs")
        return self._response(self._jobs_of(None, label_selector))

    def list_namespaced_job(self, ns: str, label_selector: str, **kw: Any) -> Any:
        self.calls.append("list jobs")
        found = self._jobs_of(ns, label_selector)
        if kw.get("_preload_content") is False:
            return self._response(found)
        return SimpleNamespace(items=[self._typed(j) for j in found])

    @staticmethod
    def _typed(job: Body) -> Any:
        meta = job["metadata"]
        return SimpleNamespace(
            metadata=SimpleNamespace(name=meta["name"], finalizers=list(meta["finalizers"]))
        )

    def read_namespaced_job(self, name: str, ns: str) -> Any:
        self.calls.append("get job")
        if (ns, name) not in self.jobs:
            raise ApiException(status=404)
        return self._typed(self.jobs[(ns, name)])

    def patch_namespaced_job(self, name: str, ns: str, patch: list[Body]) -> None:
        self.calls.append("patch job")
        self._json_patch(self.jobs, (ns, name), patch)

    def delete_namespaced_job(self, name: str, ns: str, **_: Any) -> None:
        self.calls.append("delete job")
        if (ns, name) not in self.jobs:
            raise ApiException(status=404)
        self.jobs[(ns, name)]["metadata"].setdefault("deletionTimestamp", stamp(0))
        self._gone_if_free(self.jobs, (ns, name))

    def delete_collection_namespaced_config_map(self, ns: str, **_: Any) -> None:
        self.calls.append("delete configmaps")

    def delete_collection_namespaced_pod(self, ns: str, **_: Any) -> None:
        self.calls.append("delete pods")

    def create_namespaced_event(self, ns: str, body: Body) -> None:
        self.events.append(body)

    def _json_patch(
        self, store: dict[tuple[str, str], Body], key: tuple[str, str], patch: list[Body]
    ) -> None:
        if key not in store:
            raise ApiException(status=404)
        finalizers = store[key]["metadata"]["finalizers"]
        for op in patch:
            index = int(op["path"].rsplit("/", 1)[1])
            held = finalizers[index] if index < len(finalizers) else None
            if op["op"] == "test" and held != op["value"]:
                raise ApiException(status=422)
            if op["op"] == "remove":
                del finalizers[index]
        self._gone_if_free(store, key)


def make_janitor(
    fake: FakeCluster, namespaces: tuple[str, ...] = (), cleanup_timeout: int = 60
) -> janitor.Janitor:
    apis = Apis(core=fake, batch=fake, custom=fake, events=fake)
    settings = s.Settings(namespaces=namespaces, cleanup_timeout_seconds=cleanup_timeout)
    return janitor.Janitor(Reconciler(apis, settings, clock=lambda: NOW), namespaces, lambda: NOW)


def test_at_rest_a_pass_is_two_lists_and_touches_nothing() -> None:
    fake = FakeCluster()
    live = fake.add_run("a", "running")
    fake.add_job("a", "running-step", live)
    fake.add_run("a", "finished", finalizers=[s.RUN_FINALIZER])
    done = make_janitor(fake).sweep()
    assert not done.acted and not done.runs_waiting
    assert fake.calls == ["list jobs", "list runs"]
    assert ("a", "running-step") in fake.jobs
    assert fake.jobs[("a", "running-step")]["metadata"]["finalizers"] == [s.JOB_FINALIZER]


def test_namespaced_mode_lists_each_watched_namespace() -> None:
    fake = FakeCluster()
    make_janitor(fake, ("a", "b")).sweep()
    assert sorted(fake.calls) == ["list jobs", "list jobs", "list runs", "list runs"]


def test_a_run_being_deleted_is_cleaned_up_and_released() -> None:
    fake = FakeCluster()
    uid = fake.add_run("a", "doomed", deleted_ago=1)
    fake.add_job("a", "doomed-step-1", uid)
    fake.add_job("a", "doomed-step-2", uid)
    done = make_janitor(fake).sweep()
    assert done.runs_released == ["a/doomed"]
    assert not fake.runs and not fake.jobs  # finalizers released, so both are gone
    assert "delete configmaps" in fake.calls and "delete pods" in fake.calls
    assert done.jobs_released == []  # the run's cleanup saw to its Jobs


def test_a_namespace_being_deleted_is_the_same_rule() -> None:
    # The namespace controller deletes every object in it: runs and Jobs both carry a
    # deletionTimestamp, a Job keeps it until its finalizer goes.
    fake = FakeCluster()
    uid = fake.add_run("dying", "r", deleted_ago=5)
    fake.add_job("dying", "r-step", uid)
    fake.jobs[("dying", "r-step")]["metadata"]["deletionTimestamp"] = stamp(5)
    make_janitor(fake, ("dying",)).sweep()
    assert not fake.runs and not fake.jobs


def test_a_job_whose_run_is_gone_is_released() -> None:
    fake = FakeCluster()
    fake.add_job("a", "orphan", "uid-of-a-run-long-gone")
    fake.add_job("a", "not-ours-to-hold", "uid-gone", finalizers=["example.com/hold"])
    done = make_janitor(fake).sweep()
    assert done.jobs_released == ["a/orphan"]
    assert fake.jobs[("a", "orphan")]["metadata"]["finalizers"] == []
    assert fake.jobs[("a", "not-ours-to-hold")]["metadata"]["finalizers"] == ["example.com/hold"]


def test_a_running_job_relabelled_as_a_gone_runs_keeps_its_finalizer() -> None:
    fake = FakeCluster()
    live = fake.add_run("a", "running")
    fake.add_job("a", "relabelled", "uid-of-a-run-long-gone")
    meta = fake.jobs[("a", "relabelled")]["metadata"]
    meta["ownerReferences"] = [{"kind": "AgentRun", "uid": live, "controller": True}]
    done = make_janitor(fake).sweep()
    assert done.jobs_released == []
    assert meta["finalizers"] == [s.JOB_FINALIZER]


def test_jobs_are_listed_before_runs_so_a_new_run_never_loses_its_job() -> None:
    fake = FakeCluster()
    # A run and its Job created right after a list: listing runs first, the Job would be in
    # the second list and its run in neither, as if the run were gone.
    fake.on_list_runs = lambda: (
        fake.add_job("a", "new-step", fake.add_run("a", "new")) if not fake.runs else None
    )
    make_janitor(fake).sweep()
    assert fake.jobs[("a", "new-step")]["metadata"]["finalizers"] == [s.JOB_FINALIZER]


def test_a_run_whose_cleanup_leaves_something_waits_then_goes_with_an_event() -> None:
    fake = FakeCluster()
    uid = fake.add_run("a", "held", deleted_ago=10)
    fake.add_job("a", "held-step", uid, finalizers=[s.JOB_FINALIZER, "example.com/hold"])
    done = make_janitor(fake, cleanup_timeout=60).sweep()
    assert done.runs_released == [] and done.runs_waiting
    assert "held-step" in done.runs_waiting[0] and "example.com/hold" in done.runs_waiting[0]
    assert s.RUN_FINALIZER in fake.runs[("a", "held")]["metadata"]["finalizers"]
    # Our Job finalizer went at once; the foreign one stays.
    assert fake.jobs[("a", "held-step")]["metadata"]["finalizers"] == ["example.com/hold"]

    done = make_janitor(fake, cleanup_timeout=5).sweep()
    assert done.runs_released == ["a/held"]
    assert not fake.runs
    (event,) = fake.events
    assert event["reason"] == "CleanupIncomplete" and "example.com/hold" in event["note"]
    assert event["apiVersion"] == "events.k8s.io/v1" and event["action"] == "Cleanup"


def test_a_run_whose_cleanup_keeps_failing_goes_once_patience_is_over() -> None:
    """The deletion handler's policy: a failed cleanup is tried again, and the finalizer goes
    anyway once the deletion has waited cleanup_timeout_seconds, with an Event."""
    fake = FakeCluster()
    fake.add_run("a", "stuck", deleted_ago=10)

    def refuse(ns: str, **_: Any) -> None:
        raise ApiException(status=500, reason="etcd timeout")

    fake.delete_collection_namespaced_config_map = refuse  # type: ignore[method-assign]
    done = make_janitor(fake, cleanup_timeout=60).sweep()
    assert done.runs_released == [] and done.failures
    assert "cleanup failed" in done.failures[0]
    assert s.RUN_FINALIZER in fake.runs[("a", "stuck")]["metadata"]["finalizers"]

    done = make_janitor(fake, cleanup_timeout=5).sweep()
    assert done.runs_released == ["a/stuck"]
    assert not fake.runs
    (event,) = fake.events
    assert event["reason"] == "CleanupIncomplete" and "cleanup failed" in event["note"]


def test_a_run_not_being_deleted_or_without_our_finalizer_is_left_alone() -> None:
    fake = FakeCluster()
    fake.add_run("a", "someone-elses", deleted_ago=100, finalizers=["example.com/hold"])
    done = make_janitor(fake).sweep()
    assert not done.acted
    assert fake.runs[("a", "someone-elses")]["metadata"]["finalizers"] == ["example.com/hold"]


def test_release_deletes_every_run_in_scope_and_leaves_no_finalizer() -> None:
    fake = FakeCluster()
    for name in ("one", "two"):
        uid = fake.add_run("a", name)
        fake.add_job("a", f"{name}-step", uid)
    fake.add_run("b", "elsewhere")
    said: list[str] = []
    left = janitor.release(make_janitor(fake, ("a",)), said.append, interval=0)
    assert not left
    assert list(fake.runs) == [("b", "elsewhere")]
    assert not fake.jobs
    assert "deleted agentrun a/one" in said and "released agentrun a/two" in said
    assert said[-1] == "a: deleted 2 runs; released 2 runs and 0 step Jobs"


def test_release_releases_now_even_what_someone_else_holds() -> None:
    fake = FakeCluster()
    uid = fake.add_run("a", "held")
    fake.add_job("a", "held-step", uid, finalizers=[s.JOB_FINALIZER, "example.com/hold"])
    left = janitor.release(make_janitor(fake, ("a",)), lambda _: None, interval=0)
    assert not left  # the foreign finalizer is not the operator's to release
    assert not fake.runs
    assert fake.jobs[("a", "held-step")]["metadata"]["finalizers"] == ["example.com/hold"]
    assert not fake.events  # no Event: nobody is left to read it on an uninstall


@pytest.mark.parametrize("status", [403, 500])
def test_a_refused_list_fails_the_pass(status: int) -> None:
    fake = FakeCluster()

    def refuse() -> None:
        raise ApiException(status=status)

    fake.on_list_runs = refuse
    with pytest.raises(ApiException):
        make_janitor(fake).sweep()


def test_one_patience_judges_every_cleanup_of_a_deletion() -> None:
    """The deletion handler's and the janitor's rule (agentrun.loop.cleanup.with_patience)."""
    held = ["Job j (finalizers: example.com/hold)"]

    def failing() -> list[str]:
        raise ApiException(status=500, reason="boom")

    waited: list[float] = []

    def after(seconds: float) -> Callable[[], float]:
        def measure() -> float:
            waited.append(seconds)
            return seconds

        return measure

    done = with_patience(lambda: [], after(99), patience=60)
    assert not done.left and not done.waits and not done.forced
    assert not waited, "nothing left: how long it waited does not matter"
    early = with_patience(lambda: held, after(10), patience=60)
    assert early.waits and not early.forced and early.leftovers == held[0]
    late = with_patience(lambda: held, after(60), patience=60)
    assert late.forced and late.waited == 60
    failed = with_patience(failing, after(10), patience=60)
    assert failed.waits and isinstance(failed.error, ApiException)
    assert failed.left[0].startswith("cleanup failed: (500)")
    assert with_patience(failing, after(60), patience=60).forced


def test_a_sweep_refused_with_429_is_one_line_counted_and_waits_its_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server shedding load is not the janitor's failure: one warning line, no
    traceback, the sweep counted as throttled, and the next one after the longer wait."""

    class Throttled:
        calls = 0

        def sweep(self) -> Any:
            Throttled.calls += 1
            error = ApiException(status=429, reason="Too Many Requests")
            error.headers = {"Retry-After": "2"}
            error.body = '{"message": "too many requests, please try again later"}'
            raise error

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) >= 2:
            raise asyncio.CancelledError

    before = metrics.THROTTLED_SWEEPS._value.get()
    with (
        mock.patch("agentrun.loop.janitor.asyncio.sleep", sleep),
        pytest.raises(asyncio.CancelledError),
    ):
        asyncio.run(janitor.keep_sweeping(Throttled(), 1.0))  # type: ignore[arg-type]
    assert Throttled.calls == 1 and slept == [1.0, 1.0]  # 2 s in all: what Retry-After asked
    assert metrics.THROTTLED_SWEEPS._value.get() == before + 1
    warnings = [r for r in caplog.records if "throttled by the API server" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert "too many requests, please try again later" in warnings[0].getMessage()
