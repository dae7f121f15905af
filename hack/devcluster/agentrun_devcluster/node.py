"""A local "node" for the dev/test control plane: a kubelet stand-in that runs pods as processes.

THIS IS A TEST STAND-IN, NOT A KUBELET. It exists so that Jobs created against the local
control plane (:mod:`agentrun_devcluster.controlplane`, which has no scheduler and no
kubelet) actually run and report status the way a kubelet would. It provides:

* **No images.** ``image`` is recorded in the status and otherwise ignored; a container runs
  its ``command`` + ``args`` as a local process found on the node process's ``PATH``. A
  container without ``command`` fails with reason ``NoCommand``.
* **No isolation.** Processes run as the node's user, on the host's filesystem, network and
  PID namespace, without resource limits (``resources`` only feeds ``resourceFieldRef``).
* **One volume only: the service-account token.** The projected volume the ServiceAccount
  admission plugin adds (``kube-api-access-*``, with a ``serviceAccountToken`` source) is
  materialized as a per-pod directory (see "API access" below). Every other volume and
  mount is ignored entirely, whatever its type: emptyDir, configMap, secret, other projected
  volumes, downwardAPI, hostPath, persistentVolumeClaim, ephemeral, csi, image and all
  others. Probes, lifecycle hooks, security contexts, ports, ``hostNetwork`` and the like
  are ignored too.
* **Scheduling** is binding every unscheduled pod (without ``schedulingGates``) to this
  node through the ``pods/binding`` subresource; node selectors, affinity, taints and
  tolerations are not evaluated.
* **restartPolicy** ``Never`` is what matters (Job pods). ``OnFailure`` and ``Always`` are
  treated like ``Never``: a container is never restarted; the pod ends Succeeded or Failed.
  Init containers with ``restartPolicy: Always`` (sidecars) are started, kept running while
  the rest of the pod runs, and terminated when the regular containers have exited.

What it does like a kubelet: registers a Node with a Ready condition and allocatable
cpu/memory/pods and keeps it alive (status heartbeat + Lease in ``kube-node-lease``);
resolves ``env`` (``value``, ``fieldRef``, ``resourceFieldRef``, ``configMapKeyRef``,
``secretKeyRef``, ``$(VAR)`` expansion) and ``envFrom``; runs init containers in order, then
the regular containers concurrently; reports pod status (phase, conditions, container
states, exit codes, termination messages) through ``pods/status``; kills a pod's processes
when it gets a deletionTimestamp or its ``activeDeadlineSeconds`` passes, and finishes a
deletion with a grace-period-0 delete as a kubelet does.

Termination messages: a process cannot write ``/dev/termination-log``, so each container
gets a private file. Literal occurrences of the container's ``terminationMessagePath`` in
``command`` and ``args`` are replaced with that file's path, and the path is exported as
``AGENTRUN_TERMINATION_MESSAGE_PATH``. After exit up to the last 4096 bytes are reported
as ``state.terminated.message``; with ``terminationMessagePolicy: FallbackToLogsOnError``
an empty file on failure falls back to the tail of the container's output (80 lines,
2048 bytes), like a kubelet.

API access (the service-account token volume): a pod whose
``spec.automountServiceAccountToken`` is not false and that has the ``kube-api-access-*``
projected volume gets ``<pod dir>/serviceaccount/`` holding ``token`` (from the TokenRequest
API for ``spec.serviceAccountName``, bound to the pod, with the source's
``expirationSeconds`` (default 3600) and ``audience`` (default: the API server's)),
``ca.crt`` (the cluster CA of the node's kubeconfig, else the namespace's
``kube-root-ca.crt`` ConfigMap) and ``namespace``. Every container of the pod gets
``AGENTRUN_SERVICEACCOUNT_DIR`` (that directory), ``KUBERNETES_SERVICE_HOST`` and
``KUBERNETES_SERVICE_PORT`` (host and port of the node's kubeconfig server URL, e.g.
127.0.0.1), and literal occurrences of the volume's ``mountPath`` (normally
``/var/run/secrets/kubernetes.io/serviceaccount``) in its ``command`` and ``args`` are
replaced with the directory. The token is requested once per pod and never refreshed (pods
here are short); the directory is removed when the pod's processes are gone. A failed token
request (e.g. the ServiceAccount does not exist) is retried like a configuration error (see
below). Pods without that volume (``automountServiceAccountToken: false`` on the pod or its
ServiceAccount) get none of this: no token and, unlike with a kubelet, no
``KUBERNETES_SERVICE_*`` variables.

Environment of a container process: only ``PATH`` (and ``HOME``, ``LANG``, ``TZ``,
``TMPDIR`` when set) from the node process, plus ``HOSTNAME`` (the pod name),
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` (only with the token volume; the
container's own env wins over them), the container's own env,
``AGENTRUN_TERMINATION_MESSAGE_PATH`` and ``AGENTRUN_SERVICEACCOUNT_DIR`` (only with the
token volume). ``$(VAR)`` references in env values, command and args also see the
``KUBERNETES_SERVICE_*`` variables, as with a kubelet. The working directory is
``workingDir`` if that exists here, else the pod's state directory. Output (stdout and
stderr merged) goes to ``<state_dir>/pods/<namespace>_<name>_<uid>/<container>.log``; it is
not served through the ``pods/log`` API.

Differences from a kubelet worth knowing: a configuration error (missing ConfigMap, Secret
or key, or a failed service-account token request) is reported as
``waiting: CreateContainerConfigError`` and retried for ``config_error_timeout`` (10 s),
then the container fails with that reason instead of waiting forever. A pod found
``Running`` on this node that this process did not start (the node was restarted) is marked
Failed with reason ``NodeRestarted``. On shutdown (SIGTERM/SIGINT) the node kills its pods'
processes and marks those pods Failed with reason ``NodeShutdown``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import yaml

from .kubeapi import JSON, ApiException, KubeApi

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
    "service_account_volume",
]

log = logging.getLogger(__name__)

DEFAULT_NODE_NAME = "agentrun-local-node"
TERMINATION_MESSAGE_ENV = "AGENTRUN_TERMINATION_MESSAGE_PATH"
SERVICEACCOUNT_DIR_ENV = "AGENTRUN_SERVICEACCOUNT_DIR"
SERVICEACCOUNT_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICEACCOUNT_VOLUME_PREFIX = "kube-api-access-"
DEFAULT_TOKEN_EXPIRATION_SECONDS = 3600
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
NODE_IP = "127.0.0.1"
MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
START_ERROR_EXIT_CODE = 128
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")
_TERMINAL = ("Succeeded", "Failed")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_VAR_REF = re.compile(r"\$\$|\$\(([^)]*)\)")


def now_rfc3339() -> str:
    """Current UTC time, Kubernetes ``Time`` format (seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """Current UTC time, Kubernetes ``MicroTime`` format."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def expand_vars(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined vars are substituted, ``$$`` escapes ``$``,
    references to undefined variables are left as they are."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(sub, value)


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a container exit code (killed by signal N -> 128+N)."""
    return returncode if returncode >= 0 else 128 - returncode


def _tail_bytes(path: Path, limit: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read()
    except OSError:
        return b""


def read_termination_message(
    message_file: Path, log_file: Path, *, policy: str, failed: bool
) -> str:
    """What a kubelet would report as ``state.terminated.message``."""
    data = _tail_bytes(message_file, MAX_TERMINATION_MESSAGE)
    if not data.strip() and failed and policy == "FallbackToLogsOnError":
        lines = _tail_bytes(log_file, 64 * 1024).splitlines(keepends=True)
        data = b"".join(lines[-FALLBACK_LOG_LINES:])[-FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", "replace")


def service_account_volume(pod: JSON) -> tuple[JSON, JSON] | None:
    """``(volume, serviceAccountToken source)`` of the service-account token volume the
    ServiceAccount admission plugin adds (``kube-api-access-*``, projected, with a
    ``serviceAccountToken`` source); None if the pod has none or opts out of automounting."""
    spec = pod.get("spec") or {}
    if spec.get("automountServiceAccountToken") is False:
        return None
    for volume in spec.get("volumes") or []:
        if not str(volume.get("name", "")).startswith(SERVICEACCOUNT_VOLUME_PREFIX):
            continue
        for source in (volume.get("projected") or {}).get("sources") or []:
            token = source.get("serviceAccountToken")
            if token is not None:
                return volume, token
    return None


def _kubeconfig_ca(kubeconfig: Path) -> bytes | None:
    """The CA bundle of the current cluster of ``kubeconfig`` (data or file), if any."""
    doc = yaml.safe_load(kubeconfig.read_text())
    if not isinstance(doc, dict):
        return None
    contexts = {c["name"]: c.get("context") or {} for c in doc.get("contexts") or []}
    clusters = {c["name"]: c.get("cluster") or {} for c in doc.get("clusters") or []}
    if not clusters:
        return None
    context = contexts.get(doc.get("current-context") or "", {})
    cluster = cast(JSON, clusters.get(context.get("cluster"), next(iter(clusters.values()))))
    if cluster.get("certificate-authority-data"):
        return base64.b64decode(cluster["certificate-authority-data"])
    if cluster.get("certificate-authority"):
        path = Path(cluster["certificate-authority"])
        return (path if path.is_absolute() else kubeconfig.parent / path).read_bytes()
    return None


def _service_endpoint(server: str) -> tuple[str, str]:
    """``(KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT)`` for an API server URL."""
    url = urllib.parse.urlsplit(server)
    port = url.port or (80 if url.scheme == "http" else 443)
    return url.hostname or NODE_IP, str(port)


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically, with permissions ``mode``."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _status_message(error: ApiException) -> str:
    """The ``message`` of an API error's Status body, else its reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(error.reason or "")


class ConfigError(Exception):
    """A container's configuration cannot be resolved (kubelet: CreateContainerConfigError)."""


class _Transient(Exception):
    """An API error worth retrying while resolving configuration."""


# ------------------------------------------------------------------------------------------
# Container processes
# ------------------------------------------------------------------------------------------


@dataclass
class _Container:
    """One container of a pod, and what has happened to it so far."""

    spec: JSON
    kind: str  # "init" or "regular"
    pod_dir: Path
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    kill_reason: str = ""
    _log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.kind == "init" and self.spec.get("restartPolicy") == "Always"

    @property
    def log_path(self) -> Path:
        return self.pod_dir / f"{self.name}.log"

    @property
    def message_path(self) -> Path:
        return self.pod_dir / f"{self.name}.termination-log"

    @property
    def terminated(self) -> bool:
        return "terminated" in self.state

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.terminated

    def container_id(self, pod_uid: str) -> str:
        return f"agentrun-local://{pod_uid}/{self.name}"

    def status(self, pod_uid: str) -> JSON:
        status: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.running,
            "started": self.running,
            "restartCount": 0,
            "state": self.state,
        }
        if self.started_at:
            status["containerID"] = self.container_id(pod_uid)
        return status

    def fail(self, reason: str, message: str, exit_code: int = START_ERROR_EXIT_CODE) -> None:
        t = now_rfc3339()
        self.state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "message": message,
                "startedAt": self.started_at or t,
                "finishedAt": t,
            }
        }

    def start(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.started_at = now_rfc3339()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                process_group=0,  # the container is a process group: signals reach children
            )
        except OSError as e:
            self._close_log()
            msg = (
                f'exec: "{argv[0]}": executable file not found in $PATH'
                if isinstance(e, FileNotFoundError)
                else f"failed to start {argv[0]!r}: {e}"
            )
            self.fail("StartError", msg)
            return
        self.state = {"running": {"startedAt": self.started_at}}

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def poll(self) -> bool:
        """Record the exit if the process has exited; True once terminated."""
        if self.terminated:
            return True
        if self.proc is None:
            return False
        rc = self.proc.poll()
        if rc is None:
            return False
        # Reap anything the container left behind in its group.
        self.signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._close_log()
        code = exit_code_of(rc)
        message = read_termination_message(
            self.message_path,
            self.log_path,
            policy=str(self.spec.get("terminationMessagePolicy", "File")),
            failed=code != 0,
        )
        reason = self.kill_reason or ("Completed" if code == 0 else "Error")
        terminated: JSON = {
            "exitCode": code,
            "reason": reason,
            "startedAt": self.started_at,
            "finishedAt": now_rfc3339(),
        }
        if rc < 0:
            terminated["signal"] = -rc
        if message:
            terminated["message"] = message
        self.state = {"terminated": terminated}
        return True

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


# ------------------------------------------------------------------------------------------
# One pod
# ------------------------------------------------------------------------------------------


class _PodRunner(threading.Thread):
    """Runs one pod to completion in its own thread and reports its status."""

    def __init__(self, node: LocalNode, pod: JSON) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.node = node
        self.api = node.api
        self.pod = pod
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}"
        self.pod_dir = node.state_dir / "pods" / f"{self.namespace}_{self.pod_name}_{self.uid}"
        self.sa_dir = self.pod_dir / "serviceaccount"
        self._sa_env: dict[str, str] | None = None  # see _service_account_env
        spec = pod["spec"]
        self.init = [_Container(c, "init", self.pod_dir) for c in spec.get("initContainers") or []]
        self.regular = [
            _Container(c, "regular", self.pod_dir) for c in spec.get("containers") or []
        ]
        for c in self.regular:
            c.state = {
                "waiting": {"reason": "PodInitializing" if self.init else "ContainerCreating"}
            }
        self.start_time = now_rfc3339()
        self._lock = threading.Lock()
        self._kill: tuple[str, str, float] | None = None  # (reason, message, grace seconds)
        self.done = threading.Event()
        self.gone = False  # the pod vanished from the API
        self._conditions: dict[str, JSON] = {}
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        deadline = spec.get("activeDeadlineSeconds")
        self.deadline: float | None = None
        if deadline is not None:
            started = (pod.get("status") or {}).get("startTime")
            base = parse_time(started) if started else time.time()
            self.deadline = base + float(deadline)

    # -- requests from the node (other threads) -------------------------------------------

    def request_kill(self, reason: str, message: str, grace: float) -> None:
        """Ask the runner to kill the pod's processes (idempotent; first reason wins)."""
        with self._lock:
            if self._kill is None:
                self._kill = (reason, message, grace)

    def update(self, pod: JSON) -> None:
        """Newer copy of the pod from a watch/list."""
        self.pod = pod

    # -- main -----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # never let one pod take the node down
            log.exception("pod %s/%s: runner crashed", self.namespace, self.pod_name)
            for c in self.init + self.regular:
                c.signal(signal.SIGKILL)
                if c.proc is not None:
                    with contextlib.suppress(Exception):
                        c.proc.wait(5)
                        c.poll()
                if not c.terminated:
                    c.fail("Error", f"local node error: {e}")
            self.phase, self.reason, self.message = "Failed", "NodeError", str(e)
            self._push_status()
        finally:
            for c in self.init + self.regular:
                c.signal(signal.SIGKILL)
                c._close_log()
            # Unmount the token volume: the token must not outlive the pod's processes.
            shutil.rmtree(self.sa_dir, ignore_errors=True)
            self.done.set()
            self._finalize_deletion()

    def _run(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self._set_condition("PodScheduled", True)
        self._set_condition("PodReadyToStartContainers", True)
        self._set_condition("Initialized", not self.init, "ContainersNotInitialized")
        self._set_condition("ContainersReady", False, "ContainersNotReady")
        self._set_condition("Ready", False, "ContainersNotReady")
        self._push_status()

        sidecars: list[_Container] = []
        for c in self.init:
            if not self._start_container(c):
                return self._finish()
            if c.sidecar:
                sidecars.append(c)
                self._push_status()
                continue
            self._push_status()
            self._wait([c], sidecars)
            if self._kill is not None or c.state["terminated"]["exitCode"] != 0:
                return self._finish()
        self._set_condition("Initialized", True)

        for c in self.regular:
            c.state = {"waiting": {"reason": "ContainerCreating"}}
        for c in self.regular:
            if self._kill is not None:
                break
            self._start_container(c)
        if any(c.running for c in self.regular):
            self.phase = "Running"
            if all(c.running for c in self.regular):
                self._set_condition("ContainersReady", True)
                self._set_condition("Ready", True)
        self._push_status()
        self._wait(self.regular, sidecars)
        self._finish()

    def _start_container(self, c: _Container) -> bool:
        """Resolve config and start ``c``; False if it terminated without starting."""
        spec = c.spec
        command = [str(x) for x in spec.get("command") or []]
        if not command:
            c.fail(
                "NoCommand",
                "the agentrun local node runs commands, not images: container "
                f"{c.name!r} (image {spec.get('image', '')!r}) has no command",
            )
            return False
        config_deadline = time.monotonic() + self.node.config_error_timeout
        while True:
            try:
                sa_env = self._service_account_env()
                service_env = {k: v for k, v in sa_env.items() if k != SERVICEACCOUNT_DIR_ENV}
                env = self._resolve_env(spec, service_env)
                break
            except _Transient as e:
                message = str(e)
                if time.monotonic() > config_deadline:
                    c.fail("CreateContainerConfigError", message)
                    return False
            except ConfigError as e:
                message = str(e)
                if time.monotonic() > config_deadline:
                    c.fail("CreateContainerConfigError", message)
                    return False
            if c.state.get("waiting", {}).get("reason") != "CreateContainerConfigError":
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
                self._push_status()
            if self._sleep_or_kill(1.0):
                c.fail("CreateContainerConfigError", message)
                return False

        args = [str(x) for x in spec.get("args") or []]
        argv = [expand_vars(x, {**service_env, **env}) for x in command + args]
        tm_path = str(spec.get("terminationMessagePath") or "/dev/termination-log")
        c.pod_dir.mkdir(parents=True, exist_ok=True)
        c.message_path.write_bytes(b"")
        argv = [x.replace(tm_path, str(c.message_path)) for x in argv]
        mount_path = self._service_account_mount_path(spec)
        if SERVICEACCOUNT_DIR_ENV in sa_env and mount_path.strip("/"):
            argv = [x.replace(mount_path, sa_env[SERVICEACCOUNT_DIR_ENV]) for x in argv]

        proc_env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        proc_env.update(self.node.extra_env)
        proc_env["HOSTNAME"] = self.pod_name
        proc_env.update(service_env)  # the container's own env wins, as with a kubelet
        proc_env.update(env)
        proc_env[TERMINATION_MESSAGE_ENV] = str(c.message_path)
        if SERVICEACCOUNT_DIR_ENV in sa_env:
            proc_env[SERVICEACCOUNT_DIR_ENV] = sa_env[SERVICEACCOUNT_DIR_ENV]
        working_dir = spec.get("workingDir")
        cwd = Path(working_dir) if working_dir and Path(working_dir).is_dir() else self.pod_dir
        log.info("pod %s/%s: starting %s: %s", self.namespace, self.pod_name, c.name, argv)
        c.start(argv, proc_env, cwd)
        return not c.terminated

    def _sleep_or_kill(self, seconds: float) -> bool:
        """Sleep unless a kill is requested or the deadline passes; True if killed."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self._check_deadline() or self._kill is not None:
                return True
            time.sleep(0.1)
        return self._check_deadline() or self._kill is not None

    def _check_deadline(self) -> bool:
        if self.deadline is not None and time.time() >= self.deadline:
            self.request_kill(
                "DeadlineExceeded",
                "Pod was active on the node longer than the specified deadline",
                0.0,
            )
            return True
        return False

    def _wait(self, containers: list[_Container], sidecars: list[_Container]) -> None:
        """Wait until all ``containers`` have exited, killing everything on request."""
        while True:
            changed = False
            for c in containers + sidecars:
                was = c.terminated
                if c.poll() and not was:
                    changed = True
            if changed and self.phase == "Running" and any(c.terminated for c in self.regular):
                self._set_condition("ContainersReady", False, "ContainersNotReady")
                self._set_condition("Ready", False, "ContainersNotReady")
            if all(c.terminated for c in containers):
                return
            if changed:
                self._push_status()
            self._check_deadline()
            kill = self._kill
            if kill is not None:
                reason, _message, grace = kill
                self._terminate(containers + sidecars, reason, grace)
                return
            time.sleep(0.1)

    def _terminate(self, containers: Iterable[_Container], reason: str, grace: float) -> None:
        """SIGTERM the running containers, SIGKILL them after ``grace`` seconds."""
        running = [c for c in containers if c.running]
        for c in running:
            if reason == "DeadlineExceeded" and not c.kill_reason:
                c.kill_reason = reason
            c.signal(signal.SIGTERM)
        end = time.monotonic() + max(0.0, min(grace, self.node.max_grace_seconds))
        while time.monotonic() < end and not all(c.poll() for c in running):
            time.sleep(0.1)
        for c in running:
            c.signal(signal.SIGKILL)
        for c in running:
            if c.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(5)
            c.poll()

    def _finish(self) -> None:
        """Stop sidecars, set the terminal phase and report it."""
        kill = self._kill
        sidecars = [c for c in self.init if c.sidecar and c.running]
        if sidecars:
            grace = (
                kill[2]
                if kill is not None
                else float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            )
            self._terminate(sidecars, "", grace)
        non_sidecars = [c for c in self.init if not c.sidecar] + self.regular
        ran_all = all(c.terminated for c in self.regular)
        ok = ran_all and all(
            c.terminated and c.state["terminated"]["exitCode"] == 0 for c in non_sidecars
        )
        self.phase = "Succeeded" if ok else "Failed"
        if kill is not None and kill[0] in ("DeadlineExceeded", "NodeShutdown"):
            self.phase, self.reason, self.message = "Failed", kill[0], kill[1]
        reason = "PodCompleted" if ran_all else "PodFailed"
        self._set_condition("ContainersReady", False, reason)
        self._set_condition("Ready", False, reason)
        self._push_status()
        log.info("pod %s/%s: %s", self.namespace, self.pod_name, self.phase)

    def _finalize_deletion(self) -> None:
        """If the pod is being deleted, finish the deletion like a kubelet (grace period 0)."""
        if self.gone:
            return
        try:
            pod = self.api.get(self.path)
        except ApiException as e:
            if e.status != 404:
                log.warning("pod %s/%s: get failed: %s", self.namespace, self.pod_name, e.status)
            return
        except Exception:
            log.exception("pod %s/%s: get failed", self.namespace, self.pod_name)
            return
        if pod["metadata"].get("uid") == self.uid and pod["metadata"].get("deletionTimestamp"):
            self.node.delete_now(pod)

    # -- status ---------------------------------------------------------------------------

    def _set_condition(self, ctype: str, status: bool, reason: str | None = None) -> None:
        value = "True" if status else "False"
        old = self._conditions.get(ctype)
        if old is not None and old["status"] == value and old.get("reason") == reason:
            return
        cond: JSON = {"type": ctype, "status": value}
        cond["lastTransitionTime"] = (
            old["lastTransitionTime"]
            if old is not None and old["status"] == value
            else now_rfc3339()
        )
        if reason and not status:
            cond["reason"] = reason
        self._conditions[ctype] = cond

    def status(self) -> JSON:
        order = [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ]
        status: JSON = {
            "phase": self.phase,
            "conditions": [self._conditions[t] for t in order if t in self._conditions],
            "hostIP": NODE_IP,
            "hostIPs": [{"ip": NODE_IP}],
            "podIP": NODE_IP,
            "podIPs": [{"ip": NODE_IP}],
            "startTime": self.start_time,
            "containerStatuses": [c.status(self.uid) for c in self.regular],
            "reason": self.reason,
            "message": self.message,
        }
        if self.init:
            status["initContainerStatuses"] = [c.status(self.uid) for c in self.init]
        return status

    def _push_status(self) -> None:
        """Merge-patch the pod's status (retrying API errors; gives up if the pod is gone)."""
        body = {"metadata": {"uid": self.uid}, "status": self.status()}
        for attempt in range(8):
            try:
                self.api.patch(f"{self.path}/status", body)
                return
            except ApiException as e:
                if e.status in (404, 409):  # gone, or replaced by a new pod (uid precondition)
                    self.gone = True
                    self.request_kill("Deleted", "pod no longer exists", 0.0)
                    return
                if e.status == 422:
                    log.error(
                        "pod %s/%s: status rejected: %s", self.namespace, self.pod_name, e.body
                    )
                    return
                log.warning(
                    "pod %s/%s: status update failed (%s); retrying",
                    self.namespace,
                    self.pod_name,
                    e.status,
                )
            except Exception as e:
                log.warning(
                    "pod %s/%s: status update failed (%r); retrying",
                    self.namespace,
                    self.pod_name,
                    e,
                )
            time.sleep(min(5.0, 0.2 * 2**attempt))
        log.error("pod %s/%s: giving up on a status update", self.namespace, self.pod_name)

    # -- the service-account token volume ---------------------------------------------------

    def _service_account_mount_path(self, spec: JSON) -> str:
        """Where container ``spec`` mounts the token volume (the usual path if it does not)."""
        found = service_account_volume(self.pod)
        if found is not None:
            for mount in spec.get("volumeMounts") or []:
                if mount.get("name") == found[0].get("name") and mount.get("mountPath"):
                    return str(mount["mountPath"])
        return SERVICEACCOUNT_MOUNT_PATH

    def _cluster_ca(self, volume: JSON) -> bytes:
        """The node's cluster CA, else the projected volume's root-CA ConfigMap."""
        if self.node.cluster_ca:
            return self.node.cluster_ca
        name = ROOT_CA_CONFIGMAP
        for source in (volume.get("projected") or {}).get("sources") or []:
            if (source.get("configMap") or {}).get("name"):
                name = str(source["configMap"]["name"])
        data = self._source_data("ConfigMap", name)
        if not data or not data.get("ca.crt"):
            raise _Transient(
                f"volume {volume.get('name')}: no cluster CA in the node's kubeconfig and "
                f'no key ca.crt in ConfigMap "{name}"'
            )
        return data["ca.crt"].encode()

    def _service_account_env(self) -> dict[str, str]:
        """Materialize the pod's service-account token volume (once per pod) and return the
        variables its containers get; empty for a pod without that volume.

        Raises :class:`_Transient` or :class:`ConfigError` when the token cannot be had yet.
        """
        if self._sa_env is not None:
            return self._sa_env
        found = service_account_volume(self.pod)
        if found is None:
            self._sa_env = {}
            return self._sa_env
        volume, source = found
        spec = self.pod["spec"]
        account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        what = f"volume {volume.get('name')}: token for ServiceAccount {self.namespace}/{account}"
        ca = self._cluster_ca(volume)
        request: JSON = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [str(source["audience"])] if source.get("audience") else [],
                "expirationSeconds": int(
                    source.get("expirationSeconds") or DEFAULT_TOKEN_EXPIRATION_SECONDS
                ),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.pod_name,
                    "uid": self.uid,
                },
            },
        }
        try:
            answer = self.api.post(
                f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request
            )
        except ApiException as e:
            message = f"{what}: HTTP {e.status}: {_status_message(e)}"
            if e.status == 429 or e.status >= 500:
                raise _Transient(message) from e
            raise ConfigError(message) from e
        except Exception as e:
            raise _Transient(f"{what}: {e!r}") from e
        token = str((answer.get("status") or {}).get("token") or "")
        if not token:
            raise _Transient(f"{what}: the TokenRequest answer holds no token")
        self.sa_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_file(self.sa_dir / "token", token.encode(), 0o600)
        _write_file(self.sa_dir / "ca.crt", ca, 0o644)
        _write_file(self.sa_dir / "namespace", self.namespace.encode(), 0o644)
        log.info("pod %s/%s: %s in %s", self.namespace, self.pod_name, what, self.sa_dir)
        self._sa_env = {
            SERVICEACCOUNT_DIR_ENV: str(self.sa_dir),
            "KUBERNETES_SERVICE_HOST": self.node.service_host,
            "KUBERNETES_SERVICE_PORT": self.node.service_port,
        }
        return self._sa_env

    # -- env --------------------------------------------------------------------------------

    def _get(self, kind: str, name: str) -> JSON | None:
        plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        try:
            return self.api.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        except ApiException as e:
            if e.status == 404:
                return None
            raise _Transient(f"reading {kind} {self.namespace}/{name}: HTTP {e.status}") from e
        except Exception as e:
            raise _Transient(f"reading {kind} {self.namespace}/{name}: {e!r}") from e

    def _source_data(self, kind: str, name: str) -> dict[str, str] | None:
        obj = self._get(kind, name)
        if obj is None:
            return None
        data: dict[str, str] = {}
        if kind == "Secret":
            for k, v in (obj.get("data") or {}).items():
                data[k] = base64.b64decode(v).decode("utf-8", "replace")
            data.update(obj.get("stringData") or {})
        else:
            for k, v in (obj.get("binaryData") or {}).items():
                data[k] = base64.b64decode(v).decode("utf-8", "replace")
            data.update(obj.get("data") or {})
        return data

    def _field_ref(self, path: str) -> str:
        pod = self.pod
        meta, spec = pod["metadata"], pod["spec"]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        simple: dict[str, Callable[[], Any]] = {
            "metadata.name": lambda: meta["name"],
            "metadata.namespace": lambda: meta["namespace"],
            "metadata.uid": lambda: meta["uid"],
            "metadata.labels": lambda: "\n".join(
                f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items())
            ),
            "metadata.annotations": lambda: "\n".join(
                f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items())
            ),
            "spec.nodeName": lambda: spec.get("nodeName") or self.node.name,
            "spec.serviceAccountName": lambda: spec.get("serviceAccountName", ""),
            "status.podIP": lambda: NODE_IP,
            "status.podIPs": lambda: NODE_IP,
            "status.hostIP": lambda: NODE_IP,
            "status.hostIPs": lambda: NODE_IP,
        }
        if path not in simple:
            raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")
        return str(simple[path]())

    def _resource_ref(self, ref: JSON, container: JSON) -> str:
        target = container
        if ref.get("containerName"):
            for c in (self.pod["spec"].get("containers") or []) + (
                self.pod["spec"].get("initContainers") or []
            ):
                if c.get("name") == ref["containerName"]:
                    target = c
        resource = str(ref.get("resource", ""))
        kind, _, name = resource.partition(".")
        value = ((target.get("resources") or {}).get(kind) or {}).get(name)
        if value is None:
            value = self.node.capacity.get(name, "0")
        return str(value)

    def _resolve_env(
        self, spec: JSON, service_env: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """``envFrom`` then ``env`` (later wins), with ``$(VAR)`` expansion, like a kubelet
        (``service_env``, e.g. ``KUBERNETES_SERVICE_HOST``, is seen by the expansion too)."""
        env: dict[str, str] = {}
        service_env = service_env or {}
        for src in spec.get("envFrom") or []:
            prefix = str(src.get("prefix") or "")
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                ref = src.get(key)
                if not ref:
                    continue
                data = self._source_data(kind, ref["name"])
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
                for k, v in data.items():
                    if _ENV_NAME.match(prefix + k):
                        env[prefix + k] = v
        for var in spec.get("env") or []:
            name = str(var["name"])
            if "valueFrom" not in var:
                env[name] = expand_vars(str(var.get("value") or ""), {**service_env, **env})
                continue
            vf = var["valueFrom"]
            if "fieldRef" in vf:
                env[name] = self._field_ref(str(vf["fieldRef"]["fieldPath"]))
            elif "resourceFieldRef" in vf:
                env[name] = self._resource_ref(vf["resourceFieldRef"], spec)
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                kind, ref = (
                    ("ConfigMap", vf["configMapKeyRef"])
                    if "configMapKeyRef" in vf
                    else ("Secret", vf["secretKeyRef"])
                )
                data = self._source_data(kind, ref["name"])
                optional = bool(ref.get("optional"))
                if data is None:
                    if optional:
                        continue
                    raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
                if ref["key"] not in data:
                    if optional:
                        continue
                    raise ConfigError(
                        f"couldn't find key {ref['key']} in {kind} {self.namespace}/{ref['name']}"
                    )
                env[name] = data[ref["key"]]
            else:
                raise ConfigError(f"env {name}: unsupported valueFrom {sorted(vf)}")
        return env


# ------------------------------------------------------------------------------------------
# The node
# ------------------------------------------------------------------------------------------


class LocalNode:
    """Registers a Node and runs the pods bound to it as local processes (see module doc).

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
    ) -> None:
        self.name = name
        self.api = KubeApi(kubeconfig, user_agent=f"agentrun-local-node/{name}")
        self.state_dir = Path(
            state_dir if state_dir is not None else default_node_state_dir(name)
        ).resolve()
        self.resync_seconds = resync_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.capacity: dict[str, str] = {
            "cpu": str(os.cpu_count() or 2),
            "memory": f"{_memory_kib()}Ki",
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }
        self.capacity.update(capacity or {})
        self.config_error_timeout = config_error_timeout
        self.max_grace_seconds = max_grace_seconds
        self.extra_env = dict(extra_env or {})
        # For the service-account token volume: where pods reach the API, and its CA.
        self.service_host, self.service_port = _service_endpoint(self.api.host)
        self.cluster_ca: bytes | None = None
        try:
            self.cluster_ca = _kubeconfig_ca(self.api.kubeconfig)
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
            log.warning("no cluster CA from %s (%r); using kube-root-ca.crt", kubeconfig, e)
        self._runners: dict[str, _PodRunner] = {}
        self._finished: dict[str, float] = {}  # uid -> when it was handled, for pods not ours
        self._lock = threading.RLock()
        self._registered_at = now_rfc3339()
        self._stop = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Register, then watch and run pods until ``stop`` is set; then shut down."""
        if stop is not None:
            self._stop = stop
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._retry_forever("register the node", self.register)
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True),
        ]
        for t in threads:
            t.start()
        log.info("node %s ready; state in %s", self.name, self.state_dir)
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

    # -- node object -----------------------------------------------------------------------

    def _node_status(self) -> JSON:
        t = now_rfc3339()

        def cond(ctype: str, status: str, reason: str, message: str) -> JSON:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": t,
                "lastTransitionTime": self._registered_at,
            }

        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                cond("Ready", "True", "KubeletReady", "agentrun local node is posting ready"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": NODE_IP},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": f"agentrun local node on {platform.system()}",
                "containerRuntimeVersion": "agentrun-local://0",
                "kubeletVersion": "v0.0.0-agentrun-local",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": _goarch(),
            },
        }

    def register(self) -> None:
        """Create (or adopt) the Node, clear the not-ready taint and post a Ready status."""
        path = f"/api/v1/nodes/{self.name}"
        try:
            self.api.get(path)
        except ApiException as e:
            if e.status != 404:
                raise
            labels = {
                "kubernetes.io/hostname": self.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": _goarch(),
                "agentrun.dev/local-node": "true",
            }
            with contextlib.suppress(ApiException):
                self.api.post(
                    "/api/v1/nodes",
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": self.name, "labels": labels},
                        "spec": {},
                    },
                )
        # TaintNodesByCondition adds node.kubernetes.io/not-ready at creation; there is no
        # node-lifecycle controller to lift it.
        self.api.patch(path, {"spec": {"taints": None}})
        self.api.patch(f"{path}/status", {"status": self._node_status()})
        self._renew_lease()

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        try:
            self.api.patch(path, {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            self.api.post(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name},
                    "spec": spec,
                },
            )

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self.api.patch(f"/api/v1/nodes/{self.name}/status", {"status": self._node_status()})
                self._renew_lease()
            except ApiException as e:
                if e.status == 404:
                    log.warning("node %s was deleted; registering again", self.name)
                    with contextlib.suppress(Exception):
                        self.register()
                else:
                    log.warning("heartbeat failed: HTTP %s", e.status)
            except Exception as e:
                log.warning("heartbeat failed: %r", e)

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
            if not deleting and phase not in _TERMINAL and not spec.get("schedulingGates"):
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
            elif phase not in _TERMINAL and phase != "Running":
                runner = _PodRunner(self, pod)
                self._runners[uid] = runner
                runner.start()
                return
            else:
                self._finished[uid] = time.time()
        if deleting:
            # Not running here (any more): make sure it is terminal, then finish the delete.
            if phase not in _TERMINAL and runner is None:
                self._report_lost(pod, "Deleted", "pod was deleted before it ran to completion")
            self.delete_now(pod)
        elif phase == "Running":
            # Bound to us and running, but not by this process: the node restarted.
            self._report_lost(
                pod, "NodeRestarted", "the agentrun local node restarted; the processes were lost"
            )

    def bind(self, pod: JSON) -> None:
        """Bind an unscheduled pod to this node (pods/binding), as a scheduler would."""
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            self.api.post(
                f"/api/v1/namespaces/{ns}/pods/{name}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns, "uid": meta["uid"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
                },
            )
            log.info("pod %s/%s: bound to %s", ns, name, self.name)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or already bound
                raise

    def delete_now(self, pod: JSON) -> None:
        """Finish a graceful deletion: delete with gracePeriodSeconds=0 (uid precondition)."""
        meta = pod["metadata"]
        if meta.get("deletionGracePeriodSeconds") == 0:
            return  # already done; finalizers (e.g. Job tracking) are someone else's
        try:
            self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": meta["uid"]},
                },
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _report_lost(self, pod: JSON, reason: str, message: str) -> None:
        meta = pod["metadata"]
        t = now_rfc3339()
        statuses = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            statuses.append(
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": reason,
                            "message": message,
                            "startedAt": t,
                            "finishedAt": t,
                        }
                    },
                }
            )
        conditions = []
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") == "True":
                cond = {**cond, "status": "False", "reason": "PodFailed", "lastTransitionTime": t}
            conditions.append(cond)
        try:
            self.api.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {
                    "metadata": {"uid": meta["uid"]},
                    "status": {
                        "phase": "Failed",
                        "reason": reason,
                        "message": message,
                        "conditions": conditions,
                        "containerStatuses": statuses,
                    },
                },
            )
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise


def default_node_state_dir(name: str) -> Path:
    """``${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/agentrun}/node/<name>``."""
    cache = os.environ.get("AGENTRUN_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrun"
    )
    return Path(cache) / "node" / name


def _memory_kib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 8 * 1024 * 1024


def _goarch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def run_node(
    kubeconfig: Path | str,
    *,
    name: str = DEFAULT_NODE_NAME,
    state_dir: Path | str | None = None,
    install_signal_handlers: bool = True,
) -> None:
    """Run a :class:`LocalNode` in the foreground until SIGINT/SIGTERM."""
    stop = threading.Event()
    if install_signal_handlers:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    LocalNode(kubeconfig, name=name, state_dir=state_dir).run(stop)


class NodeProcess:
    """A :class:`LocalNode` in a child process (``python -m agentrun_devcluster.cli node``).

    Context manager: :meth:`start` launches it and waits until the Node is Ready,
    :meth:`stop` sends SIGTERM (the node kills its pods' processes) and SIGKILL after
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
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.state_dir = Path(state_dir)
        self.name = name
        self.log_path = Path(log_path) if log_path else self.state_dir / "node.log"
        self.python = python or sys.executable
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, ready_timeout: float = 60.0) -> NodeProcess:
        """Launch the node and wait until its Node object reports Ready."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        argv = [
            self.python, "-m", "agentrun_devcluster.cli", "node",
            "--kubeconfig", str(self.kubeconfig),
            "--name", self.name,
            "--state-dir", str(self.state_dir),
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
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"local node exited with code {self.proc.returncode}\n{self.describe()}"
                    )
                with contextlib.suppress(Exception):
                    node = api.get(f"/api/v1/nodes/{self.name}")
                    conds = (node.get("status") or {}).get("conditions") or []
                    if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"local node {self.name} not Ready after {timeout:.0f}s\n{self.describe()}"
                    )
                time.sleep(0.2)
        finally:
            api.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> str:
        """The tail of the node's log."""
        lines = _tail_bytes(self.log_path, 16 * 1024).decode("utf-8", "replace").splitlines()
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

    def __enter__(self) -> NodeProcess:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
