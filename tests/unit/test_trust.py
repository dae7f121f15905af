"""The trust table (agentrun.api.trust) is complete, and docs/design.md shows it as generated.

* Every field path of the AgentRun CRD (spec and status, every object, leaf and array item)
  is covered by an entry; a field added without one is reported.
* Every (apiGroup, resource) the operator may get, list or watch, per the RBAC it ships
  (manifests/rbac.yaml, and the Helm chart's templates), has an entry; so is one added.
* Every entry has the attacks tests/e2e/test_trust_attacks.py makes (its change and its
  mimic), and every case that applies goes to a run there; an entry without one is reported.
* Every entry says how what is found there is proven to be the operator's own or a step's own
  (its proof of origin), and none of those routes is a shape (a name, labels, owner
  references, immutability, a spec): a namespace user can write those first, exactly.
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
from agentrun.api.trust import Actor, Attack, Origin, Outcome, Phase
from tests.support.paths import REPO_ROOT
from tests.support.trust_attacks import ATTACKS, MIMICS, planned

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
    """The rules the chart's templates write for the operator (flow-style lists, as they all
    are). The uninstall hook's own Roles are left out: it runs once the operator is stopped,
    to release what the operator held, and decides nothing a step runs."""
    rules = []
    for path in sorted(templates.glob("*")):
        if path.suffix not in (".yaml", ".tpl") or path.name == "uninstall-hook.yaml":
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
    """Entries with a case that applies and no attack of its kind to try it with."""
    made = {Attack.CHANGE: ATTACKS, Attack.MIMIC: MIMICS}
    return sorted(
        {
            c.entry.id
            for c in trust.cases(tuple(table))
            if c.expect.outcome is not Outcome.NOT_APPLICABLE and c.entry.id not in made[c.kind]
        }
    )


def test_every_entry_has_its_attacks_and_no_attack_is_left_over() -> None:
    assert not missing_attacks(trust.TABLE)
    assert set(ATTACKS) <= {e.id for e in trust.TABLE}
    assert set(MIMICS) <= {e.id for e in trust.TABLE}


def test_an_entry_without_an_attack_is_reported() -> None:
    new = replace(trust.entry("run-goal"), id="run-new-field")
    assert missing_attacks([*trust.TABLE, new]) == ["run-new-field"]


# -- proof of origin -----------------------------------------------------------------------------


def test_every_entry_is_proven_by_a_route_a_namespace_user_cannot_take() -> None:
    assert not trust.shapes_as_proof(), (
        "entries whose origin rests on nothing or on a shape a namespace user can write: "
        f"{trust.shapes_as_proof()}"
    )
    for e in trust.TABLE:
        assert e.proven, e.id
        assert len(set(e.proven)) == len(e.proven), e.id


@pytest.mark.parametrize("shape", sorted(trust.SHAPES))
def test_an_entry_proven_by_a_shape_is_reported(shape: Origin) -> None:
    found = replace(
        trust.entry("child-run"), id="child-by-name", proven=(Origin.COMMITTED_UID, shape)
    )
    alone = replace(trust.entry("result-object"), id="result-by-shape", proven=(shape,))
    nothing = replace(trust.entry("job-create"), id="job-by-nothing", proven=())
    assert trust.shapes_as_proof([*trust.TABLE, found, alone, nothing]) == [
        "child-by-name",
        "result-by-shape",
        "job-by-nothing",
    ]


def test_the_shapes_are_what_a_namespace_user_writes() -> None:
    assert {o.name for o in trust.SHAPES} == {
        "NAME",
        "LABELS",
        "OWNER_REFERENCE",
        "IMMUTABLE",
        "SPEC",
    }
    assert set(Origin) > trust.SHAPES


def test_the_found_objects_rest_on_the_routes_the_rule_names() -> None:
    """What the rule of proof of origin names for the objects the operator and steps find."""
    routes = {e.id: set(e.proven) for e in trust.TABLE}
    assert {Origin.HMAC, Origin.COMMITTED_UID} <= routes["child-run"]
    assert Origin.HMAC in routes["job-create"]
    assert {Origin.COMMITTED_DIGEST, Origin.HMAC, Origin.NODE} <= routes["result-object"]
    assert {Origin.COMMITTED_DIGEST, Origin.NODE} <= routes["executor-result"]
    assert {Origin.NODE, Origin.RBAC} <= routes["pod-status"]
    assert routes["run-identity"] == {Origin.API_SERVER}
    assert routes["agent-context"] == {Origin.COMMITTED_DIGEST}
    for e in trust.TABLE:
        if e.resource == trust.RUN_STATUS:
            assert routes[e.id] == {Origin.RBAC}, e.id


def test_every_case_that_applies_is_tried_on_a_run() -> None:
    tried = [c for cases in planned().values() for c in cases]
    applies = [c for c in trust.cases() if c.expect.outcome is not Outcome.NOT_APPLICABLE]
    assert sorted(c.id for c in tried) == sorted(c.id for c in applies)


def test_the_count_of_cases_and_their_classes() -> None:
    cases = list(trust.cases())
    assert len(cases) == len(trust.TABLE) * len(Phase) * len(Actor) * len(Attack)
    counts = Counter((c.kind, c.expect.outcome) for c in cases)
    print(
        f"\n{len(cases)} cases: " + ", ".join(f"{k}/{o.value} {n}" for (k, o), n in counts.items())
    )
    # Whoever may only create runs changes nothing that exists: a run they make anew (a
    # forged sub-agent's child) changes nothing either, and its mimic (the call's exact
    # child, made first) fails the call closed.
    only = {
        c.expect.outcome
        for c in cases
        if c.actor is Actor.RUNS_ONLY and c.entry.resource != trust.NEW_RUNS
    }
    assert only <= {Outcome.REFUSED_RBAC, Outcome.NOT_APPLICABLE}, only
    made = {c.expect.outcome for c in cases if c.entry.resource == trust.NEW_RUNS}
    assert made <= {Outcome.UNAFFECTED, Outcome.REFUSED_API, Outcome.FAILED_CLOSED,
                    Outcome.NOT_APPLICABLE}, made  # fmt: skip
    changed = {
        c.expect.outcome
        for c in cases
        if c.entry.resource == trust.NEW_RUNS and c.kind is Attack.CHANGE
    }
    assert changed <= {Outcome.UNAFFECTED, Outcome.REFUSED_API}, changed
    # Every entry has a case that applies in some phase, for some actor, of either kind.
    for e in trust.TABLE:
        for kind in Attack:
            assert any(
                c.expect.outcome is not Outcome.NOT_APPLICABLE
                for c in cases
                if c.entry is e and c.kind is kind
            ), (e.id, kind)


def test_the_mimics_that_succeeded_once_are_declared_failed_closed() -> None:
    """The mimic of the proof-of-origin issue: the legitimate writer's exact object, made
    before it, never counts."""
    child = trust.entry("child-run").expect(Phase.WAITING, Actor.RUNS_ONLY, Attack.MIMIC)
    assert (child.outcome, child.reasons) == (Outcome.FAILED_CLOSED, ("ChildNameTaken",))
    for phase in (Phase.PENDING, Phase.WAITING, Phase.LAUNCHING, Phase.RUNNING):
        found = trust.entry("result-object").expect(phase, Actor.EDIT, Attack.MIMIC)
        assert (found.outcome, found.reasons) == (Outcome.FAILED_CLOSED, ("ResultTampered",))
    job = trust.entry("job-create").expect(Phase.WAITING, Actor.EDIT, Attack.MIMIC)
    assert (job.outcome, job.reasons) == (Outcome.FAILED_CLOSED, ("JobNameTaken",))


def test_the_summary_counts_both_kinds_by_actor() -> None:
    lines = trust.summary()
    for kind in Attack:
        for actor in Actor:
            assert any(line.startswith(f"- {kind.value}, by {actor.value}: ") for line in lines)


def test_a_failure_names_its_reason() -> None:
    for c in trust.cases():
        if c.expect.outcome is Outcome.FAILED_CLOSED and c.entry.id != "agent-context":
            assert c.expect.reasons, c.id


@pytest.mark.parametrize("phase", list(Phase))
def test_the_status_is_nobodys_but_the_operators(phase: Phase) -> None:
    for e in trust.TABLE:
        if e.resource == trust.RUN_STATUS:
            for kind in Attack:
                outcomes = {e.expect(phase, a, kind).outcome for a in Actor}
                assert outcomes == {Outcome.REFUSED_RBAC}, (e.id, kind)


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
