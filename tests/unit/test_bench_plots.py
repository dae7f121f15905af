"""The benchmark's plots and data files (agentrun_devcluster.bench.plots, Report.data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentrun_devcluster.bench import main as bench_main
from agentrun_devcluster.bench import plots
from agentrun_devcluster.bench.report import Report

DATA = Path(__file__).parent / "data" / "bench-run.json"
PNG = b"\x89PNG\r\n\x1a\n"


def test_every_plot_is_drawn_from_a_small_data_file(tmp_path: Path) -> None:
    shutil.copy(DATA, tmp_path / DATA.name)
    written = plots.write_plots(plots.load_runs(tmp_path), tmp_path / "plots")
    assert sorted(p.name for p in written) == sorted(plots.PLOTS)
    for path in written:
        assert path.read_bytes().startswith(PNG), path


def test_a_plot_comes_from_the_latest_run_that_has_its_figures(tmp_path: Path) -> None:
    older = json.loads(DATA.read_text())
    newer = {"date": "2026-12-05T00:00:00Z", "commit": "def5678", "replicas": []}
    quick = {**older, "date": "2026-12-06T00:00:00Z", "quick": True}
    runs = [newer, older, quick]
    assert plots.latest_with(runs, "p3") is older  # newer has none; quick runs do not count
    assert plots.latest_with(runs, "replicas") is older  # an empty section is no figures
    assert plots.latest_with(runs, "chains") is None
    # With no run holding its figures a plot is not drawn, and nothing fails.
    assert plots.write_plots([newer], tmp_path) == []


def test_a_run_without_figures_records_what_ran(tmp_path: Path) -> None:
    report = Report(meta={"date": "2026-12-07T09:00:00Z", "commit": "0123abc"})
    report.errors.append("P1: timed out")
    config = bench_main.parse_args(["--quick", "--record", str(tmp_path), "--plots", ""])
    path = bench_main.record(config, report)
    assert path == tmp_path / "2026-12-07-0123abc.json"
    data = json.loads(path.read_text())
    assert data["commit"] == "0123abc" and data["errors"] == ["P1: timed out"]
    assert "p3" not in data and data["targets"] == []


def test_quick_runs_write_no_data_file_unless_asked() -> None:
    assert bench_main.parse_args(["--quick"]).record is None
    assert bench_main.parse_args([]).record == bench_main.RUNS_DIR
    assert bench_main.parse_args(["--record", ""]).record is None
