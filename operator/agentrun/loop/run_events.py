"""Watch events of runs: those held already decoded only as far as their metadata, and none
with its ``managedFields``.

Each status write of a run brings a watch event that carries the whole run: 137 KB of JSON
for a plan of 128 steps, decoded by kopf's watch on the operator's event loop, holding the
interpreter while it does. The run it carries at that version is most often known already:
:class:`~agentrun.loop.run_bodies.RunBodies` holds each unfinished run as this process wrote it
(the body read at the version the write fenced, with the status written: a status write
fenced by its version changes nothing else of the run but ``managedFields``) or as a read
returned it. Decoding the event whole only to find it not newer than what is held is most of
what such an event costs, and it grows with the run.

:class:`RunEvents` is the decoder of kopf's watch lines (handed to kopf by
``agentrun.loop.handlers``). A line that begins as an ADDED, MODIFIED or DELETED event of an
AgentRun is read field by field from the place the event's fixed beginning ends (the API
server writes an event's ``type`` and ``object`` in that order and a custom resource's
fields sorted, without spaces, so ``apiVersion``, ``kind`` and ``metadata`` come first; none
of them is a creator's to write), each field of the metadata by a JSON decoder but
``managedFields``, which is passed over: it is most of the metadata (47 KB of a 128-step
run's, the creator's plan field by field), and neither kopf nor the operator reads it. It is
a list of objects whose fields hold no lists and whose strings hold no bare quote, and
``name`` follows it, so the first ``],"name":"`` after its start is its end. When the event
is a MODIFIED one and the run held under that namespace and name has the same uid and
resourceVersion, the event is made of the metadata as the API server sent it (without
``managedFields``) and the spec and status held, and the rest of the line is never decoded;
otherwise the run's other fields (its spec and status) are decoded as well (someone else's
write, this process's own whose event came before its answer, another replica's run). Any
other line is decoded whole, as kopf does, and so is one that does not read as expected (the
code then does no worse than kopf's).

With shards (agentrun/observation/runs.py), the decoder is also told which runs' shards
this replica follows: the event of any other run, and every DELETED, is decoded only as far
as its metadata (the object then has no spec and no status): what the replica does with it
(waking a parent, labelling a stray, forgetting a run) reads the metadata alone.

Nothing decides anything from what is skipped: the pass reads the body held whichever way the
event was decoded (:meth:`~agentrun.loop.run_bodies.RunBodies.offer` keeps the one held at the
same version), and kopf and the event handler read the metadata and the phase, which are the
API server's and the status's. ``agentrun_run_events_total`` counts the events by how they
were decoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.api import names
from agentrun.telemetry import metrics

EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")
"""The watch events that carry an AgentRun (BOOKMARK and ERROR lines are decoded as kopf does)."""


def prefix(event_type: str) -> str:
    """How the API server begins the line of a watch event of ``event_type`` of an AgentRun,
    up to its metadata."""
    return (
        f'{{"type":"{event_type}","object":{{"apiVersion":"{names.API_VERSION}",'
        f'"kind":"{names.KIND}","metadata":'
    )


PREFIXES = {event_type: prefix(event_type) for event_type in EVENT_TYPES}
PREFIX = PREFIXES["MODIFIED"]
"""How the API server begins the line of a MODIFIED watch event of an AgentRun."""
_TYPE_AT = len('{"type":"')

_DECODER = json.JSONDecoder()
_scan_string: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
"""The decoder's reader of a string, from the character after its opening quote."""

Held = Callable[[str, str], Mapping[str, Any] | None]
"""The body held for a run, by namespace and name (``RunBodies.get``)."""


class RunEvents:
    """``loads`` for the lines of kopf's watches (see the module docstring). Called on the
    event loop's thread; ``held`` must be safe to call from it."""

    def __init__(self, held: Held, wanted: Callable[[str, str], bool] | None = None) -> None:
        """``wanted(namespace, name)``: whether the run's shard is followed here (None:
        every run's is)."""
        self.held = held
        self.wanted = wanted

    def loads(self, text: str | bytes | bytearray, **kwargs: Any) -> Any:
        if kwargs or not isinstance(text, str):
            return json.loads(text, **kwargs)
        event_type = text[_TYPE_AT : text.find('"', _TYPE_AT)]
        start = PREFIXES.get(event_type)
        if start is None or not text.startswith(start):
            return json.loads(text)
        try:
            meta, after = _metadata(text, len(start))
        except (ValueError, IndexError):
            return json.loads(text)
        if self.wanted is not None and (event_type == "DELETED" or not self._wanted(meta)):
            metrics.RUN_EVENTS.labels("metadata").inc()
            return _event(event_type, meta, {})
        if event_type == "MODIFIED":
            event = self._from_held(meta)
            if event is not None:
                metrics.RUN_EVENTS.labels("metadata").inc()
                return event
        metrics.RUN_EVENTS.labels("whole").inc()
        try:
            rest = _rest(text, after)
        except (ValueError, IndexError):
            return json.loads(text)
        return _event(event_type, meta, rest)

    def _wanted(self, meta: Mapping[str, Any]) -> bool:
        namespace, name = meta.get("namespace"), meta.get("name")
        if not (isinstance(namespace, str) and isinstance(name, str)) or self.wanted is None:
            return True
        return self.wanted(namespace, name)

    def _from_held(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        """The MODIFIED event of the run of metadata ``meta`` from the body held at its
        version; None when none is held at it."""
        namespace, name, version = (
            meta.get("namespace"),
            meta.get("name"),
            meta.get("resourceVersion"),
        )
        if not (isinstance(namespace, str) and isinstance(name, str) and version):
            return None
        body = self.held(namespace, name)
        if body is None:
            return None
        held_meta = body.get("metadata") or {}
        if held_meta.get("uid") != meta.get("uid") or held_meta.get("resourceVersion") != version:
            return None
        return _event("MODIFIED", meta, {k: body[k] for k in ("spec", "status") if k in body})


def _event(event_type: str, meta: dict[str, Any], rest: Mapping[str, Any]) -> dict[str, Any]:
    """The watch event ``event_type`` of the run of metadata ``meta`` and fields ``rest``."""
    run = {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": meta, **rest}
    return {"type": event_type, "object": run}


MANAGED_FIELDS_END = '],"name":"'
"""Where a run's ``metadata.managedFields`` ends: the list closed and the next field begun
(fields sorted: ``name`` follows ``managedFields``)."""


def _metadata(text: str, start: int) -> tuple[dict[str, Any], int]:
    """The JSON object at ``start`` of ``text`` (a run's metadata, written without spaces),
    each field decoded but ``managedFields``, which is passed over, and where it ends.
    Raises ValueError (or IndexError) for anything else."""
    if text[start] != "{":
        raise ValueError("not an object")
    meta: dict[str, Any] = {}
    at = start + 1
    if text[at] == "}":
        return meta, at + 1
    while True:
        key, at = _field_name(text, at)
        if key == "managedFields" and text[at] == "[":
            end = text.find(MANAGED_FIELDS_END, at)
            if end < 0:
                raise ValueError("managedFields without the name after it")
            at = end + 1
        else:
            meta[key], at = _DECODER.raw_decode(text, at)
        if text[at] == "}":
            return meta, at + 1
        if text[at] != ",":
            raise ValueError("neither a comma nor the end after a field")
        at += 1


def _rest(text: str, at: int) -> dict[str, Any]:
    """The fields of the run after its metadata (``at``: where the metadata ended), decoded,
    up to the end of the run and of the event, with nothing but spaces after them."""
    rest: dict[str, Any] = {}
    while text[at] == ",":
        key, at = _field_name(text, at + 1)
        rest[key], at = _DECODER.raw_decode(text, at)
    if not text.startswith("}}", at) or text[at + 2 :].strip():
        raise ValueError("the run and the event do not end there")
    return rest


def _field_name(text: str, at: int) -> tuple[str, int]:
    """The field name at ``at`` of ``text`` (its opening quote) and where its value begins
    (after the colon). Raises ValueError for anything else."""
    if text[at] != '"':
        raise ValueError("not a field name")
    key, at = _scan_string(text, at + 1)
    if text[at] != ":":
        raise ValueError("no colon after a field name")
    return key, at + 1
