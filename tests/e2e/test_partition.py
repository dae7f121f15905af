"""The operator cut from the API server while runs go: packets dropped (no reset), both ways or
one way (half-open), for a while, then healed (agentrun_devcluster.partition: the operator in a
network namespace of its own; its /readyz stays reachable over a path never cut).

What must hold, whatever the cut: no step attempt runs twice (by the steps' own ledger) and no
Job is created twice (by the API server's audit log), no step is lost (every run succeeds with
every step's result), the operator is never restarted, and once healed it records what
finished meanwhile within a bounded time (the waits' timeouts: a stuck run fails instead of
hanging; no timing is asserted). A cut long enough to kill its watches (60 s) shows as not
ready on /readyz, naming a dead watch, and ready again after the heal; a 10 s cut is ridden out
by TCP's retransmissions and need not show. Every cut leaves a log without a traceback, one
warning line per retry (``agentrun_api_retries_total``); a cut of 30 s or more has some.

A stall (:meth:`~agentrun_devcluster.partition.Partition.stall`) is the other half-open path:
a proxy that lost its backend, accepting connections, acknowledging every segment and
keepalive probe, forwarding nothing; the connections open then stay silent after the heal.
TCP never finds it out; the operator's own limits on a read do (agentrun.kubeapi: 30 s for a
request; for a watch, 75 s without an event or a bookmark, or here, where its watches end after
10 s, 25 s of silence). The same checks hold, and /readyz names a stalled watch while it lasts.

One more cut, of 90 s in CI and 5 minutes in ``make faults`` (``HISTORY_CUT_SECONDS``), lasts
while etcd's history moves past the version kopf's watch of runs would resume from (a run
elsewhere changed again and again, etcd compacted and defragmented; the operator's API server
keeps no watch cache of runs, so etcd answers that watch): healed, that watch meets 410 Gone
and lists again, as the operator's own watches do after their failed requests
(``agentrun_watch_relists_total``), and the same checks hold. 90 s outlasts every limit the
operator puts on its connections (agentrun.kubeapi: a request given up after 30 s, a watch
after 75 s of silence, its own watches tried again every 10 s at most, kopf's requests given up
after 65 s), so every connection it had is given up and made again while the cut lasts; a 5
minute cut repeats that, and ``make faults`` still makes one, and adds a 5 minute cut with no
churn.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.partition import Partition, partition_unavailable
from agentrun_devcluster.testing import KubeClients, TestCluster, job_creations, wait_for
from tests.support.cluster import TEST_LABELS, StartOperator, create_namespace, delete_namespace
from tests.support.oplogs import assert_retries_quiet, retried
from tests.support.runs import agentrun, create, envelope, get, status_of, step
from tests.support.scraping import readiness, scrape, value

pytestmark = pytest.mark.e2e

RUNS = 4
STEPS = 3
STEP_SECONDS = 3
"""Each step sleeps this long, so that steps start and end while the operator is cut."""
CHURN = 300
"""Changes of a run in another namespace, twice during the history test's cut, each round
followed by a compaction of etcd."""
RELISTED = ("agentruns", "jobs", "pods")
"""The watches that must list again after the history test's cut."""
HISTORY_CUT_SECONDS = int(os.environ.get("AGENTRUN_HISTORY_CUT_SECONDS") or 90)
"""How long the history test's cut lasts: 90 s, the longest cut in CI (``make faults``: 300)."""
LONG_CUT_SECONDS = int(os.environ.get("AGENTRUN_LONG_CUT_SECONDS") or 0)
"""A further cut of this many seconds with no churn (``make faults``: 300); 0, in CI: none."""
QUIET_CUT_SECONDS = 30
"""A cut this long outlasts a watch's read limit (20 s): something is tried again (each retry
one line of the log, counted); a shorter one may be ridden out by TCP alone."""


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
    Cut(30, to_operator=False),
    Cut(30, to_server=False),
    *([Cut(LONG_CUT_SECONDS, dead_watches=True)] if LONG_CUT_SECONDS else []),
]


def _partitionable(cluster: TestCluster) -> ControlPlane:
    """The local control plane, once a partition can be made around it; skips, saying why,
    where none can."""
    if cluster.control_plane is None:
        pytest.skip("the partition is made around the local control plane's API server")
    reason = partition_unavailable()
    if reason is not None:
        pytest.skip(f"no network partition can be made here: {reason}")
    return cluster.control_plane


@pytest.fixture
def partition(cluster: TestCluster, tmp_path: Path) -> Iterator[Partition]:
    control_plane = _partitionable(cluster)
    with Partition(control_plane.server, cluster.kubeconfig, tmp_path) as made:
        yield made


@pytest.fixture
def uncached_partition(cluster: TestCluster, tmp_path: Path) -> Iterator[Partition]:
    """A partition around a second API server of the control plane that keeps no watch cache
    of runs, so that kopf's watch of runs is served by etcd: a watch resumed from a version
    etcd has compacted away meets 410 Gone, whatever the rest of the cluster does (a watch
    cache grows while the cluster is busy and may then still hold that version)."""
    control_plane = _partitionable(cluster)
    uncached = f"--watch-cache-sizes={PLURAL}.{GROUP}#0"
    with (
        control_plane.add_apiserver(extra_args=[uncached]) as api,
        Partition(api.server, api.kubeconfig, tmp_path) as made,
    ):
        yield made


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


def _start_runs(kube: KubeClients, namespace: str, ledger: Path) -> list[str]:
    """The runs, once each has its first step running; their names."""
    names = [f"cut-{i}" for i in range(RUNS)]
    for name in names:
        create(kube, namespace, _plan(name, ledger))
    wait_for(
        "every run's first step to run",
        lambda: ledger.exists() and len(ledger.read_text().split()) >= RUNS,
        timeout=120,
    )
    return names


def _nothing() -> None:
    return None


def _cut_for(
    partition: Partition,
    op: OperatorProcess,
    cut: Cut,
    meanwhile: Callable[[], None] = _nothing,
    stall: bool = False,
) -> list[str]:
    """Cut (with ``stall``: stall instead, :meth:`Partition.stall`), run ``meanwhile`` (in a
    thread) while /readyz is asked every second, heal once ``cut.seconds`` have passed and
    ``meanwhile`` is done; what /readyz first named when it said not ready (empty: it never
    did)."""
    not_ready: list[str] = []
    if stall:
        partition.stall()
    else:
        partition.cut(to_server=cut.to_server, to_operator=cut.to_operator)
    try:
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(meanwhile)
            end = time.monotonic() + cut.seconds
            while time.monotonic() < end or not done.done():
                code, waiting = readiness(op)
                if code == 503 and not not_ready:
                    not_ready = waiting
                time.sleep(1)
            done.result()
    finally:
        partition.heal()
    if cut.dead_watches:
        what = f"a stall of {cut.seconds}s" if stall else f"a cut {cut.name}"
        assert not_ready, f"/readyz said ready all through {what}"
        assert any("watch" in w for w in not_ready), not_ready
    return not_ready


def _nothing_lost_nothing_twice(
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    op: OperatorProcess,
    names: list[str],
    ledger: Path,
) -> tuple[float, float]:
    """Every run succeeds with every result, no step attempt ran twice, no Job was created
    twice, and the operator was never started again; seconds until /readyz said ready and
    until every run finished (its last steps included)."""
    since = time.monotonic()
    wait_for("/readyz to say ready after the heal", lambda: readiness(op)[0] == 200, timeout=120)
    ready = time.monotonic() - since
    phases = wait_for(
        "every run to finish after the heal",
        lambda: _finished(kube, namespace, names),
        timeout=240,
        interval=1,
    )
    finished = time.monotonic() - since
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
    return ready, finished


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
    names = _start_runs(kube, namespace, ledger)
    before = retried(op)
    not_ready = _cut_for(partition, op, cut)
    ready, finished = _nothing_lost_nothing_twice(kube, cluster, namespace, op, names, ledger)
    after = assert_retries_quiet(op)  # one line per retry, no traceback
    if cut.seconds >= QUIET_CUT_SECONDS:
        assert after > before, f"nothing was tried again through a cut {cut.name}"
    print(
        f"cut {cut.name}: ready {ready:.1f}s and runs finished {finished:.1f}s after the heal; "
        f"not ready meanwhile: {not_ready}; retries {after - before:.0f}"
    )


def _relists(op: OperatorProcess) -> dict[str, float]:
    samples, _ = scrape(op)
    return {r: value(samples, "agentrun_watch_relists_total", resource=r) for r in RELISTED}


def test_history_compacted_during_a_cut_is_listed_again_and_nothing_is_decided_twice(
    uncached_partition: Partition,
    start_operator: StartOperator,
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    """While the operator is cut off, a run in another namespace changes again and again and
    etcd's history is compacted and defragmented past the version kopf's watch of runs would
    resume from: healed, that watch gets 410 Gone and lists again, as the operator's own
    watches do after their failed requests, and decides from what it lists now."""
    assert cluster.control_plane is not None  # the partition fixture skips else
    control_plane = cluster.control_plane
    op = start_operator(partition=uncached_partition)
    ledger = tmp_path / "executions.log"
    names = _start_runs(kube, namespace, ledger)
    before = _relists(op)
    elsewhere = create_namespace(kube, f"{namespace[:50]}-churn", labels=TEST_LABELS)
    churned = create(kube, elsewhere, agentrun("churn", [step("s", "true")]))["metadata"]["name"]

    def churn() -> None:
        for round_ in range(2):
            for i in range(CHURN):
                kube.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, elsewhere, PLURAL, churned,
                    {"metadata": {"annotations": {"test.agentrun.dev/churn": f"{round_}-{i}"}}},
                )  # fmt: skip
            control_plane.compact_etcd()

    try:
        cut = Cut(HISTORY_CUT_SECONDS, dead_watches=True)
        _cut_for(uncached_partition, op, cut, churn)
        ready, finished = _nothing_lost_nothing_twice(kube, cluster, namespace, op, names, ledger)
    finally:
        delete_namespace(kube, elsewhere)
    after = _relists(op)
    grew = {r: after[r] - before[r] for r in RELISTED}
    print(
        f"history compacted during a cut {cut.name}: ready {ready:.1f}s and runs finished "
        f"{finished:.1f}s "
        f"after the heal; lists again: {grew}"
    )
    assert all(n >= 1 for n in grew.values()), f"a watch did not list again: {grew}"


STALL_SECONDS = 30
"""How long the stall lasts: past a watch's silence limit here (25 s: the operator's watches
end after :data:`STALL_WATCH_SECONDS`, plus its 15 s grace), so that every watch is given up
while it lasts; a request's (30 s) is met after the heal, by those stalled with it."""
STALL_WATCH_SECONDS = 10
"""``AGENTRUN_WATCH_SECONDS`` of the stall test's operator. By default a watch ends after
300 s and its silence limit rests on the API server's bookmarks (75 s): the same code, which
a stall of a minute and a half would take to show."""


def test_a_path_that_accepts_and_answers_nothing_is_given_up_and_nothing_is_lost_or_run_twice(
    partition: Partition,
    start_operator: StartOperator,
    kube: KubeClients,
    cluster: TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    op = start_operator(
        partition=partition, env={"AGENTRUN_WATCH_SECONDS": str(STALL_WATCH_SECONDS)}
    )
    ledger = tmp_path / "executions.log"
    names = _start_runs(kube, namespace, ledger)
    before = retried(op)
    not_ready = _cut_for(partition, op, Cut(STALL_SECONDS, dead_watches=True), stall=True)
    ready, finished = _nothing_lost_nothing_twice(kube, cluster, namespace, op, names, ledger)
    after = assert_retries_quiet(op)
    assert after > before, "nothing was tried again through the stall"
    assert partition.stalled_connections > 0, "no connection of the operator's stalled"
    print(
        f"stall of {STALL_SECONDS}s: ready {ready:.1f}s and runs finished {finished:.1f}s after "
        f"the heal; {partition.stalled_connections} connections stalled; retries "
        f"{after - before:.0f}; not ready meanwhile: {not_ready}"
    )
