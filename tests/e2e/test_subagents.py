"""Sub-agents' children as the API server and the garbage collector treat them, and
``kubectl agentrun tree``.

The operator does not start children yet (agentrun.core.subagents decides what it will do);
these tests hold what those decisions rely on against a real control plane, with children
made here as the operator will make them (:func:`agentrun.core.subagents.child_manifest`):
the spec read back after the API server's defaulting still has the digest adoption compares,
a second create of the same call's child meets AlreadyExists, ``tree`` shows the family by
controller uid, deleting the parent deletes the family, and under the shipped admission
policies a child made by the operator's identity records it as creator and acts for the
parent's creator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api import agent as a
from agentrun.api import models as m
from agentrun.core import subagents as sa
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.cluster import bind_role, mint_user, user_subject
from tests.support.plugin import kubectl_agentrun, ok
from tests.support.runs import Run, create, get, gone

pytestmark = pytest.mark.usefixtures("crd_installed")

TOOL = sa.SubAgentTool(
    agent=a.Agent.model_validate(
        {
            "model": {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"},
            "instructions": "You look things up.",
        }
    ),
    preamble="Answer in one line.",
    max_tokens=5000,
)


def _parent(name: str) -> Run:
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {"name": name},
        "spec": {
            "goal": "find out why checkout is slow",
            "budget": {"maxTokens": 20000},
            "policy": {"approvalRequiredFor": ["write"]},
            "agent": {"model": {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"}},
        },
    }


def _child_of(stored: Run, call: str, goal: str, tokens: int, depth: int = 0) -> dict[str, Any]:
    parent = m.AgentRun.model_validate(stored)
    h = sa.call_args_hash(TOOL, {"goal": goal})
    key = f"{parent.metadata.uid}:1:{call}:{h}"
    text = sa.goal_of(TOOL, {"goal": goal})
    assert text is not None
    return sa.child_manifest(parent, depth, key, TOOL, text, tokens)


def test_a_child_as_stored_is_adopted_and_a_second_create_meets_already_exists(
    kube: KubeClients, namespace: str
) -> None:
    parent = create(kube, namespace, _parent("digest-parent"))
    manifest = _child_of(parent, "c1", "find the slow query", 4000)
    created = create(kube, namespace, manifest)
    # The API server fills in the CRD's defaults; adoption compares without them.
    stored = get(kube, namespace, manifest["metadata"]["name"])
    assert stored["spec"] != manifest["spec"]
    found = sa.observed_run(stored)
    assert found.controller_uid == parent["metadata"]["uid"]
    expected = sa.spec_digest(manifest["spec"])
    assert sa.adopt(found, parent["metadata"]["uid"], expected) == sa.Adopted(
        created["metadata"]["uid"]
    )
    # The create repeated after a crash names the same object: never a second child.
    with pytest.raises(ApiException) as again:
        create(kube, namespace, manifest)
    assert again.value.status == 409
    # Another parent's view of that object refuses it.
    other = create(kube, namespace, _parent("digest-other"))
    refused = sa.adopt(found, other["metadata"]["uid"], expected)
    assert isinstance(refused, sa.Refused) and refused.reason == sa.CHILD_NAME_TAKEN


def test_tree_shows_the_family_and_deleting_the_parent_deletes_it(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    parent = create(kube, namespace, _parent("family"))
    first = create(kube, namespace, _child_of(parent, "c1", "find the slow query", 4000))
    second = create(kube, namespace, _child_of(parent, "c2", "find the slow disk", 3000))
    grandchild = create(kube, namespace, _child_of(first, "g1", "read the plan", 1000, depth=1))
    stranger = _parent("stranger")
    stranger["metadata"]["labels"] = {sa.LABEL_PARENT_UID: parent["metadata"]["uid"]}
    create(kube, namespace, stranger)  # a label claims it; no ownerReference does

    out = ok(kubectl_agentrun(cluster, "-n", namespace, "tree", "family")).splitlines()
    assert out[0].split() == ["RUN", "PHASE", "TOKENS", "FAMILY", "TOKENS"]
    rows = [(line.split(), len(line) - len(line.lstrip())) for line in out[1:]]
    first_name, second_name = first["metadata"]["name"], second["metadata"]["name"]
    expected = [(["family", "Pending", "0", "0"], 0)]
    for kid in sorted([first_name, second_name]):  # children by name, each with its own
        expected.append(([kid, "Pending", "0", "0"], 2))
        if kid == first_name:
            expected.append(([grandchild["metadata"]["name"], "Pending", "0", "0"], 4))
    assert rows == expected  # the stranger, with only a label, is not there

    kube.custom.delete_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL, "family")
    family = [first, second, grandchild]
    wait_for(
        "the garbage collector to delete the parent's children and grandchildren",
        lambda: all(gone(kube, namespace, r["metadata"]["name"]) for r in family),
        timeout=120,
    )
    assert not gone(kube, namespace, "stranger")


def test_a_child_made_by_the_operators_identity_acts_for_the_parents_creator(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """Under the shipped admission policies: alice creates the parent; a user with the rights
    the operator has on runs creates the child as the operator will. The admission records
    that user as the child's creator (and lets the ownerReference, the call and depth
    annotations and the copied policy through); the child acts for alice."""
    operator_user = "agentrun-operator-like"
    users: dict[str, Path] = {}
    rules = {
        "alice": [
            {"apiGroups": [m.GROUP], "resources": [m.PLURAL], "verbs": ["create", "get"]},
        ],
        operator_user: [
            {"apiGroups": [m.GROUP], "resources": [m.PLURAL], "verbs": ["create", "get"]},
            {"apiGroups": [m.GROUP], "resources": [f"{m.PLURAL}/finalizers"], "verbs": ["update"]},
        ],
    }
    for user, granted in rules.items():
        to = cluster.kubeconfig.with_name(f"{namespace}-{user}.kubeconfig")
        users[user] = mint_user(cluster, user, [], to)
        bind_role(kube, namespace, f"{user}-runs", granted, [user_subject(user)])

    def create_as(user: str, body: dict[str, Any]) -> Run:
        proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body),
                               kubeconfig=users[user], check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return get(kube, namespace, body["metadata"]["name"])

    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        parent = create_as("alice", _parent("alices"))
        assert parent["metadata"]["annotations"][m.ANNOTATION_CREATED_BY] == "alice"
        child = create_as(operator_user, _child_of(parent, "c1", "find the slow query", 4000))
    annotations = child["metadata"]["annotations"]
    assert annotations[m.ANNOTATION_CREATED_BY] == operator_user
    assert annotations[sa.ANNOTATION_DEPTH] == "1"
    acting = sa.acting_creator([child, parent], operator_user, sa.Limits())
    assert isinstance(acting, sa.ActingFor), acting
    assert (acting.user, acting.depth) == ("alice", 1)
    # Read by another operator identity, the same child is a user's run of its own.
    other = sa.acting_creator([child, parent], "someone-else", sa.Limits())
    assert other == sa.ActingFor(operator_user, annotations.get(m.ANNOTATION_CREATED_BY_GROUPS),
                                 (child["metadata"]["name"],))  # fmt: skip
