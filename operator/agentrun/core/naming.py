"""Deterministic names and keys: the same inputs always give the same name.

Determinism is what makes a repeated create after a crash meet AlreadyExists instead of making
a second Job.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_NAME = 63
MAX_JOB_NAME = 57
"""The longest step Job name (step and executor Jobs alike). The Job controller names a Job's
pods ``(job name + "-")[:58]`` plus 5 random characters (``getPodsPrefix`` in Kubernetes'
pkg/controller/controller_utils.go; the API server's ``SimpleNameGenerator`` cuts a
generateName to ``MaxGeneratedNameLength``, 63 - 5 = 58). So a pod keeps its Job's whole name,
``-<hash>-<attempt>`` included, only when the Job's name has at most 57 characters, and that
ending is how the ``agentrun-pod-doors`` admission policy (manifests/admission/
pod-doors-policy.yaml) tells step and executor pods from others: it sees a pod's name only."""
_INVALID = re.compile(r"[^a-z0-9-]+")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def dns_label(prefix: str, suffix: str, max_len: int = MAX_NAME) -> str:
    """``prefix-suffix`` shortened to a DNS-1123 label of at most ``max_len`` characters
    (the prefix is cut, never the suffix)."""
    prefix = _INVALID.sub("-", prefix.lower()).strip("-")
    room = max_len - len(suffix) - 1
    prefix = prefix[:room].rstrip("-")
    return f"{prefix}-{suffix}" if prefix else suffix


def job_name(run_name: str, run_uid: str, step: str, attempt: int) -> str:
    """Name of the Job of one step attempt: readable prefix, unique hash, attempt number.

    Unique per (run uid, step, attempt): two runs of the same name (deleted and recreated) get
    different Jobs, and so do two attempts of one step. At most :data:`MAX_JOB_NAME`
    characters, so that its pods' names end in ``-<10 hex>-<attempt>-<5 random>``.
    """
    suffix = f"{_digest(run_uid, step, str(attempt))[:10]}-{attempt}"
    return dns_label(f"{run_name}-{step}", suffix, MAX_JOB_NAME)


def result_object_name(run_name: str, run_uid: str, step: str, attempt: int) -> str:
    """Name of the ConfigMap that keeps a step attempt's result when it is too big for status."""
    suffix = f"r{_digest(run_uid, step, str(attempt), 'result')[:9]}-{attempt}"
    return dns_label(f"{run_name}-{step}", suffix)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    """sha256 of ``text`` as UTF-8 (lone surrogates, which no API object holds but a hostile
    input may, are hashed as their code points instead of failing)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def args_hash(
    image: str,
    command: Sequence[str],
    args: Sequence[str],
    env: Sequence[Mapping[str, Any]],
    inputs: Mapping[str, str],
    *,
    working_dir: str | None = None,
    resources: Mapping[str, Any] | None = None,
    service_account_name: str | None = None,
    security_context: Mapping[str, Any] | None = None,
    container_security_context: Mapping[str, Any] | None = None,
) -> str:
    """sha256 of everything that decides what a step attempt does, and as whom.

    The hashed payload is the canonical JSON of an object with these members:

    - ``image``, ``command``, ``args``: the step's container, as written;
    - ``env``: the step's env entries (each as canonical JSON, sorted): literal values and the
      *references* of valueFrom entries (never secret values);
    - ``inputs``: input names mapped to what they resolve to (a value's digest);
    - ``workingDir``: the container's working directory;
    - ``resources``: the compute resources the container gets (the step's own, else the
      stepTemplate's);
    - ``serviceAccountName``, ``securityContext``, ``containerSecurityContext``: from
      spec.stepTemplate, as written (unset means the restricted defaults and no token).

    The last five are members only when set, so a step that uses none of them keeps the hash
    it had before they were covered. Approvals bind to this hash: changing any of these
    (say, the security context between two retries) needs a new approval, and gives a new
    idempotency key. (A step using the creator's rights, a ServiceAccount among them, that
    changed since the run started does not run at all: :mod:`agentrun.core.frozen`.)
    """
    payload: dict[str, Any] = {
        "image": image,
        "command": list(command),
        "args": list(args),
        "env": sorted(canonical_json(e) for e in env),
        "inputs": dict(sorted(inputs.items())),
    }
    pod: dict[str, Any] = {
        "workingDir": working_dir,
        "resources": resources,
        "serviceAccountName": service_account_name,
        "securityContext": security_context,
        "containerSecurityContext": container_security_context,
    }
    payload.update({k: v for k, v in pod.items() if v is not None})
    return sha256_text(canonical_json(payload))


def idempotency_key(run_uid: str, step: str, image: str, step_args_hash: str) -> str:
    """``{run uid}:{step}:{image}:{args hash}``: the same for every retry of an unchanged step."""
    return f"{run_uid}:{step}:{image}:{step_args_hash}"
