"""kube-score and checkov over the rendered chart (``make chart-scan``, hack/chart-scan.sh):
every finding left is explained by a row of docs/install.md's table, and no row says "left"
for a check that is no longer found (it is fixed: say so, or drop the row).

kube-score is built from its Go module (hack/build-kube-score.sh), checkov comes from PyPI
through ``uv tool run`` (both pinned in hack/versions.env); the first run builds and installs
them (about 2.5 minutes and 1.5 minutes), later ones reuse the cache. Without Go or without
PyPI the test skips, saying which and why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

INSTALL_DOC = REPO_ROOT / "docs" / "install.md"
ROW = re.compile(r"^\|\s*(kube-score|checkov)\s*\|\s*`([^`]+)`\s*\|([^|]*)\|\s*(\w+)")


def table() -> dict[tuple[str, str], tuple[str, str]]:
    """``(tool, check) -> (objects cell, status word)`` of docs/install.md's findings table."""
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    for line in INSTALL_DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            key = (match[1], match[2])
            assert key not in rows, f"docs/install.md: two rows for {key}"
            rows[key] = (match[3], match[4])
    assert rows, "docs/install.md has no table of scan findings"
    return rows


def scan(out: Path) -> list[tuple[str, str, str, str]]:
    if shutil.which("go") is None:
        pytest.skip("kube-score cannot be built here: `go` is not installed (see README)")
    proc = subprocess.run(
        [str(REPO_ROOT / "hack" / "chart-scan.sh"), str(out)],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if proc.returncode != 0 and "checkov printed nothing" in proc.stderr:
        pytest.skip(f"checkov could not be installed: {proc.stderr[-800:]}")
    assert proc.returncode == 0, f"hack/chart-scan.sh failed:\n{proc.stderr[-3000:]}"
    found = [tuple(line.split("\t")) for line in proc.stdout.splitlines() if line.strip()]
    assert all(len(f) == 4 for f in found), proc.stdout
    return found  # type: ignore[return-value]


def test_every_scan_finding_is_explained(tmp_path: Path) -> None:
    rows = table()
    found = scan(tmp_path)
    by_check: dict[tuple[str, str], set[str]] = defaultdict(set)
    for tool, check, _render, where in found:
        by_check[(tool, check)].add(where)
    unexplained = sorted(k for k in by_check if k not in rows)
    assert not unexplained, f"findings with no row in docs/install.md: {unexplained}\n" + "\n".join(
        "\t".join(f) for f in found
    )
    for key, objects in sorted(by_check.items()):
        cell, status = rows[key]
        assert status == "left", f"{key} is found, but docs/install.md says {status!r}"
        for where in objects:
            assert f"`{where}`" in cell, f"{key}: {where} is not in its row's objects: {cell}"
    stale = sorted(k for k, (_, status) in rows.items() if status == "left" and k not in by_check)
    assert not stale, f"rows say left, but these are no longer found (fixed?): {stale}"
