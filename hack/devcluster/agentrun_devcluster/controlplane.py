"""A real, node-less Kubernetes control plane run as local processes, for tests.

:class:`ControlPlane` starts etcd, kube-apiserver and kube-controller-manager (binaries
built by ``hack/build-controlplane.sh``) on 127.0.0.1 with leased ports
(:mod:`agentrun_devcluster.ports`: no other process takes them first) and a private state
directory, waits until they are healthy and writes an admin kubeconfig. There is no
kube-scheduler and no kubelet: :mod:`agentrun_devcluster.node` provides a stand-in node
that binds and runs pods as local processes.

Reaching nodes (``pods/exec``, ``pods/attach``): kube-apiserver dials a node at its
``InternalIP`` (``--kubelet-preferred-address-types``; the default would try the Node's
``Hostname`` first, which does not resolve here), presents the client certificate
:data:`~agentrun_devcluster.streaming.API_SERVER_CLIENT` (``--kubelet-client-certificate``)
and checks the node's serving certificate against the cluster CA
(``--kubelet-certificate-authority``), which kube-controller-manager's
``certificatesigningrequest-signing-controller`` signs nodes' serving certificates with
(``--cluster-signing-kubelet-serving-{cert,key}-file``: the kubelet-serving signer only; see
:mod:`agentrun_devcluster.servingcert`).

Typical use::

    with ControlPlane(bin_dir) as cp:
        print(cp.kubeconfig)                    # admin (CN=admin, O=system:masters)
        alice = cp.mint_user_kubeconfig("alice", ["dev"])
        sa = cp.mint_serviceaccount_kubeconfig("default", "default")
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

from .kubeconfig import request_serviceaccount_kubeconfig, write_kubeconfig
from .lifecycle import StartStop, http_answer, wait_answer
from .pki import PKI, CertPair
from .ports import PortLease, lease_ports, retry_port_clash
from .streaming import API_SERVER_CLIENT

__all__ = [
    "AUDIT_POLICY",
    "DEFAULT_CONTROLLERS",
    "SERVICE_ACCOUNT_ISSUER",
    "SERVICE_CLUSTER_IP_RANGE",
    "ApiServer",
    "ControlPlane",
    "ControlPlaneError",
    "apiserver_flags",
    "controller_manager_flags",
    "etcd_flags",
]

log = logging.getLogger(__name__)

#: kube-controller-manager controllers we run (1.37 names; see ``--controllers`` in --help).
#: No node-lifecycle controller: it would taint and evict the stand-in node's pods.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "job-controller",
    "cronjob-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "validatingadmissionpolicy-status-controller",
    # Signs the local node's serving certificate (kubelet-serving signer only).
    "certificatesigningrequest-signing-controller",
    "replicaset-controller",
    "deployment-controller",
    "resourcequota-controller",
    "pod-garbage-collector-controller",
)
#: Audit policy of the local API server (always on): only creates and deletes of batch/v1 Jobs,
#: at Metadata level (who, what, when, response code; no bodies), and nothing else. Enough
#: for tests to count how often each Job was created (invariant 1: at most once per attempt).
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, delete]
    resources:
      - group: batch
        resources: [jobs]
  - level: None
"""
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
LOG_TAIL_LINES = 60

_BodyCheck = Callable[[bytes], bool]


@dataclass(frozen=True)
class _Probe:
    """Where a component answers when it is healthy, and what a healthy answer looks like."""

    url: str
    context: ssl.SSLContext | None
    ok: _BodyCheck


class ControlPlaneError(RuntimeError):
    """A component failed to start or become healthy; the message carries the log tails."""


class KubectlFailed(RuntimeError):
    """A kubectl command of :meth:`ControlPlane.kubectl_output` failed."""


def wait_established(
    kubectl: Path | str, kubeconfig: Path | str, crd: str, timeout: float = 60.0
) -> None:
    """Wait until CRD ``crd`` is Established. ``kubectl wait --for=condition=...`` fails at
    once (".status.conditions accessor error") while the CRD has no conditions yet, so it is
    asked again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(int(deadline - time.monotonic()), 1)
        proc = subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig}", "wait", "--for=condition=Established",
             f"crd/{crd}", f"--timeout={left}s"],
            capture_output=True, text=True, timeout=left + 30,
        )  # fmt: skip
        if proc.returncode == 0:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"CRD {crd} not Established within {timeout:.0f}s: {proc.stderr}")
        time.sleep(0.5)


def tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a text file (empty if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    lease: PortLease
    """The ports it listens on, held until :meth:`stop`."""
    proc: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    def start(self, env: Mapping[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"--- {time.strftime('%FT%T')} {' '.join(self.argv)}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,  # own process group: stop() signals the whole group
        )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", self.name, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            # Leftover children in the group (none expected) must not outlive us.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.lease.release()

    def wait_healthy(self, probe: _Probe, timeout: float, logs: Callable[[], str]) -> None:
        """Poll ``probe`` until it answers healthy; raise :class:`ControlPlaneError` with
        ``logs()`` (the log tails) if the process exits or ``timeout`` seconds pass."""
        wait_answer(
            lambda: http_answer(probe.url, probe.ok, context=probe.context),
            exit_code=self.exited,
            timeout=timeout,
            what=self.name,
            where=f"at {probe.url}",
            error=lambda message: ControlPlaneError(f"{message}\n{logs()}"),
        )

    def describe(self) -> str:
        code = self.exited()
        state = (
            "not started"
            if self.proc is None
            else ("running" if code is None else f"exited with code {code}")
        )
        return f"--- {self.name} ({state}); last lines of {self.log_path}:\n{tail(self.log_path)}"


@dataclass(frozen=True)
class _ApiServerPki:
    """The certificates every kube-apiserver of a control plane serves and trusts."""

    serving: CertPair
    service_account: CertPair
    admin: CertPair
    front_proxy: CertPair
    kubelet_client: CertPair
    """The client certificate it reaches nodes with (exec, attach)."""


@dataclass
class ApiServer:
    """A kube-apiserver added to a running control plane (:meth:`ControlPlane.add_apiserver`):
    its URL, an admin kubeconfig naming it, and :meth:`stop`."""

    name: str
    server: str
    kubeconfig: Path
    _stop: Callable[[], None] = field(repr=False)

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL); the control plane's other components go on."""
        self._stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ControlPlane(StartStop):
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, as a context manager.

    ``bin_dir`` holds ``etcd``, ``kube-apiserver``, ``kube-controller-manager`` and
    ``kubectl``. ``state_dir``: where certificates, etcd data, logs and kubeconfigs go; if
    omitted a temporary directory is used and removed by :meth:`stop` unless
    ``keep_state`` or the start failed (its logs tell why). A given ``state_dir`` is never
    removed, and its PKI and etcd data are reused by the next start (so a cluster survives
    ``up``/``down`` cycles).

    After :meth:`start`: :attr:`kubeconfig` (admin), :attr:`server`, :attr:`timings`
    (seconds until each component was healthy) and :attr:`time_to_ready` (total).

    ``controller_manager_qps`` / ``controller_manager_burst``: the kube-controller-manager's
    API client rate limit (``--kube-api-qps`` / ``--kube-api-burst``). Its defaults upstream
    (20 and 30) cap how fast the Job controller creates pods and tracks their completion, and
    so the Job throughput of the local cluster; here they default to 100 and 200. Flags in
    ``extra_controller_manager_args`` come after these and so take precedence.

    Audit logging is always on: :data:`AUDIT_POLICY` (creates and deletes of batch/v1 Jobs at
    Metadata level, nothing else) written as JSON lines to :attr:`audit_log`
    (``<state_dir>/audit.log``, appended across restarts, never rotated). ``audit_policy``
    replaces that policy (the text of an ``audit.k8s.io/v1`` Policy): the benchmark
    (:mod:`agentrun_devcluster.bench`) records every request with it. Tests keep the default,
    whose log stays small.
    """

    def __init__(
        self,
        bin_dir: Path | str,
        *,
        state_dir: Path | str | None = None,
        keep_state: bool = False,
        start_timeout: float = 180.0,
        stop_timeout: float = 15.0,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
        controller_manager_qps: int = 100,
        controller_manager_burst: int = 200,
        audit_policy: str = AUDIT_POLICY,
    ) -> None:
        self.bin_dir = Path(bin_dir).resolve()
        for tool in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"):
            if not os.access(self.bin_dir / tool, os.X_OK):
                raise ControlPlaneError(f"{self.bin_dir / tool} is missing or not executable")
        self._own_state_dir = state_dir is None
        self.state_dir = (
            Path(tempfile.mkdtemp(prefix="agentrun-cp-")) if state_dir is None else Path(state_dir)
        ).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.keep_state = keep_state
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.controllers = tuple(controllers)
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.extra_controller_manager_args = tuple(extra_controller_manager_args)
        self.controller_manager_qps = controller_manager_qps
        self.controller_manager_burst = controller_manager_burst
        self.audit_policy_text = audit_policy

        self.pki = PKI(self.state_dir / "pki")
        self.logs_dir = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.audit_log = self.state_dir / "audit.log"
        self.audit_policy = self.state_dir / "audit-policy.yaml"
        self.server = ""
        self.etcd_url = ""
        """etcd's client URL (``http://127.0.0.1:PORT``) once started."""
        self.timings: dict[str, float] = {}
        self.time_to_ready = 0.0
        self._components: list[_Component] = []
        self._apiserver_pki: _ApiServerPki | None = None
        self._started = False
        self._failed = False

    # -- public API ------------------------------------------------------------------------

    @property
    def kubectl(self) -> Path:
        """Path of the kubectl binary built with the control plane."""
        return self.bin_dir / "kubectl"

    def kubectl_output(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        """Run kubectl as admin against this control plane and return its output; raise
        :class:`KubectlFailed` (with kubectl's stderr) when it fails."""
        proc = subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise KubectlFailed(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for subprocesses: KUBECONFIG=admin, the bin dir first on PATH."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", os.defpath)])
        return env

    def start(self) -> Self:
        """Start all components and wait until healthy; raise :class:`ControlPlaneError`."""
        if self._started:
            return self
        try:
            retry_port_clash(self._start_once, what="the control plane")
        except ControlPlaneError as e:
            self._failed = True  # keep the state dir: its logs explain the failure
            raise ControlPlaneError(f"{e}\n(state dir kept: {self.state_dir})") from None
        self._started = True
        return self

    def stop(self) -> None:
        """Stop all components (SIGTERM, then SIGKILL) and remove a temporary state dir."""
        self._stop_components()
        self._started = False
        if self._own_state_dir and not self.keep_state and not self._failed:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def logs(self) -> str:
        """The tail of every component's log, for error messages."""
        return "\n".join(c.describe() for c in self._components)

    def pids(self) -> dict[str, int]:
        """The process id of each running component, by name (``etcd``, ``kube-apiserver``,
        ``kube-controller-manager``)."""
        return {
            c.name: c.proc.pid
            for c in self._components
            if c.proc is not None and c.exited() is None
        }

    def compact_etcd(self, defragment: bool = True) -> int:
        """Compact etcd's history up to its current revision, as the API server does every
        five minutes, and (``defragment``) give the space back; the revision compacted to.
        Through etcd's JSON gateway on its client URL: no etcdctl needed."""
        self._require_started()

        def call(path: str, body: Mapping[str, object]) -> dict[str, object]:
            request = urllib.request.Request(
                f"{self.etcd_url}{path}", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(request, timeout=60) as answer:
                answered: dict[str, object] = json.loads(answer.read() or b"{}")
                return answered

        header = call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
        revision = int(header["revision"])  # type: ignore[index]
        call("/v3/kv/compaction", {"revision": revision, "physical": True})
        if defragment:
            call("/v3/maintenance/defragment", {})
        return revision

    def add_apiserver(
        self, etcd_url: str | None = None, extra_args: Sequence[str] = ()
    ) -> ApiServer:
        """Start one more kube-apiserver beside the first, as in a highly available control
        plane: the same certificates, flags and audit log, a port of its own, on this control
        plane's etcd or on ``etcd_url`` (a :class:`~agentrun_devcluster.forwarder.Forwarder`
        in front of etcd makes a slow link to etcd for this API server alone), with
        ``extra_args`` after the control plane's own flags. Returns it once
        ready, with an admin kubeconfig naming it; the controller manager and the node stay on
        the first. Stopped by its :meth:`ApiServer.stop` (or ``with`` block) or by
        :meth:`stop`."""
        self._require_started()
        index = 2
        while any(c.name == f"kube-apiserver-{index}" for c in self._components):
            index += 1
        name = f"kube-apiserver-{index}"
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}

        # The first API server's certificates, not new ones: it watches its files and would
        # serve a key that no longer matches its certificate if they were issued again.
        pki = self._apiserver_pki
        assert pki is not None  # set when the first API server started

        def launch() -> str:
            try:
                return self._launch_apiserver(
                    env, etcd_url or self.etcd_url, name, f"{name}-certs", pki, extra_args
                )
            except BaseException:
                self._drop_component(name)  # and its port lease
                raise

        server = retry_port_clash(launch, what=name)
        kubeconfig = self._write_kubeconfig(
            self.state_dir / f"admin-{index}.kubeconfig", "admin", pki.admin, server=server
        )
        return ApiServer(name, server, kubeconfig, lambda: self._drop_component(name))

    def check_alive(self) -> None:
        """Raise :class:`ControlPlaneError` if a component has exited."""
        dead = [c for c in self._components if c.exited() is not None]
        if dead:
            raise ControlPlaneError(
                f"control plane component(s) exited: {', '.join(c.name for c in dead)}\n"
                + self.logs()
            )

    def mint_user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` by client certificate."""
        self._require_started()
        pair = self.pki.client_cert(user, list(groups))
        path = self.state_dir / "kubeconfigs" / f"{pair.cert.stem}.kubeconfig"
        return write_kubeconfig(
            path,
            server=self.server,
            ca_pem=self.pki.ca_pem,
            user=user,
            client_cert_pem=pair.cert.read_bytes(),
            client_key_pem=pair.key.read_bytes(),
        )

    def mint_serviceaccount_kubeconfig(
        self, namespace: str, name: str, *, expiration_seconds: int = 24 * 3600
    ) -> Path:
        """A kubeconfig with a bound token for ServiceAccount ``namespace/name``.

        The token comes from the TokenRequest API (``serviceaccounts/token`` subresource),
        so it authenticates as ``system:serviceaccount:<namespace>:<name>``.
        """
        self._require_started()
        return request_serviceaccount_kubeconfig(
            self.kubeconfig,
            namespace,
            name,
            self.state_dir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig",
            expiration_seconds=expiration_seconds,
        )

    # -- internals -------------------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._started:
            raise ControlPlaneError("the control plane is not running")

    def _drop_component(self, name: str) -> None:
        """Stop every component called ``name`` and forget it."""
        for comp in [c for c in self._components if c.name == name]:
            comp.stop(self.stop_timeout)
            self._components.remove(comp)

    def _stop_components(self) -> None:
        for comp in reversed(self._components):
            comp.stop(self.stop_timeout)

    def _start_once(self) -> None:
        """Start every component on newly leased ports; on failure, stop what was started."""
        self._components = []
        self.timings = {}
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
        try:
            etcd_url = self.etcd_url = self._start_etcd(env)
            self.timings["etcd"] = time.monotonic() - t0
            self._start_apiserver(env, etcd_url)
            self.timings["kube-apiserver"] = time.monotonic() - t0
            self._start_controller_manager(env)
            self.timings["kube-controller-manager"] = time.monotonic() - t0
        except BaseException:
            self._stop_components()
            raise
        self.time_to_ready = time.monotonic() - t0
        self._write_cluster_info()
        log.info(
            "control plane ready at %s in %.1fs (%s)",
            self.server,
            self.time_to_ready,
            ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()),
        )

    def _start_component(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        probe: _Probe,
        lease: PortLease,
    ) -> None:
        """Start ``name`` (logging to ``<logs>/<name>.log``, holding ``lease`` until it stops)
        and wait until ``probe`` says it is healthy; the error on failure carries every
        component's log tail."""
        comp = _Component(name, argv, self.logs_dir / f"{name}.log", lease)
        self._components.append(comp)
        comp.start(env)
        comp.wait_healthy(probe, self.start_timeout, self.logs)

    def _start_etcd(self, env: Mapping[str, str]) -> str:
        """Start etcd; return its client URL."""
        lease = lease_ports(2)
        client_port, peer_port = lease.ports
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._start_component(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                *etcd_flags(self.state_dir / "etcd", client_url, peer_url),
            ],
            env,
            _Probe(f"{client_url}/health", None, lambda body: b'"true"' in body),
            lease,
        )
        return client_url

    def _start_apiserver(self, env: Mapping[str, str], etcd_url: str) -> None:
        """Start kube-apiserver on etcd at ``etcd_url``; set :attr:`server` and write the
        admin kubeconfig once it is ready."""
        self._apiserver_pki = _ApiServerPki(
            serving=self.pki.apiserver_cert(),
            service_account=self.pki.service_account_keys(),
            admin=self.pki.client_cert("admin", ["system:masters"]),
            # Front-proxy (request-header) client, as kubeadm sets up: enables aggregated
            # APIs, and delegated authentication in the controller-manager finds a CA bundle.
            front_proxy=self.pki.client_cert("front-proxy-client"),
            # No groups: the certificate is good for nodes, and nothing on the API server.
            kubelet_client=self.pki.client_cert(API_SERVER_CLIENT),
        )
        self.audit_policy.write_text(self.audit_policy_text)
        self.server = self._launch_apiserver(
            env, etcd_url, "kube-apiserver", "apiserver-certs", self._apiserver_pki
        )
        self._write_kubeconfig(self.kubeconfig, "admin", self._apiserver_pki.admin)

    def _launch_apiserver(
        self,
        env: Mapping[str, str],
        etcd_url: str,
        name: str,
        cert_dir: str,
        pki: _ApiServerPki,
        extra_args: Sequence[str] = (),
    ) -> str:
        """Start a kube-apiserver component ``name`` on etcd at ``etcd_url`` and a port of its
        own with the certificates ``pki`` (and ``extra_args`` last); return its URL once it
        is ready."""
        lease = lease_ports(1)
        port = lease.port
        server = f"https://127.0.0.1:{port}"
        flags = apiserver_flags(
            etcd_url,
            port=port,
            cert_dir=self.state_dir / cert_dir,
            serving=pki.serving,
            client_ca=self.pki.ca.cert,
            service_account=pki.service_account,
            front_proxy=pki.front_proxy,
            audit_policy=self.audit_policy,
            audit_log=self.audit_log,
            kubelet_client=pki.kubelet_client,
        )
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            *flags,
            *self.extra_apiserver_args,
            *extra_args,
        ]
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        ready = _Probe(f"{server}/readyz", ctx, lambda body: body.strip() == b"ok")
        self._start_component(name, argv, env, ready, lease)
        return server

    def _start_controller_manager(self, env: Mapping[str, str]) -> None:
        """Start kube-controller-manager against the running API server."""
        # With --use-service-account-credentials=false all controllers share this identity,
        # which then needs every controller's rights: simplest is system:masters.
        user = "system:kube-controller-manager"
        cert = self.pki.client_cert(user, ["system:masters"])
        kubeconfig = self._write_kubeconfig(
            self.state_dir / "controller-manager.kubeconfig", user, cert
        )
        lease = lease_ports(1)
        port = lease.port
        flags = controller_manager_flags(
            kubeconfig,
            port=port,
            cert_dir=self.state_dir / "controller-manager-certs",
            controllers=self.controllers,
            service_account_key=self.pki.service_account_keys().key,
            root_ca=self.pki.ca.cert,
            qps=self.controller_manager_qps,
            burst=self.controller_manager_burst,
            kubelet_serving_signer=self.pki.ca,
        )
        # Its serving certificate is self-signed: the health probe does not verify it.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._start_component(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                *flags,
                *self.extra_controller_manager_args,
            ],
            env,
            _Probe(f"https://127.0.0.1:{port}/healthz", insecure, lambda b: b.strip() == b"ok"),
            lease,
        )

    def _write_kubeconfig(
        self, path: Path, user: str, cert: CertPair, server: str | None = None
    ) -> Path:
        return write_kubeconfig(
            path,
            server=server or self.server,
            ca_pem=self.pki.ca_pem,
            user=user,
            client_cert_pem=cert.cert.read_bytes(),
            client_key_pem=cert.key.read_bytes(),
        )

    def _write_cluster_info(self) -> None:
        """``<state_dir>/cluster.json``: server, kubeconfig, pids and timings, for ``info``."""
        (self.state_dir / "cluster.json").write_text(
            json.dumps(
                {
                    "server": self.server,
                    "kubeconfig": str(self.kubeconfig),
                    "audit_log": str(self.audit_log),
                    "bin_dir": str(self.bin_dir),
                    "pids": {c.name: c.proc.pid for c in self._components if c.proc},
                    "timings": self.timings,
                },
                indent=2,
            )
        )


def etcd_flags(data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """Flags of a single-member etcd keeping its data in ``data_dir``."""
    return [
        "--name=agentrun",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=agentrun={peer_url}",
        "--unsafe-no-fsync=true",  # test data: speed over durability
        "--log-level=warn",
    ]


def apiserver_flags(
    etcd_url: str,
    *,
    port: int,
    cert_dir: Path,
    serving: CertPair,
    client_ca: Path,
    service_account: CertPair,
    front_proxy: CertPair,
    audit_policy: Path,
    audit_log: Path,
    kubelet_client: CertPair | None = None,
) -> list[str]:
    """Flags of kube-apiserver on 127.0.0.1:``port``: client certificates signed by
    ``client_ca`` authenticate, Node and RBAC authorize, audit to ``audit_log``; with
    ``kubelet_client``, nodes are reached at their InternalIP with that client certificate,
    their serving certificates checked against ``client_ca`` (the cluster CA)."""
    kubelet = (
        [
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={client_ca}",
        ]
        if kubelet_client is not None
        else []
    )
    return [
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={client_ca}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={service_account.cert}",
        f"--service-account-signing-key-file={service_account.key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        f"--requestheader-client-ca-file={client_ca}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={front_proxy.cert}",
        f"--proxy-client-key-file={front_proxy.key}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        # Endpoints may not hold loopback addresses; nothing needs them here.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        f"--audit-policy-file={audit_policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",  # written synchronously by the request handler
        "--audit-log-maxsize=0",  # never rotated: tests read the whole file
        *kubelet,
    ]


def controller_manager_flags(
    kubeconfig: Path,
    *,
    port: int,
    cert_dir: Path,
    controllers: Sequence[str],
    service_account_key: Path,
    root_ca: Path,
    qps: int,
    burst: int,
    kubelet_serving_signer: CertPair | None = None,
) -> list[str]:
    """Flags of kube-controller-manager: ``controllers`` only, no leader election, one
    identity for all controllers, its API client limited to ``qps`` requests per second
    with bursts of ``burst``; with ``kubelet_serving_signer`` (a CA), the CSR signing
    controller signs nodes' serving certificates (``kubernetes.io/kubelet-serving``) with
    it, and nothing else."""
    signer = (
        [
            f"--cluster-signing-kubelet-serving-cert-file={kubelet_serving_signer.cert}",
            f"--cluster-signing-kubelet-serving-key-file={kubelet_serving_signer.key}",
        ]
        if kubelet_serving_signer is not None
        else []
    )
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        f"--controllers={','.join(controllers)}",
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={root_ca}",
        "--use-service-account-credentials=false",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        *signer,
        f"--kube-api-qps={qps}",
        f"--kube-api-burst={burst}",
    ]
