"""The approval walkthrough of docs/approvals.md as a newcomer runs it: ``make walkthrough``
(hack/walkthrough-approvals.sh) starts a local cluster of its own with ``agentrun devcluster
up``, sets the shell up from the environment it prints, installs the CRD and the admission
policies, starts the operator, applies examples/approval-gate.yaml, approves the gated step with
``kubectl agentrun approve``, waits for Succeeded, verifies the audit record, and tears it all
down again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "hack" / "walkthrough-approvals.sh"


def test_the_approval_walkthrough_runs_end_to_end(tmp_path: Path) -> None:
    # TMPDIR: the script's work dir and the cluster's state dir go here, so that what it
    # leaves behind is seen.
    proc = subprocess.run(
        [str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, output
    out = proc.stdout
    for expected in (
        "$ export KUBECONFIG=",
        "remediate-checkout   WaitingForApproval",
        "approved step restart-service of agentrun/remediate-checkout",
        "agentrun/remediate-checkout Succeeded: all 2 steps succeeded",
        "audit record intact: ",
        'agentrun.agentrun.dev "remediate-checkout" deleted',
    ):
        assert expected in out, f"{expected!r} missing from the walkthrough's output\n{output}"
    # The printed environment puts kubectl and kubectl-agentrun on PATH.
    environment = next(line for line in out.splitlines() if line.startswith("$ export "))
    path = environment.split(" PATH=", 1)[1].split(":")
    assert any((Path(d) / "kubectl").is_file() for d in path), environment
    assert any((Path(d) / "kubectl-agentrun").is_file() for d in path), environment
    # Torn down: the cluster's state dir and the script's work dir are gone (uv's own lock
    # files may stay).
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("agentrun-"))
    assert left == [], output
