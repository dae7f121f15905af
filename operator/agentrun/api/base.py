"""What every part of the AgentRun API builds on: the base model, and the parts a plan's step
and an agent's tool share (the container to run, its risk and approval, its retries, where a
large result is kept).

:mod:`agentrun.api.models` (the run) and :mod:`agentrun.api.agent` (the agent loop) both import
this module, which imports neither, so the two never import each other both ways; the names are
re-exported by :mod:`agentrun.api.models`, where the rest of the code reads them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel

# Bounds of a container (see models.py for the others): they keep objects far below etcd's
# 1.5 MiB object limit.
MAX_ENV = 64
MAX_ARGS = 64
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": (
                r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
            ),
        }
    ),
]
"""A Kubernetes resource quantity such as ``500m``, ``1`` or ``256Mi``."""


def _format_time(value: datetime) -> str:
    """RFC 3339 in UTC with second precision, the way Kubernetes writes metav1.Time."""
    if value.tzinfo is not None and value.utcoffset():
        value = value.astimezone(UTC)  # naive times are taken as UTC
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
        f"T{value.hour:02d}:{value.minute:02d}:{value.second:02d}Z"
    )


Timestamp = Annotated[
    datetime,
    PlainSerializer(_format_time, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A point in time, serialized as RFC 3339 UTC with second precision."""


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        validate_default=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict as it is stored in Kubernetes (camelCase, no unset optionals)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Risk(StrEnum):
    """How much a step can change the world."""

    READ = "read"
    WRITE = "write"
    EXTERNAL = "external"


class ApprovalMode(StrEnum):
    """Whether a step waits for a person before it runs."""

    AUTO = "auto"
    REQUIRED = "required"


class ConfigMapKeySelector(ApiModel):
    """A key of a ConfigMap in the run's namespace."""

    name: str = Field(description="Name of the ConfigMap.", min_length=1, max_length=253)
    key: str = Field(description="Key within the ConfigMap.", min_length=1, max_length=253)


class SecretKeySelector(ApiModel):
    """A key of a Secret in the run's namespace. The value never appears in status or events."""

    name: str = Field(description="Name of the Secret.", min_length=1, max_length=253)
    key: str = Field(description="Key within the Secret.", min_length=1, max_length=253)


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from, instead of a literal value."""

    config_map_key_ref: ConfigMapKeySelector | None = Field(
        default=None, description="Take the value from a key of a ConfigMap."
    )
    secret_key_ref: SecretKeySelector | None = Field(
        default=None,
        description=(
            "Take the value from a key of a Secret. Only the reference is recorded or hashed, "
            "never the value."
        ),
    )


class EnvVar(ApiModel):
    """An environment variable for the step's container."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.value) != has(self.valueFrom)",
                    "message": "an env var sets exactly one of value and valueFrom",
                },
                {
                    "rule": "!has(self.valueFrom) || "
                    "(has(self.valueFrom.configMapKeyRef) != has(self.valueFrom.secretKeyRef))",
                    "message": "valueFrom sets exactly one of configMapKeyRef and secretKeyRef",
                },
            ]
        }
    )

    name: str = Field(
        description="Variable name (letters, digits and underscores; not starting with a digit).",
        min_length=1,
        max_length=128,
        pattern=ENV_NAME_PATTERN,
    )
    value: str | None = Field(default=None, description="Literal value.", max_length=4096)
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a ConfigMap or Secret key."
    )


class ResourceRequirements(ApiModel):
    """Compute resources of a step's container, as in a Pod's container."""

    requests: dict[str, Quantity] | None = Field(
        default=None,
        description="Minimum resources, e.g. {cpu: 100m, memory: 128Mi}.",
        max_length=8,
    )
    limits: dict[str, Quantity] | None = Field(
        default=None,
        description="Maximum resources, e.g. {cpu: '1', memory: 512Mi}.",
        max_length=8,
    )


class ContainerAction(ApiModel):
    """Run a container image as the step. The container's exit code decides the attempt."""

    image: str = Field(
        description="Container image, e.g. ghcr.io/acme/tools:1.4.",
        min_length=1,
        max_length=512,
    )
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None,
        description="Entrypoint array; the image's entrypoint when empty.",
        max_length=MAX_ARGS,
    )
    args: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None,
        description="Arguments to the entrypoint.",
        max_length=MAX_ARGS,
    )
    env: list[EnvVar] | None = Field(
        default=None,
        description=(
            "Environment variables. The operator adds AGENTRUN_RUN, AGENTRUN_STEP, "
            "AGENTRUN_ATTEMPT and AGENTRUN_IDEMPOTENCY_KEY."
        ),
        max_length=MAX_ENV,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    working_dir: str | None = Field(
        default=None, description="Working directory of the container.", max_length=1024
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Compute resources; stepTemplate.resources when unset."
    )


class Backoff(ApiModel):
    """Exponential backoff between attempts: initialSeconds * factor^(attempt-1), capped."""

    initial_seconds: int = Field(
        default=10, ge=0, le=86400, description="Delay before the second attempt, in seconds."
    )
    factor: float = Field(
        default=2.0, ge=1.0, le=10.0, description="Multiplier applied to the delay per attempt."
    )
    max_seconds: int = Field(
        default=300, ge=0, le=86400, description="Upper bound of any single delay, in seconds."
    )


class RetryPolicy(ApiModel):
    """How often a failed step is tried again. Each attempt is its own Job."""

    limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Retries after the first attempt (0 means the step runs at most once).",
    )
    backoff: Backoff | None = Field(
        default=None, description="Delay between attempts; 10s doubling up to 300s when unset."
    )


class ResultRef(ApiModel):
    """Where a result too large for status is kept."""

    kind: str = Field(default="ConfigMap", description="Kind of the object holding the result.")
    name: str = Field(description="Name of the object, in the run's namespace.", max_length=253)
    key: str = Field(description="Key within the object.", max_length=253)
