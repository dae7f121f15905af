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
from agentrun.kubeapi import JSON_PATCH, VERSION_ANSWER, patch_status
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
    """Sends the status subresource's patch (the ledger's ``send_status``): refuses with
    ``refusals`` in turn, then answers with the version written."""

    def __init__(self, *refusals: int) -> None:
        self.refusals = list(refusals)
        self.patches: list[list[dict[str, Any]]] = []

    def __call__(
        self, custom: Any, group: str, version: str, plural: str, namespace: str, name: str,
        ops: list[dict[str, Any]], field_manager: str,
    ) -> str:  # fmt: skip
        assert (group, plural, field_manager) == ("agentrun.dev", "agentruns", s.FIELD_MANAGER)
        self.patches.append(ops)
        if self.refusals:
            raise ApiException(status=self.refusals.pop(0))
        return "9"


def status_ledger(api: StatusApi) -> Ledger:
    return Ledger(mock.Mock(), send_status=api)


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
    stored = status_ledger(api).commit(read_run(old), new)
    assert api.patches == [
        [
            FENCE,
            {"op": "remove", "path": "/status/progress"},
            {"op": "replace", "path": "/status/steps/0/phase", "value": "Running"},
        ]
    ]
    assert stored["status"] is new and stored["spec"] == {"goal": "g"}
    # The metadata read, at the version written: a fenced status write changes nothing else.
    assert stored["metadata"] == {**read_run(old)["metadata"], "resourceVersion": "9"}
    # Nothing changed: the fence alone (it still fails on a run that moved on).
    status_ledger(api).commit(read_run(new), new)
    assert api.patches[-1] == [FENCE]
    # No status yet: written whole.
    status_ledger(api).commit(read_run(None), new)
    assert api.patches[-1] == [FENCE, {"op": "add", "path": "/status", "value": new}]


def test_a_status_write_on_a_run_that_moved_on_is_a_conflict() -> None:
    ledger = status_ledger(StatusApi(409))
    with pytest.raises(Conflict):
        ledger.commit(read_run({"phase": "Pending"}), {"phase": "Running"})
    assert ledger.stats.conflicts == 1 and ledger.stats.commits == 0


def test_a_patch_the_api_server_cannot_apply_is_made_again_whole_and_a_whole_refusal_raises() -> (
    None
):
    api = StatusApi(422)
    stored = status_ledger(api).commit(
        read_run({"phase": "Pending", "pruned": 1}), {"phase": "Running"}
    )
    assert stored["status"] == {"phase": "Running"}
    assert api.patches[-1] == [
        FENCE,
        {"op": "add", "path": "/status", "value": {"phase": "Running"}},
    ]
    with pytest.raises(ApiException):
        status_ledger(StatusApi(422, 422)).commit(read_run({"phase": "Pending"}), {"phase": "x"})


class RawClient:
    """An ``ApiClient`` as :func:`~agentrun.kubeapi.patch_status` uses it: the request as
    serialized, then an answer of ``status`` with ``data``."""

    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data = status, data
        self.requests: list[dict[str, Any]] = []

    def param_serialize(self, **request: Any) -> tuple[Any, ...]:
        self.requests.append(request)
        return (request["method"], request["resource_path"])

    def call_api(self, *request: Any) -> Any:
        answer = mock.Mock(status=self.status, data=self.data, reason="r")
        answer.getheaders.return_value = {}
        return answer


def test_the_status_patch_asks_for_the_version_written_only_and_raises_a_refusal() -> None:
    table = {"kind": "Table", "metadata": {"resourceVersion": "12"}, "rows": [{"cells": []}]}
    raw = RawClient(200, json.dumps(table).encode())
    ops = [FENCE]
    custom = mock.Mock(api_client=raw)
    assert (
        patch_status(custom, "agentrun.dev", "v1alpha1", "agentruns", "ns", "r", ops, "m") == "12"
    )
    request = raw.requests[0]
    assert request["method"] == "PATCH" and request["body"] == ops
    assert request["path_params"]["name"] == "r" and request["resource_path"].endswith("/status")
    assert ("includeObject", "None") in request["query_params"]
    assert request["header_params"] == {"Content-Type": JSON_PATCH, "Accept": VERSION_ANSWER}
    # An API server that cannot make a Table answers with the whole object: the same version.
    whole = RawClient(200, json.dumps({"metadata": {"resourceVersion": "13"}}).encode())
    assert patch_status(mock.Mock(api_client=whole), "g", "v", "p", "ns", "r", ops, "m") == "13"
    refusing = mock.Mock(api_client=RawClient(409, b'{"kind":"Status","code":409}'))
    with pytest.raises(ApiException) as refused:
        patch_status(refusing, "g", "v", "p", "ns", "r", ops, "m")
    assert refused.value.status == 409
