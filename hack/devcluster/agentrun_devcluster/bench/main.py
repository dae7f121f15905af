"""``make bench``: the operator against bare Jobs on the local control plane, in one run.

Starts a control plane of its own (every request audited), a local node and the operator
(``agentrun run --all-namespaces``, default settings unless ``--operator-env`` says otherwise),
then runs the cases in this order, each operator case next to the bare-Jobs case it is compared
with, and prints the report (:mod:`agentrun_devcluster.bench.report`):

1. warm-up: one 1-step run and one bare Job (not reported);
2. P2: a 1-step run, then a ``--steps``-step run, each until the operator is done with it;
3. P1: ``--p1-steps`` sequential bare Jobs, then a run of as many sequential steps;
4. P3 (and P4): for each ``--runs`` concurrency, as many bare chains of ``--steps`` Jobs,
   then as many runs of ``--steps`` steps;
5. plan size: one run of each ``--chains`` length (operator CPU per step);
6. replicas: for each ``--replicas`` count, that many replicas sharing the runs
   (``AGENTRUN_SHARDS``, ``--shards``), each in a cgroup of its own limited to
   ``--replica-cpu`` CPUs (:mod:`~agentrun_devcluster.bench.cpulimit`), running
   ``--replica-runs`` runs of ``--steps`` steps at once; the operator is stopped meanwhile;
7. P5: the operator restarted with ``--finished`` finished runs present, then at rest for
   ``--rest-seconds``: first with three in four of them lacking the run finalizer (as runs
   created while the operator was down), then once more on the same runs, all given the
   finalizer first (as the operator leaves the runs it ran);
8. peer: after that cluster is stopped, one of its own whose node runs pods as Docker
   containers, with the operator and Argo Workflows' controller beside it: one 1-step run,
   one ``--peer-chain``-step sequential run and ``--peer-runs`` concurrent runs of
   ``--peer-steps`` steps, each through the operator, as bare Jobs and as Argo Workflows
   (:mod:`~agentrun_devcluster.bench.peer`).

Everything stays on 127.0.0.1, every wait is bounded, and the cluster is removed at the end
(``--keep-state`` keeps its directory: logs, audit log, operator logs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from agentrun.api.agent import MAX_TURNS
from agentrun_devcluster.agent_demo import llm_command

from . import cases, cpulimit, peer, plots
from .report import Report, thinking
from .session import OPERATOR_USER, PEER_NAMESPACE, BenchCluster

__all__ = ["BenchConfig", "main"]

REPO = Path(__file__).resolve().parents[4]
RUNS_DIR = REPO / "docs" / "bench-runs"
PLOTS_DIR = REPO / "docs" / "bench-plots"
_T = TypeVar("_T")

QUICK = {
    "runs": "5,10",
    "steps": 3,
    "p1_steps": 5,
    "finished": 100,
    "rest_seconds": 15.0,
    "chains": "",
    "grace": 5,
    "turns": "5",
    "replica_runs": 20,
    "replicas": "1,2",
    "peer_runs": 5,
    "peer_steps": 3,
    "peer_chain": 5,
}
FULL = {
    "runs": "100,200",
    "steps": 10,
    "p1_steps": 20,
    "finished": 20_000,
    "rest_seconds": 120.0,
    "chains": "10,10,10,50,128",
    "grace": None,
    "turns": "20,20,20,1000",
    "replica_runs": 400,
    "replicas": "1,2,3",
    "peer_runs": 200,
    "peer_steps": 10,
    "peer_chain": 20,
}


CASES = ("p1", "p2", "p3", "chains", "agent", "replicas", "p5", "peer")
ALIASES = {"argo": "peer"}
"""Other names ``--only`` takes for a case."""
ASKED_FOR_ONLY = {
    "peer": "the peer leg (Argo Workflows) builds Argo and its argoexec image and runs pods as "
    "Docker containers: it runs in the full benchmark, or with --quick when --only names it "
    "(--only peer or --only argo)",
}
"""The cases ``--quick`` leaves out unless ``--only`` names them, and why."""
REPLICA_CPU = 0.15
BENCH_CM_QPS = 500
"""The controller manager's ``--kube-api-qps`` in the benchmark's cluster by default: high
enough that its Job, TTL and garbage-collector controllers do not bound either leg at 200
concurrent runs (the design's throughput and API cost targets are stated at it)."""
BENCH_CM_BURST = 1000
"""CPUs of each replica in the replicas case (its cgroup's quota)."""
SHARDS = 12
MODEL_DELAY = (0.0, 0.0)
"""Seconds the agent case's scripted model takes for each answer (``--model-delay``: a model
that thinks for a while, as a real one does). None by default: a 1,000-turn run would take
about 17 minutes longer, and the turns' figures came out the same with 0.5-1.5 s."""


@dataclass(frozen=True)
class BenchConfig:
    runs: tuple[int, ...]
    steps: int
    p1_steps: int
    finished: int
    rest_seconds: float
    chains: tuple[int, ...]
    grace: int | None
    turns: tuple[int, ...]
    """Model turns of each agent run (the first gives the turn overhead's targets)."""
    replica_runs: int
    replicas: tuple[int, ...]
    replica_cpu: float
    shards: int
    peer_runs: int
    peer_steps: int
    peer_chain: int
    controller_manager_qps: int
    controller_manager_burst: int
    operator_env: tuple[tuple[str, str], ...]
    keep_state: bool
    quick: bool
    model_delay: tuple[float, float] = MODEL_DELAY
    """Seconds the scripted model takes for each answer, drawn evenly from this range."""
    only: frozenset[str] = frozenset(CASES)
    """The cases to run (all by default)."""
    skipped: tuple[str, ...] = ()
    """The cases left out though not excluded by ``--only``, each with why (``--quick``)."""
    argo_env: tuple[tuple[str, str], ...] = ()
    """Settings of Argo's controller changed from its defaults (the peer leg)."""
    record: Path | None = None
    """The directory the run's data file is written to (None: not written)."""
    plots: Path | None = None
    """The directory the plots are drawn into, from every data file of ``record``."""

    def env(self) -> dict[str, str]:
        env = dict(self.operator_env)
        if self.grace is not None:
            env.setdefault("AGENTRUN_JOB_DELETION_GRACE_SECONDS", str(self.grace))
        # Model turns run `agentrun step llm` from this checkout (the local node runs a pod's
        # command as a process), as in `make demo-agent`.
        env.setdefault("AGENTRUN_LLM_COMMAND", shlex.join(llm_command()))
        return env


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def thinking_range(bounds: tuple[float, float]) -> str:
    """``bounds`` as ``--model-delay`` takes it."""
    low, high = bounds
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _seconds_range(text: str) -> tuple[float, float]:
    """``LOW-HIGH`` (or one number) as seconds; ValueError if it is not a range."""
    low, _, high = text.partition("-")
    bounds = (float(low), float(high or low))
    if not 0 <= bounds[0] <= bounds[1]:
        raise ValueError(text)
    return bounds


def _named(sizes: Sequence[int], prefix: str) -> list[tuple[int, str]]:
    """Each size with its case's name: ``chain-10``, then ``chain-10-2`` for the second run
    of the same size, so that a size listed again is run again on objects of its own."""
    seen: Counter[int] = Counter()
    named = []
    for size in sizes:
        seen[size] += 1
        named.append((size, f"{prefix}-{size}" + (f"-{seen[size]}" if seen[size] > 1 else "")))
    return named


def select_cases(only: str | None, quick: bool) -> tuple[frozenset[str], tuple[str, ...]]:
    """The cases to run, and those left out with why: ``only`` (``--only``, comma-separated,
    None: not given) names them; without it, every case, except with ``quick`` the cases of
    :data:`ASKED_FOR_ONLY` (which need what a quick run on any machine cannot count on).
    Raises ValueError for a name that is no case."""
    if only is None:
        if not quick:
            return frozenset(CASES), ()
        left_out = tuple(sorted(ASKED_FOR_ONLY))
        return (
            frozenset(CASES) - set(left_out),
            tuple(f"{case}: {ASKED_FOR_ONLY[case]}" for case in left_out),
        )
    names = [c.strip() for c in only.split(",") if c.strip()]
    chosen = frozenset(ALIASES.get(name, name) for name in names)
    if not chosen or chosen - set(CASES):
        raise ValueError(f"--only {only!r}: choose among {', '.join([*CASES, *ALIASES])}")
    return chosen, ()


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(
        prog="hack/bench/bench.py",
        description="Benchmark the operator against bare Jobs on the local control plane.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small version (a few minutes), without the peer leg unless --only names it",
    )
    parser.add_argument("--runs", help="P3 concurrencies, comma-separated (default 100,200)")
    parser.add_argument("--steps", type=int, help="steps per run in P2 and P3 (default 10)")
    parser.add_argument("--p1-steps", type=int, help="sequential steps in P1 (default 20)")
    parser.add_argument("--finished", type=int, help="finished runs in P5 (default 20000)")
    parser.add_argument("--rest-seconds", type=float, help="P5 window at rest (default 120)")
    parser.add_argument(
        "--chains",
        help="plan sizes for operator CPU per step, a size listed again run again (its median "
        "counts; default 10,10,10,50,128; '' for none)",
    )
    parser.add_argument(
        "--grace",
        type=int,
        help="AGENTRUN_JOB_DELETION_GRACE_SECONDS of the operator (default: its own default; "
        "--quick: 5)",
    )
    parser.add_argument(
        "--cm-qps",
        type=int,
        default=BENCH_CM_QPS,
        help="kube-controller-manager --kube-api-qps (default %(default)s: unthrottled, so "
        "that the Jobs' own controllers do not bound both legs; the local control plane's "
        "own default is 100)",
    )
    parser.add_argument(
        "--cm-burst",
        type=int,
        default=BENCH_CM_BURST,
        help="kube-controller-manager --kube-api-burst (default %(default)s)",
    )
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the operator (repeatable), e.g. AGENTRUN_RESYNC_SECONDS=30",
    )
    parser.add_argument(
        "--turns",
        help="model turns of each agent run, comma-separated, at most "
        f"{MAX_TURNS}, a count listed again run again (its median counts; default 20,20,20,1000; "
        "--quick: 5)",
    )
    parser.add_argument(
        "--model-delay",
        default=thinking_range(MODEL_DELAY),
        metavar="LOW-HIGH",
        help="seconds the agent case's scripted model takes for each answer, drawn evenly "
        "from LOW to HIGH (one number: always that; default %(default)s: at once), e.g. 0.5-1.5",
    )
    parser.add_argument(
        "--replica-runs", type=int, help="runs of the replicas case (default 400; --quick: 20)"
    )
    parser.add_argument(
        "--replicas", help="replica counts of the replicas case (default 1,2,3; --quick: 1,2)"
    )
    parser.add_argument(
        "--replica-cpu",
        type=float,
        default=REPLICA_CPU,
        help="CPUs of each replica (a cgroup CPU quota; 0: no limit; default %(default)s)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=SHARDS,
        help="AGENTRUN_SHARDS of the replicas (default %(default)s)",
    )
    parser.add_argument(
        "--peer-runs", type=int, help="concurrent runs of the peer leg (default 200; --quick: 5)"
    )
    parser.add_argument(
        "--peer-steps", type=int, help="steps of each concurrent peer run (default 10; --quick: 3)"
    )
    parser.add_argument(
        "--peer-chain", type=int, help="steps of the peer leg's sequential run (default 20)"
    )
    parser.add_argument(
        "--argo-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of Argo's controller in the peer leg (repeatable; default: none), "
        "e.g. DEFAULT_REQUEUE_TIME=2s",
    )
    parser.add_argument("--keep-state", action="store_true", help="keep the cluster's directory")
    parser.add_argument(
        "--record",
        help="where the run's figures are written as DATE-COMMIT.json (default "
        "docs/bench-runs; --quick: not written unless given; '' for none)",
    )
    parser.add_argument(
        "--plots",
        help="where the plots are drawn, from every data file of --record (default "
        "docs/bench-plots; '' for none)",
    )
    parser.add_argument(
        "--only",
        help=f"the cases to run, comma-separated, of {','.join(CASES)} ('argo' names peer; "
        "default: all; --quick: all but peer)",
    )
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    def pick(name: str) -> object:
        value = getattr(args, name)
        return base[name] if value is None else value

    def settings(option: str, items: list[str], prefix: str) -> list[tuple[str, str]]:
        """``NAME=VALUE`` items of a repeatable option, each NAME starting with ``prefix``."""
        pairs = []
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or not name or not name.startswith(prefix):
                parser.error(f"{option} {item!r}: give {prefix}NAME=VALUE")
            pairs.append((name, value))
        return pairs

    env = settings("--operator-env", args.operator_env, "AGENTRUN_")
    argo_env = settings("--argo-env", args.argo_env, "")
    grace = pick("grace")
    try:
        only, skipped = select_cases(args.only, args.quick)
    except ValueError as error:
        parser.error(str(error))
    if args.shards < 1:
        parser.error("--shards: 1 or more")
    for name in ("peer_runs", "peer_steps", "peer_chain"):
        if int(str(pick(name))) < 1:
            parser.error(f"--{name.replace('_', '-')}: 1 or more")
    turns = _ints(str(pick("turns")))
    if any(not 2 <= n <= MAX_TURNS for n in turns):
        parser.error(f"--turns {args.turns!r}: counts from 2 to {MAX_TURNS}")
    try:
        model_delay = _seconds_range(args.model_delay)
    except ValueError:
        parser.error(f"--model-delay {args.model_delay!r}: give LOW-HIGH seconds, 0 <= LOW <= HIGH")
    replicas = _ints(str(pick("replicas")))
    if any(n < 1 for n in replicas):
        parser.error(f"--replicas {args.replicas!r}: counts of 1 or more")
    return BenchConfig(
        runs=_ints(str(pick("runs"))),
        steps=int(str(pick("steps"))),
        p1_steps=int(str(pick("p1_steps"))),
        finished=int(str(pick("finished"))),
        rest_seconds=float(str(pick("rest_seconds"))),
        chains=_ints(str(pick("chains"))),
        grace=None if grace is None else int(str(grace)),
        turns=turns,
        model_delay=model_delay,
        replica_runs=int(str(pick("replica_runs"))),
        replicas=replicas,
        replica_cpu=args.replica_cpu,
        shards=args.shards,
        peer_runs=int(str(pick("peer_runs"))),
        peer_steps=int(str(pick("peer_steps"))),
        peer_chain=int(str(pick("peer_chain"))),
        controller_manager_qps=args.cm_qps,
        controller_manager_burst=args.cm_burst,
        operator_env=tuple(env),
        keep_state=args.keep_state,
        quick=args.quick,
        only=only,
        skipped=skipped,
        argo_env=tuple(argo_env),
        record=_directory(args.record, None if args.quick else RUNS_DIR),
        plots=_directory(args.plots, PLOTS_DIR),
    )


def _directory(given: str | None, default: Path | None) -> Path | None:
    if given is None:
        return default
    return Path(given) if given else None


def say(message: str) -> None:
    print(f"bench: {message}", flush=True)


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _memory_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "?"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def header(config: BenchConfig, bench: BenchCluster, limit: str = "") -> list[str]:
    """The report's header; ``limit``: how the replicas' CPU is limited."""
    changed = [line for line in _git("status", "--porcelain").splitlines() if line.strip()]
    tracked = [line for line in changed if not line.startswith("??")]
    tree = (
        "clean"
        if not changed
        else f"dirty: {len(tracked)} tracked files changed, {len(changed) - len(tracked)} untracked"
    )
    cp = bench.control_plane
    env = config.env()
    settings = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none"
    return [
        "make bench: the operator beside bare Jobs on the local control plane",
        f"    date          {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"    commit        {_git('rev-parse', '--short', 'HEAD')} (working tree {tree})",
        f"    machine       {os.cpu_count()} CPUs, {_memory_total()} memory, Linux "
        f"{platform.release()}, Python {platform.python_version()}",
        f"    control plane {cp.bin_dir.parent.name}; kube-controller-manager "
        f"--kube-api-qps={cp.controller_manager_qps} "
        f"--kube-api-burst={cp.controller_manager_burst}; audit: every request",
        f"    operator      agentrun run --all-namespaces as user {OPERATOR_USER} "
        f"(system:masters); settings changed from the defaults: {settings}",
        f"    load average  {_load()} at the start (1, 5, 15 min; other work on the machine "
        "skews every figure)",
        f"    cases         P1 {config.p1_steps} steps; P2 1 and {config.steps} steps; "
        f"P3 {', '.join(map(str, config.runs))} runs of {config.steps} steps; "
        f"plan sizes {', '.join(map(str, config.chains)) or 'none'}; "
        f"agent runs of {', '.join(map(str, config.turns))} turns, the model answering in "
        f"{thinking(config.model_delay)}; "
        f"P5 {config.finished} finished runs, {config.rest_seconds:.0f} s at rest",
        *_replicas_header(config, limit),
        *_peer_header(config),
    ]


def meta(config: BenchConfig) -> dict[str, object]:
    """What a data file says of its run first."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "working_tree_clean": not _git("status", "--porcelain").strip(),
        "machine": f"{os.cpu_count()} CPUs, {_memory_total()} memory, Linux "
        f"{platform.release()}, Python {platform.python_version()}",
        "command": shlex.join(["hack/bench/bench.py", *sys.argv[1:]]),
        "cases": sorted(config.only),
        "quick": config.quick,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "operator_settings": dict(sorted(config.env().items())),
        "model_delay_seconds": list(config.model_delay),
    }


def _peer_header(config: BenchConfig) -> list[str]:
    if "peer" not in config.only:
        return []
    return [
        f"    peer          1 run of 1 step, 1 of {config.peer_chain} sequential steps, "
        f"{config.peer_runs} concurrent runs of {config.peer_steps} steps: operator, bare Jobs, "
        "Argo Workflows, on a cluster of its own (node: Docker containers), defaults for each",
    ]


def _replicas_header(config: BenchConfig, limit: str) -> list[str]:
    if "replicas" not in config.only:
        return []
    counts = ", ".join(map(str, config.replicas))
    return [
        f"    replicas      {config.replica_runs} runs of {config.steps} steps by {counts} "
        f"replicas (AGENTRUN_SHARDS={config.shards}, the operator stopped meanwhile); {limit}",
    ]


def _replica_cases(
    bench: BenchCluster,
    config: BenchConfig,
    limit: tuple[cpulimit.Hierarchy | None, float],
    attempt: Callable[[str, Callable[[], cases.ReplicaResult]], cases.ReplicaResult | None],
) -> list[cases.ReplicaResult]:
    """The replicas case for each count, the operator stopped meanwhile (started again
    after)."""
    results: list[cases.ReplicaResult] = []
    runs = config.replica_runs
    bench.stop_operator()
    try:
        for count in config.replicas:
            result = attempt(
                f"replicas: {runs} runs of {config.steps} steps shared by {count} replicas",
                functools.partial(
                    cases.replicated_runs,
                    bench,
                    f"replicas-{count}",
                    count,
                    runs,
                    config.steps,
                    300.0 + runs * config.steps * 1.0,
                    env=config.env(),
                    shards=config.shards,
                    limit=limit,
                    say=say,
                ),
            )
            if result is not None:
                results.append(result)
    finally:
        bench.start_operator(config.env())
    return results


def run(config: BenchConfig) -> int:
    pool = max([*config.runs, 1]) + 16
    bench = BenchCluster(
        controller_manager_qps=config.controller_manager_qps,
        controller_manager_burst=config.controller_manager_burst,
        pool=pool,
        keep_state=config.keep_state,
    )
    report = Report(controller_manager_qps=config.controller_manager_qps)
    began = time.monotonic()
    step_timeout = 30.0

    def attempt(what: str, fn: Callable[[], _T]) -> _T | None:
        say(what)
        try:
            result = fn()
        except Exception as error:
            report.errors.append(f"{what}: {error!r}")
            say(f"  failed: {error!r}")
            traceback.print_exc()
            return None
        case = result.run if isinstance(result, cases.ReplicaResult) else result
        if isinstance(case, cases.CaseResult):
            summary = case.makespan
            say(
                f"  {case.done} done, {case.failed} failed, makespan "
                f"{'-' if summary is None else f'{summary:.1f} s'}, "
                f"{len(case.requests)} requests audited"
            )
        return result

    for note in config.skipped:
        say(f"skipped {note}")
    try:
        say("starting the local control plane, the node and the operator")
        bench.start()
        hierarchy, limit_note = (
            cpulimit.probe(config.replica_cpu) if "replicas" in config.only else (None, "")
        )
        report.header = header(config, bench, limit_note)
        report.meta = meta(config)
        say(f"cluster state in {bench.state_dir}")
        bench.start_operator(config.env())
        env = config.env()

        def cleanup_runs(name: str) -> None:
            attempt(f"cleaning up {name}", functools.partial(cases.delete_runs, bench, name, say))

        def cleanup_bare(name: str) -> None:
            attempt(f"cleaning up {name}", functools.partial(cases.delete_bare, bench, name, say))

        # warm-up
        attempt(
            "warm-up: one run of 1 step",
            lambda: cases.operator_runs(bench, "warmup", 1, 1, 120, settle=True),
        )
        cleanup_runs("warmup")
        attempt("warm-up: one bare Job", lambda: cases.bare_chains(bench, "warmup", 1, 1, 120))
        cleanup_bare("warmup")

        # P2
        if "p2" in config.only:
            one = attempt(
                "P2: one run of 1 step, until the operator is done with it",
                lambda: cases.operator_runs(bench, "p2-one", 1, 1, 120, settle=True),
            )
            cleanup_runs("p2-one")
            many = attempt(
                f"P2: one run of {config.steps} steps, until the operator is done with it",
                lambda: cases.operator_runs(
                    bench,
                    "p2-many",
                    1,
                    config.steps,
                    120 + step_timeout * config.steps,
                    settle=True,
                ),
            )
            cleanup_runs("p2-many")
            report.p2 = (one, many)

        # P1
        n = config.p1_steps
        if "p1" in config.only:
            p1_bare = attempt(
                f"P1: {n} sequential bare Jobs",
                lambda: cases.bare_chains(bench, "p1-bare", 1, n, 60 + step_timeout * n),
            )
            cleanup_bare("p1-bare")
            p1_op = attempt(
                f"P1: one run of {n} sequential steps",
                lambda: cases.operator_runs(bench, "p1-op", 1, n, 60 + step_timeout * n),
            )
            cleanup_runs("p1-op")
            report.p1 = (p1_op, p1_bare)

        # P3 and P4
        for concurrency in config.runs if "p3" in config.only else ():
            timeout = 300.0 + concurrency * config.steps * 1.0
            bare = attempt(
                f"P3: {concurrency} bare chains of {config.steps} Jobs",
                functools.partial(
                    cases.bare_chains,
                    bench,
                    f"p3-{concurrency}-bare",
                    concurrency,
                    config.steps,
                    timeout,
                ),
            )
            cleanup_bare(f"p3-{concurrency}-bare")
            op = attempt(
                f"P3: {concurrency} runs of {config.steps} steps",
                functools.partial(
                    cases.operator_runs,
                    bench,
                    f"p3-{concurrency}-op",
                    concurrency,
                    config.steps,
                    timeout,
                ),
            )
            cleanup_runs(f"p3-{concurrency}-op")
            report.p3.append((concurrency, op, bare))

        # plan size
        for steps, case in _named(config.chains if "chains" in config.only else (), "chain"):
            chain = attempt(
                f"plan size: one run of {steps} sequential steps",
                functools.partial(
                    cases.operator_runs, bench, case, 1, steps, 60 + step_timeout * steps
                ),
            )
            if chain is not None:
                report.chains.append(chain)
            cleanup_runs(case)

        # agent turns
        for turns, case in _named(config.turns if "agent" in config.only else (), "agent"):
            agent = attempt(
                f"agent: one run of {turns} model turns on a scripted model",
                functools.partial(
                    cases.agent_turns,
                    bench,
                    case,
                    turns,
                    120 + (10.0 + config.model_delay[1]) * turns,
                    config.model_delay,
                ),
            )
            if agent is not None:
                report.agents.append(agent)
            cleanup_runs(case)

        # replicas sharing the runs
        if "replicas" in config.only:
            report.replicas = _replica_cases(
                bench, config, (hierarchy, config.replica_cpu), attempt
            )

        # P5
        if "p5" in config.only:
            # First as after runs were created while the operator was down (most lack its
            # finalizer), then restarted on the same runs, all given the finalizer first.
            unfinalized = config.finished * 3 // 4
            for label, without in (
                ("most without the finalizer", unfinalized),
                ("finalized", None),
            ):
                say(f"P5: restarting the operator with finished runs present ({label})")
                bench.stop_operator()
                rest = attempt(
                    f"P5: {config.finished} finished runs ({label}), then "
                    f"{config.rest_seconds:.0f} s at rest",
                    functools.partial(
                        cases.at_rest,
                        bench,
                        config.finished,
                        config.rest_seconds,
                        env,
                        say,
                        bare=without,
                    ),
                )
                if rest is not None:
                    report.rests.append(rest)
    except Exception as error:
        report.errors.append(f"the benchmark stopped: {error!r}")
        traceback.print_exc()
    finally:
        say(f"done in {time.monotonic() - began:.0f} s; stopping the cluster")
        if config.keep_state and bench.cp is not None:
            say(f"state kept in {bench.cp.state_dir}")
        bench.stop()
    if "peer" in config.only:
        report.peer = attempt(
            "peer leg",
            functools.partial(
                peer.peer_leg,
                functools.partial(
                    BenchCluster,
                    controller_manager_qps=config.controller_manager_qps,
                    controller_manager_burst=config.controller_manager_burst,
                    pool=config.peer_runs + 16,
                    keep_state=config.keep_state,
                    runtime="docker",
                    namespaces=(PEER_NAMESPACE,),
                ),
                config.env(),
                (config.peer_runs, config.peer_steps, config.peer_chain),
                say,
                attempt,
                dict(config.argo_env),
            ),
        )
        say(f"done with the peer leg after {time.monotonic() - began:.0f} s")
    report.footer += [f"    skipped       {note}" for note in config.skipped]
    report.footer.append(f"    load average  {_load()} at the end")
    print()
    print(report.render(), end="", flush=True)
    record(config, report)
    return 1 if report.errors else 0


def record(config: BenchConfig, report: Report) -> Path | None:
    """Write the run's data file into ``config.record`` and draw the plots from every data
    file there into ``config.plots``; the data file, or None when none is written."""
    if config.record is None:
        return None
    data = report.data()
    name = f"{str(data.get('date', 'undated'))[:10]}-{data.get('commit', 'unknown')}.json"
    config.record.mkdir(parents=True, exist_ok=True)
    path = config.record / name
    path.write_text(json.dumps(data, indent=1) + "\n")
    say(f"figures written to {path}")
    if config.plots is not None:
        for drawn in plots.write_plots(plots.load_runs(config.record), config.plots):
            say(f"plot drawn: {drawn}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    config = parse_args(argv)
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
