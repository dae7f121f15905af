"""The generated CRD's OpenAPI schema as a JSON Schema validator: what the API server would
accept, checked without one."""

from __future__ import annotations

from typing import Any

import jsonschema
import yaml

from agentrun.api import crd
from agentrun.api import models as m

from .paths import CRDS_DIR


def _openapi_to_jsonschema(node: Any) -> Any:
    """Drop Kubernetes' x- extensions so a JSON Schema validator can read the schema."""
    if isinstance(node, dict):
        out = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-")}
        if node.get("x-kubernetes-int-or-string"):
            out.pop("pattern", None)
        return out
    if isinstance(node, list):
        return [_openapi_to_jsonschema(v) for v in node]
    return node


VALIDATOR = jsonschema.Draft202012Validator(_openapi_to_jsonschema(crd.openapi_schema()))
"""Validates an AgentRun body against the schema the CRD is generated with."""
VALIDATORS = {
    kind.kind: jsonschema.Draft202012Validator(_openapi_to_jsonschema(crd.openapi_schema(kind)))
    for kind in crd.KINDS
}
"""Kind (AgentRun, Agent, ModelConfig) -> a validator of its bodies against the schema its CRD
is generated with."""


def crd_copy(group: str, kind: str) -> dict[str, Any]:
    """The generated AgentRun CRD under ``group`` and names of its own (``kind``, its
    lower-case plural and singular, no short names or categories): a test's copy that never
    shadows the real one. kubectl resolves a resource name found in several groups to the
    first group in its discovery order (``agentrun-x.test`` sorts before ``agentrun.dev``), so
    a copy keeping the names ``agentruns``/``agentrun`` would take the real runs' place in
    every other test's ``kubectl get agentrun`` for as long as it stands."""
    (found,) = [
        doc
        for doc in yaml.safe_load_all((CRDS_DIR / f"{m.GROUP}_{m.PLURAL}.yaml").read_text())
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"
    ]
    crd: dict[str, Any] = found
    plural = f"{kind.lower()}s"
    crd["metadata"] = {"name": f"{plural}.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    return crd
