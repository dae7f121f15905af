"""``agentrun step http`` (:mod:`agentrun.pod.http_tool`) against a real HTTP server on
127.0.0.1 (tests/support/http_server.py): the request sent once with its headers, the Secret's
value and the idempotency key, the response as the model reads it, redirects, limits and the
failures that fail the attempt; and the same call on the run's executor."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun import settings as s
from agentrun.api import agent as a
from agentrun.api.base import SecretKeySelector
from agentrun.core import http_tool as core
from agentrun.core import turns
from agentrun.core.envelope import parse as parse_envelope
from agentrun.core.executor import call_digest
from agentrun.core.naming import sha256_text
from agentrun.core.pod_env import ENV_HTTP_HEADER, ENV_HTTP_TOOL, ENV_TOOL_ARGS
from agentrun.pod import executor, runner
from agentrun.pod import http_tool as pod
from tests.support.http_server import Server, serving
from tests.support.stores import FakeStore

KEY = "run-uid:1:c1:0123abcd"
TOKEN = "Bearer s3cret-value"


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as found:
        yield found


def _tool(server: Server, **http: Any) -> dict[str, Any]:
    return {
        "name": "lookup",
        "description": "Look a thing up.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "n": {}}},
        "http": {
            "url": f"{server.base}/{{path}}",
            "headers": [
                {"name": "Accept", "value": "application/json"},
                {"name": "Authorization", "secretKeyRef": {"name": "api", "key": "token"}},
            ],
            "allowedHosts": [f"127.0.0.1:{server.port}"],
            **http,
        },
    }


def _env(tool: dict[str, Any], arguments: dict[str, Any], **more: str) -> dict[str, str]:
    return {
        ENV_HTTP_TOOL: a.AgentTool.model_validate(tool).model_dump_json(
            by_alias=True, exclude_none=True
        ),
        f"{ENV_HTTP_HEADER}1": TOKEN,
        ENV_TOOL_ARGS: json.dumps(arguments),
        s.ENV_IDEMPOTENCY_KEY: KEY,
        **more,
    }


def _no_store(identity: runner.StepIdentity, env: dict[str, str]) -> None:
    return None


def _result(message: str) -> dict[str, Any]:
    envelope = parse_envelope(message)
    assert envelope.ok and envelope.result is not None, message
    found: dict[str, Any] = json.loads(envelope.result)
    return found


def test_a_call_sends_one_request_with_its_headers_and_key_and_records_the_response(
    tmp_path: Path, server: Server
) -> None:
    tool = _tool(server, method="POST", body={"template": {"n": "{n}", "fixed": True}})
    env = _env(tool, {"path": "items/a b", "n": 3},
               **{s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination")})  # fmt: skip
    assert pod.run(env, _no_store) == 0
    (seen,) = server.requests()
    assert (seen.method, seen.path) == ("POST", "/items%2Fa%20b")  # one segment, as given
    assert seen.headers["idempotency-key"] == KEY
    assert seen.headers["authorization"] == TOKEN
    assert seen.headers["accept"] == "application/json"
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["user-agent"] == core.USER_AGENT
    assert json.loads(seen.body) == {"n": 3, "fixed": True}
    message = (tmp_path / "termination").read_text()
    record = _result(message)
    assert record["status"] == 200 and record["contentType"] == "application/json"
    assert json.loads(record["body"])["body"] == '{"n":3,"fixed":true}'
    assert parse_envelope(message).summary == f"HTTP 200 OK: {record['body']}"
    assert TOKEN not in message


def test_a_status_that_is_not_2xx_is_a_result_the_model_reads(server: Server) -> None:
    tool = _tool(server, url=f"{server.base}/status/{{path}}")
    code, message = pod.outcome(_env(tool, {"path": "404"}), None)
    assert code == 0
    record = _result(message)
    assert record["status"] == 404 and record["body"] == "status 404"
    assert record["error"] == "the server answered HTTP 404 Not Found"
    assert parse_envelope(message).summary == "error: HTTP 404 Not Found: status 404"


def test_a_secret_the_server_echoes_never_reaches_the_model(server: Server) -> None:
    code, message = pod.outcome(_env(_tool(server), {"path": "echo-auth"}), None)
    assert code == 0 and TOKEN not in message
    assert _result(message)["body"] == "[the value of header Authorization]"


def test_the_body_is_cut_at_the_tools_limit(server: Server) -> None:
    tool = _tool(server, url=f"{server.base}/big/{{path}}", maxResponseBytes=100)
    record = _result(pod.outcome(_env(tool, {"path": "5000"}), None)[1])
    assert record["body"] == "x" * 100 and record["truncated"] is True


def test_a_result_too_large_for_the_message_is_compressed_or_stored(server: Server) -> None:
    tool = _tool(server, url=f"{server.base}/big/{{path}}", maxResponseBytes=100_000)
    code, message = pod.outcome(_env(tool, {"path": "60000"}), None)
    assert code == 0 and len(message.encode()) <= runner.TERMINATION_LIMIT
    assert "resultZ" in json.loads(message)
    assert _result(message)["body"] == "x" * 60000
    # Text that does not compress goes to the run's result object, with a store.
    identity = {s.ENV_RUN: "r", s.ENV_NAMESPACE: "ns", s.ENV_RUN_UID: "uid",
                s.ENV_STEP: "t1-0-lookup", s.ENV_ATTEMPT: "1",
                s.ENV_IDEMPOTENCY_KEY: KEY}  # fmt: skip
    store = FakeStore(runner.StepIdentity(identity))
    noise = secrets.token_urlsafe(8000).encode()
    record = core.response_record(200, "OK", None, noise, False, {}, "u")
    body = {"ok": True, "summary": "big", "result": record}
    code, message = pod._envelope_text(body, store)
    assert code == 0 and json.loads(message)["resultRef"]["key"] == "result"
    code, message = pod._envelope_text(body, None)
    assert code == 1 and "no API access to store it" in message


def test_a_get_follows_a_redirect_on_allowed_hosts_only(server: Server) -> None:
    with serving() as other:
        here = f"{server.base}/landed"
        tool = _tool(server, url=f"{server.base}/redirect?to={{to}}")
        record = _result(pod.outcome(_env(tool, {"to": here}), None)[1])
        assert record["status"] == 200 and record["url"] == here
        assert [r.path for r in server.requests()][-1] == "/landed"
        assert server.requests()[-1].headers["idempotency-key"] == KEY
        away = f"{other.base}/stolen"
        record = _result(pod.outcome(_env(tool, {"to": away}), None)[1])
        assert record["status"] == 302
        assert f"127.0.0.1:{other.port} is not among the tool's allowedHosts" in record["error"]
        assert other.requests() == [], "a redirect reached a host the tool does not allow"
    post = _tool(server, url=f"{server.base}/redirect?to={{to}}", method="POST")
    record = _result(pod.outcome(_env(post, {"to": here}), None)[1])
    assert record["status"] == 302
    assert "the redirect of a POST request is never followed" in record["error"]


def test_a_host_not_allowed_is_never_connected_to(server: Server) -> None:
    tool = _tool(server, url="http://{path}/x")
    code, message = pod.outcome(_env(tool, {"path": "127.0.0.1:1"}), None)
    assert code == 1 and "is not a host name" in message  # the colon was encoded
    tool = _tool(server, url="http://127.0.0.2:{path}/x")
    code, message = pod.outcome(_env(tool, {"path": str(server.port)}), None)
    assert code == 1 and "127.0.0.2" in message and "the request was not sent" in message
    assert server.requests() == []


def test_arguments_the_parameters_refuse_are_never_sent(server: Server) -> None:
    code, message = pod.outcome(_env(_tool(server), {"path": 5}), None)
    assert code == 1 and "5 is not of type 'string'" in message
    assert server.requests() == []


def test_a_request_that_cannot_be_made_fails_the_attempt_in_one_line(server: Server) -> None:
    tool = _tool(server, url="http://127.0.0.1:1/{path}", allowedHosts=["127.0.0.1"])
    code, message = pod.outcome(_env(tool, {"path": "x"}), None)
    assert code == 1
    assert message.startswith("the request to http://127.0.0.1:1/x could not be made: ")
    assert "ConnectionRefusedError" in message and "\n" not in message
    slow = {**_tool(server, url=f"{server.base}/slow/{{path}}"), "timeoutSeconds": 1}
    code, message = pod.outcome(_env(slow, {"path": "3"}), None)
    assert code == 1 and "got no answer within the tool's timeoutSeconds" in message


def test_a_secret_value_that_cannot_be_a_header_is_never_sent_or_printed(
    server: Server,
) -> None:
    env = {**_env(_tool(server), {"path": "x"}), f"{ENV_HTTP_HEADER}1": "t0ken-with-newline\n"}
    code, message = pod.outcome(env, None)
    assert code == 1 and "t0ken" not in message
    assert "(Secret api, key token) has a line break (at character 18)" in message
    assert server.requests() == []
    missing = {k: v for k, v in env.items() if k != f"{ENV_HTTP_HEADER}1"}
    assert "is not set" in pod.outcome(missing, None)[1]


def test_the_command_takes_no_arguments() -> None:
    assert pod.main(["extra"]) == 2


# -- on the run's executor -------------------------------------------------------------------

EXECUTOR_TOKEN = "the-executor-token"


def test_the_executor_makes_a_call_once_with_the_header_value_it_holds(server: Server) -> None:
    tool = _tool(server)
    held = turns.executor_secret_env(SecretKeySelector(name="api", key="token"))
    work = executor.Turns(
        {held: TOKEN, "AGENTRUN_MODEL_API_KEY": "model-key"},
        sha256_text(EXECUTOR_TOKEN),
        executor.turn_call(store_factory=_no_store),
        http_call=executor.http_call(_no_store),
    )
    env = {k: v for k, v in _env(tool, {"path": "x"}).items() if k.startswith("AGENTRUN_TOOL")}
    env[ENV_HTTP_TOOL] = _env(tool, {})[ENV_HTTP_TOOL]
    secret = {f"{ENV_HTTP_HEADER}1": held}
    request = {
        "token": EXECUTOR_TOKEN,
        "job": "r-t1-0-lookup-1",
        "step": "t1-0-lookup",
        "attempt": 1,
        "turn": 1,
        "idempotencyKey": KEY,
        "program": executor.HTTP_CALL,
        "env": env,
        "secretEnv": secret,
        "sha256": call_digest(env, secret),
        "timeoutSeconds": 30,
    }
    body = json.dumps(request).encode()
    assert work.take(body)[0] == 202
    code, answer = work.answer(json.dumps({"token": EXECUTOR_TOKEN, "job": request["job"],
                                           "wait": 30}).encode())  # fmt: skip
    assert code == 200 and answer["exitCode"] == 0, answer
    assert _result(answer["message"])["status"] == 200
    assert work.take(body)[0] == 200  # a repeat: answered from what was taken
    (seen,) = server.requests()
    assert seen.headers["authorization"] == TOKEN and seen.headers["idempotency-key"] == KEY
    # Only what an HTTP call's step has, and only Secrets it holds under a header's name.
    refused: dict[str, dict[str, dict[str, str]]] = {
        "another variable": {"env": {**env, "PATH": "/tmp"}},
        "an MCP header's name": {"secretEnv": {"AGENTRUN_MCP_HEADER_0": held}},
        "the model's key": {"secretEnv": {f"{ENV_HTTP_HEADER}1": "AGENTRUN_MODEL_API_KEY"}},
    }
    for why, change in refused.items():
        parts = {"env": env, "secretEnv": secret, **change}
        digest = call_digest(parts["env"], parts["secretEnv"])
        changed = {**request, **parts, "job": f"other-{len(why)}", "sha256": digest}
        assert work.take(json.dumps(changed).encode())[0] == 400, why
    assert len(server.requests()) == 1
