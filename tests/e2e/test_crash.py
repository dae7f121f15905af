"""The product's promise under faults: operators that die at every dangerous moment, and two
operators racing on the same runs, never launch a step attempt twice, never lose a committed
result and still carry every run to the end.

* :func:`test_runs_survive_an_operator_killed_at_every_crash_point`: one operator, restarted
  again and again; each life is started with ``AGENTRUN_CRASH_AT=point:n`` chosen from a fixed
  seed (or SIGKILLed from outside at a seeded moment if it does not get there), then a last
  life without crash points finishes the runs.
* :func:`test_two_operators_at_once_create_every_job_once_and_resolve_conflicts`: two
  standalone operators drive the same runs at once; their status writes collide (409) and are
  re-derived.
* :func:`test_three_sharded_replicas_with_one_killed_at_every_crash_point` and
  :func:`test_rolling_restarts_of_every_sharded_replica_lose_nothing`: three replicas share
  the runs by shards (``AGENTRUN_SHARDS``); one of them dies again and again at the crash
  points, or all of them are restarted in turn.

Both check invariant 1 of docs/design.md twice over, so they need the local control plane:

* Job creations in the API server's audit log (a Job deleted and created again under the same
  name counts twice). A create whose client was SIGKILLed mid-request may be stored and still
  be audited as 504 (context canceled) instead of 201; such a Job is counted as created once,
  and the ledger below must show that it ran exactly once.
* Executions: every step appends ``run/step/attempt`` to a ledger file in the test's tmp dir
  before doing anything else (the stand-in node runs step pods as local processes), so a step
  attempt that ran twice shows up even if its Jobs did not.

No timing assertions: the timeouts only make a stuck run fail instead of hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrun.api import models as m
from agentrun.core.naming import job_name
from agentrun.core.shards import run_shard_label
from agentrun.settings import LABEL_SHARD
from agentrun_devcluster.faults import POINTS as ALL_POINTS
from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.operator import OperatorError, OperatorProcess
from agentrun_devcluster.ports import lease_ports
from agentrun_devcluster.testing import (
    KubeClients,
    TestCluster,
    audit_events,
    job_creations,
    wait_for,
)
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.agents import tool, turn_asked
from tests.support.cluster import StartOperator
from tests.support.mcp_pods import Server as McpServerPod
from tests.support.mcp_pods import create_auth_secret
from tests.support.mcp_pods import entry as mcp_entry
from tests.support.plugin import LLM_COMMAND
from tests.support.runs import TERMINAL, Run, agentrun, create, get, status_of, step
from tests.support.scraping import scrape, value
from tests.support.waiting import assert_holds

pytestmark = pytest.mark.e2e

CHILD_POINT = "after-child-create"
TURN_POINTS = ("after-turn-prepare", "before-turn-request", "after-turn-request")
"""The crash points of model turns' Jobs made ahead and their requests (agent runs only)."""
EXECUTOR_POINTS = ("after-executor-create", "before-turn-request", "after-executor-answer")
"""The crash points of a run's executor and its turns (agent runs with AGENTRUN_EXECUTOR)."""
RUN_START_POINTS = ("after-executor-create",)
"""Crash points reached only as a run starts: its executor is made once, and a later life
verifies it instead of making it again. A life that is to crash at one of them starts a wave
of runs of its own (one that waited for the last wave to end may never make an executor)."""
POINTS = tuple(
    p for p in ALL_POINTS if p != CHILD_POINT and p not in TURN_POINTS and p not in EXECUTOR_POINTS
)
"""The crash points of plan runs (every one is reached by their passes)."""
AGENT_POINTS = POINTS + TURN_POINTS
SEED = int(os.environ.get("AGENTRUN_CRASH_SEED") or 20260611)
"""Seed of every random choice of the crash test, printed in its assertion messages; set
``AGENTRUN_CRASH_SEED`` to replay a failure or to explore other schedules."""

PAD = "x" * 1000
"""Makes a step's result ~1 KiB: over the 256 B inline limit, so it is kept in a ConfigMap."""
RETRY = {"limit": 2, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 2}}
CONFLICT_LINE = "status conflict: re-reading and re-deriving"
CRASH_LINE = re.compile(r"crash point (?P<point>[a-z-]+) reached \(pass (?P<n>\d+)\)")

MIN_KILLS = int(os.environ.get("AGENTRUN_CRASH_KILLS") or 20)
"""Kills of the plan-run crash test: 20 in CI; ``make soak`` sets ``AGENTRUN_CRASH_KILLS=100``."""
MIN_HITS_PER_POINT = max(2, MIN_KILLS // 10)
MAX_CRASH_LIVES = 2 * MIN_KILLS + 5
CRASH_PHASE_BUDGET = 20.0 * MIN_KILLS
"""Seconds of crash lives at most (a cap for a machine so loaded that lives are slow; on an
idle one the phase ends as soon as the kills are in); then the last life finishes the runs."""
PATIENCE = 3.0
"""Seconds added to a point's outside SIGKILL moment for each life that chose it and was
killed from outside before it fired."""
READY_TIMEOUT = 60.0
FINISH_TIMEOUT = 150.0
SETTLE_SECONDS = 5.0
"""After the runs ended: two resyncs and the Job-deletion grace, for a late duplicate to show."""

OPERATOR_ENV = {"AGENTRUN_RESYNC_SECONDS": "2", "AGENTRUN_JOB_DELETION_GRACE_SECONDS": "1"}


# -- plans: every step reports its own run, step and attempt ---------------------------------


@dataclass(frozen=True)
class StepSpec:
    """One step of a test plan and what the test expects of it."""

    name: str
    after: tuple[str, ...] = ()
    sleep: float = 0.5
    big: bool = False
    """Result ~1 KiB (kept by reference) instead of a few bytes (inline)."""
    fail_first: bool = False
    """Fails attempt 1 (exit 3) and succeeds on attempt 2; gets a retry policy."""
    blob_from: str | None = None
    """Takes the ``pad`` field of this (big) step's result as input ``BLOB``."""

    @property
    def attempts(self) -> int:
        return 2 if self.fail_first else 1

    def script(self, ledger: Path) -> str:
        """Appends ``run/step/attempt`` to ``ledger`` (the side effect that must never happen
        twice), sleeps, then reports a result naming its run, step and attempt."""
        fields = '"run":"%s","step":"%s","attempt":%s'
        values = '"$AGENTRUN_RUN" "$AGENTRUN_STEP" "$AGENTRUN_ATTEMPT"'
        if self.big:
            fields += f',"pad":"{PAD}"'
        if self.blob_from:
            fields += ',"blobLength":%s'
            values += ' "${#BLOB}"'
        report = (
            f'printf \'{{"ok":true,"summary":"%s attempt %s","result":{{{fields}}}}}\' '
            f'"$AGENTRUN_STEP" "$AGENTRUN_ATTEMPT" {values} > /dev/termination-log'
        )
        fail = (
            'if [ "$AGENTRUN_ATTEMPT" = 1 ]; then '
            "echo 'flaky: attempt 1 fails' > /dev/termination-log; exit 3; fi; "
            if self.fail_first
            else ""
        )
        record = (
            f'echo "$AGENTRUN_RUN/$AGENTRUN_STEP/$AGENTRUN_ATTEMPT" >> {shlex.quote(str(ledger))}'
        )
        return f"{record}; sleep {self.sleep}; {fail}{report}"

    def expected_result(self, run: str, attempt: int) -> dict[str, Any]:
        want: dict[str, Any] = {"run": run, "step": self.name, "attempt": attempt}
        if self.big:
            want["pad"] = PAD
        if self.blob_from:
            want["blobLength"] = len(PAD)
        return want

    def manifest(self, ledger: Path) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.fail_first:
            fields["retry"] = RETRY
        if self.blob_from:
            fields["inputs"] = [{"name": "BLOB", "fromStep": self.blob_from, "key": "pad"}]
        return step(self.name, self.script(ledger), after=self.after, **fields)


@dataclass(frozen=True)
class PlanSpec:
    name: str
    steps: tuple[StepSpec, ...]

    def manifest(self, ledger: Path) -> Run:
        steps = [st.manifest(ledger) for st in self.steps]
        return agentrun(self.name, steps, goal=f"crash test {self.name}")


def sequential(name: str, n: int = 4) -> PlanSpec:
    steps = [StepSpec(f"s{i}", after=(f"s{i - 1}",) if i > 1 else ()) for i in range(1, n + 1)]
    return PlanSpec(name, tuple(steps))


def dag(name: str, branches: int = 3) -> PlanSpec:
    mid = tuple(StepSpec(f"branch-{i}", after=("start",), sleep=1) for i in range(branches))
    join = StepSpec("join", after=tuple(b.name for b in mid))
    return PlanSpec(name, (StepSpec("start"), *mid, join))


def retried(name: str) -> PlanSpec:
    return PlanSpec(
        name,
        (
            StepSpec("prepare"),
            StepSpec("flaky", after=("prepare",), fail_first=True),
            StepSpec("finish", after=("flaky",)),
        ),
    )


def big_results(name: str, branches: int = 4) -> PlanSpec:
    mid = tuple(
        StepSpec(f"big-{i}", after=("big-1",), big=True, sleep=1) for i in range(2, branches + 2)
    )
    last = StepSpec(
        f"big-{branches + 2}",
        after=("big-1", *(st.name for st in mid)),
        big=True,
        blob_from="big-1",
    )
    return PlanSpec(name, (StepSpec("big-1", big=True, sleep=1), *mid, last))


def mixed(name: str) -> PlanSpec:
    """Parallel branches of every kind: inline, by reference, retried."""
    return PlanSpec(
        name,
        (
            StepSpec("start"),
            StepSpec("inline", after=("start",), sleep=1),
            StepSpec("big", after=("start",), big=True, sleep=1),
            StepSpec("flaky", after=("start",), fail_first=True),
            StepSpec("join", after=("inline", "big", "flaky")),
        ),
    )


# -- the cluster side ------------------------------------------------------------------------


def create_runs(
    kube: KubeClients, namespace: str, plans: Iterable[PlanSpec], ledger: Path
) -> dict[str, str]:
    """Create the runs; their uids by name."""
    uids: dict[str, str] = {}
    for plan in plans:
        created = create(kube, namespace, plan.manifest(ledger))
        uids[plan.name] = created["metadata"]["uid"]
    return uids


def phases(kube: KubeClients, namespace: str, names: Iterable[str]) -> dict[str, str | None]:
    return {n: status_of(get(kube, namespace, n)).get("phase") for n in names}


def all_terminal(kube: KubeClients, namespace: str, names: Iterable[str]) -> bool:
    return all(p in TERMINAL for p in phases(kube, namespace, names).values())


def unfinished(kube: KubeClients, namespace: str, names: Iterable[str]) -> int:
    return sum(1 for p in phases(kube, namespace, names).values() if p not in TERMINAL)


def wait_all_terminal(
    kube: KubeClients, namespace: str, names: Iterable[str], timeout: float, context: str
) -> None:
    names = list(names)
    try:
        wait_for(
            "every run to end",
            lambda: all_terminal(kube, namespace, names),
            timeout=timeout,
            interval=0.5,
        )
    except TimeoutError as e:
        raise AssertionError(
            f"{context}: runs stuck: {phases(kube, namespace, names)} ({e})"
        ) from None


def expected_jobs(plans: Iterable[PlanSpec], uids: Mapping[str, str]) -> dict[str, str]:
    """Every Job the runs must have created (once each): name -> 'run/step attempt k'."""
    want: dict[str, str] = {}
    for plan in plans:
        for st in plan.steps:
            for attempt in range(1, st.attempts + 1):
                name = job_name(plan.name, uids[plan.name], st.name, attempt)
                want[name] = f"{plan.name}/{st.name} attempt {attempt}"
    return want


@dataclass(frozen=True)
class Creations:
    """What the audit log says about the Jobs of the runs."""

    duplicates: int
    """Jobs created (201) more than once: must be 0."""
    response_lost: dict[str, list[int]]
    """Expected Jobs without a 201 whose create got another answer (the operator was killed
    while its create was in flight: the Job was stored, the answer never delivered)."""


def create_answers(cluster: TestCluster, namespace: str) -> dict[str, list[int]]:
    """HTTP codes of every Job create in the namespace, per Job name, oldest first."""
    answers: dict[str, list[int]] = {}
    for event in audit_events(cluster, verb="create", resource="jobs", namespace=namespace):
        name = (event.get("objectRef") or {}).get("name")
        if name:  # a request cut off before its body was read (500, no name) created nothing
            answers.setdefault(str(name), []).append(_code(event))
    return answers


def creates_after_deletion(cluster: TestCluster, namespace: str) -> dict[str, list[int]]:
    """Per Job name, the answers to creates received after a delete of that Job had been
    accepted, other than AlreadyExists (the Job still there, held by its finalizer). Any such
    create tried to launch an attempt again whose Job was already cleaned up: a 201 is a
    duplicate, a 504 may be one."""
    deleted_at: dict[str, str] = {}
    late: dict[str, list[int]] = {}
    events = audit_events(cluster, resource="jobs", namespace=namespace)
    for event in sorted(events, key=lambda e: str(e.get("requestReceivedTimestamp"))):
        name = str((event.get("objectRef") or {}).get("name") or "")
        code = _code(event)
        if not name:
            continue
        if event.get("verb") == "delete" and code in (200, 202):
            done = str(event.get("stageTimestamp"))
            deleted_at[name] = min(deleted_at.get(name, done), done)
        elif (
            event.get("verb") == "create"
            and code != 409
            and name in deleted_at
            and str(event.get("requestReceivedTimestamp")) > deleted_at[name]
        ):
            late.setdefault(name, []).append(code)
    return late


def _code(event: Mapping[str, Any]) -> int:
    return int((event.get("responseStatus") or {}).get("code") or 0)


def check_job_creations(
    cluster: TestCluster,
    namespace: str,
    plans: Iterable[PlanSpec],
    uids: Mapping[str, str],
    context: str,
    may: Mapping[str, str] | None = None,
) -> Creations:
    """Invariant 1 by the audit log (:func:`job_creations`: successful creates per name):
    every expected Job created exactly once, no other Job created at all (an extra attempt
    would show as an unexpected name) but those of ``may`` (name -> what it is), at most
    once each, no create of a Job after its deletion. An expected Job with no 201 but a
    create answered otherwise (not 409) was created by a request whose client died before
    the answer; it passes here, and :func:`check_executions` proves it ran exactly once."""
    want = expected_jobs(plans, uids)
    allowed = {**(may or {}), **want}

    def recorded() -> dict[str, list[int]] | None:
        answers = create_answers(cluster, namespace)
        tried = {n for n, codes in answers.items() if any(c != 409 for c in codes)}
        return answers if tried >= set(want) else None

    try:
        answers = wait_for("audit records of every expected Job", recorded, timeout=30)
    except TimeoutError:
        answers = create_answers(cluster, namespace)
        missing = {
            f"{want[n]} ({n})": answers.get(n, [])
            for n in want
            if not any(c != 409 for c in answers.get(n, []))
        }
        raise AssertionError(f"{context}: Jobs never created (create answers): {missing}") from None
    counts = job_creations(cluster, namespace)
    duplicates = {f"{allowed.get(n, '?')} ({n})": c for n, c in counts.items() if c > 1}
    unexpected = {n: codes for n, codes in answers.items() if n not in allowed}
    assert not duplicates, f"{context}: Jobs created more than once: {duplicates}"
    assert not unexpected, f"{context}: Jobs of unexpected (step, attempt)s created: {unexpected}"
    late = {
        f"{want.get(n, '?')} ({n})": c
        for n, c in creates_after_deletion(cluster, namespace).items()
    }
    assert not late, f"{context}: Jobs created again after their deletion (answers): {late}"
    lost = {f"{want[n]} ({n})": answers[n] for n in want if counts[n] == 0}
    return Creations(duplicates=len(duplicates), response_lost=lost)


def check_executions(ledger: Path, plans: Iterable[PlanSpec], context: str) -> int:
    """Every step attempt ran exactly once, by the steps' own ledger; returns the number of
    executions."""
    text = ledger.read_text() if ledger.exists() else ""
    ran = Counter(text.split())
    want = {
        f"{plan.name}/{st.name}/{attempt}"
        for plan in plans
        for st in plan.steps
        for attempt in range(1, st.attempts + 1)
    }
    twice = {k: c for k, c in ran.items() if c > 1}
    assert not twice, f"{context}: step attempts executed more than once: {twice}"
    assert set(ran) == want, (
        f"{context}: executions differ from the plan: never ran {sorted(want - set(ran))}, "
        f"ran unexpectedly {sorted(set(ran) - want)}"
    )
    return sum(ran.values())


def check_results(
    kube: KubeClients, namespace: str, plans: Iterable[PlanSpec], context: str
) -> None:
    """Every run Succeeded, every step once (twice for the retried one), its committed result
    the one the step printed (inline, or in the ConfigMap named by resultRef), history kept."""
    for plan in plans:
        status = status_of(get(kube, namespace, plan.name))
        where = f"{context}: run {plan.name}"
        assert status.get("phase") == "Succeeded", f"{where}: {status.get('phase')}: {status}"
        assert status.get("history"), f"{where}: status.history is empty"
        total = sum(st.attempts for st in plan.steps)
        assert (status.get("usage") or {}).get("attempts") == total, f"{where}: {status['usage']}"
        by_name = {st["name"]: st for st in status.get("steps") or []}
        for spec in plan.steps:
            st = by_name.get(spec.name)
            assert st is not None, f"{where}: step {spec.name} missing from status"
            assert st["phase"] == "Succeeded", f"{where}/{spec.name}: {st}"
            assert st["attempt"] == spec.attempts, (
                f"{where}/{spec.name}: attempt {st['attempt']}, expected {spec.attempts}: {st}"
            )
            want = spec.expected_result(plan.name, spec.attempts)
            assert st.get("summary") == f"{spec.name} attempt {spec.attempts}", f"{where}: {st}"
            if spec.big:
                assert "result" not in st, f"{where}/{spec.name}: a 1 KiB result kept inline"
                ref = st.get("resultRef")
                assert ref, f"{where}/{spec.name}: result lost (no result, no resultRef): {st}"
                cm = kube.core.read_namespaced_config_map(ref["name"], namespace)
                got = json.loads(cm.data[ref["key"]])
            else:
                assert "result" in st, f"{where}/{spec.name}: result lost: {st}"
                got = json.loads(st["result"])
            assert got == want, f"{where}/{spec.name}: result {got!r}, step printed {want!r}"


def assert_settled(
    cluster: TestCluster, namespace: str, operators: Iterable[OperatorProcess], context: str
) -> None:
    """For :data:`SETTLE_SECONDS` after the runs ended (two resyncs and the Job-deletion
    grace, time for a late duplicate to show): every operator stays alive, and no Job is
    created a second time or after its deletion."""
    operators = list(operators)

    def settled() -> None:
        for op in operators:
            assert op.alive(), f"{context}: an operator died\n{op.logs()}"
        twice = {n: c for n, c in job_creations(cluster, namespace).items() if c > 1}
        assert not twice, f"{context}: Jobs created more than once: {twice}"
        late = creates_after_deletion(cluster, namespace)
        assert not late, f"{context}: Jobs created again after their deletion (answers): {late}"

    assert_holds(settled, seconds=SETTLE_SECONDS, interval=1.0)


@dataclass(frozen=True)
class Ledgers:
    """Where a test's runs are recorded: the plans, their uids, the steps' own ledger."""

    plans: list[PlanSpec]
    uids: Mapping[str, str]
    ledger: Path


def check_everything(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    operators: Iterable[OperatorProcess],
    runs: Ledgers,
    context: str,
) -> tuple[Creations, int]:
    """Every run ended, the operators stay alive and create nothing more, every Job was
    created once, every attempt ran once, every result was committed; returns the audit
    log's creations and the number of executions."""
    wait_all_terminal(kube, namespace, runs.uids, FINISH_TIMEOUT, context)
    operators = list(operators)
    assert_settled(cluster, namespace, operators, f"{context} (after the runs ended)")
    with failures_explained(kube, namespace, runs.plans, operators):
        creations = check_job_creations(cluster, namespace, runs.plans, runs.uids, context)
        executions = check_executions(runs.ledger, runs.plans, context)
        check_results(kube, namespace, runs.plans, context)
    return creations, executions


def count_lines(text: str, needle: str) -> int:
    return sum(1 for line in text.splitlines() if needle in line)


STORY_LINES = 12
"""Operator warnings per run quoted by :func:`failures_explained`."""


@contextlib.contextmanager
def failures_explained(
    kube: KubeClients,
    namespace: str,
    plans: Iterable[PlanSpec],
    operators: Iterable[OperatorProcess],
) -> Iterator[None]:
    """A check failing inside says, besides its own finding, why the runs' attempts failed
    (each run's status.history of BackingOff and Failed steps) and the operators' last
    warnings about each run: what tells an extra attempt the operator decided from one that
    failed on its own."""
    try:
        yield
    except AssertionError as error:
        texts = [op.log_text() for op in operators]
        story = []
        for plan in plans:
            status = status_of(get(kube, namespace, plan.name))
            for entry in status.get("history") or []:
                if entry.get("step") and entry.get("to") in ("BackingOff", "Failed"):
                    story.append(
                        f"{plan.name}/{entry['step']} {entry.get('from')} -> {entry['to']} at "
                        f"{entry.get('at')}: {entry.get('reason')}: {entry.get('message')}"
                    )
            for number, text in enumerate(texts, 1):
                warned = [
                    line[:400]
                    for line in text.splitlines()
                    if plan.name in line and '"level": "info"' not in line
                ]
                story += [f"operator {number}: {line}" for line in warned[-STORY_LINES:]]
        raise AssertionError(
            f"{error}\nwhat the runs and operators say:\n" + "\n".join(story)
        ) from None


# -- the crash test --------------------------------------------------------------------------


@dataclass
class Life:
    """One life of the operator under test."""

    number: int
    crash_at: str
    kill_after: float
    ended_by: str = "?"  # "crash point <point>", "external SIGKILL" or "exit <code>"
    returncode: int | None = None
    seconds: float = 0.0

    def __str__(self) -> str:
        return (
            f"life {self.number}: AGENTRUN_CRASH_AT={self.crash_at} "
            f"(outside SIGKILL {self.kill_after:.1f}s after ready) -> {self.ended_by} "
            f"after {self.seconds:.1f}s, exit {self.returncode}"
        )


def point_of(crash_at: str) -> str:
    """The crash point of an ``AGENTRUN_CRASH_AT`` value ``point:n``."""
    return crash_at.partition(":")[0]


def choose(
    rng: random.Random,
    hits: Counter[str],
    points: tuple[str, ...] = POINTS,
    enough: int = MIN_HITS_PER_POINT,
) -> tuple[str, float]:
    """The next life's ``point:n`` and the moment it is killed from outside if it is still
    alive (seconds after it is ready); points not yet hit ``enough`` times are six times as
    likely and fire sooner."""
    weights = [6 if hits[p] < enough else 1 for p in points]
    point = rng.choices(points, weights=weights)[0]
    n = rng.randint(1, 2) if hits[point] < enough else rng.randint(1, 3)
    return f"{point}:{n}", rng.uniform(0.5, 3.0)


@dataclass
class CrashDriver:
    """Chooses crash points from the seed and lives through them."""

    op: OperatorProcess
    rng: random.Random
    lives: list[Life] = field(default_factory=list)
    hits: Counter[str] = field(default_factory=Counter)
    points: tuple[str, ...] = POINTS
    min_kills: int = MIN_KILLS
    min_hits: int = MIN_HITS_PER_POINT
    later: float = 0.0
    """Added to each life's outside SIGKILL moment."""
    working: Callable[[OperatorProcess], None] | None = None
    """Waits, once a life is ready, until it has work of its own (a sharded replica: until
    it owns shards); the outside SIGKILL's moment counts from then."""
    prepare: Callable[[str], None] | None = None
    """Called with the next life's ``point:n`` before it starts: gives it the work that
    point needs (see :data:`RUN_START_POINTS`)."""
    missed: Counter[str] = field(default_factory=Counter)
    """Per point, the lives that chose it and were killed from outside before it fired: each
    gives that point's next lives :data:`PATIENCE` seconds more (on a loaded machine a life
    gets there later)."""

    @property
    def kills(self) -> int:
        return sum(1 for life in self.lives if life.returncode == -9)

    def satisfied(self) -> bool:
        return self.kills >= self.min_kills and all(
            self.hits[p] >= self.min_hits for p in self.points
        )

    def next_life(self) -> Life:
        """Choose the next crash point from the seed, start the operator with it, live."""
        short = tuple(p for p in self.points if self.hits[p] < self.min_hits)
        # the kills are in: lives go to the points still short of their hits
        points = short if short and self.kills >= self.min_kills else self.points
        crash_at, kill_after = choose(self.rng, self.hits, points, self.min_hits)
        kill_after += self.later + PATIENCE * self.missed[point_of(crash_at)]
        if self.prepare is not None:
            self.prepare(crash_at)
        offset = self.op.log_path.stat().st_size if self.op.log_path.exists() else 0
        self.op.env["AGENTRUN_CRASH_AT"] = crash_at
        self.op.start(wait_ready=False)  # a crash point may fire before it is ready
        return self.live(crash_at, kill_after, offset)

    def live(self, crash_at: str, kill_after: float, offset: int) -> Life:
        """The rest of a life whose log starts at ``offset``: wait for its crash point to kill
        it, or SIGKILL it from outside ``kill_after`` seconds after it became ready."""
        life = Life(len(self.lives) + 1, crash_at, kill_after)
        begin = time.monotonic()
        with contextlib.suppress(OperatorError):  # it may die before it is ready
            self.op.wait_ready(READY_TIMEOUT)
        if self.working is not None and self.op.alive():
            with contextlib.suppress(TimeoutError, OSError, AssertionError):  # it may die
                self.working(self.op)
        if self.op.alive():
            try:
                self.op.wait_exit(kill_after)
            except OperatorError:  # still alive: the bounded life is over
                self.op.kill()
                life.ended_by = "external SIGKILL"
        life.returncode = self.op.returncode
        life.seconds = time.monotonic() - begin
        with self.op.log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        fired = [m["point"] for m in CRASH_LINE.finditer(text)]
        if fired:  # also when the outside SIGKILL came just too late
            self.hits[fired[-1]] += 1
            life.ended_by = f"crash point {fired[-1]}"
        elif life.ended_by == "?":
            life.ended_by = f"exit {life.returncode}"
        if life.ended_by == "external SIGKILL":
            self.missed[point_of(crash_at)] += 1
        self.lives.append(life)
        assert life.returncode == -9, (
            f"SEED={SEED}: the operator ended otherwise than by SIGKILL in {life}\n{self.op.logs()}"
        )
        return life

    @property
    def external_kills(self) -> int:
        return sum(1 for life in self.lives if life.ended_by == "external SIGKILL")

    def summary(self) -> str:
        points = ", ".join(f"{p}={self.hits[p]}" for p in self.points)
        return (
            f"{self.kills} kills in {len(self.lives)} lives "
            f"({sum(self.hits.values())} at crash points: {points}; "
            f"{self.external_kills} from outside)"
        )


def test_runs_survive_an_operator_killed_at_every_crash_point(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    cluster.require_audit_log()
    began = time.monotonic()
    rng = random.Random(SEED)
    ledger = tmp_path / "executions.log"
    plans: list[PlanSpec] = []
    uids: dict[str, str] = {}

    def next_wave() -> None:
        """Four more runs: the crash lives need steps in flight until they are done."""
        wave = len(plans) // 4 + 1
        new = [
            sequential(f"seq-{wave}"),
            dag(f"dag-{wave}"),
            retried(f"retry-{wave}"),
            big_results(f"big-{wave}"),
        ]
        uids.update(create_runs(kube, namespace, new, ledger))
        plans.extend(new)

    # Life 1 starts before the runs exist, so it is ready before any crash point can fire.
    hits: Counter[str] = Counter()
    crash_at, kill_after = choose(rng, hits)
    op = start_operator(env={**OPERATOR_ENV, "AGENTRUN_CRASH_AT": crash_at})
    driver = CrashDriver(op=op, rng=rng, hits=hits)
    next_wave()
    driver.live(crash_at, kill_after, offset=0)

    while (
        not driver.satisfied()
        and len(driver.lives) < MAX_CRASH_LIVES
        and time.monotonic() - began < CRASH_PHASE_BUDGET
    ):
        if all_terminal(kube, namespace, uids):
            next_wave()
        driver.next_life()
    crash_phase = time.monotonic() - began
    lives = "\n".join(map(str, driver.lives))
    context = f"SEED={SEED}, {driver.summary()}"

    # The last life: no crash points, until every run has ended.
    driver.op.env.pop("AGENTRUN_CRASH_AT", None)
    driver.op.start()
    creations, executions = check_everything(
        cluster, kube, namespace, [driver.op], Ledgers(plans, uids, ledger), f"{context}\n{lives}"
    )
    conflicts = count_lines(driver.op.log_text(), CONFLICT_LINE)
    duration = time.monotonic() - began
    print(
        f"\ncrash test summary: SEED={SEED}; {len(plans)} runs in {len(plans) // 4} wave(s), "
        f"{executions} step executions; {driver.summary()}; "
        f"kill points exercised: {sum(1 for p in POINTS if driver.hits[p])}/{len(POINTS)}; "
        f"duplicates found: {creations.duplicates}; "
        f"creates answered otherwise (operator killed mid-request): {creations.response_lost}; "
        f"conflicts: {conflicts}; crash phase {crash_phase:.0f}s, total {duration:.0f}s\n{lives}"
    )
    assert driver.kills >= MIN_KILLS, f"{context}: too few kills\n{lives}"
    missed = {p: driver.hits[p] for p in POINTS if driver.hits[p] < MIN_HITS_PER_POINT}
    assert not missed, f"{context}: crash points hit fewer than {MIN_HITS_PER_POINT}x: {missed}"


# -- two operators at once -------------------------------------------------------------------


def test_two_operators_at_once_create_every_job_once_and_resolve_conflicts(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    cluster.require_audit_log()
    began = time.monotonic()
    first = start_operator(env=OPERATOR_ENV)
    second = start_operator(env=OPERATOR_ENV)
    plans = [dag("dag-1", 4), dag("dag-2", 4), mixed("mixed-1"), mixed("mixed-2")]
    names = [p.name for p in plans]
    ledger = tmp_path / "executions.log"
    uids = create_runs(kube, namespace, plans, ledger)

    wait_all_terminal(kube, namespace, names, FINISH_TIMEOUT, "two operators")
    assert_settled(cluster, namespace, (first, second), "two operators")

    conflicts = [count_lines(op.log_text(), CONFLICT_LINE) for op in (first, second)]
    context = f"two operators (conflicts seen: {conflicts})"
    with failures_explained(kube, namespace, plans, (first, second)):
        creations = check_job_creations(cluster, namespace, plans, uids, context)
        executions = check_executions(ledger, plans, context)
        check_results(kube, namespace, plans, context)
    assert not creations.response_lost, f"{context}: creates without 201: {creations}"
    print(
        f"\ntwo-operator summary: {len(plans)} runs, {sum(len(p.steps) for p in plans)} steps, "
        f"{executions} step executions; duplicates found: {creations.duplicates}; "
        f"conflicts: {conflicts[0]} + {conflicts[1]} = {sum(conflicts)}; "
        f"total {time.monotonic() - began:.0f}s"
    )
    assert sum(conflicts) > 0, f"{context}: the two operators never collided"


def live_until(
    driver: CrashDriver,
    enough: Callable[[], bool],
    wave_done: Callable[[], bool],
    next_wave: Callable[[], None],
    deadline: float,
) -> None:
    """Crash lives until ``enough`` (or too many lives, or the ``deadline`` on the monotonic
    clock), with a new wave of runs each time the last one is done."""
    while not enough() and len(driver.lives) < MAX_CRASH_LIVES and time.monotonic() < deadline:
        if wave_done():
            next_wave()
        driver.next_life()


# -- agent runs under the same crashes -------------------------------------------------------

AGENT_TURNS = 4
"""Turns of each crash-test agent run: three with two parallel tool calls each, then the
answer."""
AGENT_CALLS = 2
AGENT_MIN_KILLS = 12
AGENT_LATER = 2.0
"""Added to each agent life's outside SIGKILL moment: a model turn's pod takes a while to
start, so on a busy machine the points of turns and results came after the kill."""
EXECUTOR_LATER = 4.0
"""The same with an executor: a life's first answer from an executor comes once it has made
one (an operator uses only executors it made itself) and its pod has started."""
AGENT_CRASH_PHASE_BUDGET = 240.0
"""Seconds of crash lives at most: a cap for a loaded machine (on an idle one the phase ends
as soon as the kills and points are in)."""


@dataclass
class CrashModel:
    """The model of the crash-test agent runs: it reads the run's name from the goal and its
    turn from the conversation, calls the ledger-writing tool :data:`AGENT_CALLS` times a turn
    (and the MCP server's ``add`` once, when offered), and answers in turn
    :data:`AGENT_TURNS`. Every request is counted per (run, turn): a model turn executed twice
    would show."""

    asked: Counter[tuple[str, int]] = field(default_factory=Counter)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        goal = next((m["content"] for m in messages if m.get("role") == "user"), "")
        run = str(goal).removeprefix("crash test ").split()[0]
        turn = turn_asked(body)
        with self.guard:
            self.asked[(run, turn)] += 1
        if turn >= AGENT_TURNS:
            return reply(f"done {run}")
        calls = [
            tool_call("record", {"note": f"{run} turn {turn} call {i}"}, f"{run}-{turn}-{i}")
            for i in range(AGENT_CALLS)
        ]
        if any(t["function"]["name"] == "add" for t in body.get("tools") or []):
            calls.append(tool_call("add", {"a": turn, "b": 100}, f"{run}-{turn}-mcp"))
        return reply(f"turn {turn}", calls)


def agent_manifest(
    name: str, base_url: str, ledger: Path, mcp: dict[str, Any] | None = None
) -> Run:
    """An agent run whose one tool appends run/step/attempt to the ledger (the side effect
    that must never happen twice) and reports the note it was given, padded to ~1 KiB (over
    the inline limit: kept in a ConfigMap, read back for the next turn's context); with
    ``mcp``, that MCP server's entry too."""
    script = (
        f'echo "$AGENTRUN_RUN/$AGENTRUN_STEP/$AGENTRUN_ATTEMPT" >> {shlex.quote(str(ledger))}; '
        f'sleep 0.5; echo "noted $AGENTRUN_TOOL_ARGS {PAD}" > /dev/termination-log'
    )
    note = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    container = {"image": "busybox:1.36", "command": ["sh", "-c", script]}
    record = tool("record", "Record a note.", note, container)
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": f"crash test {name}",
            "agent": {
                "model": {"baseURL": base_url, "name": "scripted"},
                "tools": [record],
                "maxTurns": AGENT_TURNS,
                **({"mcpServers": [mcp]} if mcp is not None else {}),
            },
        },
    }


def agent_plans(name: str) -> tuple[PlanSpec, PlanSpec]:
    """The Jobs an agent run must create once each (its model turns and tool calls), and the
    tool calls alone (the ones that write the ledger)."""
    calls = tuple(
        StepSpec(f"t{turn}-{i}-record")
        for turn in range(1, AGENT_TURNS)
        for i in range(AGENT_CALLS)
    )
    turns = tuple(StepSpec(f"t{turn}-model") for turn in range(1, AGENT_TURNS + 1))
    return PlanSpec(name, turns + calls), PlanSpec(name, calls)


def check_agent_runs(
    kube: KubeClients, namespace: str, names: Iterable[str], model: CrashModel, context: str
) -> None:
    """Every agent run Succeeded with its answer, every model turn asked once, every turn
    recorded once in its transcript with every call answered by the tool's own result."""
    for name in names:
        status = status_of(get(kube, namespace, name))
        where = f"{context}: agent run {name}"
        assert status.get("phase") == "Succeeded", f"{where}: {status.get('phase')}: {status}"
        assert (status.get("agent") or {}).get("answer") == f"done {name}", f"{where}: {status}"
        uid = get(kube, namespace, name)["metadata"]["uid"]
        records = kube.core.list_namespaced_config_map(
            namespace, label_selector=f"agentrun.dev/run-uid={uid},agentrun.dev/object=transcript"
        ).items
        turns = sorted(json.loads(cm.data["turn"])["turn"] for cm in records)
        assert turns == list(range(1, AGENT_TURNS + 1)), f"{where}: transcript turns {turns}"
        for cm in records:
            record = json.loads(cm.data["turn"])
            for call in record["toolCalls"]:
                assert call["outcome"] == "Succeeded", f"{where}: {call}"
                if call["name"] == "add":  # the MCP server's: a + b
                    result = json.loads(call["result"])["structuredContent"]["result"]
                    assert result == record["turn"] + 100, f"{where}: {call}"
                    continue
                assert call["result"] == f"noted {call['arguments']} {PAD}", f"{where}: {call}"
                assert call.get("resultRef"), f"{where}: a 1 KiB result kept inline: {call}"
    asked = {k: c for k, c in model.asked.items() if k[0] in set(names)}
    twice = {f"{r} turn {t}": c for (r, t), c in asked.items() if c > 1}
    assert not twice, f"{context}: model turns executed more than once: {twice}"
    want = {(n, t) for n in names for t in range(1, AGENT_TURNS + 1)}
    assert set(asked) == want, f"{context}: model turns asked {sorted(asked)}, want {sorted(want)}"


def test_agent_runs_survive_an_operator_killed_at_every_crash_point(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The crash test for agent loops whose model turns are Jobs (AGENTRUN_EXECUTOR=off): model
    turns and tool calls are created once each (audit log), no tool call runs twice (ledger),
    no model turn is asked twice (the model's own count), and every run ends with its
    answer."""
    _agent_crash_test(start_operator, cluster, kube, namespace, tmp_path, SEED + 1, AGENT_POINTS)


def test_agent_runs_on_an_executor_survive_an_operator_killed_at_every_crash_point(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The same with each run's model turns, and a call of an MCP server's tool each turn,
    sent to its executor (AGENTRUN_EXECUTOR=on), killed also right after an executor's create,
    before a turn's (or a call's) request and right after an executor's answer (before it is
    committed): no model turn is asked twice and no MCP call reaches the server twice (an
    operator restarted asks the executor for the outcome it already has), tool calls are
    created and run once each, a model turn's, a discovery's or an MCP call's Job or an
    executor is created at most once, and every run ends with its answer."""
    points = POINTS + EXECUTOR_POINTS
    with lease_ports(1) as lease:
        server = McpServerPod(kube, namespace, lease, tmp_path / "mcp-calls.jsonl")
        create_auth_secret(kube, namespace)
        server.start()
        try:
            with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
                _agent_crash_test(start_operator, cluster, kube, namespace, tmp_path, SEED + 3,
                                  points, executor=True, mcp=server)  # fmt: skip
        finally:
            server.stop()


def check_mcp_calls(server: McpServerPod, names: Iterable[str], context: str) -> int:
    """Every MCP call of every run reached the server exactly once (by the idempotency key
    it sent); returns their number."""
    reached = Counter(str(c["key"]).split(":")[2] for c in server.calls())
    twice = {k: c for k, c in reached.items() if c > 1}
    assert not twice, f"{context}: MCP calls that reached the server more than once: {twice}"
    want = {f"{n}-{t}-mcp" for n in names for t in range(1, AGENT_TURNS)}
    assert set(reached) == want, (
        f"{context}: MCP calls never made {sorted(want - set(reached))}, "
        f"made unexpectedly {sorted(set(reached) - want)}"
    )
    return sum(reached.values())


def _may_create(names: Iterable[str], uids: Mapping[str, str]) -> dict[str, str]:
    """With an executor: the Jobs an agent run may create besides its tool calls (at most once
    each): a model turn's (a turn that found no executor running), and its executors; an MCP
    server's discovery, and an MCP call's (a call that found no executor running)."""
    may = {}
    for name in names:
        for turn in range(1, AGENT_TURNS + 1):
            for attempt in (1, 2, 3):
                for step_name in (f"t{turn}-model", f"t{turn}-{AGENT_CALLS}-add", "t0-mcp-tools"):
                    may[job_name(name, uids[name], step_name, attempt)] = f"{name}/{step_name}"
        for generation in range(1, 4 * MAX_CRASH_LIVES):
            may[job_name(name, uids[name], "t0-executor", generation)] = f"{name}/executor"
    return may


def _agent_crash_test(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
    seed: int,
    points: tuple[str, ...],
    executor: bool = False,
    mcp: McpServerPod | None = None,
) -> None:
    cluster.require_audit_log()
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    began = time.monotonic()
    rng = random.Random(seed)
    ledger = tmp_path / "executions.log"
    crash_model = CrashModel()
    server = ScriptedModel(responder=crash_model).start()
    names: list[str] = []
    uids: dict[str, str] = {}

    def next_wave() -> None:
        wave = len(names) // 4 + 1
        for i in range(1, 5):
            name = f"agent-{wave}-{i}"
            entry = mcp_entry(mcp, "add") if mcp is not None else None
            created = create(kube, namespace, agent_manifest(name, server.base_url, ledger, entry))
            uids[name] = created["metadata"]["uid"]
            names.append(name)

    hits: Counter[str] = Counter()

    def prepare(crash_at: str) -> None:
        point = point_of(crash_at)
        if point in RUN_START_POINTS and hits[point] < MIN_HITS_PER_POINT:
            next_wave()

    try:
        crash_at, kill_after = choose(rng, hits, points)
        env = {
            **OPERATOR_ENV,
            "AGENTRUN_CRASH_AT": crash_at,
            "AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND),
            "AGENTRUN_EXECUTOR": "on" if executor else "off",
        }
        later = EXECUTOR_LATER if executor else AGENT_LATER
        driver = CrashDriver(
            op=start_operator(env=env), rng=rng, hits=hits, points=points, later=later,
            prepare=prepare, min_kills=AGENT_MIN_KILLS,
        )  # fmt: skip
        next_wave()
        driver.live(crash_at, kill_after + driver.later, offset=0)
        live_until(
            driver,
            driver.satisfied,
            lambda: all_terminal(kube, namespace, names),
            next_wave,
            began + AGENT_CRASH_PHASE_BUDGET,
        )
        lives = "\n".join(map(str, driver.lives))
        context = f"SEED={seed}, {driver.summary()}"

        driver.op.env.pop("AGENTRUN_CRASH_AT", None)
        driver.op.start()
        wait_all_terminal(kube, namespace, names, FINISH_TIMEOUT, f"{context}\n{lives}")
        assert_settled(cluster, namespace, [driver.op], f"{context} (the last life)\n{lives}")

        jobs_plans = [agent_plans(n)[1 if executor else 0] for n in names]
        calls_plans = [agent_plans(n)[1] for n in names]
        may = _may_create(names, uids) if executor else None
        creations = check_job_creations(
            cluster, namespace, jobs_plans, uids, f"{context}\n{lives}", may
        )
        executions = check_executions(ledger, calls_plans, f"{context}\n{lives}")
        check_agent_runs(kube, namespace, names, crash_model, f"{context}\n{lives}")
        mcp_calls = check_mcp_calls(mcp, names, f"{context}\n{lives}") if mcp else 0
    finally:
        server.stop()
    print(
        f"\nagent crash test summary{' (executor)' if executor else ''}: SEED={seed}; "
        f"{len(names)} agent runs, "
        f"{len(names) * AGENT_TURNS} model turns, {executions} tool call executions, "
        f"{mcp_calls} MCP calls; "
        f"{driver.summary()}; kill points exercised: "
        f"{sum(1 for p in points if driver.hits[p])}/{len(points)}; "
        f"duplicates found: {creations.duplicates}; "
        f"creates answered otherwise (operator killed mid-request): {creations.response_lost}; "
        f"total {time.monotonic() - began:.0f}s\n{lives}"
    )
    assert driver.kills >= AGENT_MIN_KILLS, f"{context}: too few kills\n{lives}"
    missed = [p for p in points if not driver.hits[p]]
    assert not missed, f"{context}: crash points never hit in agent runs: {missed}\n{lives}"


# -- sub-agents under the same crashes ---------------------------------------------------------

CHILD_CALLS = 2
"""Sub-agent calls of each crash-test parent: one a turn, then the answer."""
CHILD_MIN_KILLS = 8
CHILD_CRASH_PHASE_BUDGET = 240.0
"""Seconds of crash lives at most: enough, on a loaded machine, for every child crash point
to be hit (the phase ends as soon as it is, and the kills are in)."""
CHILD_POINTS = ("after-intent-commit", CHILD_POINT, "after-job-create", "after-result-commit")


@dataclass
class FamilyModel:
    """The model of the sub-agent crash test. A parent (offered the ``helper`` tool) calls it
    once a turn with the goal ``crash test {parent} child {turn}`` and answers in turn
    :data:`CHILD_CALLS` + 1; a child answers its goal at once. Every request is counted per
    (goal, turn): a turn executed twice would show."""

    asked: Counter[tuple[str, int]] = field(default_factory=Counter)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        goal = str(next((m["content"] for m in messages if m.get("role") == "user"), ""))
        turn = turn_asked(body)
        with self.guard:
            self.asked[(goal, turn)] += 1
        if not any(t["function"]["name"] == "helper" for t in body.get("tools") or []):
            return reply(f"answer of {goal.splitlines()[-1]}")
        parent = goal.removeprefix("crash test ").split()[0]
        if turn > CHILD_CALLS:
            return reply(f"done {parent}")
        arguments = {"goal": f"crash test {parent} child {turn}"}
        return reply("", [tool_call("helper", arguments, f"{parent}-{turn}")])


def family_manifest(name: str, base_url: str) -> Run:
    helper = {
        "name": "helper",
        "description": "Hands a goal to a helper.",
        "parameters": {
            "type": "object",
            "properties": {"goal": {"type": "string"}},
            "required": ["goal"],
        },
        "agent": {"instructions": "Answer.", "maxTurns": 1, "maxTokens": 5000},
    }
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": f"crash test {name}",
            "budget": {"maxTokens": 100000},
            "agent": {
                "model": {"baseURL": base_url, "name": "scripted"},
                "tools": [helper],
                "maxTurns": CHILD_CALLS + 1,
            },
        },
    }


def check_families(
    kube: KubeClients, namespace: str, names: Iterable[str], model: FamilyModel, context: str
) -> int:
    """Every parent Succeeded with its answer, each call's result its own child's answer;
    one child per call, never two; every turn of a parent or a child asked once. Returns the
    number of children."""
    children = 0
    for name in names:
        run = get(kube, namespace, name)
        status = status_of(run)
        where = f"{context}: parent {name}"
        assert status.get("phase") == "Succeeded", f"{where}: {status}"
        assert (status.get("agent") or {}).get("answer") == f"done {name}", f"{where}: {status}"
        uid = run["metadata"]["uid"]
        found = kube.custom.list_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", namespace, "agentruns",
            label_selector=f"agentrun.dev/parent-uid={uid}",
        )["items"]  # fmt: skip
        calls = sorted(c["metadata"]["annotations"]["agentrun.dev/call"] for c in found)
        assert len(found) == CHILD_CALLS, f"{where}: {len(found)} children: {calls}"
        assert [c.split(":")[2] for c in calls] == [
            f"{name}-{t}" for t in range(1, CHILD_CALLS + 1)
        ], f"{where}: {calls}"
        for child in found:
            assert status_of(child).get("phase") == "Succeeded", f"{where}: {status_of(child)}"
        records = kube.core.list_namespaced_config_map(
            namespace, label_selector=f"agentrun.dev/run-uid={uid},agentrun.dev/object=transcript"
        ).items
        for cm in records:
            for call in json.loads(cm.data["turn"])["toolCalls"]:
                goal = json.loads(call["arguments"])["goal"]
                assert call["result"] == f"answer of {goal}", f"{where}: {call}"
        children += len(found)
    twice = {f"{g!r} turn {t}": c for (g, t), c in model.asked.items() if c > 1}
    assert not twice, f"{context}: turns executed more than once: {twice}"
    return children


def test_sub_agents_survive_an_operator_killed_at_every_crash_point(
    start_operator: StartOperator, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """The crash test for sub-agents: the operator is killed while parents call their
    sub-agents (right after a call's intent is committed, right after its child is created,
    and anywhere from outside); every call still has one child, never two, and every parent
    ends with its answer."""
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    began = time.monotonic()
    rng = random.Random(SEED + 2)
    family_model = FamilyModel()
    server = ScriptedModel(responder=family_model).start()
    names: list[str] = []

    def next_wave() -> None:
        wave = len(names) // 3 + 1
        for i in range(1, 4):
            name = f"family-{wave}-{i}"
            create(kube, namespace, family_manifest(name, server.base_url))
            names.append(name)

    try:
        hits: Counter[str] = Counter()
        crash_at, kill_after = choose(rng, hits, CHILD_POINTS)
        env = {
            **OPERATOR_ENV,
            "AGENTRUN_CRASH_AT": crash_at,
            "AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND),
        }
        driver = CrashDriver(op=start_operator(env=env), rng=rng, hits=hits, points=CHILD_POINTS)
        next_wave()
        driver.live(crash_at, kill_after, offset=0)
        live_until(
            driver,
            lambda: driver.kills >= CHILD_MIN_KILLS and driver.hits[CHILD_POINT] >= 2,
            lambda: all_terminal(kube, namespace, names),
            next_wave,
            began + CHILD_CRASH_PHASE_BUDGET,
        )
        lives = "\n".join(map(str, driver.lives))
        context = f"SEED={SEED + 2}, {driver.summary()}"

        driver.op.env.pop("AGENTRUN_CRASH_AT", None)
        driver.op.start()
        wait_all_terminal(kube, namespace, names, FINISH_TIMEOUT, f"{context}\n{lives}")
        children = check_families(kube, namespace, names, family_model, f"{context}\n{lives}")
    finally:
        server.stop()
    print(
        f"\nsub-agent crash test summary: SEED={SEED + 2}; {len(names)} parents, {children} "
        f"children, one per call; {driver.summary()}; total {time.monotonic() - began:.0f}s"
        f"\n{lives}"
    )
    assert driver.kills >= CHILD_MIN_KILLS, f"{context}: too few kills\n{lives}"
    assert driver.hits[CHILD_POINT], f"{context}: never killed right after a child's create"


# -- replicas sharing the runs ---------------------------------------------------------------

SHARDS = 6
SHARD_LEASE_SECONDS = 4
"""Short, so that a dead replica's shards move within seconds (the default is 15)."""
SHARDED_MIN_KILLS = int(os.environ.get("AGENTRUN_SHARDED_CRASH_KILLS") or 8)
SHARDED_PHASE_BUDGET = 360.0


def sharded_env(namespace: str, identity: str) -> dict[str, str]:
    """A replica sharing the test's runs: its Leases in the test's namespace."""
    return {
        **OPERATOR_ENV,
        "AGENTRUN_SHARDS": str(SHARDS),
        "AGENTRUN_SHARD_LEASE_SECONDS": str(SHARD_LEASE_SECONDS),
        "AGENTRUN_OPERATOR_NAMESPACE": namespace,
        "AGENTRUN_IDENTITY": identity,
    }


def shards_owned(ops: Iterable[OperatorProcess]) -> list[float]:
    return [scrape(op)[0].get(("agentrun_shards_owned", ()), -1.0) for op in ops]


def wait_shards_settled(ops: Iterable[OperatorProcess], context: str) -> list[float]:
    """Every shard owned by exactly one of ``ops``, and each of them owns some."""
    ops = list(ops)

    def settled() -> list[float] | None:
        owned = shards_owned(ops)
        return owned if sum(owned) == SHARDS and min(owned) > 0 else None

    try:
        return wait_for("the shards to settle among the replicas", settled, timeout=30)
    except TimeoutError:
        raise AssertionError(f"{context}: shards owned per replica {shards_owned(ops)}") from None


def owning_shards(op: OperatorProcess) -> None:
    """Until ``op`` owns a shard (a replica started anew waits for the others to give)."""
    wait_for(
        "the replica to own shards",
        lambda: shards_owned([op])[0] > 0,
        timeout=SHARD_LEASE_SECONDS * 5,
        interval=0.2,
    )


def sharded_wave(plans: list[PlanSpec]) -> list[PlanSpec]:
    """Eight runs of every kind (spread over the shards by their names)."""
    wave = len(plans) // 8 + 1
    return [
        make(f"{kind}-{wave}-{i}")
        for i in (1, 2)
        for kind, make in (
            ("seq", sequential), ("dag", dag), ("retry", retried), ("big", big_results)
        )
    ]  # fmt: skip


def runs_split_by_shard(
    kube: KubeClients, namespace: str, ops: list[OperatorProcess], runs: int, context: str
) -> None:
    """Every run carries its shard's label (the operator's), and each replica watches the
    runs of its shards only: the runs each counts (``agentrun_runs``) add up to every run
    once, and none counts them all."""
    listed = kube.custom.list_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL)
    wrong = [
        r["metadata"]["name"]
        for r in listed["items"]
        if (r["metadata"].get("labels") or {}).get(LABEL_SHARD)
        != run_shard_label(namespace, r["metadata"]["name"], SHARDS)
    ]
    assert not wrong, f"{context}: runs without their shard's label: {wrong}"

    def counted() -> list[float] | None:
        seen = [value(scrape(op)[0], "agentrun_runs") for op in ops]
        return seen if sum(seen) == runs and max(seen) < runs else None

    wait_for(f"each run counted by one replica ({context})", counted, timeout=60)


def test_three_sharded_replicas_with_one_killed_at_every_crash_point(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Two replicas live throughout; the third dies at a crash point (or from outside) in each
    life and starts again, half the time as the same pod (its Leases taken back at once),
    half as a new one (its old shards taken by the others a lease duration later, then
    shared out again)."""
    cluster.require_audit_log()
    began = time.monotonic()
    rng = random.Random(SEED)
    ledger = tmp_path / "executions.log"
    plans: list[PlanSpec] = []
    uids: dict[str, str] = {}

    def next_wave() -> None:
        new = sharded_wave(plans)
        uids.update(create_runs(kube, namespace, new, ledger))
        plans.extend(new)

    steady = [start_operator(env=sharded_env(namespace, f"steady-{i}")) for i in (1, 2)]
    hits: Counter[str] = Counter()
    crash_at, kill_after = choose(rng, hits)
    victim = start_operator(
        env={**sharded_env(namespace, "victim-1"), "AGENTRUN_CRASH_AT": crash_at}
    )
    wait_shards_settled([*steady, victim], "three replicas starting")
    driver = CrashDriver(
        op=victim,
        rng=rng,
        hits=hits,
        min_kills=SHARDED_MIN_KILLS,
        min_hits=1,
        later=1.0,
        working=owning_shards,
    )
    next_wave()
    driver.live(crash_at, kill_after + driver.later, offset=0)
    while (
        not driver.satisfied()
        and len(driver.lives) < MAX_CRASH_LIVES
        and time.monotonic() - began < SHARDED_PHASE_BUDGET
    ):
        if unfinished(kube, namespace, uids) < 8:  # the victim's shards need steps in flight
            next_wave()
        if rng.random() < 0.5:  # a new pod; else the same pod's container again
            victim.env["AGENTRUN_IDENTITY"] = f"victim-{len(driver.lives) + 1}"
        driver.next_life()
    lives = "\n".join(map(str, driver.lives))
    context = f"SEED={SEED}, sharded: {driver.summary()}"

    victim.env.pop("AGENTRUN_CRASH_AT", None)
    victim.start()
    replicas = [*steady, victim]
    creations, executions = check_everything(
        cluster, kube, namespace, replicas, Ledgers(plans, uids, ledger), f"{context}\n{lives}"
    )
    owned = wait_shards_settled(replicas, context)
    runs_split_by_shard(kube, namespace, replicas, len(uids), context)
    conflicts = [count_lines(op.log_text(), CONFLICT_LINE) for op in replicas]
    print(
        f"\nsharded crash test summary: SEED={SEED}; {len(plans)} runs, {executions} step "
        f"executions; {driver.summary()}; duplicates found: {creations.duplicates}; creates "
        f"answered otherwise: {creations.response_lost}; conflicts per replica {conflicts}; "
        f"shards owned at the end {owned}; total {time.monotonic() - began:.0f}s\n{lives}"
    )
    assert driver.kills >= SHARDED_MIN_KILLS, f"{context}: too few kills\n{lives}"
    missed = [p for p in POINTS if not driver.hits[p]]
    assert not missed, f"{context}: crash points never hit: {missed}\n{lives}"


def test_rolling_restarts_of_every_sharded_replica_lose_nothing(
    start_operator: StartOperator,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Three replicas share the runs; twice over, each is stopped (SIGTERM: it gives its
    shards back) and started as a new pod while runs go, as a Deployment's rolling update
    does; a new wave of runs comes with each round."""
    cluster.require_audit_log()
    began = time.monotonic()
    ledger = tmp_path / "executions.log"
    plans: list[PlanSpec] = []
    uids: dict[str, str] = {}
    replicas = [start_operator(env=sharded_env(namespace, f"r{i}-a")) for i in (1, 2, 3)]
    wait_shards_settled(replicas, "three replicas starting")
    restarts = 0
    for round_ in ("b", "c"):
        new = sharded_wave(plans)
        uids.update(create_runs(kube, namespace, new, ledger))
        plans.extend(new)
        for i, op in enumerate(replicas, start=1):
            time.sleep(1.0)  # let steps move between restarts
            op.restart(env={"AGENTRUN_IDENTITY": f"r{i}-{round_}"})
            restarts += 1
    creations, executions = check_everything(
        cluster, kube, namespace, replicas, Ledgers(plans, uids, ledger), "rolling restarts"
    )
    owned = wait_shards_settled(replicas, "rolling restarts")
    runs_split_by_shard(kube, namespace, replicas, len(uids), "rolling restarts")
    handed = [
        count_lines(op.log_text(), "given back") for op in replicas
    ]  # shards released at each clean stop, and at rebalances
    print(
        f"\nrolling restart summary: {len(plans)} runs, {executions} step executions, "
        f"{restarts} restarts; duplicates found: {creations.duplicates}; shards given back "
        f"per replica {handed}; shards owned at the end {owned}; "
        f"total {time.monotonic() - began:.0f}s"
    )
    assert not creations.response_lost, f"rolling restarts: creates without 201: {creations}"
    assert all(handed), f"rolling restarts: a replica never gave a shard back: {handed}"
