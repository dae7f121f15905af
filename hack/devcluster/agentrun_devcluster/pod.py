"""One pod on the local node: its lifecycle, and its status reported like a kubelet's.

A :class:`PodRunner` thread takes a pod bound to the node from Pending to Succeeded or
Failed, whatever the node's container runtime (:mod:`agentrun_devcluster.runtime`: local
processes, :mod:`agentrun_devcluster.process`, or Docker containers,
:mod:`agentrun_devcluster.dockercontainer`):

* It gets each container's image (the docker runtime: a missing one is reported as
  ``waiting: ErrImagePull``, then ``ImagePullBackOff``, and retried with a back-off of 2 s
  doubling up to 60 s, until it is there or the pod is killed; the process runtime has no
  images), resolves its configuration (env: :mod:`agentrun_devcluster.podenv`; the token
  volume: :mod:`agentrun_devcluster.serviceaccount`), then runs init containers in order and
  the regular containers concurrently.
* **restartPolicy** ``Never`` is what matters (Job pods). With the process runtime
  ``OnFailure`` and ``Always`` are treated like ``Never``: a container is never restarted;
  the pod ends Succeeded or Failed. With the docker runtime regular containers are restarted
  as the policy says (sidecars always), after a back-off of 10 s doubling up to 300 s
  (``waiting: CrashLoopBackOff`` meanwhile, ``restartCount`` and ``lastState`` reported);
  init containers run once. Init containers with ``restartPolicy: Always`` (sidecars) are
  started, kept running while the rest of the pod runs, and terminated when the regular
  containers have exited.
* It reports pod status (phase, conditions, container states, exit codes, termination
  messages) through ``pods/status`` with a uid precondition, retrying API errors; a pod that
  is gone or replaced is killed. ``Ready`` follows the containers' readiness (the docker
  runtime's readiness probes; a running process is ready).
* It kills the pod's containers when the pod gets a deletionTimestamp (after the deletion's
  grace period, at most the node's ``max_grace_seconds``) or its ``activeDeadlineSeconds``
  passes (reason ``DeadlineExceeded``), and finishes a deletion with a grace-period-0 delete
  as a kubelet does (:func:`delete_now`).

A configuration error (missing ConfigMap, Secret or key, a failed service-account token
request, and with the docker runtime a volume it cannot mount or a ``runAsNonRoot`` the
image breaks) is reported as ``waiting: CreateContainerConfigError`` and retried for the
node's ``config_error_timeout`` (10 s), then the container fails with that reason instead of
waiting forever, unlike a kubelet. Lifecycle hooks, ports, ``hostNetwork`` and the like are
ignored; so are probes and security contexts with the process runtime.

:func:`report_lost` marks a pod Failed whose containers this node does not have (the node
restarted, or the pod was deleted before it ran).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from .kubeapi import JSON, ApiException, KubeApi, now_rfc3339, parse_time
from .podenv import (
    ConfigError,
    SourceLookup,
    TransientConfigError,
    object_data,
    pod_ip,
    resolve_env,
)
from .registration import NODE_IP
from .runtime import Container, ContainerRuntime, PodContext, terminate
from .serviceaccount import ServiceAccountVolume, service_account_volume

__all__ = [
    "TERMINAL_PHASES",
    "PodHost",
    "PodRunner",
    "PodStatus",
    "api_source_lookup",
    "delete_now",
    "push_status",
    "report_lost",
]

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")
#: Seconds between image pulls of a container whose image is missing: first, at most.
IMAGE_PULL_BACKOFF = (2.0, 60.0)
#: Seconds before restarting a container: first (doubled at each restart), at most.
RESTART_BACKOFF = (10.0, 300.0)
#: The order of a pod's conditions in its status, as a kubelet writes them.
CONDITION_ORDER = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)


class PodHost(Protocol):
    """What a :class:`PodRunner` needs of the node that runs it."""

    @property
    def name(self) -> str: ...
    @property
    def api(self) -> KubeApi: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def capacity(self) -> Mapping[str, str]: ...
    @property
    def config_error_timeout(self) -> float: ...
    @property
    def max_grace_seconds(self) -> float: ...
    @property
    def extra_env(self) -> Mapping[str, str]: ...
    @property
    def service_host(self) -> str: ...
    @property
    def service_port(self) -> str: ...
    @property
    def cluster_ca(self) -> bytes | None: ...
    @property
    def runtime(self) -> ContainerRuntime: ...


def api_source_lookup(api: KubeApi, namespace: str) -> SourceLookup:
    """A :data:`~agentrun_devcluster.podenv.SourceLookup` reading ConfigMaps and Secrets of
    ``namespace`` from the API (API errors other than 404 are transient)."""

    def lookup(kind: str, name: str) -> dict[str, str] | None:
        plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        try:
            obj = api.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        except ApiException as e:
            if e.status == 404:
                return None
            raise TransientConfigError(f"reading {kind} {namespace}/{name}: HTTP {e.status}") from e
        except Exception as e:
            raise TransientConfigError(f"reading {kind} {namespace}/{name}: {e!r}") from e
        return object_data(kind, obj)

    return lookup


class PodStatus:
    """The status a kubelet reports for one pod: phase, reason, conditions, containers."""

    def __init__(self) -> None:
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.start_time = now_rfc3339()
        self._conditions: dict[str, JSON] = {}

    def set_condition(self, ctype: str, status: bool, reason: str | None = None) -> None:
        """Set a condition; its lastTransitionTime changes only when its status does."""
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

    def set_ready(self, ready: bool, reason: str | None = None) -> None:
        """``ContainersReady`` and ``Ready`` together."""
        self.set_condition("ContainersReady", ready, reason)
        self.set_condition("Ready", ready, reason)

    def render(self, uid: str, init: list[Container], regular: list[Container]) -> JSON:
        status: JSON = {
            "phase": self.phase,
            "conditions": [self._conditions[t] for t in CONDITION_ORDER if t in self._conditions],
            "hostIP": NODE_IP,
            "hostIPs": [{"ip": NODE_IP}],
            "podIP": pod_ip(uid),
            "podIPs": [{"ip": pod_ip(uid)}],
            "startTime": self.start_time,
            "containerStatuses": [c.status(uid) for c in regular],
            "reason": self.reason,
            "message": self.message,
        }
        if init:
            status["initContainerStatuses"] = [c.status(uid) for c in init]
        return status


class PodRunner(threading.Thread):
    """Runs one pod to completion in its own thread and reports its status."""

    def __init__(self, node: PodHost, pod: JSON) -> None:
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
        self.lookup = api_source_lookup(self.api, self.namespace)
        self.runtime = node.runtime
        found = service_account_volume(pod)
        self.token_volume = ServiceAccountVolume(
            self.api,
            pod,
            self.pod_dir / "serviceaccount",
            lookup=self.lookup,
            service_host=node.service_host,
            service_port=node.service_port,
            cluster_ca=node.cluster_ca,
            file_mode=self.runtime.token_file_mode(found[0]) if found else None,
        )
        self.ctx = PodContext(
            pod=pod,
            pod_dir=self.pod_dir,
            node_name=node.name,
            extra_env=node.extra_env,
            service_host=node.service_host,
            service_port=node.service_port,
            lookup=self.lookup,
            token_volume=self.token_volume,
        )
        spec = pod["spec"]
        self.init = [
            self.runtime.container(c, "init", self.ctx) for c in spec.get("initContainers") or []
        ]
        self.regular = [
            self.runtime.container(c, "regular", self.ctx) for c in spec.get("containers") or []
        ]
        self._ready = False  # the Ready condition last reported
        for c in self.regular:
            c.state = {
                "waiting": {"reason": "PodInitializing" if self.init else "ContainerCreating"}
            }
        self.report = PodStatus()
        self._lock = threading.Lock()
        self._kill: tuple[str, str, float] | None = None  # (reason, message, grace seconds)
        self.done = threading.Event()
        self.gone = False  # the pod vanished from the API
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
                with contextlib.suppress(Exception):
                    c.cancel_restart()
                    c.signal(signal.SIGKILL)
                    c.wait_exit(5)
                    c.poll()
                if not c.terminated:
                    c.fail("Error", f"local node error: {e}")
            self.report.phase, self.report.reason, self.report.message = (
                "Failed",
                "NodeError",
                str(e),
            )
            self._push_status()
        finally:
            for c in self.init + self.regular:
                with contextlib.suppress(Exception):
                    c.release()
            with contextlib.suppress(Exception):
                self.runtime.pod_finished(self.ctx)
            self.token_volume.remove()
            self.done.set()
            self._finalize_deletion()

    def _run(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self.report.set_condition("PodScheduled", True)
        self.report.set_condition("PodReadyToStartContainers", True)
        self.report.set_condition("Initialized", not self.init, "ContainersNotInitialized")
        self.report.set_ready(False, "ContainersNotReady")
        self._push_status()

        sidecars: list[Container] = []
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
        self.report.set_condition("Initialized", True)

        for c in self.regular:
            c.state = {"waiting": {"reason": "ContainerCreating"}}
        for c in self.regular:
            if self._kill is not None:
                break
            if not self._start_container(c):
                self._maybe_restart(c)
        if any(c.running for c in self.regular):
            self.report.phase = "Running"
            if all(c.ready for c in self.regular):
                self._ready = True
                self.report.set_ready(True)
        self._push_status()
        self._wait(self.regular, sidecars)
        self._finish()

    def _resolve_config(self, c: Container) -> tuple[dict[str, str], dict[str, str]]:
        """``(token volume variables, container env)``; raises a config error."""
        sa_env = self.token_volume.env()
        env = resolve_env(
            self.pod,
            c.spec,
            self.lookup,
            node_name=self.node.name,
            node_ip=NODE_IP,
            capacity=self.node.capacity,
            service_env=c.service_env(sa_env),
        )
        return sa_env, env

    def _pull_image(self, c: Container) -> bool:
        """Get ``c``'s image, waiting (``ErrImagePull``, then ``ImagePullBackOff``) and
        retrying with a back-off like a kubelet until it is there or the pod is killed;
        False if ``c`` did not get it (or failed outright)."""
        backoff = IMAGE_PULL_BACKOFF[0]
        while True:
            waiting = c.pull()
            if c.terminated:
                return False
            if waiting is None:
                return True
            reason, message = waiting
            c.state = {"waiting": {"reason": reason, "message": message}}
            self._push_status()
            log.info("pod %s/%s: %s: %s", self.namespace, self.pod_name, reason, message)
            if reason == "ErrImagePull":
                if self._sleep_or_kill(1.0):
                    return False
                image = c.spec.get("image", "")
                c.state = {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}": {message}',
                    }
                }
                self._push_status()
            if self._sleep_or_kill(backoff):
                return False
            backoff = min(backoff * 2, IMAGE_PULL_BACKOFF[1])

    def _start_container(self, c: Container) -> bool:
        """Get its image, resolve its config and start ``c``; False if it did not start."""
        if not self._pull_image(c):
            return False
        config_deadline = time.monotonic() + self.node.config_error_timeout
        while True:
            try:
                sa_env, env = self._resolve_config(c)
                c.launch(sa_env, env)
                break
            except (TransientConfigError, ConfigError) as e:
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
        return not c.terminated

    def _maybe_restart(self, c: Container) -> bool:
        """Schedule a restart of the terminated ``c`` if the runtime restarts containers and
        the pod's restartPolicy (``Always`` for sidecars) says so; True if scheduled."""
        if not self.runtime.restarts or self._kill is not None or not c.terminated:
            return False
        if c.kind == "init" and not c.sidecar:
            return False  # init containers run once here, whatever the restartPolicy
        policy = "Always" if c.sidecar else self.pod["spec"].get("restartPolicy", "Always")
        failed = c.state["terminated"].get("exitCode", 0) != 0
        if policy == "Never" or (policy == "OnFailure" and not failed):
            return False
        restarts = int(c.status(self.uid).get("restartCount", 0))
        delay = min(RESTART_BACKOFF[0] * 2**restarts, RESTART_BACKOFF[1])
        c.schedule_restart(delay)
        log.info(
            "pod %s/%s: container %s exited; restarting in %.0fs",
            self.namespace,
            self.pod_name,
            c.name,
            delay,
        )
        return True

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

    def _wait(self, containers: list[Container], sidecars: list[Container]) -> None:
        """Wait until all ``containers`` have exited, restarting those the pod's
        restartPolicy restarts (runtimes with restarts), killing everything on request."""
        while True:
            changed = False
            for c in containers + sidecars:
                was = c.terminated
                if c.poll() and not was:
                    changed = True
                    self._maybe_restart(c)
                elif c.restart_due() and self._kill is None:
                    if not self._start_container(c):
                        self._maybe_restart(c)
                    changed = True
            if self.report.phase == "Running":
                ready = all(c.ready for c in self.regular)
                if ready != self._ready:
                    self._ready = ready
                    self.report.set_ready(ready, None if ready else "ContainersNotReady")
                    changed = True
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

    def _terminate(self, containers: list[Container], reason: str, grace: float) -> None:
        terminate(containers, min(grace, self.node.max_grace_seconds), reason=reason)

    def _finish(self) -> None:
        """Stop sidecars, set the terminal phase and report it."""
        kill = self._kill
        for c in self.init + self.regular:
            c.cancel_restart()
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
        self.report.phase = "Succeeded" if ok else "Failed"
        if kill is not None and kill[0] in ("DeadlineExceeded", "NodeShutdown"):
            self.report.phase, self.report.reason, self.report.message = "Failed", kill[0], kill[1]
        self.report.set_ready(False, "PodCompleted" if ran_all else "PodFailed")
        self._push_status()
        log.info("pod %s/%s: %s", self.namespace, self.pod_name, self.report.phase)

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
            delete_now(self.api, pod)

    # -- status ---------------------------------------------------------------------------

    def status(self) -> JSON:
        return self.report.render(self.uid, self.init, self.regular)

    def _push_status(self) -> None:
        """Report the status; a pod that is gone or replaced is killed."""
        body = {"metadata": {"uid": self.uid}, "status": self.status()}
        if not push_status(self.api, self.path, body, f"pod {self.namespace}/{self.pod_name}"):
            self.gone = True
            self.request_kill("Deleted", "pod no longer exists", 0.0)


def push_status(api: KubeApi, path: str, body: JSON, what: str) -> bool:
    """Merge-patch ``body`` into the status of the pod at ``path``, retrying API errors;
    False if the pod is gone or replaced (404, or 409 from the uid precondition)."""
    for attempt in range(8):
        try:
            api.patch(f"{path}/status", body)
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False
            if e.status == 422:
                log.error("%s: status rejected: %s", what, e.body)
                return True
            log.warning("%s: status update failed (%s); retrying", what, e.status)
        except Exception as e:
            log.warning("%s: status update failed (%r); retrying", what, e)
        time.sleep(min(5.0, 0.2 * 2**attempt))
    log.error("%s: giving up on a status update", what)
    return True


def delete_now(api: KubeApi, pod: JSON) -> None:
    """Finish a graceful deletion: delete with gracePeriodSeconds=0 (uid precondition)."""
    meta = pod["metadata"]
    if meta.get("deletionGracePeriodSeconds") == 0:
        return  # already done; finalizers (e.g. Job tracking) are someone else's
    try:
        api.delete(
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


def report_lost(api: KubeApi, pod: JSON, reason: str, message: str) -> None:
    """Mark a pod Failed whose processes this node does not have, every container
    terminated with ``reason`` (exit code 137) and Ready conditions False."""
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
        api.patch(
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
