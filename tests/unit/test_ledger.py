"""The ledger (agentrun/loop/ledger.py): its finalizer patch, guarded by the run's
resourceVersion, a refusal told as a conflict, a run gone as None; its status write, a JSON
patch of what changed behind the version read, 409 told as a conflict, a patch the API server
cannot apply made again whole. That the API server applies them so, and that a run's first
status write then meets no conflict, is shown against a real one
(tests/integration/test_crd.py, tests/e2e/test_runs.py, tests/e2e/test_observability.py)."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

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


class StatusApi:
    """The status subresource's patch: refuses with ``refusals`` in turn, then answers with
    the run's metadata (the version after the write)."""

    def __init__(self, *refusals: int) -> None:
        self.refusals = list(refusals)
        self.patches: list[list[dict[str, Any]]] = []

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        assert kwargs["_content_type"] == JSON_PATCH and kwargs["_preload_content"] is False
        self.patches.append(body)
        if self.refusals:
            raise ApiException(status=self.refusals.pop(0))
        answer = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "9"}}
        return mock.Mock(data=json.dumps(answer).encode())


def read_run(status: dict[str, Any] | None) -> dict[str, Any]:
    run = body([s.RUN_FINALIZER])
    run.update(apiVersion="agentrun.dev/v1alpha1", kind="AgentRun", spec={"goal": "g"})
    if status is not None:
        run["status"] = status
    return run


FENCE = {"op": "replace", "path": "/metadata/resourceVersion", "value": "7"}


def test_a_status_write_sends_what_changed_behind_the_version_read() -> None:
    api = StatusApi()
    old = {"phase": "Running", "steps": [{"name": "a", "phase": "Launching"}], "progress": "0/1"}
    new = {"phase": "Running", "steps": [{"name": "a", "phase": "Running"}]}
    stored = Ledger(api).commit(read_run(old), new)
    assert api.patches == [
        [
            FENCE,
            {"op": "remove", "path": "/status/progress"},
            {"op": "replace", "path": "/status/steps/0/phase", "value": "Running"},
        ]
    ]
    assert stored["status"] is new and stored["spec"] == {"goal": "g"}
    assert stored["metadata"]["resourceVersion"] == "9"
    # Nothing changed: the fence alone (it still fails on a run that moved on).
    Ledger(api).commit(read_run(new), new)
    assert api.patches[-1] == [FENCE]
    # No status yet: written whole.
    Ledger(api).commit(read_run(None), new)
    assert api.patches[-1] == [FENCE, {"op": "add", "path": "/status", "value": new}]


def test_a_status_write_on_a_run_that_moved_on_is_a_conflict() -> None:
    ledger = Ledger(StatusApi(409))
    with pytest.raises(Conflict):
        ledger.commit(read_run({"phase": "Pending"}), {"phase": "Running"})
    assert ledger.stats.conflicts == 1 and ledger.stats.commits == 0


def test_a_patch_the_api_server_cannot_apply_is_made_again_whole_and_a_whole_refusal_raises() -> (
    None
):
    api = StatusApi(422)
    stored = Ledger(api).commit(read_run({"phase": "Pending", "pruned": 1}), {"phase": "Running"})
    assert stored["status"] == {"phase": "Running"}
    assert api.patches[-1] == [
        FENCE,
        {"op": "add", "path": "/status", "value": {"phase": "Running"}},
    ]
    with pytest.raises(ApiException):
        Ledger(StatusApi(422, 422)).commit(read_run({"phase": "Pending"}), {"phase": "x"})
