"""A tiny in-memory cluster and ledger for driving the core in unit tests.

It plays the parts the shell plays in production: a status store with resourceVersion checks,
Jobs that are created at most once per name (AlreadyExists otherwise), result ConfigMaps, and a
clock. Every Job creation is counted, including re-creations after a deletion, so tests can
assert that a step attempt was launched exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.api import models as m
from agentrun.core import (
    CarriedSource,
    CoreConfig,
    CreateJob,
    Decision,
    DeleteJob,
    DeleteRun,
    JobState,
    Observed,
    ObservedJob,
    ReleaseJob,
    StoreResult,
    reconcile,
)

T0 = datetime(2026, 11, 22, 9, 0, 0, tzinfo=UTC)
UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def step(name: str, *deps: str, **extra: Any) -> dict[str, Any]:
    """A plan step as a user would write it."""
    body: dict[str, Any] = {
        "name": name,
        "container": {"image": "busybox:1.36", "command": ["sh", "-c", f"echo {name}"]},
    }
    if deps:
        body["dependsOn"] = list(deps)
    body.update(extra)
    return body


def make_run(steps: list[dict[str, Any]], name: str = "demo", **spec: Any) -> m.AgentRun:
    return m.AgentRun.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": UID, "generation": 1},
            "spec": {"goal": "test the core", "plan": {"steps": steps}, **spec},
        }
    )


@dataclass
class SimJob:
    name: str
    step: str
    attempt: int
    state: JobState = JobState.ACTIVE
    message: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    finished_at: datetime | None = None
    env: dict[str, str] = field(default_factory=dict)
    deleting: bool = False
    deleted_at: datetime | None = None
    running_since: datetime | None = None
    """When its command started running: the sim's Jobs run from their creation."""
    ttl: int | None = None
    """Set by a ReleaseJob (which also drops the operator's finalizer): the TTL controller
    deletes the Job this long after it finished (see :meth:`Sim.advance`)."""


class Conflict(Exception):
    pass


@dataclass
class Sim:
    run: m.AgentRun
    now: datetime = T0
    config: CoreConfig = field(default_factory=CoreConfig)
    version: int = 1
    jobs: dict[str, SimJob] = field(default_factory=dict)
    creations: Counter[str] = field(default_factory=Counter)
    created_specs: dict[str, CreateJob] = field(default_factory=dict)
    results: dict[str, dict[str, str]] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    deleted: bool = False
    commits: int = 0
    carried_sources: dict[str, CarriedSource] = field(default_factory=dict)
    """What the runs named by spec.carriedResults committed, as the shell would read it."""
    tampered: dict[str, str] = field(default_factory=dict)
    """Job name -> why a result by reference of that attempt is not what was committed."""
    granted: frozenset[tuple[str, str, str]] = frozenset()
    """Permissions the shell found the run's creator to have (Observed.granted)."""

    # -- the cluster ---------------------------------------------------------------------

    def observed(self) -> Observed:
        return Observed(
            tuple(
                ObservedJob(
                    name=j.name,
                    step=j.step,
                    attempt=j.attempt,
                    state=j.state,
                    termination_message=j.message,
                    exit_code=j.exit_code,
                    reason=j.reason,
                    finished_at=j.finished_at,
                    deleting=j.deleting,
                    deleted_at=j.deleted_at,
                    held=j.ttl is None,
                    expires=j.ttl is not None,
                    running_since=j.running_since if j.state == JobState.ACTIVE else None,
                )
                for j in self.jobs.values()
            ),
            carried_sources=dict(self.carried_sources),
            tampered=dict(self.tampered),
            granted=self.granted,
            # What the shell remembers: Jobs it created that are now gone.
            vanished=frozenset(n for n in self.creations if n not in self.jobs),
        )

    def finish(
        self,
        name: str,
        ok: bool = True,
        message: str | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
    ) -> None:
        job = self.jobs[name]
        job.state = JobState.SUCCEEDED if ok else JobState.FAILED
        job.message = message
        job.exit_code = 0 if ok else (1 if exit_code is None else exit_code)
        job.reason = reason
        job.finished_at = self.now

    def active(self) -> list[SimJob]:
        return [j for j in self.jobs.values() if j.state == JobState.ACTIVE and not j.deleting]

    def lose(self, name: str) -> None:
        """Someone deletes the Job: the operator's finalizer keeps it, marked deleting."""
        self.jobs[name].deleting = True
        self.jobs[name].deleted_at = self.jobs[name].deleted_at or self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        for job in list(self.jobs.values()):  # Kubernetes' TTL controller
            if job.ttl is None or job.finished_at is None:
                continue
            if self.now >= job.finished_at + timedelta(seconds=job.ttl):
                del self.jobs[job.name]

    # -- the ledger and the shell ------------------------------------------------------------

    def snapshot(self) -> tuple[m.AgentRun, int]:
        return self.run.model_copy(deep=True), self.version

    def decide(self, snapshot: tuple[m.AgentRun, int] | None = None) -> tuple[Decision, int]:
        run, version = snapshot or self.snapshot()
        read = run.model_dump()
        decision = reconcile(run, self.observed(), self.now, self.config)
        # A pass changes a copy of the status; the run as read stays as it was (the shell
        # keeps one model per version of a run and starts every pass of it from that).
        assert run.model_dump() == read, "reconcile changed the run it was given"
        return decision, version

    def commit(self, decision: Decision, version: int) -> bool:
        """Before-commit actions, then the conditional status write. False on conflict."""
        for action in decision.before_commit:
            self.apply(action)
        changed = decision.status_changed(self.run.status)
        if not changed and not decision.needs_fence:
            return True
        if version != self.version:
            return False
        if changed:
            self.run = self.run.model_copy(update={"status": decision.status.model_copy(deep=True)})
            self.version += 1
        self.commits += 1
        return True

    def apply(self, action: object) -> None:
        if isinstance(action, CreateJob):
            if action.job_name in self.jobs:
                return  # AlreadyExists: adopt
            self.creations[action.job_name] += 1
            self.created_specs[action.job_name] = action
            self.jobs[action.job_name] = SimJob(
                action.job_name,
                action.step.name,
                action.attempt,
                env={e.name: e.value or "" for e in action.input_env},
                running_since=self.now,
            )
        elif isinstance(action, DeleteJob):
            job = self.jobs.get(action.job_name)
            if job is not None and (action.release or job.ttl is not None):
                del self.jobs[action.job_name]  # no finalizer left: gone
            elif job is not None:
                self.lose(action.job_name)  # the operator's finalizer keeps it a while
        elif isinstance(action, ReleaseJob):
            released = self.jobs.get(action.job_name)
            assert released is not None and released.state != JobState.ACTIVE, action
            released.ttl = action.ttl_seconds
        elif isinstance(action, StoreResult):
            existing = self.results.get(action.name)
            assert existing is None or existing == dict(action.data), "result object changed"
            self.results[action.name] = dict(action.data)
        elif isinstance(action, DeleteRun):
            self.deleted = True
        else:
            self.events.append((getattr(action, "reason", ""), getattr(action, "message", "")))

    def tick(self) -> Decision:
        """One full reconcile: decide, commit, act. Retries on conflict like the ledger."""
        for _ in range(5):
            decision, version = self.decide()
            if self.commit(decision, version):
                for action in decision.after_commit:
                    self.apply(action)
                return decision
        raise Conflict("could not commit in 5 tries")

    # -- conveniences --------------------------------------------------------------------

    @property
    def status(self) -> m.AgentRunStatus:
        assert self.run.status is not None
        return self.run.status

    def step_status(self, name: str) -> m.StepStatus:
        return next(s for s in self.status.steps or [] if s.name == name)

    def job_of(self, name: str) -> SimJob:
        job_name = self.step_status(name).job_name
        assert job_name is not None
        return self.jobs[job_name]

    def condition(self, ctype: str) -> m.Condition | None:
        return next((c for c in self.status.conditions or [] if c.type == ctype), None)

    def spec_update(self, **changes: Any) -> None:
        spec = self.run.spec.model_copy(update=changes)
        meta = self.run.metadata.model_copy(update={"generation": self.run.metadata.generation + 1})
        self.run = self.run.model_copy(update={"spec": spec, "metadata": meta})
        self.version += 1

    def run_to_end(
        self, outcome: Callable[[SimJob], tuple[bool, str | None]] | None = None, limit: int = 200
    ) -> None:
        """Tick, finishing every active Job with ``outcome`` (default: success), until the run
        ends or nothing moves."""
        for _ in range(limit):
            decision = self.tick()
            if self.status.phase in m.TERMINAL_RUN_PHASES:
                return
            for job in self.active():
                ok, message = outcome(job) if outcome else (True, f"{job.step} done")
                self.finish(job.name, ok, message)
            if not self.active() and decision.requeue_after:
                self.advance(decision.requeue_after)
        raise AssertionError(f"run did not end: {self.status.phase} {self.status.message}")
