"""A local Kubernetes for tests and development, with or without Docker.

* :class:`ControlPlane`: etcd + kube-apiserver + kube-controller-manager as local processes
  (binaries built by ``hack/build-controlplane.sh``).
* :class:`LocalNode` / :class:`NodeProcess`: a kubelet stand-in that binds pods to itself
  and runs them: by default their commands as local processes (no images, no isolation,
  no volumes but the service-account token), or with ``runtime="docker"`` as containers
  of the local Docker engine (see :mod:`agentrun_devcluster.node` and the modules it
  lists).
* ``agentrun devcluster up|node|kubeconfig``: :mod:`agentrun_devcluster.cli`.
"""

from .binaries import BIN_DIR_ENV, BinariesError, resolve_bin_dir
from .controlplane import ControlPlane, ControlPlaneError
from .node import DEFAULT_NODE_NAME, LocalNode, NodeProcess
from .pki import PKI

__all__ = [
    "BIN_DIR_ENV",
    "DEFAULT_NODE_NAME",
    "PKI",
    "BinariesError",
    "ControlPlane",
    "ControlPlaneError",
    "LocalNode",
    "NodeProcess",
    "resolve_bin_dir",
]
