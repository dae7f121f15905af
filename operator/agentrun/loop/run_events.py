"""Watch events of runs held already, decoded only as far as their metadata.

Each status write of a run brings a watch event that carries the whole run: 137 KB of JSON
for a plan of 128 steps, decoded by kopf's watch on the operator's event loop, holding the
interpreter while it does. The run it carries at that version is most often known already:
:class:`~agentrun.loop.observe.RunBodies` holds each unfinished run as this process wrote it
(the body read at the version the write fenced, with the status written: a status write
fenced by its version changes nothing else of the run but ``managedFields``) or as a read
returned it. Decoding the event whole only to find it not newer than what is held is most of
what such an event costs, and it grows with the run.

:class:`RunEvents` is the decoder of kopf's watch lines (handed to kopf by
``agentrun.loop.handlers``). A line that begins as the MODIFIED event of an AgentRun is
decoded up to the end of the run's metadata, by a JSON decoder, from the place the event's
fixed beginning ends (the API server writes an event's ``type`` and ``object`` in that order
and a custom resource's fields sorted, so ``apiVersion``, ``kind`` and ``metadata`` come
first; none of them is a creator's to write). When the run held under that namespace and
name has the same uid and resourceVersion, the event is made of the metadata as the API
server sent it and the spec and status held, and the rest of the line is never decoded.
Every other line is decoded whole, as kopf does: another event type, another resource, a
version not held (someone else's write, or this process's own whose event came before its
answer), a line that does not begin as expected (the code then does no worse than kopf's).

Nothing decides anything from what is skipped: the pass reads the body held whichever way the
event was decoded (:meth:`~agentrun.loop.observe.RunBodies.offer` keeps the one held at the
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

PREFIX = (
    '{"type":"MODIFIED","object":{"apiVersion":"'
    + names.API_VERSION
    + '","kind":"'
    + names.KIND
    + '","metadata":'
)
"""How the API server begins the line of a MODIFIED watch event of an AgentRun."""

_DECODER = json.JSONDecoder()

Held = Callable[[str, str], Mapping[str, Any] | None]
"""The body held for a run, by namespace and name (``RunBodies.get``)."""


class RunEvents:
    """``loads`` for the lines of kopf's watches (see the module docstring). Called on the
    event loop's thread; ``held`` must be safe to call from it."""

    def __init__(self, held: Held) -> None:
        self.held = held

    def loads(self, text: str | bytes | bytearray, **kwargs: Any) -> Any:
        if kwargs or not isinstance(text, str) or not text.startswith(PREFIX):
            return json.loads(text, **kwargs)
        event = self._from_held(text)
        if event is None:
            metrics.RUN_EVENTS.labels("whole").inc()
            return json.loads(text)
        metrics.RUN_EVENTS.labels("metadata").inc()
        return event

    def _from_held(self, text: str) -> dict[str, Any] | None:
        """The event of ``text`` from its metadata and the body held at its version; None
        when none is held at it (or its metadata cannot be read as an object)."""
        try:
            meta, _ = _DECODER.raw_decode(text, len(PREFIX))
        except ValueError:
            return None
        if not isinstance(meta, dict):
            return None
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
        run: dict[str, Any] = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "metadata": meta,
        }
        for part in ("spec", "status"):
            if part in body:
                run[part] = body[part]
        return {"type": "MODIFIED", "object": run}
