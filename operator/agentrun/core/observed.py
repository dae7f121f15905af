"""What the shell observed in the cluster, reduced to what the core needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class JobState(StrEnum):
    ACTIVE = "Active"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class ObservedJob:
    """A step Job as found in the cluster (by label: run uid, step, attempt)."""

    name: str
    step: str
    attempt: int
    state: JobState
    termination_message: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # e.g. Error, DeadlineExceeded, BackoffLimitExceeded
    message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deleting: bool = False
    """Someone deleted the Job; the operator's Job finalizer keeps it visible until the
    attempt's outcome is committed, so a deleted attempt is never mistaken for one that was
    never created (which would be created again)."""


@dataclass(frozen=True)
class Observed:
    """Everything observed for one run."""

    jobs: Sequence[ObservedJob] = field(default_factory=tuple)
    recorded_seq: int | None = None
    """The highest transition seq stored in the run's audit record; None when the shell
    keeps no record (then the history is a plain ring)."""
    record_name: str | None = None

    def job(self, name: str) -> ObservedJob | None:
        return next((j for j in self.jobs if j.name == name), None)
