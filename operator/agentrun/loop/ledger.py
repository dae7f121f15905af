"""The status ledger: every status write carries the resourceVersion it was derived from.

A write that meets 409 Conflict means someone else moved the run since it was read: the caller
re-reads the run, re-derives the next status from the core and tries again. Conflicts are
counted. The ledger owns ``.status`` of AgentRuns; nothing else in the operator writes it
(kopf keeps its own bookkeeping in annotations).

It also puts the run finalizer on a run that lacks it (:meth:`Ledger.hold`), guarded by the
same resourceVersion: before a pass's first write or object for the run, which then carries
the version that patch returned (no write meets a version moved by another). A finished run
found without it is given it only by a pass that has something of it to clean up. With
shards the same patch labels the run with its shard (agentrun/observation/runs.py), and
:meth:`Ledger.relabel` labels one found without it that no pass will hold.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrun.api import models as m
from agentrun.kubeapi import (
    JSON_PATCH,
    MERGE_PATCH,
    finalizer_addition,
    json_patch,
    label_addition,
    patch_status,
    tolerate,
)
from agentrun.settings import FIELD_MANAGER, LABEL_SHARD, RUN_FINALIZER
from agentrun.telemetry import metrics

log = logging.getLogger("agentrun.ledger")


class Conflict(Exception):
    """The run changed since it was read."""


@dataclass
class LedgerStats:
    """Counters, for logs, metrics and the concurrency tests."""

    commits: int = 0
    conflicts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, commits: int = 0, conflicts: int = 0) -> None:
        with self._lock:
            self.commits += commits
            self.conflicts += conflicts


class Ledger:
    """Reads and writes AgentRuns through one API client."""

    def __init__(self, custom_api: Any, send_status: Callable[..., str] = patch_status) -> None:
        self.custom = custom_api
        self.send_status = send_status
        """How a status patch is sent (:func:`~agentrun.kubeapi.patch_status`'s arguments)."""
        self.stats = LedgerStats()

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The run as stored now (a quorum read, never a cache), or None when it is gone."""
        with tolerate(404) as gone:
            body: dict[str, Any] = self.custom.get_namespaced_custom_object(
                m.GROUP, m.VERSION, namespace, m.PLURAL, name
            )
        if gone:
            return None
        return body

    def hold(self, body: dict[str, Any], shard: str | None = None) -> dict[str, Any] | None:
        """The run read as ``body`` with the run finalizer added and, with ``shard``, its
        ``agentrun.dev/shard`` label set to it (itself if it has both), as stored then; None
        when it is gone. One JSON patch. Raises :class:`Conflict` when the run moved on since
        ``body`` was read (the patch's ``test`` op on its resourceVersion failed)."""
        meta = body["metadata"]
        finalizers = meta.get("finalizers")
        held = RUN_FINALIZER in (finalizers or [])
        labelled = shard is None or (meta.get("labels") or {}).get(LABEL_SHARD) == shard
        if held and labelled:
            return body
        patch = finalizer_addition(finalizers, RUN_FINALIZER, str(meta["resourceVersion"]))
        if held:
            patch = patch[:1]
        if not labelled:
            patch.append(label_addition(meta.get("labels"), LABEL_SHARD, str(shard)))
        with tolerate(404, 409, 422) as refused:
            stored: dict[str, Any] = self.custom.patch_namespaced_custom_object(
                m.GROUP,
                m.VERSION,
                meta["namespace"],
                m.PLURAL,
                meta["name"],
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=JSON_PATCH,
            )
        if refused and refused.status == 404:
            return None
        if refused:
            # 422: the test op failed; 409: the object changed while it was patched. Also
            # 422 when the run is being deleted: no finalizer may be added then.
            self.stats.add(conflicts=1)
            raise Conflict(f"{meta['namespace']}/{meta['name']}") from refused.error
        return stored

    def relabel(self, namespace: str, name: str, uid: str, shard: str) -> bool:
        """Set the ``agentrun.dev/shard`` label of run ``uid`` to ``shard`` (a merge patch
        bound to the uid: nothing else of the run changes, whatever its version); False when
        the run is gone or another has its name."""
        patch = {"metadata": {"uid": uid, "labels": {LABEL_SHARD: shard}}}
        with tolerate(404, 409) as refused:
            self.custom.patch_namespaced_custom_object(
                m.GROUP,
                m.VERSION,
                namespace,
                m.PLURAL,
                name,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )
        return not refused

    def commit(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Write ``status`` (in its wire form, :meth:`~agentrun.api.base.ApiModel.to_wire`)
        onto the run read as ``body``, guarded by its resourceVersion; the run as stored then.

        One JSON patch of the status subresource: the resourceVersion read (the API server
        compares it with the stored one, 409 when they differ, as for a PUT), then only what
        changed between ``body``'s status and ``status`` (:func:`~agentrun.kubeapi.json_patch`),
        so that a write costs what changed, not the run's size, to make and to send. The
        answer is asked for as the version written only (:func:`~agentrun.kubeapi.patch_status`):
        the run as stored is ``body`` with that version and ``status``. A patch the API server
        cannot apply as made (422: a path it does not hold, e.g. a field it pruned) is made
        once more as the whole status.

        Raises :class:`Conflict` when the run moved on since ``body`` was read. Also the fence
        before creating a Job: a write carrying the old resourceVersion fails even when it
        changes nothing.
        """
        meta = body["metadata"]
        old = body.get("status")
        whole = [{"op": "add", "path": "/status", "value": status}]
        if not isinstance(old, dict):
            written = self._patch_status(meta, whole, partial=False)
        else:
            try:
                changes = json_patch(old, status, "/status")
                written = self._patch_status(meta, changes, partial=True)
            except _Unapplied:
                written = self._patch_status(meta, whole, partial=False)
        self.stats.add(commits=1)
        # A write fenced by the version read changed nothing of the metadata but the version
        # (and managedFields, which the operator never reads).
        return {**body, "metadata": {**meta, "resourceVersion": written}, "status": status}

    def _patch_status(self, meta: dict[str, Any], ops: list[dict[str, Any]], partial: bool) -> str:
        """Send ``ops`` behind the fence; the resourceVersion written. ``partial``: they patch
        what changed, and a 422 raises :class:`_Unapplied` (the whole status is sent instead);
        else they are the whole status, and a 422 is the API's refusal, raised as it is."""
        version = meta["resourceVersion"]
        fence = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
        written = ""
        with tolerate(409, 422) as refused:
            written = self.send_status(
                self.custom,
                m.GROUP,
                m.VERSION,
                m.PLURAL,
                meta["namespace"],
                meta["name"],
                [fence, *ops],
                FIELD_MANAGER,
            )
        if refused and refused.status == 409:
            self.stats.add(conflicts=1)
            metrics.STATUS_CONFLICTS.inc()
            raise Conflict(f"{meta['namespace']}/{meta['name']}") from refused.error
        if refused.error is not None:
            if not partial:
                raise refused.error  # the whole status refused: invalid, said as the API says
            raise _Unapplied()
        return written


class _Unapplied(Exception):
    """The API server could not apply a status patch as made."""
