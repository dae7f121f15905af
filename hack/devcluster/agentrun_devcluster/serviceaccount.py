"""API access from pods on the local node: the service-account token volume.

The one volume the local node materializes is the projected volume the ServiceAccount
admission plugin adds (``kube-api-access-*``, with a ``serviceAccountToken`` source). Every
other volume and mount is ignored entirely, whatever its type: emptyDir, configMap, secret,
other projected volumes, downwardAPI, hostPath, persistentVolumeClaim, ephemeral, csi, image
and all others.

A pod whose ``spec.automountServiceAccountToken`` is not false and that has the
``kube-api-access-*`` projected volume gets ``<pod dir>/serviceaccount/`` holding ``token``
(from the TokenRequest API for ``spec.serviceAccountName``, bound to the pod, with the
source's ``expirationSeconds`` (default 3600) and ``audience`` (default: the API
server's)), ``ca.crt`` (the cluster CA of the node's kubeconfig, else the namespace's
``kube-root-ca.crt`` ConfigMap) and ``namespace``. Every container of the pod gets
``AGENTRUN_SERVICEACCOUNT_DIR`` (that directory), ``KUBERNETES_SERVICE_HOST`` and
``KUBERNETES_SERVICE_PORT`` (host and port of the node's kubeconfig server URL, e.g.
127.0.0.1), and literal occurrences of the volume's ``mountPath`` (normally
``/var/run/secrets/kubernetes.io/serviceaccount``) in its ``command`` and ``args`` are
replaced with the directory. The token is requested once per pod and never refreshed (pods
here are short); the directory is removed when the pod's processes are gone. A failed token
request (e.g. the ServiceAccount does not exist) is retried like a configuration error
(:class:`~agentrun_devcluster.podenv.ConfigError`). Pods without that volume
(``automountServiceAccountToken: false`` on the pod or its ServiceAccount) get none of
this: no token and, unlike with a kubelet, no ``KUBERNETES_SERVICE_*`` variables.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import urllib.parse
from pathlib import Path
from typing import cast

import yaml

from .kubeapi import JSON, ApiException, KubeApi, status_message
from .podenv import ConfigError, SourceLookup, TransientConfigError

__all__ = [
    "SERVICEACCOUNT_DIR_ENV",
    "SERVICEACCOUNT_MOUNT_PATH",
    "ServiceAccountVolume",
    "kubeconfig_ca",
    "service_account_volume",
    "service_endpoint",
]

log = logging.getLogger(__name__)

SERVICEACCOUNT_DIR_ENV = "AGENTRUN_SERVICEACCOUNT_DIR"
SERVICEACCOUNT_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICEACCOUNT_VOLUME_PREFIX = "kube-api-access-"
DEFAULT_TOKEN_EXPIRATION_SECONDS = 3600
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"


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


def kubeconfig_ca(kubeconfig: Path) -> bytes | None:
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


def service_endpoint(server: str, default_host: str) -> tuple[str, str]:
    """``(KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT)`` for an API server URL."""
    url = urllib.parse.urlsplit(server)
    port = url.port or (80 if url.scheme == "http" else 443)
    return url.hostname or default_host, str(port)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically, with permissions ``mode``."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class ServiceAccountVolume:
    """The token volume of one pod, materialized as ``directory`` on first use.

    ``lookup`` reads ConfigMaps of the pod's namespace (for the root CA when the node has
    none); ``service_host``/``service_port`` are where pods reach the API server and
    ``cluster_ca`` its CA (None: take it from the ``kube-root-ca.crt`` ConfigMap).
    ``file_mode`` None keeps the files private to the node's user (the process runtime: the
    containers are the node's own processes); a mode (the docker runtime: the volume's
    ``defaultMode``, 0644) lets a container's user read them, and the directory is 0755.
    """

    def __init__(
        self,
        api: KubeApi,
        pod: JSON,
        directory: Path,
        *,
        lookup: SourceLookup,
        service_host: str,
        service_port: str,
        cluster_ca: bytes | None,
        file_mode: int | None = None,
    ) -> None:
        self.api = api
        self.file_mode = file_mode
        self.pod = pod
        self.directory = directory
        self.lookup = lookup
        self.service_host = service_host
        self.service_port = service_port
        self.cluster_ca = cluster_ca
        self.namespace = str(pod["metadata"]["namespace"])
        self._env: dict[str, str] | None = None

    def mount_path(self, container: JSON) -> str:
        """Where ``container`` mounts the token volume (the usual path if it does not)."""
        found = service_account_volume(self.pod)
        if found is not None:
            for mount in container.get("volumeMounts") or []:
                if mount.get("name") == found[0].get("name") and mount.get("mountPath"):
                    return str(mount["mountPath"])
        return SERVICEACCOUNT_MOUNT_PATH

    def path_map(self, container: JSON) -> dict[str, str]:
        """``{mount path: directory}`` for the command line of ``container``; empty unless
        the volume is materialized (call :meth:`env` first)."""
        mount_path = self.mount_path(container)
        if self._env and mount_path.strip("/"):
            return {mount_path: str(self.directory)}
        return {}

    def env(self) -> dict[str, str]:
        """Materialize the volume (once per pod) and return the variables the pod's
        containers get; empty for a pod without that volume.

        Raises :class:`TransientConfigError` or :class:`ConfigError` when the token cannot
        be had yet.
        """
        if self._env is not None:
            return self._env
        found = service_account_volume(self.pod)
        if found is None:
            self._env = {}
            return self._env
        volume, source = found
        spec, meta = self.pod["spec"], self.pod["metadata"]
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
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            answer = self.api.post(
                f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request
            )
        except ApiException as e:
            message = f"{what}: HTTP {e.status}: {status_message(e)}"
            if e.status == 429 or e.status >= 500:
                raise TransientConfigError(message) from e
            raise ConfigError(message) from e
        except Exception as e:
            raise TransientConfigError(f"{what}: {e!r}") from e
        token = str((answer.get("status") or {}).get("token") or "")
        if not token:
            raise TransientConfigError(f"{what}: the TokenRequest answer holds no token")
        private = self.file_mode is None
        self.directory.mkdir(mode=0o700 if private else 0o755, parents=True, exist_ok=True)
        if not private:
            os.chmod(self.directory, 0o755)
        write_file(self.directory / "token", token.encode(), self.file_mode or 0o600)
        write_file(self.directory / "ca.crt", ca, self.file_mode or 0o644)
        write_file(self.directory / "namespace", self.namespace.encode(), self.file_mode or 0o644)
        log.info("pod %s/%s: %s in %s", self.namespace, meta["name"], what, self.directory)
        self._env = {
            SERVICEACCOUNT_DIR_ENV: str(self.directory),
            "KUBERNETES_SERVICE_HOST": self.service_host,
            "KUBERNETES_SERVICE_PORT": self.service_port,
        }
        return self._env

    def remove(self) -> None:
        """Unmount: the token must not outlive the pod's processes."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def _cluster_ca(self, volume: JSON) -> bytes:
        """The node's cluster CA, else the projected volume's root-CA ConfigMap."""
        if self.cluster_ca:
            return self.cluster_ca
        name = ROOT_CA_CONFIGMAP
        for source in (volume.get("projected") or {}).get("sources") or []:
            if (source.get("configMap") or {}).get("name"):
                name = str(source["configMap"]["name"])
        data = self.lookup("ConfigMap", name)
        if not data or not data.get("ca.crt"):
            raise TransientConfigError(
                f"volume {volume.get('name')}: no cluster CA in the node's kubeconfig and "
                f'no key ca.crt in ConfigMap "{name}"'
            )
        return data["ca.crt"].encode()
