"""Expected refusals of the Kubernetes API pass; any other still fails the call."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.kubeapi import finalizer_removal, list_items, tolerate


def test_a_tolerated_status_is_let_pass_and_recorded() -> None:
    with tolerate(404, 409) as exists:
        raise ApiException(status=409, reason="AlreadyExists")
    assert exists and exists.status == 409
    assert exists.error is not None and exists.error.reason == "AlreadyExists"


def test_a_call_that_succeeds_records_nothing() -> None:
    with tolerate(404) as gone:
        pass
    assert not gone and gone.status is None and gone.error is None


def test_any_other_status_propagates_unchanged() -> None:
    refusal = ApiException(status=403, reason="Forbidden")
    with pytest.raises(ApiException) as raised, tolerate(404, 409):
        raise refusal
    assert raised.value is refusal


def test_other_errors_propagate() -> None:
    with pytest.raises(ValueError), tolerate(404):
        raise ValueError("not an API refusal")


def test_list_items_are_the_api_servers_json() -> None:
    class Response:
        data = b'{"kind": "JobList", "items": [{"metadata": {"name": "j"}}]}'

    class Empty:
        data = b'{"kind": "JobList", "items": null}'

    assert list_items(Response()) == [{"metadata": {"name": "j"}}]
    assert list_items(Empty()) == []


def test_a_finalizer_is_removed_by_a_patch_that_checks_it_is_still_there() -> None:
    assert finalizer_removal(["a/x", "b/y"], "b/y") == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": "b/y"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert finalizer_removal(["a/x"], "b/y") is None
    assert finalizer_removal([], "b/y") is None
