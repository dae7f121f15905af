"""The operator's side of the property tests: passes of the reconciler over a
:class:`~tests.support.sim.Sim`, with the faults a real operator meets. Each test adds the
cluster's side (Jobs finishing, people approving) and its own invariants.

The events:

* ``tick``: a pass that reads, decides, commits and carries out what follows the commit;
* ``duplicate``: the same, and what follows the commit carried out twice (a retried request);
* ``stale``: a pass that decides from an older snapshot (its commit meets a conflict);
* ``crash_before_commit``: the pass dies after what precedes the commit, before the commit;
* ``crash_after_commit``: it dies part way through what follows the commit;
* ``pause``: it commits and stalls before carrying out the rest, until ``resume`` (or the
  clock moving on: :meth:`Passes.resume`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentrun.api import models as m
from agentrun.core import CreateJob

from .sim import Sim

PASS_EVENTS = ("tick", "duplicate", "stale", "crash_after_commit", "crash_before_commit", "pause")
"""The event kinds :meth:`Passes.handle` takes (``resume`` too)."""
FAULTS = ("stale", "crash_after_commit", "crash_before_commit", "duplicate", "pause", "resume")
"""The events of a faulty operator, one each, for a test's mix of events (with ``tick``s)."""


class Passes:
    """Runs the operator's events over ``sim``; ``execute`` carries out actions after a
    commit (checking them first)."""

    def __init__(self, sim: Sim, execute: Callable[[Sequence[Any]], None]) -> None:
        self.sim = sim
        self.execute = execute
        self.snapshots = [sim.snapshot()]
        self.paused: list[Any] = []

    def handle(self, kind: str, seed: int) -> bool:
        """Carry out event ``kind``; False if it is not the operator's."""
        if kind == "resume":
            self.resume()
            return True
        if kind not in PASS_EVENTS:
            return False
        sim = self.sim
        snap = self.snapshots[seed % len(self.snapshots)] if kind == "stale" else sim.snapshot()
        decision, version = sim.decide(snap)
        if kind == "crash_before_commit":
            for action in decision.before_commit:
                sim.apply(action)
        elif sim.commit(decision, version):
            actions = list(decision.after_commit)
            if kind == "crash_after_commit":
                actions = actions[: seed % (len(actions) + 1)]
            if kind == "pause":
                self.paused.extend(actions)
            else:
                self.execute(actions)
                if kind == "duplicate":
                    self.execute(actions)
        self.snapshots.append(sim.snapshot())
        return True

    def resume(self) -> None:
        """A stalled pass carries out what it had left."""
        self.execute(self.paused)
        self.paused.clear()


def assert_approved(sim: Sim, action: CreateJob, what: str = "gated step") -> None:
    """A Job of a step that requires approval is created only with an approval of exactly
    its arguments."""
    name = action.step.name
    if action.step.approval != m.ApprovalMode.REQUIRED:
        return
    assert any(
        a.step == name
        and a.args_hash == action.args_hash
        and a.decision == m.ApprovalDecision.APPROVE
        for a in sim.run.spec.approvals or []
    ), f"{what} {name} launched without a matching approval"
