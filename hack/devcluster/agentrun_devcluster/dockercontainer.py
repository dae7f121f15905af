"""The docker runtime of the local node: each container of a pod is a Docker container.

Selected with the node's ``--runtime docker`` (or ``auto``; see
:mod:`agentrun_devcluster.runtime`). It talks to the local Docker Engine through its API
(:mod:`agentrun_devcluster.dockerapi`). Like a kubelet:

* **Images.** The container runs the pod's ``image`` with the image's entrypoint, command,
  user, working directory and environment unless the pod overrides them: ``command``
  replaces the image's ENTRYPOINT (and drops its CMD), ``args`` replace its CMD, ``$(VAR)``
  references in both are expanded, ``workingDir`` replaces WORKDIR, ``env`` adds to (and
  wins over) the image's ENV. Images come from the engine's local store. One that is missing
  is pulled unless ``imagePullPolicy`` is ``Never``; while it cannot be had the container
  waits with reason ``ErrImagePull`` then ``ImagePullBackOff`` (or ``ErrImageNeverPull``),
  retried with a back-off, and the message says what to build or load. ``Always`` pulls
  when the image is missing and otherwise uses the local one (machines without a registry).
* **API access.** ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT`` are the API
  server's address from the node's kubeconfig, and the service-account token volume (token,
  ``ca.crt``, ``namespace``) is bind-mounted read-only at its ``mountPath``, normally
  ``/var/run/secrets/kubernetes.io/serviceaccount``: in-cluster client configuration works
  unchanged. The API server's serving certificate covers 127.0.0.1.
* **Termination message.** A file per container, bind-mounted at ``terminationMessagePath``
  (``/dev/termination-log`` by default), mode 0666; after exit it is read like a kubelet
  reads it (:func:`~agentrun_devcluster.process.read_termination_message`, with
  ``FallbackToLogsOnError``). No path in the command line is rewritten.
* **Security context** (the container's over the pod's): ``runAsUser``/``runAsGroup``
  (else the image's USER), ``runAsNonRoot`` checked against the user the container would
  run as (a configuration error otherwise, with a kubelet's message), ``supplementalGroups``
  and ``fsGroup`` as additional groups, ``readOnlyRootFilesystem``, ``capabilities``
  (add/drop), ``allowPrivilegeEscalation: false`` (no-new-privileges), ``privileged``,
  ``seccompProfile`` (RuntimeDefault or none: the engine's default profile; Unconfined;
  Localhost is a configuration error).
* **Resources.** ``limits.memory`` (memory limit; the container is ``OOMKilled`` past it),
  ``limits.cpu`` (CPU quota), ``requests.cpu`` (CPU shares). Others are not enforced.
* **Volumes**: :mod:`agentrun_devcluster.volumes` (emptyDir, configMap, secret, downwardAPI,
  projected, hostPath).
* **Probes** (:mod:`agentrun_devcluster.probes`) decide readiness; a failed liveness or
  startup probe kills the container. **Restarts**: containers are restarted per the pod's
  ``restartPolicy`` (``Always`` for sidecars) with a back-off of 10 s doubling up to 300 s
  (reason ``CrashLoopBackOff`` meanwhile); init containers run once.

**Lifecycle calls in flight** (removing a leftover, create and start; saving the output and
removing): at most :data:`LIFECYCLE_CALLS` at once per node, the others wait their turn. A
kubelet hands them to its container runtime, which queues them; the Docker engine 20.10 here,
given 200 pods' creates at once on 2 cores, stopped answering for minutes and was left with
containers it held running whose shims were gone (their removal hung until it was
restarted).

Differences from a kubelet: every container runs in the host's network namespace
(``--network host``): the control plane listens on 127.0.0.1 only, and pods must reach it.
So pods share the node's IP (127.0.0.1) and ports, and ``hostname`` is the machine's
(``HOSTNAME`` is set to the pod's name). Containers of a pod share no IPC or PID namespace.
A container is removed once it has exited; its output is appended to
``<state dir>/pods/<namespace>_<name>_<uid>/<container>.log`` first (there is no ``pods/log``
API). Containers carry the labels ``dev.agentrun.node`` (the node's state directory) and
``dev.agentrun.node-pid`` (the node process), and the ``io.kubernetes.*`` labels of pod and
container. A node removes its containers when it stops; when it starts, it removes those a
previous node left in its state directory and those of nodes whose process or state
directory is gone (killed without a shutdown).

Why Docker and not a real kubelet here (tried on a 2-core Debian 12 machine, cgroup v1, whose
capability bounding set lacks CAP_SYS_RESOURCE): kubelet v1.37.1 built from the pinned
``k8s.io/kubernetes`` module, with ``failCgroupV1: false`` and ``cgroupDriver: cgroupfs``,
against Debian's containerd 1.6.20 (CRI plugin on) and a pause image built from a Go
program, starts and registers its Node, but no pod runs: every sandbox fails with "Failed to
create pod sandbox: rpc error: code = Unknown desc = failed to create containerd task: failed
to create shim task: OCI runtime create failed: runc create failed: unable to start container
process: can't get final child's PID from pipe: EOF: unknown" (the CRI gives sandboxes
``oom_score_adj`` -998, and lowering it needs CAP_SYS_RESOURCE: ``docker run
--oom-score-adj -998`` fails the same way), the Node stays NotReady without CNI plugins
("cni plugin not initialized"), and the kubelet logs "Failed to set rlimit on max file
handles: operation not permitted". Privileged containers (kind's nodes) fail with "unable to
apply caps: operation not permitted". Ordinary Docker containers run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal as signals
import threading
import time
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from .dockerapi import DockerEngine, DockerError
from .kubeapi import JSON, now_rfc3339
from .podenv import ConfigError, expand_vars
from .probes import Prober
from .process import (
    DEFAULT_TERMINATION_MESSAGE_PATH,
    START_ERROR_EXIT_CODE,
    failed_state,
    read_termination_message,
)
from .registration import NODE_IP
from .volumes import DEFAULT_MODE, PodVolumes

if TYPE_CHECKING:
    from .runtime import PodContext

__all__ = [
    "NODE_LABEL",
    "NODE_PID_LABEL",
    "DockerContainer",
    "DockerRuntime",
    "container_user",
    "create_config",
    "parse_quantity",
]

log = logging.getLogger(__name__)

#: Labels of every container the runtime creates: the node's state directory, and the pid
#: of the node process.
NODE_LABEL = "dev.agentrun.node"
NODE_PID_LABEL = "dev.agentrun.node-pid"
IMAGE_HINT = (
    "the agentrun local node runs images of its Docker engine: build or load the image there "
    "(hack/build-images.sh builds agentrun-operator:dev, hack/build-base-images.sh busybox:1.36)"
)
PULL_TIMEOUT = 300.0
MAX_STOP_GRACE = 30.0

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")
_SUFFIXES: dict[str, int | Fraction] = {
    "": 1,
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(text: str | int | float) -> Fraction:
    """A Kubernetes quantity (``512Mi``, ``100m``, ``1.5``, ``1e3``) as an exact number."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = Fraction(m.group(1)), m.group(2)
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * Fraction(10) ** int(suffix[1:])
    if suffix not in _SUFFIXES:
        raise ValueError(f"not a quantity: {text!r} (unknown suffix {suffix!r})")
    return number * _SUFFIXES[suffix]


def _security(pod: JSON, container: JSON) -> tuple[JSON, JSON]:
    """The pod's and the container's security contexts."""
    pod_sc: JSON = (pod.get("spec") or {}).get("securityContext") or {}
    return pod_sc, container.get("securityContext") or {}


def container_user(pod: JSON, container: JSON, image_user: str) -> str:
    """The Docker ``User`` of ``container`` (``uid[:gid]`` or the image's), after checking
    ``runAsNonRoot`` like a kubelet; raises :class:`ConfigError` when it would run as root
    (or as a named user that cannot be checked)."""
    pod_sc, sc = _security(pod, container)

    def pick(field: str) -> object:
        return sc[field] if sc.get(field) is not None else pod_sc.get(field)

    run_as_user, run_as_group = pick("runAsUser"), pick("runAsGroup")
    non_root = pick("runAsNonRoot")
    image_uid, _, image_gid = image_user.partition(":")
    if run_as_user is not None:
        user, group = str(run_as_user), ""
    else:
        user, group = image_uid, image_gid
    if run_as_group is not None:
        group = str(run_as_group)
    meta = pod["metadata"]
    pod_id = f"{meta['name']}_{meta['namespace']}({meta['uid']})"
    where = f'(pod: "{pod_id}", container: {container["name"]})'
    if non_root:
        if run_as_user is not None:
            if int(str(run_as_user)) == 0:
                raise ConfigError(f"container's runAsUser breaks non-root policy {where}")
        elif user in ("", "root") or (user.isdigit() and int(user) == 0):
            raise ConfigError(f"container has runAsNonRoot and image will run as root {where}")
        elif not user.isdigit():
            raise ConfigError(
                f"container has runAsNonRoot and image has non-numeric user ({user}), cannot "
                f"verify user is non-root {where}"
            )
    if group and not user:
        user = "0"
    return f"{user}:{group}" if group else user


def create_config(
    *,
    image: str,
    pod: JSON,
    container: JSON,
    user: str,
    env: Mapping[str, str],
    mounts: list[JSON],
    labels: Mapping[str, str],
) -> JSON:
    """The body of ``POST /containers/create`` for ``container`` of ``pod``, with ``env``
    (ordered; a later name wins) and the bind ``mounts``; raises :class:`ConfigError` for
    what Docker cannot do."""
    pod_sc, sc = _security(pod, container)
    host: JSON = {
        "NetworkMode": "host",
        "Mounts": mounts,
        "ReadonlyRootfs": bool(sc.get("readOnlyRootFilesystem")),
        "Privileged": bool(sc.get("privileged")),
    }
    caps = sc.get("capabilities") or {}
    if caps.get("add"):
        host["CapAdd"] = [str(c) for c in caps["add"]]
    if caps.get("drop"):
        host["CapDrop"] = [str(c) for c in caps["drop"]]
    options = []
    if sc.get("allowPrivilegeEscalation") is False:
        options.append("no-new-privileges")
    seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
    if seccomp.get("type") == "Unconfined":
        options.append("seccomp=unconfined")
    elif seccomp.get("type") == "Localhost":
        raise ConfigError(
            f"container {container['name']}: seccompProfile Localhost is not supported by the "
            "agentrun local node (RuntimeDefault and Unconfined are)"
        )
    if options:
        host["SecurityOpt"] = options
    groups = [str(g) for g in pod_sc.get("supplementalGroups") or []]
    if pod_sc.get("fsGroup") is not None:
        groups.append(str(pod_sc["fsGroup"]))
    if groups:
        host["GroupAdd"] = list(dict.fromkeys(groups))
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    try:
        if limits.get("memory") is not None:
            host["Memory"] = int(parse_quantity(limits["memory"]))
        if limits.get("cpu") is not None:
            host["NanoCpus"] = int(parse_quantity(limits["cpu"]) * 10**9)
        if requests.get("cpu") is not None:
            host["CpuShares"] = max(2, int(parse_quantity(requests["cpu"]) * 1024))
    except ValueError as e:
        raise ConfigError(f"container {container['name']}: resources: {e}") from e

    config: JSON = {
        "Image": image,
        "User": user,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": dict(labels),
        "HostConfig": host,
    }
    command = [expand_vars(str(x), env) for x in container.get("command") or []]
    args = [expand_vars(str(x), env) for x in container.get("args") or []]
    if command:
        config["Entrypoint"] = command  # the engine then keeps none of the image's CMD
        if args:
            config["Cmd"] = args
    elif args:
        config["Cmd"] = args
    if container.get("workingDir"):
        config["WorkingDir"] = str(container["workingDir"])
    return config


def _docker_time(value: str) -> str:
    """An engine timestamp (nanoseconds) as a Kubernetes ``Time``."""
    return value[:19] + "Z" if value and not value.startswith("0001-") else now_rfc3339()


LIFECYCLE_CALLS = 4
"""Container creates, starts and removals of one node in flight at once (see the module doc)."""


class DockerRuntime:
    """The docker runtime (see the module doc) of the node whose state is ``state_dir``."""

    name = "docker"
    restarts = True

    def __init__(self, engine: DockerEngine, node_id: str, *, server_version: str = "") -> None:
        self.engine = engine
        self.lifecycle = threading.BoundedSemaphore(LIFECYCLE_CALLS)
        """Held around each container's create-and-start and its removal."""
        self.node_id = node_id  # the node's state directory: one node per directory
        self.version = f"docker://{server_version or 'unknown'}"

    def container(self, spec: JSON, kind: str, ctx: PodContext) -> DockerContainer:
        return DockerContainer(self, spec, kind, ctx)

    def token_file_mode(self, volume: JSON) -> int | None:
        return int((volume.get("projected") or {}).get("defaultMode", DEFAULT_MODE))

    def pod_finished(self, ctx: PodContext) -> None:
        shutil.rmtree(ctx.pod_dir / "volumes", ignore_errors=True)

    def start(self) -> None:
        self._remove(self._orphans(), "left by nodes that are gone")

    def stop(self) -> None:
        self._remove(self._containers({NODE_LABEL: self.node_id}), "left at shutdown")

    def _containers(self, labels: Mapping[str, str]) -> list[JSON]:
        try:
            return self.engine.containers(labels)
        except DockerError as e:
            log.warning("could not list the containers of local nodes: %s", e)
            return []

    def _orphans(self) -> list[JSON]:
        """Containers of this node's state directory (a previous node there), and of nodes
        whose process or state directory is gone (killed without a shutdown)."""
        orphans = []
        for c in self._containers({}):
            labels = c.get("Labels") or {}
            if NODE_LABEL not in labels:
                continue
            state, pid = labels[NODE_LABEL], str(labels.get(NODE_PID_LABEL, ""))
            alive = pid.isdigit() and Path(f"/proc/{pid}").exists()
            if state == self.node_id or not alive or not Path(state).is_dir():
                orphans.append(c)
        return orphans

    def _remove(self, containers: list[JSON], why: str) -> None:
        for c in containers:
            with contextlib.suppress(DockerError):
                self.engine.remove(str(c["Id"]))
        if containers:
            log.info("removed %d containers %s", len(containers), why)


class DockerContainer:
    """One container of a pod as a Docker container (see the module doc)."""

    def __init__(self, runtime: DockerRuntime, spec: JSON, kind: str, ctx: PodContext) -> None:
        self.runtime = runtime
        self.engine = runtime.engine
        self.spec = spec
        self.kind = kind
        self.ctx = ctx
        self.state: JSON = {"waiting": {"reason": "PodInitializing"}}
        self.last_state: JSON = {}
        self.kill_reason = ""
        self.restart_count = 0
        self.container_id = ""
        self.image_id = ""
        self.started_at = ""
        self._image: JSON | None = None
        self._exited = threading.Event()
        self._prober: Prober | None = None
        self._restart_at: float | None = None
        self._saved_states: tuple[JSON, JSON] | None = None
        self._removed = True
        self.volumes = PodVolumes(
            ctx.pod,
            ctx.pod_dir,
            lookup=ctx.lookup,
            token_volume=ctx.token_volume,
            node_name=ctx.node_name,
            node_ip=NODE_IP,
        )

    # -- what the lifecycle reads ---------------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.kind == "init" and self.spec.get("restartPolicy") == "Always"

    @property
    def terminated(self) -> bool:
        return "terminated" in self.state

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def ready(self) -> bool:
        return self.running and (self._prober is None or self._prober.ready)

    @property
    def log_path(self) -> Path:
        return self.ctx.pod_dir / f"{self.name}.log"

    @property
    def message_path(self) -> Path:
        return self.ctx.pod_dir / f"{self.name}.termination-log"

    @property
    def what(self) -> str:
        return f"pod {self.ctx.namespace}/{self.ctx.name} container {self.name}"

    def status(self, pod_uid: str) -> JSON:
        started = self.running and (self._prober is None or self._prober.started)
        status: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": self.image_id,
            "ready": self.ready,
            "started": started,
            "restartCount": self.restart_count,
            "state": self.state,
        }
        if self.last_state:
            status["lastState"] = self.last_state
        if self.container_id:
            status["containerID"] = f"docker://{self.container_id}"
        return status

    def fail(self, reason: str, message: str, exit_code: int = START_ERROR_EXIT_CODE) -> None:
        self.state = failed_state(reason, message, exit_code, started_at=self.started_at)

    def service_env(self, sa_env: Mapping[str, str]) -> dict[str, str]:
        """Always, as a kubelet sets them: where the API server is."""
        return {
            "KUBERNETES_SERVICE_HOST": self.ctx.service_host,
            "KUBERNETES_SERVICE_PORT": self.ctx.service_port,
        }

    # -- image ---------------------------------------------------------------------------------

    def pull(self) -> tuple[str, str] | None:
        image = str(self.spec.get("image") or "")
        if not image:
            self.fail("InvalidImageName", f"container {self.name} has no image")
            return None
        tag = image.rsplit("/", 1)[-1]
        latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
        default = "Always" if latest else "IfNotPresent"
        policy = str(self.spec.get("imagePullPolicy") or default)
        try:
            found = self.engine.image(image)
            if found is None or policy == "Always":
                if found is None and policy == "Never":
                    return (
                        "ErrImageNeverPull",
                        f'Container image "{image}" is not present with pull policy of Never; '
                        f"{IMAGE_HINT}",
                    )
                try:
                    log.info("%s: pulling image %s", self.what, image)
                    self.engine.pull(image, timeout=PULL_TIMEOUT)
                except DockerError as e:
                    if found is None:
                        return "ErrImagePull", f'failed to pull image "{image}": {e}; {IMAGE_HINT}'
                    log.info("%s: pull failed (%s); using the local image", self.what, e)
                found = self.engine.image(image) or found
            if found is None:
                return "ErrImagePull", f'image "{image}" is not there after a pull; {IMAGE_HINT}'
        except DockerError as e:
            return "ErrImagePull", f'image "{image}": {e}'
        self._image = found
        self.image_id = f"docker://{found.get('Id', '')}"
        return None

    # -- start ---------------------------------------------------------------------------------

    def launch(self, sa_env: Mapping[str, str], env: Mapping[str, str]) -> None:
        if self._image is None:
            raise ConfigError(f"container {self.name}: its image has not been pulled")
        image_config = self._image.get("Config") or {}
        user = container_user(self.ctx.pod, self.spec, str(image_config.get("User") or ""))
        full_env = self.ctx.container_env(self.service_env(sa_env), env)
        mounts = self.volumes.mounts(self.spec)
        message_target = str(
            self.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        )
        if message_target not in {m["Target"] for m in mounts}:
            mounts.append(
                {"Type": "bind", "Source": str(self.message_path), "Target": message_target}
            )
        meta = self.ctx.pod["metadata"]
        labels = {
            NODE_LABEL: self.runtime.node_id,
            NODE_PID_LABEL: str(os.getpid()),
            "io.kubernetes.pod.namespace": str(meta["namespace"]),
            "io.kubernetes.pod.name": str(meta["name"]),
            "io.kubernetes.pod.uid": str(meta["uid"]),
            "io.kubernetes.container.name": self.name,
        }
        config = create_config(
            image=str(self.spec["image"]),
            pod=self.ctx.pod,
            container=self.spec,
            user=user,
            env=full_env,
            mounts=mounts,
            labels=labels,
        )
        # Everything checked: from here on, failures end the container instead.
        self.ctx.pod_dir.mkdir(parents=True, exist_ok=True)
        self.message_path.write_bytes(b"")
        self.message_path.chmod(0o666)
        name = re.sub(
            r"[^a-zA-Z0-9_.-]",
            "-",
            f"k8s_{self.name}_{meta['name']}_{meta['namespace']}_{meta['uid']}_{self.restart_count}",
        )
        self.started_at = now_rfc3339()
        self._exited.clear()
        with self.runtime.lifecycle:
            try:
                self.engine.remove(name)  # a leftover of a node that died mid-start
                self.container_id = self.engine.create(name, config)
            except DockerError as e:
                self.fail("CreateContainerError", str(e))
                return
            self._removed = False
            try:
                self.engine.start(self.container_id)
                started = None
            except DockerError as e:
                started = e
        if started is not None:
            log.warning("%s: start failed: %s", self.what, started)
            self.fail("StartError", str(started))
            self._save_logs_and_remove()
            return
        entrypoint = config.get("Entrypoint") or image_config.get("Entrypoint") or []
        cmd = config.get("Cmd") or ([] if "Entrypoint" in config else image_config.get("Cmd"))
        log.info(
            "%s: started %s (image %s, user %r): %s",
            self.what,
            self.container_id[:12],
            self.spec["image"],
            user,
            [*entrypoint, *(cmd or [])],
        )
        self.state = {"running": {"startedAt": self.started_at}}
        threading.Thread(
            target=self._wait_for_exit,
            args=(self.container_id,),
            name=f"wait-{self.ctx.name}/{self.name}",
            daemon=True,
        ).start()
        prober = Prober(
            self.spec,
            host=NODE_IP,
            run=self._exec,
            kill=self._killed_by_probe,
            what=self.what,
        )
        if prober.needed:
            self._prober = prober
            prober.start()

    def _exec(self, argv: list[str], timeout: float) -> tuple[int, bytes]:
        return self.engine.exec(self.container_id, argv, timeout)

    def _killed_by_probe(self, reason: str) -> None:
        container = self.container_id
        grace = float(self.ctx.pod["spec"].get("terminationGracePeriodSeconds", 30))

        def stop() -> None:
            with contextlib.suppress(DockerError):
                self.engine.kill(container, "SIGTERM")
                if not self._exited.wait(min(grace, MAX_STOP_GRACE)):
                    self.engine.kill(container, "SIGKILL")

        threading.Thread(target=stop, name=f"stop-{self.name}", daemon=True).start()

    def _wait_for_exit(self, container: str) -> None:
        while True:
            try:
                self.engine.wait(container)
                break
            except DockerError as e:
                log.warning("%s: waiting for the container failed (%s); polling", self.what, e)
                time.sleep(1.0)
                with contextlib.suppress(DockerError):
                    info = self.engine.inspect(container)
                    if info is None or not info["State"].get("Running"):
                        break
        if container == self.container_id:
            self._exited.set()

    # -- exit ----------------------------------------------------------------------------------

    def poll(self) -> bool:
        if self.terminated:
            return True
        if not self.running or not self._exited.is_set():
            return False
        if self._prober is not None:
            self._prober.stop()
        state: JSON = {}
        try:
            info = self.engine.inspect(self.container_id)
            state = (info or {}).get("State") or {}
        except DockerError as e:
            log.warning("%s: inspect after exit failed: %s", self.what, e)
        code = int(state.get("ExitCode", 137 if self.kill_reason else 1))
        self._save_logs_and_remove()
        message = read_termination_message(
            self.message_path,
            self.log_path,
            policy=str(self.spec.get("terminationMessagePolicy", "File")),
            failed=code != 0,
        )
        reason = self.kill_reason or (
            "OOMKilled" if state.get("OOMKilled") else "Completed" if code == 0 else "Error"
        )
        terminated: JSON = {
            "exitCode": code,
            "reason": reason,
            "startedAt": _docker_time(str(state.get("StartedAt", ""))) or self.started_at,
            "finishedAt": _docker_time(str(state.get("FinishedAt", ""))),
            "containerID": f"docker://{self.container_id}",
        }
        if message:
            terminated["message"] = message
        self.state = {"terminated": terminated}
        log.info("%s: exited with %d (%s)", self.what, code, reason)
        return True

    def _save_logs_and_remove(self) -> None:
        if self._removed or not self.container_id:
            return
        with self.runtime.lifecycle:
            try:
                output = self.engine.logs(self.container_id)
                with self.log_path.open("ab") as f:
                    f.write(output)
            except (DockerError, OSError) as e:
                log.warning("%s: could not save its output: %s", self.what, e)
            with contextlib.suppress(DockerError):
                self.engine.remove(self.container_id)
        self._removed = True

    def signal(self, sig: int) -> None:
        if self.running and self.container_id:
            with contextlib.suppress(DockerError):
                self.engine.kill(self.container_id, signals.Signals(sig).name)

    def wait_exit(self, timeout: float) -> None:
        if self.running:
            self._exited.wait(timeout)

    def release(self) -> None:
        if self._prober is not None:
            self._prober.stop()
        self._save_logs_and_remove()

    # -- restarts ------------------------------------------------------------------------------

    def schedule_restart(self, delay: float) -> None:
        self._saved_states = (self.state, self.last_state)
        self.last_state = self.state
        self.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:.0f}s restarting failed container={self.name} "
                f"pod={self.ctx.name}_{self.ctx.namespace}({self.ctx.uid})",
            }
        }
        self._restart_at = time.monotonic() + delay

    def restart_due(self) -> bool:
        if self._restart_at is None or time.monotonic() < self._restart_at:
            return False
        self._restart_at = None
        self._saved_states = None
        self.restart_count += 1
        self.kill_reason = ""
        self._prober = None
        self.state = {"waiting": {"reason": "ContainerCreating"}}
        return True

    def cancel_restart(self) -> None:
        if self._restart_at is not None and self._saved_states is not None:
            self.state, self.last_state = self._saved_states
        self._restart_at = None
        self._saved_states = None
