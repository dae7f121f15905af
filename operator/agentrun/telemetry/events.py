"""Events on runs, as events.k8s.io/v1 Events.

Not core/v1 Events with second timestamps: several Events of one pass land in the same second,
and readers could not order them. An events.k8s.io/v1 Event carries ``eventTime`` with
microseconds, and its name ends in that time as hex nanoseconds (as client-go's recorder names
Events), so both the time and the name order the Events of a run as they happened.
:class:`EventClock` makes the times of one process strictly increasing, so two Events never
share one.

``reportingController`` is the operator; ``reportingInstance`` is this process (the pod's name
in a cluster, see :attr:`agentrun.settings.Settings.instance`). Readers of core/v1 Events
(``kubectl get events``, ``kubectl describe agentrun``) see the same Events: the API server
serves both versions from one store, ``note`` as ``message`` and ``regarding`` as
``involvedObject``.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.api import models as m
from agentrun.core import EmitEvent

API_VERSION = "events.k8s.io/v1"
NOTE_LIMIT = 1024
"""Bytes: the API server refuses a longer note (and reason and action past 128)."""
ACTIONS = {"CleanupIncomplete": "Cleanup"}
"""The action of an Event, by its reason: what the operator was doing. Every other Event comes
from a reconcile pass."""
RECONCILE = "Reconcile"


class EventClock:
    """Strictly increasing microsecond times, from any thread."""

    def __init__(self) -> None:
        self._last: datetime | None = None
        self._lock = threading.Lock()

    def stamp(self, now: datetime) -> datetime:
        """``now`` to the microsecond, or just past the last time given when not later."""
        with self._lock:
            if self._last is not None and now <= self._last:
                now = self._last + timedelta(microseconds=1)
            self._last = now
            return now


def micro_time(at: datetime) -> str:
    """A metav1.MicroTime: RFC 3339 in UTC with six fractional digits."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_name(run_name: str, at: datetime) -> str:
    """``<run>.<hex nanoseconds>``: unique per run and time, ordered by time."""
    nanos = (int(at.timestamp()) * 1_000_000 + at.microsecond) * 1000
    return f"{run_name}.{nanos:x}"


def event_body(
    namespace: str,
    name: str,
    uid: str,
    event: EmitEvent,
    at: datetime,
    *,
    controller: str,
    instance: str,
) -> dict[str, Any]:
    """The events.k8s.io/v1 Event of ``event`` on the run ``namespace/name`` (``uid``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Event",
        "metadata": {"name": event_name(name, at), "namespace": namespace},
        "eventTime": micro_time(at),
        "reportingController": controller,
        "reportingInstance": _clip(instance, 128),
        "action": ACTIONS.get(event.reason, RECONCILE),
        "reason": _clip(event.reason, 128),
        "note": _clip(event.message, NOTE_LIMIT),
        "type": event.type,
        "regarding": {
            "apiVersion": m.API_VERSION,
            "kind": m.KIND,
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
    }


def _clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, never inside a character."""
    return text.encode()[:limit].decode(errors="ignore")
