"""The local node's Node object, its heartbeats, and the binding of pods to it.

Like a kubelet, the local node registers a Node (labels ``kubernetes.io/hostname``, ``os``,
``arch``, ``agentrun.dev/local-node`` and :data:`RUNTIME_LABEL`, the container runtime: see
:mod:`agentrun_devcluster.runtime`) with a Ready condition, its address
(:data:`NODE_IP`, which every pod shares) and allocatable cpu/memory/pods/ephemeral-storage
(this machine's, unless overridden), its streaming endpoint once it serves one
(``daemonEndpoints.kubeletEndpoint.Port``, with ``declaredFeatures: [ExtendWebSocketsToKubelet]``
so that the API server passes WebSocket exec and attach requests on as they came: see
:mod:`agentrun_devcluster.streaming`; port 0 and no features until then, or when it serves
none), and keeps it alive: a status heartbeat and a Lease in
``kube-node-lease`` renewed every few seconds. A deleted Node is registered again at the
next heartbeat. ``TaintNodesByCondition`` adds ``node.kubernetes.io/not-ready`` at creation
and, without a node-lifecycle controller, nothing would lift it: registration clears the
taints.

Scheduling is binding every unscheduled pod (without ``schedulingGates``) to this node
through the ``pods/binding`` subresource (:func:`bind`); node selectors, affinity, taints
and tolerations are not evaluated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading

from .kubeapi import JSON, ApiException, KubeApi, now_micro, now_rfc3339

__all__ = [
    "NODE_IP",
    "RUNTIME_LABEL",
    "STREAMING_FEATURES",
    "NodeRegistration",
    "bind",
    "default_capacity",
]

log = logging.getLogger(__name__)

#: The node's address. Pods run on the host's network; each has an address of its own
#: (:func:`agentrun_devcluster.podenv.pod_ip`).
NODE_IP = "127.0.0.1"
LEASE_DURATION_SECONDS = 40
#: Label of the Node: the container runtime its pods run in (``process`` or ``docker``).
RUNTIME_LABEL = "agentrun.dev/container-runtime"
#: ``status.declaredFeatures`` of a node that serves exec and attach: the API server
#: (``ExtendWebSocketsToKubelet``, pkg/registry/core/pod/rest/subresources.go) then passes a
#: WebSocket request of any protocol on to it instead of translating v5 to SPDY.
STREAMING_FEATURES = ["ExtendWebSocketsToKubelet"]


def memory_kib() -> int:
    """This machine's memory in KiB (8 GiB if it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 8 * 1024 * 1024


def goarch() -> str:
    """This machine's architecture, as Go (and so Kubernetes) names it."""
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def default_capacity() -> dict[str, str]:
    """What the node offers unless told otherwise: this machine's cpus and memory."""
    return {
        "cpu": str(os.cpu_count() or 2),
        "memory": f"{memory_kib()}Ki",
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }


class NodeRegistration:
    """The Node object ``name`` and its Lease, kept alive by :meth:`heartbeat_loop`."""

    def __init__(
        self,
        api: KubeApi,
        name: str,
        capacity: dict[str, str],
        *,
        runtime: str = "process",
        runtime_version: str = "agentrun-local://0",
    ) -> None:
        self.api = api
        self.name = name
        self.capacity = capacity
        self.runtime = runtime
        self.runtime_version = runtime_version
        self.registered_at = now_rfc3339()
        #: The port of the node's streaming server (:mod:`agentrun_devcluster.streaming`);
        #: 0 while it serves none.
        self.kubelet_port = 0

    @property
    def path(self) -> str:
        return f"/api/v1/nodes/{self.name}"

    def status(self) -> JSON:
        """The Node's status: Ready, no pressure, capacity, address and node info."""
        t = now_rfc3339()

        def cond(ctype: str, status: str, reason: str, message: str) -> JSON:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": t,
                "lastTransitionTime": self.registered_at,
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
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            # null removes what a previous node process declared (a merge patch).
            "declaredFeatures": STREAMING_FEATURES if self.kubelet_port else None,
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": f"agentrun local node on {platform.system()}",
                "containerRuntimeVersion": self.runtime_version,
                "kubeletVersion": "v0.0.0-agentrun-local",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": goarch(),
            },
        }

    def register(self) -> None:
        """Create (or adopt) the Node, clear the not-ready taint and post a Ready status."""
        try:
            self.api.get(self.path)
        except ApiException as e:
            if e.status != 404:
                raise
            labels = {
                "kubernetes.io/hostname": self.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": goarch(),
                "agentrun.dev/local-node": "true",
                RUNTIME_LABEL: self.runtime,
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
        # node-lifecycle controller to lift it. The runtime label follows this node process.
        self.api.patch(
            self.path,
            {"metadata": {"labels": {RUNTIME_LABEL: self.runtime}}, "spec": {"taints": None}},
        )
        self.api.patch(f"{self.path}/status", {"status": self.status()})
        self.renew_lease()

    def renew_lease(self) -> None:
        """Renew (or create) the node's Lease in ``kube-node-lease``."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": now_micro(),
        }
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

    def heartbeat(self) -> None:
        """Post the status and renew the Lease; register again if the Node was deleted."""
        try:
            self.api.patch(f"{self.path}/status", {"status": self.status()})
            self.renew_lease()
        except ApiException as e:
            if e.status == 404:
                log.warning("node %s was deleted; registering again", self.name)
                with contextlib.suppress(Exception):
                    self.register()
            else:
                log.warning("heartbeat failed: HTTP %s", e.status)
        except Exception as e:
            log.warning("heartbeat failed: %r", e)

    def heartbeat_loop(self, stop: threading.Event, interval: float) -> None:
        """A :meth:`heartbeat` every ``interval`` seconds until ``stop`` is set."""
        while not stop.wait(interval):
            self.heartbeat()


def bind(api: KubeApi, pod: JSON, node_name: str) -> None:
    """Bind an unscheduled pod to node ``node_name`` (pods/binding), as a scheduler would."""
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        api.post(
            f"/api/v1/namespaces/{ns}/pods/{name}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": ns, "uid": meta["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
            },
        )
        log.info("pod %s/%s: bound to %s", ns, name, node_name)
    except ApiException as e:
        if e.status not in (404, 409):  # gone, or already bound
            raise
