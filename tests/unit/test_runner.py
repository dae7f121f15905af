"""The step runner: envelopes, large results by reference, idempotent replays."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, V1ConfigMap
from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.core import envelope
from agentrun.pod import runner
from tests.support.stores import FakeStore


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        s.ENV_RUN: "r", s.ENV_NAMESPACE: "ns", s.ENV_RUN_UID: "uid", s.ENV_STEP: "collect",
        s.ENV_ATTEMPT: "1", s.ENV_IDEMPOTENCY_KEY: "uid:collect:img:abc",
        s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination-log"),
    }  # fmt: skip


def _message(env: dict[str, str]) -> Any:
    return json.loads(Path(env[s.ENV_TERMINATION_MESSAGE_PATH]).read_text())


def test_stdout_becomes_an_inline_result(env: dict[str, str]) -> None:
    code = runner.run_step(["sh", "-c", "echo found it"], env, lambda i, e: None)
    assert code == 0
    assert _message(env) == {"ok": True, "summary": "found it", "result": "found it"}


def test_failure_keeps_the_exit_code_and_ok_false(env: dict[str, str]) -> None:
    code = runner.run_step(["sh", "-c", "echo nope; exit 3"], env, lambda i, e: None)
    assert code == 3 and _message(env)["ok"] is False


def test_result_file_wins_over_stdout(env: dict[str, str]) -> None:
    script = (
        'echo noise; printf \'{"ok": true, "summary": "s", "result": 1}\' > "$AGENTRUN_RESULT_FILE"'
    )
    runner.run_step(["sh", "-c", script], env, lambda i, e: None)
    assert _message(env) == {"ok": True, "summary": "s", "result": 1}


def test_large_result_goes_by_reference_and_the_operator_reads_it(env: dict[str, str]) -> None:
    stores: list[FakeStore] = []

    def factory(identity: runner.StepIdentity, _: dict[str, str]) -> FakeStore:
        stores.append(FakeStore(identity))
        return stores[-1]

    code = runner.run_step([sys.executable, "-c", "print('x' * 10000)"], env, factory)
    assert code == 0
    message = Path(env[s.ENV_TERMINATION_MESSAGE_PATH]).read_text()
    assert len(message) < runner.TERMINATION_LIMIT
    parsed = envelope.parse(message)
    assert parsed.ok and parsed.result_ref == ("collect-1", "result")
    assert stores[0].objects["collect-1"]["result"] == "x" * 10000
    assert parsed.result_digest is not None


def test_large_result_without_api_access_fails_clearly(env: dict[str, str]) -> None:
    code = runner.run_step([sys.executable, "-c", "print('x' * 10000)"], env, lambda i, e: None)
    assert code == 1
    assert "stepTemplate.serviceAccountName" in _message(env)["summary"]


def test_a_result_of_an_earlier_attempt_with_the_same_key_is_never_replayed(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Nothing found proves an earlier attempt did the work: the command always runs (with
    the same idempotency key, which is what it dedupes by)."""
    marker = tmp_path / "side-effect"
    store = FakeStore(runner.StepIdentity(env))
    store.store("done before", "done before")
    code = runner.run_step(["sh", "-c", f"touch {marker}"], env, lambda i, e: store)
    assert code == 0 and marker.exists()
    assert "replayed" not in _message(env)


def _typed(body: dict[str, Any], kind: str) -> Any:
    """``body`` as the kubernetes client's typed model ``kind``, as the API calls return."""
    client: Any = ApiClient()
    return client._ApiClient__deserialize(body, kind)


class FakeCoreApi:
    """Records created ConfigMaps; refuses a create with ``refuse`` when it is set, and
    then reads back ``existing`` (the object holding the name) or the body it was given."""

    def __init__(self, refuse: int | None = None, existing: dict[str, Any] | None = None) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.refuse = refuse
        self.existing = existing

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self.created.append((namespace, body))
        if self.refuse is not None:
            raise ApiException(status=self.refuse, reason="refused")

    def list_namespaced_config_map(self, namespace: str, label_selector: str) -> Any:
        return _typed({"items": []}, "V1ConfigMapList")

    def read_namespaced_config_map(self, name: str, namespace: str) -> V1ConfigMap:
        body = self.existing or self.created[-1][1]
        found: V1ConfigMap = _typed(body, "V1ConfigMap")
        return found


def test_a_result_name_taken_before_the_store_is_never_referenced(env: dict[str, str]) -> None:
    """The mimic: the exact object this attempt would store, with the same content, made by
    someone else first. Only the attempt's own create may make what it references."""
    api = FakeCoreApi()
    runner.ResultStore(api, runner.StepIdentity(env)).store("big", "summary")
    exact = api.created[0][1]
    taken = FakeCoreApi(refuse=409, existing=exact)
    with pytest.raises(runner.ResultTampered, match=r"^ResultTampered: "):
        runner.ResultStore(taken, runner.StepIdentity(env)).store("big", "summary")


def _forged(env: dict[str, str], **changes: Any) -> dict[str, Any]:
    """The object the attempt would store, holding ``FORGED`` (and ``changes``)."""
    api = FakeCoreApi()
    runner.ResultStore(api, runner.StepIdentity(env)).store("big", "summary")
    body = api.created[0][1]
    body["data"] = {"result": "FORGED"}
    body.update(changes)
    return body


@pytest.mark.parametrize(
    "changes",
    [{}, {"immutable": None}, {"data": {"result": "x" * 10000}}],
    ids=["other-content", "mutable", "same-content"],
)
def test_a_result_object_created_before_the_step_wrote_it_fails_the_step(
    env: dict[str, str], changes: dict[str, Any]
) -> None:
    forged = _forged(env, **changes)
    if "immutable" in changes:
        forged["data"] = {"result": "x" * 10000, "field.rows": "FORGED"}
    api = FakeCoreApi(refuse=409, existing=forged)
    store = runner.ResultStore(api, runner.StepIdentity(env))
    code = runner.run_step([sys.executable, "-c", "print('x' * 10000)"], env, lambda i, e: store)
    assert code == 1
    message = _message(env)
    assert message["ok"] is False and "resultRef" not in message
    assert message["summary"].startswith("ResultTampered:"), message


def test_other_refusals_of_the_result_store_fail_the_step(env: dict[str, str]) -> None:
    api = FakeCoreApi(refuse=403)
    with pytest.raises(ApiException):
        runner.ResultStore(api, runner.StepIdentity(env)).store("big", "summary")


def test_a_large_result_is_stored_owned_by_the_run_and_marked_complete(
    env: dict[str, str],
) -> None:
    api = FakeCoreApi()
    identity = runner.StepIdentity(env)
    runner.ResultStore(api, identity).store('{"n": 1}', "one")
    ((namespace, body),) = api.created
    meta = body["metadata"]
    assert namespace == meta["namespace"] == "ns"
    assert meta["labels"][s.LABEL_RUN_UID] == "uid"
    assert meta["labels"][s.LABEL_STEP] == "collect" and meta["labels"][s.LABEL_ATTEMPT] == "1"
    assert meta["labels"][s.LABEL_KIND] == "result"
    assert meta["labels"][runner.LABEL_KEY_HASH] == identity.key_hash
    assert meta["annotations"] == {
        runner.ANNOTATION_COMPLETE: "true",
        runner.ANNOTATION_SUMMARY: "one",
    }
    (owner,) = meta["ownerReferences"]
    assert (owner["name"], owner["uid"]) == ("r", "uid")
    assert not owner["blockOwnerDeletion"], "the pod may not block the run's deletion"
    assert body["data"] == {"result": '{"n": 1}', "field.n": "1"}
