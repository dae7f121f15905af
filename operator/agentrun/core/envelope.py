"""The result envelope a step pod leaves in its termination message.

A step writes JSON ``{"ok": true, "summary": "...", "result": ..., "usage": {"tokens": N}}``
(or, for results it stored itself, ``"resultRef": {"name": ..., "key": ...}``) to its
termination log. Anything that is not such an object is taken as a plain-text result.
Kubelet keeps at most 4 KiB of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrun.core.naming import canonical_json

SUMMARY_LIMIT = 200


@dataclass(frozen=True)
class Envelope:
    """What a step reported about its attempt."""

    ok: bool
    summary: str | None
    result: str | None
    tokens: int
    result_ref: tuple[str, str] | None  # (ConfigMap name, key) written by the step itself
    result_digest: str | None


def summary_line(text: str) -> str:
    """The first line of ``text``, shortened to :data:`SUMMARY_LIMIT` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 1] + "…"


def parse(message: str | None) -> Envelope:
    """Read a termination message; never raises, whatever the step wrote."""
    text = (message or "").strip()
    if not text:
        return Envelope(True, None, None, 0, None, None)
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
        return Envelope(True, summary_line(text), text, 0, None, None)

    summary = data.get("summary")
    summary = summary_line(summary) if isinstance(summary, str) else None
    raw_result = data.get("result")
    if raw_result is None:
        result = None
    elif isinstance(raw_result, str):
        result = raw_result
    else:
        result = canonical_json(raw_result)
    usage = data.get("usage")
    tokens = usage.get("tokens", 0) if isinstance(usage, dict) else 0
    tokens = (
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0
    )
    ref = data.get("resultRef")
    result_ref = None
    if (
        isinstance(ref, dict)
        and isinstance(ref.get("name"), str)
        and isinstance(ref.get("key"), str)
    ):
        result_ref = (ref["name"], ref["key"])
    digest = data.get("resultDigest")
    return Envelope(
        ok=data["ok"],
        summary=summary,
        result=result,
        tokens=tokens,
        result_ref=result_ref,
        result_digest=digest if isinstance(digest, str) else None,
    )


def _config_map_key_ok(key: str) -> bool:
    return 0 < len(key) <= 240 and all(c.isalnum() or c in "-._" for c in key)


def result_object_data(result: str) -> tuple[tuple[str, str], ...]:
    """Entries of a result ConfigMap: the whole result as ``result``, and each top-level field
    of a JSON object as ``field.<name>``, so a later step can take one field as an input."""
    data: list[tuple[str, str]] = [("result", result)]
    try:
        parsed = json.loads(result)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key, value in sorted(parsed.items()):
            if isinstance(key, str) and _config_map_key_ok(key):
                text = value if isinstance(value, str) else canonical_json(value)
                data.append((f"field.{key}", text))
    return tuple(data)
