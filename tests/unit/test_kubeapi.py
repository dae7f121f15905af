"""Expected refusals of the Kubernetes API pass; any other still fails the call."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.kubeapi import tolerate


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
