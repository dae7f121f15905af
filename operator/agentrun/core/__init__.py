"""The pure run state machine.

``reconcile(run, observed, now)`` derives the next status of an AgentRun and the actions that
move it forward. Nothing here performs I/O or imports kopf or the kubernetes client (a unit test
enforces that), so every decision the operator makes can be tested in milliseconds.
"""

from agentrun.core.actions import (
    Action,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
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
    "PrepareTurn",
    "ReleaseJob",
    "ResumeSource",
    "SendTurn",
    "StartPod",
    "StoreResult",
    "StrayJob",
    "reconcile",
]
