"""The ledger's finalizer patch (agentrun/loop/ledger.py): guarded by the run's
resourceVersion, a refusal told as a conflict, a run gone as None. That the API server
applies it so, and that a run's first status write then meets no conflict, is shown against
a real one (tests/e2e/test_runs.py, tests/e2e/test_observability.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.kubeapi import JSON_PATCH
from agentrun.loop.ledger import Conflict, Ledger


class Custom:
    def __init__(self, refusal: int | None = None) -> None:
        self.refusal = refusal
        self.patches: list[tuple[str, list[dict[str, Any]], str]] = []

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:  # fmt: skip
        self.patches.append((name, body, kwargs["_content_type"]))
        if self.refusal is not None:
            raise ApiException(status=self.refusal)
        return {"metadata": {"name": name, "resourceVersion": "8", "finalizers": ["x"]}}


def body(finalizers: list[str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "demo", "namespace": "default", "resourceVersion": "7"}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"metadata": meta}


def test_a_run_without_the_finalizer_is_patched_at_the_version_read() -> None:
    custom = Custom()
    stored = Ledger(custom).hold(body(["other/keep"]))
    assert stored is not None and stored["metadata"]["resourceVersion"] == "8"
    ((name, ops, kind),) = custom.patches
    assert (name, kind) == ("demo", JSON_PATCH)
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": s.RUN_FINALIZER},
    ]


def test_a_run_that_has_it_is_not_written() -> None:
    custom = Custom()
    run = body([s.RUN_FINALIZER])
    assert Ledger(custom).hold(run) is run
    assert not custom.patches


@pytest.mark.parametrize("status", [409, 422])
def test_a_run_that_moved_on_is_a_conflict(status: int) -> None:
    ledger = Ledger(Custom(status))
    with pytest.raises(Conflict):
        ledger.hold(body(None))
    assert ledger.stats.conflicts == 1


def test_a_run_gone_is_none_and_other_refusals_propagate() -> None:
    assert Ledger(Custom(404)).hold(body(None)) is None
    with pytest.raises(ApiException):
        Ledger(Custom(403)).hold(body(None))
