"""The scripted model server checks what it is sent as strictly as real servers do, so that a
test whose operator sends a request a real server refuses fails (HTTP 400, or 500 for tool
call arguments that are not JSON, as llama.cpp's server answers)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from agentrun_devcluster.modelserver import ScriptedModel, check_request, reply, tool_call

SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def _call(call_id: str, arguments: str = '{"q": "x"}', name: str = "search") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), "tools": [SEARCH], **extra}


SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "why?"}


def _asks(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def _answers(call_id: str, content: Any = "found") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_a_conversation_as_real_servers_take_it_passes() -> None:
    body = _body(
        SYSTEM, USER, _asks(_call("a"), _call("b")), _answers("b"), _answers("a"),
        {"role": "user", "content": [{"type": "text", "text": "[a note]"}]},
        _asks(_call("c", "{}")), _answers("c"),
        {"role": "assistant", "content": "thinking"}, USER,
        tool_choice={"type": "function", "function": {"name": "search"}},
    )  # fmt: skip
    assert check_request(body) is None
    assert check_request(_body(SYSTEM, USER, tool_choice="required")) is None


@pytest.mark.parametrize(
    ("body", "code", "said"),
    [
        (_body(USER, _asks(_call("a", '{"q": "unterminated'))), 500,
         "Failed to parse tool call arguments as JSON"),
        (_body(USER, _asks(_call("a", ""))), 500, "Failed to parse tool call arguments"),
        (_body(USER, _asks(_call("a", "[1]")), _answers("a")), 500, "must be a JSON object"),
        (_body(USER, _asks(_call("a"))), 400,
         "The following tool_call_ids did not have response messages: a"),
        (_body(USER, _asks(_call("a"), _call("b")), _answers("a"), USER), 400,
         "did not have response messages: b"),
        (_body(USER, _asks(_call("a")), _answers("a"), _answers("a")), 400,
         "'a' was already answered"),
        (_body(USER, _answers("x")), 400, "'x' is not a call made"),
        (_body(USER, _asks(_call("a")), _answers("z")), 400, "'z' is not a call made"),
        (_body({"role": "robot", "content": "hi"}), 400, 'Invalid value: "robot"'),
        (_body(SYSTEM, USER, USER), 500, "Conversation roles must alternate"),
        (_body(USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}),
         500, "messages[1] and messages[2] are both assistant"),
        (_body({"role": "user", "content": 5}), 400, "expected one of a string or array"),
        (_body({"role": "user", "content": None}), 400, "expected a string, got null"),
        (_body(USER, {"role": "assistant", "content": None}), 400, "got null"),
        (_body(USER, _asks(_call("a")), _answers("a", None)), 400, "got null"),
        (_body({"role": "user", "content": [{"type": "video"}]}), 400, "Supported values"),
        (_body(USER, _asks({"id": "", "type": "function", "function": {}})), 400,
         "tool_calls[0].id'"),
        (_body(USER, _asks(_call("a"), _call("a"))), 400, "Duplicate tool call id 'a'"),
        (_body(USER, tool_choice="sometimes"), 400, "Supported values are: 'none'"),
        (_body(USER, tool_choice={"type": "function", "function": {"name": "nope"}}), 400,
         "no function named 'nope'"),
        ({"model": "m", "messages": [USER], "tool_choice": "auto"}, 400,
         "only allowed when 'tools' are specified"),
        ({"model": "m", "messages": [USER], "tools": [SEARCH, SEARCH]}, 400, "Duplicate tool"),
        ({"model": "m", "messages": []}, 400, "non-empty array"),
        ({"messages": [USER]}, 400, "'model'"),
        ({"model": "m", "messages": [USER], "max_tokens": 0}, 400, "max_tokens"),
    ],
)  # fmt: skip
def test_what_real_servers_refuse_is_refused(body: dict[str, Any], code: int, said: str) -> None:
    refusal = check_request(body)
    assert refusal is not None
    assert refusal.code == code
    assert said in refusal.message, refusal.message


def test_a_refused_request_is_answered_like_a_server_and_uses_no_reply() -> None:
    with ScriptedModel(script=[reply("the answer")]) as model:
        bad = _body(USER, _asks(_call("a", '{"q": ')), _answers("a"))
        request = urllib.request.Request(
            f"{model.base_url}/chat/completions", data=json.dumps(bad).encode(), method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 500
        error = json.loads(refused.value.read())["error"]
        assert error["message"].startswith("Failed to parse tool call arguments as JSON")
        assert [r.code for r in model.refused] == [500]
        good = _body(USER, _asks(tool_call("search", {"q": 1}, "a")), _answers("a"))
        request = urllib.request.Request(
            f"{model.base_url}/chat/completions", data=json.dumps(good).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as answered:
            said = json.loads(answered.read())
        assert said["choices"][0]["message"]["content"] == "the answer"


def test_a_lenient_server_takes_anything() -> None:
    with ScriptedModel(script=[reply("fine")], strict=False) as model:
        bad = _body(USER, _asks(_call("a", "not json")))
        request = urllib.request.Request(
            f"{model.base_url}/chat/completions", data=json.dumps(bad).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as answered:
            assert answered.status == 200
        assert model.refused == []


def test_a_thinking_model_waits_before_it_answers_and_the_same_seed_waits_the_same() -> None:
    def waits(model: ScriptedModel) -> list[float]:
        return [model.thinking() for _ in range(20)]

    model = ScriptedModel(script=[reply("fine")], delay=(0.1, 0.2), delay_seed=3)
    first = waits(ScriptedModel(delay=(0.1, 0.2), delay_seed=3))
    assert all(0.1 <= w <= 0.2 for w in first)
    assert waits(ScriptedModel(delay=(0.1, 0.2), delay_seed=3)) == first
    assert ScriptedModel().thinking() == 0.0, "at once by default"
    with model:
        request = urllib.request.Request(
            f"{model.base_url}/chat/completions",
            data=json.dumps(_body(USER)).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as answered:
            assert answered.status == 200
        # the server notes the answer once it is sent: the client may read it first
        deadline = time.monotonic() + 5
        while not model.answered_at and time.monotonic() < deadline:
            time.sleep(0.01)
        asked, done = model.completions()[0].at, model.answered_at[0]
        assert done - asked >= 0.1
