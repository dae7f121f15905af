"""A :class:`~tests.support.sim.Sim` whose committed writes are compared with the status they
were derived from (:func:`agentrun.telemetry.changes.derive`), as the reconciler does after each
successful commit: what the telemetry tests and the tracing tests observe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentrun.api import models as m
from agentrun.core import Decision
from agentrun.telemetry.changes import AttemptEnded, Changes, derive

from .sim import Sim, SimJob


@dataclass
class Recorded:
    """A :class:`Sim` whose every committed write is derived, like the reconciler's passes."""

    sim: Sim
    changes: list[Changes] = field(default_factory=list)

    def tick(self) -> Decision:
        for _ in range(5):
            snapshot = self.sim.snapshot()
            decision, version = self.sim.decide(snapshot)
            if self.sim.commit(decision, version):
                self.changes.append(derive(snapshot[0].status, decision.status))
                for action in decision.after_commit:
                    self.sim.apply(action)
                return decision
        raise AssertionError("could not commit in 5 tries")

    def run_to_end(
        self, outcome: Callable[[SimJob], tuple[bool, str | None]], step_seconds: float = 7
    ) -> None:
        for _ in range(100):
            decision = self.tick()
            if self.sim.status.phase in m.TERMINAL_RUN_PHASES:
                return
            self.sim.advance(step_seconds)
            for job in self.sim.active():
                ok, message = outcome(job)
                self.sim.finish(job.name, ok, message)
            if not self.sim.active() and decision.requeue_after:
                self.sim.advance(decision.requeue_after)
        raise AssertionError(f"the run did not end: {self.sim.status.phase}")

    @property
    def started(self) -> int:
        return sum(c.attempts_started for c in self.changes)

    @property
    def ended(self) -> list[AttemptEnded]:
        return [e for c in self.changes for e in c.attempts_ended]

    def outcomes(self) -> list[tuple[str, int, str]]:
        return [(e.step, e.attempt, e.outcome) for e in self.ended]
