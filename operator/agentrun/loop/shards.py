"""Shard Leases: several active replicas share the runs (agentrun/core/shards.py decides).

One thread per replica (not the pass workers: a busy replica must still renew) lists the
Leases labelled ``agentrun.dev/lease`` in the operator's namespace every third of the lease
duration, renews its member Lease and the shards it keeps, takes those :func:`plan` gives it
and releases those over its share once no pass of theirs is in flight. Every write is a PUT
at the resourceVersion seen (or a create): of two replicas taking the same shard at once,
one gets 409 and the shard stays the other's.

A replica decides a run only while it :meth:`ShardKeeper.owns` the run's shard: it holds the
shard's Lease, does not give it away, and *sent* its last successful renewal less than two
thirds of the duration ago. Others take the shard only a whole duration after they saw that
renewal, so a replica cut off from the API server stops deciding before anyone else starts.
A pass already running when that moment passes may still finish; its status write is fenced
by the resourceVersion it read (a stale one fails with 409) and a Job it creates has the
attempt's own name (a second create fails with 409): a run is never decided twice.

``on_change(gained, lost)`` is called from the keeper's thread after each tick that changed
what it owns; :mod:`agentrun.loop.handlers` hands it to the scheduler. ``follow(shards)`` is
told the shards held after each tick, and before a tick writes the Leases of shards it takes
those too: the informer then watches their Jobs and pods (and passes wait until it listed
them) before the replica may decide their runs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from agentrun.api.models import GROUP
from agentrun.core import shards as sh
from agentrun.kubeapi import CONNECT_SECONDS, api_message, tolerate
from agentrun.telemetry import metrics
from agentrun.telemetry.retries import fields, retried

log = logging.getLogger("agentrun.shards")

LEASE_LABEL = f"{GROUP}/lease"
"""On every Lease the keepers write: ``shard`` or ``member``; they list by it."""
COUNT_LABEL = f"{GROUP}/shards"
"""On every Lease the keepers write: the shard count of the replica that wrote it. While a
live Lease shows another count than a replica's own, that replica decides nothing: replicas
that split the runs differently would each decide some runs of the other's shards."""

FORGET_DURATIONS = 10
"""A member Lease left unrenewed this many lease durations is deleted by the others."""

Change = Callable[[frozenset[int], frozenset[int]], None]
Busy = Callable[[frozenset[int]], bool]
Follow = Callable[[frozenset[int]], None]
"""``follow(shards)``: watch the Jobs and pods of exactly these shards (the informer's
:meth:`~agentrun.observation.watches.Informer.follow`). Told the shards held, and those about
to be taken before their Leases are written: a pass of a shard's run waits for their list."""


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ShardKeeper:
    """Holds this replica's shard Leases in ``namespace`` (see the module docstring)."""

    def __init__(
        self,
        coordination: Any,
        namespace: str,
        identity: str,
        count: int,
        duration: float,
        *,
        on_change: Change = lambda gained, lost: None,
        busy: Busy = lambda shards: False,
        follow: Follow = lambda shards: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = coordination
        self.namespace = namespace
        self.identity = identity
        self.count = count
        self.duration = float(duration)
        self.on_change = on_change
        self.busy = busy
        self.follow = follow
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[int, float] = {}
        """Shard -> when the last successful write of its Lease was sent (monotonic)."""
        self._giving: set[int] = set()
        self._owned: frozenset[int] = frozenset()
        """What the last tick told ``on_change``."""
        self._seen: dict[str, tuple[str, sh.Seen, dict[str, Any]]] = {}
        """Lease name -> (resourceVersion, as seen, body) of every Lease listed or written."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the passes ask ---------------------------------------------------------------

    @property
    def period(self) -> float:
        return self.duration / 3

    @property
    def limits(self) -> tuple[float, float]:
        """The ``_request_timeout`` of every Lease request: a read waits at most a
        :attr:`period`, so that a renewal that went unanswered is sent again in time to keep
        the shards (ownership lapses by the clock anyway: this is for liveness only)."""
        return CONNECT_SECONDS, max(self.period, 1.0)

    def owns_shard(self, shard: int) -> bool:
        with self._lock:
            sent = self._held.get(shard)
            giving = shard in self._giving
        limit = self.duration * sh.RENEW_FRACTION
        return sent is not None and not giving and self.clock() - sent < limit

    def owns(self, namespace: str, name: str) -> bool:
        """Whether this replica decides run ``namespace/name`` now."""
        return self.owns_shard(sh.shard_of(namespace, name, self.count))

    def holds(self, namespace: str, name: str) -> bool:
        """Whether this replica means to decide run ``namespace/name``: it holds the run's
        shard and is not giving it back, though its renewal may be late right now (then
        :meth:`owns` is False until the next renewal, or until the shard is told lost)."""
        shard = sh.shard_of(namespace, name, self.count)
        with self._lock:
            return shard in self._held and shard not in self._giving

    def owned(self) -> frozenset[int]:
        return frozenset(i for i in range(self.count) if self.owns_shard(i))

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._keep, name="shard-leases", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while True:
            try:
                self.tick()
            except Exception as error:  # the API server is away: owns() lapses by itself
                away = retried("shards", error)
                line = fields("shards", away.reason) if away is not None else None
                log.warning("shard Leases: %s", _describe(error), extra=line)
                self._tell()
            if self._stop.wait(self.period):
                return

    def stop(self, release: bool = True) -> None:
        """End the thread; with ``release``, give every shard back and leave (a clean
        shutdown: the others take the shards at their next tick, not a duration later)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.duration)
        if not release:
            return
        with self._lock:
            held = list(self._held)
            self._giving.update(held)
        self._tell()
        for shard in held:
            try:
                self._release(shard)
            except Exception as error:
                log.warning("shard %d not released: %s", shard, _describe(error))
        self._tell()  # nothing held now: no shard's Jobs are watched any longer
        with tolerate(404):
            self.api.delete_namespaced_lease(
                sh.member_lease(self.identity), self.namespace, _request_timeout=self.limits
            )

    # -- one tick --------------------------------------------------------------------------

    def tick(self) -> None:
        """List, renew, take and give (see the module docstring); tell what changed."""
        now = self.clock()
        self._observe(now)
        self._write_member()
        members: dict[str, sh.Seen] = {}
        shards: dict[int, sh.Seen] = {}
        for name, (_, seen, body) in self._seen.items():
            kind = ((body.get("metadata") or {}).get("labels") or {}).get(LEASE_LABEL)
            shard = sh.shard_from_lease(name)
            if kind == "shard" and shard is not None:
                shards[shard] = seen
            elif kind == "member":
                members[name] = seen
        live = sh.live_members(members, now, self.duration)
        self._forget_members(members, now)
        decided = sh.plan(self.identity, self.count, shards, live, now, self.duration)
        others = self._other_counts(now)
        if others:
            log.error(
                "replicas disagree on the shard count: this one has AGENTRUN_SHARDS=%d, live "
                "Leases in %s show %s; deciding no run until every replica has the same",
                self.count, self.namespace, ", ".join(others),
            )  # fmt: skip
            mine = [i for i, seen in shards.items() if seen.holder == self.identity]
            decided = sh.ShardPlan(give=tuple(sorted(mine)))
        with self._lock:
            self._giving = set(decided.give)
            # A shard the Leases show held by another is not this replica's, whatever it wrote.
            for shard in list(self._held):
                other = shards.get(shard)
                if other is not None and other.holder != self.identity:
                    del self._held[shard]
        self._tell()
        for shard in decided.keep:
            self._write_shard(shard, renew=True)
        if decided.take:
            with self._lock:
                held = frozenset(self._held)
            self.follow(held | frozenset(decided.take))
        for shard in decided.take:
            self._write_shard(shard, renew=False)
        giving = frozenset(decided.give)
        if giving and not self.busy(giving):
            for shard in giving:
                self._release(shard)
        self._tell()

    def _other_counts(self, now: float) -> list[str]:
        """The shard counts other than this replica's on Leases someone holds and renews."""
        found = {
            str(((body.get("metadata") or {}).get("labels") or {}).get(COUNT_LABEL) or "")
            for _, seen, body in self._seen.values()
            if not sh.expired(seen, now, self.duration)
        }
        return sorted(c for c in found - {"", str(self.count)})

    def _forget_members(self, members: Mapping[str, sh.Seen], now: float) -> None:
        """Delete member Leases nobody renewed for :data:`FORGET_DURATIONS` durations (a
        replica that died: its pod's name is not used again), at the version seen."""
        for name, seen in members.items():
            if now - seen.changed_at <= FORGET_DURATIONS * self.duration:
                continue
            version = self._seen[name][0]
            body = {"preconditions": {"resourceVersion": version}}
            with tolerate(404, 409):
                self.api.delete_namespaced_lease(
                    name, self.namespace, body=body, _request_timeout=self.limits
                )
            self._seen.pop(name, None)

    def _observe(self, now: float) -> None:
        response = self.api.list_namespaced_lease(
            self.namespace,
            label_selector=LEASE_LABEL,
            _preload_content=False,
            _request_timeout=self.limits,
        )
        listed: dict[str, dict[str, Any]] = {
            str(item["metadata"]["name"]): item
            for item in json.loads(response.data).get("items") or []
        }
        for name in set(self._seen) - set(listed):
            del self._seen[name]
        for name, body in listed.items():
            self._note(name, body, now)

    def _note(self, name: str, body: Mapping[str, Any], now: float) -> None:
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        holder = str((body.get("spec") or {}).get("holderIdentity") or "")
        before = self._seen.get(name)
        if before is not None and before[0] == version:
            return
        self._seen[name] = (version, sh.Seen(holder, now), dict(body))

    def _write_member(self) -> None:
        name = sh.member_lease(self.identity)
        self._write(name, "member", keep_holder=False)

    def _write_shard(self, shard: int, *, renew: bool) -> None:
        sent = self.clock()
        ok = self._write(sh.shard_lease(shard), "shard", keep_holder=renew)
        with self._lock:
            if ok:
                self._held[shard] = sent
            elif renew:
                self._held.pop(shard, None)

    def _write(self, name: str, kind: str, *, keep_holder: bool) -> bool:
        """Hold Lease ``name`` (create it, or PUT it at the version seen); False on 409."""
        now = _micro_now()
        seen = self._seen.get(name)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(int(self.duration), 1),
            "renewTime": now,
        }
        if seen is None:
            body: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "labels": self._labels(kind, {})},
                "spec": {**spec, "acquireTime": now, "leaseTransitions": 0},
            }
            with tolerate(409) as taken:
                answer = self.api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=self.limits
                )
        else:
            old = seen[2]
            old_spec = dict(old.get("spec") or {})
            if not (keep_holder or old_spec.get("holderIdentity") == self.identity):
                old_spec["acquireTime"] = now
                old_spec["leaseTransitions"] = int(old_spec.get("leaseTransitions") or 0) + 1
            meta = dict(old.get("metadata") or {})
            meta["labels"] = self._labels(kind, meta.get("labels") or {})
            body = {**old, "metadata": meta, "spec": {**old_spec, **spec}}
            with tolerate(409, 404) as taken:
                answer = self.api.replace_namespaced_lease(
                    name,
                    self.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self.limits,
                )
        if taken:
            self._seen.pop(name, None)  # listed again at the next tick
            return False
        self._note(name, json.loads(answer.data), self.clock())
        return True

    def _labels(self, kind: str, labels: Mapping[str, str]) -> dict[str, str]:
        return {**labels, LEASE_LABEL: kind, COUNT_LABEL: str(self.count)}

    def _release(self, shard: int) -> None:
        name = sh.shard_lease(shard)
        seen = self._seen.get(name)
        with self._lock:
            self._held.pop(shard, None)
        if seen is None or seen[1].holder != self.identity:
            return
        body = dict(seen[2])
        spec = {k: v for k, v in (body.get("spec") or {}).items() if k != "holderIdentity"}
        with tolerate(409, 404) as gone:
            answer = self.api.replace_namespaced_lease(
                name,
                self.namespace,
                {**body, "spec": spec},
                _preload_content=False,
                _request_timeout=self.limits,
            )
        if gone:
            self._seen.pop(name, None)
        else:
            self._note(name, json.loads(answer.data), self.clock())
        log.info("shard %d given back", shard)

    def _tell(self) -> None:
        with self._lock:
            held = frozenset(self._held)
        self.follow(held)
        owned = self.owned()
        gained, lost = owned - self._owned, self._owned - owned
        self._owned = owned
        metrics.SHARDS_OWNED.set(len(owned))
        if gained:
            metrics.SHARD_CHANGES.labels("gained").inc(len(gained))
        if lost:
            metrics.SHARD_CHANGES.labels("lost").inc(len(lost))
        if gained or lost:
            log.info(
                "shards owned: %s (gained %s, lost %s)",
                sorted(owned), sorted(gained), sorted(lost),
            )  # fmt: skip
            self.on_change(gained, lost)


def _describe(error: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    if isinstance(error, ApiException):
        return api_message(error)
    return f"{type(error).__name__}: {error}"
