"""Objects a run owns: the labels and owner reference each one carries, and the run-owned
ConfigMaps (results too large for status, chunks of the audit record).

Pure functions over plain dicts (the JSON the API server speaks). The operator, the step runner
(inside the step's pod) and the plugin build their ConfigMaps here, so every object of a run is
found by the same labels and removed with the run by the same owner reference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m


@dataclass(frozen=True)
class RunRef:
    """The run an object belongs to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, run: m.AgentRun) -> RunRef:
        return cls(run.metadata.name, run.metadata.namespace, run.metadata.uid)


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 characters): longer ones are shortened and made
    unique with a hash; selectors use the run uid label, this one is for people."""
    if len(text) <= 63:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[:54].rstrip('-._')}-{digest}"


def run_labels(run: RunRef) -> dict[str, str]:
    """The labels of every object the run owns."""
    return {
        s.LABEL_RUN: label_value(run.name),
        s.LABEL_RUN_UID: run.uid,
        s.LABEL_MANAGED_BY: s.MANAGED_BY,
    }


def owned_by(run_uid: str, kind: str | None = None) -> str:
    """Label selector of the objects run ``run_uid`` owns; with ``kind``, only those whose
    ``agentrun.dev/object`` label is ``kind`` ("step-job", "result", "audit")."""
    selector = f"{s.LABEL_RUN_UID}={run_uid}"
    return selector if kind is None else f"{selector},{s.LABEL_KIND}={kind}"


def owner_reference(run: RunRef, *, controller: bool = True) -> dict[str, Any]:
    """A reference to the run, so that deleting the run deletes the object.

    The operator's objects name the run as their controller and block its deletion until they
    are gone. Objects written with someone else's rights (the step pod's ServiceAccount, the
    plugin's user) do neither: blocking an owner's deletion takes the right to update its
    finalizers, which only the operator has.
    """
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": controller,
        "blockOwnerDeletion": controller,
    }


def owned_config_map(
    run: RunRef,
    name: str,
    labels: Mapping[str, str],
    data: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    annotations: Mapping[str, str] | None = None,
    controller: bool = True,
) -> dict[str, Any]:
    """A ConfigMap in the run's namespace with the run's labels (and ``labels``), owned by
    the run (see :func:`owner_reference` for ``controller``)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": run.namespace,
        "labels": {**run_labels(run), **labels},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    metadata["ownerReferences"] = [owner_reference(run, controller=controller)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}


def result_config_map(
    run: RunRef,
    name: str,
    step: str,
    attempt: int,
    data: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    controller: bool = True,
) -> dict[str, Any]:
    """The ConfigMap holding a step attempt's result too large for status."""
    result_labels = {s.LABEL_STEP: step, s.LABEL_ATTEMPT: str(attempt), s.LABEL_KIND: "result"}
    return owned_config_map(
        run,
        name,
        {**result_labels, **(labels or {})},
        data,
        annotations=annotations,
        controller=controller,
    )


def audit_config_map(run: RunRef, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """One chunk of the run's audit record."""
    return owned_config_map(run, name, {s.LABEL_KIND: "audit"}, data)
