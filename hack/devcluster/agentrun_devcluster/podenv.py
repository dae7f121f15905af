"""A container's environment, resolved from its pod spec the way a kubelet resolves it.

Pure: no API calls and no I/O. ConfigMaps and Secrets come through a small lookup callable
(:data:`SourceLookup`) that the caller backs with the API (the local node) or with a dict
(tests); everything else a container's env may refer to is in the pod and in the few node
facts passed in (its name, its IP, its capacity).

Supported, like a kubelet:

* ``envFrom`` (``configMapRef`` / ``secretRef``, with ``prefix`` and ``optional``), then
  ``env`` in order; a later definition of a name wins over an earlier one. Keys that are not
  valid variable names (after the prefix) are skipped.
* ``env[].value`` with ``$(VAR)`` expansion (:func:`expand_vars`): it sees the variables
  defined before it and the service variables passed in (``KUBERNETES_SERVICE_HOST`` ...).
  Values from ``valueFrom`` are taken as they are, never expanded.
* ``valueFrom.fieldRef``: ``metadata.name``, ``metadata.namespace``, ``metadata.uid``,
  ``metadata.labels``, ``metadata.annotations``, ``metadata.labels['k']``,
  ``metadata.annotations['k']``, ``spec.nodeName``, ``spec.serviceAccountName``,
  ``status.podIP(s)`` (the pod's own loopback address,
  :func:`pod_ip`) and ``status.hostIP(s)`` (the node's).
* ``valueFrom.resourceFieldRef``: the container's (or ``containerName``'s) requests or
  limits as written in the spec, else the node's capacity (no divisor, no unit conversion).
* ``valueFrom.configMapKeyRef`` / ``secretKeyRef``, with ``optional``: an optional source
  that is missing, or an optional key that is missing, leaves the variable undefined.

What cannot be resolved raises :class:`ConfigError` with a kubelet-like message; the local
node reports it as ``waiting: CreateContainerConfigError`` and retries (see
:mod:`agentrun_devcluster.pod`). A lookup that fails for a reason worth retrying (an API
error) raises :class:`TransientConfigError`, which is passed through unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ConfigError",
    "SourceLookup",
    "TransientConfigError",
    "expand_vars",
    "field_ref",
    "object_data",
    "resolve_env",
    "resource_field_ref",
]

JSON = dict[str, Any]

#: ``(kind, name) -> data``: the data of the ConfigMap or Secret ``name`` of the pod's
#: namespace as text (see :func:`object_data`), or None if it does not exist. ``kind`` is
#: ``"ConfigMap"`` or ``"Secret"``.
SourceLookup = Callable[[str, str], Mapping[str, str] | None]

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_VAR_REF = re.compile(r"\$\$|\$\(([^)]*)\)")
_MAP_ENTRY = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")


class ConfigError(Exception):
    """A container's configuration cannot be resolved (kubelet: CreateContainerConfigError)."""


class TransientConfigError(Exception):
    """An API error worth retrying while resolving configuration."""


def expand_vars(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined vars are substituted, ``$$`` escapes ``$``,
    references to undefined variables are left as they are."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(sub, value)


def object_data(kind: str, obj: JSON) -> dict[str, str]:
    """The data of a ConfigMap or Secret object as text, as a kubelet exposes it to env:
    base64 ``data`` of a Secret (plus ``stringData``), ``binaryData`` plus ``data`` of a
    ConfigMap (the plain entries win)."""
    data: dict[str, str] = {}
    encoded, plain = ("data", "stringData") if kind == "Secret" else ("binaryData", "data")
    for k, v in (obj.get(encoded) or {}).items():
        data[k] = base64.b64decode(v).decode("utf-8", "replace")
    data.update(obj.get(plain) or {})
    return data


def _key_values(items: Mapping[str, Any] | None) -> str:
    return "\n".join(f'{k}="{v}"' for k, v in sorted((items or {}).items()))


def pod_ip(uid: str) -> str:
    """The pod's own address: one of 127.0.0.0/8 (all of it is the loopback interface), from
    the pod's uid, as a network plugin gives each pod its own IP. The node's pods share the
    host's network namespace, so an address is a convention, not a fence: a pod that binds
    its own address (as a model turn's does) never clashes with another pod's on a port."""
    digest = hashlib.sha256(uid.encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


def field_ref(pod: JSON, path: str, *, node_name: str, node_ip: str) -> str:
    """The value of a downward-API ``fieldRef`` with ``fieldPath`` ``path``."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    m = _MAP_ENTRY.fullmatch(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple: dict[str, Callable[[], Any]] = {
        "metadata.name": lambda: meta["name"],
        "metadata.namespace": lambda: meta["namespace"],
        "metadata.uid": lambda: meta["uid"],
        "metadata.labels": lambda: _key_values(meta.get("labels")),
        "metadata.annotations": lambda: _key_values(meta.get("annotations")),
        "spec.nodeName": lambda: spec.get("nodeName") or node_name,
        "spec.serviceAccountName": lambda: spec.get("serviceAccountName", ""),
        "status.podIP": lambda: pod_ip(str(meta["uid"])),
        "status.podIPs": lambda: pod_ip(str(meta["uid"])),
        "status.hostIP": lambda: node_ip,
        "status.hostIPs": lambda: node_ip,
    }
    if path not in simple:
        raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")
    return str(simple[path]())


def resource_field_ref(
    pod: JSON, ref: JSON, container: JSON, *, capacity: Mapping[str, str]
) -> str:
    """The value of a ``resourceFieldRef`` (e.g. ``limits.cpu``) of ``container``, or of the
    container named by its ``containerName``; the node's capacity when not set."""
    target = container
    if ref.get("containerName"):
        spec = pod.get("spec") or {}
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            if c.get("name") == ref["containerName"]:
                target = c
    kind, _, name = str(ref.get("resource", "")).partition(".")
    value = ((target.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        value = capacity.get(name, "0")
    return str(value)


def _env_from(container: JSON, lookup: SourceLookup) -> dict[str, str]:
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = str(src.get("prefix") or "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = src.get(key)
            if not ref:
                continue
            data = lookup(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
            for k, v in data.items():
                if _ENV_NAME.match(prefix + k):
                    env[prefix + k] = v
    return env


def _key_ref(kind: str, ref: JSON, namespace: str, lookup: SourceLookup) -> str | None:
    """The value of a ``configMapKeyRef`` / ``secretKeyRef``; None if optional and absent."""
    data = lookup(kind, ref["name"])
    optional = bool(ref.get("optional"))
    if data is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return data[ref["key"]]


def resolve_env(
    pod: JSON,
    container: JSON,
    lookup: SourceLookup,
    *,
    node_name: str,
    node_ip: str,
    capacity: Mapping[str, str],
    service_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables ``container`` (a container spec of ``pod``) defines: ``envFrom`` then
    ``env`` (later wins), with ``$(VAR)`` expansion, like a kubelet. ``service_env`` (e.g.
    ``KUBERNETES_SERVICE_HOST``) is seen by the expansion but not returned."""
    service_env = service_env or {}
    namespace = str(pod["metadata"].get("namespace", ""))
    env = _env_from(container, lookup)
    for var in container.get("env") or []:
        name = str(var["name"])
        if "valueFrom" not in var:
            env[name] = expand_vars(str(var.get("value") or ""), {**service_env, **env})
            continue
        vf = var["valueFrom"]
        value: str | None
        if "fieldRef" in vf:
            value = field_ref(
                pod, str(vf["fieldRef"]["fieldPath"]), node_name=node_name, node_ip=node_ip
            )
        elif "resourceFieldRef" in vf:
            value = resource_field_ref(pod, vf["resourceFieldRef"], container, capacity=capacity)
        elif "configMapKeyRef" in vf:
            value = _key_ref("ConfigMap", vf["configMapKeyRef"], namespace, lookup)
        elif "secretKeyRef" in vf:
            value = _key_ref("Secret", vf["secretKeyRef"], namespace, lookup)
        else:
            raise ConfigError(f"env {name}: unsupported valueFrom {sorted(vf)}")
        if value is not None:
            env[name] = value
    return env
