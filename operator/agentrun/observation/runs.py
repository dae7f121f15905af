"""The runs a sharded replica watches: its own shards' runs, not every run.

Replicas that share the runs (``AGENTRUN_SHARDS``) each watch, in every watched namespace
(or in all of them), with reflectors of :mod:`agentrun.observation.watches`:

* the runs of each shard they follow, by the run's ``agentrun.dev/shard`` label
  (``<shard>-of-<count>``, :func:`agentrun.core.shards.shard_label`), one watch per shard;
* the runs labelled with no shard of their count (*strays*): a run just created (the label is
  put on by the first write of the replica that holds its shard, with the run finalizer),
  one labelled under another count, or relabelled by someone who may edit runs;
* the runs labelled as some run's sub-agent child (``agentrun.dev/parent-uid``): a child's
  change wakes its parent, whose shard may be another than the child's.

So each event of a labelled run reaches the replica that holds its shard, and no other (but a
child's, which also reaches every replica, decoded only as far as its metadata where its
shard is not followed: :class:`agentrun.loop.run_events.RunEvents`). The label routes watch
events only: a pass reads no decision from it, and a run labelled wrongly is labelled again
(agentrun/loop/run_watch.py).

:class:`RunView` takes the reflectors' lists and events and delivers each change of a run
once, the newest first seen: a run may be in two of these watches at once (a child in its
shard's and the children's; a run moving from the strays' to its shard's), and a DELETED of
one watch is the run leaving that watch's selector as often as the run being deleted (the
API server sends a relabelled object's leaving as DELETED). A DELETED is delivered only when
no other watch here holds the run; when the run may be on its way to a watch here that has
not delivered it yet (it left the strays' or the children's, shows no deletion, and its shard
is followed here) it is read again first, and delivered only if it is gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentrun.observation.view import Obj, Source, metadata
from agentrun.observation.watches import Reflector

log = logging.getLogger("agentrun.observer")

Key = tuple[str, str]
Deliver = Callable[[str, Obj, Source], None]
"""``deliver(event type, run, source)``: ADDED or MODIFIED with the run as it is now, or
DELETED (the run is gone from every watch here) with what was last known of it. Called with
the view's lock held, from a reflector's thread: it must only hand the change on."""
Read = Callable[[str, str], Obj | None]
"""The run ``namespace/name`` as stored now, or None when there is none."""
Wanted = Callable[[str, str], bool]
"""Whether the shard of run ``namespace/name`` is followed here."""


def _key(obj: Mapping[str, Any]) -> Key:
    meta = metadata(obj)
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _version(obj: Mapping[str, Any]) -> int:
    try:
        return int(metadata(obj).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class RunView:
    """Which runs each run watch holds, and what was delivered of each (see the module
    docstring). Thread-safe."""

    def __init__(
        self,
        deliver: Deliver,
        read: Read,
        wanted: Wanted,
        listed: Callable[[str | None], None] = lambda namespace: None,
    ) -> None:
        """``listed(namespace)`` is told when the strays' watch of ``namespace`` (None: all
        namespaces) has listed for the first time: every run there not yet labelled is
        known."""
        self.deliver = deliver
        self.read = read
        self.wanted = wanted
        self.listed = listed
        self._lock = threading.Lock()
        self._members: dict[Source, dict[Key, int]] = {}
        """Each live source's runs and the version it last showed of each."""
        self._delivered: dict[Key, tuple[int, bool]] = {}
        """The newest version delivered of each run held by some source, and whether it was
        taken: delivered whole (with its spec, not only its metadata) while its shard was
        followed here."""
        self._retired: set[Source] = set()

    def expect(self, source: Source) -> None:
        with self._lock:
            self._retired.discard(source)
            self._members.setdefault(source, {})

    def replace(self, source: Source, items: Iterable[Obj]) -> list[Obj]:
        """A list of ``source``: its runs become ``items``; each newer than delivered is
        delivered (ADDED), each it held and no source holds now is delivered DELETED."""
        first = False
        with self._lock:
            if source in self._retired:
                return []
            old = self._members.get(source)
            first = old is None or not old
            new = {_key(item): _version(item) for item in items}
            self._members[source] = new
            for item in items:
                self._offer("ADDED", item, source)
            for key in set(old or {}) - set(new):
                self._left(key, {"metadata": {"namespace": key[0], "name": key[1]}}, source)
        if first and source.others is not None:
            self.listed(source.namespace)
        return []

    def apply(
        self, kind: str, event_type: str, obj: Obj, source: Source | None = None
    ) -> Obj | None:
        """One watch event of ``source``; delivers it if it tells something new."""
        if source is None:
            return None
        key = _key(obj)
        if event_type != "DELETED":
            with self._lock:
                if source not in self._retired:
                    self._members.setdefault(source, {})[key] = _version(obj)
                    self._offer(event_type, obj, source)
            return None
        with self._lock:
            if source in self._retired:
                return None
            self._members.setdefault(source, {}).pop(key, None)
            if self._elsewhere(key, source):
                return None
        if self._may_be_moving(obj, source) and self._still_there(obj):
            return None  # its watch here delivers it (or did meanwhile)
        with self._lock:
            self._left(key, obj, source)
        return None

    def run_of(self, kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
        return None  # changes are delivered, not woken by

    def covered_elsewhere(self, source: Source, obj: Obj) -> bool:
        return False  # a DELETED is judged by apply

    def forget(self, source: Source) -> None:
        """``source`` is no longer watched (its shard went elsewhere): each run it held that
        no other source holds is delivered DELETED, and its late events are dropped."""
        with self._lock:
            self._retired.add(source)
            held = self._members.pop(source, {})
            for key in held:
                self._left(key, {"metadata": {"namespace": key[0], "name": key[1]}}, source)

    def followed(self) -> None:
        """The shards followed here changed: each stray (a run not labelled yet) of a shard
        now followed, not taken before (delivered while its shard was not followed, or only
        as far as its metadata), is read and delivered whole, in a thread of its own: the
        strays' watch delivers nothing new of a run that has not changed. A labelled run
        comes with its shard's watch."""
        threading.Thread(target=self._strays_again, name="strays read again", daemon=True).start()

    def _strays_again(self) -> None:
        with self._lock:
            strays = {
                key: source
                for source, runs in self._members.items()
                if source.others is not None and source not in self._retired
                for key in runs
                if not self._delivered.get(key, (0, False))[1]
            }
        for key, source in strays.items():
            if not self.wanted(*key):
                continue
            try:
                body = self.read(*key)
            except Exception as error:
                log.info("could not read run %s/%s again (%s)", *key, error)
                continue
            if body is None:
                continue
            with self._lock:
                if source not in self._retired:
                    self._offer("ADDED", body, source)

    def size(self) -> int:
        """Runs delivered and not gone."""
        with self._lock:
            return len(self._delivered)

    # -- with the lock held ------------------------------------------------------------------

    def _offer(self, event_type: str, obj: Obj, source: Source) -> None:
        key, version = _key(obj), _version(obj)
        taken = "spec" in obj and self.wanted(*key)
        known, known_taken = self._delivered.get(key, (-1, False))
        if known >= version and (known_taken or not taken):
            return  # another watch here delivered it at this version or later
        self._delivered[key] = (version, taken)
        self.deliver(event_type, obj, source)

    def _elsewhere(self, key: Key, source: Source) -> bool:
        return any(
            key in runs
            for other, runs in self._members.items()
            if other != source and other not in self._retired
        )

    def _left(self, key: Key, obj: Obj, source: Source) -> None:
        if self._elsewhere(key, source) or key not in self._delivered:
            return
        del self._delivered[key]
        self.deliver("DELETED", obj, source)

    # -- without it ------------------------------------------------------------------------

    def _may_be_moving(self, obj: Obj, source: Source) -> bool:
        """Whether the run of a DELETED of ``source`` may have left it for a shard's watch
        here that has not delivered it yet: it left the strays' or the children's (not a
        shard's: its holder relabels a run found in the wrong one), shows no deletion, and
        its shard is followed here."""
        if source.shard is not None or metadata(obj).get("deletionTimestamp"):
            return False
        return self.wanted(*_key(obj))

    def _still_there(self, obj: Obj) -> bool:
        """Whether the run of ``obj`` (the same uid) is still stored; a failed read takes it
        for gone (a watch here delivers it again if it is not)."""
        try:
            current = self.read(*_key(obj))
        except Exception as error:
            log.info("could not read run %s/%s again (%s)", *_key(obj), error)
            return False
        return current is not None and metadata(current).get("uid") == metadata(obj).get("uid")


class RunReflector(Reflector):
    """A reflector of a source of runs into a :class:`RunView` (which judges its DELETEDs)."""

    def _moved(self, obj: Obj) -> bool:
        return False
