"""The local node's env resolution (agentrun_devcluster.podenv), without a cluster.

ConfigMaps and Secrets come from a dict-backed lookup; the pod is a plain manifest.
"""

from __future__ import annotations

import ast
import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster import podenv
from agentrun_devcluster.podenv import (
    ConfigError,
    TransientConfigError,
    expand_vars,
    field_ref,
    object_data,
    pod_ip,
    resolve_env,
    resource_field_ref,
)

NODE = "test-node"
NODE_IP = "127.0.0.9"
CAPACITY = {"cpu": "2", "memory": "8Gi"}

Objects = Mapping[tuple[str, str], Mapping[str, str]]


def make_pod(container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "step-1",
            "namespace": "runs",
            "uid": "0b5e-uid",
            "labels": {"app": "agentrun", "agentrun.dev/step": "fetch"},
            "annotations": {"note": 'say "hi"'},
        },
        "spec": {"containers": [container], **spec},
    }


class Lookup:
    """A SourceLookup over ``{(kind, name): data}`` that records what it was asked."""

    def __init__(self, objects: Objects | None = None) -> None:
        self.objects = dict(objects or {})
        self.calls: list[tuple[str, str]] = []

    def __call__(self, kind: str, name: str) -> Mapping[str, str] | None:
        self.calls.append((kind, name))
        return self.objects.get((kind, name))


def resolve(
    container: dict[str, Any],
    objects: Objects | None = None,
    *,
    service_env: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, str]:
    return resolve_env(
        make_pod(container, **spec),
        container,
        Lookup(objects),
        node_name=NODE,
        node_ip=NODE_IP,
        capacity=CAPACITY,
        service_env=service_env,
    )


def env_of(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"name": "main", "command": ["true"], "env": list(entries)}


def key_ref(kind: str, name: str, key: str, *, optional: bool | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": name, "key": key}
    if optional is not None:
        ref["optional"] = optional
    field = "configMapKeyRef" if kind == "ConfigMap" else "secretKeyRef"
    return {field: ref}


# -- plain values, expansion, order ---------------------------------------------------------


def test_no_env_resolves_to_nothing() -> None:
    assert resolve({"name": "main", "command": ["true"]}) == {}


def test_plain_values_and_a_missing_value_is_empty() -> None:
    env = resolve(env_of({"name": "A", "value": "1"}, {"name": "EMPTY"}))
    assert env == {"A": "1", "EMPTY": ""}


def test_values_expand_earlier_variables_only() -> None:
    env = resolve(
        env_of(
            {"name": "LATER_REF", "value": "x-$(B)"},
            {"name": "B", "value": "b"},
            {"name": "C", "value": "$(B)/$(B)"},
        )
    )
    assert env == {"LATER_REF": "x-$(B)", "B": "b", "C": "b/b"}


def test_expansion_escapes_and_leaves_undefined_references() -> None:
    env = resolve(env_of({"name": "A", "value": "$$(B) $(UNDEFINED) $$ $"}))
    assert env == {"A": "$(B) $(UNDEFINED) $ $"}


def test_service_env_is_seen_by_expansion_but_not_returned() -> None:
    service = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    env = resolve(
        env_of(
            {
                "name": "URL",
                "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)",
            }
        ),
        service_env=service,
    )
    assert env == {"URL": "https://127.0.0.1:6443"}


def test_container_env_wins_over_service_env_in_expansion() -> None:
    env = resolve(
        env_of(
            {"name": "KUBERNETES_SERVICE_HOST", "value": "api.local"},
            {"name": "URL", "value": "$(KUBERNETES_SERVICE_HOST)"},
        ),
        service_env={"KUBERNETES_SERVICE_HOST": "127.0.0.1"},
    )
    assert env == {"KUBERNETES_SERVICE_HOST": "api.local", "URL": "api.local"}


def test_a_later_definition_wins() -> None:
    env = resolve(env_of({"name": "A", "value": "first"}, {"name": "A", "value": "second"}))
    assert env == {"A": "second"}


def test_env_overrides_env_from_and_expands_its_values() -> None:
    container = env_of({"name": "MODE", "value": "env-$(MODE)"})
    container["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    env = resolve(container, {("ConfigMap", "settings"): {"MODE": "cm", "OTHER": "o"}})
    assert env == {"MODE": "env-cm", "OTHER": "o"}


def test_value_from_is_not_expanded() -> None:
    env = resolve(
        env_of(
            {"name": "B", "value": "b"},
            {"name": "A", "valueFrom": key_ref("ConfigMap", "cm", "raw")},
        ),
        {("ConfigMap", "cm"): {"raw": "$(B)"}},
    )
    assert env == {"B": "b", "A": "$(B)"}


def test_expand_vars_directly() -> None:
    assert expand_vars("$(A)-$(B)-$$(A)", {"A": "1"}) == "1-$(B)-$(A)"
    assert expand_vars("no refs", {}) == "no refs"


# -- fieldRef -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "step-1"),
        ("metadata.namespace", "runs"),
        ("metadata.uid", "0b5e-uid"),
        ("metadata.labels['agentrun.dev/step']", "fetch"),
        ("metadata.labels['absent']", ""),
        ("metadata.annotations['note']", 'say "hi"'),
        ("metadata.labels", 'agentrun.dev/step="fetch"\napp="agentrun"'),
        ("metadata.annotations", 'note="say "hi""'),
        ("spec.serviceAccountName", "runner"),
        ("spec.nodeName", "bound-node"),
        ("status.podIP", pod_ip("0b5e-uid")),
        ("status.podIPs", pod_ip("0b5e-uid")),
        ("status.hostIP", NODE_IP),
        ("status.hostIPs", NODE_IP),
    ],
)
def test_field_ref(path: str, expected: str) -> None:
    env = resolve(
        env_of({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}),
        serviceAccountName="runner",
        nodeName="bound-node",
    )
    assert env == {"V": expected}


def test_field_ref_node_name_before_binding_is_this_node() -> None:
    pod = make_pod({"name": "main"})
    assert field_ref(pod, "spec.nodeName", node_name=NODE, node_ip=NODE_IP) == NODE


def test_field_ref_without_a_service_account_name_is_empty() -> None:
    pod = make_pod({"name": "main"})
    assert field_ref(pod, "spec.serviceAccountName", node_name=NODE, node_ip=NODE_IP) == ""


def test_unsupported_field_path_is_a_config_error() -> None:
    container = env_of({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}})
    with pytest.raises(ConfigError, match=r"^unsupported fieldRef fieldPath 'spec.hostname'$"):
        resolve(container)


# -- resourceFieldRef -----------------------------------------------------------------------


def test_resource_field_ref_reads_the_container_then_the_node_capacity() -> None:
    container = env_of(
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
        {"name": "GPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}},
    )
    container["resources"] = {"limits": {"cpu": "500m"}}
    assert resolve(container) == {"CPU": "500m", "MEM": "8Gi", "GPU": "0"}


def test_resource_field_ref_of_another_container() -> None:
    main = {"name": "main", "resources": {"limits": {"memory": "1Gi"}}}
    init = {"name": "setup", "resources": {"limits": {"memory": "64Mi"}}}
    pod = make_pod(main, initContainers=[init])
    ref = {"containerName": "setup", "resource": "limits.memory"}
    assert resource_field_ref(pod, ref, main, capacity=CAPACITY) == "64Mi"
    assert resource_field_ref(pod, {"resource": "limits.memory"}, main, capacity=CAPACITY) == (
        "1Gi"
    )


# -- configMapKeyRef and secretKeyRef -------------------------------------------------------


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_key_ref_found(kind: str) -> None:
    lookup = Lookup({(kind, "src"): {"token": "s3cr3t"}})
    container = env_of({"name": "V", "valueFrom": key_ref(kind, "src", "token")})
    env = resolve_env(
        make_pod(container), container, lookup, node_name=NODE, node_ip=NODE_IP, capacity={}
    )
    assert env == {"V": "s3cr3t"}
    assert lookup.calls == [(kind, "src")]


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_key_ref_missing_key_is_a_config_error(kind: str) -> None:
    container = env_of({"name": "V", "valueFrom": key_ref(kind, "src", "absent")})
    with pytest.raises(ConfigError) as e:
        resolve(container, {(kind, "src"): {"token": "x"}})
    assert str(e.value) == f"couldn't find key absent in {kind} runs/src"


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_key_ref_missing_object_is_a_config_error(kind: str) -> None:
    container = env_of({"name": "V", "valueFrom": key_ref(kind, "nowhere", "k", optional=False)})
    with pytest.raises(ConfigError) as e:
        resolve(container)
    assert str(e.value) == f'{kind.lower()} "nowhere" not found'


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_optional_key_ref_leaves_the_variable_undefined(kind: str) -> None:
    container = env_of(
        {"name": "NO_OBJECT", "valueFrom": key_ref(kind, "nowhere", "k", optional=True)},
        {"name": "NO_KEY", "valueFrom": key_ref(kind, "src", "absent", optional=True)},
        {"name": "REF", "value": "[$(NO_OBJECT)][$(NO_KEY)]"},
    )
    env = resolve(container, {(kind, "src"): {"token": "x"}})
    assert env == {"REF": "[$(NO_OBJECT)][$(NO_KEY)]"}


def test_optional_missing_key_keeps_an_earlier_value() -> None:
    container = env_of(
        {"name": "V", "value": "default"},
        {"name": "V", "valueFrom": key_ref("Secret", "src", "absent", optional=True)},
    )
    assert resolve(container, {("Secret", "src"): {}}) == {"V": "default"}


def test_first_unresolvable_variable_stops_resolution() -> None:
    lookup = Lookup()
    container = env_of(
        {"name": "A", "valueFrom": key_ref("ConfigMap", "first", "k")},
        {"name": "B", "valueFrom": key_ref("Secret", "second", "k")},
    )
    with pytest.raises(ConfigError, match='configmap "first" not found'):
        resolve_env(
            make_pod(container), container, lookup, node_name=NODE, node_ip=NODE_IP, capacity={}
        )
    assert lookup.calls == [("ConfigMap", "first")]


def test_lookup_errors_pass_through() -> None:
    def failing(kind: str, name: str) -> Mapping[str, str] | None:
        raise TransientConfigError(f"reading {kind} runs/{name}: HTTP 503")

    container = env_of({"name": "V", "valueFrom": key_ref("Secret", "src", "k")})
    with pytest.raises(TransientConfigError, match="HTTP 503"):
        resolve_env(
            make_pod(container), container, failing, node_name=NODE, node_ip=NODE_IP, capacity={}
        )


# -- envFrom ----------------------------------------------------------------------------------


def test_env_from_with_prefix_skips_invalid_names_and_later_sources_win() -> None:
    container: dict[str, Any] = {
        "name": "main",
        "envFrom": [
            {"configMapRef": {"name": "cm"}, "prefix": "CM_"},
            {"secretRef": {"name": "sec"}},
            {"configMapRef": {"name": "cm"}},
        ],
    }
    objects = {
        ("ConfigMap", "cm"): {"A": "cm-a", "1BAD": "x", "has space": "y", "SHARED": "cm"},
        ("Secret", "sec"): {"SHARED": "secret", "TOKEN": "t"},
    }
    env = resolve(container, objects)
    assert env == {
        "CM_A": "cm-a",
        "CM_1BAD": "x",  # valid once prefixed
        "CM_SHARED": "cm",
        "SHARED": "cm",
        "TOKEN": "t",
        "A": "cm-a",
    }


def test_env_from_missing_source() -> None:
    optional = {"name": "main", "envFrom": [{"secretRef": {"name": "gone", "optional": True}}]}
    assert resolve(optional) == {}
    required = {"name": "main", "envFrom": [{"secretRef": {"name": "gone"}}]}
    with pytest.raises(ConfigError) as e:
        resolve(required)
    assert str(e.value) == 'secret "gone" not found'


# -- unsupported sources ----------------------------------------------------------------------


def test_unsupported_value_from_names_the_variable_and_the_source() -> None:
    container = env_of(
        {"name": "FILE", "valueFrom": {"fileKeyRef": {"path": "x", "key": "k", "volumeName": "v"}}}
    )
    with pytest.raises(ConfigError) as e:
        resolve(container)
    assert str(e.value) == "env FILE: unsupported valueFrom ['fileKeyRef']"


def test_empty_value_from_is_unsupported() -> None:
    with pytest.raises(ConfigError, match=r"^env V: unsupported valueFrom \[\]$"):
        resolve(env_of({"name": "V", "valueFrom": {}}))


# -- object data ----------------------------------------------------------------------------


def test_object_data_decodes_secrets_and_binary_config_map_entries() -> None:
    b64 = base64.b64encode
    secret = {"data": {"a": b64(b"alpha").decode(), "b": b64(b"old").decode()}}
    secret["stringData"] = {"b": "new"}
    assert object_data("Secret", secret) == {"a": "alpha", "b": "new"}
    cm = {"data": {"plain": "p"}, "binaryData": {"bin": b64(b"\xffok").decode()}}
    assert object_data("ConfigMap", cm) == {"plain": "p", "bin": "\ufffdok"}
    assert object_data("ConfigMap", {}) == {}


# -- purity ---------------------------------------------------------------------------------


def test_podenv_imports_nothing_that_does_io() -> None:
    tree = ast.parse(Path(podenv.__file__).read_text())
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    allowed = {"__future__", "base64", "hashlib", "re", "collections.abc", "typing"}
    assert set(imported) <= allowed, sorted(set(imported) - allowed)


def test_each_pod_has_its_own_loopback_address() -> None:
    addresses = {pod_ip(f"uid-{i}") for i in range(1000)}
    assert len(addresses) == 1000
    assert all(a.startswith("127.") and a != NODE_IP for a in addresses)
    assert pod_ip("uid-1") == pod_ip("uid-1")
