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
ANNOTATION_SPEC_DIGEST = f"{s.ANNOTATION_PROOF}-spec"
"""The digest of the spec a Job's proof was made over (for telling the operator's Job made
from an earlier version of a step from someone else's; it proves nothing on its own)."""


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
    name = str((manifest.get("metadata") or {}).get("name") or "")
    return _proof(key, run_uid, step, attempt, name, spec_digest(manifest.get("spec") or {}))


def _proof(key: bytes, run_uid: str, step: str, attempt: int, name: str, digest: str) -> str:
    if len(key) < KEY_BYTES:
        raise ValueError(f"the key of step Jobs' proofs has {len(key)} bytes, not {KEY_BYTES}")
    signed = json.dumps([VERSION, run_uid, step, attempt, name, digest], separators=(",", ":"))
    return f"{VERSION}:{hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()}"


def signed_earlier(
    key: bytes, run_uid: str, step: str, attempt: int, found: Mapping[str, Any]
) -> bool:
    """Whether ``found`` carries the operator's proof for this attempt over the spec digest
    it names (``agentrun.dev/spec-digest``): a Job the operator made for the attempt from
    what the step was then, whatever the step is now. Says who made it, never that it runs
    the committed intent (that is :func:`proof_problem`'s)."""
    meta = found.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    given, digest = annotations.get(s.ANNOTATION_PROOF), annotations.get(ANNOTATION_SPEC_DIGEST)
    if not isinstance(given, str) or not isinstance(digest, str):
        return False
    wanted = _proof(key, run_uid, step, attempt, str(meta.get("name") or ""), digest)
    return hmac.compare_digest(given.encode(), wanted.encode())


def sign(key: bytes, run_uid: str, step: str, attempt: int, manifest: dict[str, Any]) -> None:
    """Put the proof on ``manifest`` (in place), before it is created."""
    annotations = manifest.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[s.ANNOTATION_PROOF] = proof(key, run_uid, step, attempt, manifest)
    annotations[ANNOTATION_SPEC_DIGEST] = spec_digest(manifest.get("spec") or {})


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


def object_proof(key: bytes, kind: str, run_uid: str, name: str, *bound: str) -> str:
    """The proof of an object (not a Job) the operator creates for a run: an HMAC over its
    kind (``result``, ``child``), the run's uid, its name and ``bound`` (the attempt, the
    digest of its content or spec), under the key of the Jobs' proofs. Anyone may copy the
    object, annotation and all, under its name; no one without the key can make the proof of
    other content, and a copy of the same content holds exactly what the operator wrote."""
    if len(key) < KEY_BYTES:
        raise ValueError(f"the key of the operator's proofs has {len(key)} bytes, not {KEY_BYTES}")
    signed = json.dumps([VERSION, kind, run_uid, name, *bound], separators=(",", ":"))
    return f"{VERSION}:{hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()}"


def object_proof_problem(
    key: bytes, found: Mapping[str, Any], kind: str, run_uid: str, *bound: str
) -> str | None:
    """Why ``found`` (the API's JSON of an object under a name the operator derives) is not
    proven to be the one the operator created with ``bound``; None when its proof verifies."""
    meta = found.get("metadata") or {}
    name = str(meta.get("name") or "")
    given = (meta.get("annotations") or {}).get(s.ANNOTATION_PROOF)
    if not isinstance(given, str) or not given:
        return f"it carries no {s.ANNOTATION_PROOF} annotation: the operator did not create it"
    wanted = object_proof(key, kind, run_uid, name, *bound)
    if not hmac.compare_digest(given.encode(), wanted.encode()):
        return (
            f"its {s.ANNOTATION_PROOF} annotation does not verify: the operator did not create "
            "it with this content"
        )
    return None
