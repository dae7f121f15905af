"""Small pieces of talking to the Kubernetes API that every caller needs done the same way.

Refusals a caller expects and lets pass: many calls have an answer that is not a failure, 404
on a delete (already gone), 409 on a create (already there, e.g. a Job adopted after a crash).
:func:`tolerate` names those statuses at the call site and reports whether one was met; any
other refusal propagates unchanged::

    with tolerate(409) as exists:
        batch.create_namespaced_job(namespace, manifest)
    if exists:
        log.info("adopted")

Also: how a refusal is told to a person (:func:`api_message`), the content types of patches,
the items of a list call as plain JSON, and the guarded patch that removes a finalizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def api_message(error: ApiException) -> str:
    """The API server's own words (the ``message`` of its Status), else the HTTP reason."""
    body = getattr(error, "body", None)
    if body:
        try:
            parsed = json.loads(body)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])
        if isinstance(body, str | bytes):
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            return text.strip()[:500]
    return f"HTTP {error.status} {error.reason or ''}".strip()


@dataclass
class Tolerated:
    """What a :func:`tolerate` block let pass: nothing, or one refusal of the API."""

    error: ApiException | None = None

    @property
    def status(self) -> int | None:
        """The HTTP status of the refusal let pass, None when the call succeeded."""
        return None if self.error is None else int(self.error.status)

    def __bool__(self) -> bool:
        """True when the block met one of the tolerated statuses."""
        return self.error is not None


@contextmanager
def tolerate(*statuses: int) -> Iterator[Tolerated]:
    """Let an ``ApiException`` with one of ``statuses`` pass (recorded in the yielded
    :class:`Tolerated`); re-raise any other."""
    # Imported here: the step runner uses this module and starts without the kubernetes client.
    from kubernetes.client.exceptions import ApiException

    tolerated = Tolerated()
    try:
        yield tolerated
    except ApiException as error:
        if error.status not in statuses:
            raise
        tolerated.error = error


def list_items(response: Any) -> list[dict[str, Any]]:
    """Items of a list call made with ``_preload_content=False``: the API server's own JSON,
    without building the client's typed models (much faster for long lists)."""
    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


def finalizer_removal(finalizers: Sequence[str], finalizer: str) -> list[dict[str, Any]] | None:
    """A JSON patch removing ``finalizer`` from an object whose finalizers were read as
    ``finalizers``, guarded by a ``test`` op so that it fails (422) rather than removing
    another finalizer when the list changed since; None when ``finalizer`` is not there."""
    if finalizer not in finalizers:
        return None
    index = list(finalizers).index(finalizer)
    return [
        {"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]
