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

Beside the newest of them (:data:`MAX_DOCUMENT_BYTES` of text) it also keeps the document as
the core stored it (:class:`agentrun.core.context.Stored`), given to the core with the parts
(``Observed.contexts``): the pass that closes the turn continues from it rather than parsing
the parts again, when they are exactly the parts it was stored as.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from agentrun.core.context import Stored

MAX_BYTES = 4 * 1024 * 1024
"""Most characters of ConfigMap data kept (a context at the 64 KiB limit: 64 of them)."""
MAX_DOCUMENT_BYTES = 1024 * 1024
"""Most characters of data whose document is kept too (:class:`Stored`; a few times its
text in memory, beside the data): the newest contexts, about ten at the 64 KiB limit (a
turn's context is read by the pass that closes the turn, soon after it was written)."""


class Written:
    """ConfigMap data this process created, by namespace and name. Safe across threads."""

    def __init__(
        self, max_bytes: int = MAX_BYTES, max_document_bytes: int = MAX_DOCUMENT_BYTES
    ) -> None:
        self.max_bytes = max_bytes
        self.max_document_bytes = max_document_bytes
        self._lock = threading.Lock()
        self._data: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()
        self._bytes = 0
        self._documents: OrderedDict[tuple[str, str], tuple[Stored, int]] = OrderedDict()
        """The documents kept, with the size of their data."""
        self._document_bytes = 0

    def remember(
        self, namespace: str, name: str, data: Mapping[str, str], stored: Stored | None = None
    ) -> None:
        """``data`` is what ConfigMap ``name`` was created with; ``stored``, the context
        document it holds, if known."""
        kept = dict(data)
        size = _size(kept)
        with self._lock:
            self._drop((namespace, name))
            if size > self.max_bytes:
                return
            self._data[(namespace, name)] = kept
            self._bytes += size
            if stored is not None and size <= self.max_document_bytes:
                self._documents[(namespace, name)] = (stored, size)
                self._document_bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._data)))
            while self._document_bytes > self.max_document_bytes:
                self._drop_document(next(iter(self._documents)))

    def get(self, namespace: str, name: str) -> dict[str, str] | None:
        """The data ConfigMap ``name`` was created with by this process, if still kept."""
        with self._lock:
            kept = self._data.get((namespace, name))
            if kept is None:
                return None
            self._data.move_to_end((namespace, name))
            return dict(kept)

    def document(self, namespace: str, name: str) -> Stored | None:
        """The context document ConfigMap ``name`` holds as the core stored it, if still
        kept (the core takes it only for the parts it was stored as)."""
        with self._lock:
            kept = self._documents.get((namespace, name))
            if kept is None:
                return None
            self._documents.move_to_end((namespace, name))
            return kept[0]

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
        self._drop_document(key)

    def _drop_document(self, key: tuple[str, str]) -> None:
        kept = self._documents.pop(key, None)
        if kept is not None:
            self._document_bytes -= kept[1]


def _size(data: Mapping[str, str]) -> int:
    return sum(len(k) + len(v) for k, v in data.items())
