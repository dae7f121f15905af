"""The generated CRD's OpenAPI schema as a JSON Schema validator: what the API server would
accept, checked without one."""

from __future__ import annotations

from typing import Any

import jsonschema

from agentrun.api import crd


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
