"""The test MCP server (:mod:`tests.support.mcp_server`) as a pod on the local node, and the
pieces an agent run needs to use it: its entry in ``spec.agent.mcpServers`` and the Secret of
its Authorization header."""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun_devcluster.ports import PortLease
from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support import mcp_server
from tests.support.paths import REPO_ROOT
from tests.support.runs import IMAGE

TOKEN = "Bearer e2e-s3cret"
"""The Authorization header's value, in the Secret :data:`AUTH_SECRET`."""
AUTH_SECRET = "mcp-auth"


class Server:
    """The test MCP server as a pod on the local node (which runs its command as a process
    with the node's network), on a leased port; stopped by deleting the pod, and started again
    as a new pod (``wide``: with another schema of ``add``)."""

    def __init__(self, kube: KubeClients, namespace: str, lease: PortLease, log: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.port = lease.port
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.pod: str | None = None
        self.started = 0

    def start(self, *, wide: bool = False) -> None:
        self.started += 1
        self.pod = f"mcp-server-{self.started}"
        command = [sys.executable, "-m", "tests.support.mcp_server"]
        command += ["--port", str(self.port), "--log", str(self.log), *(["--wide"] if wide else [])]
        container = {"name": "server", "image": IMAGE, "command": command,
                     "workingDir": str(REPO_ROOT)}  # fmt: skip
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.pod, "labels": {"app": "mcp-server"}},
            "spec": {"restartPolicy": "Never", "containers": [container]},
        }
        self.kube.core.create_namespaced_pod(self.namespace, body)
        wait_for(f"the MCP server's pod {self.pod} on port {self.port}", self._listening,
                 timeout=90)  # fmt: skip

    def _phase(self) -> str | None:
        assert self.pod is not None
        pod = self.kube.core.read_namespaced_pod(self.pod, self.namespace)
        return pod.status.phase if pod.status else None

    def _listening(self) -> bool:
        if self._phase() in ("Succeeded", "Failed"):
            raise RuntimeError(f"the MCP server's pod {self.pod} ended: {self._phase()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def _closed(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) != 0

    def stop(self) -> None:
        if self.pod is None:
            return
        with contextlib.suppress(ApiException):
            self.kube.core.delete_namespaced_pod(self.pod, self.namespace, grace_period_seconds=0)
        wait_for(f"the MCP server's pod {self.pod} to stop", self._closed, timeout=60)
        self.pod = None

    def calls(self) -> list[dict[str, Any]]:
        return mcp_server.calls(self.log)


def create_auth_secret(kube: KubeClients, namespace: str) -> str:
    """The Secret of the Authorization header (:data:`TOKEN`); its name."""
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": AUTH_SECRET}, "stringData": {"token": TOKEN}}
    )
    return AUTH_SECRET


def entry(server: Server, *tools: str) -> dict[str, Any]:
    """The server's entry in ``spec.agent.mcpServers``, allowing ``tools``."""
    return {
        "name": "tools",
        "url": server.url,
        "headers": [
            {"name": "Authorization", "secretKeyRef": {"name": AUTH_SECRET, "key": "token"}}
        ],
        "tools": [{"name": t} for t in tools],
    }
