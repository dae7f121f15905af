"""HTTP tools: a tool of ``spec.agent.tools`` whose every call is one HTTP request to a host
the tool allows (``spec.agent.tools[].http``, :class:`HttpRequest`).

A call runs as every MCP call does (:mod:`agentrun.api.mcp`): a step of the run, in its
namespace and with its identity, in the operator's image (``agentrun step http``, see
:mod:`agentrun.pod.http_tool`), on the run's executor when it runs; never from the
operator's own pod. The pure part (filling the URL, the allow-list of hosts, the body, what
the model reads) is :mod:`agentrun.core.http_tool`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from agentrun.api.base import ApiModel, SecretKeySelector
from agentrun.api.mcp import HEADER_NAME_PATTERN

MAX_HEADERS = 16
MAX_ALLOWED_HOSTS = 16
DEFAULT_RESPONSE_BYTES = 16 * 1024
MAX_RESPONSE_BYTES = 512 * 1024
"""Most bytes of a response body a call keeps (a result object holds it whole)."""
DEFAULT_TIMEOUT_SECONDS = 30
"""The request's deadline when the tool sets no timeoutSeconds."""
RESERVED_HEADERS = (
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "idempotency-key",
)
"""Header names a tool may not set (lower case): the request's framing and connection are
the program's, and Idempotency-Key carries the call's idempotency key."""
ALLOWED_HOST_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|\[[0-9a-f:.]+\])"
    r"(:[0-9]{1,5})?$"
)
"""A host as a request's URL names it, in lower case: a DNS name (punycode for other
scripts) or an IP address (IPv6 in brackets), optionally with a port."""
ARGUMENT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
"""The name of an argument a placeholder ``{name}`` takes."""


class HttpMethod(StrEnum):
    """The request's method."""

    GET = "GET"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


_RESERVED_LIST = ", ".join(f"'{h}'" for h in RESERVED_HEADERS)


class HttpHeader(ApiModel):
    """A header sent with every request of the tool: a literal value, or one from a Secret."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.value) != has(self.secretKeyRef)",
                    "message": "a header has a value or a secretKeyRef, exactly one",
                },
                {
                    "rule": f"!(self.name.lowerAscii() in [{_RESERVED_LIST}])",
                    "message": (
                        "a tool may not set the headers Host, Content-Length, "
                        "Transfer-Encoding, Connection, Keep-Alive, Upgrade, TE, Trailer, "
                        "Proxy-Connection or Idempotency-Key (the call's idempotency key)"
                    ),
                    "fieldPath": ".name",
                },
            ]
        }
    )

    name: str = Field(
        description="The header's name, e.g. Authorization or Accept.",
        min_length=1,
        max_length=128,
        pattern=HEADER_NAME_PATTERN,
    )
    value: str | None = Field(
        default=None,
        description=(
            "A literal value (printable ASCII): it is part of the spec, so of the call's "
            "argsHash. Put anything secret in a Secret (secretKeyRef) instead."
        ),
        max_length=4096,
        pattern=r"^[ -~]*$",
    )
    secret_key_ref: SecretKeySelector | None = Field(
        default=None,
        description=(
            "The value from a key of a Secret in the run's namespace. It goes to the pod that "
            "makes the request (the run's executor, or the call's own pod) as an environment "
            "variable, and from there only into this header of requests to allowedHosts: never "
            "into status, events, logs or the model's context (a response that echoes it has "
            "it replaced). The run's creator must be allowed to get the Secret; the reference "
            "(not the value) is part of the call's argsHash."
        ),
    )


class HttpBody(ApiModel):
    """What becomes the request's JSON body (sent with Content-Type: application/json)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.argument) != has(self.template)",
                    "message": "a body is an argument or a template, exactly one",
                }
            ]
        }
    )

    argument: str | None = Field(
        default=None,
        description=(
            "The name of the argument whose value (any JSON) is the whole body. A call "
            "without it is answered to the model as invalid."
        ),
        pattern=ARGUMENT_PATTERN,
    )
    template: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A JSON object, sent as written but for its strings with placeholders: a string "
            "that is exactly {name} becomes the argument's value, whatever its JSON type (a "
            "member or item whose argument the call does not give is left out); {name} within "
            "a longer string becomes the argument's text (a call without it is answered as "
            "invalid)."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class HttpRequest(ApiModel):
    """One HTTP request per call, to a host the tool allows; its response is the call's
    result."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.body) || self.method != 'GET'",
                    "message": "a GET request has no body",
                    "fieldPath": ".body",
                }
            ]
        }
    )

    method: HttpMethod = Field(
        default=HttpMethod.GET,
        description=(
            "GET, POST, PUT, PATCH or DELETE. A tool that changes something should say so in "
            "its risk (write or external) or approval; every request carries the call's "
            "idempotency key in the header Idempotency-Key, the same in every attempt of the "
            "call, for the server to answer a repeat without acting twice."
        ),
    )
    url: str = Field(
        description=(
            "The request's URL, a template: each {name} is replaced by the call's argument "
            "name, percent-encoded (every character but letters, digits and -._~), so an "
            "argument can never add a path segment, a query parameter, a port or a host of its "
            "own. A string argument is taken as it is, a number or a boolean as its JSON text; "
            "a call without a placeholder's argument, with an object or array for it, or whose "
            "value is . or .., is answered to the model as invalid. The scheme (http or https) "
            "is literal; a fragment is never sent."
        ),
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
    )
    headers: list[HttpHeader] | None = Field(
        default=None,
        description=(
            "Headers sent with every request, each a literal value or a Secret's key. "
            "Content-Type is application/json when there is a body, unless set here."
        ),
        max_length=MAX_HEADERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    body: HttpBody | None = Field(
        default=None,
        description="The request's JSON body: an argument or a template; none when unset.",
    )
    allowed_hosts: list[
        Annotated[str, Field(min_length=1, max_length=261, pattern=ALLOWED_HOST_PATTERN)]
    ] = Field(
        description=(
            "The hosts a request may go to: the URL's host, once the template is filled, must "
            "be one of these exactly (no wildcards: allowed.example does not allow "
            "allowed.example.evil.com; an IP address only as written, 127.0.0.1 does not "
            "allow 127.1), with its port when the entry names one (host:port). A URL with "
            "userinfo (user@host) is never sent. A call whose URL names another host is "
            "answered to the model as invalid, and the pod checks again before it sends. A "
            "redirect is followed only by a GET, at most 5 times, and only to a URL that "
            "passes the same check and keeps https; any other redirect is the call's result "
            "(an error the model reads), never followed."
        ),
        min_length=1,
        max_length=MAX_ALLOWED_HOSTS,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    max_response_bytes: int = Field(
        default=DEFAULT_RESPONSE_BYTES,
        ge=1,
        le=MAX_RESPONSE_BYTES,
        description=(
            "Most bytes of the response's body kept (the rest is not read; the result says it "
            "was cut). The result the model reads is the status code, the Content-Type and "
            "this body as text; a status that is not 2xx is an error the model reads, not a "
            "failure of the run. A result larger than a termination message holds, even "
            "compressed, needs steps that may store it (stepTemplate.serviceAccountName "
            "allowed to create ConfigMaps), as for other tools."
        ),
    )
