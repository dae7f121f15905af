"""Agents as objects: the ``Agent`` and ``ModelConfig`` kinds, ``AgentRun.spec.agentRef``
that names an Agent, and ``status.agent.definition``, the Agent as a run took it.

A platform team (the namespace's admins) defines an agent once: a ``ModelConfig`` (the model
endpoint, its API key Secret, settings and an ordered list of fallbacks) and an ``Agent``
(instructions, tools, MCP servers, tool choice, limits, and a ``modelConfigRef``). Teams start
runs of it with a goal: ``spec.agentRef: {name: triage}``. On the run's first pass the operator
reads both objects once, with the run creator's rights checked (``get`` on each object and on
every Secret they name), builds the ``spec.agent`` they amount to and commits it to
``status.agent.definition`` (which only the operator writes: the status subresource), with the
uid and generation of each object and the digest of what it took. Every later pass, and every
turn, uses that copy: a change of the Agent or ModelConfig never changes a run that started.

Both kinds are namespaced, with no cluster-scoped variant: a run's pods can read Secrets of
their own namespace only, so a ModelConfig's key must live where the runs do, and who may
define an agent is then decided by the namespace's RBAC (``agentrun-define``, aggregated into
``admin`` only: holders of ``edit`` use Agents, they cannot change them). A platform team that
serves many namespaces renders the same objects into each (the chart's values, or a GitOps
tool); docs/agents.md shows the pattern.

Neither kind has a status: the operator does not reconcile them; it reads one when a run names
it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from agentrun.api import agent as a
from agentrun.api import names
from agentrun.api.base import ApiModel
from agentrun.api.mcp import MAX_SERVERS, McpServer

AGENT_KIND = "Agent"
AGENT_PLURAL = "agents"
AGENT_SINGULAR = "agent"
MODEL_CONFIG_KIND = "ModelConfig"
MODEL_CONFIG_PLURAL = "modelconfigs"
MODEL_CONFIG_SINGULAR = "modelconfig"
MAX_DEFINITION_BYTES = 128 * 1024
"""Largest resolved definition (canonical JSON) a run takes into its status; a larger one fails
the run (reason AgentRefRefused): status is read on every pass and stays well below etcd's
object limit."""
REF_NAME_PATTERN = a.RUN_NAME_PATTERN


class Override(StrEnum):
    """A field of the Agent that a run may set for itself (``spec.agentRef.overrides``), when
    the Agent lists it in ``allowOverrides``."""

    MAX_TURNS = "maxTurns"
    MAX_TOOL_CALLS_PER_TURN = "maxToolCallsPerTurn"
    CONTEXT_BYTES = "contextBytes"


class ObjectName(ApiModel):
    """An object of this namespace, by name."""

    name: str = Field(
        description="Its name (in the same namespace).",
        min_length=1,
        max_length=253,
        pattern=REF_NAME_PATTERN,
    )


class AgentSpec(ApiModel):
    """An agent as a platform team defines it once: what the model is told, the tools it may
    call, its limits, and the model (a ModelConfig by name)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *a.TOOL_CHOICE_RULES,
                {
                    "rule": "has(self.modelConfigRef) != has(self.model)",
                    "message": "an Agent has modelConfigRef (a ModelConfig) or model, exactly one",
                },
            ]
        }
    )

    model_config_ref: ObjectName | None = Field(
        default=None,
        description=(
            "The ModelConfig of this namespace whose endpoint, key, settings and fallbacks the "
            "agent's model turns use (or set model instead). Read once per run, when the run "
            "starts."
        ),
    )
    model: a.ModelEndpoint | None = Field(
        default=None,
        description="The model, written out here instead of in a ModelConfig.",
    )
    instructions: str | None = Field(
        default=None,
        description="The system prompt. A run's goal is the first user message.",
        max_length=32768,
    )
    tools: list[a.AgentTool] | None = Field(
        default=None,
        description=(
            "The tools the model may call, as in AgentRun spec.agent.tools; none: the model "
            "only answers."
        ),
        max_length=a.MAX_TOOLS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    mcp_servers: list[McpServer] | None = Field(
        default=None,
        description="MCP servers whose listed tools the model may call, as in spec.agent.",
        max_length=MAX_SERVERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    tool_choice: str | None = Field(
        default=None,
        description="auto, none, required or a tool's name, as in spec.agent.toolChoice.",
        min_length=1,
        max_length=48,
        pattern=a.TOOL_NAME_PATTERN,
    )
    max_turns: int = Field(
        default=20, ge=1, le=a.MAX_TURNS, description="Most model turns of a run."
    )
    max_tool_calls_per_turn: int = Field(
        default=4,
        ge=1,
        le=a.MAX_CALLS_PER_TURN,
        description="Most tool calls run per turn.",
    )
    context_bytes: int = Field(
        default=a.DEFAULT_CONTEXT_BYTES,
        ge=a.MIN_CONTEXT_BYTES,
        le=a.MAX_CONTEXT_BYTES,
        description="Most bytes of messages sent to the model in one turn.",
    )
    allow_overrides: list[Override] | None = Field(
        default=None,
        description=(
            "What a run of this agent may set for itself in spec.agentRef.overrides: "
            "maxTurns, maxToolCallsPerTurn, contextBytes. None when unset; a run that "
            "overrides anything else fails (reason AgentRefRefused)."
        ),
        max_length=len(Override),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class DefinitionMeta(ApiModel):
    """The parts of an Agent's or ModelConfig's metadata the operator reads."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="Name.")
    namespace: str = Field(default="default", description="Namespace.")
    uid: str = Field(default="", description="UID assigned by the API server.")
    generation: int = Field(default=0, description="Spec generation.")
    resource_version: str | None = Field(default=None, description="Version read.")


class AgentObject(ApiModel):
    """An agent a platform team defines once; runs name it in spec.agentRef and take it, as it
    is then, when they start."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = Field(default=f"{names.GROUP}/{names.VERSION}", description="")
    kind: str = Field(default=AGENT_KIND, description="Agent")
    metadata: DefinitionMeta = Field(description="Standard object metadata.")
    spec: AgentSpec = Field(description="The agent.")


class ModelConfigObject(ApiModel):
    """A model endpoint, its API key Secret, settings and fallbacks, defined once for the
    Agents of a namespace (their modelConfigRef)."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = Field(default=f"{names.GROUP}/{names.VERSION}", description="")
    kind: str = Field(default=MODEL_CONFIG_KIND, description="ModelConfig")
    metadata: DefinitionMeta = Field(description="Standard object metadata.")
    spec: a.ModelEndpoint = Field(description="The model.")


# -- the run's side ---------------------------------------------------------------------------


class AgentOverrides(ApiModel):
    """What a run sets for itself of the Agent it names, where the Agent allows it."""

    max_turns: int | None = Field(
        default=None, ge=1, le=a.MAX_TURNS, description="The run's maxTurns."
    )
    max_tool_calls_per_turn: int | None = Field(
        default=None, ge=1, le=a.MAX_CALLS_PER_TURN, description="The run's maxToolCallsPerTurn."
    )
    context_bytes: int | None = Field(
        default=None,
        ge=a.MIN_CONTEXT_BYTES,
        le=a.MAX_CONTEXT_BYTES,
        description="The run's contextBytes.",
    )


class AgentRef(ApiModel):
    """An Agent of the run's namespace, run with this run's goal."""

    name: str = Field(
        description=(
            "The Agent's name. The operator reads it (and its ModelConfig) once, on the run's "
            "first pass, checking that the run's creator may get both and every Secret they "
            "name; the run then uses that copy (status.agent.definition) to its end."
        ),
        min_length=1,
        max_length=253,
        pattern=REF_NAME_PATTERN,
    )
    overrides: AgentOverrides | None = Field(
        default=None,
        description="Settings of the Agent this run changes, among those it allows.",
    )
    resume_from: a.ResumeFrom | None = Field(
        default=None,
        description=(
            "Continue another agent run's conversation (kubectl agentrun ask and fork), as "
            "spec.agent.resumeFrom does."
        ),
    )


class DefinitionSource(ApiModel):
    """One object a run's definition was taken from."""

    name: str = Field(description="Its name.", max_length=253)
    uid: str = Field(description="Its metadata.uid.", max_length=64)
    generation: int = Field(ge=0, description="Its metadata.generation, as read.")
    resource_version: str | None = Field(
        default=None, description="Its metadata.resourceVersion, as read.", max_length=64
    )


class AgentDefinition(ApiModel):
    """The Agent a run names (spec.agentRef), as the operator took it on the run's first pass:
    what every turn of the run uses, whatever becomes of the Agent."""

    agent: DefinitionSource = Field(description="The Agent.")
    model_config_source: DefinitionSource | None = Field(
        default=None,
        alias="modelConfig",
        description="Its ModelConfig; unset when the Agent writes its model out.",
    )
    ref_digest: str = Field(
        description=(
            "sha256 of spec.agentRef as it was: a run whose spec.agentRef changes fails "
            "(reason AgentSpecChanged)."
        ),
        max_length=64,
    )
    digest: str = Field(description="sha256 of spec (canonical JSON).", max_length=64)
    spec: Annotated[
        a.Agent,
        # Written by the operator alone, and read back through a.Agent: the API server need
        # not validate it again on every status write.
        WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
    ] = Field(
        description=(
            "The spec.agent the Agent and its ModelConfig amount to, with the run's overrides "
            "and resumeFrom (the shape of spec.agent): the run reads its agent from here."
        )
    )


def wire(model: ApiModel) -> dict[str, Any]:
    """``model`` as canonical data: fields at their defaults left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True)
