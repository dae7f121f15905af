"""The benchmark's plots, drawn from its data files (docs/bench-runs/*.json) with matplotlib.

Each plot is drawn from the latest run whose file holds its figures (a run of ``--only
replicas`` has no P3, a full run no peer leg unless it ran), and says which run that was:

* ``throughput.png``: steps per second against concurrent runs, the operator beside bare
  Jobs (P1 and P3, a node running pods as processes) and beside bare Jobs and Argo Workflows
  (the peer leg, a node running pods as Docker containers);
* ``replicas.png``: the makespan of the replicas case against the replica count, beside the
  makespan of one replica divided by the count;
* ``agent-cpu.png``: the operator's CPU per turn along the longest agent run.

``python -m agentrun_devcluster.bench.plots [RUNS_DIR [PLOTS_DIR]]`` draws them again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["PLOTS", "latest_with", "load_runs", "main", "write_plots"]

Run = Mapping[str, Any]
REPO = Path(__file__).resolve().parents[4]
RUNS_DIR = REPO / "docs" / "bench-runs"
PLOTS_DIR = REPO / "docs" / "bench-plots"
BIN_TURNS = 50
"""Turns per point of the CPU-per-turn plot, when the run's CPU was sampled."""


def load_runs(directory: Path) -> list[dict[str, Any]]:
    """Every run's data file in ``directory``, oldest first (by its ``date``)."""
    runs = [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]
    return sorted(runs, key=lambda run: str(run.get("date", "")))


def latest_with(runs: Sequence[Run], key: str) -> Run | None:
    """The latest run (by ``date``) whose ``key`` holds figures; None if none does."""
    found = [run for run in runs if run.get(key) and not run.get("quick")]
    return max(found, key=lambda run: str(run.get("date", "")), default=None)


def _source(run: Run) -> str:
    return f"{str(run.get('date', '?'))[:10]}, commit {run.get('commit', '?')}"


def _series(ax: Axes, points: Sequence[tuple[float, float | None]], label: str, **kw: Any) -> None:
    shown = [(x, y) for x, y in points if y is not None]
    if shown:
        ax.plot([x for x, _ in shown], [y for _, y in shown], marker="o", label=label, **kw)


def throughput(runs: Sequence[Run], path: Path) -> bool:
    p3, peer = latest_with(runs, "p3"), latest_with(runs, "peer")
    if p3 is None and peer is None:
        return False
    fig = Figure(figsize=(10, 4))
    left, right = axes = fig.subplots(1, 2)
    if p3 is not None:
        rows = sorted(p3["p3"], key=lambda row: row["concurrency"])
        p1 = p3.get("p1") or {}
        for leg, label in (("operator", "operator"), ("bare", "bare Jobs")):
            points: list[tuple[float, float | None]] = []
            if p1.get(f"{leg}_makespan_s"):
                points.append((1, p1["steps"] / p1[f"{leg}_makespan_s"]))
            points += [(row["concurrency"], row.get(f"{leg}_steps_per_s")) for row in rows]
            _series(left, points, label)
        left.set_title(f"pods as processes (P1, P3)\n{_source(p3)}", fontsize=9)
    if peer is not None:
        by_leg: dict[str, list[tuple[float, float | None]]] = {}
        for row in sorted(peer["peer"], key=lambda row: row["runs"]):
            if row["runs"] == 1 and row["steps"] == 1:
                continue  # one step: a start-up time, not a rate
            by_leg.setdefault(row["leg"], []).append((row["runs"], row.get("steps_per_s")))
        for leg, label in (("operator", "operator"), ("bare", "bare Jobs"), ("argo", "Argo")):
            _series(right, by_leg.get(leg, []), label)
        right.set_title(f"pods as Docker containers (peer)\n{_source(peer)}", fontsize=9)
    for ax in axes:
        ax.set_xlabel("concurrent runs (chains of Jobs, Workflows)")
        ax.set_ylabel("steps per second")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.suptitle("Throughput against concurrency")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def replicas(runs: Sequence[Run], path: Path) -> bool:
    run = latest_with(runs, "replicas")
    if run is None:
        return False
    rows = sorted(run["replicas"], key=lambda row: row["replicas"])
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    _series(ax, [(row["replicas"], row.get("makespan_s")) for row in rows], "measured")
    first = rows[0]
    if first.get("makespan_s"):
        ideal = [(row["replicas"], first["makespan_s"] * first["replicas"] / row["replicas"])
                 for row in rows]  # fmt: skip
        _series(ax, ideal, f"{first['replicas']} replica's / count", linestyle="--", alpha=0.6)
    for row in rows:
        if row.get("makespan_s") and row.get("speedup"):
            ax.annotate(
                f"{row['speedup']:.2f}x",
                (row["replicas"], row["makespan_s"]),
                textcoords="offset points",
                xytext=(6, 6),
            )
    ax.set_xticks([row["replicas"] for row in rows])
    ax.set_xlabel("replicas")
    ax.set_ylabel("makespan (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    cpu = f", {first['cpu_per_replica']:g} CPU each" if first.get("cpu_per_replica") else ""
    ax.set_title(
        f"{first.get('runs', '?')} runs of {first.get('steps', '?')} steps{cpu}\n{_source(run)}",
        fontsize=9,
    )
    fig.suptitle("Makespan against replicas")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def _per_turn(samples: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """(turn, ms of operator CPU per turn) over bins of :data:`BIN_TURNS` turns, from samples
    of (seconds, turns, CPU seconds)."""
    ordered = sorted(samples, key=lambda s: (s[0], s[1]))
    points = []
    start = ordered[0] if ordered else None
    for sample in ordered[1:]:
        assert start is not None
        if sample[1] - start[1] >= BIN_TURNS:
            turns = sample[1] - start[1]
            points.append(((start[1] + sample[1]) / 2, (sample[2] - start[2]) / turns * 1000))
            start = sample
    return points


def agent_cpu(runs: Sequence[Run], path: Path) -> bool:
    run = latest_with(runs, "agents")
    if run is None:
        return False
    agent = max(run["agents"], key=lambda a: a["turns"])
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    if agent.get("cpu_samples"):
        points = _per_turn(agent["cpu_samples"])
        _series(ax, [(x, y) for x, y in points], f"per {BIN_TURNS} turns", markersize=3)
    for window in agent.get("cpu_windows", []):
        ax.hlines(
            window["cpu_ms_per_turn"], window["first"], window["last"], linewidth=4, color="C1"
        )
        ax.annotate(
            f"turns {window['first']}-{window['last']}: {window['cpu_ms_per_turn']:g} ms",
            (window["first"], window["cpu_ms_per_turn"]),
            textcoords="offset points",
            xytext=(0, 8),
            fontsize=8,
        )
    if agent.get("cpu_ms_per_turn"):
        ax.axhline(
            agent["cpu_ms_per_turn"],
            linestyle="--",
            color="gray",
            label=f"whole run: {agent['cpu_ms_per_turn']:g} ms",
        )
    ax.set_xlim(0, agent["turns"])
    ax.set_ylim(bottom=0, top=max([*ax.get_ylim(), 1.0]) * 1.2)
    ax.set_xlabel("model turn")
    ax.set_ylabel("operator CPU per turn (ms)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"one run of {agent['turns']} turns\n{_source(run)}", fontsize=9)
    fig.suptitle("Operator CPU per turn along an agent run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


PLOTS: dict[str, Callable[[Sequence[Run], Path], bool]] = {
    "throughput.png": throughput,
    "replicas.png": replicas,
    "agent-cpu.png": agent_cpu,
}


def write_plots(runs: Sequence[Run], directory: Path) -> list[Path]:
    """Draw every plot whose figures some run holds into ``directory``; the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    return [directory / name for name, draw in PLOTS.items() if draw(runs, directory / name)]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    runs_dir = Path(args[0]) if args else RUNS_DIR
    plots_dir = Path(args[1]) if len(args) > 1 else PLOTS_DIR
    for path in write_plots(load_runs(runs_dir), plots_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
