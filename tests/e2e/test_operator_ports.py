"""An operator whose liveness port is taken between its lease and its bind is started again on
new ports and runs (agentrun_devcluster.ports): the crash test's "Address already in use"."""

from __future__ import annotations

import pytest

from agentrun_devcluster import operator as operator_process
from agentrun_devcluster.testing import KubeClients
from tests.support.cluster import StartOperator
from tests.support.ports import first_lease_taken
from tests.support.runs import agentrun, create, envelope, step
from tests.support.waiting import wait_phase


def test_an_operator_whose_port_was_taken_starts_on_new_ports_and_runs(
    monkeypatch: pytest.MonkeyPatch,
    start_operator: StartOperator,
    kube: KubeClients,
    namespace: str,
) -> None:
    with first_lease_taken(monkeypatch, operator_process) as asked:
        op = start_operator()
    assert asked == [2, 2]
    assert op.starts == 2
    assert "address already in use" in op.log_text().lower()
    create(kube, namespace, agentrun("after-clash", [step("one", envelope("ran"))]))
    wait_phase(kube, namespace, "after-clash", "Succeeded")


def test_the_operator_runs_on_the_c_allocator_in_the_process_it_was_started_as(
    start_operator: StartOperator, kube: KubeClients, namespace: str
) -> None:
    """``agentrun run`` starts itself again with ``PYTHONMALLOC=malloc`` (memory it frees can
    go back to the system), as the same process: the pid its starter knows runs it."""
    op = start_operator()
    pid = op.pid
    assert pid is not None
    with open(f"/proc/{pid}/environ", "rb") as handle:
        environ = handle.read().split(b"\0")
    assert b"PYTHONMALLOC=malloc" in environ
    create(kube, namespace, agentrun("on-malloc", [step("one", envelope("ran"))]))
    wait_phase(kube, namespace, "on-malloc", "Succeeded")
    assert op.pid == pid and op.alive()
