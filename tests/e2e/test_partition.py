"""The operator cut from the API server while runs go: packets dropped (no reset), both ways or
one way (half-open), for a while, then healed (agentrun_devcluster.partition: the operator in a
network namespace of its own; its /readyz stays reachable over a path never cut).

What must hold, whatever the cut: no step attempt runs twice (by the steps' own ledger) and no
Job is created twice (by the API server's audit log), no step is lost (every run succeeds with
every step's result), the operator is never restarted, and once healed it records what
finished meanwhile within a bounded time (the waits' timeouts: a stuck run fails instead of
hanging; no timing is asserted). A cut long enough to kill its watches (60 s) shows as not
ready on /readyz, naming a dead watch, and ready again after the heal; a 10 s cut is ridden out
by TCP's retransmissions and need not show. ``make faults`` adds a 5 minute cut.
"""

from __future__ import annotations

import json
import os
import shlex
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.partition import Partition, partition_unavailable
from agentrun_devcluster.testing import KubeClients, TestCluster, job_creations, wait_for
from tests.support.cluster import StartOperator
from tests.support.runs import agentrun, create, envelope, get, status_of, step

pytestmark = pytest.mark.e2e

RUNS = 4
STEPS = 3
STEP_SECONDS = 3
"""Each step sleeps this long, so that steps start and end while the operator is cut."""
LONG_CUT_SECONDS = int(os.environ.get("AGENTRUN_LONG_CUT_SECONDS") or 0)
"""A further cut of this many seconds (``make faults``: 300); 0, in CI: none."""


@dataclass(frozen=True)
class Cut:
    seconds: int
    to_server: bool = True
    to_operator: bool = True
    dead_watches: bool = False
    """Long enough that /readyz must say not ready while it lasts."""

    @property
    def name(self) -> str:
        if self.to_server and self.to_operator:
            return f"both ways for {self.seconds}s"
        way = "operator to server" if self.to_server else "server to operator"
        return f"{way} only for {self.seconds}s"


CUTS = [
    Cut(10),
    Cut(60, dead_watches=True),
    Cut(40, to_operator=False),
    Cut(40, to_server=False),
    *([Cut(LONG_CUT_SECONDS, dead_watches=True)] if LONG_CUT_SECONDS else []),
]


@pytest.fixture
def partition(cluster: TestCluster, tmp_path: Path) -> Iterator[Partition]:
    if cluster.control_plane is None:
        pytest.skip("the partition is made around the local control plane's API server")
    reason = partition_unavailable()
    if reason is not None:
        pytest.skip(f"no network partition can be made here: {reason}")
    with Partition(cluster.control_plane.server, cluster.kubeconfig, tmp_path) as made:
        yield made


def _readyz(op: OperatorProcess) -> tuple[int, list[str]]:
    try:
        with urllib.request.urlopen(op.readiness_url, timeout=5) as answer:
            return int(answer.status), list(json.loads(answer.read())["waitingFor"])
    except urllib.error.HTTPError as error:
        return int(error.code), list(json.loads(error.read())["waitingFor"])


def _plan(name: str, ledger: Path) -> dict[str, object]:
    record = f'echo "$AGENTRUN_RUN/$AGENTRUN_STEP/$AGENTRUN_ATTEMPT" >> {shlex.quote(str(ledger))}'
    steps = [
        step(
            f"s{i}",
            f"{record}; sleep {STEP_SECONDS}; {envelope(f'step {i} of {name}', {'step': i})}",
            after=[f"s{i - 1}"] if i else [],
        )
        for i in range(STEPS)
    ]
    return agentrun(name, steps)


def _finished(kube: KubeClients, namespace: str, names: list[str]) -> list[str]:
    phases = {n: status_of(get(kube, namespace, n)).get("phase") for n in names}
    unfinished = [n for n, p in phases.items() if p not in ("Succeeded", "Failed", "Cancelled")]
    return [] if unfinished else [f"{n}: {p}" for n, p in phases.items()]


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: c.name.replace(" ", "-"))
def test_a_cut_from_the_api_server_loses_nothing_and_runs_nothing_twice(
    partition: Partition,
    start_operator: StartOperator,
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    tmp_path: Path,
    cut: Cut,
) -> None:
    op = start_operator(partition=partition)
    ledger = tmp_path / "executions.log"
    names = [f"cut-{i}" for i in range(RUNS)]
    for name in names:
        create(kube, namespace, _plan(name, ledger))
    wait_for(
        "every run's first step to run",
        lambda: ledger.exists() and len(ledger.read_text().split()) >= RUNS,
        timeout=120,
    )
    not_ready: list[str] = []
    partition.cut(to_server=cut.to_server, to_operator=cut.to_operator)
    try:
        end = time.monotonic() + cut.seconds
        while time.monotonic() < end:
            code, waiting = _readyz(op)
            if code == 503 and not not_ready:
                not_ready = waiting
            time.sleep(1)
    finally:
        partition.heal()
    healed = time.monotonic()
    if cut.dead_watches:
        assert not_ready, f"/readyz said ready all through a cut {cut.name}"
        assert any("watch" in w for w in not_ready), not_ready
    wait_for("/readyz to say ready after the heal", lambda: _readyz(op)[0] == 200, timeout=120)
    phases = wait_for(
        "every run to finish after the heal",
        lambda: _finished(kube, namespace, names),
        timeout=240,
        interval=1,
    )
    recovered = time.monotonic() - healed
    print(f"cut {cut.name}: runs finished {recovered:.1f}s after the heal; not ready: {not_ready}")

    assert op.alive() and op.starts == 1, "the operator had to be started again"
    assert phases == [f"{n}: Succeeded" for n in names]
    for name in names:
        results = {
            s["name"]: json.loads(s["result"])
            for s in status_of(get(kube, namespace, name)).get("steps") or []
        }
        assert results == {f"s{i}": {"step": i} for i in range(STEPS)}, (name, results)
    ran = Counter(ledger.read_text().split())
    want = {f"{n}/s{i}/1" for n in names for i in range(STEPS)}
    assert set(ran) == want and max(ran.values()) == 1, ran
    created = job_creations(cluster, namespace)
    assert len(created) == RUNS * STEPS and max(created.values()) == 1, created
