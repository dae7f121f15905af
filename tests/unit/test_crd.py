"""The checked-in CRD is exactly what the generator produces, and it is structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api import crd, models

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "agentrun.dev_agentruns.yaml"


@pytest.mark.parametrize("kind", crd.KINDS, ids=lambda k: k.kind)
def test_checked_in_crd_is_up_to_date(kind: crd.Kind) -> None:
    path = ROOT / "crds" / kind.file_name
    assert path.read_text() == crd.render(kind), (
        f"crds/{kind.file_name} is stale: run `make crds` and commit the result"
    )


def test_crds_holds_every_kind_and_nothing_else() -> None:
    assert sorted(p.name for p in (ROOT / "crds").glob("*.yaml")) == sorted(
        k.file_name for k in crd.KINDS
    )


def test_only_runs_have_a_status() -> None:
    """Agents and ModelConfigs are read, never reconciled: no status, no subresource."""
    for kind in crd.KINDS:
        version = crd.custom_resource_definition(kind)["spec"]["versions"][0]
        assert ("status" in version.get("subresources", {})) == (kind is crd.RUN), kind.kind
        props = version["schema"]["openAPIV3Schema"]["properties"]
        assert ("status" in props) == (kind is crd.RUN), kind.kind


def _walk(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, sub in (node.get("properties") or {}).items():
        found += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("kind", crd.KINDS, ids=lambda k: k.kind)
def test_schema_is_structural_and_every_field_is_described(kind: crd.Kind) -> None:
    schema = crd.openapi_schema(kind)
    for path, node in _walk(schema, kind.singular):
        assert "$ref" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{path} uses anyOf"
        assert node.get("additionalProperties") not in (True, False), path
        assert "null" not in str(node.get("type")), path
        is_list_item = path.endswith("[]") or path.endswith("}")
        if path.count(".") >= 2 and not is_list_item:
            assert node.get("description"), f"{path} has no description"


def test_names_columns_and_subresources() -> None:
    body = crd.custom_resource_definition()
    spec = body["spec"]
    assert spec["names"]["shortNames"] == ["ar"]
    assert spec["names"]["categories"] == ["agentrun"]
    (version,) = spec["versions"]
    assert version["subresources"] == {"status": {}}
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Phase",
        "Progress",
        "Step",
        "Age",
        "Message",
    ]
    # kubectl get -o wide adds these.
    assert [c["name"] for c in columns if c.get("priority") == 1] == [
        "Attempts",
        "Tokens",
        "Waiting",
        "Reason",
        "Agent",
    ]


def test_list_keys_and_cel_rules_are_present() -> None:
    text = CRD_FILE.read_text()
    steps = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]["properties"]["plan"]["properties"]["steps"]
    assert steps["x-kubernetes-list-type"] == "map"
    assert steps["x-kubernetes-list-map-keys"] == ["name"]
    assert steps["maxItems"] == models.MAX_STEPS
    rules = [r["message"] for r in steps["items"]["x-kubernetes-validations"]]
    assert "a step cannot depend on itself" in rules
    assert "every dependsOn entry must name a step of this plan" in text


def _spec_schema() -> dict[str, Any]:
    crd_body = yaml.safe_load(CRD_FILE.read_text())
    schema: dict[str, Any] = crd_body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_new_carried_results_need_an_args_hash_and_old_runs_stay_updatable() -> None:
    carried = _spec_schema()["properties"]["spec"]["properties"]["carriedResults"]
    assert carried["items"]["properties"]["argsHash"]["pattern"] == models.ARGS_HASH_PATTERN
    (rule,) = [r for r in carried["x-kubernetes-validations"] if "argsHash" in r["rule"]]
    # Evaluated when there is no old value (creation) only: runs created before argsHash
    # existed keep accepting updates such as approvals.
    assert rule["optionalOldSelf"] is True and rule["rule"].startswith("oldSelf.hasValue() ||")


def test_every_status_text_the_core_writes_from_step_output_is_bounded() -> None:
    status = _spec_schema()["properties"]["status"]["properties"]
    step = status["steps"]["items"]["properties"]
    transition = status["history"]["items"]["properties"]
    bounded = {
        "steps[].summary": step["summary"],
        "steps[].result": step["result"],
        "steps[].message": step["message"],
        "steps[].error.reason": step["error"]["properties"]["reason"],
        "steps[].error.message": step["error"]["properties"]["message"],
        "history[].reason": transition["reason"],
        "history[].message": transition["message"],
        "message": status["message"],
    }
    for path, node in bounded.items():
        assert "maxLength" in node, path
    assert step["usage"]["properties"]["tokens"]["maximum"] == models.MAX_TOKENS
    assert status["usage"]["properties"]["tokens"]["maximum"] == models.MAX_TOKENS


def test_the_agentrun_category_names_agentruns_alone() -> None:
    """``kubectl get agentrun NAME`` resolves ``agentrun`` as a category before a singular: a
    category shared by the other kinds would make it name several resources and fail."""
    for kind in crd.KINDS:
        names = crd.custom_resource_definition(kind)["spec"]["names"]
        assert ("categories" in names) == (kind is crd.RUN), kind.kind
        assert kind.singular not in [c for k in crd.KINDS if k is not kind for c in k.categories]
