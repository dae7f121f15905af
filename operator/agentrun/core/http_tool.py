"""HTTP tools, the pure part: the request a call makes (its URL filled from the arguments,
its body, its headers), whether its host is one the tool allows, which redirects are
followed, and what the model reads of the response.

The operator checks a call with :func:`call_problem` before it becomes a step (a call whose
URL or body cannot be made, or whose host is not allowed, is answered to the model as invalid
and never runs); the step's program (:mod:`agentrun.pod.http_tool`, on the run's executor or
in a pod of its own) builds the request with :func:`request_of` and checks every URL it
would send to again, with the same code.

Why the URL is parsed here, strictly, rather than by a general URL library: the host the
allow-list is checked against must be the host the request goes to. A URL is sent only when
its authority is exactly ``host`` or ``host:port`` with host a DNS name or an IP literal in
ASCII (no userinfo, no percent-encoding, no backslash, no other character), and the program
connects to that host and port itself, so no second parser can read another host out of it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

from agentrun.api import agent as a
from agentrun.api import http_tool as api
from agentrun.api import models as m
from agentrun.api.base import SecretKeySelector
from agentrun.core import naming
from agentrun.core.envelope import clean, summary_line
from agentrun.core.pod_env import ENV_HTTP_HEADER, ENV_HTTP_TOOL

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The header that carries the call's idempotency key (the same in every attempt)."""
USER_AGENT = "agentrun-http-tool"
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_WHOLE = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]{0,63})\}$")
_AUTHORITY = re.compile(
    r"^(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9.])?|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHOWN = 120
"""Characters of a URL or a value a message shows."""
_REDACT_MIN = 4
"""Shortest Secret value replaced in what the model reads (a shorter one would blank out
ordinary text, and guessing it is easy anyway)."""


def header_secrets(agent: a.Agent | None) -> list[SecretKeySelector]:
    """The Secret keys the headers of ``agent``'s HTTP tools take their values from."""
    return [
        header.secret_key_ref
        for tool in (agent.tools if agent is not None else None) or []
        if tool.http is not None
        for header in tool.http.headers or []
        if header.secret_key_ref is not None
    ]


def step_env(tool: a.AgentTool) -> list[m.EnvVar]:
    """What a call's step holds of its HTTP tool: the tool's entry (header values from
    Secrets by reference only, as the spec has them), and each such header's value from its
    Secret, by the header's index (the environment of ``agentrun step http``)."""
    assert tool.http is not None
    entry = tool.model_dump_json(by_alias=True, exclude_none=True)
    env = [m.EnvVar.model_construct(name=ENV_HTTP_TOOL, value=entry, value_from=None)]
    for i, header in enumerate(tool.http.headers or []):
        ref = header.secret_key_ref
        if ref is not None:
            source = m.EnvVarSource(secret_key_ref=m.SecretKeySelector(name=ref.name, key=ref.key))
            env.append(m.EnvVar(name=f"{ENV_HTTP_HEADER}{i}", value_from=source))
    return env


class Refused(ValueError):
    """A request that may not be made; the message says why, for the model or the step."""


def _show(text: str) -> str:
    text = clean(text)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


@dataclass(frozen=True)
class Target:
    """Where a request goes: what the program connects to and what it asks for."""

    scheme: str
    host: str
    """Lower case, without a trailing dot; an IPv6 address without its brackets."""
    port: int
    path: str
    """The path and query as sent (at least ``/``); never a fragment."""

    @property
    def authority(self) -> str:
        """``host:port``, the port always named (what the allow-list is checked against)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = _DEFAULT_PORTS[self.scheme] == self.port
        return f"{self.scheme}://{host}{'' if default else f':{self.port}'}{self.path}"


def _host_key(host: str) -> str:
    """A host as it is compared: lower case, no trailing dot, an IP address in its one
    written form (so that ``[::1]`` and ``[0::1]`` are one host, but ``127.1`` is not
    ``127.0.0.1``: only a canonical dotted quad is an IPv4 address here)."""
    host = host.lower()
    if host.startswith("["):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise Refused(f"{_show(host)} is not an IPv6 address") from None
    return host[:-1] if host.endswith(".") else host


def parse_url(url: str) -> Target:
    """The target of ``url``, or :class:`Refused` when it is not one this tool sends to (see
    the module's doc)."""
    if any(not 0x21 <= ord(c) <= 0x7E for c in url):
        raise Refused(f"the URL {_show(url)!r} has a character that is not printable ASCII")
    try:
        parts = urlsplit(url)
    except ValueError as error:  # a bracket not closed
        raise Refused(f"the URL {_show(url)} cannot be read: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise Refused(f"the URL {_show(url)} is not http or https")
    if "@" in parts.netloc:
        raise Refused(f"the URL {_show(url)} has userinfo (user@host): it is never sent")
    found = _AUTHORITY.match(parts.netloc)
    if found is None:
        raise Refused(
            f"the URL's host {_show(parts.netloc)!r} is not a host name or an IP address "
            "(letters, digits, dots and dashes, or [IPv6])"
        )
    port = int(found["port"]) if found["port"] else _DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise Refused(f"the URL's port {port} is not a port")
    path = parts.path or "/"
    if not path.startswith("/"):
        raise Refused(f"the URL {_show(url)} has no absolute path")
    if parts.query:
        path += f"?{parts.query}"
    return Target(scheme, _host_key(found["host"]), port, path)


def _allowed_entry(entry: str) -> tuple[str, int | None]:
    found = _AUTHORITY.match(entry)
    if found is None:
        raise Refused(f"allowedHosts has {_show(entry)!r}, which is not a host")
    return _host_key(found["host"]), int(found["port"]) if found["port"] else None


def allows(allowed: Sequence[str], target: Target) -> bool:
    """Whether ``target``'s host (and port, when the entry names one) is an entry of
    ``allowed`` exactly."""
    for entry in allowed:
        try:
            host, port = _allowed_entry(entry)
        except Refused:
            continue
        if host == target.host and (port is None or port == target.port):
            return True
    return False


def check_url(url: str, allowed: Sequence[str]) -> Target:
    """The target of ``url`` when its host is allowed; else :class:`Refused`."""
    target = parse_url(url)
    if not allows(allowed, target):
        raise Refused(
            f"the URL's host {target.authority} is not among the tool's allowedHosts "
            f"({', '.join(allowed)}): the request was not sent"
        )
    return target


def _text(name: str, arguments: Mapping[str, Any]) -> str | None:
    """An argument as a placeholder takes it (None when absent or null)."""
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    raise Refused(
        f"the argument {name} is {'an object' if isinstance(value, dict) else 'an array'}: "
        "a placeholder takes a string, a number or a boolean"
    )


def fill_url(template: str, arguments: Mapping[str, Any]) -> str:
    """``template`` with each ``{name}`` replaced by its argument, percent-encoded."""

    def one(found: re.Match[str]) -> str:
        name = found.group(1)
        text = _text(name, arguments)
        if text is None:
            raise Refused(f"the URL needs the argument {name}")
        if text in (".", ".."):
            raise Refused(f"the argument {name} may not be {text!r} (a path's dot segment)")
        return quote(text, safe="")

    return PLACEHOLDER.sub(one, template)


_ABSENT = object()


def _fill(node: Any, arguments: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        whole = _WHOLE.match(node)
        if whole is not None:
            return arguments.get(whole.group(1), _ABSENT)

        def one(found: re.Match[str]) -> str:
            text = _text(found.group(1), arguments)
            if text is None:
                raise Refused(f"the body needs the argument {found.group(1)}")
            return text

        return PLACEHOLDER.sub(one, node)
    if isinstance(node, dict):
        filled = {k: _fill(v, arguments) for k, v in node.items()}
        return {k: v for k, v in filled.items() if v is not _ABSENT}
    if isinstance(node, list):
        items = [_fill(v, arguments) for v in node]
        return [v for v in items if v is not _ABSENT]
    return node


def fill_body(body: api.HttpBody, arguments: Mapping[str, Any]) -> bytes:
    """The request's body as sent: the argument, or the template filled, as JSON."""
    if body.argument is not None:
        if body.argument not in arguments:
            raise Refused(f"the body is the argument {body.argument}, which the call does not give")
        value = arguments[body.argument]
    else:
        value = _fill(body.template or {}, arguments)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Request:
    """One request of a call, before its Secret headers' values are added."""

    method: str
    target: Target
    headers: tuple[tuple[str, str], ...]
    """The literal headers, Content-Type (with a body) and the idempotency key."""
    secret_headers: tuple[str, ...]
    """The names of the headers whose values come from Secrets, in the tool's order."""
    body: bytes | None


def idempotency_value(key: str) -> str:
    """The call's idempotency key as its header carries it: as it is when it is visible
    ASCII (the operator's keys are, unless the model wrote a call id with other
    characters), else ``sha256-`` and its sha256, which is as stable."""
    if key and all(0x21 <= ord(c) <= 0x7E for c in key):
        return key
    return f"sha256-{naming.sha256_text(key)}"


def request_of(http: api.HttpRequest, arguments: Mapping[str, Any], key: str) -> Request:
    """The request of a call with ``arguments`` and the idempotency key ``key``; or
    :class:`Refused` (its URL or body cannot be made, or its host is not allowed)."""
    target = check_url(fill_url(http.url, arguments), http.allowed_hosts)
    body = fill_body(http.body, arguments) if http.body is not None else None
    headers: list[tuple[str, str]] = []
    secret: list[str] = []
    for header in http.headers or []:
        if header.name.lower() in api.RESERVED_HEADERS:
            raise Refused(f"the tool may not set the header {header.name}")
        if header.secret_key_ref is not None:
            secret.append(header.name)
        else:
            headers.append((header.name, header.value or ""))
    named = {n.lower() for n, _ in headers} | {n.lower() for n in secret}
    if "user-agent" not in named:
        headers.insert(0, ("User-Agent", USER_AGENT))
    if body is not None and "content-type" not in named:
        headers.append(("Content-Type", "application/json"))
    headers.append((IDEMPOTENCY_HEADER, idempotency_value(key)))
    return Request(http.method.value, target, tuple(headers), tuple(secret), body)


def call_problem(http: api.HttpRequest, arguments: Mapping[str, Any]) -> str | None:
    """Why a call with ``arguments`` (valid against the tool's parameters) may not run: its
    URL or body cannot be made from them, or its host is not allowed. None when it may."""
    try:
        request_of(http, arguments, "")
    except Refused as refused:
        return str(refused)
    except (ValueError, RecursionError) as error:  # a body JSON cannot hold
        return f"the body cannot be made: {str(error)[:200]}"
    return None


def _properties(tool: a.AgentTool) -> set[str] | None:
    found = tool.parameters.get("properties")
    return set(found) if isinstance(found, Mapping) else None


def _netloc(url: str) -> str:
    try:
        return urlsplit(url).netloc
    except ValueError:
        return ""


def _template_names(node: Any) -> list[str]:
    """The arguments a body template's strings name (its keys are taken as written)."""
    if isinstance(node, str):
        return PLACEHOLDER.findall(node)
    if isinstance(node, dict):
        return [n for v in node.values() for n in _template_names(v)]
    if isinstance(node, list):
        return [n for v in node for n in _template_names(v)]
    return []


def declaration_problems(tool: a.AgentTool) -> list[str]:
    """What is wrong with an HTTP tool's declaration that its schema cannot tell: a
    placeholder or a body argument its parameters do not declare, a URL whose literal host
    is not among its allowedHosts. Checked when the run starts (the run fails InvalidAgent)."""
    http = tool.http
    if http is None:
        return []
    where = f"the HTTP tool {tool.name}"
    problems: list[str] = []
    properties = _properties(tool) or set()
    named = PLACEHOLDER.findall(http.url)
    if http.body is not None:
        if http.body.argument is not None:
            named.append(http.body.argument)
        else:
            named += _template_names(http.body.template or {})
    missing = sorted({n for n in named if n not in properties})
    if missing:
        problems.append(
            f"{where} takes the arguments {', '.join(missing)}, which its parameters do not "
            "declare (properties)"
        )
    if PLACEHOLDER.search(_netloc(http.url)) is None:  # else known per call only
        try:
            check_url(PLACEHOLDER.sub("x", http.url), http.allowed_hosts)
        except Refused as refused:
            problems.append(f"{where}: {refused} (its url {_show(http.url)})")
    for entry in http.allowed_hosts:
        try:
            _allowed_entry(entry)
        except Refused as refused:
            problems.append(f"{where}: {refused}")
    return problems


def redirect(current: Target, location: str | None, allowed: Sequence[str]) -> Target | str:
    """Where a redirect from ``current`` to ``location`` goes when it may be followed (the
    same check as the first URL, and never from https to http); else why not."""
    if not location:
        return "it names no Location"
    try:
        target = check_url(urljoin(current.url, location), allowed)
    except Refused as refused:
        return str(refused)
    if current.scheme == "https" and target.scheme != "https":
        return f"it goes from https to {_show(target.url)}"
    return target


def redact(text: str, secrets: Mapping[str, str]) -> str:
    """``text`` with every Secret header's value (``secrets``: name to value) replaced."""
    for name, value in secrets.items():
        if len(value) >= _REDACT_MIN:
            text = text.replace(value, f"[the value of header {name}]")
    return text


def response_record(
    status: int,
    reason: str,
    content_type: str | None,
    body: bytes,
    truncated: bool,
    secrets: Mapping[str, str],
    url: str,
    not_followed: str | None = None,
) -> dict[str, Any]:
    """The call's result as it is recorded and the model reads it: the status, its reason,
    the Content-Type and the body as text (cut at the tool's maxResponseBytes), with any
    Secret header's value replaced; a status that is not 2xx carries ``error``."""
    text = redact(clean(body.decode("utf-8", "replace")), secrets)
    record: dict[str, Any] = {
        "status": status,
        "reason": redact(clean(reason), secrets)[:200],
        "url": redact(url, secrets),
    }
    if content_type:
        record["contentType"] = redact(clean(content_type), secrets)[:200]
    record["body"] = text
    if truncated:
        record["truncated"] = True
    if not 200 <= status < 300:
        error = f"the server answered HTTP {status} {record['reason']}".rstrip()
        if not_followed is not None:
            error += f"; its redirect was not followed: {redact(not_followed, secrets)}"
        record["error"] = error
    return record


def result_summary(record: Mapping[str, Any]) -> str:
    """The first line of a recorded response: ``HTTP 200 OK: ...``, ``error: ...`` first when
    the status is not 2xx."""
    head = f"HTTP {record.get('status')} {record.get('reason') or ''}".rstrip()
    line = summary_line(f"{head}: {record.get('body') or '(no body)'}")
    return f"error: {line}" if "error" in record else line
