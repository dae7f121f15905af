"""The trust table (agentrun.api.trust) is complete, and docs/design.md shows it as generated.

* Every field path of the AgentRun CRD (spec and status, every object, leaf and array item)
  is covered by an entry; a field added without one is reported.
* Every (apiGroup, resource) the operator may get, list or watch, per the RBAC it ships
  (manifests/rbac.yaml, and the Helm chart's templates), has an entry; so is one added.
* Every entry has the attack tests/e2e/test_trust_attacks.py makes, and every case that
  applies goes to a run there; an entry without an attack is reported.
* docs/design.md's "Trust table" is what ``make trust-table`` generates, and each known gap an
  entry names is a bullet of its "Not enforced yet".
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api import trust
from agentrun.api.trust import Actor, Outcome, Phase
from tests.support.paths import REPO_ROOT
from tests.support.trust_attacks import ATTACKS, planned

CRD = REPO_ROOT / "crds" / "agentrun.dev_agentruns.yaml"
DESIGN = REPO_ROOT / "docs" / "design.md"
RBAC_MANIFEST = REPO_ROOT / "manifests" / "rbac.yaml"
CHART_TEMPLATES = REPO_ROOT / "charts" / "agentrun-operator" / "templates"
READS = frozenset({"get", "list", "watch", "*"})


# -- the CRD's fields -------------------------------------------------------------------------


def field_paths(node: dict[str, Any], path: str = "") -> Iterator[str]:
    """Every field path of an OpenAPI schema: objects, leaves, array items (``[]``) and map
    values (``{}``), depth first."""
    if path:
        yield path
    for name, child in (node.get("properties") or {}).items():
        yield from field_paths(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from field_paths(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from field_paths(node["additionalProperties"], f"{path}{{}}")


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_the_walk_sees_spec_and_status_objects_leaves_arrays_and_maps() -> None:
    paths = set(field_paths(crd_schema()))
    assert {
        "spec",
        "spec.plan.steps[].container.image",
        "spec.plan.steps[].container.command[]",
        "spec.stepTemplate.resources.limits{}",
        "spec.agent.model.baseURL",
        "status.steps[].resultDigest",
        "status.agent.frozen.toolsDigest",
    } <= paths
    assert len(paths) > 300


def test_every_field_of_the_crd_has_a_trust_entry() -> None:
    missing = trust.uncovered(list(field_paths(crd_schema())))
    assert not missing, f"fields without an entry in agentrun.api.trust.TABLE: {missing}"


def test_a_field_added_without_an_entry_is_reported() -> None:
    schema = copy.deepcopy(crd_schema())
    step = schema["properties"]["spec"]["properties"]["plan"]["properties"]["steps"]["items"]
    step["properties"]["hostNetwork"] = {"type": "boolean"}
    schema["properties"]["spec"]["properties"]["sidecar"] = {
        "type": "object",
        "properties": {"image": {"type": "string"}},
    }
    schema["properties"]["status"]["properties"]["verdict"] = {"type": "string"}
    assert trust.uncovered(list(field_paths(schema))) == [
        "spec.plan.steps[].hostNetwork",
        "spec.sidecar",
        "spec.sidecar.image",
        "status.verdict",
    ]


def test_a_subtree_pattern_covers_its_root_and_below_only() -> None:
    assert trust.covers("spec.policy.**", "spec.policy")
    assert trust.covers("spec.policy.**", "spec.policy.allowedImages[]")
    assert trust.covers("spec.approvals.**", "spec.approvals[].argsHash")
    assert not trust.covers("spec.policy.**", "spec.policyX")
    assert trust.covers("spec.plan.steps[]", "spec.plan.steps[]")
    assert not trust.covers("spec.plan.steps[]", "spec.plan.steps[].risk")


# -- what the operator may read ------------------------------------------------------------------

_RULE = re.compile(
    r"apiGroups:\s*\[(?P<groups>[^\]]*)\]\s*\n\s*(?:-\s*)?resources:\s*\[(?P<resources>[^\]]*)\]"
    r"(?:\s*\n\s*resourceNames:\s*\[[^\]]*\])?\s*\n\s*verbs:\s*\[(?P<verbs>[^\]]*)\]"
)


def _items(text: str) -> list[str]:
    return [i.strip().strip("\"'") for i in text.split(",") if i.strip()]


def rules_of_manifests(path: Path) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") in ("ClusterRole", "Role"):
            rules.extend(doc.get("rules") or [])
    return rules


def rules_of_chart(templates: Path) -> list[dict[str, Any]]:
    """The rules the chart's templates write (flow-style lists, as they all are)."""
    rules = []
    for path in sorted(templates.glob("*")):
        if path.suffix not in (".yaml", ".tpl"):
            continue
        for found in _RULE.finditer(path.read_text()):
            rules.append(
                {
                    "apiGroups": _items(found["groups"]),
                    "resources": _items(found["resources"]),
                    "verbs": _items(found["verbs"]),
                }
            )
    return rules


def readable(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (apiGroup, resource) pairs the rules let one get, list or watch."""
    return {
        (group, resource.split("/")[0])
        for rule in rules
        if READS & set(rule.get("verbs") or [])
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
    }


def without_entry(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    entered = {(g, r.split(" ")[0].split("/")[0]) for g, r in (e.resource for e in trust.TABLE)}
    return sorted(set(pairs) - entered)


def operator_rules() -> list[dict[str, Any]]:
    chart = rules_of_chart(CHART_TEMPLATES)
    manifests = rules_of_manifests(RBAC_MANIFEST)
    assert len(chart) >= 10 and len(manifests) >= 10, (chart, manifests)
    return [*chart, *manifests]


def test_the_operators_reads_are_found_in_the_chart_and_the_manifests() -> None:
    found = readable(operator_rules())
    assert {
        ("agentrun.dev", "agentruns"),
        ("batch", "jobs"),
        ("", "pods"),
        ("", "configmaps"),
        ("", "secrets"),
        ("", "events"),
        ("", "namespaces"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    } <= found, found


def test_every_resource_the_operator_may_read_has_a_trust_entry() -> None:
    missing = without_entry(readable(operator_rules()))
    assert not missing, f"the operator may read these, and the trust table has no entry: {missing}"


def test_a_resource_read_without_an_entry_is_reported() -> None:
    extra = {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}
    written = {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles"],
        "verbs": ["create"],
    }
    assert without_entry(readable([*operator_rules(), extra, written])) == [("apps", "deployments")]


# -- the table itself, and its attacks ---------------------------------------------------------


def test_entries_are_unique_and_say_every_phase() -> None:
    ids = Counter(e.id for e in trust.TABLE)
    assert not [i for i, n in ids.items() if n > 1], ids
    for e in trust.TABLE:
        assert set(e.outcomes) == set(Phase), e.id
        assert e.writers and e.checks, e.id


def missing_attacks(table: Iterable[trust.Entry]) -> list[str]:
    """Entries with a case that applies and no attack to try it with."""
    return sorted(
        {
            c.entry.id
            for c in trust.cases(tuple(table))
            if c.expect.outcome is not Outcome.NOT_APPLICABLE and c.entry.id not in ATTACKS
        }
    )


def test_every_entry_has_its_attack_and_no_attack_is_left_over() -> None:
    assert not missing_attacks(trust.TABLE)
    assert set(ATTACKS) <= {e.id for e in trust.TABLE}


def test_an_entry_without_an_attack_is_reported() -> None:
    new = replace(trust.entry("run-goal"), id="run-new-field")
    assert missing_attacks([*trust.TABLE, new]) == ["run-new-field"]


def test_every_case_that_applies_is_tried_on_a_run() -> None:
    tried = [c for cases in planned().values() for c in cases]
    applies = [c for c in trust.cases() if c.expect.outcome is not Outcome.NOT_APPLICABLE]
    assert sorted(c.id for c in tried) == sorted(c.id for c in applies)


def test_the_count_of_cases_and_their_classes() -> None:
    cases = list(trust.cases())
    assert len(cases) == len(trust.TABLE) * len(Phase) * len(Actor)
    counts = Counter(c.expect.outcome for c in cases)
    print(f"\n{len(cases)} cases: " + ", ".join(f"{o.value} {n}" for o, n in counts.items()))
    # Whoever may only create runs changes nothing that exists: a run they make anew (a
    # forged sub-agent's child) changes nothing either.
    only = {
        c.expect.outcome
        for c in cases
        if c.actor is Actor.RUNS_ONLY and c.entry.resource != trust.NEW_RUNS
    }
    assert only <= {Outcome.REFUSED_RBAC, Outcome.NOT_APPLICABLE}, only
    made = {c.expect.outcome for c in cases if c.entry.resource == trust.NEW_RUNS}
    assert made <= {Outcome.UNAFFECTED, Outcome.REFUSED_API}, made
    # Every entry has a case that applies in some phase, for some actor.
    for e in trust.TABLE:
        assert any(c.expect.outcome is not Outcome.NOT_APPLICABLE for c in cases if c.entry is e), (
            e.id
        )


def test_a_failure_names_its_reason() -> None:
    for c in trust.cases():
        if c.expect.outcome is Outcome.FAILED_CLOSED and c.entry.id != "agent-context":
            assert c.expect.reasons, c.id


@pytest.mark.parametrize("phase", list(Phase))
def test_the_status_is_nobodys_but_the_operators(phase: Phase) -> None:
    for e in trust.TABLE:
        if e.resource == trust.RUN_STATUS:
            assert {e.expect(phase, a).outcome for a in Actor} == {Outcome.REFUSED_RBAC}


# -- docs/design.md ------------------------------------------------------------------------------


def test_the_design_docs_table_is_the_generated_one() -> None:
    text = DESIGN.read_text()
    assert trust.markdown() in text + "\n", "run `make trust-table` to regenerate docs/design.md"
    assert trust.replace_in(text) == text


def test_a_changed_table_is_noticed_in_the_docs() -> None:
    changed = [replace(trust.TABLE[0], path="something else"), *trust.TABLE[1:]]
    assert trust.markdown(changed) not in DESIGN.read_text()


def test_every_gap_an_entry_names_is_a_bullet_of_not_enforced_yet() -> None:
    text = DESIGN.read_text()
    section = text.split("\nNot enforced yet:\n", 1)[1].split("\n## ", 1)[0]
    bullets = [b.strip() for b in section.split("\n- ")[1:]]
    for e in trust.TABLE:
        if e.gap:
            assert any(b.startswith(e.gap) for b in bullets), (e.id, e.gap)
