"""The AgentRun CRD's category (``agentrun``) beside kagent's ``agents.kagent.dev``, against
the real kube-apiserver and the real kubectl.

The category was ``agents`` in 0.1.0: kubectl expands a category before it looks for a resource
of that name, so with kagent installed ``kubectl get agents`` listed AgentRuns instead of
kagent's Agents. ``kubectl get agentrun`` (the category, and the singular name) lists
AgentRuns alone.

Since agentrun.dev has an Agent kind of its own (docs/agents.md), ``agents`` names two
resources where kagent is installed too, and kubectl takes the group it lists first
(``agentrun.dev``, before ``kagent.dev``): kagent's are ``agents.kagent.dev`` (or its category
``kagent``), ours ``agents.agentrun.dev``. What this test holds: each name that is ours or
kagent's alone lists only its own, the group-qualified names list each product's, and no
category lists the other product's objects.

The kagent-shaped CRD (group kagent.dev, kind Agent, plural agents, category kagent, a minimal
schema) is removed after the test.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agentrun.api import models as m
from agentrun_devcluster.controlplane import wait_established
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.runs import agentrun, create, step
from tests.support.schema import crd_copy

pytestmark = pytest.mark.usefixtures("crd_installed")

KAGENT = "agents.kagent.dev"
KAGENT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": KAGENT},
    "spec": {
        "group": "kagent.dev",
        "scope": "Namespaced",
        "names": {
            "kind": "Agent",
            "listKind": "AgentList",
            "plural": "agents",
            "singular": "agent",
            "categories": ["kagent"],
        },
        "versions": [
            {
                "name": "v1alpha2",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def kagent_crd(cluster: TestCluster) -> Iterator[None]:
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(KAGENT_CRD))
    wait_established(cluster.kubectl_path, cluster.kubeconfig, KAGENT)
    try:
        yield
    finally:
        cluster.kubectl(
            "delete", "crd", KAGENT, "--ignore-not-found", "--wait=false"
        )  # nothing else uses its names


def test_the_crd_is_in_the_category_agentrun_not_agents(kube: KubeClients) -> None:
    crd = kube.apiext.read_custom_resource_definition(f"{m.PLURAL}.{m.GROUP}")
    assert crd.spec.names.categories == ["agentrun"]
    assert crd.spec.names.short_names == ["ar"]


def test_kubectl_get_agents_lists_kagents_agents_and_the_category_lists_agentruns(
    cluster: TestCluster, kube: KubeClients, namespace: str, kagent_crd: None, tmp_path: Path
) -> None:
    create(kube, namespace, agentrun("my-run", [step("a", "true")]))
    kube.custom.create_namespaced_custom_object(
        "kagent.dev",
        "v1alpha2",
        namespace,
        "agents",
        {
            "apiVersion": "kagent.dev/v1alpha2",
            "kind": "Agent",
            "metadata": {"name": "my-agent"},
            "spec": {"description": "a kagent agent"},
        },
    )

    def names(*resource: str) -> list[str]:
        # A discovery cache of its own: the one kubectl keeps in ~/.kube may predate the CRD.
        out = cluster.kubectl(
            "get", *resource, "-n", namespace, "-o", "name", f"--cache-dir={tmp_path}"
        ).stdout
        return sorted(out.split())

    kube.custom.create_namespaced_custom_object(
        m.GROUP,
        m.VERSION,
        namespace,
        "agents",
        {
            "apiVersion": m.API_VERSION,
            "kind": "Agent",
            "metadata": {"name": "our-agent"},
            "spec": {"model": {"baseURL": "http://127.0.0.1:1/v1", "name": "scripted"}},
        },
    )
    assert names("agents.kagent.dev") == ["agent.kagent.dev/my-agent"]
    assert names("agents.agentrun.dev") == ["agent.agentrun.dev/our-agent"]
    # Both groups serve `agents`: kubectl takes agentrun.dev, which it lists first.
    assert names("agents") == ["agent.agentrun.dev/our-agent"]
    assert names("agentrun") == ["agentrun.agentrun.dev/my-run"]
    assert names("agentruns") == ["agentrun.agentrun.dev/my-run"]
    assert names("ar") == ["agentrun.agentrun.dev/my-run"]
    assert names("kagent") == ["agent.kagent.dev/my-agent"]

    # The category as discovery serves it: kubectl expands `agentrun` to exactly AgentRuns.
    listed = json.loads(
        cluster.kubectl(
            "get", "--raw", f"/apis/{m.GROUP}/{m.VERSION}", f"--cache-dir={tmp_path}"
        ).stdout
    )
    (resource,) = [r for r in listed["resources"] if r["name"] == m.PLURAL]
    assert resource["categories"] == ["agentrun"]
    assert resource["shortNames"] == ["ar"]


def test_applying_the_new_crd_over_the_old_replaces_the_category(
    cluster: TestCluster, kube: KubeClients
) -> None:
    """The upgrade of docs/configuration.md ("Upgrades and several installs"), on a copy of
    the CRD under a group and names of its own (so that it never shadows the real one):
    installed by Helm in one category, then the new CRD applied with the documented command,
    in the new category alone (as ``agents`` gives way to ``agentrun``)."""
    group = "agentrun-upgrade.test"
    crd = crd_copy(group, "UpgradeRun")  # names of its own: it must not shadow the real CRD
    name = crd["metadata"]["name"]
    crd["spec"]["names"]["categories"] = ["upgrade-new"]  # the category the new CRD has
    old = copy.deepcopy(crd)
    old["spec"]["names"]["categories"] = ["upgrade-old"]  # the category the old one had
    try:
        cluster.kubectl(
            "apply", "--server-side", "--field-manager=helm", "-f", "-", input=yaml.safe_dump(old)
        )
        wait_established(cluster.kubectl_path, cluster.kubeconfig, name)
        cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=agentrun-crds",
            "-f",
            "-",
            input=yaml.safe_dump(crd),
        )
        names = kube.apiext.read_custom_resource_definition(name).spec.names
        assert names.categories == ["upgrade-new"]  # replaced, not added to
    finally:
        cluster.kubectl(
            "delete", "crd", name, "--ignore-not-found", "--wait=false"
        )  # its names are its own: nothing waits for it to go
