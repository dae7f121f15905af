"""Runs made under an operator that was not sharded carry no shard label; once replicas share
the runs (``AGENTRUN_SHARDS``), the replica that follows each run's shard labels it, so that
its events reach that replica's watch alone (agentrun/loop/run_watch.py), and nothing of the
run is decided again: a finished run stays as it finished."""

from __future__ import annotations

from agentrun.api import models as m
from agentrun.core.shards import run_shard_label
from agentrun.settings import LABEL_SHARD
from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.cluster import StartOperator
from tests.support.runs import agentrun, create, envelope, get, status_of, step
from tests.support.waiting import wait_phase

SHARDS = 4


def _env(namespace: str, identity: str) -> dict[str, str]:
    return {
        "AGENTRUN_SHARDS": str(SHARDS),
        "AGENTRUN_SHARD_LEASE_SECONDS": "4",
        "AGENTRUN_OPERATOR_NAMESPACE": namespace,
        "AGENTRUN_IDENTITY": identity,
    }


def _labels(kube: KubeClients, namespace: str) -> dict[str, str | None]:
    listed = kube.custom.list_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL)
    return {
        r["metadata"]["name"]: (r["metadata"].get("labels") or {}).get(LABEL_SHARD)
        for r in listed["items"]
    }


def test_runs_of_an_unsharded_operator_are_labelled_once_replicas_share_them(
    start_operator: StartOperator, kube: KubeClients, namespace: str
) -> None:
    single = start_operator()
    old = [f"old-{i}" for i in range(6)]
    for name in old:
        create(kube, namespace, agentrun(name, [step("a", envelope("a"))]))
    finished = {name: status_of(wait_phase(kube, namespace, name, "Succeeded")) for name in old}
    single.stop()
    assert set(_labels(kube, namespace).values()) == {None}, "unsharded: no run is labelled"

    replicas = [start_operator(env=_env(namespace, f"r{i}")) for i in (1, 2)]
    want = {name: run_shard_label(namespace, name, SHARDS) for name in old}
    wait_for(
        "every run made before the shards labelled with its shard",
        lambda: _labels(kube, namespace) == want or None,
        timeout=90,
    )
    for name in old:  # labelling decided nothing again (the audit record levels on its own)
        now = {k: v for k, v in status_of(get(kube, namespace, name)).items() if k != "audit"}
        assert now == {k: v for k, v in finished[name].items() if k != "audit"}, name

    create(kube, namespace, agentrun("new", [step("a", envelope("a"))]))
    wait_phase(kube, namespace, "new", "Succeeded")
    assert _labels(kube, namespace)["new"] == run_shard_label(namespace, "new", SHARDS)
    for op in replicas:
        assert op.alive(), op.log_text()[-2000:]
