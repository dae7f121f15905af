"""The first step of the path from v1alpha1 to v1beta1 (docs/api.md, "API versions and
compatibility"), against the real kube-apiserver: the CRD serves a second version,
``v1beta1``, with the same schema, ``served: true, storage: false`` and ``conversion: None``;
runs created as either version are read as the other, and stored as v1alpha1.

The CRD applied is a copy of the generated one under a group of its own
(:data:`GROUP`) under names of its own (:func:`tests.support.schema.crd_copy`): the other
tests of the session use the real CRD, which this test must not change, and ``kubectl get
agentrun`` must go on finding only the real AgentRuns.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun_devcluster.controlplane import wait_established
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.runs import agentrun, step
from tests.support.schema import crd_copy

GROUP = "agentrun-compat.test"
KIND = "CompatRun"
PLURAL = "compatruns"
NAME = f"{PLURAL}.{GROUP}"
OLD, NEW = m.VERSION, "v1beta1"


def _served_alone() -> dict[str, Any]:
    """The generated CRD, moved to :data:`GROUP` under names of its own: the CRD as a release
    installs it today."""
    crd = crd_copy(GROUP, KIND)
    assert [v["name"] for v in crd["spec"]["versions"]] == [OLD]
    return crd


def _with_v1beta1(crd: dict[str, Any]) -> dict[str, Any]:
    """``crd`` with v1beta1 added beside v1alpha1: its schema copied, served, not stored, and
    no conversion (the API server only rewrites apiVersion)."""
    new = copy.deepcopy(crd)
    (old,) = new["spec"]["versions"]
    beta = copy.deepcopy(old)
    beta.update(name=NEW, served=True, storage=False)
    new["spec"]["versions"] = [old, beta]
    new["spec"]["conversion"] = {"strategy": "None"}
    return new


def _apply(cluster: TestCluster, crd: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(crd)
    )
    wait_established(cluster.kubectl_path, cluster.kubeconfig, NAME)


@pytest.fixture
def compat_crd(cluster: TestCluster) -> Iterator[dict[str, Any]]:
    crd = _served_alone()
    _apply(cluster, crd)
    try:
        yield crd
    finally:
        cluster.kubectl(
            "delete", "crd", NAME, "--ignore-not-found", "--wait=false"
        )  # names of its own: nothing waits for it


def _create(kube: KubeClients, namespace: str, version: str, name: str) -> dict[str, Any]:
    run = agentrun(name, [step("a", "true")], goal=f"created as {version}")
    run["apiVersion"], run["kind"] = f"{GROUP}/{version}", KIND
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        GROUP, version, namespace, PLURAL, run
    )
    return created


def _get(kube: KubeClients, namespace: str, version: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, version, namespace, PLURAL, name
    )
    return got


def test_a_second_served_version_without_conversion_reads_runs_of_either_version(
    cluster: TestCluster, kube: KubeClients, namespace: str, compat_crd: dict[str, Any]
) -> None:
    # A run made before the upgrade, while only v1alpha1 is served.
    before = _create(kube, namespace, OLD, "before")

    _apply(cluster, _with_v1beta1(compat_crd))
    served = kube.apiext.read_custom_resource_definition(NAME)
    assert [(v.name, v.served, v.storage) for v in served.spec.versions] == [
        (OLD, True, True),
        (NEW, True, False),
    ]

    # v1alpha1 -> v1beta1: the run from before, and one created as v1alpha1 after.
    after = _create(kube, namespace, OLD, "alpha")
    for made in (before, after):
        name = made["metadata"]["name"]
        read = _get(kube, namespace, NEW, name)
        assert read["apiVersion"] == f"{GROUP}/{NEW}"
        assert read["spec"] == made["spec"]
        assert read["metadata"]["uid"] == made["metadata"]["uid"]

    # v1beta1 -> v1alpha1: created as v1beta1, read back as v1alpha1.
    beta = _create(kube, namespace, NEW, "beta")
    assert beta["apiVersion"] == f"{GROUP}/{NEW}"
    read = _get(kube, namespace, OLD, "beta")
    assert read["apiVersion"] == f"{GROUP}/{OLD}"
    assert read["spec"] == beta["spec"]
    assert read["spec"]["goal"] == f"created as {NEW}"

    # The same validation holds at both versions (the schema was copied).
    bad = agentrun("bad", [step("a"), step("a")])
    bad["apiVersion"], bad["kind"] = f"{GROUP}/{NEW}", KIND
    with pytest.raises(ApiException, match="Duplicate value"):
        kube.custom.create_namespaced_custom_object(GROUP, NEW, namespace, PLURAL, bad)

    # Every object is stored as v1alpha1 (the storage version): dropping v1beta1 again, the
    # way back, leaves nothing unreadable.
    stored = kube.apiext.read_custom_resource_definition(NAME).status.stored_versions
    assert stored == [OLD]
    _apply(cluster, compat_crd)
    listed = kube.custom.list_namespaced_custom_object(GROUP, OLD, namespace, PLURAL)
    assert {r["metadata"]["name"] for r in listed["items"]} == {"before", "alpha", "beta"}
    versions = kube.apiext.read_custom_resource_definition(NAME).spec.versions
    assert [v.name for v in versions] == [OLD]
