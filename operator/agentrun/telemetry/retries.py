"""Retries the operator makes as a matter of course while the API server is away, cannot
serve, or asks for a wait: each is one warning line in the log, never a traceback, carrying
``retry`` (who tries again) and ``reason`` (:attr:`agentrun.kubeapi.Transient.reason`), and a
count (``agentrun_api_retries_total{by, reason}``).

Whether a failure is one of those is :func:`agentrun.kubeapi.transient`'s to say. The callers
that try again (a pass, a deletion's cleanup, the check of a finished run, the janitor's
sweep, a watch, the shard Leases' tick) call :func:`retried`, and log its
:attr:`~agentrun.kubeapi.Transient.says` with :func:`fields`; those that log nothing else
about the failure call :func:`logged`, which does both. The retries of the kubernetes
client and of kopf are told by their own log lines, which
:class:`agentrun.telemetry.logs.RetryLines` counts and marks the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentrun.kubeapi import UNREACHABLE, Transient, transient
from agentrun.telemetry.logs import CONTEXT, REASON_FIELD, RETRY_FIELD
from agentrun.telemetry.metrics import API_RETRIES

BY = ("pass", "deletion", "check", "janitor", "watch", "shards", "client", "kopf")
"""Who tries again: the values of the metric's ``by`` label and of the log's ``retry``."""


def retried(by: str, error: BaseException) -> Transient | None:
    """``error`` as the API server being away or asking for a wait, counted as a retry by
    ``by`` (one of :data:`BY`); None, and nothing counted, for any other failure (log that
    with its traceback)."""
    found = transient(error)
    if found is not None:
        API_RETRIES.labels(by, found.reason).inc()
    return found


def count(by: str, reason: str = UNREACHABLE) -> None:
    """Count one retry by ``by`` whose error the caller holds no object of (a watch that
    went silent), or that it classified itself."""
    API_RETRIES.labels(by, reason).inc()


def fields(by: str, reason: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``extra`` of a retry's log line: ``extra`` (the operator's log context, if any)
    with the line marked as a retry by ``by`` for ``reason``."""
    context = dict((extra or {}).get(CONTEXT) or {})
    context.update({RETRY_FIELD: by, REASON_FIELD: reason})
    return {**(extra or {}), CONTEXT: context}


def logged(
    log: logging.Logger,
    by: str,
    what: str,
    error: Exception,
    then: str | Callable[[Transient | None], str],
    extra: dict[str, Any] | None = None,
) -> Transient | None:
    """Log the failure ``error`` of ``what`` (e.g. "reconcile") and what follows (``then``,
    or what it says given the failure as :func:`retried` tells it): the API server away or
    asking for a wait is one warning line, counted and marked a retry by ``by``; anything
    else is an error with its traceback. Returns what :func:`retried` said."""
    away = retried(by, error)
    follows = then if isinstance(then, str) else then(away)
    if away is None:
        log.exception("%s failed; %s", what, follows, extra=extra)
    else:
        log.warning("%s %s; %s", what, away.says, follows, extra=fields(by, away.reason, extra))
    return away
