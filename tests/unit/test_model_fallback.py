"""Model fallback (spec.agent.model.fallbacks): the turn's program asks the next model when the
one before is unavailable (HTTP 5xx, no connection, a 429 past its patience), never for a
refused request or a broken answer; the operator gives each fallback's key to the turn's pod
from its own Secret, asks the creator's right to each, freezes them with the model, and says
on the run which model answered.

The program's tests run against scripted OpenAI-compatible servers over real HTTP on
127.0.0.1 (the official ``openai`` client in between), as tests/unit/test_llm.py does."""

from __future__ import annotations

import dataclasses
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
from agentrun.access import authz
from agentrun.api import agent as a
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.clients.plugin import transcript
from agentrun.core import agent_loop as loop
from agentrun.core import agent_output, builder, rights, turn_steps
from agentrun.core import context as cx
from agentrun.core import executor as core_executor
from agentrun.core.naming import sha256_text
from agentrun.core.pod_env import (
    ENV_MODEL_FALLBACKS,
    ENV_MODEL_TIMEOUT_SECONDS,
    fallback_env,
)
from agentrun.pod import executor, llm, model_call, runner
from agentrun_devcluster.modelserver import Drop, Raw, ScriptedModel, Status, reply
from agentrun_devcluster.ports import lease_ports
from tests.support.agent_sim import SEARCH, AgentSim, agent_run, call

PRIMARY_KEY = "sk-primary-0123456789"
BACKUP_KEY = "sk-backup-9876543210"


@pytest.fixture
def primary() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


@pytest.fixture
def backup() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


def _context() -> cx.Context:
    return cx.Context(turn=1, messages=cx.first_messages("You are an SRE.", "why is it slow?"))


def _env(tmp_path: Path, *models: tuple[str, str | None], **more: str) -> dict[str, str]:
    """A turn's environment with ``models`` (base URL, API key): the first spec.agent.model,
    the rest its fallbacks, as the operator sets them (turn_steps.model_turn_step)."""
    parts, digest = _context().encoded()
    (first_url, first_key), rest = models[0], models[1:]
    env = {
        s.ENV_RUN: "r", s.ENV_NAMESPACE: "ns", s.ENV_RUN_UID: "uid", s.ENV_STEP: "t1-model",
        s.ENV_ATTEMPT: "1", s.ENV_IDEMPOTENCY_KEY: "uid:1:model:abc",
        s.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination-log"),
        loop.ENV_TURN: "1",
        loop.ENV_MODEL_BASE_URL: first_url,
        loop.ENV_MODEL_NAME: "primary",
        loop.ENV_MODEL_MAX_OUTPUT_TOKENS: "300",
        loop.ENV_CONTEXT_PARTS: str(len(parts)),
        loop.ENV_CONTEXT_SHA256: digest,
        **{f"{loop.ENV_CONTEXT_PART}{i}": part for i, part in enumerate(parts)},
    }  # fmt: skip
    if first_key:
        env[loop.ENV_MODEL_API_KEY] = first_key
    if rest:
        env[ENV_MODEL_FALLBACKS] = str(len(rest))
    for index, (url, key) in enumerate(rest, start=1):
        env[fallback_env(index, "BASE_URL")] = url
        env[fallback_env(index, "NAME")] = f"backup-{index}"
        if key:
            env[fallback_env(index, "API_KEY")] = key
    return {**env, **more}


def _no_store(identity: runner.StepIdentity, env: dict[str, str]) -> None:
    return None


def _turn(env: dict[str, str]) -> tuple[int, str]:
    code = llm.run_turn(env, store_factory=_no_store)
    return code, Path(env[s.ENV_TERMINATION_MESSAGE_PATH]).read_text()


def _output(message: str) -> cx.Output:
    output = cx.parse_output(json.dumps(json.loads(message)["result"]), 1)
    assert isinstance(output, cx.Output), output
    return output


# -- the turn's program ---------------------------------------------------------------------------


def test_a_5xx_falls_back_to_the_next_model_with_its_own_key(
    tmp_path: Path,
    primary: ScriptedModel,
    backup: ScriptedModel,
    capsys: pytest.CaptureFixture[str],
) -> None:
    primary.add(Status(500, f"boom (key {PRIMARY_KEY})"))
    backup.add(reply("the cache is cold"))
    env = _env(tmp_path, (primary.base_url, PRIMARY_KEY), (backup.base_url, BACKUP_KEY))
    code, message = _turn(env)
    assert code == 0, message
    output = _output(message)
    assert output.content == "the cache is cold"
    assert output.answered_by == cx.Answerer(1, "backup-1", backup.base_url)
    assert output.fallback_from == (
        f"primary at {primary.base_url}: ModelErrorStatus: HTTP 500: boom (key [the API key])",
    )
    # Each model got its own key, and only its own; the same request but for the model name.
    (first,) = primary.completions()
    (second,) = backup.completions()
    assert first.authorization == f"Bearer {PRIMARY_KEY}"
    assert second.authorization == f"Bearer {BACKUP_KEY}"
    assert second.body["model"] == "backup-1" and first.body["model"] == "primary"
    assert first.messages == second.messages
    said = capsys.readouterr()
    assert "answered by fallback 1 backup-1" in said.out
    for key in (PRIMARY_KEY, BACKUP_KEY):
        assert key not in said.out + said.err + message


def test_no_connection_and_a_dropped_connection_fall_back(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel
) -> None:
    primary.add(Drop())
    backup.add(reply("first"), reply("second"))
    with lease_ports(1) as down:  # leased and never bound: connections are refused
        closed = f"http://127.0.0.1:{down.port}/v1"
        env = _env(tmp_path, (closed, None), (primary.base_url, None), (backup.base_url, None))
        code, message = _turn(env)
    assert code == 0, message
    output = _output(message)
    assert output.answered_by is not None and output.answered_by.index == 2
    refused, dropped = output.fallback_from
    assert refused.startswith(f"primary at {closed}: ModelUnreachable: cannot be reached: ")
    assert dropped.startswith(
        f"fallback 1 backup-1 at {primary.base_url}: ModelUnreachable: cannot be reached: "
    )
    assert len(primary.completions()) == 1 and len(backup.completions()) == 1


def test_a_429_is_waited_for_as_its_retry_after_asks_then_the_same_model_answers(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel
) -> None:
    primary.add(Status(429, "slow down", (("Retry-After", "2"),)), reply("patient"))
    env = _env(tmp_path, (primary.base_url, None), (backup.base_url, None))
    waits: list[float] = []
    output = model_call.call_model(env, _context(), sleep=waits.append)
    assert waits == [2.0]
    assert output.content == "patient"
    assert output.answered_by == cx.Answerer(0, "primary", primary.base_url)
    assert output.fallback_from == ()
    assert len(primary.completions()) == 2 and backup.completions() == []


def test_a_429_whose_wait_the_deadline_does_not_leave_falls_back_at_once(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel
) -> None:
    primary.add(Status(429, "slow down", (("Retry-After", "30"),)))
    backup.add(reply("from the backup"))
    env = _env(
        tmp_path,
        (primary.base_url, None),
        (backup.base_url, None),
        **{ENV_MODEL_TIMEOUT_SECONDS: "20"},
    )
    waits: list[float] = []
    output = model_call.call_model(env, _context(), sleep=waits.append)
    assert waits == []
    assert output.content == "from the backup"
    (why,) = output.fallback_from
    assert why.startswith(f"primary at {primary.base_url}: ModelErrorStatus: HTTP 429: slow down")
    assert "it asks to wait 30 s, more than the turn's deadline leaves" in why


def test_a_429_past_the_patience_falls_back(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel
) -> None:
    limited = Status(429, "slow down", (("Retry-After", "40"),))
    primary.add(limited, limited)
    backup.add(reply("from the backup"))
    env = _env(tmp_path, (primary.base_url, None), (backup.base_url, None))
    waits: list[float] = []
    output = model_call.call_model(env, _context(), sleep=waits.append)
    assert waits == [40.0], "one wait of 40 s; a second would pass the 60 s patience"
    (why,) = output.fallback_from
    assert "waited 40 s as its Retry-After asked; it asks to wait 40 s more" in why
    assert output.answered_by is not None and output.answered_by.index == 1


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Status(400, "bad request"), "ModelErrorStatus"),
        (Status(401, "bad key"), "ModelErrorStatus"),
        (Raw(b"<html>bad gateway</html>", "text/html"), "ModelAnswerNotJSON"),
        (Raw(b'{"choices": []}'), "ModelAnswerInvalid"),
    ],
)
def test_a_refused_request_or_a_broken_answer_is_no_reason_to_fall_back(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel, answer: Any, reason: str
) -> None:
    """The next model would be sent the same request: the turn fails with the reason, as
    without fallbacks, and the fallback hears nothing."""
    primary.add(answer)
    env = _env(tmp_path, (primary.base_url, None), (backup.base_url, None))
    code, message = _turn(env)
    assert code == 1
    assert message.startswith(f"{reason}: the model endpoint {primary.base_url} "), message
    assert backup.received() == []


def test_a_turn_whose_every_model_failed_has_the_last_reason_and_names_each(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel
) -> None:
    primary.add(Status(503, f"overloaded {PRIMARY_KEY}"))
    backup.add(Status(404, "no such model"))
    with lease_ports(1) as down:
        closed = f"http://127.0.0.1:{down.port}/v1"
        env = _env(
            tmp_path,
            (primary.base_url, PRIMARY_KEY),
            (closed, BACKUP_KEY),
            (backup.base_url, None),
        )
        code, message = _turn(env)
    assert code == 1
    assert message.startswith("ModelErrorStatus: no model of the turn answered (3 asked): ")
    assert f"primary at {primary.base_url}: ModelErrorStatus: HTTP 503: overloaded" in message
    assert f"then fallback 1 backup-1 at {closed}: ModelUnreachable: cannot be reached" in message
    assert (
        f"then fallback 2 backup-2 at {backup.base_url}: the model endpoint {backup.base_url} "
        "answered HTTP 404: no such model"
    ) in message
    assert PRIMARY_KEY not in message and "[the API key]" in message
    assert "\n" not in message
    # The last one unavailable too: its reason.
    primary.add(Status(500, "down"))
    backup.add(Status(502, "bad gateway"))
    code, message = _turn(_env(tmp_path, (primary.base_url, None), (backup.base_url, None)))
    assert code == 1 and message.startswith("ModelErrorStatus: no model of the turn answered")


def test_without_fallbacks_a_turn_is_as_before(tmp_path: Path, primary: ScriptedModel) -> None:
    """One request, a 429 fails the attempt at once (retry decides), and the output names no
    model (there is only the one)."""
    primary.add(Status(429, "slow down", (("Retry-After", "1"),)), reply("later"))
    env = _env(tmp_path, (primary.base_url, None))
    code, message = _turn(env)
    assert code == 1 and message.startswith("ModelErrorStatus: the model endpoint ")
    assert "answered HTTP 429: slow down" in message
    code, message = _turn(env)
    assert code == 0
    result = json.loads(message)["result"]
    assert "answeredBy" not in result and "fallbackFrom" not in result


def _post(port: int, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(payload).encode(), method="POST"
    )
    for _ in range(200):
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return int(answer.status), json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return int(error.code), json.loads(error.read())
        except urllib.error.URLError:
            time.sleep(0.05)  # not listening yet
    raise AssertionError("the executor never listened")


def test_the_runs_executor_falls_back_too_and_keeps_the_keys_from_its_calls(
    tmp_path: Path, primary: ScriptedModel, backup: ScriptedModel
) -> None:
    primary.add(Status(502, "bad gateway"), Status(502, "bad gateway"))
    backup.add(reply("one"), reply("two"))
    token = "the-executor-token"
    env = _env(tmp_path, (primary.base_url, PRIMARY_KEY), (backup.base_url, BACKUP_KEY))
    env = {k: v for k, v in env.items() if not k.startswith("AGENTRUN_CONTEXT")}
    env.update({s.ENV_EXECUTOR_TOKEN_SHA256: sha256_text(token), s.ENV_POD_IP: "127.0.0.1"})
    exit_codes: list[int] = []
    outcomes: list[dict[str, Any]] = []
    with lease_ports(1) as lease:
        port = lease.port
        lease.release()
        serving = threading.Thread(
            target=lambda: exit_codes.append(
                executor.serve(env, port=port, idle_seconds=1.0, store_factory=_no_store)
            )
        )
        serving.start()
        for turn in (1, 2):
            doc = cx.Context(turn=turn, messages=cx.first_messages("You are an SRE.", "why?"))
            parts, digest = doc.encoded()
            request = {"token": token, "job": f"r-t{turn}-model-1", "step": f"t{turn}-model",
                       "attempt": 1, "turn": turn, "parts": parts, "sha256": digest,
                       "idempotencyKey": f"uid:{turn}:model"}  # fmt: skip
            assert _post(port, "/turn", request)[0] == 202
            code, answer = _post(port, "/answer", {"token": token, "job": request["job"],
                                                   "wait": 20})  # fmt: skip
            assert code == 200 and answer["exitCode"] == 0, answer
            outcomes.append(json.loads(answer["message"]))
        serving.join(30)
    assert exit_codes == [0]
    assert [o["result"]["answeredBy"]["index"] for o in outcomes] == [1, 1]
    assert [r.authorization for r in backup.completions()] == [f"Bearer {BACKUP_KEY}"] * 2
    # A call sent to the executor gets none of the models' keys.
    turns = executor.Turns(env, sha256_text(token), lambda e: (0, "{}"))
    call_env = turns._call_env({"env": {}, "secretEnv": {}}, core_executor.call_digest({}, {}),
                               "k", {}, frozenset())  # fmt: skip
    assert isinstance(call_env, dict)
    assert not [k for k in call_env if model_call.is_key_env(k)]


# -- the operator ---------------------------------------------------------------------------------

PRIMARY: dict[str, Any] = {
    "baseURL": "http://llm.models.svc:8000/v1",
    "name": "big",
    "apiKeySecretRef": {"name": "llm", "key": "api-key"},
    "timeoutSeconds": 120,
}
FALLBACKS: list[dict[str, Any]] = [
    {
        "baseURL": "http://backup.models.svc:8000/v1",
        "name": "small",
        "apiKeySecretRef": {"name": "backup-llm", "key": "token"},
        "temperature": 0.5,
    },
    {"baseURL": "http://local.models.svc:8000/v1", "name": "tiny"},
]


class Reviews:
    """LocalSubjectAccessReviews answered from the (user, verb, resource, name) allowed."""

    def __init__(self, grants: set[tuple[str, str, str, str]]) -> None:
        self.grants = grants

    def create_namespaced_local_subject_access_review(
        self, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        spec = body["spec"]
        attrs = spec["resourceAttributes"]
        asked = (spec["user"], attrs["verb"], attrs["resource"], attrs["name"])
        return {"status": {"allowed": asked in self.grants}}


def _created_by(run: m.AgentRun, user: str) -> m.AgentRun:
    run.metadata.annotations = {
        m.ANNOTATION_CREATED_BY: user,
        m.ANNOTATION_CREATED_BY_GROUPS: "[]",
    }
    return run


def _sim(**model: Any) -> AgentSim:
    return AgentSim(agent_run(model={**PRIMARY, "fallbacks": FALLBACKS, **model}, tools=[SEARCH]))


def test_the_api_takes_at_most_three_fallbacks_checked_as_the_model_is() -> None:
    model = a.ModelEndpoint.model_validate({**PRIMARY, "fallbacks": FALLBACKS})
    assert [f.name for f in model.fallbacks or []] == ["small", "tiny"]
    with pytest.raises(ValueError, match="at most 3"):
        a.ModelEndpoint.model_validate({**PRIMARY, "fallbacks": FALLBACKS * 2})
    with pytest.raises(ValueError, match="baseURL"):
        a.ModelEndpoint.model_validate({**PRIMARY, "fallbacks": [{"baseURL": "x", "name": "n"}]})
    with pytest.raises(ValueError, match="temperature"):
        a.ModelFallback.model_validate({"baseURL": "http://x/v1", "name": "n", "temperature": 3})


def test_each_fallback_is_in_the_turns_env_its_key_from_its_own_secret() -> None:
    sim = _sim()
    sim.settle()
    job = sim.model_job()
    assert job is not None
    create = sim.created_specs[job.name]
    env = {e.name: e for e in create.step.container.env or []}
    assert env[ENV_MODEL_FALLBACKS].value == "2"
    assert env[ENV_MODEL_TIMEOUT_SECONDS].value == "120"
    assert env[fallback_env(1, "BASE_URL")].value == "http://backup.models.svc:8000/v1"
    assert env[fallback_env(1, "NAME")].value == "small"
    assert env[fallback_env(1, "TEMPERATURE")].value == "0.5"
    key = env[fallback_env(1, "API_KEY")].value_from
    assert key is not None and key.secret_key_ref is not None
    assert (key.secret_key_ref.name, key.secret_key_ref.key) == ("backup-llm", "token")
    assert env[fallback_env(1, "API_KEY")].value is None, "never the value itself"
    assert fallback_env(2, "API_KEY") not in env and fallback_env(2, "TEMPERATURE") not in env
    assert env[fallback_env(2, "NAME")].value == "tiny"


def test_the_creator_must_be_allowed_to_read_every_fallbacks_key() -> None:
    sim = _sim()
    sim.settle()
    run = sim.run
    statuses = {st.name: st for st in run.status.steps or []} if run.status else {}
    (turn,) = loop.dynamic_steps(run, statuses, loop.AgentConfig())
    checks = rights.checks_for(run, turn)
    assert [(c.describe(), c.source) for c in checks] == [
        ("get secrets/llm", f"env {loop.ENV_MODEL_API_KEY}"),
        ("get secrets/backup-llm", f"env {fallback_env(1, 'API_KEY')}"),
    ]
    # The executor holds them too, so its checks ask for them.
    held = {c.permission for c in turn_steps.executor_checks(run)}
    assert {("get", "secrets", "llm"), ("get", "secrets", "backup-llm")} <= held
    # A creator who may read the model's key but not the fallback's: the turn is refused,
    # naming the fallback's Secret.
    begun = _sim()
    begun.tick()  # the first turn's step, committed and not launched: its rights are asked
    assert begun.step_status("t1-model").phase == SP.PENDING
    fresh = _created_by(begun.run.model_copy(deep=True), "alice")
    api = Reviews({("alice", "get", "secrets", "llm")})
    refusals = authz.Authorizer(api).refusals(fresh)
    assert list(refusals) == ["t1-model"]
    assert refusals["t1-model"].startswith(
        f"creator alice may not get secrets/backup-llm in {fresh.metadata.namespace} "
        f"(env {fallback_env(1, 'API_KEY')})"
    )
    allowed = Reviews(
        {("alice", "get", "secrets", "llm"), ("alice", "get", "secrets", "backup-llm")}
    )
    assert authz.Authorizer(allowed).refusals(fresh) == {}


def test_a_refused_fallback_key_fails_the_turn_forbidden_before_any_job() -> None:
    sim = _sim()
    why = "creator alice may not get secrets/backup-llm in default (env X)"
    sim.observed = lambda: dataclasses.replace(  # type: ignore[method-assign]
        AgentSim.observed(sim), refusals={"t1-model": why}
    )
    sim.settle()
    turn = sim.step_status("t1-model")
    assert turn.phase == SP.FAILED and turn.error is not None
    assert turn.error.reason == "Forbidden" and "secrets/backup-llm" in turn.error.message
    assert sim.model_job() is None
    assert sim.status.phase == m.RunPhase.FAILED


def test_a_change_of_the_fallbacks_after_the_first_pass_fails_the_run() -> None:
    sim = _sim()
    sim.answer("", [call("search", {"query": "x"}, "c")])
    agent = sim.run.spec.agent
    assert agent is not None
    attacker = [{"baseURL": "http://attacker.example/v1", "name": "x",
                 "apiKeySecretRef": {"name": "llm", "key": "api-key"}}]  # fmt: skip
    model = a.ModelEndpoint.model_validate({**agent.model.to_wire(), "fallbacks": attacker})
    sim.spec_update(agent=agent.model_copy(update={"model": model}))
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    assert sim.condition("Ready") is not None
    message = sim.status.message or ""
    assert message.startswith("spec.agent.model.fallbacks changed after the run started"), message
    assert not any(
        e.value == "http://attacker.example/v1"
        for c in sim.created_specs.values()
        for e in c.step.container.env or []
    )


def _fallback_envelope(content: str, index: int, before: tuple[str, ...]) -> str:
    names = {0: ("big", PRIMARY["baseURL"]), 1: ("small", FALLBACKS[0]["baseURL"])}
    name, url = names.get(index, ("tiny", FALLBACKS[1]["baseURL"]))
    output = cx.Output(
        content=content,
        finish_reason="stop",
        prompt_tokens=100,
        completion_tokens=20,
        answered_by=cx.Answerer(index, name, url),
        fallback_from=before,
    )
    return json.dumps(
        {
            "ok": True,
            "summary": cx.output_summary(output),
            "result": cx.output_result(output),
            "usage": {"tokens": 120},
        }
    )


def test_a_turn_answered_by_a_fallback_says_so_in_status_record_and_an_event() -> None:
    sim = _sim()
    sim.settle()
    job = sim.model_job()
    assert job is not None
    why = f"big at {PRIMARY['baseURL']}: ModelErrorStatus: HTTP 500: boom"
    sim.finish(job.name, True, _fallback_envelope("the cache is cold", 1, (why,)))
    sim.settle()
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    (summary,) = sim.agent.recent or []
    assert (summary.model, summary.fallback) == ("small", 1)
    (record,) = sim.transcript()
    assert record["answeredBy"] == {"index": 1, "name": "small", "baseURL": FALLBACKS[0]["baseURL"]}
    assert record["fallbackFrom"] == [why]
    (transition,) = [t for t in sim.status.history or [] if t.reason == "ModelFallback"]
    assert transition.message is not None
    assert transition.message.startswith(
        f"turn 1: answered by fallback 1 small at {FALLBACKS[0]['baseURL']} after: {why}"
    )
    assert ("ModelFallback", transition.message) in [
        (reason, message[: len(transition.message)]) for reason, message in sim.events
    ]
    assert (
        builder.posts_event(transition) and agent_output.MODEL_FALLBACK in builder.WARNING_REASONS
    )
    # kubectl agentrun transcript says who answered and why the first did not.
    lines = transcript.turn_lines(record)
    assert f"  answered by small at {FALLBACKS[0]['baseURL']} (fallback 1 after: {why})" in lines, (
        lines
    )
    status_lines = transcript.agent_status_lines(sim.run)
    assert any("fallback 1 small" in line for line in status_lines), status_lines


def test_a_turn_the_model_itself_answered_posts_no_fallback_event() -> None:
    sim = _sim()
    sim.settle()
    job = sim.model_job()
    assert job is not None
    sim.finish(job.name, True, _fallback_envelope("answered", 0, ()))
    sim.settle()
    (summary,) = sim.agent.recent or []
    assert (summary.model, summary.fallback) == ("big", None)
    assert "ModelFallback" not in [t.reason for t in sim.status.history or []]
    (record,) = sim.transcript()
    assert not [line for line in transcript.turn_lines(record) if "answered by" in line]
