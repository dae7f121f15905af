"""The working state of one reconcile pass, which every part of the state machine writes to.

:class:`Builder` holds what a pass reads (the run, the observed Jobs, the clock) and the status
it derives, and collects what the pass decides: transitions, each also an Event when a person
watching the run acts on it (:func:`posts_event`); actions to run before and after the status
is committed; timers; and why the run must stop (``halt``). Observing attempts, carrying
results, launching and settling all write through it, and :func:`agentrun.core.machine.reconcile`
turns it into one :class:`~agentrun.core.machine.Decision` at the end of the pass.

Also here: :class:`CoreConfig`, the machine's tunables (the builder carries them), and what
keeps a text within a status field's length (:func:`truncate`).

Imports no other module of the machine: :mod:`.arguments`, :mod:`.settle`, :mod:`.launch`,
:mod:`.carried` and :mod:`.attempts` build on it, and :mod:`.machine` on all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import agent_budget, agent_loop, agent_output
from agentrun.core.actions import Action, EmitEvent
from agentrun.core.envelope import clean
from agentrun.core.observed import Observed

MESSAGE_LIMIT = 512
REASON_LIMIT = 128
"""StepError.reason's maxLength; reasons also become condition and transition reasons."""
USER_LIMIT = 253


@dataclass(frozen=True)
class CoreConfig:
    """Tunables of the state machine (operator settings, not user API)."""

    inline_result_limit: int = 256
    """Results up to this many bytes are kept in status; larger ones in a ConfigMap."""
    history_limit: int = m.MAX_HISTORY
    jitter_seed: int = 0
    job_deletion_grace_seconds: int = 30
    step_timeout_grace_seconds: int = 30
    """After a step's timeout plus this, the core stops waiting for the Job's own deadline."""
    running_after_seconds: int = 2
    """A step moves from Launching to Running once its Job has been active this long: a
    shorter step goes from Launching straight to its outcome, one status write fewer."""
    refusal_grace_seconds: int = 75
    """How long an attempt waits for a refusal of its pod or its Job that may pass (a
    ServiceAccount not made yet, a quota, an overloaded API server) before it fails: long
    enough for the Job controller's sixth try of a pod, about 63 s after its first (its
    backoff starts at 1 s and doubles up to 60 s), short enough that a refusal that lasts
    fails the step within a minute or two."""
    agent: agent_loop.AgentConfig = field(default_factory=agent_loop.AgentConfig)
    """Settings of the agent loop (model turns' image and command)."""


def truncate(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` fit for status: valid Unicode, at most ``limit`` characters."""
    if len(text) <= limit:
        return clean(text)
    return clean(text[: limit - 1]) + "…"


NOTABLE_STEP_PHASES = frozenset({SP.WAITING_FOR_APPROVAL, SP.BACKING_OFF, SP.FAILED})
NOTABLE_RUN_PHASES = m.TERMINAL_RUN_PHASES | {m.RunPhase.SUSPENDED}
NOTABLE_REASONS = frozenset({"ApprovalRequested", "Rejected", "ApprovalExpired", "ArgsChanged"})


def posts_event(transition: m.Transition) -> bool:
    """Whether the operator posts an Event for ``transition`` (see :func:`_notable`)."""
    t = transition
    return _warns(t.to_phase, t.reason) or _notable(t.step, t.to_phase, t.reason, t.by)


WARNING_REASONS = frozenset({agent_budget.USAGE_NOT_REPORTED, agent_output.MODEL_FALLBACK})
"""Reasons of transitions that post a Warning Event besides failures, ``...Exceeded`` and
``...Refused``: what the run's creator must hear of though the run goes on."""


def _warns(new: str, reason: str) -> bool:
    return (
        new in {SP.FAILED, m.RunPhase.FAILED}
        or reason.endswith(("Exceeded", "Refused"))
        or reason in WARNING_REASONS
    )


def _notable(step: str | None, new: str, reason: str, by: str | None) -> bool:
    """Whether a transition is worth an Event: what a person watching the run acts on (a
    failed attempt, an approval asked for or decided, a person's own action, the run's end or
    pause). Every transition is in status.history and the audit record either way; routine
    ones (Launching, Running, Succeeded of a step) post no Event, which saves a write each."""
    if by is not None or reason in NOTABLE_REASONS:
        return True
    if step is None:
        return new in NOTABLE_RUN_PHASES
    return new in NOTABLE_STEP_PHASES


def floor_seconds(t: datetime) -> datetime:
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).replace(microsecond=0)


@dataclass
class Halt:
    reason: str
    message: str


@dataclass
class Builder:
    """Mutable working state of one reconcile."""

    run: m.AgentRun
    observed: Observed
    now: datetime
    config: CoreConfig
    status: m.AgentRunStatus
    steps: dict[str, m.StepStatus]
    closed: dict[str, m.StepStatus] = field(default_factory=dict)
    """Steps of a turn this pass closed, taken out of ``steps``: their outcomes are in the
    turn's transcript record, written before this pass's status, so their Jobs are let go as
    those of steps finished in this pass are (agentrun.core.settle.apply_retention)."""
    transitions: list[m.Transition] = field(default_factory=list)
    events: list[EmitEvent] = field(default_factory=list)
    before: list[Action] = field(default_factory=list)
    after: list[Action] = field(default_factory=list)
    later: list[Action] = field(default_factory=list)
    """After-commit actions that no one waits for yet (a later turn's Job made ahead of it):
    carried out after :attr:`after`, so that the current turn's launch and request go first."""
    timers: list[datetime] = field(default_factory=list)
    halt: Halt | None = None

    # -- recording -------------------------------------------------------------------------

    def record(
        self,
        step: str | None,
        old: str | None,
        new: str,
        reason: str,
        msg: str,
        by: str | None = None,
    ) -> None:
        seq = (self.status.history_seq or 0) + 1
        self.status.history_seq = seq
        self.transitions.append(
            m.Transition(
                at=self.now,
                step=step,
                from_phase=old,
                to_phase=new,
                reason=reason,
                message=truncate(msg, 256) or None,
                by=truncate(by, USER_LIMIT) if by is not None else None,
                seq=seq,
            )
        )
        warning = _warns(new, reason)
        if warning or _notable(step, new, reason, by):
            self.events.append(EmitEvent("Warning" if warning else "Normal", reason, truncate(msg)))

    def move(
        self, st: m.StepStatus, phase: SP, reason: str, msg: str, by: str | None = None
    ) -> None:
        if st.phase == phase:
            st.message = truncate(msg)
            return
        old = st.phase
        st.phase = phase
        st.message = truncate(msg)
        self.record(st.name, old, phase, reason, f"step {st.name}: {msg}", by)

    def stop(self, reason: str, message: str) -> None:
        if self.halt is None:
            self.halt = Halt(reason, message)

    def timer(self, at: datetime | None) -> None:
        if at is not None:
            self.timers.append(at)


def all_steps(b: Builder) -> list[m.Step]:
    """The plan's steps and, in an agent run, the current turn's (model turn, tool calls)."""
    return [*b.run.spec.plan.steps, *agent_loop.current_steps(b, b.config.agent)]
