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
