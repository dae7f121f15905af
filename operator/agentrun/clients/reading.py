"""Reading a run: its history, a step's result or an agent run's answer, and waiting for it.
One implementation for :class:`agentrun.clients.typed.AgentRunClient` and ``kubectl agentrun``.

* History: the run's audit record (the ConfigMaps the run owns, told from imitations by
  :func:`agentrun.access.audit.select`), followed by the transitions of ``status.history`` the
  record does not hold yet; :meth:`History.problems` checks the record's hash chain against
  the head anchored in status.
* Results: inline from status, or from the ConfigMap status refers to (when it was too large),
  with the digest the step committed, so that the caller can tell whether it was changed since.
* Waiting: the run read again until its phase is one of those asked for or it has finished.

The API calls are the caller's (``read``, ``list_config_maps``, ``get_config_map``), so each
client keeps its own connection; each raises ``ApiException`` when the API server refuses.
What cannot be read is :class:`Unreadable`, whose message says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.access import audit
from agentrun.api import models as m
from agentrun.core import naming
from agentrun.execution import objects
from agentrun.kubeapi import api_message

ReadRun = Callable[[], m.AgentRun]
"""The run as stored now."""
ListConfigMaps = Callable[[str], list[dict[str, Any]]]
"""The ConfigMaps matching a label selector, as plain JSON."""
GetConfigMap = Callable[[str], dict[str, Any] | None]
"""A ConfigMap as plain JSON, None when there is none."""


class Unreadable(Exception):
    """A result or an answer that cannot be read; ``status`` is the API server's HTTP status
    when it refused (or 404 for a ConfigMap that is gone)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotAStep(Unreadable):
    """No step of the run's plan has that name; ``steps`` are the plan's."""

    def __init__(self, run: m.AgentRun, step: str) -> None:
        self.steps = [s.name for s in run.spec.plan.steps]
        super().__init__(
            f"step '{step}' is not a step of agentrun/{run.metadata.name} in namespace "
            f"'{run.metadata.namespace}' (its steps: {', '.join(self.steps)})"
        )


class NoResult(Unreadable):
    """The step has committed no result (yet); ``phase`` is where it stands."""

    def __init__(self, run: m.AgentRun, step: str, st: m.StepStatus | None) -> None:
        self.phase = str(st.phase) if st else "not evaluated yet"
        summary = f"; its summary: {st.summary}" if st and st.summary else ""
        super().__init__(
            f"step '{step}' of agentrun/{run.metadata.name} has no result (phase {self.phase})"
            f"{summary}"
        )


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A result (or an answer) as read, and the digest committed with it."""

    content: str
    digest: str | None
    """None for a result committed without one."""
    ref: m.ResultRef | None = None
    """Where it was read from when it is not inline in status."""

    @property
    def intact(self) -> bool:
        """Whether the content is what was committed (True when no digest was)."""
        return not self.digest or naming.sha256_text(self.content) == self.digest


def step_result(run: m.AgentRun, step: str, get_config_map: GetConfigMap) -> Stored:
    """The whole result ``step`` of ``run`` committed; :class:`NotAStep`, :class:`NoResult`
    or :class:`Unreadable` when there is none to read."""
    if run.step(step) is None:
        raise NotAStep(run, step)
    steps = run.status.steps if run.status else None
    st = next((s for s in steps or [] if s.name == step), None)
    if st is None or (st.result is None and st.result_ref is None):
        raise NoResult(run, step, st)
    return _stored(run, step, st.result, st.result_ref, st.result_digest, get_config_map)


def answer(run: m.AgentRun, get_config_map: GetConfigMap) -> Stored:
    """The answer an agent run's model gave; :class:`Unreadable` while there is none."""
    agent = run.status.agent if run.status else None
    if agent is None or (agent.answer is None and agent.answer_ref is None):
        phase = (run.status.phase if run.status else None) or "not started"
        raise Unreadable(f"agentrun/{run.metadata.name} has no answer (yet): phase {phase}")
    ref = agent.answer_ref
    return _stored(run, "the answer", agent.answer, ref, agent.answer_digest, get_config_map)


def _stored(
    run: m.AgentRun,
    step: str,
    inline: str | None,
    ref: m.ResultRef | None,
    digest: str | None,
    get_config_map: GetConfigMap,
) -> Stored:
    if inline is not None:
        return Stored(inline, digest)
    assert ref is not None
    return Stored(_referenced(run, step, ref, get_config_map), digest, ref)


def _referenced(run: m.AgentRun, step: str, ref: m.ResultRef, get_config_map: GetConfigMap) -> str:
    where = f"{ref.kind} '{ref.name}' (key {ref.key})"
    if ref.kind != "ConfigMap":
        raise Unreadable(
            f"the result of step '{step}' is kept in a {where}; only ConfigMaps can be read"
        )
    try:
        cm = get_config_map(ref.name)
    except ApiException as error:
        raise Unreadable(
            f"cannot read the result of step '{step}' from {where}: {api_message(error)}",
            error.status,
        ) from None
    if cm is None:
        raise Unreadable(
            f"the result of step '{step}' of agentrun/{run.metadata.name} is kept in {where}, "
            f"which does not exist in namespace '{run.metadata.namespace}'",
            404,
        )
    data = cm.get("data") or {}
    if ref.key not in data:
        raise Unreadable(f"{where} has no key '{ref.key}' (keys: {', '.join(sorted(data))})")
    return str(data[ref.key])


# -- history ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class History:
    """A run's audit record as read, and the run read after it."""

    run: m.AgentRun
    """Read after the record: the head anchored in its status is never older than the record
    read."""
    record: list[dict[str, Any]] = field(default_factory=list)
    """The record's entries, oldest first, with their hash chain (``prev``, ``hash``)."""
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """ConfigMaps labelled as the record that are not part of it, and why."""

    @property
    def status_history(self) -> list[dict[str, Any]]:
        """``status.history`` as on the wire: the last transitions."""
        return [t.to_wire() for t in (self.run.status.history if self.run.status else None) or []]

    @property
    def anchor(self) -> m.AuditStatus:
        return (self.run.status.audit if self.run.status else None) or m.AuditStatus()

    @property
    def timeline(self) -> list[Mapping[str, Any]]:
        """Every transition, oldest first: the record, then what only status.history holds."""
        return merge_timeline(self.record, self.status_history)

    def problems(self) -> list[str]:
        """What is wrong with the record (empty when it is intact)."""
        return verify_record(self.record, self.status_history, self.run)


def history(read: ReadRun, list_config_maps: ListConfigMaps) -> History:
    """The run's audit record and the run as read after it."""
    run = read()
    found = list_config_maps(objects.owned_by(run.metadata.uid, "audit"))
    run = read()
    status = run.status or m.AgentRunStatus()
    anchor = status.audit or m.AuditStatus()
    latest = anchor.head_seq if anchor.head_seq is not None else status.history_seq
    # Only the run's own chunks count: anyone who may write ConfigMaps can add the labels.
    chosen = audit.select(
        found, audit.record_prefix(run.metadata.name, run.metadata.uid), run.metadata.uid, latest
    )
    return History(run, chosen.entries, chosen.ignored)


def merge_timeline(
    record: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The audit record, followed by the transitions in status.history it does not hold yet
    (the operator appends to the record after it commits the status)."""
    last = max((int(e.get("seq") or 0) for e in record), default=0)
    newer = [h for h in history if int(h.get("seq") or 0) > last]
    return [*record, *sorted(newer, key=lambda h: int(h.get("seq") or 0))]


def verify_record(
    record: Sequence[dict[str, Any]], history: Sequence[dict[str, Any]], run: m.AgentRun
) -> list[str]:
    """The hash chain's problems, whether it ends at the head anchored in status (through the
    committed transitions not appended yet), and what status says the record should hold and
    does not."""
    problems = audit.verify(record, run.metadata.uid)
    problems.extend(record_disagreements(record, history))
    status = run.status or m.AgentRunStatus()
    anchor = status.audit or m.AuditStatus()
    if anchor.head_seq is not None and anchor.head_hash:
        problems.extend(
            audit.verify_anchored(
                record, status.history or [], run.metadata.uid, anchor.head_seq, anchor.head_hash
            )
        )
    recorded = anchor.recorded_seq
    last = max((int(e.get("seq") or 0) for e in record if isinstance(e.get("seq"), int)), default=0)
    if recorded > last:
        problems.append(
            f"status.audit.recordedSeq is {recorded} but the record ends at entry {last}: "
            "entries were removed"
        )
    return problems


def record_disagreements(
    record: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Transitions that status.history and the audit record both hold but tell differently."""
    by_seq = {e.get("seq"): e for e in record}
    problems = []
    for h in history:
        seq = h.get("seq")
        e = by_seq.get(seq)
        if not seq or e is None:
            continue
        fields = [k for k in ("at", "step", "from", "to", "reason", "by") if h.get(k) != e.get(k)]
        if fields:
            problems.append(f"entry {seq} disagrees with status.history on {', '.join(fields)}")
    return problems


# -- waiting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waited:
    """Where a wait ended: the run as last read, and whether the time ran out first."""

    run: m.AgentRun
    timed_out: bool = False

    @property
    def phase(self) -> m.RunPhase | None:
        return self.run.status.phase if self.run.status else None


def wait(read: ReadRun, phases: Collection[m.RunPhase], timeout: float, interval: float) -> Waited:
    """Read the run every ``interval`` seconds until its phase is one of ``phases`` or a
    terminal one (it will not change again), for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        waited = Waited(read())
        if waited.phase in phases or waited.phase in m.TERMINAL_RUN_PHASES:
            return waited
        left = deadline - time.monotonic()
        if left <= 0:
            return Waited(waited.run, timed_out=True)
        time.sleep(min(interval, left))
