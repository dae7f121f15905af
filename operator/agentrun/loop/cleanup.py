"""Cleanup: what deleting a run removes, and how long its deletion waits for that.

* :func:`remove_owned`: delete everything a run owns (its Jobs, releasing their finalizers, its
  pods and ConfigMaps) and say what is still there;
* :func:`with_patience`: the one policy of a deletion whose cleanup leaves something (a Job
  held by someone else's finalizer) or fails: the run keeps its finalizer, and cleanup is
  tried again, until the deletion has waited ``patience`` seconds (the
  ``cleanup_timeout_seconds`` setting); then it is finished anyway, with a CleanupIncomplete
  Event saying what was left. Both a deletion's own task (:mod:`.scheduler`) and the janitor
  (:mod:`.janitor`) judge their cleanups by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentrun.execution import objects
from agentrun.loop.act import Actor
from agentrun.loop.common import Apis


def remove_owned(apis: Apis, actor: Actor, namespace: str, uid: str) -> list[str]:
    """Delete everything run ``uid`` owns; return what is still there."""
    selector = objects.owned_by(uid)
    for job in apis.batch.list_namespaced_job(namespace, label_selector=selector).items:
        actor.delete_job(namespace, job.metadata.name)
    apis.core.delete_collection_namespaced_config_map(namespace, label_selector=selector)
    apis.core.delete_collection_namespaced_pod(namespace, label_selector=selector)
    left: list[str] = []
    for job in apis.batch.list_namespaced_job(namespace, label_selector=selector).items:
        holders = ", ".join(job.metadata.finalizers or []) or "no finalizers"
        left.append(f"Job {job.metadata.name} (finalizers: {holders})")
    return left


@dataclass(frozen=True)
class Deletion:
    """One cleanup of a run being deleted, judged by the patience of its deletion."""

    left: list[str]
    """What is still there; when the cleanup failed, why. Empty: the deletion is complete."""
    error: Exception | None = None
    """The failure of the cleanup, if it failed."""
    waited: float = 0.0
    """Seconds the deletion had waited, measured when something was left."""
    waits: bool = False
    """Something is left and patience is not over: the run keeps its finalizer for now."""

    @property
    def forced(self) -> bool:
        """Something is left and patience is over: the run's finalizer goes anyway."""
        return bool(self.left) and not self.waits

    @property
    def leftovers(self) -> str:
        return ", ".join(self.left)


def with_patience(
    cleanup: Callable[[], list[str]], waited: Callable[[], float], patience: float
) -> Deletion:
    """Run ``cleanup`` (it returns what is still there) once and judge it. ``waited``: how
    long the deletion has waited so far, in seconds, as the caller measures it."""
    try:
        left = cleanup()
        error = None
    except Exception as exc:  # cleanup must never hang the deletion forever
        left, error = [f"cleanup failed: {exc}"], exc
    if not left:
        return Deletion([])
    seconds = waited()
    return Deletion(left, error, seconds, seconds < patience)
