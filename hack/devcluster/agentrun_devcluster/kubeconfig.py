"""Writing and reading the small kubeconfig files the dev cluster hands out."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, cast

import yaml

__all__ = [
    "read_server",
    "request_serviceaccount_kubeconfig",
    "write_kubeconfig",
    "write_private_yaml",
    "write_token_kubeconfig",
]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_pem: bytes,
    user: str,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    token: str | None = None,
    cluster_name: str = "agentrun-devcluster",
    namespace: str | None = None,
) -> Path:
    """Write a self-contained kubeconfig (credentials embedded) with one context; mode 0600."""
    if token is None and (client_cert_pem is None or client_key_pem is None):
        raise ValueError("need either a token or a client certificate and key")
    user_entry: dict[str, Any] = {}
    if token is not None:
        user_entry["token"] = token
    else:
        assert client_cert_pem is not None and client_key_pem is not None
        user_entry["client-certificate-data"] = _b64(client_cert_pem)
        user_entry["client-key-data"] = _b64(client_key_pem)
    context: dict[str, Any] = {"cluster": cluster_name, "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": f"{user}@{cluster_name}", "context": context}],
        "current-context": f"{user}@{cluster_name}",
        "preferences": {},
    }
    return write_private_yaml(path, doc)


def write_private_yaml(path: Path, doc: Any) -> Path:
    """Write ``doc`` as YAML at ``path``, readable by its owner only (mode 0600), at once (a
    reader never sees half of it); ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    os.replace(tmp, path)
    return path


def read_server(path: Path) -> str:
    """The server URL of a kubeconfig's current context."""
    doc = cast(dict[str, Any], yaml.safe_load(path.read_text()))
    current = doc.get("current-context")
    contexts = {c["name"]: c["context"] for c in doc.get("contexts", [])}
    clusters = {c["name"]: c["cluster"] for c in doc.get("clusters", [])}
    cluster_name = contexts[current]["cluster"] if current in contexts else None
    if cluster_name is None:
        cluster_name = next(iter(clusters))
    return cast(str, clusters[cluster_name]["server"])


def _current(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(context, cluster) entries of a kubeconfig's current context."""
    contexts = {c["name"]: c["context"] for c in doc.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in doc.get("clusters") or []}
    context = contexts.get(doc.get("current-context", ""), {})
    name = context.get("cluster") or next(iter(clusters))
    return context, dict(clusters[name])


def write_token_kubeconfig(
    base: Path, path: Path, *, user: str, token: str, namespace: str | None = None
) -> Path:
    """A kubeconfig for ``base``'s current cluster (server, CA, TLS settings) with a token."""
    doc = cast(dict[str, Any], yaml.safe_load(base.read_text()))
    _, cluster = _current(doc)
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((base.parent / ca).resolve())
    context: dict[str, Any] = {"cluster": "cluster", "user": user}
    if namespace:
        context["namespace"] = namespace
    out = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(out, f, sort_keys=False)
    os.replace(tmp, path)
    return path


def request_serviceaccount_kubeconfig(
    admin_kubeconfig: Path,
    namespace: str,
    name: str,
    path: Path,
    *,
    expiration_seconds: int = 24 * 3600,
) -> Path:
    """Ask the TokenRequest API (``serviceaccounts/token``) for a token of ServiceAccount
    ``namespace/name`` and write a kubeconfig with it; works against any cluster."""
    from .kubeapi import KubeApi  # local: keep this module light

    api = KubeApi(admin_kubeconfig)
    try:
        resp = api.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
    finally:
        api.close()
    return write_token_kubeconfig(
        admin_kubeconfig,
        path,
        user=f"system:serviceaccount:{namespace}:{name}",
        token=str(resp["status"]["token"]),
        namespace=namespace,
    )
