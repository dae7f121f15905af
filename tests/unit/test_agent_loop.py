"""The agent loop in the pure core: model turns and tool calls as committed, durable,
approvable, budgeted steps (docs/agent.md)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.clients.plugin import transcript
from agentrun.core import StoreResult, builder
from agentrun.core import agent_loop as loop
from agentrun.core import context as cx
from agentrun.core.arguments import args_hash
from agentrun.core.envelope import MAX_TOKENS
from agentrun.core.naming import sha256_text
from agentrun_devcluster.modelserver import check_request
from tests.support.agent_sim import (
    RESTART,
    SEARCH,
    AgentSim,
    agent_run,
    call,
    tool_envelope,
    turn_envelope,
)
from tests.support.sim import UID


def _reasons(sim: AgentSim) -> list[str]:
    return [t.reason for t in sim.status.history or []]


def _tool_messages(ctx: cx.Context, turn: int) -> dict[str, str]:
    return {
        str(msg["tool_call_id"]): str(msg["content"])
        for msg in ctx.messages
        if msg.get("role") == "tool" and msg.get("x-turn") == turn
    }


def test_a_loop_of_turns_with_parallel_calls_ends_with_the_answer_as_the_result() -> None:
    sim = AgentSim(agent_run())
    sim.settle()
    assert sim.agent.stage == agent_status.AgentStage.THINKING
    assert sim.status.current_step == "t1-model"
    sim.answer(
        "two searches at once",
        [call("search", {"query": "latency"}, "c1"), call("search", {"query": "db"}, "c2")],
    )
    assert sim.agent.stage == agent_status.AgentStage.ACTING
    assert sorted(j.step for j in sim.tool_jobs()) == ["t1-0-search", "t1-1-search"]
    sim.tools_return()
    assert sim.agent.turn == 2
    # The closed turn left status (its record keeps it); turn 2 thinks with the results.
    assert [s.name for s in sim.status.steps or []] == ["t2-model"]
    assert _tool_messages(sim.context(), 1) == {
        "c1": "result of t1-0-search",
        "c2": "result of t1-1-search",
    }
    sim.answer("one more", [call("search", {"query": "cache"}, "c3")])
    sim.tools_return()
    sim.answer("checkout is slow because the cache is cold")

    status = sim.status
    assert status.phase == m.RunPhase.SUCCEEDED
    assert (
        status.message == "the model answered in turn 3: checkout is slow because the cache is cold"
    )
    assert sim.agent.stage == agent_status.AgentStage.ANSWERED
    assert sim.agent.answer == "checkout is slow because the cache is cold"
    assert sim.agent.answer_digest == sha256_text(sim.agent.answer)
    assert status.progress == "turn 3/20"
    assert (sim.agent.tool_calls, sim.agent.invalid_tool_calls) == (3, 0)
    assert (sim.agent.prompt_tokens, sim.agent.completion_tokens) == (300, 60)
    assert status.usage is not None and status.usage.tokens == 360
    # Every model turn and tool call had one Job, created once.
    assert sorted(sim.creations.values()) == [1] * 6
    assert [r["turn"] for r in sim.transcript()] == [1, 2, 3]
    assert [len(r["toolCalls"]) for r in sim.transcript()] == [2, 1, 0]
    assert sim.transcript()[-1]["answer"] is True


def test_tools_get_their_arguments_and_an_idempotency_key_of_turn_call_and_args() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "latency"}, "c1")])
    (job,) = sim.tool_jobs()
    create = sim.created_specs[job.name]
    env = {e.name: e.value for e in create.step.container.env or []}
    assert json.loads(env[loop.ENV_TOOL_ARGS] or "") == {"query": "latency"}
    assert (env[loop.ENV_TOOL_NAME], env[loop.ENV_TOOL_CALL_ID], env[loop.ENV_TURN]) == (
        "search",
        "c1",
        "1",
    )
    assert create.step.container.image == "ghcr.io/acme/search:1"
    st = sim.step_status("t1-0-search")
    assert st.idempotency_key == f"{UID}:1:c1:{st.args_hash}"
    assert create.idempotency_key == st.idempotency_key


def test_the_model_turn_runs_the_operator_image_and_binds_its_context_by_digest() -> None:
    sim = AgentSim(
        agent_run(
            model={
                "baseURL": "http://llm:8000/v1",
                "name": "m",
                "apiKeySecretRef": {"name": "llm", "key": "token"},
                "temperature": 0.2,
            }
        )
    )
    sim.settle()
    job = sim.model_job()
    assert job is not None
    create = sim.created_specs[job.name]
    assert create.step.container.image == loop.AgentConfig().llm_image
    assert create.step.container.command == ["agentrun", "step", "llm"]
    env = {e.name: e for e in create.step.container.env or []}
    assert env[loop.ENV_MODEL_BASE_URL].value == "http://llm:8000/v1"
    assert env[loop.ENV_MODEL_TEMPERATURE].value == "0.2"
    key = env[loop.ENV_MODEL_API_KEY].value_from
    assert key is not None and key.secret_key_ref is not None
    assert (key.secret_key_ref.name, key.secret_key_ref.key) == ("llm", "token")
    ctx = sim.agent.context
    # The context is not in the Job: its pod takes it by request once the turn's intent is
    # committed (so the Job can be made before the turn); its digest is in the args hash.
    assert not any(name.startswith("AGENTRUN_CONTEXT") for name in env)
    assert create.input_env == ()
    assert create.args_hash == args_hash(sim.run, create.step, {loop.CONTEXT_INPUT: ctx.digest})
    # The context is stored before the status that names it, and is what the digest says.
    doc = sim.context()
    assert doc.digest() == ctx.digest
    assert [msg["role"] for msg in doc.messages] == ["system", "user"]
    assert doc.tools[0]["function"]["name"] == "search"


def test_an_invalid_call_is_never_run_and_the_model_reads_why_then_corrects_it() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x", "limit": 0}, "bad")])
    assert sim.tool_jobs() == []
    assert sim.agent.turn == 2, "a turn of only invalid calls closes at once"
    said = _tool_messages(sim.context(), 1)["bad"]
    assert said == (
        "error: the call was not run: the arguments do not match the tool's parameters: "
        "limit: 0 is less than the minimum of 1"
    )
    assert "ToolCallRefused" in _reasons(sim)
    sim.answer("", [call("search", {"query": "x", "limit": 5}, "good")])
    assert [j.step for j in sim.tool_jobs()] == ["t2-0-search"]
    sim.tools_return()
    sim.answer("done")
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.agent.invalid_tool_calls == 1


@pytest.mark.parametrize(
    "arguments", ['{"query": "why is check', "[1, 2]", '"x"', '{"query": "x"} trailing']
)
def test_a_call_cut_off_is_answered_and_the_next_request_is_one_any_server_takes(
    arguments: str,
) -> None:
    """The model's output was cut off inside a call's arguments (or they are not an object):
    the call never runs, the model reads that and why, and the assistant message sent back
    carries arguments every server parses (llama.cpp's answers HTTP 500 to the request that
    repeats arguments that are not JSON, and fails it again on every retry)."""
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", arguments, "cut"), call("search", {"query": "x"}, "ok")])
    sim.tools_return()
    assert sim.agent.turn == 2 and sim.agent.stage == agent_status.AgentStage.THINKING
    request = sim.request()
    assert check_request(request) is None
    (asked,) = [msg for msg in request["messages"] if msg.get("tool_calls")]
    sent = {c["id"]: c["function"]["arguments"] for c in asked["tool_calls"]}
    assert sent == {"cut": "{}", "ok": '{"query": "x"}'}
    said = _tool_messages(sim.context(), 1)["cut"]
    assert said.startswith("error: the call was not run: the arguments ")
    assert said.endswith("(your message above shows {} as its arguments)")
    # The transcript keeps what the model wrote.
    record = sim.transcript()[0]["toolCalls"][0]
    assert (record["arguments"], record["outcome"]) == (arguments, "Invalid")
    sim.answer("done")
    assert sim.status.phase == m.RunPhase.SUCCEEDED


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("not json", "the arguments are not valid JSON"),
        ("[1, 2]", "the arguments must be a JSON object, not list"),
        (
            {"limit": 3},
            "the arguments do not match the tool's parameters: (the arguments): "
            "'query' is a required property",
        ),
        (
            {"query": "x", "extra": 1},
            "Additional properties are not allowed ('extra' was unexpected)",
        ),
        ({"query": "x" * 5000}, "the arguments are 50"),
    ],
)
def test_arguments_are_validated_against_the_tools_json_schema(
    arguments: Any, problem: str
) -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", arguments, "c")])
    record = sim.transcript()[0]["toolCalls"][0]
    assert record["outcome"] == "Invalid"
    assert problem in record["problem"]
    assert sim.creations and all("search" not in name for name in sim.creations)


def test_an_unknown_tool_is_answered_with_the_tools_there_are() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH, RESTART]))
    sim.answer("", [call("delete_everything", {}, "c")])
    assert _tool_messages(sim.context(), 1)["c"] == (
        "error: the call was not run: there is no tool 'delete_everything' "
        "(the tools: restart, search)"
    )


def test_a_risky_call_waits_for_an_approval_of_its_exact_arguments() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH, RESTART]))
    sim.answer("", [call("restart", {"service": "checkout"}, "r1")])
    st = sim.step_status("t1-0-restart")
    assert st.phase == SP.WAITING_FOR_APPROVAL
    assert sim.status.phase == m.RunPhase.WAITING_FOR_APPROVAL
    assert sim.tool_jobs() == []
    h = st.args_hash
    assert h is not None
    # An approval of other arguments (or another step) does not count.
    other = m.Approval(step="t1-0-restart", decision="approve", args_hash="0" * 64, by="bob")
    sim.spec_update(approvals=[other])
    sim.settle()
    assert sim.step_status("t1-0-restart").phase == SP.WAITING_FOR_APPROVAL
    ok = m.Approval(step="t1-0-restart", decision="approve", args_hash=h, by="alice")
    sim.spec_update(approvals=[other, ok])
    sim.settle()
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-restart"]
    assert sim.step_status("t1-0-restart").decided_by == "alice"
    sim.tools_return()
    assert sim.transcript()[0]["toolCalls"][0]["decidedBy"] == "alice"
    # The same tool with changed arguments is a new call: a new step and a new approval.
    sim.answer("", [call("restart", {"service": "payments"}, "r2")])
    st2 = sim.step_status("t2-0-restart")
    assert st2.phase == SP.WAITING_FOR_APPROVAL and st2.args_hash != h


def test_the_history_names_one_argshash_for_a_call_from_acceptance_to_approval() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH, RESTART]))
    sim.answer("", [call("restart", {"service": "checkout"}, "r1")])
    h = sim.step_status("t1-0-restart").args_hash or ""
    sim.spec_update(approvals=[m.Approval(step="t1-0-restart", decision="approve",
                                          args_hash=h, by="alice")])  # fmt: skip
    sim.settle()
    said = {
        t.reason: t.message or ""
        for t in sim.status.history or []
        if t.step == "t1-0-restart" or t.reason == "WaitingForApproval"
    }
    for reason in ("ToolCallAccepted", "ApprovalRequested", "WaitingForApproval"):
        digests = set(re.findall(r"args ([0-9a-f]{12})", said[reason]))
        assert digests == {h[:12]}, (reason, said[reason])


def test_a_rejected_call_is_answered_to_the_model_and_the_run_goes_on() -> None:
    sim = AgentSim(agent_run(tools=[SEARCH, RESTART]))
    sim.answer("", [call("restart", {"service": "checkout"}, "r1")])
    h = sim.step_status("t1-0-restart").args_hash or ""
    no = m.Approval(
        step="t1-0-restart", decision="reject", args_hash=h, by="alice", reason="not now"
    )
    sim.spec_update(approvals=[no])
    sim.settle()
    assert sim.agent.turn == 2
    assert _tool_messages(sim.context(), 1)["r1"] == (
        "error: the call was not run: it was rejected (rejected by alice: not now)"
    )
    assert sim.status.phase == m.RunPhase.RUNNING


def test_a_failed_call_is_an_error_for_the_model_not_for_the_run() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.tools_return(lambda job: (False, "boom"))
    assert sim.agent.turn == 2 and sim.status.phase == m.RunPhase.RUNNING
    assert (
        _tool_messages(sim.context(), 1)["c"] == "error: the tool failed (Error: exit code 1: boom)"
    )


def test_the_budget_pauses_before_a_turn_and_raising_it_resumes() -> None:
    # Turn 1 may use 1024 output tokens plus its prompt; 2000 covers it, not turn 2 as well.
    sim = AgentSim(agent_run(spec={"budget": {"maxTokens": 2000}}))
    sim.answer("", [call("search", {"query": "x"}, "c")], prompt=800, completion=200)
    sim.tools_return()
    assert sim.agent.stage == agent_status.AgentStage.PAUSED
    assert sim.status.phase == m.RunPhase.SUSPENDED
    succeeded = sim.condition("Succeeded")
    assert succeeded is not None and succeeded.reason == "BudgetExhausted"
    assert succeeded.status == m.ConditionStatus.UNKNOWN
    assert "raise spec.budget.maxTokens to resume" in (sim.status.message or "")
    assert ("BudgetExhausted", sim.status.message) in sim.events
    assert sim.model_job() is None
    sim.spec_update(budget=m.Budget(max_tokens=10_000))
    sim.settle()
    assert sim.agent.stage == agent_status.AgentStage.THINKING
    resumed: m.RunPhase | None = sim.status.phase  # (read again: mypy narrowed it above)
    assert resumed == m.RunPhase.RUNNING
    started = [t for t in sim.status.history or [] if t.reason == "TurnStarted"][-1]
    assert "resumed" in (started.message or "") and "of budget.maxTokens 10000 left" in (
        started.message or ""
    )
    sim.answer("done")
    ended: m.RunPhase | None = sim.status.phase
    assert ended == m.RunPhase.SUCCEEDED


def test_max_turns_ends_the_run_with_a_clear_reason() -> None:
    sim = AgentSim(agent_run(maxTurns=2))
    for turn in (1, 2):
        sim.answer("", [call("search", {"query": f"q{turn}"}, f"c{turn}")])
        sim.tools_return()
    assert sim.status.phase == m.RunPhase.FAILED
    assert sim.status.message == (
        "the model was still calling tools in turn 2, the last one (spec.agent.maxTurns 2), "
        "and gave no answer"
    )
    assert _reasons(sim)[-1] == "MaxTurnsReached"
    assert sim.agent.stage == agent_status.AgentStage.STOPPED
    assert [r["turn"] for r in sim.transcript()] == [1, 2]


def test_a_failed_model_turn_is_retried_per_policy_then_fails_the_run() -> None:
    sim = AgentSim(
        agent_run(
            model={
                "baseURL": "http://127.0.0.1:9/v1",
                "name": "m",
                "retry": {"limit": 1, "backoff": {"initialSeconds": 5}},
            }
        )
    )
    sim.settle()
    job = sim.model_job()
    assert job is not None
    sim.finish(job.name, False, "the model endpoint http://127.0.0.1:9/v1 cannot be reached")
    sim.settle()
    st = sim.step_status("t1-model")
    assert st.phase == SP.BACKING_OFF
    sim.advance(10)
    sim.settle()
    retry = sim.model_job()
    assert retry is not None and retry.attempt == 2
    sim.finish(retry.name, False, "the model endpoint http://127.0.0.1:9/v1 cannot be reached")
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    assert "step t1-model failed" in (sim.status.message or "")
    assert "cannot be reached" in (sim.status.message or "")


def test_garbage_from_the_model_step_fails_the_turn_with_a_clear_reason() -> None:
    sim = AgentSim(agent_run())
    sim.settle()
    job = sim.model_job()
    assert job is not None
    sim.finish(job.name, True, json.dumps({"ok": True, "result": {"toolCalls": "nope"}}))
    sim.settle()
    assert sim.status.phase == m.RunPhase.FAILED
    assert _reasons(sim)[-1] == "InvalidModelOutput"
    assert "toolCalls is not a list" in (sim.status.message or "")


def test_a_plan_runs_first_and_its_results_open_the_conversation() -> None:
    plan = [
        {"name": "gather", "container": {"image": "busybox", "command": ["gather"]}},
        {
            "name": "metrics",
            "dependsOn": ["gather"],
            "container": {"image": "busybox", "command": ["metrics"]},
        },
    ]
    sim = AgentSim(agent_run(plan=plan))
    sim.settle()
    assert sim.agent.stage == agent_status.AgentStage.WAITING and sim.model_job() is None
    assert sim.status.progress == "0/2"
    for name, result in (("gather", "p99 is 2s"), ("metrics", "x" * 1000)):
        (job,) = sim.active()
        assert job.step == name
        sim.finish(job.name, True, tool_envelope(result, f"{name} summary"))
        sim.settle()
    # metrics' result went to a ConfigMap; the core read it back for the first message.
    assert sim.step_status("metrics").result_ref is not None
    assert sim.agent.stage == agent_status.AgentStage.THINKING
    user = sim.context().messages[1]["content"]
    assert user.startswith("find out why checkout is slow\n\n# Results of the plan's steps")
    assert "## step gather: succeeded\nsummary: gather summary\np99 is 2s" in user
    assert "x" * 1000 in user
    sim.answer("done")
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.status.progress == "turn 1/20"


def test_too_many_calls_in_a_turn_are_answered_not_run() -> None:
    sim = AgentSim(agent_run(maxToolCallsPerTurn=2))
    sim.answer("", [call("search", {"query": f"q{i}"}, f"c{i}") for i in range(3)])
    assert len(sim.tool_jobs()) == 2
    (extra,) = [c for c in sim.agent.calls if c.problem]
    assert extra.id == "c2" and "at most 2 tool calls a turn" in (extra.problem or "")


def test_a_tool_image_outside_the_policy_is_refused_but_the_model_turn_runs() -> None:
    sim = AgentSim(agent_run(spec={"policy": {"allowedImages": ["docker.io/"]}}))
    sim.answer("", [call("search", {"query": "x"}, "c")])
    (c,) = sim.transcript()[0]["toolCalls"]
    assert c["outcome"] == "Invalid"
    assert "is not allowed by policy.allowedImages" in c["problem"]
    assert sim.status.phase == m.RunPhase.RUNNING and sim.model_job() is not None


def test_results_kept_by_reference_go_into_the_next_context_stored_now_or_read_back() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "a"), call("search", {"query": "y"}, "b")])
    first, second = sim.tool_jobs()
    big = json.dumps({"rows": "y" * 3000})
    sim.finish(first.name, True, tool_envelope(big, "3000 rows"))
    sim.tick()  # this pass commits the first result (stored by reference); b still runs
    st = sim.step_status("t1-0-search")
    assert st.result_ref is not None and sim.agent.turn == 1
    bigger = json.dumps({"rows": "z" * 3000})
    sim.finish(second.name, True, tool_envelope(bigger, "3000 rows"))
    decision = sim.tick()  # the last result: committed with the turn closed, the next begun
    assert sim.agent.turn == 2 and sim.agent.stage == agent_status.AgentStage.THINKING
    messages = _tool_messages(sim.context(), 1)
    assert messages == {"a": big, "b": bigger}
    # The first read back by the shell; the second taken from this pass's own store.
    assert (st.result_ref.name, "result") in sim.asked
    second_ref = next(x.name for x in decision.before_commit if isinstance(x, StoreResult))
    assert not any(name == second_ref for name, _ in sim.asked)


def test_the_context_stays_under_its_limit_old_results_by_summary_then_old_turns_left_out() -> None:
    sim = AgentSim(agent_run(contextBytes=a.MIN_CONTEXT_BYTES, maxTurns=40))
    for turn in range(1, 30):
        sim.answer(f"turn {turn}", [call("search", {"query": f"q{turn}"}, f"c{turn}")])
        sim.tools_return(
            lambda job: (True, tool_envelope("r" * 600, f"{job.step}: 600 bytes of r"))
        )
        ctx = sim.context()
        assert ctx.bytes + ctx.tools_bytes <= sim.agent.context.bytes
        assert ctx.bytes <= a.MIN_CONTEXT_BYTES
        # Every call of every turn still in the context has exactly one answer.
        calls = {c["id"] for msg in ctx.messages for c in msg.get("tool_calls") or []}
        assert calls == {msg["tool_call_id"] for msg in ctx.messages if msg["role"] == "tool"}
    ctx = sim.context()
    assert ctx.paged_results > 0 and ctx.omitted_turns > 0
    assert [msg["role"] for msg in ctx.messages[:3]] == ["system", "user", "user"]
    assert ctx.messages[2]["content"].startswith(f"[Earlier turns 1 to {ctx.omitted_turns} were")
    # As sent, the note joins the goal: templates that want user and assistant to alternate
    # (Gemma's, Mistral's) refuse two user messages in a row.
    request = sim.request()
    assert check_request(request) is None
    assert [msg["role"] for msg in request["messages"][:3]] == ["system", "user", "assistant"]
    assert request["messages"][1]["content"] == (
        f"{ctx.messages[1]['content']}\n\n{ctx.messages[2]['content']}"
    )
    # The newest turn's result is whole; older ones by their summary.
    assert _tool_messages(ctx, 29)["c29"] == "r" * 600
    paged = [msg for msg in ctx.messages if msg.get("x-paged")]
    assert paged and paged[0]["content"].startswith("[result paged out to fit the context")
    # The transcript still has everything.
    assert len(sim.transcript()) == 29
    assert sim.transcript()[0]["toolCalls"][0]["result"] == "r" * 600


def test_status_keeps_only_the_current_turn_and_the_last_turns_summaries() -> None:
    sim = AgentSim(agent_run(maxTurns=30))
    for turn in range(1, 26):
        sim.answer("", [call("search", {"query": f"q{turn}"}, f"c{turn}")])
        sim.tools_return()
    recent = sim.agent.recent
    assert [r.turn for r in recent] == list(range(16, 26))
    assert len(sim.status.steps or []) == 1
    assert sim.agent.transcript is not None
    assert all(
        name.startswith(sim.agent.transcript) for name in sim.record_kinds if "transcript" in name
    )


def test_jobs_of_closed_turns_are_deleted_after_the_grace() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.tools_return()
    assert any("t1-0-search" in name for name in sim.jobs)
    sim.advance(sim.config.job_deletion_grace_seconds + 1)
    sim.settle()
    assert not any(name.startswith("agent-t1-") for name in sim.jobs)


def test_an_answer_too_long_for_status_is_kept_in_the_last_record() -> None:
    sim = AgentSim(agent_run())
    sim.answer("a" * (a.MAX_ANSWER + 1))
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    ref = sim.agent.answer_ref
    assert sim.agent.answer is None and ref is not None
    assert sim.records[ref.name][ref.key] == "a" * (a.MAX_ANSWER + 1)


@pytest.mark.parametrize("turn", [1, 2])
def test_an_answer_cut_off_at_the_output_limit_fails_the_run_saying_so(turn: int) -> None:
    """finish_reason length without a tool call: the text is not a whole answer, so it is not
    the run's result. The run fails (AnswerCutOff) saying how to go on; the transcript keeps
    what the model said."""
    sim = AgentSim(agent_run(model={"baseURL": "http://127.0.0.1:9/v1", "name": "m",
                                    "maxOutputTokens": 64}))  # fmt: skip
    if turn == 2:
        sim.answer("", [call("search", {"query": "x"}, "c")])
        sim.tools_return()
    sim.answer("The cause is the ca", finish="length")
    assert sim.status.phase == m.RunPhase.FAILED
    assert _reasons(sim)[-1] == "AnswerCutOff"
    message = sim.status.message or ""
    assert message.startswith(
        f"the model's answer in turn {turn} was cut off at maxOutputTokens (64; finish reason "
        "length), so it is not the run's result"
    )
    if turn == 2:
        assert "raise spec.agent.model.maxOutputTokens in a fork from turn 1" in message
        assert "kubectl agentrun fork agent --from 1 --dry-run" in message
    else:
        assert "create the run again with a larger spec.agent.model.maxOutputTokens" in message
    assert sim.agent.stage == agent_status.AgentStage.STOPPED
    assert sim.agent.answer is None and sim.agent.answer_ref is None
    record = sim.transcript()[-1]
    assert (record["content"], record["cutOff"], record["answer"]) == (
        "The cause is the ca",
        True,
        False,
    )


def test_a_cut_off_output_with_calls_goes_on_and_the_calls_are_validated() -> None:
    """Cut off inside a call: the call is answered as invalid, the loop goes on."""
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", '{"query": "x', "c")], finish="length")
    assert sim.agent.turn == 2 and sim.status.phase == m.RunPhase.RUNNING
    assert check_request(sim.request()) is None


def test_the_estimate_before_a_turn_counts_the_whole_request_tool_definitions_too() -> None:
    """The context's size in status is the request the turn sends, tool definitions and
    settings included, so large tool definitions pause a run whose messages alone would fit."""
    long = "Search the logs. " * 230
    tools = [{**SEARCH, "description": long}, {**RESTART, "description": long}]
    sim = AgentSim(agent_run(tools=tools, spec={"budget": {"maxTokens": 1024 + 1000}}))
    sim.settle()
    ctx = sim.agent.context
    assert ctx is not None
    assert ctx.bytes == cx.request_bytes(sim.request())
    messages_only = cx.messages_bytes(sim.context().messages)
    assert 1024 + messages_only // 4 < 1024 + 1000 < 1024 + ctx.bytes // 4
    assert sim.agent.stage == agent_status.AgentStage.PAUSED
    assert sim.status.phase == m.RunPhase.SUSPENDED
    assert f"it may use {1024 + -(-ctx.bytes // 4)} tokens" in (sim.status.message or "")


def test_the_largest_answer_accepted_is_stored_once_within_a_config_map() -> None:
    """An answer of MAX_ANSWER_BYTES (characters JSON escapes and multi-byte ones included),
    arriving compressed as with the default ServiceAccount: the model turn's result object
    holds its output once (no field entries), and the last transcript record holds the answer
    once, under its key, the record naming that key; both stay under a ConfigMap's 1 MiB."""
    answer = 'é"a' * (a.MAX_ANSWER_BYTES // 4)
    assert len(answer.encode()) == a.MAX_ANSWER_BYTES
    sim = AgentSim(agent_run())
    sim.answer(answer, packed=True)
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    (result_object,) = sim.results.values()
    assert list(result_object) == ["result"]
    ref = sim.agent.answer_ref
    assert ref is not None and ref.key == "answer"
    data = sim.records[ref.name]
    assert data["answer"] == answer
    record = json.loads(data["turn"])
    assert (record["content"], record["contentKey"]) == (None, "answer")
    assert 'é"a' not in data["turn"]
    limit = 1024 * 1024 - 16 * 1024  # the API server's 1 MiB, with room for the metadata
    for stored in (data, result_object):
        assert sum(len(k) + len(v.encode()) for k, v in stored.items()) < limit
    shown = transcript.turn_lines(transcript.records_of(sim.run, sim.config_maps().values())[0])
    assert shown[1].startswith('  answer: é"aé"a')


def test_an_answer_over_the_largest_accepted_fails_the_run_saying_so() -> None:
    sim = AgentSim(agent_run())
    sim.answer("b" * (a.MAX_ANSWER_BYTES + 1), packed=True)
    assert sim.status.phase == m.RunPhase.FAILED
    assert _reasons(sim)[-1] == "AnswerTooLarge"
    assert (sim.status.message or "").startswith(
        f"the model's answer in turn 1 is {a.MAX_ANSWER_BYTES + 1} bytes, more than the "
        f"{a.MAX_ANSWER_BYTES} a run accepts as its result"
    )
    record = sim.transcript()[0]
    assert (len(record["content"]), record["contentCut"]) == (1024, a.MAX_ANSWER_BYTES + 1)
    assert sim.agent.answer is None and sim.agent.answer_ref is None


def test_cancelling_stops_the_loop() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.spec_update(cancel=True)
    sim.settle()
    assert sim.status.phase == m.RunPhase.CANCELLED
    assert sim.agent.stage == agent_status.AgentStage.STOPPED


def test_reported_usage_counts_at_most_what_the_turn_could_have_used() -> None:
    """An endpoint reporting 10^30 tokens for a turn does not exhaust a 200,000-token budget:
    the turn is counted for at most its maxOutputTokens plus a prompt of one token per byte
    sent plus what a chat template adds, and the report is recorded (status, history, a
    Warning Event)."""
    sim = AgentSim(agent_run(spec={"budget": {"maxTokens": 200_000}}))
    sim.settle()
    ctx = sim.agent.context
    assert ctx is not None
    ceiling = 1024 + loop.prompt_ceiling(ctx)
    assert ceiling < 10_000
    sim.answer("", [call("search", {"query": "x"}, "c")], prompt=10**30, completion=10**30)
    assert sim.status.usage is not None and sim.status.usage.tokens == ceiling
    assert sim.agent.prompt_tokens == loop.prompt_ceiling(ctx)
    assert sim.agent.completion_tokens == 1024
    assert sim.agent.over_reported_turns == 1
    (refused,) = [t for t in sim.status.history or [] if t.reason == "ReportedUsageRefused"]
    assert refused.step == "t1-model"
    assert refused.message is not None and f"; {ceiling} counted" in refused.message
    assert "ReportedUsageRefused" in [reason for reason, _ in sim.events]
    assert builder._warns("Counted", "ReportedUsageRefused"), "a Warning Event"
    sim.tools_return()
    assert sim.agent.stage == agent_status.AgentStage.THINKING, "the budget was not exhausted"
    (summary,) = sim.agent.recent or []
    assert (summary.tokens, summary.reported_tokens) == (ceiling, MAX_TOKENS)
    assert sim.transcript()[0]["reportedTokens"] == MAX_TOKENS
    # A turn that reports what it could have used is counted as reported.
    sim.answer("done", prompt=300, completion=20)
    assert sim.status.usage.tokens == ceiling + 320
    assert sim.agent.over_reported_turns == 1
    assert sim.status.phase == m.RunPhase.SUCCEEDED


def test_a_new_step_of_the_loop_launches_in_its_pass_only_with_its_rights_known() -> None:
    """The shell checks a step's Secrets and env against the creator's rights
    (agentrun.access.authz). A turn's new step that uses none of the creator's (the model
    here has no API key, the search tool no Secret) launches in the pass that makes it."""
    sim = AgentSim(agent_run())
    sim.tick()
    assert sim.agent.stage == agent_status.AgentStage.THINKING
    job = sim.model_job()
    assert job is not None and sim.step_status("t1-model").phase == SP.LAUNCHING
    sim.finish(job.name, True, turn_envelope("", [call("search", {"query": "x"}, "c")]))
    sim.tick()
    assert sim.step_status("t1-0-search").phase == SP.LAUNCHING
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-search"]


SECRET_KEY = {"name": "llm-key", "key": "token"}
GRANTED_KEY = frozenset({("get", "secrets", "llm-key")})


@pytest.mark.parametrize("granted", [frozenset(), GRANTED_KEY], ids=["unknown", "granted"])
def test_a_new_step_that_uses_the_creators_rights_waits_to_be_committed_unless_granted(
    granted: frozenset[tuple[str, str, str]],
) -> None:
    """A model turn with an API key Secret: launched in the pass that begins it only when the
    shell found the creator may read that Secret (Observed.granted, confirmed within the
    rights TTL); else committed Pending first, so that the shell checks it before its
    launch is decided (a refusal then fails it: tests/unit/test_authz.py)."""
    model = {"baseURL": "http://127.0.0.1:9/v1", "name": "m", "apiKeySecretRef": SECRET_KEY}
    sim = AgentSim(agent_run(model=model))
    sim.granted = granted
    sim.tick()
    assert sim.agent.stage == agent_status.AgentStage.THINKING
    if granted:
        assert sim.step_status("t1-model").phase == SP.LAUNCHING and sim.model_job() is not None
        return
    assert sim.step_status("t1-model").phase == SP.PENDING and not sim.jobs
    sim.granted = frozenset({("get", "secrets", "another")})  # not the one it uses
    sim.tick()  # committed: checked by the shell, whose refusals would stop it here
    assert sim.model_job() is not None


def test_the_committed_launch_of_a_turn_and_a_call_is_the_job_the_machine_created() -> None:
    """A restarted operator verifies a Job found under an attempt's name against the create
    the committed status gives (agentrun.observation.adoption): for the loop's steps too."""
    from agentrun.core.machine import committed_launch

    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c")])
    sim.settle()
    for step in ("t1-model", "t1-0-search"):
        st = sim.step_status(step)
        assert st.job_name is not None
        assert committed_launch(sim.run, step) == sim.created_specs[st.job_name], step
