"""A pod's volumes for the docker runtime: host directories bind-mounted into its containers.

Each volume a container mounts is made a directory under ``<pod dir>/volumes/<name>`` (or is
one already) and bind-mounted at the ``mountPath`` (with ``subPath``, a path below it):

* the service-account token volume (``kube-api-access-*``): the directory
  :class:`~agentrun_devcluster.serviceaccount.ServiceAccountVolume` keeps (``token``,
  ``ca.crt``, ``namespace``), read-only;
* ``emptyDir``: an empty directory, mode 0777, shared by the pod's containers (``medium``
  and ``sizeLimit`` are not enforced);
* ``configMap``, ``secret``: the keys (or ``items``) as files with ``defaultMode`` (0644) or
  the item's ``mode``, read-only; a missing object or key that is not ``optional`` is a
  configuration error. Values are written as text (binary data is decoded as UTF-8);
* ``downwardAPI`` and ``projected`` (``configMap``, ``secret`` and ``downwardAPI`` sources):
  the same, with ``fieldRef`` items only;
* ``hostPath``: the path itself (``DirectoryOrCreate`` and ``FileOrCreate`` create it).

Every other volume type (persistentVolumeClaim, csi, ephemeral, image, nfs...) and projected
``serviceAccountToken`` sources other than the token volume's raise
:class:`~agentrun_devcluster.podenv.ConfigError`: the container waits with
``CreateContainerConfigError`` saying which volume. Files are written when a container
starts (again for each container, so a later one sees current ConfigMaps) and removed with
the pod.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from .kubeapi import JSON
from .podenv import ConfigError, SourceLookup, field_ref
from .serviceaccount import ServiceAccountVolume, service_account_volume

__all__ = ["PodVolumes"]

DEFAULT_MODE = 0o644
SUPPORTED = ("emptyDir", "configMap", "secret", "downwardAPI", "projected", "hostPath")


def _relative(path: str, what: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ConfigError(f"{what}: {path!r} must be a relative path without '..'")
    return rel


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class PodVolumes:
    """The volumes of one pod (see the module doc)."""

    def __init__(
        self,
        pod: JSON,
        pod_dir: Path,
        *,
        lookup: SourceLookup,
        token_volume: ServiceAccountVolume,
        node_name: str,
        node_ip: str,
    ) -> None:
        self.pod = pod
        self.root = pod_dir / "volumes"
        self.lookup = lookup
        self.token_volume = token_volume
        self.node_name = node_name
        self.node_ip = node_ip
        found = service_account_volume(pod)
        self.token_volume_name = str(found[0]["name"]) if found else None
        self.volumes = {str(v["name"]): v for v in (pod.get("spec") or {}).get("volumes") or []}

    def mounts(self, container: JSON) -> list[JSON]:
        """Docker ``Mounts`` (bind) for the ``volumeMounts`` of ``container``, the volumes
        made first; raises :class:`ConfigError` for what cannot be mounted."""
        mounts: list[JSON] = []
        for mount in container.get("volumeMounts") or []:
            name = str(mount.get("name", ""))
            volume = self.volumes.get(name)
            if volume is None:
                raise ConfigError(f"volumeMount {name!r}: the pod has no volume of that name")
            source, read_only = self._source(volume)
            if mount.get("subPath"):
                source = source / _relative(str(mount["subPath"]), f"volumeMount {name} subPath")
                if not source.exists():
                    source.mkdir(mode=0o777, parents=True)
                    os.chmod(source, 0o777)
            mounts.append(
                {
                    "Type": "bind",
                    "Source": str(source),
                    "Target": str(mount["mountPath"]),
                    "ReadOnly": read_only or bool(mount.get("readOnly")),
                }
            )
        return mounts

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- each kind of volume ------------------------------------------------------------------

    def _source(self, volume: JSON) -> tuple[Path, bool]:
        """The host path of ``volume`` (made now) and whether it is read-only."""
        name = str(volume["name"])
        if name == self.token_volume_name:
            if not (self.token_volume.directory / "token").exists():
                raise ConfigError(f"volume {name}: the service-account token is not there yet")
            return self.token_volume.directory, True
        kind = next((k for k in volume if k != "name"), "")
        if kind not in SUPPORTED:
            raise ConfigError(
                f"volume {name!r}: {kind or 'this'} volumes are not supported by the agentrun "
                f"local node (docker runtime supports {', '.join(SUPPORTED)})"
            )
        if kind == "hostPath":
            return self._host_path(name, volume["hostPath"]), False
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        if kind == "emptyDir":
            os.chmod(directory, 0o777)
            return directory, False
        os.chmod(directory, 0o755)
        spec = volume[kind] or {}
        default_mode = int(spec.get("defaultMode", DEFAULT_MODE))
        files: dict[PurePosixPath, tuple[bytes, int]] = {}
        sources = (spec.get("sources") or []) if kind == "projected" else [{kind: spec}]
        for source in sources:
            files.update(self._files(name, source, default_mode))
        for rel, (data, mode) in files.items():
            _write(directory / rel, data, mode)
        return directory, True

    def _host_path(self, name: str, spec: JSON) -> Path:
        path = Path(str(spec.get("path", "")))
        if not path.is_absolute():
            raise ConfigError(f"volume {name!r}: hostPath {path} is not absolute")
        kind = spec.get("type") or ""
        if kind == "DirectoryOrCreate":
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
        elif kind == "FileOrCreate" and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(0o644)
        elif not path.exists() and kind:
            raise ConfigError(f"volume {name!r}: hostPath {path} does not exist (type {kind})")
        return path

    def _files(
        self, name: str, source: JSON, default_mode: int
    ) -> dict[PurePosixPath, tuple[bytes, int]]:
        """The files one volume source contributes: ``{relative path: (data, mode)}``."""
        for kind, object_kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
            if kind not in source:
                continue
            spec = source[kind] or {}
            object_name = str(spec.get("name") or spec.get("secretName") or "")
            data = self.lookup(object_kind, object_name)
            optional = bool(spec.get("optional"))
            if data is None:
                if optional:
                    return {}
                raise ConfigError(
                    f'volume {name!r}: {object_kind.lower()} "{object_name}" not found'
                )
            mode = int(spec.get("defaultMode", default_mode))
            items = spec.get("items")
            if not items:
                return {_relative(k, f"volume {name}"): (v.encode(), mode) for k, v in data.items()}
            files: dict[PurePosixPath, tuple[bytes, int]] = {}
            for item in items:
                key = str(item["key"])
                if key not in data:
                    if optional:
                        continue
                    raise ConfigError(
                        f"volume {name!r}: couldn't find key {key} in {object_kind} "
                        f"{self.pod['metadata']['namespace']}/{object_name}"
                    )
                rel = _relative(str(item.get("path") or key), f"volume {name}")
                files[rel] = (data[key].encode(), int(item.get("mode", mode)))
            return files
        if "downwardAPI" in source:
            spec = source["downwardAPI"] or {}
            mode = int(spec.get("defaultMode", default_mode))
            files = {}
            for item in spec.get("items") or []:
                rel = _relative(str(item["path"]), f"volume {name}")
                if "fieldRef" not in item:
                    raise ConfigError(
                        f"volume {name!r}: downwardAPI item {rel}: only fieldRef is supported "
                        "by the agentrun local node"
                    )
                value = field_ref(
                    self.pod,
                    str(item["fieldRef"]["fieldPath"]),
                    node_name=self.node_name,
                    node_ip=self.node_ip,
                )
                files[rel] = (value.encode(), int(item.get("mode", mode)))
            return files
        kinds = ", ".join(sorted(source)) or "an empty source"
        raise ConfigError(
            f"volume {name!r}: projected {kinds} is not supported by the agentrun local node"
        )
