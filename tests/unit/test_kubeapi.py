"""Expected refusals of the Kubernetes API pass; any other still fails the call. A refusal is
told to a person in the API server's own words."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.kubeapi import api_message, finalizer_removal, list_items, tolerate


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


def test_a_refusal_is_told_in_the_api_servers_words_else_its_body_else_its_status() -> None:
    status = '{"kind": "Status", "message": "agentruns.agentrun.dev \\"x\\" not found"}'
    assert api_message(ApiException(status=404, reason="Not Found")) == "HTTP 404 Not Found"
    refused = ApiException(status=404, reason="Not Found")
    refused.body = status
    assert api_message(refused) == 'agentruns.agentrun.dev "x" not found'
    plain = ApiException(status=502, reason="Bad Gateway")
    raw: Any = b"  upstream went away \n"  # a body urllib3 did not decode
    plain.body = raw
    assert api_message(plain) == "upstream went away"
    plain.body = "x" * 600
    assert api_message(plain) == "x" * 500
