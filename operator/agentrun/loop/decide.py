"""Decide: ask the core (:func:`agentrun.core.reconcile`) what a run needs, with the
configuration it takes from the settings, and read its answer: when the next pass is due.

No I/O: what the core is given was observed before (:mod:`.observe`), what it answers is
committed and carried out after (:mod:`.commit`, :mod:`.act`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import (
    CoreConfig,
    CreateJob,
    Decision,
    Observed,
    agent_loop,
    reconcile,
    refusals,
    turns,
)
from agentrun.execution import jobs

REFUSAL_REQUEUE = 0.1
"""Seconds until the pass that fails an attempt whose Job the API refused."""


def core_config(settings: s.Settings) -> CoreConfig:
    """What the core takes from the operator's settings."""
    return CoreConfig(
        jitter_seed=settings.jitter_seed,
        job_deletion_grace_seconds=settings.job_deletion_grace_seconds,
        running_after_seconds=settings.running_after_seconds,
        refusal_grace_seconds=settings.refusal_grace_seconds,
        agent=agent_loop.AgentConfig(
            llm_image=settings.llm_image,
            llm_command=settings.llm_command,
            turns_ahead=max(0, min(settings.turns_ahead, turns.AHEAD_LIMIT)),
            executor=settings.executor,
        ),
    )


class Decider:
    """The core, with the operator's configuration and clock."""

    def __init__(self, settings: s.Settings, clock: Callable[[], datetime]) -> None:
        self.config = core_config(settings)
        self.clock = clock

    def decide(self, run: m.AgentRun, observed: Observed) -> Decision:
        return reconcile(run, observed, self.clock(), self.config)

    def due_in(self, body: dict[str, Any], found: list[dict[str, Any]]) -> float | None:
        """In memory: seconds until a finished run needs a pass (0: now), None if never. The
        core is asked what it would do with the run and its watched Jobs (unverified: a pass
        verifies them before acting)."""
        run = m.AgentRun.model_validate(body)
        observed = [o for o in (jobs.observe_job(j, None) for j in found) if o is not None]
        decision = self.decide(run, Observed(tuple(observed)))
        if decision.after_commit or decision.status_changed(run.status):
            return 0.0
        return decision.requeue_after


def requeue_after(decision: Decision, refused: Mapping[str, str]) -> float | None:
    """When the run's next pass is due after ``decision`` was carried out: as the core says,
    or soon when the API refused a Job it was to create (``refused``: the run's Jobs whose
    create was refused, with the API's words): at once, so that the next pass fails the
    attempt, or, for a refusal that may pass, when the create is to be tried again."""
    requeue = decision.requeue_after
    for action in decision.after_commit:
        if isinstance(action, CreateJob) and action.job_name in refused:
            passing = refusals.refusal_may_pass(refused[action.job_name])
            soon = refusals.CREATE_RETRY_SECONDS if passing else REFUSAL_REQUEUE
            requeue = min(requeue or soon, soon)
    return requeue
