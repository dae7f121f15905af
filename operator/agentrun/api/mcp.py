"""Tools from MCP servers: the API of a server an agent's model may call tools of, and of the
tools the operator pinned when it discovered them.

A server is reached over MCP's streamable HTTP transport, never from the operator's own pod:
discovery (``tools/list``) and every call (``tools/call``) run as steps of the run, in its
namespace and with its identity, in the operator's image (``agentrun step mcp``, see
:mod:`agentrun.pod.mcp`). Only the tools a server's entry lists are ever offered to the model;
each listed tool's definition (name, description, input and output schema) is pinned by digest
when it is discovered (:mod:`agentrun.core.mcp`), and a call to a tool whose definition the
server has changed since is refused before it is sent.

``spec.agent.mcpServers`` holds :class:`McpServer` entries and ``status.agent.mcpTools`` the
:class:`PinnedTool` entries (:mod:`agentrun.api.agent`).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from agentrun.api.base import ApiModel, ApprovalMode, RetryPolicy, Risk, SecretKeySelector

MAX_SERVERS = 8
MAX_SERVER_TOOLS = 32
MAX_HEADERS = 8
SERVER_NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,18}[a-z0-9])?$"
"""A DNS label of at most 20 characters: it names the server's discovery step
(``mcp-{server}``)."""
MCP_TOOL_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]{0,47}$"
"""A tool name as MCP servers name them that is also a function name Chat Completions accepts
(the model calls the tool by this name)."""
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"
"""An HTTP header name (RFC 9110 token)."""
MAX_TOOL_DEFINITION = 16 * 1024
"""Largest definition of one discovered tool (canonical JSON, bytes); a larger one is not
offered."""


class McpHeader(ApiModel):
    """An HTTP header sent with every request to the server, its value from a Secret."""

    name: str = Field(
        description="The header's name, e.g. Authorization.", pattern=HEADER_NAME_PATTERN
    )
    secret_key_ref: SecretKeySelector = Field(
        description=(
            "The header's value: a key of a Secret in the run's namespace, given to the "
            "discovery and call steps' pods as an environment variable (never written to "
            "status, events or logs). The run's creator must be allowed to get the Secret."
        )
    )


class McpTool(ApiModel):
    """A tool of the server the model may call (the allow-list), and how its calls are run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.name in ['auto', 'none', 'required'])",
                    "message": "a tool may not be named auto, none or required: those are the "
                    "modes of toolChoice",
                    "fieldPath": ".name",
                }
            ]
        }
    )

    name: str = Field(
        description=(
            "The tool's name as the server lists it; the model calls it by this name, which "
            "must differ from every other tool of spec.agent."
        ),
        min_length=1,
        max_length=48,
        pattern=MCP_TOOL_NAME_PATTERN,
    )
    risk: Risk = Field(
        default=Risk.EXTERNAL,
        description=(
            "read, write or external, as for plan steps (policy.approvalRequiredFor decides "
            "which risks need approval). A server's tool can do anything its server does: "
            "external unless you know better."
        ),
    )
    approval: ApprovalMode = Field(
        default=ApprovalMode.AUTO,
        description=(
            "required: every call waits for an approval naming the call's step and argsHash "
            "(the hash of the arguments and of the tool's pinned definition)."
        ),
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 86400,
        description="Deadline of one attempt of a call (the step Job's activeDeadlineSeconds).",
    )
    retry: RetryPolicy | None = Field(
        default=None,
        description=(
            "Retries of a call that could not be completed (server unreachable, protocol "
            "error); none when unset. Every attempt sends the same idempotency key. A call the "
            "server answered with isError is not retried: the model reads it."
        ),
    )


class McpServer(ApiModel):
    """An MCP server reached over streamable HTTP from the run's own step pods."""

    name: str = Field(
        description="A name for the server, unique in spec.agent.mcpServers (a DNS label).",
        min_length=1,
        max_length=20,
        pattern=SERVER_NAME_PATTERN,
    )
    url: str = Field(
        description=(
            "The server's MCP endpoint (streamable HTTP), e.g. http://tools.team.svc:8000/mcp. "
            "Connected to only from the run's step pods, in the run's namespace."
        ),
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
    )
    headers: list[McpHeader] | None = Field(
        default=None,
        description="HTTP headers sent with every request, each from a Secret key.",
        max_length=MAX_HEADERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    tools: list[McpTool] = Field(
        description=(
            "The server's tools the model may call. Any other tool the server lists is never "
            "offered, and a call naming one is answered to the model as invalid. Each tool "
            "listed here must be among those the server lists at discovery."
        ),
        min_length=1,
        max_length=MAX_SERVER_TOOLS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="Deadline of the discovery step (the Job's activeDeadlineSeconds).",
    )


class PinnedTool(ApiModel):
    """A tool of an MCP server as discovered: what every later call is checked against."""

    server: str = Field(description="The server (spec.agent.mcpServers[].name).", max_length=20)
    name: str = Field(description="The tool's name.", max_length=48)
    digest: str = Field(
        description=(
            "sha256 of the tool's definition as the server listed it at discovery (canonical "
            "JSON of name, description, inputSchema and outputSchema). Every call lists the "
            "server's tools again first and is refused, unsent, when the definition's digest "
            "differs."
        ),
        max_length=64,
    )
