"""Argo Workflows on the local control plane: the benchmark's peer leg (``make bench``, ``--only
peer``).

Argo Workflows is the workflow engine most platform teams already run; the benchmark runs the
same busybox steps as Workflows beside the operator's runs and bare Jobs, on one control plane
and one node. This module installs and runs it as a cluster would, with the default settings:

* :func:`argo_bin_dir`: ``workflow-controller`` and ``argoexec`` built by
  ``hack/build-argo.sh`` from the Go module pinned in ``hack/argo/versions.env`` (cached; the
  release's CRDs beside them); :func:`argoexec_image`: argoexec as a local image
  (``hack/build-argoexec-image.sh``), which pods run from the local Docker engine. Argo's pods
  need a node that runs images: the local node's docker runtime.
* :class:`ArgoController`: :meth:`~ArgoController.install` applies the CRDs, makes the
  controller's namespace (:data:`ARGO_NAMESPACE`) and its ConfigMap, and gives the
  ServiceAccount that workflow pods run as in each workload namespace the executor's rights
  (create and patch WorkflowTaskResults, as upstream's quick-start ``executor`` Role);
  :meth:`~ArgoController.start` runs ``workflow-controller`` as a local process (as the
  operator runs in the benchmark), as its own user (:data:`CONTROLLER_USER`, so that the
  audit log tells its requests apart), with leader election on (its default) and waits until
  it leads.

Settings that differ from upstream's install, and why: the controller is a process, not a pod
(as the operator is in the benchmark); its metrics listen on a leased port instead of 9090
(``metricsConfig.port`` in its ConfigMap; the machine may run other things), without TLS
(nothing scrapes them here); the executor image is the local one with pull policy ``Never``
(no registry). Everything else (QPS 20, burst 30, 32 workflow workers, no pod GC, no archive)
is the release's default, unless ``env`` sets one (``make bench --argo-env``). Among them:
the controller handles a workflow at most once per ``DEFAULT_REQUEUE_TIME`` (10 s) after its
pods change (upstream's comment: some users lower it to 2 s), so a sequential step takes 10 s
or more. The controller's healthz stays on upstream's fixed port 6060; if that port is taken
it only logs so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

from .binaries import BinariesError, build_script, run_build_script
from .controlplane import ControlPlane, KubectlFailed, tail, wait_established
from .lifecycle import StartStop
from .ports import PortLease, lease_ports

__all__ = [
    "ARGO_NAMESPACE",
    "CONTROLLER_USER",
    "GROUP",
    "VERSION",
    "ArgoController",
    "ArgoError",
    "DockerUnavailable",
    "argo_bin_dir",
    "argoexec_image",
    "controller_configmap",
    "executor_rbac",
]

ARGO_NAMESPACE = "argo"
"""The controller's namespace: its ConfigMap and its leader-election Lease."""
CONTROLLER_USER = "argo-workflow-controller"
"""The user the controller authenticates as (a client certificate in ``system:masters``)."""
CONFIGMAP = "workflow-controller-configmap"
LEADER_LEASE = "workflow-controller"
EXECUTOR_ROLE = "argo-executor"
GROUP = "argoproj.io"
VERSION = "v1alpha1"
DOCKER_UNAVAILABLE = 3
"""The exit code of hack/docker-up.sh (and so of hack/build-argoexec-image.sh) when no Docker
engine can be had on this machine."""


class ArgoError(RuntimeError):
    """Argo Workflows could not be built, installed or started."""


class DockerUnavailable(ArgoError):
    """No Docker engine can be had here, so no argoexec image and no node to run it."""


def argo_bin_dir() -> Path:
    """The bin dir of ``workflow-controller`` and ``argoexec`` (``hack/build-argo.sh``; its
    sibling ``crds/`` holds the release's CRDs)."""
    script = build_script(name="build-argo.sh")
    if script is None:
        raise BinariesError("hack/build-argo.sh not found")
    return run_build_script(script)


def argoexec_image() -> str:
    """Build (or find cached) the local argoexec image and return its tag; raise
    :class:`DockerUnavailable` (with the reason) where no Docker engine can be had."""
    script = build_script(name="build-argoexec-image.sh")
    if script is None:
        raise BinariesError("hack/build-argoexec-image.sh not found")
    # Its progress (a cold build takes minutes) and its reasons go to our stderr.
    proc = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    if proc.returncode == DOCKER_UNAVAILABLE:
        raise DockerUnavailable(
            "no Docker engine can be had on this machine (hack/docker-up.sh said why above)"
        )
    if proc.returncode != 0:
        raise ArgoError(f"{script} failed with exit code {proc.returncode} (see stderr)")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ArgoError(f"{script} printed no image")
    return lines[-1]


def executor_rbac(namespace: str, service_account: str = "default") -> list[dict[str, object]]:
    """The Role and RoleBinding that let workflow pods in ``namespace`` report their results
    (upstream's quick-start ``executor`` Role: WorkflowTaskResults, create and patch)."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": EXECUTOR_ROLE, "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": ["workflowtaskresults"],
                    "verbs": ["create", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": EXECUTOR_ROLE, "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": EXECUTOR_ROLE,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
    ]


def controller_configmap(metrics_port: int) -> dict[str, object]:
    """The controller's ConfigMap: the defaults, but metrics on ``metrics_port`` without TLS."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": ARGO_NAMESPACE},
        "data": {"metricsConfig": f"port: {metrics_port}\nsecure: false\n"},
    }


class ArgoController(StartStop):
    """Argo Workflows' controller for the workflows of ``namespaces`` (see the module doc)."""

    def __init__(
        self,
        cp: ControlPlane,
        bin_dir: Path,
        executor_image: str,
        namespaces: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.cp = cp
        self.env = dict(env or {})
        """Settings of the controller's environment (e.g. ``DEFAULT_REQUEUE_TIME``)."""
        self.bin_dir = bin_dir
        self.executor_image = executor_image
        self.namespaces = tuple(namespaces)
        self.log_path = log_path
        self.identity = f"bench-{os.getpid()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._ports: PortLease | None = None

    @property
    def crd_dir(self) -> Path:
        return self.bin_dir.parent / "crds"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def install(self) -> Self:
        """The CRDs, the controller's namespace and ConfigMap, the executor's rights."""
        crds = sorted(self.crd_dir.glob("*.yaml"))
        if not crds:
            raise ArgoError(f"no CRDs in {self.crd_dir} (hack/build-argo.sh puts them there)")
        kubectl = self.cp.kubectl_output
        for crd in crds:
            kubectl("apply", "--server-side", "-f", str(crd))
        for name in ("workflows", "workflowtaskresults"):
            wait_established(self.cp.kubectl, self.cp.kubeconfig, f"{name}.{GROUP}")
        kubectl("create", "namespace", ARGO_NAMESPACE)
        self._ports = lease_ports(1)
        objects: list[dict[str, object]] = [controller_configmap(self._ports.port)]
        for namespace in self.namespaces:
            objects += executor_rbac(namespace)
        listed = {"apiVersion": "v1", "kind": "List", "items": objects}
        kubectl("apply", "-f", "-", input=json.dumps(listed))
        return self

    def argv(self, kubeconfig: Path) -> list[str]:
        return [
            str(self.bin_dir / "workflow-controller"),
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            ARGO_NAMESPACE,
            "--configmap",
            CONFIGMAP,
            "--executor-image",
            self.executor_image,
            "--executor-image-pull-policy",
            "Never",
        ]

    def start(self, timeout: float = 90.0) -> Self:
        """Start the controller and wait until it holds its leader Lease (it runs workflows
        only from then on). A controller already running is left as it is."""
        if self.alive():
            return self
        kubeconfig = self.cp.mint_user_kubeconfig(CONTROLLER_USER, ["system:masters"])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
        env.update(self.env)
        env["LEADER_ELECTION_IDENTITY"] = self.identity
        self.proc = subprocess.Popen(
            self.argv(kubeconfig),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ArgoError(
                    f"workflow-controller exited with {self.proc.returncode}:\n{self.logs()}"
                )
            if self.leading():
                return self
            time.sleep(0.5)
        raise ArgoError(f"workflow-controller did not lead within {timeout:.0f} s:\n{self.logs()}")

    def leading(self) -> bool:
        """The controller's leader Lease names this controller."""
        try:
            holder = self.cp.kubectl_output(
                "get", "lease", "-n", ARGO_NAMESPACE, LEADER_LEASE,
                "-o", "jsonpath={.spec.holderIdentity}", timeout=30,
            )  # fmt: skip
        except KubectlFailed:  # not made yet
            return False
        return holder.strip() == self.identity

    def logs(self, lines: int = 60) -> str:
        return tail(self.log_path, lines) or "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._ports is not None:
            self._ports.release()
            self._ports = None
