"""``spec.stepTemplate``: the defaults of every step's pod, with the typed fields of the
Pod's and the container's securityContext (core/v1 PodSecurityContext and SecurityContext)
that the generated CRD checks.

Part of :mod:`agentrun.api.models`, which re-exports every public name here.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentrun.api.base import ApiModel, ResourceRequirements


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
