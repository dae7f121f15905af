"""The AgentRun API (agentrun.dev/v1alpha1): pydantic models of spec and status.

These models are the single source of truth for the API. The CustomResourceDefinition in
``crds/`` (its OpenAPI schema, the descriptions shown by ``kubectl explain`` and the CEL
validation rules) is generated from them by ``agentrun crd`` (see :mod:`agentrun.api.crd`).

Every field carries a description; keep them written for the person typing ``kubectl explain``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator

from agentrun.api.agent import Agent, AgentStatus

# Re-exported: the rest of the code reads every name of the API from this module.
from agentrun.api.base import ENV_NAME_PATTERN as ENV_NAME_PATTERN
from agentrun.api.base import MAX_ARGS as MAX_ARGS
from agentrun.api.base import MAX_ENV as MAX_ENV
from agentrun.api.base import ApiModel as ApiModel
from agentrun.api.base import ApprovalMode as ApprovalMode
from agentrun.api.base import Backoff as Backoff
from agentrun.api.base import ConfigMapKeySelector as ConfigMapKeySelector
from agentrun.api.base import ContainerAction as ContainerAction
from agentrun.api.base import EnvVar as EnvVar
from agentrun.api.base import EnvVarSource as EnvVarSource
from agentrun.api.base import Quantity as Quantity
from agentrun.api.base import ResourceRequirements as ResourceRequirements
from agentrun.api.base import ResultRef as ResultRef
from agentrun.api.base import RetryPolicy as RetryPolicy
from agentrun.api.base import Risk as Risk
from agentrun.api.base import SecretKeySelector as SecretKeySelector
from agentrun.api.base import Timestamp as Timestamp
from agentrun.api.names import API_VERSION as API_VERSION
from agentrun.api.names import CATEGORIES as CATEGORIES
from agentrun.api.names import GROUP as GROUP
from agentrun.api.names import KIND as KIND
from agentrun.api.names import MAX_FIELD_KEY as MAX_FIELD_KEY
from agentrun.api.names import PLURAL as PLURAL
from agentrun.api.names import SHORT_NAMES as SHORT_NAMES
from agentrun.api.names import SINGULAR as SINGULAR
from agentrun.api.names import VERSION as VERSION

# Limits that keep objects far below etcd's 1.5 MiB object limit and CEL costs bounded.
MAX_GOAL = 4096
"""Longest spec.goal (characters); a follow-up question is one."""
# MAX_STEPS and MAX_DEPENDENCIES are set by the API server's cost budget for the CEL rule that
# checks every dependsOn entry names a step (its estimated cost grows as steps^2 * deps):
# 128 x 16 fits, 500 x 32 is refused as 26x over budget.
MAX_STEPS = 128
MAX_DEPENDENCIES = 16
MAX_INPUTS = 32
MAX_APPROVALS = 64
MAX_HISTORY = 50
MAX_HISTORY_HARD = 1000
"""History keeps entries the audit record has not stored yet, up to this many."""
MAX_INLINE_RESULT = 4096
"""Longest result kept in status (spec.carriedResults[].result has the same bound)."""
MAX_SUMMARY = 1024
MAX_MESSAGE = 1024
MAX_REASON = 128
MAX_TOKENS = 2**53 - 1
"""Token counts in status are clamped to this (exact in any JSON reader, within int64)."""
ANNOTATION_CREATED_BY = f"{GROUP}/created-by"
"""Set at admission (MutatingAdmissionPolicy) to the user who created the run."""
ANNOTATION_CREATED_BY_GROUPS = f"{GROUP}/created-by-groups"
"""Set at admission with created-by: the creating user's groups, a JSON array of strings."""
ANNOTATION_MODIFIED_BY = f"{GROUP}/last-modified-by"
"""Set at admission to the user who last changed the run's spec."""

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ARGS_HASH_PATTERN = r"^[a-f0-9]{64}$"


# --------------------------------------------------------------------------------------------
# Enums
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------------------------


class StepInput(ApiModel):
    """A result of an earlier step handed to this step as an environment variable."""

    name: str = Field(
        description="Environment variable that receives the value.",
        min_length=1,
        max_length=128,
        pattern=ENV_NAME_PATTERN,
    )
    from_step: str = Field(
        description="The step whose result is passed; it must be listed in dependsOn.",
        min_length=1,
        max_length=63,
    )
    key: str | None = Field(
        default=None,
        description=(
            "A top-level field of the step's JSON result; the whole result (JSON text) when "
            "unset. At most 240 characters: longer field names are not kept apart from the "
            "whole result."
        ),
        max_length=MAX_FIELD_KEY,
    )


class Step(ApiModel):
    """One step of the plan: what to run, after what, how risky, how often to retry."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.dependsOn) || !(self.name in self.dependsOn)",
                    "message": "a step cannot depend on itself",
                },
                {
                    "rule": "!has(self.inputs) || self.inputs.all(i, has(self.dependsOn) && "
                    "i.fromStep in self.dependsOn)",
                    "message": "every inputs[].fromStep must be listed in dependsOn",
                },
            ]
        }
    )

    name: str = Field(
        description=(
            "Unique name of the step within the plan: a DNS label (lowercase letters, digits "
            "and '-', at most 63 characters)."
        ),
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
    )
    description: str | None = Field(
        default=None, description="What the step does, for people.", max_length=1024
    )
    depends_on: list[Annotated[str, Field(max_length=63)]] | None = Field(
        default=None,
        description="Names of steps that must succeed before this one starts.",
        max_length=MAX_DEPENDENCIES,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    container: ContainerAction = Field(description="The container that performs the step.")
    risk: Risk = Field(
        default=Risk.READ,
        description=(
            "read: only observes; write: changes state the run owns; external: acts on the "
            "outside world. policy.approvalRequiredFor decides which risks need approval."
        ),
    )
    approval: ApprovalMode = Field(
        default=ApprovalMode.AUTO,
        description="required: the step waits for a matching approval in spec.approvals.",
    )
    on_rejection: OnRejection = Field(
        default=OnRejection.FAIL_RUN,
        description=(
            "failRun: a rejection of this step fails the run; skipStep: the step and the steps "
            "that depend on it are skipped and the rest of the plan goes on."
        ),
    )
    retry: RetryPolicy | None = Field(default=None, description="Retries; none when unset.")
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 86400,
        description="Deadline of one attempt (the Job's activeDeadlineSeconds).",
    )
    inputs: list[StepInput] | None = Field(
        default=None,
        description="Results of earlier steps passed to this step as environment variables.",
        max_length=MAX_INPUTS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class Plan(ApiModel):
    """The steps of the run and their dependencies (a directed acyclic graph)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The API server evaluates a spec's rules on every write of the run, its
                    # status writes included; this one walks the steps once per dependency
                    # (some 130 ms of the API server's time per write of a 128-step run), so
                    # a plan unchanged by the write is not walked again.
                    "rule": "(oldSelf.hasValue() && self == oldSelf.value()) || "
                    "self.steps.all(s, !has(s.dependsOn) || "
                    "s.dependsOn.all(d, self.steps.exists(t, t.name == d)))",
                    "message": "every dependsOn entry must name a step of this plan",
                    "optionalOldSelf": True,
                }
            ]
        }
    )

    steps: list[Step] = Field(
        description="The steps, in any order; dependsOn decides the order they run in.",
        min_length=1,
        max_length=MAX_STEPS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class Budget(ApiModel):
    """Limits the run never exceeds; reaching one ends the run with reason BudgetExceeded."""

    max_steps: int | None = Field(
        default=None, ge=1, le=10000, description="Most distinct steps the run may start."
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="Most step attempts (Jobs) in total, retries included.",
    )
    max_wall_time_seconds: int | None = Field(
        default=None,
        ge=1,
        le=30 * 86400,
        description=(
            "Deadline of the whole run, counted from its start; running steps are stopped "
            "and the run fails with reason DeadlineExceeded."
        ),
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Most tokens the steps may report in total (model turns report the prompt and "
            "completion tokens of the endpoint's usage); once reached no further step starts. "
            "An agent run is paused instead (reason BudgetExhausted) before a model turn the "
            "tokens left may not cover (maxOutputTokens plus the prompt, estimated at 4 bytes a "
            "token); raising it resumes the run."
        ),
    )


class Policy(ApiModel):
    """Rules the run must follow."""

    approval_required_for: list[Risk] | None = Field(
        default=None,
        description="Risks that always need approval, e.g. [write, external].",
        max_length=3,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    allowed_images: list[Annotated[str, Field(max_length=512)]] | None = Field(
        default=None,
        description=(
            "Image prefixes steps may use (e.g. ghcr.io/acme/); any image when unset. A step "
            "with another image fails with reason ImageNotAllowed."
        ),
        max_length=64,
    )
    approver_groups: list[Annotated[str, Field(max_length=253)]] | None = Field(
        default=None,
        description=(
            "Only members of one of these groups may add approvals (enforced at admission by "
            "the agentrun-approvals ValidatingAdmissionPolicy); anyone allowed to update the "
            "run when unset."
        ),
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    require_second_person: bool | None = Field(
        default=None,
        description=(
            "true: the user who created the run may not approve or reject its steps "
            "(enforced at admission)."
        ),
    )
    approval_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=30 * 86400,
        description=(
            "A step waiting for approval longer than this fails with reason ApprovalExpired."
        ),
    )


class Approval(ApiModel):
    """A person's decision on a gated step, bound to the step's exact arguments."""

    step: str = Field(description="The step decided on.", min_length=1, max_length=63)
    decision: ApprovalDecision = Field(description="approve or reject.")
    args_hash: str = Field(
        description=(
            "The step's argsHash as shown in status.steps[].argsHash; a decision on other "
            "arguments does not count."
        ),
        pattern=ARGS_HASH_PATTERN,
    )
    by: str = Field(
        description="Who decided (a Kubernetes user name).", min_length=1, max_length=253
    )
    reason: str | None = Field(default=None, description="Why.", max_length=1024)
    at: Timestamp | None = Field(default=None, description="When the decision was made.")


class CarriedResult(ApiModel):
    """A step result committed by an earlier run, carried into this one (kubectl agentrun
    fork): the step counts as Succeeded and does not run again."""

    step: str = Field(description="The step of this plan the result belongs to.", max_length=63)
    from_run: str | None = Field(
        default=None,
        description=(
            "namespace/name of the run it was committed in; it must be in this run's "
            "namespace, and still hold the result when this run starts."
        ),
        max_length=317,
    )
    args_hash: str | None = Field(
        default=None,
        description=(
            "The step's argsHash when fromRun committed the result (status.steps[].argsHash "
            "there). Required for new entries. The result is carried only when this equals "
            "the step's argsHash in this run, fromRun committed exactly this result for it, "
            "and, for a step that needs approval, spec.approvals of this run approves these "
            "arguments; otherwise the step runs (transition reason CarriedResultRefused)."
        ),
        pattern=ARGS_HASH_PATTERN,
    )
    summary: str | None = Field(default=None, description="Short summary.", max_length=MAX_SUMMARY)
    result: str | None = Field(
        default=None,
        description="The result, when small enough to keep inline.",
        max_length=MAX_INLINE_RESULT,
    )
    result_ref: ResultRef | None = Field(
        default=None, description="Where a larger result is kept (a ConfigMap of this run)."
    )
    result_digest: str | None = Field(
        default=None, description="sha256 of the full result.", max_length=64
    )


class Retention(ApiModel):
    """What is kept after steps and the run finish."""

    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the run this many seconds after it finished; kept forever when unset.",
    )
    keep_jobs: KeepJobs = Field(
        default=KeepJobs.FAILED,
        description=(
            "Which finished step Jobs to keep once their result is recorded: none, failed or all."
        ),
    )


def _typed(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def _open(description: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An object whose known fields are typed: the API server refuses a run that gives one
    a value of another type, at ``kubectl apply``, saying which field. Unknown fields are kept
    (never pruned in silence): the Job's create refuses them, and the step fails, saying so."""
    return _typed(
        "object",
        description,
        properties=properties,
        **{"x-kubernetes-preserve-unknown-fields": True},
        **extra,
    )


_INT64 = {"format": "int64"}
_PROFILE = {
    "type": _typed("string", "RuntimeDefault, Localhost or Unconfined."),
    "localhostProfile": _typed("string", "The profile's path on the node, for Localhost."),
}
_SECURITY_COMMON: dict[str, Any] = {
    "runAsUser": _typed("integer", "UID the container process runs as.", **_INT64),
    "runAsGroup": _typed("integer", "GID the container process runs as.", **_INT64),
    "runAsNonRoot": _typed("boolean", "Refuse to start the container as root."),
    "seccompProfile": _open("Seccomp profile.", _PROFILE, required=["type"]),
    "appArmorProfile": _open("AppArmor profile.", _PROFILE, required=["type"]),
    "seLinuxOptions": _open(
        "SELinux context.",
        {k: _typed("string", f"SELinux {k} label.") for k in ("user", "role", "type", "level")},
    ),
    "windowsOptions": _open(
        "Windows-specific settings.",
        {
            "gmsaCredentialSpecName": _typed("string", "Name of the GMSA credential spec."),
            "gmsaCredentialSpec": _typed("string", "Content of the GMSA credential spec."),
            "runAsUserName": _typed("string", "Windows user name to run as."),
            "hostProcess": _typed("boolean", "Run as a Windows HostProcess container."),
        },
    ),
}
POD_SECURITY_CONTEXT: dict[str, Any] = {
    **_SECURITY_COMMON,
    "fsGroup": _typed("integer", "Group owning the pod's volumes.", **_INT64),
    "fsGroupChangePolicy": _typed("string", "OnRootMismatch or Always."),
    "supplementalGroups": _typed(
        "array", "Extra groups of the first process.", items={"type": "integer", **_INT64}
    ),
    "supplementalGroupsPolicy": _typed("string", "Merge or Strict."),
    "seLinuxChangePolicy": _typed("string", "MountOption or Recursive."),
    "sysctls": _typed(
        "array",
        "Namespaced sysctls of the pod.",
        items={
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "required": ["name", "value"],
            "properties": {
                "name": _typed("string", "Sysctl name."),
                "value": _typed("string", "Sysctl value."),
            },
        },
    ),
}
"""The typed fields of a Pod's securityContext (core/v1 PodSecurityContext)."""
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    **_SECURITY_COMMON,
    "allowPrivilegeEscalation": _typed("boolean", "Whether a process may gain privileges."),
    "privileged": _typed("boolean", "Run the container privileged."),
    "readOnlyRootFilesystem": _typed("boolean", "Mount the root filesystem read-only."),
    "procMount": _typed("string", "Default or Unmasked."),
    "capabilities": _open(
        "Capabilities to add and drop.",
        {
            "add": _typed("array", "Capabilities to add.", items={"type": "string"}),
            "drop": _typed("array", "Capabilities to drop.", items={"type": "string"}),
        },
    ),
}
"""The typed fields of a container's securityContext (core/v1 SecurityContext)."""


class StepTemplate(ApiModel):
    """Defaults for every step's pod."""

    service_account_name: str | None = Field(
        default=None, description="ServiceAccount of step pods.", max_length=253
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Default compute resources of step containers."
    )
    security_context: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Pod securityContext of step pods; the restricted Pod Security Standard when unset."
        ),
        json_schema_extra={
            "properties": POD_SECURITY_CONTEXT,
            "x-kubernetes-preserve-unknown-fields": True,
        },
    )
    container_security_context: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Container securityContext of step containers; the restricted Pod Security "
            "Standard when unset."
        ),
        json_schema_extra={
            "properties": CONTAINER_SECURITY_CONTEXT,
            "x-kubernetes-preserve-unknown-fields": True,
        },
    )


class AgentRunSpec(ApiModel):
    """What the user wants: a goal and a plan, with limits, policy and decisions."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.carriedResults) == has(oldSelf.carriedResults)",
                    "message": "carriedResults can only be set when the run is created",
                },
                {
                    "rule": "!has(self.carriedResults) || (has(self.plan) && "
                    "self.carriedResults.all(c, self.plan.steps.exists(s, s.name == c.step)))",
                    "message": "every carriedResults entry must name a step of this plan",
                },
                {
                    "rule": "(has(self.agent) && has(self.agent.resumeFrom)) == "
                    "(has(oldSelf.agent) && has(oldSelf.agent.resumeFrom))",
                    "message": "spec.agent.resumeFrom can only be set when the run is created",
                },
                {
                    "rule": "has(self.plan) || has(self.agent)",
                    "message": "a run needs spec.plan, spec.agent or both",
                },
                {
                    "rule": "!has(self.agent) || !has(self.plan) || "
                    "self.plan.steps.all(s, !s.name.matches('^t[0-9]+-'))",
                    "message": "in a run with spec.agent, plan step names may not look like "
                    "t<number>-... (the names of model turns and tool calls)",
                },
            ]
        }
    )

    goal: str = Field(
        description="What the run is for, in plain words.", min_length=1, max_length=MAX_GOAL
    )
    actor: str | None = Field(
        default=None, description="Who or what asked for the run (agent or person).", max_length=253
    )
    plan: Plan = Field(
        # Unset (in a run with spec.agent only) reads as a plan of no steps.
        default_factory=lambda: Plan.model_construct(steps=[]),
        exclude_if=lambda plan: not plan.steps,
        description=(
            "The steps to run. Optional when spec.agent is set: the plan then runs first, and "
            "the agent starts once every plan step succeeded (or was skipped), with the plan's "
            "results in its first message."
        ),
    )
    agent: Agent | None = Field(
        default=None,
        description=(
            "A model that decides the next steps at run time: it proposes tool calls, the "
            "operator validates and runs them as steps, and the run succeeds with the model's "
            "answer."
        ),
    )
    budget: Budget | None = Field(default=None, description="Limits of the run.")
    policy: Policy | None = Field(default=None, description="Approval and image rules.")
    suspend: bool | None = Field(
        default=None,
        description="true: start no new step (running steps finish); false or unset: proceed.",
    )
    cancel: bool | None = Field(
        default=None,
        description="true: stop running steps and end the run as Cancelled. Cannot be undone.",
    )
    approvals: list[Approval] | None = Field(
        default=None,
        description="Decisions on gated steps, appended by people (kubectl agentrun approve).",
        max_length=MAX_APPROVALS,
    )
    retention: Retention | None = Field(default=None, description="What is kept afterwards.")
    carried_results: list[CarriedResult] | None = Field(
        default=None,
        description=(
            "Results committed by an earlier run for some steps of this plan (kubectl agentrun "
            "fork); those steps are not run. Fixed at creation."
        ),
        max_length=MAX_STEPS,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["step"],
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "carriedResults cannot change"},
                {
                    # Checked when the entries are written (at creation) only, so runs made
                    # before argsHash existed stay updatable (their entries are refused).
                    "rule": "oldSelf.hasValue() || self.all(c, has(c.argsHash))",
                    "optionalOldSelf": True,
                    "message": "every carriedResults entry needs argsHash (the step's "
                    "argsHash in the run it comes from)",
                },
            ],
        },
    )
    step_template: StepTemplate | None = Field(
        default=None, description="Defaults for every step's pod."
    )


# --------------------------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------------------------


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


class OwnerReference(ApiModel):
    """An owner of the run (a sub-agent's run is controlled by its parent)."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = Field(default="", description="The owner's apiVersion.")
    kind: str = Field(default="", description="The owner's kind.")
    name: str = Field(default="", description="The owner's name.")
    uid: str = Field(default="", description="The owner's uid.")
    controller: bool | None = Field(default=None, description="Whether it is the controller.")


class ObjectMeta(ApiModel):
    """The parts of metadata the operator reads."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="Name of the run.")
    namespace: str = Field(default="default", description="Namespace of the run.")
    uid: str = Field(default="", description="UID assigned by the API server.")
    generation: int = Field(default=0, description="Spec generation.")
    resource_version: str | None = Field(default=None, description="Version read.")
    creation_timestamp: Timestamp | None = Field(default=None, description="Creation time.")
    deletion_timestamp: Timestamp | None = Field(default=None, description="Deletion time.")
    labels: dict[str, str] | None = Field(default=None, description="Labels.")
    annotations: dict[str, str] | None = Field(default=None, description="Annotations.")
    owner_references: list[OwnerReference] | None = Field(
        default=None, description="Owners (a sub-agent's run: its parent, as controller)."
    )

    @field_validator("labels", "annotations", mode="before")
    @classmethod
    def _empty_to_none(cls, value: object) -> object:
        return value or None


class AgentRun(ApiModel):
    """An AI agent workflow: a goal, a plan of steps, and the durable record of their runs."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = Field(default=API_VERSION, description="agentrun.dev/v1alpha1")
    kind: str = Field(default=KIND, description="AgentRun")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: AgentRunSpec = Field(description="What the user wants.")
    status: AgentRunStatus | None = Field(default=None, description="What the operator observed.")

    def step(self, name: str) -> Step | None:
        """The plan's step called ``name``, if any."""
        return next((s for s in self.spec.plan.steps if s.name == name), None)
