"""Test-suite glue: a cluster to test against, API clients and a kubectl runner.

The pytest fixtures in ``tests/conftest.py`` (shared by tests/integration and tests/e2e) are
thin wrappers around this module; :mod:`agentrun_devcluster.operator` runs the operator.

:func:`start_test_cluster` starts a :class:`~agentrun_devcluster.controlplane.ControlPlane`
plus a :class:`~agentrun_devcluster.node.NodeProcess`, or, when ``AGENTRUN_TEST_KUBECONFIG``
names a kubeconfig, uses that existing cluster and starts nothing.

Audit: the local control plane records creates and deletes of Jobs
(:data:`~agentrun_devcluster.controlplane.AUDIT_POLICY`). :func:`job_creations` counts the
successful creates per Job name, :func:`audit_events` returns the raw events. Both raise
:class:`AuditLogUnavailable` for an external cluster; tests that need them skip with
:data:`AUDIT_LOG_REQUIRED` as the reason (``cluster.require_audit_log()`` does that).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as kube_client
from kubernetes import config as kube_config

from .binaries import BIN_DIR_ENV, resolve_bin_dir
from .controlplane import ControlPlane
from .kubeconfig import request_serviceaccount_kubeconfig
from .node import NodeProcess

__all__ = [
    "AUDIT_LOG_REQUIRED",
    "KEEP_STATE_ENV",
    "TEST_KUBECONFIG_ENV",
    "AuditLogUnavailable",
    "KubeClients",
    "KubectlError",
    "TestCluster",
    "audit_events",
    "job_creations",
    "job_deletions",
    "start_test_cluster",
    "wait_for",
]

#: Use this existing cluster (kubeconfig path) instead of starting one.
TEST_KUBECONFIG_ENV = "AGENTRUN_TEST_KUBECONFIG"
#: Set to 1 to keep the local cluster's state dir (logs, certs, etcd) after the run.
KEEP_STATE_ENV = "AGENTRUN_TEST_KEEP_STATE"

#: Skip reason of tests that count API requests in the audit log.
AUDIT_LOG_REQUIRED = "needs the local control plane's audit log"

_T = TypeVar("_T")


class AuditLogUnavailable(RuntimeError):
    """The cluster under test has no audit log we can read (an external cluster)."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; ``str()`` shows its stdout and stderr."""

    def __str__(self) -> str:
        return (
            f"{' '.join(map(str, self.cmd))} exited with {self.returncode}\n"
            f"stdout: {self.stdout}\nstderr: {self.stderr}"
        )


@dataclass
class KubeClients:
    """Typed API clients for one kubeconfig (not the process-global default config)."""

    api_client: Any
    core: Any  # CoreV1Api
    batch: Any  # BatchV1Api
    custom: Any  # CustomObjectsApi
    apiext: Any  # ApiextensionsV1Api
    rbac: Any  # RbacAuthorizationV1Api

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str) -> KubeClients:
        factory: Callable[..., Any] = kube_config.new_client_from_config
        api_client = factory(config_file=str(kubeconfig))
        return cls(
            api_client=api_client,
            core=kube_client.CoreV1Api(api_client),
            batch=kube_client.BatchV1Api(api_client),
            custom=kube_client.CustomObjectsApi(api_client),
            apiext=kube_client.ApiextensionsV1Api(api_client),
            rbac=kube_client.RbacAuthorizationV1Api(api_client),
        )

    def close(self) -> None:
        self.api_client.close()


@dataclass
class TestCluster:
    """A cluster under test: local (``control_plane`` and ``node`` set) or external."""

    __test__ = False  # not a pytest test class

    kubeconfig: Path
    kubectl_path: str
    bin_dir: Path | None = None
    control_plane: ControlPlane | None = None
    node: NodeProcess | None = None

    @property
    def external(self) -> bool:
        return self.control_plane is None

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for subprocesses: KUBECONFIG set, the bin dir first on PATH."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        if self.bin_dir is not None:
            env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", os.defpath)])
        return env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster (or with another ``kubeconfig``)."""
        cmd = [self.kubectl_path, f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def mint_user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """Client-certificate kubeconfig for ``user``/``groups`` (local cluster only)."""
        if self.control_plane is None:
            raise NotImplementedError("minting user certificates needs the local control plane")
        return self.control_plane.mint_user_kubeconfig(user, groups)

    def mint_serviceaccount_kubeconfig(self, namespace: str, name: str) -> Path:
        """Token kubeconfig for ServiceAccount ``namespace/name`` (TokenRequest API)."""
        if self.control_plane is not None:
            return self.control_plane.mint_serviceaccount_kubeconfig(namespace, name)
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrun-sa-{namespace}-{name}.kubeconfig"
        return request_serviceaccount_kubeconfig(self.kubeconfig, namespace, name, out)

    @property
    def audit_log(self) -> Path | None:
        """The API server's audit log (local control plane only)."""
        return None if self.control_plane is None else self.control_plane.audit_log

    def require_audit_log(self) -> Path:
        """The audit log; in a test, skip it (reason :data:`AUDIT_LOG_REQUIRED`) when the
        cluster is external."""
        if self.control_plane is None:
            import pytest  # only tests call this; keep pytest out of the package's imports

            pytest.skip(AUDIT_LOG_REQUIRED)
        return self.control_plane.audit_log

    def logs(self) -> str:
        """Tails of the component and node logs (empty for an external cluster)."""
        parts = []
        if self.control_plane is not None:
            parts.append(self.control_plane.logs())
        if self.node is not None:
            parts.append(self.node.describe())
        return "\n".join(parts)

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
        if self.control_plane is not None:
            self.control_plane.stop()


def start_test_cluster(
    *, keep_state: bool | None = None, runtime: str = "process", external_ok: bool = True
) -> TestCluster:
    """The cluster to test against; raises (with component logs) if it cannot start.

    ``runtime`` is the local node's container runtime (:mod:`agentrun_devcluster.runtime`);
    with ``external_ok`` false, ``$AGENTRUN_TEST_KUBECONFIG`` is ignored and a local cluster
    is always started."""
    external = os.environ.get(TEST_KUBECONFIG_ENV) if external_ok else None
    if external:
        bin_env = os.environ.get(BIN_DIR_ENV)
        bin_dir = Path(bin_env) if bin_env else None
        kubectl = str(bin_dir / "kubectl") if bin_dir else shutil.which("kubectl") or "kubectl"
        return TestCluster(kubeconfig=Path(external), kubectl_path=kubectl, bin_dir=bin_dir)

    if keep_state is None:
        keep_state = os.environ.get(KEEP_STATE_ENV, "") not in ("", "0", "false")
    bin_dir = resolve_bin_dir()
    cp = ControlPlane(bin_dir, keep_state=keep_state)
    node: NodeProcess | None = None
    try:
        cp.start()
        node = NodeProcess(
            cp.kubeconfig,
            state_dir=cp.state_dir / "node",
            log_path=cp.logs_dir / "node.log",
            runtime=runtime,
        )
        try:
            node.start()
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{cp.logs()}") from None
    except BaseException:
        if node is not None:
            node.stop()
        cp.keep_state = True  # the logs in it explain the failure
        with contextlib.suppress(Exception):
            cp.stop()
        raise
    return TestCluster(
        kubeconfig=cp.kubeconfig,
        kubectl_path=str(cp.kubectl),
        bin_dir=bin_dir,
        control_plane=cp,
        node=node,
    )


def audit_events(
    cluster: TestCluster,
    *,
    verb: str | None = None,
    resource: str | None = None,
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    """Completed requests (stage ResponseComplete) in the API server's audit log, oldest
    first, optionally only those with this ``verb``, ``objectRef.resource`` and namespace.

    Only what :data:`~agentrun_devcluster.controlplane.AUDIT_POLICY` records is there
    (creates and deletes of batch/v1 Jobs). Raises :class:`AuditLogUnavailable` for an
    external cluster. An event is written when its request completes: poll (with
    :func:`wait_for`) rather than read once right after the request.
    """
    path = cluster.audit_log
    if path is None:
        raise AuditLogUnavailable(
            f"{AUDIT_LOG_REQUIRED}: the cluster under test is external "
            f"(${TEST_KUBECONFIG_ENV}); its API server's audit log is not readable here"
        )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []  # nothing audited yet
    events: list[dict[str, Any]] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written right now
        if not isinstance(event, dict) or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        if verb is not None and event.get("verb") != verb:
            continue
        if resource is not None and (ref.get("resource") != resource or ref.get("subresource")):
            continue
        if namespace is not None and ref.get("namespace") != namespace:
            continue
        events.append(event)
    return events


def _count_by_name(events: list[dict[str, Any]], code: int, api_group: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for event in events:
        ref = event.get("objectRef") or {}
        status = event.get("responseStatus") or {}
        if "dryRun=" in str(event.get("requestURI", "")):
            continue  # a dry run stores nothing
        if ref.get("apiGroup") == api_group and status.get("code") == code and ref.get("name"):
            counts[str(ref["name"])] += 1
    return counts


def job_creations(cluster: TestCluster, namespace: str | None = None) -> Counter[str]:
    """How often each Job (by name) was created successfully (HTTP 201), per the audit log.

    Every successful create counts, also of a Job deleted and created again under the same
    name; a create refused with AlreadyExists (409) does not, nor a dry run. Raises
    :class:`AuditLogUnavailable` for an external cluster.

    A create whose client was killed mid-request can be stored by the API server yet audited
    as 504 (context canceled) instead of 201, so it is missing here: callers that kill the
    operator must allow a Job that exists (or ran) with a count of 0, never one above 1.
    """
    events = audit_events(cluster, verb="create", resource="jobs", namespace=namespace)
    return _count_by_name(events, 201, "batch")


def job_deletions(cluster: TestCluster, namespace: str | None = None) -> Counter[str]:
    """How often each Job (by name) was deleted successfully (HTTP 200/202: the delete was
    accepted, even if finalizers keep the Job a while), per the audit log."""
    events = audit_events(cluster, verb="delete", resource="jobs", namespace=namespace)
    return _count_by_name(events, 200, "batch") + _count_by_name(events, 202, "batch")


def wait_for(
    what: str, fn: Callable[[], _T | None], timeout: float = 60.0, interval: float = 0.25
) -> _T:
    """Poll ``fn`` until it returns something truthy and return that; API errors count as
    not yet. Raise ``TimeoutError`` (naming ``what`` and the last error) after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except kube_client.exceptions.ApiException as e:
            last = f"HTTP {e.status}: {e.body}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last})")
        time.sleep(interval)
