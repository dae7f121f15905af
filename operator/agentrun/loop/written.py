"""The context documents this process wrote, kept so that it does not read them back.

An agent run's turn stores its context in a ConfigMap named for the turn and the document's
digest (:func:`agentrun.core.turns.context_name`), and the next passes read it twice: the pass
that sends the turn's request (:mod:`agentrun.loop.turn_requests`) and the pass that closes the
turn (the core's ``_previous_context``). A document reaches the context limit (64 KiB by
default) after a few hundred turns, so each read is a GET of that much and its decoding.
:class:`Written` keeps the data of each context ConfigMap this process created (a create that
succeeded: one that found the name taken keeps nothing, and the ConfigMap is read as before);
both reads take it from here when it is, and from the API server otherwise (after a restart,
or once it was dropped).

What is kept is what the operator wrote under a name that stands for its content, and it is
checked against the digest committed in status where it is used, as a read is: someone who
changes the ConfigMap afterwards changes what ``kubectl agentrun transcript`` shows, never
what the next turn is sent. Bounded by :data:`MAX_BYTES` of text, the least recently used
dropped first; an entry is a few times its text in memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

MAX_BYTES = 4 * 1024 * 1024
"""Most characters of ConfigMap data kept (a context at the 64 KiB limit: 64 of them)."""


class Written:
    """ConfigMap data this process created, by namespace and name. Safe across threads."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._data: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()
        self._bytes = 0

    def remember(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """``data`` is what ConfigMap ``name`` was created with."""
        kept = dict(data)
        size = _size(kept)
        with self._lock:
            self._drop((namespace, name))
            if size > self.max_bytes:
                return
            self._data[(namespace, name)] = kept
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._data)))

    def get(self, namespace: str, name: str) -> dict[str, str] | None:
        """The data ConfigMap ``name`` was created with by this process, if still kept."""
        with self._lock:
            kept = self._data.get((namespace, name))
            if kept is None:
                return None
            self._data.move_to_end((namespace, name))
            return dict(kept)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._drop((namespace, name))

    @property
    def size(self) -> int:
        """Characters kept."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def _drop(self, key: tuple[str, str]) -> None:
        kept = self._data.pop(key, None)
        if kept is not None:
            self._bytes -= _size(kept)


def _size(data: Mapping[str, str]) -> int:
    return sum(len(k) + len(v) for k, v in data.items())
