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
from typing import TYPE_CHECKING, Any

from agentrun import settings as s
from agentrun.api import names
from agentrun.core.envelope import result_object_data
from agentrun.core.naming import sha256_text

if TYPE_CHECKING:
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


def owner_reference(
    run: RunRef, *, controller: bool = True, block: bool | None = None
) -> dict[str, Any]:
    """A reference to the run, so that deleting the run deletes the object.

    The operator's objects name the run as their controller and block its deletion until they
    are gone. Objects written with someone else's rights (the step pod's ServiceAccount, the
    plugin's user) do neither: blocking an owner's deletion takes the right to update its
    finalizers, which only the operator has: ``block`` (default: ``controller``) says
    whether it blocks.
    """
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": controller,
        "blockOwnerDeletion": controller if block is None else block,
    }


def owned_config_map(
    run: RunRef,
    name: str,
    labels: Mapping[str, str],
    data: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    annotations: Mapping[str, str] | None = None,
    controller: bool = True,
    block: bool | None = None,
    immutable: bool = False,
) -> dict[str, Any]:
    """A ConfigMap in the run's namespace with the run's labels (and ``labels``), owned by
    the run (see :func:`owner_reference` for ``controller`` and ``block``)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": run.namespace,
        "labels": {**run_labels(run), **labels},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    metadata["ownerReferences"] = [owner_reference(run, controller=controller, block=block)]
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
    body["data"] = dict(data)
    if immutable:
        body["immutable"] = True
    return body


def result_config_map(
    run: RunRef,
    name: str,
    step: str,
    attempt: int,
    data: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    block: bool = True,
) -> dict[str, Any]:
    """The ConfigMap holding a step attempt's result too large for status: immutable, its
    controller the run (``block``: whether it blocks the run's deletion, which only the
    operator may ask for). Immutable alone proves nothing (anyone who may create ConfigMaps
    can delete it and create another under the name): where it is read, its controller's uid
    and the digest committed in status are checked (:func:`result_problem`)."""
    result_labels = {s.LABEL_STEP: step, s.LABEL_ATTEMPT: str(attempt), s.LABEL_KIND: "result"}
    return owned_config_map(
        run,
        name,
        {**result_labels, **(labels or {})},
        data,
        annotations=annotations,
        controller=True,
        block=block,
        immutable=True,
    )


def result_problem(
    run_uid: str, config_map: Mapping[str, Any], digest: str | None, *, stored: bool = False
) -> str | None:
    """Why ``config_map`` (the API's JSON) is not a result object of run ``run_uid`` holding
    content of sha256 ``digest`` (its ``result`` entry; every other entry derives from it);
    None when it is. ``stored``: it must be as the operator stores it (controlled by the run,
    immutable); else any reference to the run will do (a fork's copy of a carried result is
    its user's), for the digest is the proof."""
    meta = config_map.get("metadata") or {}
    name = meta.get("name")
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller") or not stored]
    if not any(o.get("uid") == run_uid for o in owners):
        how = "controlled" if stored else "owned"
        return f"ConfigMap {name} is not {how} by the run (uid {run_uid})"
    if stored and config_map.get("immutable") is not True:
        return f"ConfigMap {name} is not immutable, so its content may have changed"
    result = (config_map.get("data") or {}).get("result")
    if not isinstance(result, str) or not digest or sha256_text(result) != digest:
        return (
            f"the content of ConfigMap {name} does not have the digest committed for it "
            f"({(digest or 'none')[:12]}): it was changed or replaced after the step wrote it"
        )
    return None


def result_entry(result: str, key: str) -> str | None:
    """Entry ``key`` of a result object holding ``result``, derived from the verified result
    itself (never read from the object's other entries), None when it has no such entry."""
    return dict(result_object_data(result)).get(key)


def audit_config_map(run: RunRef, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """One chunk of the run's audit record."""
    return owned_config_map(run, name, {s.LABEL_KIND: "audit"}, data)
