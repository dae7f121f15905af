"""The AgentRun API (agentrun.dev/v1alpha1): pydantic models of spec and status.

These models are the single source of truth for the API. The CustomResourceDefinition in
``crds/`` (its OpenAPI schema, the descriptions shown by ``kubectl explain`` and the CEL
validation rules) is generated from them by ``agentrun crd`` (see :mod:`agentrun.api.crd`).

Every field carries a description; keep them written for the person typing ``kubectl explain``.

The spec and the run are here; the enums (:mod:`agentrun.api.phases`), the limits
(:mod:`agentrun.api.limits`), the step pods' defaults (:mod:`agentrun.api.step_template`) and
the status (:mod:`agentrun.api.run_status`) live beside them and are re-exported, so that the
rest of the code reads every name of the API from this module.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, field_validator

from agentrun.api.agent import Agent
from agentrun.api.agent_defs import AgentRef

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
from agentrun.api.limits import ANNOTATION_CREATED_BY as ANNOTATION_CREATED_BY
from agentrun.api.limits import ANNOTATION_CREATED_BY_GROUPS as ANNOTATION_CREATED_BY_GROUPS
from agentrun.api.limits import ANNOTATION_MODIFIED_BY as ANNOTATION_MODIFIED_BY
from agentrun.api.limits import ARGS_HASH_PATTERN as ARGS_HASH_PATTERN
from agentrun.api.limits import DNS_LABEL_PATTERN as DNS_LABEL_PATTERN
from agentrun.api.limits import MAX_APPROVALS as MAX_APPROVALS
from agentrun.api.limits import MAX_DEPENDENCIES as MAX_DEPENDENCIES
from agentrun.api.limits import MAX_GOAL as MAX_GOAL
from agentrun.api.limits import MAX_HISTORY as MAX_HISTORY
from agentrun.api.limits import MAX_HISTORY_HARD as MAX_HISTORY_HARD
from agentrun.api.limits import MAX_INLINE_RESULT as MAX_INLINE_RESULT
from agentrun.api.limits import MAX_INPUTS as MAX_INPUTS
from agentrun.api.limits import MAX_MESSAGE as MAX_MESSAGE
from agentrun.api.limits import MAX_REASON as MAX_REASON
from agentrun.api.limits import MAX_STEPS as MAX_STEPS
from agentrun.api.limits import MAX_SUMMARY as MAX_SUMMARY
from agentrun.api.limits import MAX_TOKENS as MAX_TOKENS
from agentrun.api.names import API_VERSION as API_VERSION
from agentrun.api.names import CATEGORIES as CATEGORIES
from agentrun.api.names import GROUP as GROUP
from agentrun.api.names import KIND as KIND
from agentrun.api.names import MAX_FIELD_KEY as MAX_FIELD_KEY
from agentrun.api.names import PLURAL as PLURAL
from agentrun.api.names import SHORT_NAMES as SHORT_NAMES
from agentrun.api.names import SINGULAR as SINGULAR
from agentrun.api.names import VERSION as VERSION
from agentrun.api.phases import ACTIVE_STEP_PHASES as ACTIVE_STEP_PHASES
from agentrun.api.phases import TERMINAL_RUN_PHASES as TERMINAL_RUN_PHASES
from agentrun.api.phases import TERMINAL_STEP_PHASES as TERMINAL_STEP_PHASES
from agentrun.api.phases import ApprovalDecision as ApprovalDecision
from agentrun.api.phases import KeepJobs as KeepJobs
from agentrun.api.phases import OnRejection as OnRejection
from agentrun.api.phases import RunPhase as RunPhase
from agentrun.api.phases import StepPhase as StepPhase
from agentrun.api.run_status import AgentRunStatus as AgentRunStatus
from agentrun.api.run_status import AuditStatus as AuditStatus
from agentrun.api.run_status import Condition as Condition
from agentrun.api.run_status import ConditionStatus as ConditionStatus
from agentrun.api.run_status import StepError as StepError
from agentrun.api.run_status import StepStatus as StepStatus
from agentrun.api.run_status import StepUsage as StepUsage
from agentrun.api.run_status import Transition as Transition
from agentrun.api.run_status import Usage as Usage
from agentrun.api.step_template import CONTAINER_SECURITY_CONTEXT as CONTAINER_SECURITY_CONTEXT
from agentrun.api.step_template import POD_SECURITY_CONTEXT as POD_SECURITY_CONTEXT
from agentrun.api.step_template import StepTemplate as StepTemplate

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
                    "rule": "has(self.plan) || has(self.agent) || has(self.agentRef)",
                    "message": "a run needs spec.plan, spec.agent (or spec.agentRef) or both",
                },
                {
                    "rule": "!(has(self.agent) && has(self.agentRef))",
                    "message": "a run has spec.agent or spec.agentRef (an Agent by name), not both",
                },
                {
                    "rule": "has(self.agentRef) == has(oldSelf.agentRef)",
                    "message": "spec.agentRef can only be set when the run is created",
                },
                {
                    "rule": "(!has(self.agent) && !has(self.agentRef)) || !has(self.plan) || "
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
    agent_ref: AgentRef | None = Field(
        default=None,
        description=(
            "Run an Agent of this namespace (instead of spec.agent): its instructions, tools, "
            "limits and ModelConfig, as they are when the run starts, with this run's goal. "
            "The operator takes them on its first pass, with the creator's rights to read "
            "them and every Secret they name checked, into status.agent.definition (with each "
            "object's uid and generation); a later change of the Agent or its ModelConfig "
            "changes nothing in this run. Fixed at creation."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "agentRef cannot change"}
            ]
        },
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
