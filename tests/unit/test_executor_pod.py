"""``agentrun step llm`` as a run's executor (:mod:`agentrun.pod.executor`): many turns in one
process, each attempt called once, its outcome kept for an operator that asks again."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun import settings as s
from agentrun.core import agent_loop as loop
from agentrun.core import context as cx
from agentrun.core.naming import sha256_text
from agentrun.pod import executor, runner
from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.ports import lease_ports
from tests.support.stores import FakeStore

TOKEN = "the-executor-token"


def _request(turn: int, attempt: int = 1, **changes: Any) -> dict[str, Any]:
    doc = cx.Context(turn=turn, messages=cx.first_messages("You are an SRE.", f"turn {turn}?"))
    parts, digest = doc.encoded()
    return {
        "token": TOKEN,
        "job": f"r-t{turn}-model-{attempt}",
        "step": f"t{turn}-model",
        "attempt": attempt,
        "turn": turn,
        "parts": parts,
        "sha256": digest,
        "idempotencyKey": f"uid:{turn}:model",
        **changes,
    }


def _body(request: dict[str, Any]) -> bytes:
    return json.dumps(request).encode()


class Calls:
    """A call that records the environment of each attempt it was run for."""

    def __init__(self, release: threading.Event | None = None) -> None:
        self.envs: list[dict[str, str]] = []
        self.release = release

    def __call__(self, env: dict[str, str]) -> tuple[int, str]:
        self.envs.append(env)
        if self.release is not None:
            self.release.wait(10)
        return 0, json.dumps({"ok": True, "summary": f"turn {env[loop.ENV_TURN]}"})


def _turns(call: executor.Call) -> executor.Turns:
    return executor.Turns({loop.ENV_MODEL_NAME: "m"}, sha256_text(TOKEN), call)


def test_each_attempt_is_called_once_and_a_repeat_gets_what_was_taken() -> None:
    release = threading.Event()
    calls = Calls(release)
    turns = _turns(calls)
    first = _request(1)
    assert turns.take(_body(first)) == (202, {"taken": first["sha256"]})
    assert turns.take(_body(first)) == (200, {"taken": first["sha256"]})
    assert turns.answer(_body({"token": TOKEN, "job": first["job"], "wait": 0})) == (
        202,
        {"taken": first["sha256"]},
    )
    release.set()
    code, answer = turns.answer(_body({"token": TOKEN, "job": first["job"], "wait": 5}))
    assert code == 200 and answer["exitCode"] == 0
    assert json.loads(answer["message"])["summary"] == "turn 1"
    # Asked again (an operator restarted): the same outcome, no second call.
    assert turns.take(_body(first))[1] == answer
    assert turns.answer(_body({"token": TOKEN, "job": first["job"]})) == (200, answer)
    assert len(calls.envs) == 1
    (env,) = calls.envs
    assert env[s.ENV_STEP] == "t1-model" and env[s.ENV_ATTEMPT] == "1"
    assert env[s.ENV_IDEMPOTENCY_KEY] == "uid:1:model" and env[loop.ENV_MODEL_NAME] == "m"
    parts = [env[f"{loop.ENV_CONTEXT_PART}{i}"] for i in range(int(env[loop.ENV_CONTEXT_PARTS]))]
    assert sha256_text("".join(parts)) == env[loop.ENV_CONTEXT_SHA256] == first["sha256"]
    # The next turn, and a retry of it, are calls of their own.
    turns.take(_body(_request(2)))
    turns.take(_body(_request(2, attempt=2)))
    for job in ("r-t2-model-1", "r-t2-model-2"):
        assert turns.answer(_body({"token": TOKEN, "job": job, "wait": 5}))[0] == 200
    assert [e[s.ENV_ATTEMPT] for e in calls.envs[1:]] == ["1", "2"]


def test_only_the_operators_token_and_the_committed_context_are_taken() -> None:
    calls = Calls()
    turns = _turns(calls)
    request = _request(1)
    assert turns.take(_body({**request, "token": "guessed"}))[0] == 403
    assert turns.take(_body({**request, "sha256": "0" * 64}))[0] == 400
    assert turns.take(b"not json")[0] == 400
    assert turns.take(_body({k: v for k, v in request.items() if k != "turn"}))[0] == 400
    assert turns.answer(_body({"token": "guessed", "job": request["job"]}))[0] == 403
    assert turns.answer(_body({"token": TOKEN, "job": request["job"]}))[0] == 404
    assert calls.envs == []
    assert turns.take(_body(request))[0] == 202
    # The same attempt with another context: refused, saying which one was taken.
    other = _request(1, parts=["{}"], sha256=sha256_text("{}"))
    assert turns.take(_body(other)) == (409, {"taken": request["sha256"]})


def test_the_last_attempts_are_remembered_and_older_ones_forgotten() -> None:
    turns = _turns(Calls())
    for turn in range(1, executor.REMEMBERED + 2):
        turns.take(_body(_request(turn)))
    assert turns.answer(_body({"token": TOKEN, "job": "r-t1-model-1"}))[0] == 404
    last = f"r-t{executor.REMEMBERED + 1}-model-1"
    assert turns.answer(_body({"token": TOKEN, "job": last, "wait": 5}))[0] == 200


def test_a_call_that_raises_is_an_outcome_of_one_line() -> None:
    def broken(env: dict[str, str]) -> tuple[int, str]:
        raise RuntimeError("boom")

    turns = _turns(broken)
    request = _request(1)
    turns.take(_body(request))
    code, answer = turns.answer(_body({"token": TOKEN, "job": request["job"], "wait": 5}))
    assert code == 200 and answer["exitCode"] == 1
    assert answer["message"] == "the turn failed: RuntimeError: boom"


def test_a_result_found_under_the_attempts_name_never_answers_the_turn() -> None:
    """The mimic of a model turn's large output: the object the executor would store,
    written first by someone else. The executor never takes it for the turn's outcome: the
    turn's own program runs (here it stops at once: no context was sent)."""

    class Found(FakeStore):
        def __init__(self, identity: runner.StepIdentity) -> None:
            super().__init__(identity)
            self.store("FORGED model answer", "FORGED")

    def client(base_url: str, key: str) -> Any:
        raise AssertionError("no context: the model is not reached")

    call = executor.turn_call(client, lambda identity, env: Found(identity))
    env = {s.ENV_RUN: "r", s.ENV_NAMESPACE: "ns", s.ENV_RUN_UID: "uid", s.ENV_STEP: "t1-model",
           s.ENV_ATTEMPT: "2", s.ENV_IDEMPOTENCY_KEY: "uid:1:model"}  # fmt: skip
    code, message = call(env)
    assert code == 1 and "FORGED" not in message, message
    assert "AGENTRUN_CONTEXT_PARTS is not set" in message, message


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


def _post(port: int, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=_body(payload), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read())


def _no_store(identity: runner.StepIdentity, env: dict[str, str]) -> None:
    return None


def test_an_executor_serves_the_turns_of_a_run_over_http_then_ends_when_idle(
    tmp_path: Path, model: ScriptedModel
) -> None:
    model.add(reply("", [tool_call("search", {"q": "x"}, "c1")]), reply("done"))
    env = {s.ENV_EXECUTOR_TOKEN_SHA256: sha256_text(TOKEN), s.ENV_POD_IP: "127.0.0.1",
           s.ENV_RUN: "r", s.ENV_NAMESPACE: "ns", s.ENV_RUN_UID: "uid",
           loop.ENV_MODEL_BASE_URL: model.base_url, loop.ENV_MODEL_NAME: "scripted",
           loop.ENV_MODEL_MAX_OUTPUT_TOKENS: "300"}  # fmt: skip
    exit_codes: list[int] = []
    with lease_ports(1) as lease:
        port = lease.port
        lease.release()
        serving = threading.Thread(
            target=lambda: exit_codes.append(
                executor.serve(env, port=port, idle_seconds=1.0, store_factory=_no_store)
            )
        )
        serving.start()
        outcomes = []
        for turn in (1, 2):
            request = _request(turn)
            for _ in range(200):
                try:
                    code, _answer = _post(port, "/turn", request)
                    break
                except urllib.error.URLError:
                    time.sleep(0.05)
            assert code == 202
            wait = {"token": TOKEN, "job": request["job"], "wait": 20}
            code, answer = _post(port, "/answer", wait)
            assert code == 200 and answer["exitCode"] == 0, answer
            outcomes.append(json.loads(answer["message"]))
        serving.join(30)
    assert exit_codes == [0]
    assert outcomes[0]["result"]["toolCalls"][0]["name"] == "search"
    assert outcomes[1]["summary"] == "done"
    assert len(model.completions()) == 2
