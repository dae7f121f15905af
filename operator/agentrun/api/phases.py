"""The enums of the AgentRun API: where a run and a step are in their life
(:class:`RunPhase`, :class:`StepPhase`, with the sets of terminal and active phases), a
person's decision on a gated step and what a rejection does, and which finished Jobs are kept.

Part of :mod:`agentrun.api.models`, which re-exports every name here.
"""

from __future__ import annotations

from enum import StrEnum


class ApprovalDecision(StrEnum):
    """A person's decision on a gated step."""

    APPROVE = "approve"
    REJECT = "reject"


class OnRejection(StrEnum):
    """What a rejection of a gated step does to the run."""

    FAIL_RUN = "failRun"
    SKIP_STEP = "skipStep"


class KeepJobs(StrEnum):
    """Which finished step Jobs the operator keeps."""

    NONE = "none"
    FAILED = "failed"
    ALL = "all"


class RunPhase(StrEnum):
    """Where a run is in its life."""

    PENDING = "Pending"
    RUNNING = "Running"
    WAITING_FOR_APPROVAL = "WaitingForApproval"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL_RUN_PHASES = frozenset({RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED})


class StepPhase(StrEnum):
    """Where a step is in its life."""

    PENDING = "Pending"
    WAITING_FOR_APPROVAL = "WaitingForApproval"
    LAUNCHING = "Launching"
    RUNNING = "Running"
    BACKING_OFF = "BackingOff"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SKIPPED = "Skipped"
    CANCELLED = "Cancelled"


TERMINAL_STEP_PHASES = frozenset(
    {StepPhase.SUCCEEDED, StepPhase.FAILED, StepPhase.SKIPPED, StepPhase.CANCELLED}
)


ACTIVE_STEP_PHASES = frozenset({StepPhase.LAUNCHING, StepPhase.RUNNING})
