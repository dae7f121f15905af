"""What every part of a reconcile pass shares: the API groups it talks to (:class:`Apis`), the
named moments where the crash tests stop it (:data:`CHECKPOINTS`), and its logger with the log
fields that name a run, step and attempt.

Imports nothing of the loop: observe, decide, commit, act and cleanup all stand on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrun.api import models as m

log = logging.getLogger("agentrun.reconciler")
"""One logger for every part of a pass: the name its lines have always carried."""

CHECKPOINTS = (
    "after-intent-commit",
    "after-job-create",
    "after-child-create",
    "after-pod-start",
    "after-result-store",
    "before-result-commit",
    "after-result-commit",
    "before-job-release",
    "after-turn-prepare",
    "before-turn-request",
    "after-turn-request",
    "after-executor-create",
    "after-executor-answer",
)
"""The named moments of a pass where a crash is most interesting: a :data:`Checkpoint` hook
given to :class:`agentrun.loop.reconciler.Reconciler` is called with one of these names each
time a pass reaches it."""

Checkpoint = Callable[[str], None]
"""Called with a :data:`CHECKPOINTS` name; the crash tests inject one that kills the process."""


def no_checkpoint(point: str) -> None:
    return None


@dataclass(frozen=True)
class Apis:
    """The API groups the operator talks to."""

    core: Any  # CoreV1Api
    batch: Any  # BatchV1Api
    custom: Any  # CustomObjectsApi
    authorization: Any = None  # AuthorizationV1Api; made from core's client when not given
    events: Any = None  # EventsV1Api; made from core's client when not given


def run_fields(
    run: m.AgentRun, step: str | None = None, attempt: int | None = None
) -> dict[str, Any]:
    """Structured log fields naming the run, step and attempt."""
    fields: dict[str, Any] = {"run": f"{run.metadata.namespace}/{run.metadata.name}"}
    if step is not None:
        fields["step"] = step
    if attempt is not None:
        fields["attempt"] = attempt
    return {"agentrun": fields}
