"""The agentrun-pod-doors policy's way in for admins (``create`` on the virtual resource
``agentrun.dev`` ``steppods/<door>``) is granted by none of the roles shipped with the operator:
not the people's roles (agentrun-edit aggregates into ``edit`` and ``admin``), nor the
operator's own. The policy's names of pods are tested in tests/unit/test_naming.py, the policy
against a real API server in tests/e2e/test_pod_doors.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.paths import ADMISSION_DIR, MANIFESTS

DOORS = ("exec", "attach", "portforward", "proxy", "ephemeralcontainers")


def rules(path: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for doc in yaml.safe_load_all((MANIFESTS / path).read_text()):
        if doc and doc["kind"] in ("ClusterRole", "Role"):
            found += [(doc["metadata"]["name"], rule) for rule in doc.get("rules") or []]
    return found


def grants(rule: dict[str, Any], resource: str) -> bool:
    """Whether an RBAC rule allows ``create`` on ``agentrun.dev`` ``resource``."""
    groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
    verbs = rule.get("verbs") or []
    return (
        bool({"agentrun.dev", "*"} & set(groups))
        and bool({resource, "*", "steppods/*"} & set(resources))
        and bool({"create", "*"} & set(verbs))
    )


@pytest.mark.parametrize("path", ["user-roles.yaml", "rbac.yaml"])
def test_no_shipped_role_opens_a_step_pods_doors(path: str) -> None:
    for name, rule in rules(path):
        for door in DOORS:
            assert not grants(rule, f"steppods/{door}"), (name, rule)


def test_the_policy_asks_the_authorizer_about_the_door_of_the_request() -> None:
    text = (ADMISSION_DIR / "pod-doors-policy.yaml").read_text()
    [policy, binding] = [d for d in yaml.safe_load_all(text) if d]
    [condition] = [
        c["expression"]
        for c in policy["spec"]["matchConditions"]
        if c["name"] == "not-a-cluster-admin"
    ]
    for piece in (
        "'system:masters' in request.userInfo.groups",
        "authorizer.group('agentrun.dev').resource('steppods')",
        ".subresource(request.subResource).namespace(request.namespace)",
        ".check('create').allowed()",
    ):
        assert piece in " ".join(condition.split()).replace(" .", "."), piece
    rules_ = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {(op, r) for rule in rules_ for op in rule["operations"] for r in rule["resources"]} == {
        ("CONNECT", "pods/exec"),
        ("CONNECT", "pods/attach"),
        ("CONNECT", "pods/portforward"),
        ("CONNECT", "pods/proxy"),
        ("UPDATE", "pods/ephemeralcontainers"),
    }
    assert binding["spec"] == {"policyName": "agentrun-pod-doors", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
