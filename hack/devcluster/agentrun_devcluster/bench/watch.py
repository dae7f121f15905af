"""Waiting for many objects at once: one watch per case, as ``kubectl wait`` would use.

A :class:`Tracker` lists, then watches, the objects of one kind in one namespace with one
label, and records the moment (``time.monotonic()``) it first sees each one done. Callers
wait on a name or on all of them; nobody polls the API server. The watch is read as raw JSON
lines (the client's model deserialization would cost the benchmark more CPU than the
operator it measures).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["Tracker", "job_finished", "run_finished"]

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]
ListCall = Callable[..., Any]


def job_finished(job: Obj) -> bool:
    """A Job's Complete or Failed condition is True."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return True
    return False


def run_finished(run: Obj) -> bool:
    """An AgentRun is in a terminal phase."""
    return (run.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled")


class Tracker:
    """Records when each watched object is first seen done.

    ``list_call(**kwargs)`` is a generated client list function bound to the namespace
    (``functools.partial(batch.list_namespaced_job, ns)``); it is called with
    ``watch``/``resource_version``/``label_selector`` and ``_preload_content=False``.
    """

    def __init__(
        self, list_call: ListCall, done: Callable[[Obj], bool], label_selector: str
    ) -> None:
        self._list = list_call
        self._done = done
        self._selector = label_selector
        self._cond = threading.Condition()
        self.done_at: dict[str, float] = {}
        self.final: dict[str, Obj] = {}
        """The object as first seen done."""
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> Tracker:
        """List (so nothing done before the watch is missed), then watch in a thread."""
        listed = self._list(label_selector=self._selector, _preload_content=False)
        body = json.loads(listed.data)
        for item in body.get("items") or []:
            self._see(item)
        version = str((body.get("metadata") or {}).get("resourceVersion", ""))
        self._thread = threading.Thread(
            target=self._watch, args=(version,), name="bench-watch", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _see(self, obj: Obj) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if not name or name in self.done_at or not self._done(obj):
            return
        with self._cond:
            self.done_at.setdefault(name, time.monotonic())
            self.final.setdefault(name, obj)
            self._cond.notify_all()

    def _watch(self, version: str) -> None:
        while not self._stopped.is_set():
            try:
                self._response = self._list(
                    label_selector=self._selector,
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=600,
                    _preload_content=False,
                )
                try:
                    for line in self._response:
                        if self._stopped.is_set():
                            return
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            version = ""  # too old: start from now, after a fresh list
                            break
                        meta = obj.get("metadata") or {}
                        version = str(meta.get("resourceVersion", version))
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._see(obj)
                finally:
                    self._response.release_conn()
                if not version:
                    listed = self._list(label_selector=self._selector, _preload_content=False)
                    body = json.loads(listed.data)
                    for item in body.get("items") or []:
                        self._see(item)
                    version = str((body.get("metadata") or {}).get("resourceVersion", ""))
            except Exception as error:
                if self._stopped.is_set():
                    return
                log.warning("watch failed, resuming: %s", error)
                self.error = error
                time.sleep(0.5)

    def wait(self, name: str, timeout: float) -> float | None:
        """When ``name`` was seen done; None if it was not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while name not in self.done_at:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))
            return self.done_at[name]

    def wait_all(self, names: Iterable[str], timeout: float) -> bool:
        """Whether all of ``names`` were seen done within ``timeout`` seconds."""
        wanted = set(names)
        deadline = time.monotonic() + timeout
        with self._cond:
            while not wanted <= self.done_at.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True
