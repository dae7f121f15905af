"""``make demo``: the whole thing on one machine, start to finish.

Builds (or reuses) the control plane, starts it with the local node, installs the CRD, starts
the operator as its own process, applies an example AgentRun, follows it to Succeeded with
``kubectl wait``, prints ``kubectl get agentruns`` and the run's history, shuts everything down
and exits 0 (non-zero, with the logs, when anything fails).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from agentrun.plugin import render

from .binaries import resolve_bin_dir
from .controlplane import ControlPlane, free_port, tail, wait_established
from .node import NodeProcess

REPO = Path(__file__).resolve().parents[3]
DEFAULT_EXAMPLE = REPO / "examples" / "incident-investigation.yaml"
NAMESPACE = "demo"


def _say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def run_demo(example: Path, timeout: int) -> int:
    started = time.monotonic()
    bin_dir = resolve_bin_dir()
    state = Path(tempfile.mkdtemp(prefix="agentrun-demo-"))
    _say(f"starting the local control plane (state in {state})")
    with ControlPlane(bin_dir, state_dir=state / "cp") as cp:
        env = cp.env()

        def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            proc = subprocess.run(
                [str(cp.kubectl), *args],
                env=env,
                text=True,
                capture_output=True,
                timeout=timeout + 60,
            )
            if check and proc.returncode != 0:
                raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
            return proc

        _say(f"control plane ready in {cp.time_to_ready:.1f}s; starting the local node")
        with NodeProcess(cp.kubeconfig, state_dir=state / "node"):
            kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            wait_established(cp.kubectl, cp.kubeconfig, "agentruns.agentrun.dev")
            kubectl("create", "namespace", NAMESPACE)
            log_path = state / "operator.log"
            _say(f"starting the operator (log: {log_path})")
            with log_path.open("wb") as log:
                operator = subprocess.Popen(
                    [sys.executable, "-m", "agentrun.cli", "run", "--namespace", NAMESPACE,
                     "--liveness-port", str(free_port()), "--liveness-host", "127.0.0.1",
                     "--metrics-port", "0"],
                    env={**env, "AGENTRUN_JOB_DELETION_GRACE_SECONDS": "5"},
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )  # fmt: skip
                try:
                    name = yaml.safe_load(example.read_text())["metadata"]["name"]
                    _say(f"applying {example.relative_to(REPO)}")
                    print(kubectl("apply", "-n", NAMESPACE, "-f", str(example)).stdout, end="")
                    waited = kubectl(
                        "wait",
                        "-n",
                        NAMESPACE,
                        "--for=condition=Succeeded",
                        f"agentrun/{name}",
                        f"--timeout={timeout}s",
                        check=False,
                    )
                    print(kubectl("get", "agentruns", "-n", NAMESPACE).stdout, end="")
                    run = json.loads(
                        kubectl("get", "agentrun", name, "-n", NAMESPACE, "-o", "json").stdout
                    )
                    print(
                        "\n".join(
                            render.history_lines((run.get("status") or {}).get("history") or [])
                        )
                    )
                    if waited.returncode != 0:
                        _say(f"the run did not succeed: {waited.stderr.strip()}")
                        _say("operator log tail:\n" + tail(log_path))
                        return 1
                finally:
                    operator.terminate()
                    try:
                        operator.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        operator.kill()
    _say(f"succeeded in {time.monotonic() - started:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrun devcluster demo", description=__doc__)
    parser.add_argument(
        "--example",
        type=Path,
        default=DEFAULT_EXAMPLE,
        help="the AgentRun to run (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=int, default=180, help="seconds to wait for it")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_demo(args.example.resolve(), args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
