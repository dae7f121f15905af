"""A local "node" for the dev/test control plane: a kubelet stand-in that runs pods.

THIS IS A TEST STAND-IN, NOT A KUBELET. It exists so that Jobs created against the local
control plane (:mod:`agentrun_devcluster.controlplane`, which has no scheduler and no
kubelet) actually run and report status the way a kubelet would. Each concern has its own
module, whose docstring says what it does like a kubelet and where it differs:

* :mod:`~agentrun_devcluster.runtime`: how containers run, chosen here by ``runtime``
  (``--runtime process|docker|auto``, :func:`select_runtime`): as local processes (the
  default, and the fallback of ``auto`` where no Docker engine answers) or as Docker
  containers (:mod:`~agentrun_devcluster.dockercontainer`, with
  :mod:`~agentrun_devcluster.volumes` and :mod:`~agentrun_devcluster.probes`). The node
  logs which one it uses and why, and labels its Node with it.

* :mod:`~agentrun_devcluster.registration`: the Node object (Ready condition, allocatable
  cpu/memory/pods), its heartbeats and Lease, and scheduling: binding every unscheduled pod
  to this node.
* :mod:`~agentrun_devcluster.pod`: one pod's lifecycle (init containers in order, then the
  regular containers concurrently, sidecars, deadlines, deletion) and its status.
* :mod:`~agentrun_devcluster.process`: a container as a local process: no images, no
  isolation, its command line, environment, output and termination message.
* :mod:`~agentrun_devcluster.podenv`: ``env``/``envFrom`` resolution (pure).
* :mod:`~agentrun_devcluster.serviceaccount`: the service-account token volume, the only
  volume the process runtime materializes (it ignores every other volume and mount).
* :mod:`~agentrun_devcluster.streaming`: ``pods/exec`` and ``pods/attach``, as the API server
  proxies them to a node, over HTTPS with a serving certificate the cluster signs
  (:mod:`~agentrun_devcluster.servingcert`), for containers of the process runtime.

This module wires them: :class:`LocalNode` registers the Node, gets its serving certificate
and starts its streaming server in the background (the Node advertises the server's port once
it serves; until then, or if the control plane signs no certificate, exec and attach find no
node to reach), lists and watches all pods
(relisting every ``resync_seconds``), binds the unscheduled ones, starts a
:class:`~agentrun_devcluster.pod.PodRunner` for each new pod bound to it, kills a pod's
containers when it gets a deletionTimestamp, and finishes deletions. :func:`run_node` runs
one in the foreground, :class:`NodeProcess` in a child process.

Differences from a kubelet at this level: a pod found ``Running`` on this node that this
process did not start (the node was restarted) is marked Failed with reason
``NodeRestarted`` (the docker runtime first removes the containers a previous node left).
On shutdown (SIGTERM/SIGINT) the node kills its pods' containers and marks those pods
Failed with reason ``NodeShutdown``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Self

import yaml

from .binaries import cache_root
from .dockerapi import DockerError, engine_from_env
from .dockercontainer import DockerRuntime
from .kubeapi import JSON, KubeApi
from .lifecycle import StartStop, wait_answer
from .pod import TERMINAL_PHASES, PodRunner, report_lost
from .pod import delete_now as delete_pod_now
from .podenv import ConfigError, expand_vars
from .process import (
    TERMINATION_MESSAGE_ENV,
    ContainerProcess,
    ExecContext,
    ProcessRuntime,
    exit_code_of,
    read_termination_message,
    tail_bytes,
)
from .registration import NODE_IP, RUNTIME_LABEL, NodeRegistration, default_capacity
from .registration import bind as bind_pod
from .runtime import RUNTIMES, ContainerRuntime, RuntimeUnavailable
from .serviceaccount import (
    SERVICEACCOUNT_DIR_ENV,
    SERVICEACCOUNT_MOUNT_PATH,
    kubeconfig_ca,
    service_account_volume,
    service_endpoint,
)
from .servingcert import request_serving_certificate
from .streaming import NotServed, StreamingServer

__all__ = [
    "DEFAULT_NODE_NAME",
    "SERVICEACCOUNT_DIR_ENV",
    "SERVICEACCOUNT_MOUNT_PATH",
    "TERMINATION_MESSAGE_ENV",
    "ConfigError",
    "LocalNode",
    "NodeProcess",
    "exit_code_of",
    "expand_vars",
    "read_termination_message",
    "run_node",
    "select_runtime",
    "service_account_volume",
]

log = logging.getLogger(__name__)

DEFAULT_NODE_NAME = "agentrun-local-node"


def select_runtime(choice: str, state_dir: Path) -> tuple[ContainerRuntime, str]:
    """The runtime for ``--runtime choice`` of the node whose state is in ``state_dir``, and
    why it was chosen; raises :class:`RuntimeUnavailable` for ``docker`` when no engine
    answers."""
    if choice not in RUNTIMES:
        raise RuntimeUnavailable(f"--runtime {choice!r}: expected one of {', '.join(RUNTIMES)}")
    if choice == "process":
        return ProcessRuntime(), "--runtime process"
    try:
        engine = engine_from_env()
        info = engine.info()
    except DockerError as e:
        if choice == "docker":
            raise RuntimeUnavailable(f"--runtime docker: {e}") from e
        return ProcessRuntime(), f"--runtime auto: no Docker engine ({e})"
    runtime = DockerRuntime(
        engine, str(state_dir), server_version=str(info.get("ServerVersion", ""))
    )
    return runtime, f"--runtime {choice}: Docker engine {runtime.version} at {engine.address}"


class LocalNode:
    """Registers a Node and runs the pods bound to it (see module doc) with ``runtime``: a
    ``--runtime`` choice (``process``, ``docker``, ``auto``; ``docker`` raises
    :class:`~agentrun_devcluster.runtime.RuntimeUnavailable` when no engine answers) or a
    :class:`~agentrun_devcluster.runtime.ContainerRuntime`.

    ``run(stop)`` blocks until ``stop`` is set; it survives API errors (logs and retries)
    and never crashes on one bad pod. Use a kubeconfig with cluster-admin rights: the node
    must see and bind unscheduled pods of every namespace, which the Node authorizer would
    not allow a real ``system:node:<name>`` identity.
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        *,
        name: str = DEFAULT_NODE_NAME,
        state_dir: Path | str | None = None,
        resync_seconds: int = 30,
        heartbeat_seconds: float = 10.0,
        capacity: Mapping[str, str] | None = None,
        config_error_timeout: float = 10.0,
        max_grace_seconds: float = 30.0,
        extra_env: Mapping[str, str] | None = None,
        runtime: str | ContainerRuntime = "process",
    ) -> None:
        self.name = name
        self.state_dir = Path(
            state_dir if state_dir is not None else default_node_state_dir(name)
        ).resolve()
        if isinstance(runtime, str):
            self.runtime, why = select_runtime(runtime, self.state_dir)
        else:
            self.runtime, why = runtime, "given"
        log.info("node %s: container runtime %s (%s)", name, self.runtime.name, why)
        self.api = KubeApi(kubeconfig, user_agent=f"agentrun-local-node/{name}")
        self.resync_seconds = resync_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.capacity = default_capacity()
        self.capacity.update(capacity or {})
        self.config_error_timeout = config_error_timeout
        self.max_grace_seconds = max_grace_seconds
        self.extra_env = dict(extra_env or {})
        # For the service-account token volume: where pods reach the API, and its CA.
        self.service_host, self.service_port = service_endpoint(self.api.host, NODE_IP)
        self.cluster_ca: bytes | None = None
        try:
            self.cluster_ca = kubeconfig_ca(self.api.kubeconfig)
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
            log.warning("no cluster CA from %s (%r); using kube-root-ca.crt", kubeconfig, e)
        self.registration = NodeRegistration(
            self.api,
            name,
            self.capacity,
            runtime=self.runtime.name,
            runtime_version=self.runtime.version,
        )
        self._runners: dict[str, PodRunner] = {}
        self._finished: dict[str, float] = {}  # uid -> when it was handled, for pods not ours
        self._lock = threading.RLock()
        self._stop = threading.Event()
        #: Serves pods/exec and pods/attach once the cluster signed its certificate.
        self.streaming: StreamingServer | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Register, then watch and run pods until ``stop`` is set; then shut down."""
        if stop is not None:
            self._stop = stop
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.runtime.start()
        self._retry_forever("register the node", self.register)
        threads = [
            threading.Thread(
                target=self.registration.heartbeat_loop,
                args=(self._stop, self.heartbeat_seconds),
                name="heartbeat",
                daemon=True,
            ),
            threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True),
            threading.Thread(target=self.serve_streams, name="streaming-setup", daemon=True),
        ]
        for t in threads:
            t.start()
        log.info(
            "node %s ready (container runtime %s); state in %s",
            self.name,
            self.runtime.name,
            self.state_dir,
        )
        self._stop.wait()
        self.shutdown()

    def shutdown(self) -> None:
        """Kill all pod processes and report the pods Failed (best effort)."""
        self._stop.set()
        with self._lock:
            runners = [r for r in self._runners.values() if not r.done.is_set()]
        for r in runners:
            r.request_kill("NodeShutdown", "the agentrun local node shut down", 2.0)
        for r in runners:
            r.join(10)
        if self.streaming is not None:
            self.streaming.stop()
        self.runtime.stop()
        self.api.close()

    def _retry_forever(self, what: str, fn: Callable[[], None]) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                fn()
                return
            except Exception as e:
                log.warning("could not %s (%r); retrying in %.0fs", what, e, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)

    def register(self) -> None:
        """Create (or adopt) the Node, clear the not-ready taint and post a Ready status."""
        self.registration.register()

    # -- exec and attach --------------------------------------------------------------------

    def serve_streams(self) -> None:
        """Get a serving certificate from the cluster, start the streaming server and
        advertise its port on the Node; without a certificate (the control plane signs none,
        or the kubeconfig names no CA to check the API server's client certificate with),
        log why and serve none."""
        if self.cluster_ca is None:
            log.warning("no cluster CA: the node serves no exec or attach")
            return
        cert = request_serving_certificate(
            self.api, self.name, self.state_dir / "pki", addresses=[NODE_IP], timeout=60
        )
        if cert is None or self._stop.is_set():
            log.warning("no serving certificate: the node serves no exec or attach")
            return
        self.streaming = StreamingServer(
            self.find_container, cert, self.cluster_ca, host=NODE_IP, find_log=self.find_log
        )
        self.streaming.start()
        self.registration.kubelet_port = self.streaming.port
        self.registration.heartbeat()  # the port, at once
        log.info("node %s serves exec and attach on %s:%d", self.name, NODE_IP, self.streaming.port)

    def find_log(self, namespace: str, pod: str, container: str) -> tuple[Path, Callable[[], bool]]:
        """The output file of container ``container`` of pod ``namespace/pod`` (running or
        ended, until the pod is deleted), and whether it still runs, for ``pods/log``."""
        c = self._container(namespace, pod, container, ended=True)
        if not isinstance(c, ContainerProcess):
            raise NotServed(501, "the agentrun local node serves logs of its process runtime only")
        return c.log_path, lambda: bool(c.running)

    def _container(self, namespace: str, pod: str, container: str, *, ended: bool) -> Any:
        """Container ``container`` of pod ``namespace/pod`` on this node (of a pod that ended
        too, with ``ended``); raises :class:`NotServed` saying why there is none."""
        with self._lock:
            runners = [
                r
                for r in self._runners.values()
                if r.namespace == namespace and r.pod_name == pod and (ended or not r.done.is_set())
            ]
        if not runners:
            raise NotServed(404, f"pod {namespace}/{pod} does not run on node {self.name}")
        found = [c for c in runners[0].init + runners[0].regular if c.name == container]
        if not found:
            raise NotServed(404, f"container not found ({container!r})")
        return found[0]

    def find_container(self, namespace: str, pod: str, container: str) -> ExecContext:
        """The running container ``container`` of pod ``namespace/pod`` on this node, for the
        streaming server; raises :class:`NotServed` saying why there is none."""
        c = self._container(namespace, pod, container, ended=False)
        if not isinstance(c, ContainerProcess) or c.exec_context is None:
            if isinstance(c, ContainerProcess):
                raise NotServed(400, f"container {container!r} has not started")
            raise NotServed(
                501,
                f"the agentrun local node serves exec and attach for its process runtime only,"
                f" not {self.runtime.name}",
            )
        if not c.running:
            raise NotServed(400, f"container {container!r} is not running")
        return c.exec_context

    # -- pods -------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        """List + watch all pods; the watch times out every ``resync_seconds`` (resync)."""
        while not self._stop.is_set():
            try:
                lst = self.api.get("/api/v1/pods")
                rv = str(lst["metadata"]["resourceVersion"])
                seen = set()
                for pod in lst.get("items") or []:
                    seen.add(pod["metadata"]["uid"])
                    self._safe_reconcile(pod)
                self._forget_missing(seen)
                for event in self.api.watch(
                    "/api/v1/pods", resource_version=rv, timeout_seconds=self.resync_seconds
                ):
                    if self._stop.is_set():
                        return
                    etype, obj = event.get("type"), event.get("object") or {}
                    if etype == "ERROR":
                        log.info("watch error (%s); relisting", obj.get("message"))
                        break
                    if etype == "BOOKMARK":
                        continue
                    if etype == "DELETED":
                        self._forget(obj["metadata"]["uid"])
                        continue
                    self._safe_reconcile(obj)
            except Exception as e:
                log.warning("pod watch failed (%r); relisting", e)
                self._stop.wait(1.0)

    def _forget(self, uid: str) -> None:
        with self._lock:
            runner = self._runners.pop(uid, None)
            self._finished.pop(uid, None)
        if runner is not None and not runner.done.is_set():
            runner.gone = True
            runner.request_kill("Deleted", "pod was deleted", 0.0)

    def _forget_missing(self, seen: set[str]) -> None:
        with self._lock:
            missing = [uid for uid in list(self._runners) + list(self._finished) if uid not in seen]
        for uid in missing:
            self._forget(uid)

    def _safe_reconcile(self, pod: JSON) -> None:
        try:
            self.reconcile(pod)
        except Exception:
            meta = pod.get("metadata") or {}
            log.exception("pod %s/%s: reconcile failed", meta.get("namespace"), meta.get("name"))

    def reconcile(self, pod: JSON) -> None:
        """Bring one pod forward: bind it, start it, kill it, or finish its deletion."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        status = pod.get("status") or {}
        uid, phase = meta["uid"], status.get("phase", "Pending")
        deleting = bool(meta.get("deletionTimestamp"))
        node_name = spec.get("nodeName")
        if not node_name:
            if not deleting and phase not in TERMINAL_PHASES and not spec.get("schedulingGates"):
                self.bind(pod)
            return
        if node_name != self.name:
            return
        with self._lock:
            runner = self._runners.get(uid)
            if runner is not None:
                runner.update(pod)
            if deleting:
                if runner is not None and not runner.done.is_set():
                    grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                    runner.request_kill("Deleted", "pod is being deleted", grace)
                    return
            elif runner is not None or uid in self._finished:
                return
            elif phase not in TERMINAL_PHASES and phase != "Running":
                runner = PodRunner(self, pod)
                self._runners[uid] = runner
                runner.start()
                return
            else:
                self._finished[uid] = time.time()
        if deleting:
            # Not running here (any more): make sure it is terminal, then finish the delete.
            if phase not in TERMINAL_PHASES and runner is None:
                report_lost(self.api, pod, "Deleted", "pod was deleted before it ran to completion")
            self.delete_now(pod)
        elif phase == "Running":
            # Bound to us and running, but not by this process: the node restarted.
            report_lost(
                self.api,
                pod,
                "NodeRestarted",
                "the agentrun local node restarted; the processes were lost",
            )

    def bind(self, pod: JSON) -> None:
        """Bind an unscheduled pod to this node (pods/binding), as a scheduler would."""
        bind_pod(self.api, pod, self.name)

    def delete_now(self, pod: JSON) -> None:
        """Finish a graceful deletion: delete with gracePeriodSeconds=0 (uid precondition)."""
        delete_pod_now(self.api, pod)


def default_node_state_dir(name: str) -> Path:
    """``${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/agentrun}/node/<name>``."""
    return cache_root() / "node" / name


def run_node(
    kubeconfig: Path | str,
    *,
    name: str = DEFAULT_NODE_NAME,
    state_dir: Path | str | None = None,
    install_signal_handlers: bool = True,
    runtime: str = "process",
) -> None:
    """Run a :class:`LocalNode` in the foreground until SIGINT/SIGTERM."""
    stop = threading.Event()
    if install_signal_handlers:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    LocalNode(kubeconfig, name=name, state_dir=state_dir, runtime=runtime).run(stop)


class NodeProcess(StartStop):
    """A :class:`LocalNode` in a child process (``python -m agentrun_devcluster.cli node``).

    Context manager: :meth:`start` launches it and waits until the Node is Ready (then
    :attr:`runtime_in_use` says which container runtime it chose for ``runtime``),
    :meth:`stop` sends SIGTERM (the node kills its pods' containers) and SIGKILL after
    ``stop_timeout``. Output goes to ``log_path``.
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        *,
        state_dir: Path | str,
        name: str = DEFAULT_NODE_NAME,
        log_path: Path | str | None = None,
        python: str | None = None,
        stop_timeout: float = 20.0,
        runtime: str = "process",
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.runtime = runtime
        #: The runtime the node chose (``process`` or ``docker``), once it is Ready.
        self.runtime_in_use = ""
        self.state_dir = Path(state_dir)
        self.name = name
        self.log_path = Path(log_path) if log_path else self.state_dir / "node.log"
        self.python = python or sys.executable
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, ready_timeout: float = 60.0) -> Self:
        """Launch the node and wait until its Node object reports Ready."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        argv = [
            self.python, "-m", "agentrun_devcluster.cli", "node",
            "--kubeconfig", str(self.kubeconfig),
            "--name", self.name,
            "--state-dir", str(self.state_dir),
            "--runtime", self.runtime,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll the Node object until Ready=True; raise RuntimeError with the log tail."""
        api = KubeApi(self.kubeconfig)
        try:
            wait_answer(
                lambda: self._ready(api),
                exit_code=lambda: None if self.proc is None else self.proc.poll(),
                timeout=timeout,
                what=f"local node {self.name}",
                error=lambda message: RuntimeError(f"{message}\n{self.describe()}"),
            )
        finally:
            api.close()

    def _ready(self, api: KubeApi) -> str | None:
        """None once the Node is Ready (and :attr:`runtime_in_use` read from its label)."""
        try:
            node = api.get(f"/api/v1/nodes/{self.name}")
            conds = (node.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                labels = node.get("metadata", {}).get("labels") or {}
                self.runtime_in_use = str(labels.get(RUNTIME_LABEL, ""))
                return None
        except Exception as e:
            return repr(e)
        return "not Ready yet"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> str:
        """The tail of the node's log."""
        lines = tail_bytes(self.log_path, 16 * 1024).decode("utf-8", "replace").splitlines()
        return f"--- local node; last lines of {self.log_path}:\n" + "\n".join(lines[-60:])

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
