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
import tempfile
import time
from pathlib import Path

import yaml

from agentrun.clients.plugin import render

from .democluster import NAMESPACE, REPO, demo_cluster

DEFAULT_EXAMPLE = REPO / "examples" / "incident-investigation.yaml"


def _say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def run_demo(example: Path, timeout: int) -> int:
    started = time.monotonic()
    state = Path(tempfile.mkdtemp(prefix="agentrun-demo-"))
    with demo_cluster(state, _say, timeout=timeout) as cluster:
        kubectl = cluster.kubectl
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
        run = json.loads(kubectl("get", "agentrun", name, "-n", NAMESPACE, "-o", "json").stdout)
        print("\n".join(render.history_lines((run.get("status") or {}).get("history") or [])))
        if waited.returncode != 0:
            _say(f"the run did not succeed: {waited.stderr.strip()}")
            _say("operator log tail:\n" + cluster.operator_log_tail())
            return 1
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
