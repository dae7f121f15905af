"""The pure checks of whether a Job found under an attempt's name is the Job the operator
creates for the committed intent (:mod:`agentrun.observation.adoption` runs them): whom it
names as its controller, how its spec compares with a dry run of the operator's own manifest
(ignoring only what the API server derives from the Job's name and uid), and how a Job that is
not the attempt's is told to the run's creator.

Pure functions over plain dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agentrun.api import models as m
from agentrun.core import CreateJob
from agentrun.execution import jobs, proof
from agentrun.observation.view import controller_ref

Obj = dict[str, Any]

DERIVED_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)
"""Pod template labels the API server sets from the Job's uid and name."""


def ownership_problem(job: Mapping[str, Any], run_uid: str) -> str | None:
    """Why ``job`` is not controlled by run ``run_uid``; None when it is. Labels are not
    looked at: anyone who may edit the Job may change them."""
    ref = controller_ref(job)
    if ref is None:
        return "it has no controller owner reference"
    group = str(ref.get("apiVersion", "")).split("/")[0]
    if ref.get("kind") != m.KIND or group != m.GROUP or ref.get("uid") != run_uid:
        return (
            f"its controller is {ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')}), "
            "not this run"
        )
    return None


def comparable_spec(job: Mapping[str, Any]) -> Any:
    """The Job's spec without what the API server derives from its name and uid, nor what
    decides nothing the step runs."""
    # The shard label routes watch events only (proof.without_shard_label).
    spec = dict(copy.deepcopy(proof.without_shard_label(job.get("spec") or {})))
    spec.pop("selector", None)
    # Set by the operator when it releases a finished Job (agentrun.core.actions.ReleaseJob);
    # it decides when the Job goes, never what it runs.
    spec.pop("ttlSecondsAfterFinished", None)
    # How many pods the Job keeps active decides nothing: the operator lets one pod of an
    # attempt start (agentrun.execution.jobs.choose_pod), and any other stays held.
    spec.pop("parallelism", None)
    meta = job.get("metadata") or {}
    derived = {meta.get("uid"), meta.get("name")} - {None, ""}
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        for key in [k for k, v in labels.items() if k in DERIVED_LABELS or v in derived]:
            del labels[key]
    return spec


def first_difference(expected: Any, found: Any, path: str = "spec") -> str | None:
    """The path of the first place where ``found`` differs from ``expected``; None if equal."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for key in sorted(set(expected) | set(found)):
            if key not in found:
                return f"{path}.{key} (missing)"
            if key not in expected:
                return f"{path}.{key} (unexpected)"
            where = first_difference(expected[key], found[key], f"{path}.{key}")
            if where:
                return where
        return None
    if isinstance(expected, list) and isinstance(found, list):
        for i, (a, b) in enumerate(zip(expected, found, strict=False)):
            where = first_difference(a, b, f"{path}[{i}]")
            if where:
                return where
        if len(expected) != len(found):
            return f"{path} ({len(found)} items, not {len(expected)})"
        return None
    return None if expected == found else path


def spec_problem(expected_job: Mapping[str, Any], found_job: Mapping[str, Any]) -> str | None:
    """Check (ii): why ``found_job``'s spec is not ``expected_job``'s (the dry run of the
    operator's manifest); None when they agree."""
    where = first_difference(comparable_spec(expected_job), comparable_spec(found_job))
    if where is None:
        return None
    return f"its spec is not the one the operator creates for the attempt ({where} differs)"


def dry_run_manifest(run: m.AgentRun, intent: CreateJob, key: bytes) -> Obj:
    """The operator's manifest for ``intent`` under ``generateName`` (for the dry run)."""
    manifest = jobs.step_job(run, intent, key)
    manifest["metadata"].pop("name", None)
    manifest["metadata"]["generateName"] = f"{intent.job_name[:56]}-"
    return manifest


def name_taken_message(name: str, attempt: int, problem: str, signed: bool = False) -> str:
    if signed:  # the operator's own, made from what the step was at its launch
        return (
            f"Job {name} of attempt {attempt} was created by the operator from the step as it "
            f"was at its launch, and the step has changed since ({problem}); it does not run "
            "what the step is now and never counts as its result"
        )
    return (
        f"a Job not created by the operator holds the name {name} of attempt {attempt}: "
        f"{problem}; it is left alone and never counts as the step's"
    )
