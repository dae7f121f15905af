"""``agentrun devcluster up --runtime auto`` says which runtime its node uses: docker, where an
engine answers (as here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.docker import Images


def test_up_with_runtime_auto_runs_docker_and_says_so(images: Images, tmp_path: Path) -> None:
    errors = (tmp_path / "up.stderr").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrun_devcluster.cli", "up", "--runtime", "auto"],
        stdout=subprocess.PIPE,
        stderr=errors,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("press Ctrl-C"):
                break
        node = [line for line in lines if line.startswith("local node: ")]
        assert node, "no 'local node:' line in the output of up:\n" + "\n".join(lines)
        assert node[0].startswith(
            "local node: agentrun-local-node, container runtime docker (--runtime auto; log "
        ), node[0]
    finally:
        with_group = os.getpgid(proc.pid)
        os.killpg(with_group, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(with_group, signal.SIGKILL)
            proc.wait()
        errors.close()
    assert proc.returncode == 0, (tmp_path / "up.stderr").read_text()
