"""What ``make demo`` (:mod:`agentrun_devcluster.demo`) and ``make demo-agent``
(:mod:`agentrun_devcluster.agent_demo`) both run on: the local control plane and node, the
CRD, the namespace :data:`NAMESPACE`, and the operator as its own process watching it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .binaries import resolve_bin_dir
from .controlplane import ControlPlane, tail, wait_established
from .node import NodeProcess
from .operator import OperatorProcess

__all__ = ["NAMESPACE", "REPO", "DemoCluster", "demo_cluster"]

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "demo"


@dataclass
class DemoCluster:
    """A running demo cluster: its control plane, the environment of kubectl and the
    operator (admin kubeconfig, the cluster's kubectl first on PATH) and the operator's log."""

    cp: ControlPlane
    env: dict[str, str]
    operator_log: Path
    timeout: int

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS``; with ``check``, a failure raises RuntimeError with its stderr."""
        proc = subprocess.run(
            [str(self.cp.kubectl), *args],
            env=self.env,
            text=True,
            capture_output=True,
            timeout=self.timeout + 60,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def operator_log_tail(self) -> str:
        return tail(self.operator_log)


@contextmanager
def demo_cluster(
    state: Path,
    say: Callable[[str], None],
    *,
    timeout: int,
    path_first: Sequence[Path] = (),
    operator_env: Mapping[str, str] | None = None,
) -> Iterator[DemoCluster]:
    """Start the control plane (state in ``state``) and the node, install the CRD, create
    :data:`NAMESPACE` and start the operator on it; stop them all when the block ends.
    ``path_first``: directories put first on PATH (before the cluster's kubectl) for kubectl
    and the operator; ``operator_env``: added to the operator's environment. ``timeout``: what
    the demo waits for its run, which bounds each kubectl call (plus a minute)."""
    bin_dir = resolve_bin_dir()
    say(f"starting the local control plane (state in {state})")
    with ControlPlane(bin_dir, state_dir=state / "cp") as cp:
        env = cp.env()
        if path_first:
            env["PATH"] = os.pathsep.join([*map(str, path_first), env.get("PATH", os.defpath)])
        cluster = DemoCluster(cp, env, state / "operator.log", timeout)
        say(f"control plane ready in {cp.time_to_ready:.1f}s; starting the local node")
        with NodeProcess(cp.kubeconfig, state_dir=state / "node"):
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            wait_established(cp.kubectl, cp.kubeconfig, "agentruns.agentrun.dev")
            cluster.kubectl("create", "namespace", NAMESPACE)
            say(f"starting the operator (log: {cluster.operator_log})")
            cluster.operator_log.unlink(missing_ok=True)
            operator = OperatorProcess(
                cp.kubeconfig,
                namespaces=[NAMESPACE],
                env={
                    "PATH": env["PATH"],
                    "AGENTRUN_JOB_DELETION_GRACE_SECONDS": "5",
                    **(operator_env or {}),
                },
                log_path=cluster.operator_log,
                inherit_agentrun_env=True,
            )
            with operator:
                yield cluster
