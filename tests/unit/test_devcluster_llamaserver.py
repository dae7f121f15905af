"""agentrun_devcluster.llamaserver without llama-server: the recording proxy in front of a
scripted upstream, what an exchange reads off an answer, and the failure that says what is
missing when the build scripts fail."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster import llamaserver
from agentrun_devcluster.llamaserver import Exchange, LlamaUnavailable, RecordingProxy
from agentrun_devcluster.modelserver import Entry, ScriptedModel, Status, reply, tool_call
from agentrun_devcluster.ports import lease_ports


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_proxy_forwards_each_request_and_keeps_the_status_and_the_answer() -> None:
    first = reply("", [tool_call("search", {"query": "x"}, "c1")], prompt_tokens=40)
    # The proxy, not the protocol, is under test: the upstream answers whatever it is sent.
    script: list[Entry] = [first, Status(500, "Failed to parse tool call arguments")]
    with ScriptedModel(script=script, strict=False) as up:
        root = up.base_url.removesuffix("/v1")
        with RecordingProxy(upstream=root) as proxy:
            assert _post(proxy.base_url, {"messages": [{"role": "user", "content": "a"}]}) == (
                200,
                first,
            )
            status, body = _post(proxy.base_url, {"messages": [{"role": "user", "content": "b"}]})
    assert status == 500
    assert body["error"]["message"] == "Failed to parse tool call arguments"
    # The upstream got what the proxy got, and the proxy kept both sides.
    assert [r.messages[0]["content"] for r in up.completions()] == ["a", "b"]
    assert [r.messages[0]["content"] for r in proxy.sent()] == ["a", "b"]
    ok, refused = proxy.answered()
    assert (ok.status, ok.tokens, [c["id"] for c in ok.tool_calls]) == (200, 50, ["c1"])
    assert (refused.status, refused.tokens, refused.tool_calls) == (500, 0, [])
    assert refused.request["messages"][0]["content"] == "b"


def test_an_upstream_that_cannot_be_reached_is_a_502_kept_with_status_0() -> None:
    # A leased port that nothing binds refuses connections for as long as it is held.
    with (
        lease_ports(1) as lease,
        RecordingProxy(upstream=f"http://127.0.0.1:{lease.port}") as proxy,
    ):
        status, body = _post(proxy.base_url, {"messages": []})
    assert status == 502
    assert body["error"]["message"].startswith("proxy: ")
    assert [e.status for e in proxy.answered()] == [0]


def test_an_exchange_reads_usage_and_calls_and_nothing_from_a_body_that_is_not_json() -> None:
    answer = reply("", [tool_call("a", {}), tool_call("b", "{not json")], prompt_tokens=7)
    exchange = Exchange({}, 200, json.dumps(answer))
    assert exchange.tokens == 17
    assert [c["function"]["name"] for c in exchange.tool_calls] == ["a", "b"]
    garbage = Exchange({}, 200, "<html>")
    assert (garbage.response, garbage.tokens, garbage.tool_calls) == (None, 0, [])


def test_a_failed_build_script_says_which_script_and_that_its_stderr_tells_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = tmp_path / "build.sh"
    failing.write_text("echo 'build: error: cmake not found' >&2; exit 1\n")
    monkeypatch.setattr(llamaserver, "REPO", tmp_path)
    monkeypatch.setattr(llamaserver, "BUILD_SCRIPT", failing)
    with pytest.raises(LlamaUnavailable, match=r"build\.sh failed with exit code 1, so there is "):
        llamaserver.build_llama(timeout=30)
