"""The benchmark's cluster: a local control plane auditing every request, a local node, the
CRD, the namespaces, API clients, and the operator as a process of its own identity.

The operator authenticates as :data:`OPERATOR_USER` (a client certificate in
``system:masters``), so that its requests are the audit log's requests of that user; the
benchmark itself and the bare-Jobs script are ``admin``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes import config as kube_config

from agentrun.api import crd
from agentrun_devcluster.binaries import resolve_bin_dir
from agentrun_devcluster.controlplane import ControlPlane, wait_established
from agentrun_devcluster.node import NodeProcess
from agentrun_devcluster.operator import OperatorProcess

from . import procstat
from .audit import BENCH_AUDIT_POLICY, AuditLog

__all__ = [
    "BARE_NAMESPACE",
    "OPERATOR_USER",
    "REST_NAMESPACE",
    "RUNS_NAMESPACE",
    "BenchCluster",
    "Clients",
]

OPERATOR_USER = "agentrun-operator"
RUNS_NAMESPACE = "bench-runs"
"""Where the operator cases' runs go."""
BARE_NAMESPACE = "bench-bare"
"""Where the bare-Jobs script's Jobs go."""
REST_NAMESPACE = "bench-rest"
"""Where the finished runs of the at-rest case go."""


@dataclass
class Clients:
    api_client: Any
    core: Any
    batch: Any
    custom: Any

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, pool: int) -> Clients:
        """Clients with a connection pool of ``pool`` (the bare-Jobs script runs that many
        threads)."""
        configuration = kube_client.Configuration()
        load: Callable[..., None] = kube_config.load_kube_config
        load(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = pool
        api_client = kube_client.ApiClient(configuration)
        return cls(
            api_client=api_client,
            core=kube_client.CoreV1Api(api_client),
            batch=kube_client.BatchV1Api(api_client),
            custom=kube_client.CustomObjectsApi(api_client),
        )


class BenchCluster:
    """Start with :meth:`start`, end with :meth:`stop` (also of the operator)."""

    def __init__(
        self,
        *,
        controller_manager_qps: int,
        controller_manager_burst: int,
        pool: int,
        keep_state: bool = False,
    ) -> None:
        self.controller_manager_qps = controller_manager_qps
        self.controller_manager_burst = controller_manager_burst
        self.pool = pool
        self.keep_state = keep_state
        self.cp: ControlPlane | None = None
        self.node: NodeProcess | None = None
        self.operator: OperatorProcess | None = None
        self.operator_env: dict[str, str] = {}
        self._admin: Clients | None = None
        self._operator_kubeconfig: Path | None = None
        self._operator_starts = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.cp = ControlPlane(
            resolve_bin_dir(),
            keep_state=self.keep_state,
            controller_manager_qps=self.controller_manager_qps,
            controller_manager_burst=self.controller_manager_burst,
            audit_policy=BENCH_AUDIT_POLICY,
        )
        self.cp.start()
        self.node = NodeProcess(
            self.cp.kubeconfig,
            state_dir=self.cp.state_dir / "node",
            log_path=self.cp.logs_dir / "node.log",
        ).start()
        self.kubectl("apply", "--server-side", "-f", "-", input=crd.render())
        wait_established(self.cp.kubectl, self.cp.kubeconfig, "agentruns.agentrun.dev")
        for namespace in (RUNS_NAMESPACE, BARE_NAMESPACE, REST_NAMESPACE):
            self.kubectl("create", "namespace", namespace)
        for namespace in (RUNS_NAMESPACE, BARE_NAMESPACE, REST_NAMESPACE):
            self._wait_default_serviceaccount(namespace)
        self._operator_kubeconfig = self.cp.mint_user_kubeconfig(OPERATOR_USER, ["system:masters"])

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self._admin is not None:
            self._admin.api_client.close()
        if self.node is not None:
            self.node.stop()
        if self.cp is not None:
            self.cp.stop()

    @property
    def control_plane(self) -> ControlPlane:
        if self.cp is None:
            raise RuntimeError("the bench cluster is not started")
        return self.cp

    @property
    def state_dir(self) -> Path:
        return self.control_plane.state_dir

    @property
    def audit(self) -> AuditLog:
        return AuditLog(self.control_plane.audit_log)

    @property
    def admin(self) -> Clients:
        if self._admin is None:
            self._admin = Clients.for_kubeconfig(self.control_plane.kubeconfig, self.pool)
        return self._admin

    def kubectl(self, *args: str, input: str | None = None) -> str:
        cp = self.control_plane
        proc = subprocess.run(
            [str(cp.kubectl), f"--kubeconfig={cp.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def _wait_default_serviceaccount(self, namespace: str, timeout: float = 60.0) -> None:
        """Pods are refused until the namespace's ``default`` ServiceAccount exists."""
        deadline = time.monotonic() + timeout
        while "serviceaccount/default" not in self.kubectl(
            "-n", namespace, "get", "serviceaccounts", "-o", "name"
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no default ServiceAccount in {namespace} after {timeout}s")
            time.sleep(0.2)

    # -- the operator ------------------------------------------------------------------------

    def start_operator(self, env: Mapping[str, str], *, wait_ready: bool = True) -> OperatorProcess:
        """``agentrun run --all-namespaces`` as :data:`OPERATOR_USER`; default settings plus
        ``env``."""
        if self._operator_kubeconfig is None:
            raise RuntimeError("the bench cluster is not started")
        self._operator_starts += 1
        self.operator_env = dict(env)
        self.operator = OperatorProcess(
            self._operator_kubeconfig,
            all_namespaces=True,
            env=env,
            log_path=self.state_dir / f"operator-{self._operator_starts}.log",
            ready_timeout=600.0,
        )
        return self.operator.start(wait_ready=wait_ready)

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()
            self.operator = None

    # -- what processes cost -----------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        """The processes whose CPU the report shows."""
        found = dict(self.control_plane.pids())
        if self.node is not None and self.node.proc is not None:
            found["local node"] = self.node.proc.pid
        if self.operator is not None and self.operator.pid is not None and self.operator.alive():
            found["operator"] = self.operator.pid
        found["benchmark"] = os.getpid()
        return found

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process of :meth:`pids`."""
        seconds: dict[str, float] = {}
        for name, pid in self.pids().items():
            with contextlib.suppress(OSError, ValueError):
                seconds[name] = procstat.cpu_seconds(pid)
        return seconds
