"""The benchmark's cluster: a local control plane auditing every request, a local node, the
CRD, the namespaces, API clients, and the operator as a process of its own identity.

The node runs pods as local processes (``runtime="process"``, the default: no images, the
cheapest pod start) or as Docker containers (``runtime="docker"``: the peer leg, whose Argo
pods need images and shared volumes).

The operator authenticates as :data:`OPERATOR_USER` (a client certificate in
``system:masters``), so that its requests are the audit log's requests of that user; the
benchmark itself and the bare-Jobs script are ``admin``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes import config as kube_config
from prometheus_client.parser import text_string_to_metric_families

from agentrun.api import crd
from agentrun.loop.shards import LEASE_LABEL
from agentrun_devcluster.binaries import resolve_bin_dir
from agentrun_devcluster.controlplane import ControlPlane, wait_established
from agentrun_devcluster.node import NodeProcess
from agentrun_devcluster.operator import OperatorProcess

from . import procstat
from .audit import BENCH_AUDIT_POLICY, AuditLog

__all__ = [
    "BARE_NAMESPACE",
    "LEASE_NAMESPACE",
    "OPERATOR_USER",
    "PEER_NAMESPACE",
    "REST_NAMESPACE",
    "RUNS_NAMESPACE",
    "BenchCluster",
    "Clients",
    "sample",
    "shard_env",
]

OPERATOR_USER = "agentrun-operator"
RUNS_NAMESPACE = "bench-runs"
"""Where the operator cases' runs go."""
BARE_NAMESPACE = "bench-bare"
"""Where the bare-Jobs script's Jobs go."""
REST_NAMESPACE = "bench-rest"
PEER_NAMESPACE = "bench-argo"
"""The namespace of the peer leg's Argo Workflows (only on a cluster started with it)."""
"""Where the finished runs of the at-rest case go."""
SHARDS_LOST = "agentrun_shard_changes_total"
LEASE_NAMESPACE = "default"
"""The replicas' namespace (AGENTRUN_OPERATOR_NAMESPACE): their Leases, and the signing key
that the single operator keeps there too."""


def shard_env(shards: int, identity: str) -> dict[str, str]:
    """The settings of a replica sharing the runs with others, in ``shards`` shards."""
    return {
        "AGENTRUN_SHARDS": str(shards),
        "AGENTRUN_IDENTITY": identity,
        "AGENTRUN_OPERATOR_NAMESPACE": LEASE_NAMESPACE,
    }


def sample(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of the sample ``name`` with exactly ``labels`` (none by default) in a
    /metrics text; None if absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == dict(labels or {}):
                return float(s.value)
    return None


def scrape(
    operator: OperatorProcess, name: str, labels: Mapping[str, str] | None = None
) -> float | None:
    """:func:`sample` of ``operator``'s /metrics as it answers now. Raises OSError when it
    does not answer."""
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as answer:
        return sample(answer.read().decode(), name, labels)


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
        runtime: str = "process",
        namespaces: tuple[str, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.namespaces = (RUNS_NAMESPACE, BARE_NAMESPACE, REST_NAMESPACE, *namespaces)
        self.processes: dict[str, Callable[[], int | None]] = {}
        """Other processes whose CPU the cases measure (name: a function giving its pid)."""
        self.controller_manager_qps = controller_manager_qps
        self.controller_manager_burst = controller_manager_burst
        self.pool = pool
        self.keep_state = keep_state
        self.cp: ControlPlane | None = None
        self.node: NodeProcess | None = None
        self.operator: OperatorProcess | None = None
        self.operator_env: dict[str, str] = {}
        self.replicas: list[OperatorProcess] = []
        """The replicas sharing the runs (:meth:`start_replicas`), instead of the operator."""
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
            runtime=self.runtime,
        ).start()
        self.kubectl("apply", "--server-side", "-f", "-", input=crd.render())
        wait_established(self.cp.kubectl, self.cp.kubeconfig, "agentruns.agentrun.dev")
        for namespace in self.namespaces:
            self.kubectl("create", "namespace", namespace)
        for namespace in self.namespaces:
            self._wait_default_serviceaccount(namespace)
        self._operator_kubeconfig = self.cp.mint_user_kubeconfig(OPERATOR_USER, ["system:masters"])

    def stop(self) -> None:
        self.stop_replicas()
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
        return self.control_plane.kubectl_output(*args, input=input)

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
        self._operator_starts += 1
        self.operator_env = dict(env)
        self.operator = self._operator_process(env, f"operator-{self._operator_starts}.log")
        return self.operator.start(wait_ready=wait_ready)

    def _operator_process(self, env: Mapping[str, str], log_name: str) -> OperatorProcess:
        if self._operator_kubeconfig is None:
            raise RuntimeError("the bench cluster is not started")
        return OperatorProcess(
            self._operator_kubeconfig,
            all_namespaces=True,
            env=env,
            log_path=self.state_dir / log_name,
            ready_timeout=600.0,
        )

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()
            self.operator = None

    def start_replicas(
        self,
        env: Mapping[str, str],
        count: int,
        shards: int,
        place: Callable[[int, int], None] = lambda index, pid: None,
    ) -> list[OperatorProcess]:
        """``count`` replicas sharing the runs in ``shards`` shards (no other operator must be
        running), each as :data:`OPERATOR_USER` with default settings plus ``env``, each
        given to ``place(index, pid)`` (into its cgroup) before it is waited for. Leases of
        replicas before are deleted first."""
        self.stop_replicas()
        self.delete_shard_leases()
        for index in range(count):
            identity = f"bench-{count}x-{index + 1}"
            replica = self._operator_process(
                {**env, **shard_env(shards, identity)}, f"operator-{identity}.log"
            )
            self.replicas.append(replica)
            replica.start(wait_ready=False)
            assert replica.pid is not None
            place(index, replica.pid)
        for replica in self.replicas:
            replica.wait_ready(600.0)
        return self.replicas

    def operator_sample(self, name: str) -> float | None:
        """The sample ``name`` (no labels) of the operator's /metrics; None when there is no
        operator, it did not answer, or it has no such sample."""
        if self.operator is None or not self.operator.alive():
            return None
        try:
            return scrape(self.operator, name)
        except OSError:
            return None

    def replica_samples(self, name: str, labels: Mapping[str, str] | None = None) -> list[float]:
        """The sample ``name`` (with ``labels``) of each replica's /metrics (-1 when it did
        not answer, 0 when it has no such sample yet)."""
        values: list[float] = []
        for replica in self.replicas:
            try:
                value = scrape(replica, name, labels)
            except OSError:
                values.append(-1.0)
                continue
            values.append(0.0 if value is None else value)
        return values

    def shards_owned(self) -> list[float]:
        """``agentrun_shards_owned`` of each replica (-1 when /metrics did not answer)."""
        return self.replica_samples("agentrun_shards_owned")

    def shards_lost(self) -> float:
        """Shards the replicas stopped deciding so far (``agentrun_shard_changes`` lost):
        given back at a rebalance, or lapsed while their renewals were late."""
        return sum(max(0.0, v) for v in self.replica_samples(SHARDS_LOST, {"change": "lost"}))

    def wait_shards(self, shards: int, timeout: float = 120.0) -> list[float]:
        """Wait until the replicas own every shard between them, each some and none over its
        share (``shards / replicas`` rounded up); what each owns. Raises RuntimeError after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        share = math.ceil(shards / max(1, len(self.replicas)))
        while True:
            owned = self.shards_owned()
            if sum(owned) == shards and min(owned) > 0 and max(owned) <= share:
                return owned
            if time.monotonic() > deadline:
                raise RuntimeError(f"shards owned per replica after {timeout:.0f}s: {owned}")
            time.sleep(0.5)

    def stop_replicas(self) -> None:
        """Stop every replica (each gives its shards back as it stops)."""
        for replica in self.replicas:
            replica.stop()
        self.replicas = []

    def delete_shard_leases(self) -> None:
        kube_client.CoordinationV1Api(self.admin.api_client).delete_collection_namespaced_lease(
            LEASE_NAMESPACE, label_selector=LEASE_LABEL
        )

    # -- what processes cost -----------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        """The processes whose CPU the report shows."""
        found = dict(self.control_plane.pids())
        if self.node is not None and self.node.proc is not None:
            found["local node"] = self.node.proc.pid
        if self.operator is not None and self.operator.pid is not None and self.operator.alive():
            found["operator"] = self.operator.pid
        for index, replica in enumerate(self.replicas, 1):
            if replica.pid is not None and replica.alive():
                found[f"replica {index}"] = replica.pid
        for name, pid_of in self.processes.items():
            pid = pid_of()
            if pid is not None:
                found[name] = pid
        found["benchmark"] = os.getpid()
        return found

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process of :meth:`pids`."""
        seconds: dict[str, float] = {}
        for name, pid in self.pids().items():
            with contextlib.suppress(OSError, ValueError):
                seconds[name] = procstat.cpu_seconds(pid)
        return seconds
