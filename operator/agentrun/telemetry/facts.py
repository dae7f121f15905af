"""The facts of one committed status write: attempts ended, approvals decided, the run ended.

:mod:`agentrun.telemetry.changes` derives them from the status read and the status committed;
:mod:`agentrun.telemetry.metrics` and :mod:`agentrun.telemetry.tracing` record them. They live
apart so that the recorders need not import the module that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
"""Outcomes of a step attempt. Cancelled: stopped by the run ending or the step leaving the
plan, or its intent dropped before its Job was created (the step changed)."""

APPROVED = "approved"
REJECTED = "rejected"
EXPIRED = "expired"
"""Decisions on a step waiting for approval."""


@dataclass(frozen=True)
class AttemptEnded:
    """A step attempt whose end this commit recorded."""

    step: str
    attempt: int
    outcome: str
    """:data:`SUCCEEDED`, :data:`FAILED` or :data:`CANCELLED`."""
    retried: bool
    """A failed attempt after which another one is scheduled (the step is BackingOff)."""
    reason: str
    started_at: datetime | None
    """When the attempt was launched (its committed intent); None when not known."""
    ended_at: datetime
    tokens: int
    """Tokens the attempt reported (a succeeded attempt's envelope), else 0."""
    approval_wait_seconds: float | None
    """How long the step waited for the approval that launched this attempt, when it did
    and the committed history still holds both transitions."""

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None:
            return None
        return max((self.ended_at - self.started_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class ApprovalDecided:
    """A step left WaitingForApproval on a decision (approved, rejected or expired)."""

    step: str
    decision: str
    requested_at: datetime | None
    decided_at: datetime
    by: str | None

    @property
    def wait_seconds(self) -> float | None:
        if self.requested_at is None:
            return None
        return max((self.decided_at - self.requested_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class RunEnded:
    """The run reached a terminal phase in this commit."""

    phase: str
    reason: str
    started_at: datetime | None
    completed_at: datetime | None
    tokens: int
    attempts: int
    steps: int


@dataclass(frozen=True)
class Changes:
    """What a committed write changed."""

    attempts_started: int = 0
    attempts_ended: tuple[AttemptEnded, ...] = ()
    approvals: tuple[ApprovalDecided, ...] = ()
    tokens: int = 0
    run_ended: RunEnded | None = None

    def __bool__(self) -> bool:
        return bool(
            self.attempts_started
            or self.attempts_ended
            or self.approvals
            or self.tokens
            or self.run_ended
        )
