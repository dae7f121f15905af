"""Refusals that may pass: the API server's refusal of a step's pod, its Job or a sub-agent's
child run that the next try may not meet (a ServiceAccount not made yet, a quota, an
overloaded API server), and how long an attempt waits them out before it fails.

Imports :mod:`.builder` and :mod:`.actions` only: :mod:`.attempts` and :mod:`.children` build on it.
"""

from __future__ import annotations

from datetime import timedelta

from agentrun.api import models as m
from agentrun.core.actions import EmitEvent
from agentrun.core.builder import Builder, floor_seconds, truncate

PASSING_REFUSALS = (
    "error looking up service account",  # the ServiceAccount is not made yet
    "exceeded quota: ",  # ResourceQuota: other pods or Jobs of the namespace may end
    "Timeout: ",  # the API server's own timeout
    "request timed out",
    "connection reset by peer",
    "connection refused",
    "the server is currently unable to handle the request",
    "Too many requests",
    "etcdserver: ",
    "Internal error occurred: ",
)
"""The API server's words (as it writes them) in a refusal that may pass on its own: the Job
controller keeps trying to create a refused pod (after 1 s, doubling up to a minute), and the
operator a refused Job, so the attempt waits for them. Any other refusal (Pod Security, a
LimitRange, a quota's missing limits, an invalid Job) is refused the same way each time and
fails the attempt at once. Matched as written, so that a key or value of the user's own
quoted in a refusal (an env var named TIMEOUT) is not taken for one."""


CREATE_RETRY_SECONDS = 5
"""How often the create of an attempt's Job is tried again while the API server refuses it for
a reason that may pass (a quota on Jobs)."""


def refusal_may_pass(message: str) -> bool:
    """Whether the API server's refusal of a step's pod or Job (in its own words) may pass on
    its own: a ServiceAccount not made yet, a quota other pods or Jobs use up, the API server
    or etcd overloaded or unreachable (:data:`PASSING_REFUSALS`)."""
    return any(words in message for words in PASSING_REFUSALS)


def refusal_waits(b: Builder, st: m.StepStatus, message: str, note: str, reason: str) -> bool:
    """Whether the attempt still waits out a refusal of its pod or its Job that may pass
    (:func:`refusal_may_pass`): for ``refusal_grace_seconds`` from the attempt's intent
    (``attemptStartedAt``, this operator's clock). The step's message says so (``note``: the
    same words on every pass, so one status write), a Warning Event (``reason``, the one the
    attempt fails with, and the API's words) tells it once, and a timer brings the pass that
    fails the attempt if it is still refused then; a pod or Job made meanwhile ends the
    refusal."""
    if not refusal_may_pass(message):
        return False
    started = st.attempt_started_at
    since = min(floor_seconds(started), b.now) if started else b.now
    due = since + timedelta(seconds=b.config.refusal_grace_seconds)
    if b.now >= due:
        return False
    says = truncate(f"{note} until {due.isoformat()}, then the attempt fails")
    if st.message != says:  # the first pass that sees it (the message is committed with it)
        text = f"step {st.name}, attempt {st.attempt}: {says}: {message}"
        b.events.append(EmitEvent("Warning", reason, truncate(text)))
    st.message = says
    b.timer(due)
    return True


def create_refusal_waits(
    b: Builder, st: m.StepStatus, what: str, message: str, reason: str
) -> bool:
    """:func:`refusal_waits` for the create of ``what`` (a Job, a child run), which the
    operator itself tries again: every :data:`CREATE_RETRY_SECONDS` (a timer brings the pass
    that does) while the attempt waits."""
    note = (
        f"the API server refuses to create {what} for now ({_gist(message)}); the operator "
        f"tries again every {CREATE_RETRY_SECONDS} s"
    )
    if not refusal_waits(b, st, message, note, reason):
        return False
    b.timer(b.now + timedelta(seconds=CREATE_RETRY_SECONDS))
    return True


def _gist(message: str) -> str:
    """A refusal's reason without what changes from one try to the next (a quota's counts):
    ``jobs.batch "x" is forbidden: exceeded quota: q, requested: ...`` gives ``exceeded
    quota: q``."""
    reason = message.rsplit("forbidden: ", 1)[-1]
    return truncate(reason.split(", requested:", 1)[0], 120)
