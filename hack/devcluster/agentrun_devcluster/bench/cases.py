"""The benchmark's cases: runs through the operator, the same steps as bare Jobs, and the
operator at rest with many finished runs.

Each case measures with three clocks, each where it is exact:

* makespans and throughput with the benchmark's own clock (``time.monotonic()``): from just
  before the first create to the moment its watch sees the last object done, the way a
  script waiting on them would;
* API requests, and the moments a Job was marked Complete and a step's result committed,
  from the API server's audit log (microseconds, one clock for every client);
* CPU seconds and memory of each process from /proc.

Between cases everything the case created is deleted and waited for, so that no case pays for
the one before.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.core.turns import is_model_turn, turn_of_step
from agentrun.kubeapi import METADATA_ONLY
from agentrun.settings import RUN_FINALIZER
from agentrun_devcluster.lifecycle import http_answer
from agentrun_devcluster.modelserver import ScriptedModel

from . import cpulimit, procstat
from .audit import Request, job_completions, run_finishes, step_commits, step_marks
from .session import (
    BARE_NAMESPACE,
    OPERATOR_USER,
    REST_NAMESPACE,
    RUNS_NAMESPACE,
    BenchCluster,
)
from .stats import ratio
from .watch import Tracker, job_finished, run_finished
from .workloads import (
    BENCH_LABEL,
    agent_run,
    bare_job,
    chain_run,
    finished_run,
    finished_status,
    turn_answer,
)

__all__ = [
    "CaseResult",
    "ReplicaResult",
    "RestResult",
    "at_rest",
    "bare_chains",
    "operator_runs",
    "replicated_runs",
]

Say = Callable[[str], None]
CREATE_THREADS = 16
"""Threads that create the runs of a case (so that 200 runs start within a second or so)."""
PASSES = "agentrun_reconcile_duration_seconds_count"
"""The operator's reconcile passes so far, on its /metrics."""
PASS_SECONDS = "agentrun_reconcile_duration_seconds_sum"
"""The seconds its passes took so far."""
WAITS = "agentrun_reconcile_wait_seconds_count"
"""The passes handed to its workers so far (the scheduler's: not those of a deletion)."""
WAIT_SECONDS = "agentrun_reconcile_wait_seconds_sum"
"""The seconds those passes waited for a worker."""
PASS_SAMPLES = (PASSES, PASS_SECONDS, WAITS, WAIT_SECONDS)
RUN_EVENTS = "agentrun_run_events_total"
"""Run events an operator decoded so far, by how (``decoded``: ``whole`` or ``metadata``)."""
QUIET_SECONDS = 3.0
"""The operator counts as done with a case when it made no request for this long."""


@dataclass
class CaseResult:
    """What one case measured."""

    name: str
    kind: str
    """``operator``, ``bare`` or ``argo`` (the peer leg's Workflows)."""
    runs: int
    steps: int
    makespan: float | None
    """Seconds from just before the first create until the last run (Job) was seen done;
    None if not everything was done in time."""
    done: int
    failed: int
    cpu: dict[str, float]
    """CPU seconds of each process during the case."""
    requests: list[Request] = field(default_factory=list)
    """Every API request of the case's window, of every client."""
    window: float = 0.0
    """Seconds the audited window lasted."""
    samples: dict[str, float] = field(default_factory=dict)
    """How much each of :data:`PASS_SAMPLES` of the operator's /metrics grew during the case,
    over the same window as ``cpu``; empty for another engine, or when /metrics did not
    answer."""

    @property
    def passes(self) -> float | None:
        """The operator's reconcile passes during the case, of every run; None for another
        engine, or when /metrics did not answer."""
        return self.samples.get(PASSES)

    @property
    def pass_seconds(self) -> float | None:
        """The mean seconds of a pass during the case."""
        return _mean(self.samples, PASS_SECONDS, PASSES)

    @property
    def pass_wait(self) -> float | None:
        """The mean seconds a pass waited for a worker during the case."""
        return _mean(self.samples, WAIT_SECONDS, WAITS)

    @property
    def total_steps(self) -> int:
        return self.runs * self.steps

    @property
    def throughput(self) -> float | None:
        """Steps (or Jobs) per second over the makespan."""
        if not self.makespan:
            return None
        return self.done * (1 if self.kind == "bare" else self.steps) / self.makespan

    @property
    def operator_cpu(self) -> float | None:
        """CPU seconds of the operator during the case, or of all its replicas together."""
        used = [v for k, v in self.cpu.items() if k == "operator" or k.startswith("replica ")]
        return sum(used) if used else None

    def of_user(self, user: str) -> list[Request]:
        return [r for r in self.requests if r.user == user]

    @property
    def operator_requests(self) -> list[Request]:
        return self.of_user(OPERATOR_USER)

    def commit_latencies(self) -> list[float]:
        """Seconds from each step Job marked Complete to its result committed in status."""
        completed = job_completions(self.requests)
        committed = step_commits(self.requests, OPERATOR_USER)
        return [committed[k] - completed[k] for k in committed if k in completed]

    def run_spans(self) -> list[float]:
        """Per run, seconds from its create to its terminal status write (audit clock)."""
        created = {
            f"{r.namespace}/{r.name}": r.received
            for r in self.requests
            if r.verb == "create" and r.resource == "agentruns" and r.ok
        }
        finished = run_finishes(self.requests, OPERATOR_USER)
        return [finished[k] - created[k] for k in finished if k in created]


def _mean(samples: dict[str, float], total: str, count: str) -> float | None:
    if total not in samples or not samples.get(count):
        return None
    return samples[total] / samples[count]


def _operator_samples(bench: BenchCluster) -> dict[str, float] | None:
    """:data:`PASS_SAMPLES` of the operator's /metrics now (absent ones as 0); None when it
    did not answer."""
    found = {name: bench.operator_sample(name) for name in PASS_SAMPLES}
    if found[PASSES] is None:
        return None
    return {name: value or 0.0 for name, value in found.items()}


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if k in before}


def _drain(response: Any) -> None:
    """Read and release a raw (``_preload_content=False``) response."""
    _ = response.data
    response.release_conn()


# -- bare Jobs ----------------------------------------------------------------------------


def bare_chains(
    bench: BenchCluster, case: str, chains: int, steps: int, timeout: float
) -> CaseResult:
    """``chains`` threads, each creating ``steps`` Jobs one after the other and waiting for
    each to complete before creating the next: a script doing what the operator does, with
    none of its bookkeeping."""
    batch = bench.admin.batch
    tracker = Tracker(
        functools.partial(batch.list_namespaced_job, BARE_NAMESPACE),
        job_finished,
        f"{BENCH_LABEL}={case}",
    ).start()
    deadline = time.monotonic() + timeout
    failures: Counter[str] = Counter()

    def chain(index: int) -> None:
        for k in range(steps):
            name = f"{case}-{index:03d}-{k:03d}"
            try:
                _drain(
                    batch.create_namespaced_job(
                        BARE_NAMESPACE, bare_job(name, case), _preload_content=False
                    )
                )
            except Exception as error:
                failures[f"create: {error}"] += 1
                return
            if tracker.wait(name, deadline - time.monotonic()) is None:
                return

    start_offset = bench.audit.mark()
    cpu_before = bench.cpu()
    started = time.monotonic()
    threads = [threading.Thread(target=chain, args=(i,), daemon=True) for i in range(chains)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 5)
    tracker.stop()
    cpu_after = bench.cpu()
    end_offset = bench.audit.mark()
    window = time.monotonic() - started
    done = len(tracker.done_at)
    failed = sum(
        1
        for job in tracker.final.values()
        if any(
            c.get("type") == "Failed" and c.get("status") == "True"
            for c in (job.get("status") or {}).get("conditions") or []
        )
    )
    complete = done == chains * steps
    return CaseResult(
        name=case,
        kind="bare",
        runs=chains,
        steps=steps,
        makespan=max(tracker.done_at.values()) - started if complete else None,
        done=done,
        failed=failed + sum(failures.values()),
        cpu=_delta(cpu_before, cpu_after),
        requests=bench.audit.read(start_offset, end_offset),
        window=window,
    )


def delete_bare(bench: BenchCluster, case: str, say: Say, timeout: float = 300.0) -> None:
    """Delete the case's Jobs and wait until they and their pods are gone."""
    selector = f"{BENCH_LABEL}={case}"
    batch = bench.admin.batch

    def delete_all() -> None:
        batch.delete_collection_namespaced_job(
            BARE_NAMESPACE, label_selector=selector, propagation_policy="Background"
        )

    _retrying(delete_all, say)
    _wait_gone(bench, BARE_NAMESPACE, selector, say, timeout, again=delete_all)


def _retrying(call: Callable[[], object], say: Say) -> None:
    """``call``, once more after a server error: a busy API server ends a long collection
    delete with 504 after its request timeout, having deleted only part of it."""
    try:
        call()
    except ApiException as error:
        if error.status is None or error.status < 500:
            raise
        say(f"  HTTP {error.status} ({error.reason}); going on")


# -- runs through the operator ----------------------------------------------------------------


def operator_runs(
    bench: BenchCluster,
    case: str,
    runs: int,
    steps: int,
    timeout: float,
    *,
    settle: bool = False,
) -> CaseResult:
    """Create ``runs`` runs of ``steps`` chained steps at once and wait until all are
    finished. With ``settle``, the audited window lasts until the operator is done with them
    (their Jobs deleted after the grace, no request for :data:`QUIET_SECONDS`), so that it
    holds every request the runs cost."""
    names = [f"{case}-{i:03d}" for i in range(runs)]
    bodies = [chain_run(n, steps, case) for n in names]
    return _runs(bench, case, bodies, steps, timeout, settle=settle)


def _runs(
    bench: BenchCluster,
    case: str,
    bodies: list[dict[str, Any]],
    steps: int,
    timeout: float,
    *,
    settle: bool = False,
) -> CaseResult:
    """Create the runs ``bodies`` (of ``steps`` steps each) at once and wait until all are
    finished (see :func:`operator_runs`)."""
    return custom_objects_at_once(
        bench,
        case,
        "operator",
        bodies,
        steps,
        timeout,
        (m.GROUP, m.VERSION, RUNS_NAMESPACE, m.PLURAL),
        run_finished,
        functools.partial(wait_operator_done, bench, RUNS_NAMESPACE, timeout=120.0)
        if settle
        else None,
    )


def custom_objects_at_once(
    bench: BenchCluster,
    case: str,
    kind: str,
    bodies: list[dict[str, Any]],
    steps: int,
    timeout: float,
    where: tuple[str, str, str, str],
    finished: Callable[[Mapping[str, Any]], bool],
    settle: Callable[[], object] | None = None,
) -> CaseResult:
    """Create the custom objects ``bodies`` (runs, or another engine's workflows, of ``steps``
    steps each) in ``where`` (group, version, namespace, plural) at once, wait until each is
    ``finished``, then ``settle`` (the engine done with them): the case ``kind`` (see
    :func:`operator_runs`). An object succeeded when its ``status.phase`` is Succeeded."""
    custom = bench.admin.custom
    group, version, namespace, plural = where
    tracker = Tracker(
        functools.partial(custom.list_namespaced_custom_object, group, version, namespace, plural),
        finished,
        f"{BENCH_LABEL}={case}",
    ).start()
    names = [str(b["metadata"]["name"]) for b in bodies]

    def create(body: dict[str, Any]) -> None:
        custom.create_namespaced_custom_object(group, version, namespace, plural, body)

    start_offset = bench.audit.mark()
    cpu_before = bench.cpu()
    samples_before = _operator_samples(bench) if kind == "operator" else None
    started = time.monotonic()
    with ThreadPoolExecutor(min(CREATE_THREADS, len(bodies))) as pool:
        list(pool.map(create, bodies))
    all_done = tracker.wait_all(names, timeout)
    cpu_after = bench.cpu()
    samples_after = _operator_samples(bench) if samples_before is not None else None
    tracker.stop()
    if settle is not None and all_done:
        settle()
    end_offset = bench.audit.mark()
    window = time.monotonic() - started
    samples = (
        _delta(samples_before, samples_after)
        if samples_before is not None and samples_after is not None
        else {}
    )
    failed = sum(
        1 for obj in tracker.final.values() if (obj.get("status") or {}).get("phase") != "Succeeded"
    )
    return CaseResult(
        name=case,
        kind=kind,
        runs=len(bodies),
        steps=steps,
        makespan=max(tracker.done_at.values()) - started if all_done else None,
        done=len(tracker.done_at),
        failed=failed,
        cpu=_delta(cpu_before, cpu_after),
        requests=bench.audit.read(start_offset, end_offset),
        window=window,
        samples=samples,
    )


# -- runs shared by replicas -------------------------------------------------------------------


@dataclass
class ReplicaResult:
    """Concurrent runs decided by ``replicas`` replicas of the operator sharing them."""

    replicas: int
    run: CaseResult
    shards: list[float]
    """Shards each replica owned when the runs were created."""
    cpus: float | None
    """The CPU limit of each replica; None: none."""
    throttled: float | None = None
    """The share of the replicas' CFS periods throttled by their limit while the runs ran
    (None: no limit)."""
    lost: float = 0.0
    """Shards the replicas stopped deciding while the runs ran: their renewals came late
    (none is given back at a rebalance then: the replicas had split them before)."""
    decoded: list[float] = field(default_factory=list)
    """Run events each replica decoded whole while the runs ran
    (``agentrun_run_events_total{decoded="whole"}``); empty when a replica did not answer."""

    @property
    def cores_per_replica(self) -> float | None:
        """CPU a replica used on average while the runs ran (cores; beside the limit: how
        busy the limit kept it)."""
        span = self.run.makespan
        return ratio(self.run.operator_cpu, None if span is None else span * self.replicas)


def replicated_runs(
    bench: BenchCluster,
    case: str,
    replicas: int,
    runs: int,
    steps: int,
    timeout: float,
    *,
    env: dict[str, str],
    shards: int,
    limit: tuple[cpulimit.Hierarchy | None, float],
    say: Say,
) -> ReplicaResult:
    """Start ``replicas`` replicas sharing the runs in ``shards`` shards (no other operator
    must be running), each in a cgroup of its own limited to ``limit`` (where, CPUs; no
    hierarchy: no limit), wait until they split the shards, run :func:`operator_runs`, then
    delete the runs (with the replicas still there to let them go) and stop the replicas."""
    hierarchy, cpus = limit
    group = f"agentrun-bench-{os.getpid()}-{case}"
    with cpulimit.limited(hierarchy, cpus, group, replicas) as groups:
        try:
            bench.start_replicas(env, replicas, shards, groups.place)
            owned = bench.wait_shards(shards)
            say(f"  shards owned per replica: {', '.join(f'{n:g}' for n in owned)}")
            before, lost = groups.periods(), bench.shards_lost()
            whole = bench.replica_samples(RUN_EVENTS, {"decoded": "whole"})
            result = operator_runs(bench, case, runs, steps, timeout)
            after, lost = groups.periods(), bench.shards_lost() - lost
            decoded = [
                b - a
                for a, b in zip(whole, bench.replica_samples(RUN_EVENTS, {"decoded": "whole"}),
                                strict=True)
                if a >= 0 and b >= 0
            ]  # fmt: skip
        finally:
            say(f"  cleaning up {case}")
            delete_runs(bench, case, say)
            bench.stop_replicas()
    throttled = None
    if before is not None and after is not None:
        throttled = ratio(after[1] - before[1], after[0] - before[0])
    limited = cpus if groups.groups else None
    if len(decoded) != replicas:
        decoded = []
    return ReplicaResult(
        replicas, result, owned, limited, throttled=throttled, lost=lost, decoded=decoded
    )


@dataclass
class AgentResult:
    """One agent run whose model (scripted, answering in :attr:`model_delay`) calls one tool
    per turn."""

    run: CaseResult
    turns: int
    """Model requests the run made."""
    into_model: list[float]
    """For each turn after the first: seconds from the commit of the previous turn's tool
    result to the model's request (audit log and the model server's clock: one machine)."""
    out_of_model: list[float]
    """For each turn that called the tool: seconds from the model's answer to the commit of
    the intent of its call."""
    into_turns: list[int] = field(default_factory=list)
    """The turn whose model request each of :attr:`into_model` timed."""
    between_models: list[float] = field(default_factory=list)
    """For each turn after the first: seconds from the previous turn's model answer to this
    turn's request: both overheads and the call's Job, its pod's start and its command (a
    tool whose pod started late shows here, not in the two above)."""
    samples: list[TurnSample] = field(default_factory=list)
    """The operator's CPU as the run went (see :func:`steady_windows`)."""
    model_delay: tuple[float, float] = (0.0, 0.0)
    """Seconds the model took for each answer, drawn evenly from this range."""

    @property
    def cpu_per_turn(self) -> float | None:
        """The operator's CPU seconds per model turn."""
        return ratio(self.run.cpu.get("operator"), self.turns or None)

    @property
    def slowest_into(self) -> int | None:
        """The turn whose request came slowest after the previous turn's result."""
        if not self.into_model or len(self.into_turns) != len(self.into_model):
            return None
        return self.into_turns[self.into_model.index(max(self.into_model))]


@dataclass(frozen=True)
class TurnSample:
    """The operator's CPU seconds so far when the model had been asked ``turns`` times,
    ``at`` seconds after the run's first model request."""

    at: float
    turns: int
    cpu: float


@dataclass(frozen=True)
class TurnWindow:
    """The operator's CPU per turn over the turns ``first`` to ``last`` of one run."""

    first: int
    last: int
    cpu_per_turn: float


STEADY_TURNS = 200
"""Turns in each of the two windows of a long agent run whose CPU per turn is compared."""
STEADY_AFTER_SECONDS = 40.0
"""The early window starts this long after the run's first model request: past the grace
after which the operator lets a turn's Jobs go (``AGENTRUN_JOB_DELETION_GRACE_SECONDS``, 30 s
by default), so that both windows hold the same kinds of work (a window at the run's start
holds none of those releases, which come later for its turns)."""
TAIL_TURNS = 20
"""Turns left out at the end of a long run (its last turns' work is not done in the window)."""
SAMPLE_SECONDS = 0.1


def steady_windows(samples: list[TurnSample]) -> tuple[TurnWindow, TurnWindow] | None:
    """The operator's CPU per turn early and late in one long agent run, each over
    :data:`STEADY_TURNS` turns: the early window from the first turn asked
    :data:`STEADY_AFTER_SECONDS` after the first, the late one ending :data:`TAIL_TURNS` before
    the last. None when the run is too short for two windows apart (or was not sampled).

    Both windows are of the same run, at the same pace, with the same background work (the
    Jobs of turns 30 s older let go): the ratio of the two is what a turn costs late in a run
    against early, which is the flat-cost claim, without the noise of comparing short runs
    measured at other times."""
    if not samples:
        return None
    ordered = sorted(samples, key=lambda s: (s.at, s.turns))
    early_from = next((s.turns for s in ordered if s.at >= STEADY_AFTER_SECONDS), None)
    most = ordered[-1].turns
    late_to = most - TAIL_TURNS
    if early_from is None or late_to - STEADY_TURNS < early_from + STEADY_TURNS:
        return None

    def window(first: int, last: int) -> TurnWindow | None:
        start = next((s for s in ordered if s.turns >= first), None)
        end = next((s for s in ordered if s.turns >= last), None)
        if start is None or end is None or end.turns <= start.turns:
            return None
        per_turn = (end.cpu - start.cpu) / (end.turns - start.turns)
        return TurnWindow(start.turns, end.turns, per_turn)

    early = window(early_from, early_from + STEADY_TURNS)
    late = window(late_to - STEADY_TURNS, late_to)
    return None if early is None or late is None else (early, late)


class _TurnSampler:
    """Samples the operator's CPU and the model's request count every
    :data:`SAMPLE_SECONDS` while a run goes (a thread)."""

    def __init__(self, bench: BenchCluster, model: ScriptedModel) -> None:
        self.bench, self.model = bench, model
        self.samples: list[TurnSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="turn-sampler", daemon=True)

    def __enter__(self) -> _TurnSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        first: float | None = None
        while not self._stop.wait(SAMPLE_SECONDS):
            asked = self.model.completions()
            cpu = self.bench.cpu().get("operator")
            if not asked or cpu is None:
                continue
            first = asked[0].at if first is None else first
            self.samples.append(TurnSample(time.time() - first, len(asked), cpu))


def agent_turns(
    bench: BenchCluster,
    case: str,
    turns: int,
    timeout: float,
    model_delay: tuple[float, float] = (0.0, 0.0),
) -> AgentResult:
    """Run one agent run of ``turns`` model turns (every turn but the last calls
    :data:`~.workloads.AGENT_TOOL`) on a scripted model on 127.0.0.1 that takes
    ``model_delay`` seconds (drawn evenly from the range) for each answer, and time the
    operator's part of each turn."""
    model = ScriptedModel(responder=turn_answer(turns), strict=True, delay=model_delay)
    with model:
        body = agent_run(f"{case}-000", turns, case, model.base_url)
        with _TurnSampler(bench, model) as sampler:
            result = _runs(bench, case, [body], turns, timeout)
        asked = [r.at for r in model.completions()]
        answered = list(model.answered_at)
    name = f"{case}-000"
    marks = step_marks(result.requests, OPERATOR_USER)
    calls: dict[int, tuple[float | None, float | None]] = {}
    begun: dict[int, float | None] = {}
    for (namespace, run, step), mark in marks.items():
        turn = turn_of_step(step)
        ours = namespace == RUNS_NAMESPACE and run == name
        if ours and turn is not None:
            if is_model_turn(step):
                begun[turn] = mark[0]
            else:
                calls[turn] = mark
    into: list[float] = []
    into_turns: list[int] = []
    out: list[float] = []
    for turn in sorted(calls):
        intent, done = calls[turn]
        # A turn whose last result closes it in the same write is never written finished
        # (its steps leave status for the transcript): that write is the one that commits
        # the next turn's model intent, and no result is committed later than that.
        if done is None:
            done = begun.get(turn + 1)
        if intent is not None and turn - 1 < len(answered):
            out.append(intent - answered[turn - 1])
        if done is not None and turn < len(asked):
            into.append(asked[turn] - done)
            into_turns.append(turn + 1)
    return AgentResult(
        run=result,
        turns=len(asked),
        into_model=into,
        out_of_model=out,
        into_turns=into_turns,
        between_models=[later - answer for answer, later in zip(answered, asked[1:], strict=False)],
        samples=sampler.samples,
        model_delay=model_delay,
    )


def wait_quiet(
    bench: BenchCluster,
    users: set[str],
    timeout: float,
    done: Callable[[], bool] = lambda: True,
) -> bool:
    """Wait until none of ``users`` made a request for :data:`QUIET_SECONDS` and ``done()``
    says so too; False on ``timeout``."""
    deadline = time.monotonic() + timeout
    offset = bench.audit.mark()
    last = time.time()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        end = bench.audit.mark()
        theirs = [r.received for r in bench.audit.read(offset, end) if r.user in users]
        offset = end
        if theirs:
            last = max(last, *theirs)
        if time.time() - last >= QUIET_SECONDS and done():
            return True
    return False


def wait_operator_done(bench: BenchCluster, namespace: str, timeout: float) -> bool:
    """Wait until no step Job is left in ``namespace`` (deleted after the grace) and the
    operator made no request for :data:`QUIET_SECONDS`; False on ``timeout``."""

    def no_jobs() -> bool:
        jobs = bench.admin.batch.list_namespaced_job(namespace, _preload_content=False)
        return not json.loads(jobs.data).get("items")

    return wait_quiet(bench, {OPERATOR_USER}, timeout, no_jobs)


def delete_runs(bench: BenchCluster, case: str, say: Say, timeout: float = 300.0) -> None:
    """Delete the case's runs (the operator cleans up after them) and wait until they, their
    Jobs and pods are gone. Past ``timeout``, the finalizers left are removed so that the next
    case starts clean, and that is said."""
    custom = bench.admin.custom
    selector = f"{BENCH_LABEL}={case}"

    def listed() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = custom.list_namespaced_custom_object(
            m.GROUP, m.VERSION, RUNS_NAMESPACE, m.PLURAL, label_selector=selector
        )["items"]
        return items

    def delete_all() -> None:
        custom.delete_collection_namespaced_custom_object(
            m.GROUP, m.VERSION, RUNS_NAMESPACE, m.PLURAL, label_selector=selector
        )

    _retrying(delete_all, say)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = listed()
        if not left:
            break
        if any(not run["metadata"].get("deletionTimestamp") for run in left):
            _retrying(delete_all, say)
        time.sleep(1.0)
    else:
        say(f"  {case}: runs still there after {timeout:.0f}s; removing their finalizers")
        for run in listed():
            custom.patch_namespaced_custom_object(
                m.GROUP,
                m.VERSION,
                RUNS_NAMESPACE,
                m.PLURAL,
                run["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )
    _wait_gone(bench, RUNS_NAMESPACE, None, say, timeout)


def _wait_gone(
    bench: BenchCluster,
    namespace: str,
    selector: str | None,
    say: Say,
    timeout: float,
    again: Callable[[], object] | None = None,
) -> None:
    """Wait until no Job and no pod (with ``selector``) is left in ``namespace``; ``again``
    (the delete) is repeated while Jobs are left that are not being deleted."""
    deadline = time.monotonic() + timeout
    kwargs: dict[str, Any] = {"_preload_content": False}
    if selector:
        kwargs["label_selector"] = selector
    while time.monotonic() < deadline:
        jobs = json.loads(bench.admin.batch.list_namespaced_job(namespace, **kwargs).data)
        pods = json.loads(bench.admin.core.list_namespaced_pod(namespace, **kwargs).data)
        if not jobs.get("items") and not pods.get("items"):
            return
        if again is not None and any(
            not j["metadata"].get("deletionTimestamp") for j in jobs.get("items") or []
        ):
            _retrying(again, say)
        time.sleep(1.0)
    say(f"  warning: Jobs or pods still in {namespace} after {timeout:.0f}s")


# -- at rest ------------------------------------------------------------------------------


@dataclass
class RestResult:
    """The operator started with many finished runs present, then left alone."""

    finished: int
    without_finalizer: int
    """Runs without the operator's run finalizer when it started (a finished run with nothing
    left to clean up needs none, and is left without it)."""
    created_in: float
    """Seconds the benchmark took to create the finished runs (not a figure of the operator)."""
    ready: float
    """Seconds from the operator's start until its /healthz answered."""
    first_job: float | None
    """Seconds from the operator's start until it created the Job of a run created the
    moment /healthz answered."""
    ready_runs: float | None
    """Seconds from the operator's start until its /readyz answered 200: its watches of runs,
    Jobs, pods and pod refusals have listed, so every run listed has been checked."""
    handled: float | None
    """Seconds from the operator's start until it was ready (/readyz) and its last write to
    a run of the case (the probe run's aside) was made, the later of the two."""
    startup_requests: list[Request]
    """The operator's requests from its start until that Job."""
    startup_cpu: float | None
    rest_seconds: float
    rest_requests: list[Request]
    rest_cpu: float | None
    rss: list[int]
    """The operator's resident memory, sampled every few seconds at rest (bytes)."""

    @property
    def requests_per_second(self) -> float:
        return len(self.rest_requests) / self.rest_seconds if self.rest_seconds else 0.0

    @property
    def cpu_per_minute(self) -> float | None:
        if self.rest_cpu is None or not self.rest_seconds:
            return None
        return self.rest_cpu * 60.0 / self.rest_seconds


def create_finished_runs(bench: BenchCluster, count: int, case: str, bare: int = 0) -> None:
    """``count`` one-step runs in :data:`REST_NAMESPACE`, each created and then given the
    status the core commits for it once its step succeeded, its audit record level with its
    history (through the status subresource): what the operator leaves behind, without
    running anything. The first ``bare`` of them lack the operator's run finalizer, as runs
    created while the operator was down do."""
    custom = bench.admin.custom

    def make(index: int) -> None:
        body = finished_run(f"{case}-{index:05d}", case)
        if index < bare:
            body["metadata"].pop("finalizers", None)
        created = custom.create_namespaced_custom_object(
            m.GROUP, m.VERSION, REST_NAMESPACE, m.PLURAL, body
        )
        created["status"] = finished_status(created)
        custom.replace_namespaced_custom_object_status(
            m.GROUP, m.VERSION, REST_NAMESPACE, m.PLURAL, created["metadata"]["name"], created
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(count)))


def _rest_runs(bench: BenchCluster) -> list[dict[str, Any]]:
    """The runs in :data:`REST_NAMESPACE`, metadata only."""
    listed = bench.admin.custom.list_namespaced_custom_object(
        m.GROUP, m.VERSION, REST_NAMESPACE, m.PLURAL, _preload_content=False,
        _headers=METADATA_ONLY,
    )  # fmt: skip
    items: list[dict[str, Any]] = json.loads(listed.data).get("items") or []
    return items


def _unfinalized(runs: list[dict[str, Any]]) -> list[str]:
    """The names of ``runs`` without the operator's run finalizer."""
    return [
        r["metadata"]["name"]
        for r in runs
        if RUN_FINALIZER not in (r["metadata"].get("finalizers") or [])
    ]


def finalize_all(bench: BenchCluster) -> None:
    """Put the operator's run finalizer on every run in :data:`REST_NAMESPACE` lacking it, as
    the operator leaves the runs it ran (no operator must be running)."""
    custom = bench.admin.custom

    def add(name: str) -> None:
        custom.patch_namespaced_custom_object(
            m.GROUP, m.VERSION, REST_NAMESPACE, m.PLURAL, name,
            {"metadata": {"finalizers": [RUN_FINALIZER]}},
        )  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add, _unfinalized(_rest_runs(bench))))


def at_rest(
    bench: BenchCluster,
    finished: int,
    rest_seconds: float,
    env: dict[str, str],
    say: Say,
    *,
    bare: int | None = None,
) -> RestResult:
    """Start the operator (no operator must be running) with finished runs present, time its
    start, then watch it do nothing for ``rest_seconds``. With ``bare``, ``finished`` runs
    are created first, ``bare`` of them without the run finalizer; without it, the runs of
    the case before are reused, each given the finalizer first (as runs the operator ran
    carry it)."""
    case = "rest"
    began = time.monotonic()
    if bare is not None:
        create_finished_runs(bench, finished, case, bare)
    else:
        finalize_all(bench)
    created_in = time.monotonic() - began
    missing = len(_unfinalized(_rest_runs(bench)))
    say(f"  {finished} finished runs ({missing} without the finalizer) ready in "
        f"{created_in:.1f}s; starting the operator")  # fmt: skip
    custom = bench.admin.custom
    probe = f"{case}-probe-{missing}"
    start_offset = bench.audit.mark()
    started_wall = time.time()
    started = time.monotonic()
    operator = bench.start_operator(env, wait_ready=False)
    pid = operator.pid
    assert pid is not None
    operator.wait_ready(600.0)
    ready = time.monotonic() - started
    custom.create_namespaced_custom_object(
        m.GROUP, m.VERSION, REST_NAMESPACE, m.PLURAL, chain_run(probe, 1, f"{case}-probe")
    )
    first_job: float | None = None
    ready_runs: float | None = None
    startup_requests: list[Request] = []
    deadline = time.monotonic() + 600.0
    while (first_job is None or ready_runs is None) and time.monotonic() < deadline:
        time.sleep(0.2)
        if ready_runs is None and http_answer(operator.readiness_url, timeout=2) is None:
            ready_runs = time.monotonic() - started
        if first_job is not None:
            continue
        requests = bench.audit.read(start_offset)
        mine = [r for r in requests if r.user == OPERATOR_USER]
        creates = [
            r.received
            for r in mine
            if r.verb == "create"
            and r.resource == "jobs"
            and r.namespace == REST_NAMESPACE
            and (r.name or "").startswith(probe)
        ]
        if creates:
            first_job = min(creates) - started_wall
            startup_requests = [r for r in mine if r.received <= min(creates)]
    startup_cpu = _cpu_or_none(pid)
    say(f"  ready in {ready:.1f}s; waiting for the probe run to finish and be cleaned up")
    settled = wait_operator_done(bench, REST_NAMESPACE, timeout=300.0)
    if not settled:
        say("  the operator did not go quiet within 300s; measuring at rest anyway")
    run_writes = [
        r.received - started_wall
        for r in bench.audit.read(start_offset)
        if r.user == OPERATOR_USER
        and r.write
        and r.resource.startswith(m.PLURAL)
        and r.namespace == REST_NAMESPACE
        and not (r.name or "").startswith(probe)
    ]
    handled = None if ready_runs is None else max([ready_runs, *run_writes])
    say(f"  {len(run_writes)} writes to the finished runs; every run handled after "
        f"{'-' if handled is None else f'{handled:.1f}s'}")  # fmt: skip
    rest_offset = bench.audit.mark()
    cpu_before = _cpu_or_none(pid)
    rss: list[int] = []
    rest_began = time.time()
    rest_end = time.monotonic() + rest_seconds
    while time.monotonic() < rest_end:
        try:
            rss.append(procstat.rss_bytes(pid))
        except (OSError, ValueError):
            break
        time.sleep(min(5.0, max(0.0, rest_end - time.monotonic())))
    cpu_after = _cpu_or_none(pid)
    rest_window = time.time() - rest_began
    rest_requests = [
        r
        for r in bench.audit.read(rest_offset)
        if r.user == OPERATOR_USER and rest_began <= r.received <= rest_began + rest_window
    ]
    return RestResult(
        finished=finished,
        without_finalizer=missing,
        created_in=created_in,
        ready=ready,
        first_job=first_job,
        ready_runs=ready_runs,
        handled=handled,
        startup_requests=startup_requests,
        startup_cpu=startup_cpu,
        rest_seconds=rest_window,
        rest_requests=rest_requests,
        rest_cpu=None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
        rss=rss,
    )


def _cpu_or_none(pid: int) -> float | None:
    try:
        return procstat.cpu_seconds(pid)
    except (OSError, ValueError):
        return None
