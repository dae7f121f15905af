"""``kubectl agentrun wait`` on a watch: the run is read once, then watched (the one run, by
the field selector ``metadata.name``) from the resourceVersion it was read at, until it ends
or the time runs out. A watch the API server closes (its timeout, a dropped connection) is
resumed from the last resourceVersion seen; one whose resourceVersion is too old (410 Gone)
starts again from a fresh read. The API calls are passed in, so this is tested without a
cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.clients.reading import Waited

Event = tuple[str, Mapping[str, Any]]
"""(type, object as stored): ADDED, MODIFIED, DELETED, BOOKMARK."""
Read = Callable[[], tuple[Mapping[str, Any], m.AgentRun]]
"""Read the run: as stored and parsed."""
Watch = Callable[[str, float], Iterable[Event]]
"""Watch the run from a resourceVersion for at most so many seconds."""

PAUSE_SECONDS = 0.5
"""How long to wait before watching again after a watch that ended at once with nothing."""


class Deleted(Exception):
    """The run was deleted while it was waited for."""


class WatchRefused(Exception):
    """The API server refused the watch itself (403): the caller may poll instead."""

    def __init__(self, run: m.AgentRun, left: float, error: ApiException) -> None:
        super().__init__(str(error))
        self.run, self.left, self.error = run, left, error


def _version(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def _ended(run: m.AgentRun) -> bool:
    return bool(run.status and run.status.phase in m.TERMINAL_RUN_PHASES)


def wait(
    read: Read,
    watch: Watch,
    parse: Callable[[Mapping[str, Any]], m.AgentRun],
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> Waited:
    """Until the run ends (a terminal phase) or ``timeout`` seconds pass."""
    deadline = clock() + timeout
    body, run = read()
    version = _version(body)
    while True:
        if _ended(run):
            return Waited(run)
        left = deadline - clock()
        if left <= 0:
            return Waited(run, timed_out=True)
        started, seen = clock(), False
        try:
            for kind, obj in watch(version, left):
                seen = True
                version = _version(obj) or version
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    raise Deleted(f"agentrun/{run.metadata.name} was deleted while waiting")
                run = parse(obj)
                if _ended(run) or clock() >= deadline:
                    break
        except ApiException as error:
            if error.status == 410:  # too old a resourceVersion: read afresh
                body, run = read()
                version = _version(body)
                continue
            if error.status == 403:
                raise WatchRefused(run, deadline - clock(), error) from None
            raise
        if not seen and clock() - started < PAUSE_SECONDS:
            pause(min(PAUSE_SECONDS, max(deadline - clock(), 0)))
