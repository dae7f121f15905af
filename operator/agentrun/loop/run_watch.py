"""What the event loop does with a change of a run, from kopf's watch of runs or, with shards,
from the operator's own (agentrun/observation/runs.py).

* :func:`run_event`: the run's latest body to the reconciler, the run to the scheduler, and a
  wake to the run's parent (a sub-agent's change: the parent reads the child's phase, tokens
  and answer);
* :class:`RunWatch`, with shards: hands each change delivered by a reflector's thread to the
  loop, and labels a run with its shard where no pass will (the label routes the run's
  events to the replica that holds its shard, and nothing else: see the trust table's
  ``run-shard-label``). A run not yet labelled is labelled by its first pass, in the patch
  that puts the run finalizer on it; one found with a wrong label in a shard's watch here is
  labelled by this replica whatever its shard; one found among the strays (no label of this
  count) whose shard this replica follows and that no pass will hold (finished: a run made
  before its operator was sharded, or under another count) is labelled here. The label is the
  same whoever writes it (the run's shard, not its holder's name).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core.shards import run_shard_label, shard_of
from agentrun.loop.ledger import Ledger
from agentrun.loop.run_bodies import RunBodies
from agentrun.loop.run_events import RunEvents
from agentrun.loop.scheduler import FINISHED, Scheduler
from agentrun.observation.runs import RunReflector, RunView
from agentrun.observation.view import Source
from agentrun.observation.watches import ListCall, Reflector
from agentrun.telemetry import metrics
from agentrun.telemetry.retries import logged

log = logging.getLogger("agentrun.handlers")


def run_event(
    scheduler: Scheduler,
    bodies: RunBodies | None,
    event_type: str | None,
    body: Mapping[str, Any],
) -> None:
    """A change of a run this replica follows (called in the loop): ``event_type`` DELETED
    when it is gone, else the run as it is now."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    phase = (body.get("status") or {}).get("phase")
    if event_type == "DELETED":
        metrics.RUNS.gone(namespace, name)
    else:
        metrics.RUNS.seen(namespace, name, phase)
    if bodies is not None:
        if event_type == "DELETED" or not scheduler.holds(namespace, name):
            bodies.drop(namespace, name)
        else:
            bodies.offer(dict(body))  # before the wake: the pass starts from it
    if event_type == "DELETED":
        scheduler.run_gone(namespace, name)
    else:
        scheduler.run_changed(namespace, name, phase, body)
    wake_parent(scheduler, body)


def wake_parent(scheduler: Scheduler, body: Mapping[str, Any]) -> None:
    """A sub-agent's run changed: its parent (its controller, an AgentRun) passes."""
    meta = body.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller") is True and owner.get("kind") == m.KIND:
            scheduler.wake(str(meta.get("namespace", "")), str(owner.get("name", "")))


class RunWatch:
    """The loop's side of a sharded replica's watches of runs (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        bodies: RunBodies | None,
        ledger: Ledger,
        count: int,
        followed: Callable[[], frozenset[int]],
    ) -> None:
        """``count``: ``AGENTRUN_SHARDS``; ``followed()``: the shards whose runs are watched
        here (:meth:`agentrun.observation.watches.Informer.followed`)."""
        self.scheduler = scheduler
        self.bodies = bodies
        self.ledger = ledger
        self.count = count
        self.followed = followed
        self.relabelling: set[tuple[str, str]] = set()

    def wanted(self, namespace: str, name: str) -> bool:
        """Whether the shard of run ``namespace/name`` is followed here."""
        return shard_of(namespace, name, self.count) in self.followed()

    def deliver(self, event_type: str, body: dict[str, Any], source: Source) -> None:
        """A change delivered by a reflector's thread: handled in the loop, in order."""
        loop = self.scheduler.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.changed, event_type, body, source)

    def changed(self, event_type: str, body: dict[str, Any], source: Source) -> None:
        """A change of a run (called in the loop)."""
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if event_type == "DELETED" or (self.wanted(namespace, name) and "spec" in body):
            run_event(self.scheduler, self.bodies, event_type, body)
        else:
            wake_parent(self.scheduler, body)
        if event_type != "DELETED":
            self._label(namespace, name, body, source)

    def _label(self, namespace: str, name: str, body: Mapping[str, Any], source: Source) -> None:
        meta = body.get("metadata") or {}
        shard = run_shard_label(namespace, name, self.count)
        if (meta.get("labels") or {}).get(s.LABEL_SHARD) == shard or meta.get("deletionTimestamp"):
            return
        if source.shard is None:  # a stray, or a child in no shard of this count
            if not self.wanted(namespace, name):
                return  # the replica that follows its shard labels it
            if (body.get("status") or {}).get("phase") not in FINISHED:
                return  # its pass labels it, with the run finalizer
        key = (namespace, name)
        if key in self.relabelling or not meta.get("uid"):
            return
        self.relabelling.add(key)
        self.scheduler.spawn(self._relabel(key, str(meta["uid"]), shard))

    async def _relabel(self, key: tuple[str, str], uid: str, shard: str) -> None:
        try:
            await asyncio.to_thread(self.ledger.relabel, *key, uid, shard)
            log.info("labelled run %s/%s with its shard %s", *key, shard)
        except Exception as error:
            ctx = {"agentrun": {"run": f"{key[0]}/{key[1]}"}}
            logged(log, "label", "labelling the run with its shard", error,
                   "it stays among the strays, which every replica watches", ctx)  # fmt: skip
        finally:
            self.relabelling.discard(key)


class RunSources:
    """The reflector of each source of runs a sharded replica watches, into one
    :class:`~agentrun.observation.runs.RunView` that hands each change to a
    :class:`RunWatch` (the Informer's ``runs``)."""

    def __init__(
        self,
        watch: RunWatch,
        custom: Any,
        listed: Callable[[str | None], None],
        relisted: Callable[[str], None],
        retried: Callable[[str], None],
    ) -> None:
        """``custom``: a CustomObjectsApi; ``listed``: told when the strays of a namespace
        have listed (/readyz); ``relisted``, ``retried``: as for every reflector."""
        self.view = RunView(watch.deliver, watch.ledger.read, watch.wanted, listed)
        self.custom = custom
        self.relisted = relisted
        self.retried = retried
        held = watch.bodies.get if watch.bodies is not None else (lambda namespace, name: None)
        self.decoder = RunEvents(held, watch.wanted)

    def reflector(self, source: Source) -> Reflector:
        return RunReflector(
            self.view,
            source,
            _runs_call(self.custom, source.namespace),
            lambda namespace, name, uid: None,
            label_selector=source.label_selector(),
            relisted=self.relisted,
            retried=self.retried,
            loads=self.decoder.loads,
        )

    def followed(self) -> None:
        self.view.followed()


def _runs_call(custom: Any, namespace: str | None) -> ListCall:
    """The list (and watch) call of AgentRuns in ``namespace``, or in all namespaces."""

    def call(**kwargs: Any) -> Any:
        if namespace is None:
            return custom.list_cluster_custom_object(m.GROUP, m.VERSION, m.PLURAL, **kwargs)
        return custom.list_namespaced_custom_object(
            m.GROUP, m.VERSION, namespace, m.PLURAL, **kwargs
        )

    return call
