"""The watch lines the real API server writes for runs, decoded as kopf's watch of runs decodes
them in the operator (agentrun/loop/run_events.py): the event of the operator's own status
write, at the version its write made, is taken from the run as the ledger left it, and equals
the event decoded whole but for the run's ``managedFields`` (passed over); someone else's
write is decoded whole, ``managedFields`` passed over as well."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun.api import models as m
from agentrun.core import Observed, reconcile
from agentrun.loop.ledger import Ledger
from agentrun.loop.run_bodies import RunBodies
from agentrun.loop.run_events import PREFIX, RunEvents
from agentrun_devcluster.testing import KubeClients
from tests.support.runs import agentrun, create, step

pytestmark = pytest.mark.usefixtures("crd_installed")


def _watch_lines(kube: KubeClients, namespace: str, since: str) -> list[str]:
    """The lines of a watch of the namespace's runs from version ``since``, for 2 s."""
    response = kube.custom.list_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL,
        watch=True, resource_version=since, timeout_seconds=2, _preload_content=False,
    )  # fmt: skip
    try:
        text = response.data.decode("utf-8")
    finally:
        response.release_conn()
    return [line for line in text.splitlines() if line]


def _count(decoded: str) -> float:
    return REGISTRY.get_sample_value("agentrun_run_events_total", {"decoded": decoded}) or 0.0


def test_the_event_of_the_operators_status_write_is_the_run_the_ledger_left(
    kube: KubeClients, namespace: str
) -> None:
    created = create(kube, namespace, agentrun("watched", [step("a"), step("b", after=["a"])]))
    since = created["metadata"]["resourceVersion"]
    decision = reconcile(m.AgentRun.model_validate(created), Observed(), datetime.now(UTC))
    held = RunBodies()
    written = Ledger(kube.custom).commit(created, decision.status.to_wire())
    held.offer(written)
    edited = kube.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "watched",
        {"metadata": {"annotations": {"team.example/note": "edited"}}},
    )  # fmt: skip

    own, foreign = _watch_lines(kube, namespace, since)
    for line in (own, foreign):
        assert line.startswith(PREFIX), line[:200]
    events = RunEvents(held.get)
    reused, whole = _count("metadata"), _count("whole")
    own_event = events.loads(own)
    assert _count("metadata") == reused + 1
    expected = json.loads(own)
    assert expected["object"]["metadata"].pop("managedFields")  # passed over, not decoded
    assert own_event == expected
    assert own_event["object"]["status"] is written["status"]
    assert (
        own_event["object"]["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    )
    foreign_event: dict[str, Any] = events.loads(foreign)
    assert _count("whole") == whole + 1
    expected = json.loads(foreign)
    assert expected["object"]["metadata"].pop("managedFields")
    assert foreign_event == expected
    assert (
        foreign_event["object"]["metadata"]["resourceVersion"]
        == (edited["metadata"]["resourceVersion"])
    )
    assert foreign_event["object"]["metadata"]["annotations"]["team.example/note"] == "edited"
