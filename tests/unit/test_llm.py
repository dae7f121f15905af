"""``agentrun step llm``: one model turn against a scripted OpenAI-compatible server over real
HTTP (on 127.0.0.1), through the official ``openai`` client."""

from __future__ import annotations

import json
import random
import string
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.api import names
from agentrun.core import agent_loop as loop
from agentrun.core import context as cx
from agentrun.core.envelope import MAX_INFLATED_RESULT
from agentrun.core.envelope import parse as envelope_parse
from agentrun.core.naming import sha256_text
from agentrun.pod import llm, runner
from agentrun_devcluster.modelserver import Raw, ScriptedModel, Status, reply, tool_call
from agentrun_devcluster.ports import lease_ports
from tests.support.stores import FakeStore


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


def _context() -> cx.Context:
    messages = cx.first_messages("You are an SRE.", "why is checkout slow?")
    messages += [
        cx.assistant_message(1, cx.Output("", (cx.ToolCall("c1", "search", '{"q":"x"}'),))),
        cx.tool_message(1, "c1", "p99 is 2s", "p99 is 2s"),
    ]
    tools = cx.tool_definitions([("search", "search logs", {"type": "object"})])
    return cx.Context(turn=2, messages=messages, tools=tools)


def _env(tmp_path: Path, base_url: str, context: cx.Context | None = None) -> dict[str, str]:
    ctx = context or _context()
    parts = cx.split_bytes(ctx.to_json(), 200)  # several parts, as a large context has
    env = {
        s.ENV_RUN: "r", s.ENV_NAMESPACE: "ns", s.ENV_RUN_UID: "uid", s.ENV_STEP: "t2-model",
        s.ENV_ATTEMPT: "1", s.ENV_IDEMPOTENCY_KEY: "uid:2:model:abc",
        s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination-log"),
        loop.ENV_TURN: "2",
        loop.ENV_MODEL_BASE_URL: base_url,
        loop.ENV_MODEL_NAME: "scripted",
        loop.ENV_MODEL_MAX_OUTPUT_TOKENS: "300",
        loop.ENV_CONTEXT_PARTS: str(len(parts)),
        loop.ENV_CONTEXT_SHA256: sha256_text("".join(parts)),
    }  # fmt: skip
    env.update({f"{loop.ENV_CONTEXT_PART}{i}": part for i, part in enumerate(parts)})
    return env


def _termination(env: dict[str, str]) -> str:
    return Path(env[s.ENV_TERMINATION_MESSAGE_PATH]).read_text()


def _no_store(identity: runner.StepIdentity, env: dict[str, str]) -> None:
    return None


def test_a_turn_sends_the_context_and_reports_the_proposed_calls(
    tmp_path: Path, model: ScriptedModel
) -> None:
    model.add(
        reply(
            "let me look",
            [tool_call("search", {"q": "db"}, "c2"), tool_call("search", {"q": "cache"}, "c3")],
            prompt_tokens=120,
            completion_tokens=30,
        )
    )
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0
    envelope = json.loads(_termination(env))
    assert envelope["ok"] is True
    assert envelope["usage"] == {"tokens": 150}
    assert envelope["summary"] == "calls search, search: let me look"
    output = cx.parse_output(json.dumps(envelope["result"]), 2)
    assert isinstance(output, cx.Output)
    assert output.tool_calls == (
        cx.ToolCall("c2", "search", '{"q": "db"}'),
        cx.ToolCall("c3", "search", '{"q": "cache"}'),
    )
    assert (output.prompt_tokens, output.completion_tokens) == (120, 30)
    assert output.finish_reason == "tool_calls"
    (request,) = model.completions()
    # The bookkeeping members never reach the model.
    assert all(not k.startswith("x-") for msg in request.messages for k in msg)
    assert [msg["role"] for msg in request.messages] == ["system", "user", "assistant", "tool"]
    assert request.tool_answers == {"c1": "p99 is 2s"}
    assert request.body["tools"][0]["function"]["name"] == "search"
    assert request.body["max_tokens"] == 300
    assert request.body["model"] == "scripted"
    assert request.authorization == "Bearer none"


def test_the_api_key_comes_from_the_environment_and_is_never_printed(
    tmp_path: Path, model: ScriptedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    model.add(Status(401, "bad key"))
    env = {**_env(tmp_path, model.base_url), loop.ENV_MODEL_API_KEY: "sk-secret-value"}
    assert llm.run_turn(env, store_factory=_no_store) == 1
    assert model.completions()[0].authorization == "Bearer sk-secret-value"
    said = _termination(env)
    assert said == (
        f"ModelErrorStatus: the model endpoint {model.base_url} answered HTTP 401: bad key: "
        "check the API key (spec.agent.model.apiKeySecretRef) and that it may use "
        "spec.agent.model.name"
    )
    out = capsys.readouterr()
    assert "sk-secret-value" not in out.out + out.err + said


def test_an_answer_without_calls(tmp_path: Path, model: ScriptedModel) -> None:
    model.add(reply("the cache is cold"))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0
    envelope = json.loads(_termination(env))
    assert envelope["result"]["content"] == "the cache is cold"
    assert envelope["result"]["toolCalls"] == []


def test_an_endpoint_that_is_down_fails_the_turn_with_the_reason(tmp_path: Path) -> None:
    with lease_ports(1) as down:  # leased and never bound: connections are refused
        base_url = f"http://127.0.0.1:{down.port}/v1"
        env = _env(tmp_path, base_url)
        assert llm.run_turn(env, store_factory=_no_store) == 1
    assert _termination(env).startswith(
        f"ModelUnreachable: the model endpoint {base_url} cannot be reached"
    )


@pytest.mark.parametrize(
    ("answer", "reason", "said"),
    [
        (
            Status(500, "overloaded"),
            "ModelErrorStatus",
            "answered HTTP 500: overloaded: the server failed: a retry may pass",
        ),
        (
            Status(404, "no such model"),
            "ModelErrorStatus",
            "answered HTTP 404: no such model: check spec.agent.model.baseURL",
        ),
        (
            Raw(b"<html>bad gateway</html>", "text/html"),
            "ModelAnswerNotJSON",
            "answered with a body that is not JSON (<html>bad gateway</html>): is "
            "spec.agent.model.baseURL the API's base",
        ),
        (Raw(b'{"choices": []}'), "ModelAnswerInvalid", "not a chat completion: it has no choices"),
        (
            Raw(b'{"object": "nonsense"}'),
            "ModelAnswerInvalid",
            "not a chat completion: it has no choices",
        ),
        (
            Raw(b'{"choices": [{"index": 0, "message": {"content": 5}}]}'),
            "ModelAnswerInvalid",
            "not a chat completion: the message's content is not text",
        ),
        (Raw(b""), "ModelEmptyAnswer", "answered HTTP 200 with an empty body"),
        (Raw(b"   \n"), "ModelEmptyAnswer", "answered HTTP 200 with an empty body"),
        (
            Raw(b'{"choices": [{"message": '),
            "ModelAnswerNotJSON",
            'a body that is not JSON ({"choices": [{"message":)',
        ),
        (Raw(b"null"), "ModelAnswerInvalid", "JSON that is null, not a chat completion object"),
        (Raw(b"[1]"), "ModelAnswerInvalid", "JSON that is an array, not a chat completion"),
        (
            Raw(b'{"choices": [{"message": {"content": "caf\xe9"}}]}'),
            "ModelAnswerNotUTF8",
            "a body that is not UTF-8 text (byte 41 is 0xe9): a chat completion is JSON in UTF-8",
        ),
        (
            Raw(b"\xff\xfe\x00\x00"),
            "ModelAnswerNotUTF8",
            "not UTF-8 text (byte 0 is 0xff)",
        ),
        (
            Raw(b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "a"}}'),
            "ModelUsageInvalid",
            'reported usage.prompt_tokens "a" (not a number) for turn 2: a token count is',
        ),
    ],
)
def test_garbage_from_the_endpoint_fails_the_turn_with_its_reason_and_one_line_saying_why(
    tmp_path: Path, model: ScriptedModel, answer: Any, reason: str, said: str
) -> None:
    """An error status, an empty 200 body, a body that is not JSON or not UTF-8, JSON that is
    not a chat completion: the turn fails with its own reason (the termination message begins
    with it, and the operator takes it from there) and one line saying what was wrong and what
    to do (never a traceback's)."""
    model.add(answer)
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 1
    message = _termination(env)
    assert message.startswith(f"{reason}: the model endpoint {model.base_url} "), message
    assert reason in names.TURN_FAILURES
    assert said in message
    assert "\n" not in message and "Traceback" not in message, message


def test_whatever_fails_in_a_turn_it_ends_in_one_line(tmp_path: Path) -> None:
    """Even what no endpoint answer explains (a client that raises anything at all)."""

    def broken(base_url: str, api_key: str) -> Any:
        raise RuntimeError("first line\n  second line of something deep")

    env = _env(tmp_path, "http://127.0.0.1:9/v1")
    assert llm.run_turn(env, client_factory=broken, store_factory=_no_store) == 1
    assert _termination(env) == (
        "TurnFailed: the turn failed: RuntimeError: first line second line of something deep"
    )


def test_a_context_changed_after_it_was_committed_is_refused(
    tmp_path: Path, model: ScriptedModel
) -> None:
    env = _env(tmp_path, model.base_url)
    env[f"{loop.ENV_CONTEXT_PART}0"] = env[f"{loop.ENV_CONTEXT_PART}0"].replace("SRE", "CFO")
    assert llm.run_turn(env, store_factory=_no_store) == 1
    assert "the context does not match the digest the operator committed" in _termination(env)
    assert model.completions() == []


def test_without_a_context_it_says_what_it_is_for(tmp_path: Path) -> None:
    env = {s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "t")}
    assert llm.run_turn(env, store_factory=_no_store) == 1
    assert "runs as a model turn of an agent run" in _termination(env)


def _incompressible(n: int, seed: int = 7) -> str:
    """``n`` characters that zlib hardly shrinks (letters and digits drawn at random)."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def _packed_bytes(content: str) -> int:
    """Bytes of the termination message a turn answering ``content`` writes."""
    output = cx.Output(content, (), "stop", 50, 10, "scripted")
    return len(llm.inline_text(llm.envelope(output)).encode())


def test_an_output_over_the_inline_limit_goes_compressed_with_no_api_access(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """A long answer (12 KB of prose) needs no ServiceAccount: the envelope carries it
    compressed in the termination message, and the operator reads it back whole."""
    prose = " ".join(f"Line {i}: the checkout cache was cold after the deploy." for i in range(220))
    assert len(prose) > 12_000
    model.add(reply(prose))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0
    message = _termination(env)
    assert len(message.encode()) <= runner.TERMINATION_LIMIT
    assert "resultZ" in json.loads(message) and "result" not in json.loads(message)
    read = envelope_parse(message)
    assert read.ok and read.problem is None and read.result is not None
    assert json.loads(read.result)["content"] == prose


def test_the_largest_output_the_termination_message_holds_and_one_byte_more(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """At the limit (the compressed envelope exactly fills what fits in 4096 bytes) the turn
    succeeds with the default ServiceAccount; one character more fails it, saying why and
    what to do."""
    text = _incompressible(8000)
    fits, over = 0, len(text)
    assert _packed_bytes(text[:fits]) <= runner.TERMINATION_LIMIT < _packed_bytes(text)
    while over - fits > 1:  # the longest prefix that fits, next to one that does not
        middle = (fits + over) // 2
        if _packed_bytes(text[:middle]) <= runner.TERMINATION_LIMIT:
            fits = middle
        else:
            over = middle
    assert over == fits + 1 and fits > runner.INLINE_LIMIT
    model.add(reply(text[:fits]), reply(text[:over]))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0
    message = _termination(env)
    assert len(message.encode()) <= runner.TERMINATION_LIMIT
    read = envelope_parse(message)
    assert read.result is not None and json.loads(read.result)["content"] == text[:fits]

    assert llm.run_turn(env, store_factory=_no_store) == 1
    said = _termination(env)
    assert said.startswith("TurnOutputTooLarge: the turn's output is ")
    assert f"({_packed_bytes(text[:over])} as the compressed envelope)" in said
    assert f"more than the {runner.TERMINATION_LIMIT} bytes of the termination message" in said
    assert "lower spec.agent.model.maxOutputTokens, or give steps a ServiceAccount" in said


def test_an_output_too_large_even_compressed_goes_to_a_config_map(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """With a ServiceAccount that may create ConfigMaps: stored once (no field entries)."""
    text = _incompressible(9000)
    model.add(reply(text))
    env = _env(tmp_path, model.base_url)
    stores: list[FakeStore] = []

    def store(identity: runner.StepIdentity, env: dict[str, str]) -> FakeStore:
        stores.append(FakeStore(identity))
        return stores[-1]

    assert llm.run_turn(env, store_factory=store) == 0
    envelope = json.loads(_termination(env))
    ref = envelope["resultRef"]
    stored = stores[0].objects[ref["name"]]
    assert envelope["resultDigest"] == sha256_text(stored["result"])
    assert json.loads(stored["result"])["content"] == text
    assert stored["fields"] is False


def test_a_service_account_that_may_not_store_it_fails_the_turn_in_one_line(
    tmp_path: Path, model: ScriptedModel
) -> None:
    class Forbidden(FakeStore):
        def previous(self) -> dict[str, Any] | None:
            raise ApiException(status=403, reason="Forbidden")

        def store(self, result: str, summary: str, *, fields: bool = True) -> dict[str, Any]:
            raise ApiException(status=403, reason="Forbidden")

    model.add(reply(_incompressible(9000)))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=lambda i, e: Forbidden(i)) == 1
    said = _termination(env)
    assert "storing it in a ConfigMap failed (ApiException: Forbidden)" in said
    assert "\n" not in said


def test_an_output_over_the_most_a_turn_may_return_fails_the_turn(
    tmp_path: Path, model: ScriptedModel
) -> None:
    model.add(reply("x" * MAX_INFLATED_RESULT))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=lambda i, e: FakeStore(i)) == 1
    assert _termination(env).startswith("TurnOutputTooLarge: the turn's output is ")
    assert f"more than the {MAX_INFLATED_RESULT} a turn may return" in _termination(env)


def test_the_runner_hands_a_tool_its_arguments_as_a_file(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination-log"),
        loop.ENV_TOOL_ARGS: '{"query": "latency"}',
    }
    code = runner.run_step(
        ["sh", "-c", 'cat "$AGENTRUN_TOOL_ARGS_FILE"; echo " $AGENTRUN_TOOL_ARGS"'],
        env,
        lambda i, e: None,
    )
    assert code == 0
    said = json.loads(_termination(env))["result"]
    assert said == '{"query": "latency"} {"query": "latency"}'


def test_agentrun_step_llm_is_the_cli_of_a_turn(
    tmp_path: Path, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrun import cli

    model.add(reply("done"))
    env = _env(tmp_path, model.base_url)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(s.ENV_SERVICEACCOUNT_DIR, str(tmp_path / "no-token"))
    assert cli.main(["step", "llm"]) == 0
    assert json.loads(_termination(env))["result"]["content"] == "done"


def test_the_scripted_model_records_every_request_whatever_its_method(
    model: ScriptedModel,
) -> None:
    """So that a test can say a server (an attacker's) received nothing at all."""
    for method in ("GET", "DELETE", "PUT"):
        request = urllib.request.Request(
            f"{model.base_url}/models", method=method, headers={"Authorization": "Bearer k"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except urllib.error.HTTPError as refused:
            assert refused.code == 405
    received = model.received()
    assert [(r.method, r.path, r.authorization) for r in received] == [
        ("GET", "/v1/models", "Bearer k"),
        ("DELETE", "/v1/models", "Bearer k"),
        ("PUT", "/v1/models", "Bearer k"),
    ]
    assert model.completions() == []


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("search", {"type": "function", "function": {"name": "search"}}),
    ],
)
def test_the_tool_choice_is_sent_as_chat_completions_defines_it(
    tmp_path: Path, model: ScriptedModel, choice: str, sent: Any
) -> None:
    model.add(reply("done") if choice in ("auto", "none") else reply("", [_search_call()]))
    env = {**_env(tmp_path, model.base_url), loop.ENV_MODEL_TOOL_CHOICE: choice}
    assert llm.run_turn(env, store_factory=_no_store) == 0
    (request,) = model.completions()
    assert request.body["tool_choice"] == sent
    assert model.refused == []


def _search_call() -> dict[str, Any]:
    return tool_call("search", {"q": "db"}, "c9")


@pytest.mark.parametrize(
    ("choice", "answer", "said"),
    [
        ("required", reply("plain text"), "is required, but the model endpoint {url} answered "
         "without calling a tool: the server did not honour tool_choice"),
        ("required", reply("cut", finish_reason="length"), "answered without calling a tool "
         "(cut off at maxOutputTokens, perhaps while writing a call)"),
        ("search", reply("plain text"), "is search (a call of that tool), but the model "
         "endpoint {url} answered without calling a tool"),
        ("search", reply("", [tool_call("grep", {"q": "x"})]), "called grep"),
        ("search", reply("", [_search_call(), tool_call("grep", {})]), "called grep, search"),
    ],
)  # fmt: skip
def test_an_answer_that_ignores_the_tool_choice_fails_the_turn_tool_choice_ignored(
    tmp_path: Path, model: ScriptedModel, choice: str, answer: dict[str, Any], said: str
) -> None:
    """toolChoice required (or a tool's name) asks that every turn call a tool (that tool):
    an answer without one, or with another tool's, is not taken (llama-server answered plain
    text to `required`). The turn fails with its own reason, so the operator retries it per
    spec.agent.model.retry, each retry a call of its own."""
    model.add(answer)
    env = {**_env(tmp_path, model.base_url), loop.ENV_MODEL_TOOL_CHOICE: choice}
    assert llm.run_turn(env, store_factory=_no_store) == 1
    message = _termination(env)
    assert message.startswith(f"ToolChoiceIgnored: turn 2: spec.agent.toolChoice {said}"[:35])
    assert said.format(url=model.base_url) in message, message
    assert len(model.completions()) == 1, "one call: a retry is the operator's, a new attempt"


def _no_usage(usage: dict[str, Any] | None, content: str = "the cache is cold") -> Raw:
    body: dict[str, Any] = {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
    }
    if usage is not None:
        body["usage"] = usage
    return Raw(json.dumps(body).encode())


@pytest.mark.parametrize(
    ("usage", "said"),
    [
        ({"prompt_tokens": -3, "completion_tokens": 5}, "usage.prompt_tokens -3"),
        ({"prompt_tokens": 3, "completion_tokens": -1}, "usage.completion_tokens -1"),
        ({"prompt_tokens": 3, "completion_tokens": -0.5}, "usage.completion_tokens -0.5"),
    ],
)
def test_negative_usage_fails_the_turn_model_usage_invalid(
    tmp_path: Path, model: ScriptedModel, usage: dict[str, Any], said: str
) -> None:
    """A negative token count is no usage: the turn is not counted as 0 (which would let the
    server spend the budget for free), it fails saying which count, for which turn."""
    model.add(_no_usage(usage))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 1
    assert _termination(env).startswith(
        f"ModelUsageInvalid: the model endpoint {model.base_url} reported {said} for turn 2: a "
        "token count is a number of at least 0, so this answer cannot be counted against "
        "spec.budget.maxTokens and is not taken (the attempt counts no tokens)"
    )


BOTH = ["prompt_tokens", "completion_tokens"]


@pytest.mark.parametrize(
    ("usage", "estimated"),
    [
        (None, BOTH),
        ({}, BOTH),
        ({"prompt_tokens": None, "completion_tokens": None}, BOTH),
        ({"prompt_tokens": 70}, ["completion_tokens"]),
        ({"completion_tokens": 9, "total_tokens": 9}, ["prompt_tokens"]),
    ],
)  # fmt: skip
def test_usage_the_server_did_not_report_is_estimated_and_named(
    tmp_path: Path, model: ScriptedModel, usage: dict[str, Any] | None, estimated: list[str]
) -> None:
    """A count the server did not report is not 0 (which would let the run's turns past
    budget.maxTokens): it is estimated as the operator estimates a turn before it starts, 4
    bytes a token of the request sent and of the output, and the output names it, so that the
    operator says so on the run (UsageNotReported)."""
    model.add(_no_usage(usage))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0
    envelope = json.loads(_termination(env))
    (request,) = model.completions()
    sent = cx.request_bytes(request.body)
    prompt = -(-sent // cx.BYTES_PER_TOKEN) if "prompt_tokens" in estimated else 70
    completion = 5 if "completion_tokens" in estimated else 9  # 17 bytes: "the cache is cold"
    assert envelope["usage"] == {"tokens": prompt + completion}
    assert envelope["result"]["usage"]["estimated"] == estimated
    output = cx.parse_output(json.dumps(envelope["result"]), 2)
    assert isinstance(output, cx.Output)
    assert output.unreported == tuple(estimated)
    assert (output.prompt_tokens, output.completion_tokens) == (prompt, completion)


def test_reported_usage_is_not_called_estimated(tmp_path: Path, model: ScriptedModel) -> None:
    model.add(_no_usage({"prompt_tokens": 0, "completion_tokens": 0}))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0
    envelope = json.loads(_termination(env))
    assert envelope["usage"] == {"tokens": 0}
    assert "estimated" not in envelope["result"]["usage"]


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("sk-secret-value\n", "ends with a line break (a Secret made from a file"),
        ("sk-secret-value\r\n", "ends with a line break"),
        (" sk-secret-value", "begins or ends with whitespace"),
        ("sk-secret\u2019value", "has a character that is not printable ASCII (its character 10)"),
        ("sk-secret\x00value", "has a character that is not printable ASCII (its character 10)"),
    ],
)
def test_an_api_key_no_header_can_carry_fails_the_turn_without_printing_it(
    tmp_path: Path,
    model: ScriptedModel,
    capsys: pytest.CaptureFixture[str],
    key: str,
    said: str,
) -> None:
    """A key with a line break or a character that is not ASCII cannot be an HTTP header: the
    HTTP client's own error quoted the header, key and all ("Illegal header value b'Bearer
    sk-...'"), or was a raw UnicodeEncodeError. The turn fails saying what is wrong with the
    key and where it comes from, sends nothing, and never prints it."""
    model.add(reply("never sent"))
    env = {**_env(tmp_path, model.base_url), loop.ENV_MODEL_API_KEY: key}
    assert llm.run_turn(env, store_factory=_no_store) == 1
    message = _termination(env)
    assert message.startswith(
        "ModelAPIKeyInvalid: the API key (the Secret key spec.agent.model.apiKeySecretRef "
        f"names) {said}"
    ), message
    assert "UnicodeEncodeError" not in message
    assert model.completions() == []
    out = capsys.readouterr()
    for part in ("secret-value", "secret\u2019value", "secret\x00value"):
        assert part not in out.out + out.err + message


def test_an_error_that_quotes_the_api_key_is_said_without_it(
    tmp_path: Path, model: ScriptedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    model.add(Status(401, "Incorrect API key provided: sk-secret-value."))
    env = {**_env(tmp_path, model.base_url), loop.ENV_MODEL_API_KEY: "sk-secret-value"}
    assert llm.run_turn(env, store_factory=_no_store) == 1
    message = _termination(env)
    assert "Incorrect API key provided: [the API key]." in message
    out = capsys.readouterr()
    assert "sk-secret-value" not in out.out + out.err + message


def test_a_lone_surrogate_in_the_answer_becomes_a_replacement_character(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """JSON may escape half of a surrogate pair (\\ud800), which is no character and which
    UTF-8 cannot carry: the turn failed with a raw UnicodeEncodeError. It is taken as U+FFFD,
    as the operator reads a turn's output anyway."""
    # JSON text, as the server sent it: each \u escape is one of the body's, not the
    # arguments' (which hold the lone surrogate itself once the body is read).
    body = (
        r'{"choices": [{"message": {"content": "x\ud800y", "tool_calls": [{"id": "c1", '
        r'"type": "function", "function": {"name": "search", "arguments": '
        r'"{\"q\": \"\udc00\"}"}}]}, "finish_reason": "tool_calls"}]}'
    )
    model.add(Raw(body.encode()))
    env = _env(tmp_path, model.base_url)
    assert llm.run_turn(env, store_factory=_no_store) == 0, _termination(env)
    envelope = json.loads(_termination(env))
    assert envelope["result"]["content"] == "x\ufffdy"
    assert envelope["result"]["toolCalls"][0]["arguments"] == '{"q": "\ufffd"}'


def test_no_tool_choice_is_sent_unset_or_without_tools(
    tmp_path: Path, model: ScriptedModel
) -> None:
    model.add(reply("one"), reply("two"))
    assert llm.run_turn(_env(tmp_path, model.base_url), store_factory=_no_store) == 0
    bare = cx.Context(turn=1, messages=cx.first_messages(None, "hi"))
    env = {**_env(tmp_path, model.base_url, bare), loop.ENV_MODEL_TOOL_CHOICE: "none"}
    assert llm.run_turn(env, store_factory=_no_store) == 0
    first, second = model.completions()
    assert "tool_choice" not in first.body
    assert "tools" not in second.body and "tool_choice" not in second.body


def test_the_request_sent_is_the_one_the_core_counts(tmp_path: Path, model: ScriptedModel) -> None:
    """What the server received is exactly cx.request_body of the context: the budget's
    estimate (status.agent.context.bytes) counts that body."""
    model.add(reply("done"))
    env = {**_env(tmp_path, model.base_url), loop.ENV_MODEL_TOOL_CHOICE: "auto"}
    assert llm.run_turn(env, store_factory=_no_store) == 0
    (request,) = model.completions()
    assert request.body == cx.request_body(_context(), "scripted", 300, None, "auto")


def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/turn", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read())


def test_a_waiting_turn_takes_one_request_with_its_token_and_nothing_else(
    tmp_path: Path, model: ScriptedModel
) -> None:
    model.add(reply("done"))
    given = _env(tmp_path, model.base_url)
    parts = [
        given[f"{loop.ENV_CONTEXT_PART}{i}"] for i in range(int(given[loop.ENV_CONTEXT_PARTS]))
    ]
    digest = given[loop.ENV_CONTEXT_SHA256]
    env = {k: v for k, v in given.items() if not k.startswith("AGENTRUN_CONTEXT")}
    del env[s.ENV_IDEMPOTENCY_KEY]
    env[s.ENV_TURN_TOKEN_SHA256] = sha256_text("the-token")
    env[s.ENV_POD_IP] = "127.0.0.1"
    exit_codes: list[int] = []
    with lease_ports(1) as lease:
        port = lease.port
        lease.release()
        waiting = threading.Thread(
            target=lambda: exit_codes.append(
                llm.serve(env, port=port, wait_seconds=30, store_factory=_no_store)
            )
        )
        waiting.start()
        request = {"token": "the-token", "parts": parts, "sha256": digest,
                   "idempotencyKey": "uid:2:model:abc"}  # fmt: skip
        code, answer = 0, dict[str, Any]()
        for _ in range(200):
            try:
                code, answer = _post(port, {**request, "token": "guessed"})
                break
            except urllib.error.URLError:
                time.sleep(0.05)
        assert code == 403, answer
        assert _post(port, {**request, "sha256": "0" * 64})[0] == 400
        assert _post(port, request) == (202, {"taken": digest})
        waiting.join(30)
    assert exit_codes == [0]
    assert json.loads(_termination(env))["summary"] == "done"
    (sent,) = model.completions()  # one call: the refused requests reached no model
    assert [msg["role"] for msg in sent.messages] == ["system", "user", "assistant", "tool"]


def test_a_turn_without_its_request_fails_when_its_wait_ends(tmp_path: Path) -> None:
    env = {s.ENV_TURN_TOKEN_SHA256: sha256_text("t"), s.ENV_POD_IP: "127.0.0.1",
           s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination-log")}  # fmt: skip
    with lease_ports(1) as lease:
        port = lease.port
        lease.release()
        assert llm.serve(env, port=port, wait_seconds=0.2, store_factory=_no_store) == 1
    assert _termination(env).startswith(
        "TurnRequestMissing: no request for the turn came within 0 s: the operator did not send it"
    )


def test_a_repeated_request_is_answered_with_what_was_taken() -> None:
    requests = llm.TurnRequests(sha256_text("t"))
    first = {"token": "t", "parts": ["a", "b"], "sha256": sha256_text("ab"), "idempotencyKey": "k"}
    assert requests.offer(json.dumps(first).encode()) == (202, {"taken": sha256_text("ab")})
    other = {**first, "parts": ["c"], "sha256": sha256_text("c")}
    assert requests.offer(json.dumps(other).encode()) == (200, {"taken": sha256_text("ab")})
    assert requests.offer(b"not json")[0] == 400
    env = requests.env({})
    assert env[loop.ENV_CONTEXT_PARTS] == "2" and env[s.ENV_IDEMPOTENCY_KEY] == "k"
    assert env[f"{loop.ENV_CONTEXT_PART}1"] == "b"
