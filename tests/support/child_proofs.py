"""The operator's proof of the child runs it makes, for tests without a cluster: the same
HMAC the shell puts on a child (:meth:`agentrun.loop.act.Actions._signed_child`) and checks
(:meth:`agentrun.loop.observe.Observer.child_proven`), under a fixed test key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun import settings as s
from agentrun.core import subagents
from agentrun.execution import proof

KEY = b"k" * proof.KEY_BYTES
"""The key of these tests' proofs (a namespace user never holds the operator's)."""


def sign(body: dict[str, Any], parent_uid: str, key: bytes = KEY) -> dict[str, Any]:
    """``body`` (a child's manifest) with the operator's proof on it, in place."""
    bound = subagents.proof_bound(body)
    assert bound is not None, "a child the operator makes has a call key and a valid spec"
    name = str(body["metadata"]["name"])
    annotations = body["metadata"].setdefault("annotations", {})
    annotations[s.ANNOTATION_PROOF] = proof.object_proof(key, "child", parent_uid, name, *bound)
    return body


def proven(body: Mapping[str, Any], parent_uid: str) -> bool:
    """Whether ``body`` carries the proof :func:`sign` makes for a child of ``parent_uid``."""
    bound = subagents.proof_bound(body)
    if bound is None:
        return False
    return proof.object_proof_problem(KEY, body, "child", parent_uid, *bound) is None
