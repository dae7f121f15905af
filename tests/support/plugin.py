"""The project's commands as the suites run them: ``kubectl agentrun`` found by kubectl's plugin
discovery, and ``agentrun step llm`` as the local node's processes can start it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from agentrun_devcluster.testing import TestCluster

VENV_BIN = Path(sys.executable).parent
"""The scripts directory of the environment the tests run in (``kubectl-agentrun``,
``agentrun``)."""

LLM_COMMAND = (
    [str(VENV_BIN / "agentrun"), "step", "llm"]
    if (VENV_BIN / "agentrun").exists()
    else [sys.executable, "-m", "agentrun.cli", "step", "llm"]
)
"""``agentrun step llm`` as the local node's processes can run it (the operator image's own
command on a real cluster)."""


def kubectl_agentrun(
    cluster: TestCluster,
    *args: str,
    kubeconfig: Path | None = None,
    timeout: float = 180.0,
) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ARGS`` as a person types it: kubectl finds ``kubectl-agentrun`` on
    PATH. Never raises on a non-zero exit (see :func:`ok` and :func:`fails`)."""
    env = cluster.env()
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env["PATH"]])
    assert shutil.which("kubectl-agentrun", path=env["PATH"]), (
        f"kubectl-agentrun is not installed in {VENV_BIN}: run `uv sync`"
    )
    extra = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    return subprocess.run(
        [cluster.kubectl_path, "agentrun", *args, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The standard output of a command that must have exited 0."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    )
    return proc.stdout


def fails(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The standard error of a command that must have exited ``code``."""
    assert proc.returncode == code, (
        f"expected exit {code}, got {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    )
    return proc.stderr
