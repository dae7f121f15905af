"""How the local node runs a pod's containers, whatever the runtime: what both runtimes
implement, and what they share.

Two container runtimes share one pod lifecycle (:mod:`agentrun_devcluster.pod`):

* ``process`` (:class:`~agentrun_devcluster.process.ProcessRuntime`,
  :mod:`agentrun_devcluster.process`): a container is a local process running its ``command``;
  no images, no isolation, paths rewritten. It needs nothing but this machine, and stays the
  fallback where no Docker engine can be had.
* ``docker`` (:class:`~agentrun_devcluster.dockercontainer.DockerRuntime`): a container is a
  real container of a local Docker Engine: the image's entrypoint, user and files, the
  service-account token and the termination log at their real paths, security contexts and
  resource limits, probes and restarts (see :mod:`agentrun_devcluster.dockercontainer`).

:func:`agentrun_devcluster.node.select_runtime` chooses one from the node's ``--runtime``
option (:data:`RUNTIMES`): ``process``, ``docker`` (:class:`RuntimeUnavailable` when the
engine does not answer), or ``auto`` (docker when the engine answers ``GET /info``, i.e. when
``docker info`` would work, else process). The choice and its reason are logged by the node,
shown on the Node (label :data:`RUNTIME_LABEL`, ``nodeInfo.containerRuntimeVersion``) and
printed by ``agentrun devcluster up``.

:class:`Container` is what the pod lifecycle needs of one container, whatever the runtime;
:class:`PodContext` is what a runtime needs of the pod; :func:`terminate` kills containers of
either runtime. The runtimes import this module and it imports neither of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .kubeapi import JSON
from .podenv import SourceLookup
from .registration import RUNTIME_LABEL
from .serviceaccount import ServiceAccountVolume

__all__ = [
    "RUNTIMES",
    "RUNTIME_LABEL",
    "Container",
    "ContainerRuntime",
    "PodContext",
    "RuntimeUnavailable",
    "terminate",
]

log = logging.getLogger(__name__)

RUNTIMES = ("process", "docker", "auto")


class RuntimeUnavailable(Exception):
    """The runtime asked for cannot be had here."""


@dataclass
class PodContext:
    """What a container runtime needs to know of the pod it runs a container of."""

    pod: JSON
    pod_dir: Path
    node_name: str
    extra_env: Mapping[str, str]
    service_host: str
    service_port: str
    lookup: SourceLookup
    token_volume: ServiceAccountVolume
    started: float = field(default_factory=time.time)

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    def container_env(
        self, service_env: Mapping[str, str], env: Mapping[str, str]
    ) -> dict[str, str]:
        """The environment every runtime gives a container of this pod, before what is its
        own: the node's extra env, ``HOSTNAME`` (the pod name), ``service_env``, then the
        container's resolved ``env``, which wins over them all, as with a kubelet."""
        return {**self.extra_env, "HOSTNAME": self.name, **service_env, **env}


class Container(Protocol):
    """One container of a pod, in whatever runtime, and what has happened to it so far."""

    spec: JSON
    kind: str  # "init" or "regular"
    state: JSON
    kill_reason: str

    @property
    def name(self) -> str: ...
    @property
    def sidecar(self) -> bool: ...
    @property
    def terminated(self) -> bool: ...
    @property
    def running(self) -> bool: ...
    @property
    def ready(self) -> bool: ...

    def status(self, pod_uid: str) -> JSON: ...
    def fail(self, reason: str, message: str, exit_code: int = ...) -> None: ...
    def pull(self) -> tuple[str, str] | None:
        """Get the image: None when done (or when the container failed outright, which
        ``terminated`` then says), else ``(waiting reason, message)`` to retry later."""
        ...

    def launch(self, sa_env: Mapping[str, str], env: Mapping[str, str]) -> None:
        """Start it with the token volume's variables and its resolved env; may raise
        :class:`~agentrun_devcluster.podenv.ConfigError` before anything starts. A failure
        to start terminates it (reason ``StartError``)."""
        ...

    def service_env(self, sa_env: Mapping[str, str]) -> dict[str, str]:
        """The service variables its env's ``$(VAR)`` references see."""
        ...

    def poll(self) -> bool:
        """Record the exit if it has exited; True once terminated."""
        ...

    def signal(self, sig: int) -> None: ...
    def wait_exit(self, timeout: float) -> None: ...
    def release(self) -> None:
        """Free what it holds on the node (log file, stopped container, probes)."""
        ...

    # Restarts (runtimes with ``restarts``): the lifecycle schedules, the container waits.
    def schedule_restart(self, delay: float) -> None: ...
    def restart_due(self) -> bool: ...
    def cancel_restart(self) -> None: ...


class ContainerRuntime(Protocol):
    """A way of running containers: ``process`` or ``docker``."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str:
        """``nodeInfo.containerRuntimeVersion``, e.g. ``docker://20.10.24``."""
        ...

    @property
    def restarts(self) -> bool:
        """Whether containers are restarted per the pod's restartPolicy."""
        ...

    def container(self, spec: JSON, kind: str, ctx: PodContext) -> Container: ...
    def token_file_mode(self, volume: JSON) -> int | None:
        """Mode of the token volume's files (None: private to the node's user)."""
        ...

    def pod_finished(self, ctx: PodContext) -> None:
        """Called when the pod's containers are gone: free what the pod held."""
        ...

    def start(self) -> None:
        """Called once when the node starts (e.g. to clean up after a previous node)."""
        ...

    def stop(self) -> None:
        """Called once when the node has shut down."""
        ...


def terminate(containers: Iterable[Container], grace: float, *, reason: str = "") -> None:
    """SIGTERM the running ``containers``, SIGKILL them after ``grace`` seconds, and record
    their exits (with ``reason`` ``DeadlineExceeded`` when that is why they were killed).
    Containers waiting to be restarted are not restarted."""
    import signal

    containers = list(containers)
    for c in containers:
        c.cancel_restart()
    running = [c for c in containers if c.running]
    for c in running:
        if reason == "DeadlineExceeded" and not c.kill_reason:
            c.kill_reason = reason
        c.signal(signal.SIGTERM)
    end = time.monotonic() + max(0.0, grace)
    while time.monotonic() < end and not all(c.poll() for c in running):
        time.sleep(0.1)
    for c in running:
        c.signal(signal.SIGKILL)
    for c in running:
        c.wait_exit(5)
        c.poll()
