"""The result envelope a step pod leaves in its termination message.

A step writes JSON ``{"ok": true, "summary": "...", "result": ..., "usage": {"tokens": N}}``
(or, for results it stored itself, ``"resultRef": {"name": ..., "key": ...}``) to its
termination log. Anything that is not such an object is taken as a plain-text result.
Kubelet keeps at most 4 KiB of it, so a result may come compressed instead:
``"resultZ": "<base64 of the zlib-compressed UTF-8 text>"`` (:func:`compress_result`), read back
up to :data:`MAX_INFLATED_RESULT` bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from dataclasses import dataclass
from typing import Any

from agentrun.api.names import MAX_FIELD_KEY
from agentrun.core.naming import canonical_json

SUMMARY_LIMIT = 200
MESSAGE_LIMIT = 64 * 1024
"""Longest termination message read, in characters. Kubelet keeps 4 KiB; a longer one is not
a step's report, and reading it whole would only carry its size further."""
MAX_TOKENS = 2**53 - 1
"""Token counts are clamped to this: it fits the API server's int64 and is exact in any JSON
reader (a larger number would make every status write fail validation)."""
MAX_INFLATED_RESULT = 960 * 1024
"""Most bytes a compressed result (``resultZ``) may hold once inflated: a result object (a
ConfigMap, at most 1 MiB with its metadata) takes it whole."""
RESULT_Z = "resultZ"
NAME_LIMIT = 253
DIGEST_LIMIT = 64

_SURROGATES = re.compile("[\ud800-\udfff]")
_CONFIG_MAP_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class Envelope:
    """What a step reported about its attempt."""

    ok: bool
    summary: str | None
    result: str | None
    tokens: int
    result_ref: tuple[str, str] | None  # (ConfigMap name, key) written by the step itself
    result_digest: str | None
    problem: str | None = None
    """Why the envelope cannot be taken as the step's report (then ``ok`` is False and the
    attempt fails with reason InvalidEnvelope)."""


def clean(text: str) -> str:
    """``text`` with lone surrogates (what invalid UTF-8 decodes to, and what no JSON writer
    of the API server accepts) replaced by U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


def summary_line(text: str) -> str:
    """The first line of ``text``, shortened to :data:`SUMMARY_LIMIT` characters."""
    text = clean(text)
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 1] + "…"


def _invalid(problem: str) -> Envelope:
    return Envelope(False, None, None, 0, None, None, problem)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def parse(message: str | None) -> Envelope:
    """Read a termination message; never raises, whatever the step wrote.

    A JSON object with a boolean ``ok`` is an envelope, and each of its known fields must have
    the right shape (else the attempt fails with the problem named); anything else is a
    plain-text result.
    """
    text = clean(message or "").strip()
    if not text:
        return Envelope(True, None, None, 0, None, None)
    if len(text) > MESSAGE_LIMIT:
        return _invalid(
            f"the termination message has {len(text)} characters, more than the "
            f"{MESSAGE_LIMIT} a step may report"
        )
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        data = None
    except (ValueError, RecursionError) as e:  # JSON, but nested too deep or numbers too long
        if text.startswith("{"):
            return _invalid(f"the envelope cannot be read: {_reading_error(e)}")
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
        return Envelope(True, summary_line(text), text, 0, None, None)
    try:
        return _envelope(data)
    except (ValueError, RecursionError) as e:
        return _invalid(f"the envelope cannot be read: {_reading_error(e)}")


def _reading_error(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "it is nested too deeply"
    return str(e)[:200] or type(e).__name__


def _envelope(data: dict[str, Any]) -> Envelope:
    summary = data.get("summary")
    if summary is not None and not isinstance(summary, str):
        return _invalid(f"summary is a {_type_name(summary)}, not a string")
    raw_result = data.get("result")
    if raw_result is None and RESULT_Z in data:
        inflated = inflate_result(data[RESULT_Z])
        if not isinstance(inflated, tuple):
            return _invalid(inflated)
        result = clean(inflated[0])
    elif raw_result is None:
        result = None
    elif isinstance(raw_result, str):
        result = clean(raw_result)
    else:
        result = clean(canonical_json(raw_result))
    tokens = 0
    usage = data.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            return _invalid(f"usage is a {_type_name(usage)}, not an object")
        raw_tokens = usage.get("tokens")
        if raw_tokens is not None:
            if not isinstance(raw_tokens, int) or isinstance(raw_tokens, bool) or raw_tokens < 0:
                shown = clean(repr(raw_tokens))[:40]
                return _invalid(f"usage.tokens is {shown}, not a whole number >= 0")
            tokens = min(raw_tokens, MAX_TOKENS)
    ref = data.get("resultRef")
    result_ref = None
    if ref is not None:
        if not isinstance(ref, dict):
            return _invalid(f"resultRef is a {_type_name(ref)}, not an object")
        name, key = ref.get("name"), ref.get("key")
        if not (
            isinstance(name, str) and len(name) <= NAME_LIMIT and _CONFIG_MAP_NAME.fullmatch(name)
        ):
            return _invalid("resultRef.name is not the name of a ConfigMap")
        if not (isinstance(key, str) and len(key) <= NAME_LIMIT and _CONFIG_MAP_KEY.fullmatch(key)):
            return _invalid("resultRef.key is not a ConfigMap key")
        result_ref = (name, key)
    digest = data.get("resultDigest")
    if digest is not None and not (isinstance(digest, str) and len(digest) <= DIGEST_LIMIT):
        return _invalid(f"resultDigest is not a digest of at most {DIGEST_LIMIT} characters")
    return Envelope(
        ok=data["ok"],
        summary=summary_line(summary) if summary is not None else None,
        result=result,
        tokens=tokens,
        result_ref=result_ref,
        result_digest=clean(digest) if digest is not None else None,
    )


def compress_result(text: str) -> str:
    """``text`` as ``resultZ`` carries it."""
    return base64.b64encode(zlib.compress(text.encode("utf-8", "surrogatepass"), 9)).decode()


def inflate_result(packed: Any) -> tuple[str] | str:
    """The text of a ``resultZ`` (in a 1-tuple), or why it cannot be read; never more than
    :data:`MAX_INFLATED_RESULT` bytes are inflated."""
    if not isinstance(packed, str):
        return f"resultZ is a {_type_name(packed)}, not a string"
    try:
        compressed = base64.b64decode(packed, validate=True)
        inflater = zlib.decompressobj()
        data = inflater.decompress(compressed, MAX_INFLATED_RESULT + 1)
    except (binascii.Error, ValueError, zlib.error) as e:
        return f"resultZ is not base64 of zlib data: {str(e)[:120]}"
    if len(data) > MAX_INFLATED_RESULT or inflater.unconsumed_tail:
        return f"resultZ holds more than the {MAX_INFLATED_RESULT} bytes a result may have"
    if not inflater.eof:
        return "resultZ is cut short"
    try:
        return (data.decode("utf-8"),)
    except UnicodeDecodeError:
        return "resultZ does not hold UTF-8 text"


def _config_map_key_ok(key: str) -> bool:
    return len(key) <= MAX_FIELD_KEY and _CONFIG_MAP_KEY.fullmatch(key) is not None


def result_object_data(result: str, *, fields: bool = True) -> tuple[tuple[str, str], ...]:
    """Entries of a result ConfigMap: the whole result as ``result``, and (with ``fields``)
    each top-level field of a JSON object as ``field.<name>``, so a later step can take one
    field as an input. A model turn's output has no fields: nothing takes them, and they
    would hold its answer a second time."""
    if not fields:
        return (("result", result),)
    found: list[tuple[str, str]] = []
    try:
        parsed = json.loads(result)
        if isinstance(parsed, dict):
            for key, value in sorted(parsed.items()):
                if _config_map_key_ok(key):
                    text = value if isinstance(value, str) else canonical_json(value)
                    found.append((f"field.{key}", clean(text)))
    except (ValueError, RecursionError):  # not JSON, or JSON too deep to read: no fields
        found = []
    return (("result", result), *found)
