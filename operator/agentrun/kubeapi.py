"""Refusals of the Kubernetes API that a caller expects and lets pass.

Many calls have an answer that is not a failure: 404 on a delete (already gone), 409 on a create
(already there, e.g. a Job adopted after a crash). :func:`tolerate` names those statuses at the
call site and reports whether one was met; any other refusal propagates unchanged::

    with tolerate(409) as exists:
        batch.create_namespaced_job(namespace, manifest)
    if exists:
        log.info("adopted")
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException


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
