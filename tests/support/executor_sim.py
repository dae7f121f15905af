"""The agent loop with a shell that makes a run's executor and sends it turns
(agentrun.core.executor), for the core's tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentrun.core import (
    AheadJob,
    JobState,
    Observed,
    ObservedJob,
    PodRef,
    PrepareExecutor,
    SendTurn,
    StartPod,
    turns,
)
from agentrun.core import executor as ex
from tests.support.agent_sim import AgentSim, turn_envelope


@dataclass
class SimExecutor:
    generation: int
    state: JobState = JobState.ACTIVE
    trusted: bool = True
    started: bool = False
    """Its pod was let start (StartPod): it then runs, with an address."""
    started_at: datetime | None = None
    """When its pod was let start: its command runs from then on."""

    @property
    def pod_uid(self) -> str:
        return f"executor-pod-{self.generation}"


@dataclass
class ExecutorSim(AgentSim):
    """The agent loop with a shell that makes executors and sends them turns."""

    executors: dict[str, SimExecutor] = field(default_factory=dict)
    sent: list[SendTurn] = field(default_factory=list)
    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    pods_start: bool = True
    """Whether an executor's pod let start runs (False: it stays pending, as without a node)."""

    def __post_init__(self) -> None:
        agent = dataclasses.replace(self.config.agent, executor=True)
        self.config = dataclasses.replace(self.config, agent=agent)

    def executor_job(self) -> AheadJob | None:
        ag = self.run.status.agent if self.run.status else None
        named = ag.executor.job_name if ag is not None and ag.executor is not None else None
        found = self.executors.get(named or "")
        if named is None or found is None:
            return None
        running = found.started and found.state == JobState.ACTIVE
        job = ObservedJob(
            named,
            turns.EXECUTOR_STEP,
            found.generation,
            found.state,
            start_pod=None if found.started else PodRef(f"{named}-pod", found.pod_uid),
            address="10.0.0.9" if running else None,
            pod_uid=found.pod_uid if running else None,
            running_since=found.started_at if running else None,
        )
        return AheadJob(job, found.trusted)

    def observed(self) -> Observed:
        base = super().observed()
        executor = self.executor_job()
        bound = ex.attempts_on(self.run, executor.job if executor else None, self.answers)
        return dataclasses.replace(base, jobs=(*base.jobs, *bound), executor=executor)

    def apply(self, action: object) -> None:
        if isinstance(action, PrepareExecutor):
            self.executors.setdefault(action.job_name, SimExecutor(action.generation))
            return
        if isinstance(action, StartPod) and action.job_name in self.executors:
            executor = self.executors[action.job_name]
            executor.started = self.pods_start
            if executor.started and executor.started_at is None:
                executor.started_at = self.now
            return
        if isinstance(action, SendTurn) and action.executor:
            self.sent.append(action)
            return
        super().apply(action)

    def progress(self) -> tuple[object, ...]:
        """Also the executors made or let start (a step may wait for the executor to run)."""
        started = tuple((name, e.started) for name, e in self.executors.items())
        return (*super().progress(), started)

    def executor_answers(self, content: str = "", calls: Any = (), **usage: Any) -> None:
        """The executor answers the model turn's attempt in flight; the run settles."""
        self.settle()
        pending = [s for s in self.sent if s.job_name not in self.answers]
        assert pending, f"no turn sent to the executor: {self.status.message}"
        self.answers[pending[-1].job_name] = (0, turn_envelope(content, calls, **usage))
        self.settle()
