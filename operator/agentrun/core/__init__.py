"""The pure run state machine.

``reconcile(run, observed, now)`` derives the next status of an AgentRun and the actions that
move it forward. Nothing here performs I/O or imports kopf or the kubernetes client (a unit test
enforces that), so every decision the operator makes can be tested in milliseconds.

The names below are loaded when first asked for: importing a module of the core (its names,
its envelope, a turn's context, as a step's pod does) loads no more than that module needs.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrun.core.actions import (
        Action,
        CreateJob,
        DeleteJob,
        DeleteRun,
        EmitEvent,
        PrepareExecutor,
        PrepareTurn,
        ReleaseJob,
        SendTurn,
        StartPod,
        StoreResult,
    )
    from agentrun.core.machine import CoreConfig, Decision, reconcile
    from agentrun.core.observed import (
        AheadJob,
        CarriedSource,
        JobState,
        Observed,
        ObservedJob,
        PodRef,
        ResumeSource,
        StrayJob,
    )

_WHERE = {
    "Action": "actions",
    "AheadJob": "observed",
    "CarriedSource": "observed",
    "CoreConfig": "machine",
    "CreateJob": "actions",
    "Decision": "machine",
    "DeleteJob": "actions",
    "DeleteRun": "actions",
    "EmitEvent": "actions",
    "JobState": "observed",
    "Observed": "observed",
    "ObservedJob": "observed",
    "PodRef": "observed",
    "PrepareExecutor": "actions",
    "PrepareTurn": "actions",
    "ReleaseJob": "actions",
    "ResumeSource": "observed",
    "SendTurn": "actions",
    "StartPod": "actions",
    "StoreResult": "actions",
    "StrayJob": "observed",
    "reconcile": "machine",
}
"""Where each name below lives (its module of the core)."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Action",
    "AheadJob",
    "CarriedSource",
    "CoreConfig",
    "CreateJob",
    "Decision",
    "DeleteJob",
    "DeleteRun",
    "EmitEvent",
    "JobState",
    "Observed",
    "ObservedJob",
    "PodRef",
    "PrepareExecutor",
    "PrepareTurn",
    "ReleaseJob",
    "ResumeSource",
    "SendTurn",
    "StartPod",
    "StoreResult",
    "StrayJob",
    "reconcile",
]
