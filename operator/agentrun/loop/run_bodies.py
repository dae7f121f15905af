"""The latest known body of each unfinished run (:class:`RunBodies`): as kopf's watch
delivered it, or as a status write of this process left it, whichever is newer, with what
passes derive from it alone (the run's model and its status in wire form), kept once. The
passes read runs from it (:mod:`agentrun.loop.observe` observes the rest).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from agentrun.api import models as m


class RunBodies:
    """The latest known body of each unfinished run: as kopf's watch delivered it, or as a
    status write of this process left it, whichever is newer (resourceVersions compared
    as the integers etcd makes them; one that is not taken as newer). Safe across threads.

    With each body it keeps what passes derive from it alone, once: the body validated into
    the run's model and that model's status in wire form. A run of many steps is passed many
    times per status write (each change of its Jobs and pods brings one), so this is most of
    what would otherwise grow with its size on every pass. Passes only read the model."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self._derived: dict[tuple[str, str], _Derived] = {}

    def offer(self, body: dict[str, Any], run: m.AgentRun | None = None) -> None:
        """Keep ``body`` unless a newer one is known. A finished run's is not kept: such a
        run is rarely passed again (and then read), and thousands of them would cost memory.
        ``run``: ``body`` as a model, when known (a status write's: the model written, whose
        status in wire form is ``body``'s), kept as derived from it."""
        key = _key(body)
        finished = (body.get("status") or {}).get("phase") in FINISHED_PHASES
        with self._lock:
            known = self._bodies.get(key)
            if known is not None and _not_newer(body, known):
                derived = self._derived.get(key)
                if (
                    run is not None
                    and _same_version(body, known)
                    and (derived is None or derived.body is not known)
                ):
                    # The watch event of this write came first: it is the run as written,
                    # so the model written is what the next pass would validate from it.
                    self._derived[key] = _Derived(known, run, body.get("status") or {})
                return  # the one kept is as new (then what is derived from it is kept too)
            if finished:
                self._bodies.pop(key, None)
                self._derived.pop(key, None)
            else:
                self._bodies[key] = body
                if run is not None:
                    self._derived[key] = _Derived(body, run, body.get("status") or {})

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._bodies.get((namespace, name))

    def drop(self, namespace: str, name: str) -> None:
        with self._lock:
            self._bodies.pop((namespace, name), None)
            self._derived.pop((namespace, name), None)

    def model(self, body: dict[str, Any]) -> m.AgentRun:
        """``body`` validated: made once for the body kept here, else made now."""
        return self._derive(body).run

    def status_wire(self, body: dict[str, Any], run: m.AgentRun) -> dict[str, Any]:
        """``run.status`` (``run`` being :meth:`model` of ``body``) in wire form: made once
        for the body kept here, else made now."""
        with self._lock:
            derived = self._derived.get(_key(body))
        if derived is None or derived.body is not body or derived.run is not run:
            return run.status.to_wire() if run.status is not None else {}
        if derived.wire is None:
            derived.wire = run.status.to_wire() if run.status is not None else {}
        return derived.wire

    def _derive(self, body: dict[str, Any]) -> _Derived:
        key = _key(body)
        with self._lock:
            known = self._derived.get(key)
            if known is not None and known.body is body:
                return known
        made = _Derived(body, m.AgentRun.model_validate(body))
        with self._lock:
            if self._bodies.get(key) is body:  # kept: so is what is derived from it
                self._derived[key] = made
        return made


@dataclasses.dataclass
class _Derived:
    body: dict[str, Any]
    run: m.AgentRun
    wire: dict[str, Any] | None = None


FINISHED_PHASES = frozenset(str(p) for p in m.TERMINAL_RUN_PHASES)


def _key(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _same_version(body: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether ``body`` and ``than`` are the same run at the same resourceVersion."""
    mine, theirs = body.get("metadata") or {}, than.get("metadata") or {}
    version = mine.get("resourceVersion")
    return (
        bool(version)
        and mine.get("uid") == theirs.get("uid")
        and (version == theirs.get("resourceVersion"))
    )


def _not_newer(body: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether ``body`` is the run ``than`` is, at an older resourceVersion (a late watch
    event) or at the same one (the same object: a status write's result, and the watch event
    of that write)."""
    mine_meta, their_meta = body.get("metadata") or {}, than.get("metadata") or {}
    if mine_meta.get("uid") != their_meta.get("uid"):
        return False  # another run of that name: the newer one
    if _same_version(body, than):
        return True
    mine = str(mine_meta.get("resourceVersion") or "")
    theirs = str(their_meta.get("resourceVersion") or "")
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)
