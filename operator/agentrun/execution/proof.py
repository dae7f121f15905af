"""The operator's proof that it created a step Job.

Anyone who may create Jobs in a run's namespace can build a step Job's exact manifest (the
code is public, the inputs readable) and create it under the attempt's name before the
operator does. Names, labels, owner references and spec can all be copied; a key cannot. So
the operator signs every step Job it creates: the annotation ``agentrun.dev/proof`` holds an
HMAC-SHA256, keyed by a secret only the operator holds (the Secret ``agentrun-job-signing`` in
its own namespace), over the run's uid, the step, the attempt, the Job's name and the digest of
the spec the operator creates. A Job carrying a proof that verifies was created by the
operator for exactly that attempt; any other is not the attempt's, however it looks.

Pure functions over plain dicts; the key is given.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from agentrun import settings as s

VERSION = "v1"
KEY_BYTES = 32


def spec_digest(spec: Mapping[str, Any]) -> str:
    """SHA-256 of the spec as canonical JSON (sorted keys, no spaces), without the pod
    template's shard label (:func:`without_shard_label`)."""
    text = json.dumps(
        without_shard_label(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def without_shard_label(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec`` without its pod template's ``agentrun.dev/shard`` label (a copy of what it
    changes). That label only says which replica watches the pods (its value depends on
    ``AGENTRUN_SHARDS``), so neither a proof nor the comparison of a Job found with the
    operator's manifest covers it: a Job made under another shard count, or before Jobs
    carried it, is still the attempt's."""
    template = spec.get("template")
    meta = template.get("metadata") if isinstance(template, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping) or s.LABEL_SHARD not in labels:
        return spec
    kept = {k: v for k, v in labels.items() if k != s.LABEL_SHARD}
    assert isinstance(template, Mapping) and isinstance(meta, Mapping)
    return {**spec, "template": {**template, "metadata": {**meta, "labels": kept}}}


def proof(key: bytes, run_uid: str, step: str, attempt: int, manifest: Mapping[str, Any]) -> str:
    """The proof of the Job ``manifest`` (as the operator builds it) of one step attempt."""
    if len(key) < KEY_BYTES:
        raise ValueError(f"the key of step Jobs' proofs has {len(key)} bytes, not {KEY_BYTES}")
    name = str((manifest.get("metadata") or {}).get("name") or "")
    signed = json.dumps(
        [VERSION, run_uid, step, attempt, name, spec_digest(manifest.get("spec") or {})],
        separators=(",", ":"),
    )
    return f"{VERSION}:{hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()}"


def sign(key: bytes, run_uid: str, step: str, attempt: int, manifest: dict[str, Any]) -> None:
    """Put the proof on ``manifest`` (in place), before it is created."""
    annotations = manifest.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[s.ANNOTATION_PROOF] = proof(key, run_uid, step, attempt, manifest)


def proof_problem(
    key: bytes,
    run_uid: str,
    step: str,
    attempt: int,
    expected: Mapping[str, Any],
    found: Mapping[str, Any],
) -> str | None:
    """Why ``found`` is not proven to be the Job the operator created from ``expected`` (its
    manifest for the attempt, which names the Job); None when its proof verifies."""
    meta = found.get("metadata") or {}
    expected_name = (expected.get("metadata") or {}).get("name")
    if meta.get("name") != expected_name:
        return f"its name is not {expected_name}"
    given = (meta.get("annotations") or {}).get(s.ANNOTATION_PROOF)
    if not isinstance(given, str) or not given:
        return f"it carries no {s.ANNOTATION_PROOF} annotation: the operator did not create it"
    wanted = proof(key, run_uid, step, attempt, expected)
    if not hmac.compare_digest(given.encode(), wanted.encode()):
        return (
            f"its {s.ANNOTATION_PROOF} annotation does not verify: the operator did not create "
            "it for this attempt"
        )
    return None


def turn_token(key: bytes, run_uid: str, job_name: str) -> str:
    """The one-time token a model turn's pod takes its request with
    (:mod:`agentrun.pod.llm`): only the operator, which holds the key, can make it; its Job
    carries only its sha256 (:func:`agentrun.execution.jobs.build_job`), which anyone who may
    read the Job sees."""
    signed = json.dumps([VERSION, "turn", run_uid, job_name], separators=(",", ":"))
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


def executor_token(key: bytes, run_uid: str, job_name: str) -> str:
    """The token every request to a run's executor carries (:mod:`agentrun.pod.executor`):
    only the operator, which holds the key, can make it; the executor's Job carries only its
    sha256, which anyone who may read the Job sees."""
    signed = json.dumps([VERSION, "executor", run_uid, job_name], separators=(",", ":"))
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()
