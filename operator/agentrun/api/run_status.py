"""The AgentRun's status: what the operator observed (:class:`AgentRunStatus`), with each
step's (:class:`StepStatus`, :class:`StepError`, :class:`StepUsage`), the run's conditions,
usage, transitions and audit record; the agent loop's part is :mod:`agentrun.api.agent_status`.

Part of :mod:`agentrun.api.models`, which re-exports every name here. Every field carries a
description for ``kubectl explain``.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from agentrun.api.agent_status import AgentStatus
from agentrun.api.base import ApiModel, ResultRef, Timestamp
from agentrun.api.limits import (
    MAX_HISTORY,
    MAX_HISTORY_HARD,
    MAX_INLINE_RESULT,
    MAX_MESSAGE,
    MAX_REASON,
    MAX_SUMMARY,
    MAX_TOKENS,
)
from agentrun.api.phases import RunPhase, StepPhase


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(description="Condition type, e.g. Succeeded.", max_length=316)
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.", max_length=1024)
    message: str = Field(default="", description="Human readable details.", max_length=32768)
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was set from."
    )
    last_transition_time: Timestamp = Field(description="When status last changed.")


class StepError(ApiModel):
    """Why the last attempt of a step failed."""

    reason: str = Field(
        description="CamelCase reason, e.g. Error, DeadlineExceeded.", max_length=MAX_REASON
    )
    message: str = Field(default="", description="Details, truncated.", max_length=1024)
    exit_code: int | None = Field(default=None, description="Exit code of the container.")
    at: Timestamp | None = Field(default=None, description="When the failure was recorded.")


class StepUsage(ApiModel):
    """What a step consumed, as reported by the step."""

    tokens: int = Field(
        default=0, ge=0, le=MAX_TOKENS, description="Tokens reported by the step (clamped)."
    )


class StepStatus(ApiModel):
    """Observed state of one step."""

    name: str = Field(description="Step name.", max_length=63)
    phase: StepPhase = Field(description="Where the step is in its life.")
    attempt: int = Field(
        default=0, ge=0, description="Number of the current or last attempt (0: not started)."
    )
    job_name: str | None = Field(default=None, description="Job of the current or last attempt.")
    executor_pod: str | None = Field(
        default=None,
        description=(
            "For a model turn's attempt sent to the run's executor instead of a Job of its "
            "own: the uid of the executor's pod, bound in the attempt's intent. Only that pod "
            "is asked for the attempt's outcome; once it is gone without one, the attempt "
            "failed (reason ExecutorLost). jobName is then the attempt's name, not a Job's."
        ),
        max_length=64,
    )
    args_hash: str | None = Field(
        default=None,
        description=(
            "sha256 of everything that decides what the step runs and as whom: image, "
            "command, args, env (references, never secret values), inputs, workingDir, "
            "resources, and stepTemplate's serviceAccountName and security contexts. "
            "Approvals must name it; any change needs a new approval."
        ),
    )
    idempotency_key: str | None = Field(
        default=None,
        description=(
            "{run uid}:{step}:{image}:{argsHash}, given to the pod as AGENTRUN_IDEMPOTENCY_KEY."
        ),
    )
    started_at: Timestamp | None = Field(
        default=None, description="When the first attempt started."
    )
    finished_at: Timestamp | None = Field(default=None, description="When the step finished.")
    attempt_started_at: Timestamp | None = Field(
        default=None, description="When the current attempt was launched."
    )
    next_attempt_at: Timestamp | None = Field(
        default=None, description="When the next attempt starts (while BackingOff)."
    )
    summary: str | None = Field(
        default=None, description="Short summary of the result.", max_length=MAX_SUMMARY
    )
    result: str | None = Field(
        default=None,
        description="The result, when small enough to keep inline.",
        max_length=MAX_INLINE_RESULT,
    )
    result_ref: ResultRef | None = Field(default=None, description="Where a larger result is kept.")
    result_digest: str | None = Field(
        default=None,
        description="sha256 of the full result, when it is kept by reference.",
        max_length=64,
    )
    error: StepError | None = Field(default=None, description="Why the last attempt failed.")
    approval_requested_at: Timestamp | None = Field(
        default=None, description="Since when the step waits for approval."
    )
    decided_by: str | None = Field(
        default=None,
        description="Who approved or rejected the step's current arguments.",
        max_length=253,
    )
    gated: bool | None = Field(
        default=None,
        description=(
            "True once the step has needed approval in this run. A gated step stays gated for "
            "the run's life, even if it is removed from the plan and added back with a weaker "
            "risk or approval: approval requirements only get stricter."
        ),
    )
    frozen: str | None = Field(
        default=None,
        description=(
            "What the step may use with its creator's rights: a digest of its container and "
            "the run's ServiceAccount as the plan held them on the operator's first pass, or "
            "'added' for a step added later. A step that uses a Secret, a ConfigMap or the "
            "ServiceAccount launches only while it still has that digest."
        ),
        max_length=64,
    )
    usage: StepUsage | None = Field(default=None, description="What the step consumed.")
    message: str | None = Field(
        default=None, description="Human readable state.", max_length=MAX_MESSAGE
    )


class Usage(ApiModel):
    """What the run consumed so far."""

    steps: int = Field(default=0, ge=0, description="Distinct steps started.")
    attempts: int = Field(default=0, ge=0, description="Step attempts (Jobs) launched.")
    tokens: int = Field(
        default=0, ge=0, le=MAX_TOKENS, description="Tokens reported by steps (clamped)."
    )
    wall_time_seconds: int = Field(default=0, ge=0, description="Seconds since the run started.")


class Transition(ApiModel):
    """One change of phase of the run or of a step."""

    # Never changed once made: a pass appends new ones and shares those it read
    # (agentrun.core.machine._copy_status).
    model_config = ConfigDict(frozen=True)

    at: Timestamp = Field(description="When it happened.")
    step: str | None = Field(default=None, description="The step; unset for the run itself.")
    from_phase: str | None = Field(
        default=None, alias="from", description="Phase before (unset when new)."
    )
    to_phase: str = Field(alias="to", description="Phase after.")
    reason: str = Field(description="CamelCase reason.", max_length=MAX_REASON)
    message: str | None = Field(default=None, description="Details.", max_length=MAX_MESSAGE)
    by: str | None = Field(
        default=None, description="Who caused it, when a person did.", max_length=253
    )
    seq: int = Field(default=0, ge=0, description="Sequence number of the transition in the run.")


class AuditStatus(ApiModel):
    """Where the full, hash-chained audit record of the run is kept."""

    record: str | None = Field(
        default=None, description="Name prefix of the run's audit record ConfigMaps."
    )
    recorded_seq: int = Field(
        default=0, ge=0, description="Transitions up to this seq are in the audit record."
    )
    head_seq: int | None = Field(
        default=None,
        ge=0,
        description=(
            "seq of the last transition the record's hash chain covers, committed with it: "
            "the chain's anchor (status is written only by the operator)."
        ),
    )
    head_hash: str | None = Field(
        default=None,
        description="Hash of the chain's entry headSeq; the record must end at it.",
        pattern=r"^[a-f0-9]{64}$",
    )


class AgentRunStatus(ApiModel):
    """What the operator observed and did. Written only by the operator, via /status."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation this status was derived from."
    )
    phase: RunPhase | None = Field(default=None, description="Where the run is in its life.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="Succeeded (Unknown, True or False with a reason) and ApprovalPending.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    message: str | None = Field(
        default=None, description="Human readable state of the run.", max_length=MAX_MESSAGE
    )
    progress: str | None = Field(default=None, description="Succeeded steps / all steps, e.g. 2/5.")
    current_step: str | None = Field(
        default=None,
        description="The step(s) running or waiting now, comma separated.",
        max_length=MAX_MESSAGE,
    )
    started_at: Timestamp | None = Field(default=None, description="When the run started.")
    completed_at: Timestamp | None = Field(default=None, description="When the run finished.")
    steps: list[StepStatus] | None = Field(
        default=None,
        description="One entry per step that the operator has looked at.",
        # Atomic, not a map keyed by name: the operator is the list's only writer, and the API
        # server then tracks it in managedFields as one field, not every field of every entry
        # (about 31 KiB of each read, watch event and stored copy of a 128-step run).
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    usage: Usage | None = Field(default=None, description="What the run consumed.")
    history: list[Transition] | None = Field(
        default=None,
        description=(
            f"The last {MAX_HISTORY} transitions, oldest first (more while the audit record "
            "lags behind); the full trail is in the audit record."
        ),
        max_length=MAX_HISTORY_HARD,
    )
    history_seq: int | None = Field(default=None, description="seq of the latest transition.")
    audit: AuditStatus | None = Field(default=None, description="The full audit record.")
    agent: AgentStatus | None = Field(
        default=None, description="The agent loop, in runs with spec.agent."
    )
