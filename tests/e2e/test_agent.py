"""Agent runs end to end: the operator as its own process, model turns running ``agentrun step
llm`` on the local node against a scripted OpenAI-compatible server over real HTTP, tools as
busybox scripts.

The model server answers from a script and records what it was sent, so each test checks both
sides: what the run did, and what the model saw (the validation errors, the tool results).
"""

from __future__ import annotations

import json
import secrets
import shlex
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.modelserver import Raw, ScriptedModel, Status, reply, tool_call
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.ports import lease_ports
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.agents import RESTART, SEARCH, agent_run
from tests.support.cluster import Kubectl, StartOperator, bind_role, mint_user, user_subject
from tests.support.plugin import LLM_COMMAND, kubectl_agentrun
from tests.support.runs import (
    Run,
    condition,
    create,
    get,
    patch_spec,
    status_of,
    step_status,
)
from tests.support.waiting import wait_events, wait_phase, wait_step_phase


@pytest.fixture
def agent_operator(cluster: TestCluster, start_operator: StartOperator) -> OperatorProcess:
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    return start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})


def _history(run: Run) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = status_of(run).get("history") or []
    return history


def _launches(run: Run) -> dict[str, int]:
    """How often each step was launched, from the run's history."""
    found: dict[str, int] = {}
    for t in _history(run):
        if t.get("reason") == "Launching" and t.get("step"):
            found[t["step"]] = found.get(t["step"], 0) + 1
    return found


def _transcript(kube: KubeClients, namespace: str, uid: str) -> list[dict[str, Any]]:
    items = kube.core.list_namespaced_config_map(
        namespace, label_selector=f"agentrun.dev/run-uid={uid},agentrun.dev/object=transcript"
    ).items
    records = [json.loads(cm.data["turn"]) for cm in items]
    return sorted(records, key=lambda r: int(r["turn"]))


def test_a_loop_of_turns_with_parallel_tool_calls_ends_with_the_answer(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(
        reply(
            "two searches at once",
            [
                tool_call("search", {"query": "latency"}, "c1"),
                tool_call("search", {"query": "db"}, "c2"),
            ],
        ),
        reply("one more", [tool_call("search", {"query": "cache"}, "c3")]),
        reply("Checkout is slow because the cache is cold.", prompt_tokens=300),
    )
    created = create(kube, namespace, agent_run("loop", model))
    run = wait_phase(kube, namespace, "loop", "Succeeded")

    status = status_of(run)
    agent = status["agent"]
    assert agent["stage"] == "Answered"
    assert agent["answer"] == "Checkout is slow because the cache is cold."
    assert status["message"].startswith("the model answered in turn 3")
    assert status["progress"] == "turn 3/20"
    assert (agent["toolCalls"], agent["invalidToolCalls"]) == (3, 0)
    assert status["usage"]["tokens"] == 60 + 60 + 310
    # The model saw every tool's result, and each call was answered exactly once.
    first, second, third = model.completions()
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.messages[1]["content"] == "find out why checkout is slow"
    assert second.tool_answers == {
        "c1": 'search got {"query": "latency"}',
        "c2": 'search got {"query": "db"}',
    }
    assert third.tool_answers["c3"] == 'search got {"query": "cache"}'
    assert first.body["tools"][0]["function"]["name"] == "search"
    # Every model turn and tool call was launched once; closed turns left status.
    launches = _launches(run)
    assert launches == {
        "t1-model": 1,
        "t1-0-search": 1,
        "t1-1-search": 1,
        "t2-model": 1,
        "t2-0-search": 1,
        "t3-model": 1,
    }
    assert [s["name"] for s in status["steps"]] == ["t3-model"]
    records = _transcript(kube, namespace, created["metadata"]["uid"])
    assert [r["turn"] for r in records] == [1, 2, 3]
    assert [c["id"] for c in records[0]["toolCalls"]] == ["c1", "c2"]
    assert records[2]["answer"] is True
    assert model.refused == [], "the operator sent a request a real server refuses"


def test_invalid_arguments_are_answered_with_the_error_and_the_model_corrects_them(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(
        reply("", [tool_call("search", {"query": "x", "limit": 0}, "bad")]),
        reply("", [tool_call("search", {"query": "x", "limit": 5}, "good")]),
        reply("done"),
    )
    create(kube, namespace, agent_run("fix-args", model))
    run = wait_phase(kube, namespace, "fix-args", "Succeeded")
    _, second, third = model.completions()
    assert second.tool_answers["bad"] == (
        "error: the call was not run: the arguments do not match the tool's parameters: "
        "limit: 0 is less than the minimum of 1"
    )
    assert third.tool_answers["good"] == 'search got {"query": "x", "limit": 5}'
    assert "t1-0-search" not in _launches(run), "the invalid call ran"
    assert _launches(run)["t2-0-search"] == 1
    reasons = [t["reason"] for t in _history(run)]
    assert "ToolCallRefused" in reasons
    assert status_of(run)["agent"]["invalidToolCalls"] == 1


def test_an_unknown_tool_is_answered_with_the_tools_there_are(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(reply("", [tool_call("drop_database", {}, "c1")]), reply("fine"))
    create(kube, namespace, agent_run("unknown-tool", model))
    wait_phase(kube, namespace, "unknown-tool", "Succeeded")
    assert model.completions()[1].tool_answers["c1"] == (
        "error: the call was not run: there is no tool 'drop_database' (the tools: search)"
    )


def test_a_risky_call_waits_for_approval_and_changed_arguments_need_a_new_one(
    cluster: TestCluster,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    agent_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    model.add(
        reply("", [tool_call("restart", {"service": "checkout"}, "r1")]),
        reply("", [tool_call("restart", {"service": "payments"}, "r2")]),
        reply("both restarted"),
    )
    create(kube, namespace, agent_run("gated", model, tools=[SEARCH, RESTART]))
    run = wait_step_phase(kube, namespace, "gated", "t1-0-restart", "WaitingForApproval")
    assert status_of(run)["phase"] == "WaitingForApproval"
    first_hash = step_status(run, "t1-0-restart")["argsHash"]
    # kubectl agentrun approve works for the call's step as for a plan step.
    proc = kubectl_agentrun(cluster, "approve", "gated", "t1-0-restart", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    assert f"approved step t1-0-restart of agentrun/gated (args {first_hash[:12]})" in proc.stdout

    run = wait_step_phase(kube, namespace, "gated", "t2-0-restart", "WaitingForApproval")
    second_hash = step_status(run, "t2-0-restart")["argsHash"]
    assert second_hash != first_hash
    assert model.completions()[1].tool_answers["r1"] == 'restart got {"service": "checkout"}'
    patch_spec(kubectl, namespace, "gated", approvals=[
        *(get(kube, namespace, "gated")["spec"].get("approvals") or []),
        {"step": "t2-0-restart", "decision": "approve", "argsHash": second_hash, "by": "admin"},
    ])  # fmt: skip
    run = wait_phase(kube, namespace, "gated", "Succeeded")
    assert _launches(run)["t2-0-restart"] == 1
    # The answer is the run's result; the transcript tells the story.
    result = kubectl_agentrun(cluster, "result", "gated", "-n", namespace)
    assert (result.returncode, result.stdout) == (0, "both restarted"), result.stderr
    shown = kubectl_agentrun(cluster, "transcript", "gated", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert '  -> restart({"service": "checkout"})  [r1]' in lines
    assert "     Succeeded as step t1-0-restart, decided by admin" in lines
    assert '     result: restart got {"service": "checkout"}' in lines
    assert "  answer: both restarted" in lines


def test_the_token_budget_pauses_the_run_and_raising_it_resumes(
    kube: KubeClients, kubectl: Kubectl, namespace: str, agent_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:  # fmt: skip
    model.add(
        reply("", [tool_call("search", {"query": "x"}, "c1")], prompt_tokens=450,
              completion_tokens=100),
        reply("the answer"),
    )  # fmt: skip
    # Turn 1 needs 100 output tokens plus its prompt (about 100 tokens of context: under
    # 700); it reports 550 used, and turn 2 (100 output tokens plus a larger prompt) does not
    # fit in the 150 left.
    body = agent_run(
        "budget", model, model_extra={"maxOutputTokens": 100}, budget={"maxTokens": 700}
    )
    create(kube, namespace, body)
    run = wait_phase(kube, namespace, "budget", "Suspended")
    status = status_of(run)
    assert status["agent"]["stage"] == "Paused"
    assert condition(run)["reason"] == "BudgetExhausted"
    assert "raise spec.budget.maxTokens to resume" in status["message"]
    # Posted after the commit that paused it: a moment after the phase shows.
    wait_events(kube, namespace, "budget", "BudgetExhausted")
    assert len(model.completions()) == 1
    patch_spec(kubectl, namespace, "budget", budget={"maxTokens": 5000})
    run = wait_phase(kube, namespace, "budget", "Succeeded")
    assert status_of(run)["agent"]["answer"] == "the answer"
    started = [t for t in _history(run) if t["reason"] == "TurnStarted"][-1]
    assert "resumed" in started["message"]


def test_max_turns_ends_the_run_with_a_clear_reason(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(
        reply("", [tool_call("search", {"query": "a"}, "c1")]),
        reply("", [tool_call("search", {"query": "b"}, "c2")]),
    )
    create(kube, namespace, agent_run("turns", model, agent={"maxTurns": 2}))
    run = wait_phase(kube, namespace, "turns", "Failed")
    assert status_of(run)["message"] == (
        "the model was still calling tools in turn 2, the last one (spec.agent.maxTurns 2), "
        "and gave no answer"
    )
    assert condition(run)["reason"] == "MaxTurnsReached"
    assert len(model.completions()) == 2


def test_an_endpoint_answering_errors_and_garbage_is_retried_per_policy(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(Status(503, "overloaded"), Raw(b"<html>bad gateway</html>", "text/html"))
    model.add(reply("answered on the third attempt"))
    retry = {"retry": {"limit": 2, "backoff": {"initialSeconds": 1, "maxSeconds": 2}}}
    create(kube, namespace, agent_run("flaky", model, model_extra=retry))
    run = wait_phase(kube, namespace, "flaky", "Succeeded")
    assert step_status(run, "t1-model")["attempt"] == 3
    retries = [t["message"] for t in _history(run) if t["reason"] == "RetryScheduled"]
    assert len(retries) == 2
    assert (
        f"(ModelErrorStatus: the model endpoint {model.base_url} answered HTTP 503: overloaded"
        in retries[0]
    )
    assert f"(ModelAnswerNotJSON: the model endpoint {model.base_url} answered" in retries[1]
    assert len(model.completions()) == 3
    assert agent_operator.alive()


def test_an_endpoint_that_is_down_fails_the_run_and_the_operator_goes_on(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    with lease_ports(1) as port:  # leased and never bound: connections are refused
        down = f"http://127.0.0.1:{port.port}/v1"
        create(kube, namespace, agent_run("down", down))
        run = wait_phase(kube, namespace, "down", "Failed")
    message = status_of(run)["message"]
    assert message.startswith("step t1-model failed: ")
    assert f"the model endpoint {down} cannot be reached" in message
    assert condition(run)["reason"] == "ModelUnreachable"
    # The operator is fine and goes on with other runs.
    assert agent_operator.alive()
    model.add(reply("still here"))
    create(kube, namespace, agent_run("after", model))
    wait_phase(kube, namespace, "after", "Succeeded")


def test_a_plan_runs_first_and_its_results_open_the_conversation(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(reply("p99 is 2s, so: the cache"))
    gather = {
        "name": "gather",
        "container": {
            "image": "busybox:1.36",
            "command": ["sh", "-c", "echo 'p99 latency is 2s' > /dev/termination-log"],
        },
    }
    create(kube, namespace, agent_run("plan-first", model, plan={"steps": [gather]}))
    run = wait_phase(kube, namespace, "plan-first", "Succeeded")
    (request,) = model.completions()
    user = request.messages[1]["content"]
    assert "# Results of the plan's steps, which ran before you" in user
    assert "## step gather: succeeded" in user and "p99 latency is 2s" in user
    assert step_status(run, "gather")["phase"] == "Succeeded"


def test_the_api_key_is_used_only_with_the_rights_of_the_runs_creator(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agent_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    """mallory may create runs but not read the Secret holding the API key: her run's first
    turn fails Forbidden before any Job, and the model never hears from it. carol may read it:
    her run's turns send the key."""
    key = f"sk-{secrets.token_hex(8)}"
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "llm"}, "stringData": {"api-key": key}}
    )
    users: dict[str, Path] = {}
    run_rules = [{"apiGroups": ["agentrun.dev"], "resources": ["agentruns"],
                  "verbs": ["create", "get", "list", "watch"]}]  # fmt: skip
    for user in ("mallory", "carol"):
        to = cluster.kubeconfig.with_name(f"{namespace}-{user}.kubeconfig")
        users[user] = mint_user(cluster, user, [], to)
        bind_role(kube, namespace, f"{user}-runs", run_rules, [user_subject(user)])
    read_key = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                 "resourceNames": ["llm"]}]  # fmt: skip
    bind_role(kube, namespace, "carol-reads-the-key", read_key, [user_subject("carol")])
    keyed = {"apiKeySecretRef": {"name": "llm", "key": "api-key"}}

    def create_as(user: str, name: str) -> None:
        body = json.dumps(agent_run(name, model, model_extra=keyed))
        proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=body,
                               kubeconfig=users[user], check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr

    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        create_as("mallory", "borrowed-key")
        run = wait_phase(kube, namespace, "borrowed-key", "Failed")
        turn = step_status(run, "t1-model")
        assert (turn.get("error") or {}).get("reason") == "Forbidden", turn
        assert "creator mallory may not get secrets/llm" in turn["error"]["message"]
        assert not turn.get("jobName"), "a Job was made for a refused turn"
        assert model.completions() == []

        model.add(reply("answered with carol's key"))
        create_as("carol", "own-key")
        wait_phase(kube, namespace, "own-key", "Succeeded")
    (request,) = model.completions()
    assert request.authorization == f"Bearer {key}"
    for name in ("borrowed-key", "own-key"):
        assert key not in json.dumps(get(kube, namespace, name)), "the key is in the run"


def test_a_call_cut_off_at_the_output_limit_is_answered_and_the_loop_goes_on(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    """The model's output ends inside a call's arguments: the next request, which the
    scripted model checks as strictly as llama.cpp's server, carries {} for them and an answer
    saying why the call was not run; the loop goes on to the answer."""
    model.add(
        reply("", [tool_call("search", '{"query": "latency of chec', "cut")],
              finish_reason="length"),
        reply("", [tool_call("search", {"query": "latency"}, "whole")]),
        reply("the cache"),
    )  # fmt: skip
    create(kube, namespace, agent_run("cut-call", model))
    run = wait_phase(kube, namespace, "cut-call", "Succeeded")
    assert model.refused == []
    _, second, _ = model.completions()
    (asked,) = [m for m in second.messages if m.get("tool_calls")]
    assert asked["tool_calls"][0]["function"]["arguments"] == "{}"
    said = second.tool_answers["cut"]
    assert said.startswith("error: the call was not run: the arguments are not valid JSON")
    assert said.endswith("(your message above shows {} as its arguments)")
    assert "t1-0-search" not in _launches(run)


def test_an_answer_cut_off_at_the_output_limit_fails_the_run_with_the_reason(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(reply("The cause is the cold ca", finish_reason="length"))
    create(kube, namespace, agent_run("cut-answer", model, model_extra={"maxOutputTokens": 64}))
    run = wait_phase(kube, namespace, "cut-answer", "Failed")
    assert condition(run)["reason"] == "AnswerCutOff"
    assert status_of(run)["message"].startswith(
        "the model's answer in turn 1 was cut off at maxOutputTokens (64; finish reason length)"
    )
    assert "answer" not in status_of(run)["agent"]
    wait_events(kube, namespace, "cut-answer", "AnswerCutOff")


def test_a_long_answer_works_with_the_default_service_account(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agent_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    """12 KB of prose: more than kubelet's 4 KiB termination message, and the steps run as
    the namespace's default ServiceAccount, which may not create ConfigMaps."""
    prose = "\n".join(f"{i}. the checkout cache was cold after the deploy" for i in range(300))
    assert len(prose.encode()) > 12_000
    model.add(reply(prose))
    create(kube, namespace, agent_run("long-answer", model))
    wait_phase(kube, namespace, "long-answer", "Succeeded")
    result = kubectl_agentrun(cluster, "result", "long-answer", "-n", namespace)
    assert (result.returncode, result.stdout) == (0, prose), result.stderr


def test_an_output_too_large_for_the_termination_message_fails_saying_what_to_do(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    noise = "".join(
        secrets.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        for _ in range(9000)
    )
    model.add(reply(noise))
    create(kube, namespace, agent_run("too-long", model))
    run = wait_phase(kube, namespace, "too-long", "Failed")
    message = status_of(run)["message"]
    assert "more than the 4096 bytes of the termination message" in message
    assert "lower spec.agent.model.maxOutputTokens, or give steps a ServiceAccount" in message
    assert "\n" not in message and "Traceback" not in message


def test_reported_usage_of_ten_to_the_thirty_does_not_exhaust_the_budget(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(
        reply("", [tool_call("search", {"query": "x"}, "c1")], prompt_tokens=10**30,
              completion_tokens=10**30),
        reply("the answer", prompt_tokens=300, completion_tokens=20),
    )  # fmt: skip
    create(kube, namespace, agent_run("liar", model, budget={"maxTokens": 200_000}))
    run = wait_phase(kube, namespace, "liar", "Succeeded")
    status = status_of(run)
    assert 320 < status["usage"]["tokens"] < 20_000
    agent = status["agent"]
    assert agent["overReportedTurns"] == 1
    assert agent["recent"][0]["reportedTokens"] == 2**53 - 1
    assert "ReportedUsageRefused" in [t["reason"] for t in _history(run)]
    wait_events(kube, namespace, "liar", "ReportedUsageRefused")


@pytest.mark.parametrize(
    ("body", "reason", "said"),
    [
        (b"", "ModelEmptyAnswer", "answered HTTP 200 with an empty body"),
        (
            b'{"choices": [',
            "ModelAnswerNotJSON",
            'answered with a body that is not JSON ({"choices": [)',
        ),
        (
            b'{"choices": [{"message": {"content": "caf\xe9"}}]}',
            "ModelAnswerNotUTF8",
            "answered with a body that is not UTF-8 text (byte 41 is 0xe9)",
        ),
    ],
    ids=["empty", "not-json", "not-utf8"],
)
def test_a_broken_answer_fails_the_turn_with_its_reason_and_one_line(
    kube: KubeClients,
    namespace: str,
    agent_operator: OperatorProcess,
    model: ScriptedModel,
    body: bytes,
    reason: str,
    said: str,
) -> None:
    """Each way an answer is broken has its own reason, on the step and the run (not Error),
    and one line saying what was wrong."""
    model.add(Raw(body))
    create(kube, namespace, agent_run("broken", model))
    run = wait_phase(kube, namespace, "broken", "Failed")
    message = status_of(run)["message"]
    assert message.startswith(f"step t1-model failed: {reason}: the model endpoint ")
    assert f"the model endpoint {model.base_url} {said}" in message, message
    assert condition(run)["reason"] == reason
    assert step_status(run, "t1-model")["error"]["reason"] == reason
    assert "\n" not in message and "Traceback" not in message


def test_the_tool_choice_is_sent_with_every_turn(
    kube: KubeClients, namespace: str, agent_operator: OperatorProcess, model: ScriptedModel
) -> None:
    model.add(reply("", [tool_call("search", {"query": "x"}, "c1")]), reply("answered"))
    create(kube, namespace, agent_run("choice", model, agent={"toolChoice": "none"}))
    run = wait_phase(kube, namespace, "choice", "Succeeded")
    assert [r.body.get("tool_choice") for r in model.completions()] == ["none", "none"]
    assert status_of(run)["agent"]["frozen"]["toolChoice"] == "none"
    assert model.refused == []


def test_a_failing_first_model_falls_back_to_the_second(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agent_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    """spec.agent.model answers HTTP 500 to every request; its fallback (the scripted model)
    answers each turn within the same attempt: the run Succeeds in one attempt a turn, and
    every turn says which model answered and why the first did not, in status, the transcript
    and a Warning Event ModelFallback."""
    model.add(
        reply("", [tool_call("search", {"query": "latency"}, "c1")]),
        reply("Checkout is slow because the cache is cold."),
    )
    with ScriptedModel(responder=lambda body: Status(500, "overloaded")) as broken:
        fallbacks = {"fallbacks": [{"baseURL": model.base_url, "name": "backup"}]}
        create(kube, namespace, agent_run("fallback", broken, model_extra=fallbacks))
        run = wait_phase(kube, namespace, "fallback", "Succeeded")
        assert len(broken.completions()) == 2
    assert [r.body["model"] for r in model.completions()] == ["backup", "backup"]
    agent = status_of(run)["agent"]
    assert [(t.get("model"), t.get("fallback")) for t in agent["recent"]] == [("backup", 1)] * 2
    why = f"scripted at {broken.base_url}: ModelErrorStatus: HTTP 500: overloaded"
    records = _transcript(kube, namespace, run["metadata"]["uid"])
    for record in records:
        assert record["answeredBy"] == {"index": 1, "name": "backup", "baseURL": model.base_url}
        assert record["fallbackFrom"] == [why]
        assert record["attempts"] == 1
    (event, *_) = wait_events(kube, namespace, "fallback", "ModelFallback", warning=True)
    assert f"answered by fallback 1 backup at {model.base_url} after: {why}" in event.message
    shown = kubectl_agentrun(cluster, "transcript", "fallback", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert f"answered by backup at {model.base_url} (fallback 1 after: {why})" in shown.stdout
