"""The peer leg: the same workloads as AgentRuns, as chains of bare Jobs and as Argo Workflows,
on one control plane and one node, in one run (``--only peer``).

Argo's pods need a node that runs images (argoexec is an image: an init container copies it
into a volume the step's container shares with a ``wait`` container), so the peer leg starts
a cluster of its own whose local node runs pods as Docker containers
(:mod:`agentrun_devcluster.dockercontainer`), after the other cases, whose node runs pods as
processes: its figures compare the three legs with each other, not with P1-P5. Argo Workflows
runs with its release's defaults (:mod:`agentrun_devcluster.argo` says which settings differ
and why), the operator with its own.

Workloads: one 1-step run, one 20-step sequential run, and ``runs`` (200) concurrent runs of
10 sequential steps; each step is the same busybox container in every leg. Per workload and
leg: makespan and throughput (benchmark clock, from the first create until the last run,
Job or Workflow is seen done), API writes per step of the engine and of every client (audit
log, in a window that lasts until the engine made no request for 3 s after the last was done,
so that what it writes after the end counts), the engine's CPU seconds (/proc) and its peak
RSS (sampled every 0.5 s).

The engine's writes: the operator's user; Argo's controller user and the workflow pods'
ServiceAccount (argoexec's ``wait`` container writes each step's WorkflowTaskResult); for bare
Jobs, the script's Job creates. Every client's writes add the Job controller's and the node's
(pod status) on top, leaving out those of the other legs' engines (idle, but Argo's controller
renews its leader Lease meanwhile).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from agentrun_devcluster.argo import (
    ARGO_NAMESPACE,
    CONTROLLER_USER,
    GROUP,
    VERSION,
    ArgoController,
    ArgoError,
    DockerUnavailable,
    argo_bin_dir,
    argoexec_image,
)

from . import cases, procstat
from .audit import Request
from .cases import CaseResult, Say, wait_quiet
from .session import OPERATOR_USER, PEER_NAMESPACE, BenchCluster
from .workloads import BENCH_LABEL, argo_workflow

__all__ = [
    "EXECUTOR_USER",
    "LEGS",
    "PeerResult",
    "PeerRow",
    "all_writes",
    "argo_workflows",
    "engine_writes",
    "peer_leg",
    "workflow_finished",
]

_T = TypeVar("_T")


class Attempt(Protocol):
    """Runs one case, saying what it does; a case that raises is reported and gives None."""

    def __call__(self, what: str, fn: Callable[[], _T], /) -> _T | None: ...


EXECUTOR_USER = f"system:serviceaccount:{PEER_NAMESPACE}:default"
"""Who Argo's pods write as: the ServiceAccount of the workflows' namespace."""
LEGS = ("operator", "bare", "argo")
ENGINE_PROCESS = {"operator": "operator", "argo": "argo controller"}
"""Per leg, the process of :meth:`BenchCluster.pids` that decides (bare: none, a script)."""
FINISHED_PHASES = frozenset({"Succeeded", "Failed", "Error"})
RSS_PERIOD = 0.5


def workflow_finished(workflow: Mapping[str, Any]) -> bool:
    """An Argo Workflow is in a terminal phase."""
    return (workflow.get("status") or {}).get("phase") in FINISHED_PHASES


def engine_writes(kind: str, requests: Iterable[Request]) -> int:
    """The writes of the engine of a leg of ``kind`` (see the module doc)."""
    if kind == "operator":
        return sum(1 for r in requests if r.write and r.user == OPERATOR_USER)
    if kind == "argo":
        users = {CONTROLLER_USER, EXECUTOR_USER}
        return sum(1 for r in requests if r.write and r.user in users)
    return sum(1 for r in requests if r.verb == "create" and r.resource == "jobs" and r.ok)


def all_writes(kind: str, requests: Iterable[Request]) -> int:
    """The writes of every client during a leg of ``kind``, but those of the other legs'
    engines (idle meanwhile, but Argo's controller renews its leader Lease every few
    seconds)."""
    others = {OPERATOR_USER, CONTROLLER_USER, EXECUTOR_USER}
    if kind == "operator":
        others.discard(OPERATOR_USER)
    elif kind == "argo":
        others -= {CONTROLLER_USER, EXECUTOR_USER}
    return sum(1 for r in requests if r.write and r.user not in others)


@dataclass
class PeerRow:
    """One workload, run by each leg."""

    label: str
    runs: int
    steps: int
    legs: dict[str, CaseResult | None] = field(default_factory=dict)
    rss: dict[str, int | None] = field(default_factory=dict)
    """Per leg, the engine's peak RSS in bytes during the case."""


@dataclass
class PeerResult:
    rows: list[PeerRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the report's section says first: versions, settings, or why it did not run."""


class RssPeak:
    """The highest RSS of one process while it runs (sampled every :data:`RSS_PERIOD`)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssPeak:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _sample(self) -> None:
        assert self.pid is not None
        while True:
            try:
                rss = procstat.rss_bytes(self.pid)
            except (OSError, ValueError):
                return
            self.peak = rss if self.peak is None else max(self.peak, rss)
            if self._stop.wait(RSS_PERIOD):
                return


def argo_workflows(
    bench: BenchCluster, case: str, runs: int, steps: int, timeout: float
) -> CaseResult:
    """Create ``runs`` Workflows of ``steps`` sequential steps at once, wait until all are
    finished and Argo is quiet (see the module doc)."""
    return cases.custom_objects_at_once(
        bench,
        case,
        "argo",
        [argo_workflow(f"{case}-{i:03d}", steps, case) for i in range(runs)],
        steps,
        timeout,
        (GROUP, VERSION, PEER_NAMESPACE, "workflows"),
        workflow_finished,
        functools.partial(wait_quiet, bench, {CONTROLLER_USER, EXECUTOR_USER}, timeout=120.0),
    )


def delete_workflows(bench: BenchCluster, case: str, say: Say, timeout: float = 600.0) -> None:
    """Delete the case's Workflows and wait until they and their pods are gone (the garbage
    collector deletes the pods they own)."""
    custom = bench.admin.custom
    selector = f"{BENCH_LABEL}={case}"
    custom.delete_collection_namespaced_custom_object(
        GROUP, VERSION, PEER_NAMESPACE, "workflows", label_selector=selector
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workflows = custom.list_namespaced_custom_object(
            GROUP, VERSION, PEER_NAMESPACE, "workflows", label_selector=selector
        )["items"]
        pods = json.loads(
            bench.admin.core.list_namespaced_pod(
                PEER_NAMESPACE, label_selector=selector, _preload_content=False
            ).data
        )["items"]
        if not workflows and not pods:
            return
        time.sleep(1.0)
    say(f"  warning: Workflows or pods of {case} still in {PEER_NAMESPACE} after {timeout:.0f}s")


def workloads(runs: int, steps: int, chain: int) -> list[tuple[str, int, int]]:
    """(label, runs, steps) of the peer leg's workloads."""
    return [
        ("one 1-step run", 1, 1),
        (f"one {chain}-step sequential run", 1, chain),
        (f"{runs} concurrent {steps}-step runs", runs, steps),
    ]


def peer_leg(
    make_cluster: Callable[[], BenchCluster],
    env: dict[str, str],
    shape: tuple[int, int, int],
    say: Say,
    attempt: Attempt,
    argo_env: Mapping[str, str] | None = None,
) -> PeerResult:
    """Start a cluster with a docker node (``make_cluster``), the operator (``env``) and Argo's
    controller (``argo_env``: settings changed from its defaults) beside it, and run each
    workload of ``shape`` (runs, steps, chain) by each leg. Where no Docker engine can be had
    the result says why and holds no rows."""
    result = PeerResult()
    try:
        image = argoexec_image()
        bin_dir = argo_bin_dir()
    except DockerUnavailable as error:
        result.notes.append(f"not run: {error} (Argo's pods need a node that runs images)")
        return result
    bench = make_cluster()
    try:
        say("peer leg: a control plane with a docker node, the operator and Argo Workflows")
        bench.start()
        bench.start_operator(env)
        argo = ArgoController(
            bench.control_plane,
            bin_dir,
            image,
            [PEER_NAMESPACE],
            log_path=bench.state_dir / "argo-controller.log",
            env=argo_env,
        )
        bench.processes["argo controller"] = lambda: argo.pid
        try:
            argo.install().start()
        except ArgoError as error:
            result.notes.append(f"not run: {error}")
            argo.stop()
            return result
        changed = ", ".join(f"{k}={v}" for k, v in sorted((argo_env or {}).items()))
        result.notes += [
            f"Argo Workflows {bin_dir.parent.name.removeprefix('argo-workflows-')} "
            f"(workflow-controller in namespace {ARGO_NAMESPACE}, executor image {image}): "
            "QPS 20, burst 30, 32 workflow workers, no pod GC, a workflow handled at most once "
            "per DEFAULT_REQUEUE_TIME (10 s) after its pods change; settings changed from the "
            f"release's defaults: {changed or 'none'}",
            f"operator: settings changed from its defaults: "
            f"{', '.join(f'{k}={v}' for k, v in sorted(env.items())) or 'none'}",
        ]
        try:
            for label, runs, steps in workloads(*shape):
                row = PeerRow(label, runs, steps)
                timeout = 300.0 + runs * steps * 1.5
                slug = f"peer-{runs}x{steps}"
                for kind in LEGS:
                    case = f"{slug}-{kind[:2]}"
                    run_case, cleanup = _leg(bench, kind, case, runs, steps, timeout, say)
                    process = ENGINE_PROCESS.get(kind)
                    pid = bench.pids().get(process) if process else None
                    with RssPeak(pid) as peak:
                        row.legs[kind] = attempt(f"peer: {label}, {kind}", run_case)
                    row.rss[kind] = peak.peak
                    attempt(f"cleaning up {case}", cleanup)
                result.rows.append(row)
        finally:
            argo.stop()
    finally:
        bench.stop()
    return result


def _leg(
    bench: BenchCluster,
    kind: str,
    case: str,
    runs: int,
    steps: int,
    timeout: float,
    say: Say,
) -> tuple[Callable[[], CaseResult], Callable[[], None]]:
    """The case of one leg and its cleanup."""
    if kind == "operator":
        return (
            functools.partial(cases.operator_runs, bench, case, runs, steps, timeout, settle=True),
            functools.partial(cases.delete_runs, bench, case, say),
        )
    if kind == "bare":
        return (
            functools.partial(cases.bare_chains, bench, case, runs, steps, timeout),
            functools.partial(cases.delete_bare, bench, case, say),
        )
    return (
        functools.partial(argo_workflows, bench, case, runs, steps, timeout),
        functools.partial(delete_workflows, bench, case, say),
    )
