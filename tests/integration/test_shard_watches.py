"""A sharded replica's watches of step Jobs and pods, against the real API server and Job
controller (agentrun/observation/watches.py, ``Informer(shard_count=...)``).

Replicas that share the runs (``AGENTRUN_SHARDS``) watch only the Jobs and pods of the shards
they hold (their ``agentrun.dev/shard`` label, ``<shard>-of-<count>``), and every Job or pod
labelled with no shard of their count: one made before Jobs carried the label, under another
count, or relabelled by someone who may edit Jobs. Following other shards makes their objects
appear in the view and the others' leave it; a relabelled Job moves between the watches
without ever leaving the view of the replica that holds it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from agentrun import settings as s
from agentrun.core import CreateJob
from agentrun.core import shards as sh
from agentrun.execution import jobs
from agentrun.observation.view import ClusterView
from agentrun.observation.watches import Informer
from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.sim import make_run, step
from tests.support.waiting import assert_holds

COUNT = 2


def _job(namespace: str, name: str, shard: str | None) -> dict[str, Any]:
    """A step Job as the operator builds it (no owner: no run exists here), labelled
    ``shard`` (None: no shard label)."""
    run = make_run([step("a")])
    found = run.step("a")
    assert found is not None
    job = jobs.build_job(run, CreateJob(found, 1, name, "key", "hash"))
    job["metadata"]["namespace"] = namespace
    job["metadata"]["labels"][s.LABEL_RUN_UID] = str(uuid.uuid4())
    job["spec"]["template"]["metadata"]["labels"][s.LABEL_RUN_UID] = job["metadata"]["labels"][
        s.LABEL_RUN_UID
    ]
    for key in ("ownerReferences", "finalizers"):
        job["metadata"].pop(key)
    return jobs.with_shard_label(job, shard) if shard is not None else job


@pytest.fixture
def informer(kube: KubeClients, namespace: str) -> Iterator[Informer]:
    apis = SimpleNamespace(core=kube.core, batch=kube.batch)
    made = Informer(apis, [namespace], lambda ns, name, uid: None, ClusterView(), shard_count=2)
    made.start()
    yield made
    made.stop()


def _seen(informer: Informer, namespace: str) -> tuple[set[str], set[str]]:
    """Names of the Jobs in the view, and of the Jobs whose pods are in it."""
    view = informer.view
    assert view.wait_synced(timeout=60), "the sharded watches never listed"
    names = {"a-0", "b-1", "c-none", "d-other"}
    found = {n for n in names if view.job_named(namespace, n) is not None}
    with_pods = {
        n for n in found if (job := view.job_named(namespace, n)) and view.pods_of_job(
            job["metadata"]["uid"]
        )
    }  # fmt: skip
    return found, with_pods


def _wait_seen(informer: Informer, namespace: str, jobs_: set[str], what: str) -> None:
    wait_for(
        what,
        lambda: _seen(informer, namespace) == (jobs_, jobs_) or None,
        timeout=60,
    )


def test_a_sharded_replica_watches_its_shards_jobs_and_pods_and_every_stray(
    kube: KubeClients, namespace: str, informer: Informer
) -> None:
    for name, shard in (
        ("a-0", sh.shard_label(0, COUNT)),
        ("b-1", sh.shard_label(1, COUNT)),
        ("c-none", None),
        ("d-other", sh.shard_label(0, COUNT + 1)),
    ):
        kube.batch.create_namespaced_job(namespace, _job(namespace, name, shard))

    # Before it holds a shard: only the Jobs (and their pods) labelled with no shard of 2.
    _wait_seen(informer, namespace, {"c-none", "d-other"}, "the strays only")

    informer.follow(frozenset({0}))
    _wait_seen(informer, namespace, {"a-0", "c-none", "d-other"}, "shard 0 and the strays")

    informer.follow(frozenset({1}))
    _wait_seen(informer, namespace, {"b-1", "c-none", "d-other"}, "shard 1 and the strays")
    assert informer.followed() == frozenset({1})

    # Someone who may edit Jobs takes the shard label off a Job of shard 1: the Job moves
    # from shard 1's watch to the strays', and never leaves the view meanwhile.
    kube.batch.patch_namespaced_job(
        "b-1", namespace, [{"op": "remove", "path": "/metadata/labels/agentrun.dev~1shard"}]
    )

    def b_in_view() -> None:
        job = informer.view.job_named(namespace, "b-1")
        assert job is not None, "the relabelled Job left the view"
        assert informer.view.synced

    assert_holds(b_in_view, seconds=3)
    wait_for(
        "the view to hold the Job without its label",
        lambda: (
            s.LABEL_SHARD
            not in ((informer.view.job_named(namespace, "b-1") or {}).get("metadata") or {}).get(
                "labels", {s.LABEL_SHARD: ""}
            )
            or None
        ),
        timeout=30,
    )
    assert informer.troubles() == []

    # A stray labelled into a shard this replica does not hold leaves its view.
    kube.batch.patch_namespaced_job(
        "c-none", namespace, {"metadata": {"labels": {s.LABEL_SHARD: sh.shard_label(0, COUNT)}}}
    )
    wait_for(
        "the Job relabelled into shard 0 to leave the view",
        lambda: informer.view.job_named(namespace, "c-none") is None or None,
        timeout=30,
    )

    informer.follow(frozenset())
    assert informer.followed() == frozenset()
    found, _ = _seen(informer, namespace)
    assert found == {"b-1", "d-other"}, found
