"""The run's executor as the core decides it (:mod:`agentrun.core.executor`): made once per
run, each model turn's attempt (and each call of an MCP server's tool) bound to its pod and
sent to it, lost attempts retried, and replaced when it ends."""

from __future__ import annotations

import dataclasses
import json

from agentrun.api import agent_status
from agentrun.api import mcp as mcp_api
from agentrun.api import models as m
from agentrun.core import (
    CreateJob,
    JobState,
    PrepareTurn,
    SendTurn,
    mcp,
    reconcile,
    turn_steps,
    turns,
)
from agentrun.core import agent_loop as loop
from agentrun.core import executor as ex
from tests.support.agent_sim import RESTART, SEARCH, AgentSim, agent_run, call, tool_envelope
from tests.support.executor_sim import ExecutorSim
from tests.support.sim import T0

KEYED = {"baseURL": "http://127.0.0.1:9/v1", "name": "m",
         "apiKeySecretRef": {"name": "llm-key", "key": "token"}}  # fmt: skip


def _model_attempt(sim: AgentSim, turn: int) -> m.StepStatus:
    return sim.step_status(turns.model_step(turn))


def test_a_run_makes_one_executor_and_every_turn_goes_to_it() -> None:
    sim = ExecutorSim(agent_run())
    sim.settle()
    # Named in status first, then made; its pod let start by this process.
    assert sim.agent.executor == agent_status.ExecutorStatus(
        generation=1, job_name=turns.executor_name(sim.run, 1), named_at=T0
    )
    assert list(sim.executors) == [turns.executor_name(sim.run, 1)]
    assert sim.executors[turns.executor_name(sim.run, 1)].started
    # The first turn waited for the executor and is bound to its pod: no Job of its own.
    first = _model_attempt(sim, 1)
    assert first.executor_pod == "executor-pod-1" and first.job_name not in sim.jobs
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    # So is the second, sent once its intent is committed.
    second = _model_attempt(sim, 2)
    assert second.executor_pod == "executor-pod-1"
    assert second.job_name not in sim.jobs and second.phase == m.StepPhase.LAUNCHING
    (sent,) = {s for s in sim.sent if s.step == "t2-model"}  # each pass asks again
    assert (sent.job_name, sent.step, sent.attempt, sent.turn) == (
        second.job_name,
        "t2-model",
        1,
        2,
    )
    assert sent.address == "10.0.0.9" and sent.digest == sim.agent.context.digest
    assert sent.idempotency_key == second.idempotency_key
    # Its answer settles the turn as a pod's termination message would.
    sim.executor_answers("", [call("search", {"query": "disk"})])
    sim.tools_return()
    sim.executor_answers("the disk is full")
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    assert sim.agent.answer == "the disk is full"
    assert sorted({s.step for s in sim.sent}) == ["t1-model", "t2-model", "t3-model"]
    assert len(sim.executors) == 1
    # No model turn's Job was made, ahead or at its launch: the executor takes them.
    assert [n for n in sim.creations if "model" in n] == []


def test_a_turn_waits_for_an_executor_that_does_not_run_then_runs_as_a_job() -> None:
    sim = ExecutorSim(agent_run(), pods_start=False)
    sim.settle()
    # The executor is made, its pod let start, and it does not run: the first turn waits.
    assert list(sim.executors) == [turns.executor_name(sim.run, 1)]
    assert sim.step_status("t1-model").phase == m.StepPhase.PENDING
    assert not [n for n in sim.creations if "model" in n] and sim.sent == []
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    assert decision.requeue_after == ex.WAIT_SECONDS  # the pass that stops waiting
    sim.advance(ex.WAIT_SECONDS - 1)
    sim.settle()
    assert sim.step_status("t1-model").phase == m.StepPhase.PENDING
    sim.advance(1)
    sim.settle()
    first = _model_attempt(sim, 1)
    assert first.executor_pod is None and first.job_name in sim.jobs
    sim.answer("", [call("search", {"query": "db"})])
    sim.tools_return()
    # Named 30 s ago and still not running: the next turn does not wait for it again.
    second = _model_attempt(sim, 2)
    assert second.executor_pod is None and second.job_name in sim.jobs


def test_no_turn_jobs_are_made_ahead_with_an_executor() -> None:
    sim = ExecutorSim(agent_run())
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    assert not [p for p in decision.after_commit if isinstance(p, PrepareTurn)]


def test_a_turn_sent_again_to_the_executor_it_is_bound_to_until_answered() -> None:
    sim = ExecutorSim(agent_run())
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    second = _model_attempt(sim, 2)
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    again = [s for s in decision.after_commit if isinstance(s, SendTurn)]
    assert [(s.job_name, s.executor) for s in again] == [
        (second.job_name, turns.executor_name(sim.run, 1))
    ]
    assert not [c for c in decision.after_commit if isinstance(c, CreateJob)]


def test_an_attempt_whose_executor_went_fails_and_its_retry_goes_to_the_next() -> None:
    retried = {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted", "retry": {"limit": 2}}
    sim = ExecutorSim(agent_run(model=retried))
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    lost = _model_attempt(sim, 2)
    assert lost.executor_pod == "executor-pod-1"
    sim.executors[turns.executor_name(sim.run, 1)].state = JobState.FAILED
    sim.version += 1
    sim.settle()
    # Failed, as a pod's death fails an attempt; a new executor named and made, and the
    # retry, a new attempt with its own intent, sent to it.
    history = [h.message or "" for h in sim.status.history or [] if h.step == "t2-model"]
    assert any(ex.LOST in text and "is gone without its outcome" in text for text in history)
    sim.advance(30)
    sim.settle()
    assert sim.agent.executor is not None and sim.agent.executor.named_at is not None
    assert sim.agent.executor == agent_status.ExecutorStatus(
        generation=2,
        job_name=turns.executor_name(sim.run, 2),
        named_at=sim.agent.executor.named_at,
    )
    retry = _model_attempt(sim, 2)
    assert (retry.attempt, retry.executor_pod) == (2, "executor-pod-2")
    sim.executor_answers("done")
    assert sim.status.phase == m.RunPhase.SUCCEEDED


def test_an_executor_found_after_a_restart_is_replaced_once_nothing_is_bound_to_it() -> None:
    sim = ExecutorSim(agent_run())
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    name = turns.executor_name(sim.run, 1)
    sim.executors[name].trusted = False  # not made by this process, nor verified
    # The attempt in flight is still asked of it, and it is kept meanwhile.
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    assert [s.executor for s in decision.after_commit if isinstance(s, SendTurn)] == [name]
    assert decision.status.agent is not None
    assert decision.status.agent.executor == sim.agent.executor
    sim.executor_answers("", [call("search", {"query": "disk"})])
    sim.tools_return()
    # The next turn does not go to it: a new executor is made, and the turn waits for it.
    assert sim.agent.executor is not None and sim.agent.executor.generation == 2
    third = _model_attempt(sim, 3)
    assert third.executor_pod == "executor-pod-2" and third.job_name not in sim.jobs


def test_a_keyed_models_executor_is_made_only_while_its_rights_are_confirmed() -> None:
    sim = ExecutorSim(agent_run(model=KEYED))
    sim.settle()
    assert sim.agent.executor is None and not sim.executors
    # Nothing coming: the first turn is a Job of its own at once.
    assert _model_attempt(sim, 1).job_name in sim.jobs


def test_a_keyed_models_first_turn_goes_to_the_executor_once_its_rights_are_confirmed() -> None:
    sim = ExecutorSim(agent_run(model=KEYED))
    sim.granted = frozenset({("get", "secrets", "llm-key")})  # asked from the first pass
    sim.settle()
    first = _model_attempt(sim, 1)
    assert first.executor_pod == "executor-pod-1" and first.job_name not in sim.jobs


def test_without_the_setting_there_is_no_executor() -> None:
    sim = AgentSim(agent_run())
    sim.settle()
    sim.answer("", [call("search", {"query": "db"})])
    sim.tools_return()
    assert sim.agent.executor is None
    assert _model_attempt(sim, 2).executor_pod is None


def test_the_attempts_bound_to_an_executor_as_the_core_observes_them() -> None:
    sim = ExecutorSim(agent_run())
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    st = _model_attempt(sim, 2)
    executor = sim.executor_job()
    assert executor is not None
    (running,) = ex.attempts_on(sim.run, executor.job, {})
    assert (running.name, running.state, running.address) == (
        st.job_name,
        JobState.ACTIVE,
        "10.0.0.9",
    )
    assert not running.held  # nothing to release: it is not a Job
    (answered,) = ex.attempts_on(sim.run, executor.job, {st.job_name or "": (1, "boom")})
    assert (answered.state, answered.exit_code, answered.termination_message) == (
        JobState.FAILED,
        1,
        "boom",
    )
    other = dataclasses.replace(executor.job, pod_uid="another-pod")
    (lost,) = ex.attempts_on(sim.run, other, {})
    assert (lost.state, lost.reason) == (JobState.FAILED, ex.LOST)
    (gone,) = ex.attempts_on(sim.run, None, {})
    assert gone.reason == ex.LOST


def test_an_executor_that_ended_is_not_made_again_while_a_call_waits_for_approval() -> None:
    sim = ExecutorSim(agent_run(tools=[SEARCH, RESTART]))
    sim.settle()
    sim.executor_answers("", [call("restart", {"service": "checkout"}, "r1")])
    assert sim.step_status("t1-0-restart").phase == m.StepPhase.WAITING_FOR_APPROVAL
    # It ends itself after an hour idle: no new one while the approval is awaited.
    sim.executors[turns.executor_name(sim.run, 1)].state = JobState.SUCCEEDED
    sim.version += 1
    sim.settle()
    assert sim.agent.executor is not None and sim.agent.executor.generation == 1
    h = sim.step_status("t1-0-restart").args_hash
    ok = m.Approval(step="t1-0-restart", decision="approve", args_hash=h, by="alice")
    sim.spec_update(approvals=[ok])
    sim.settle()
    # Approved: the call runs, and the next executor is made for the turns after it.
    assert sim.agent.executor is not None and sim.agent.executor.generation == 2
    assert turns.executor_name(sim.run, 2) in sim.executors


def test_a_retry_that_finds_no_executor_running_is_a_job_not_bound_to_the_lost_pod() -> None:
    retried = {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted", "retry": {"limit": 2}}
    sim = ExecutorSim(agent_run(model=retried))
    sim.settle()
    sim.executor_answers("", [call("search", {"query": "db"})])
    sim.tools_return()
    launch = [h for h in sim.status.history or [] if h.step == "t2-model"][-1]
    assert "on the run's executor" in (launch.message or "") and "executor-pod-1" in (
        launch.message or ""
    )
    sim.executors[turns.executor_name(sim.run, 1)].state = JobState.FAILED
    sim.version += 1
    sim.settle()
    # The next executor's pod has not started yet when the retry launches.
    sim.executors.clear()
    sim.advance(30)
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    st = next(s for s in decision.status.steps or [] if s.name == "t2-model")
    assert st.attempt == 2 and st.executor_pod is None
    assert [c.job_name for c in decision.after_commit if isinstance(c, CreateJob)] == [st.job_name]


MCP_SERVER = {
    "name": "tools",
    "url": "http://tools.team.svc:8000/mcp",
    "headers": [{"name": "Authorization", "secretKeyRef": {"name": "mcp", "key": "token"}}],
    "tools": [{"name": "lookup"}],
}
LOOKUP = {"name": "lookup", "description": "Look a word up.", "inputSchema": {"type": "object"}}
MCP_SECRET = ("get", "secrets", "mcp")


def _mcp_sim(granted: bool = True) -> ExecutorSim:
    """A run with one MCP server whose discovery step has reported its tool."""
    sim = ExecutorSim(agent_run(mcpServers=[MCP_SERVER]))
    if granted:
        sim.granted = frozenset({MCP_SECRET})
    sim.settle()
    _discover(sim)
    return sim


def _discover(sim: ExecutorSim) -> None:
    """The discovery step reports the server's one tool: from the run's executor, or from its
    own Job when the run has no executor."""
    server = mcp_api.McpServer.model_validate(MCP_SERVER)
    found = mcp.pin(server, [LOOKUP])
    envelope = tool_envelope(json.dumps(found.to_wire()), "1 tool")
    sent = {s.job_name for s in sim.sent if s.program == ex.MCP_DISCOVER}
    if sent:
        (attempt,) = sent  # sent again on each pass until it answers
        sim.answers[attempt] = (0, envelope)
    else:
        (job,) = sim.tool_jobs()
        sim.finish(job.name, True, envelope)
    sim.settle()


def test_with_mcp_servers_the_executor_starts_beside_the_discovery_and_takes_turn_one() -> None:
    sim = ExecutorSim(agent_run(mcpServers=[MCP_SERVER]))
    sim.granted = frozenset({MCP_SECRET})
    sim.settle()
    assert sim.executors[turns.executor_name(sim.run, 1)].started
    # The discovery waited for the executor and was sent to it: no Job of its own.
    assert sim.agent.turn == 0 and sim.tool_jobs() == []
    discovery = sim.step_status("t0-mcp-tools")
    assert discovery.executor_pod == "executor-pod-1" and discovery.job_name not in sim.jobs
    sent = next(s for s in sim.sent if s.step == "t0-mcp-tools")
    assert (sent.program, sent.parts, sent.turn) == (ex.MCP_DISCOVER, 0, 0)
    assert [name for name, _ in sent.env] == [turns.ENV_MCP_SERVER]
    assert sent.digest == ex.call_digest(dict(sent.env), dict(sent.secret_env))
    _discover(sim)
    first = _model_attempt(sim, 1)
    assert first.executor_pod == "executor-pod-1" and first.job_name not in sim.jobs


def test_a_discovery_waits_for_an_executor_that_does_not_run_then_runs_as_a_job() -> None:
    sim = ExecutorSim(agent_run(mcpServers=[MCP_SERVER]), pods_start=False)
    sim.granted = frozenset({MCP_SECRET})
    sim.settle()
    # The executor is made, its pod let start, and it does not run: the discovery waits.
    assert list(sim.executors) == [turns.executor_name(sim.run, 1)]
    assert sim.step_status("t0-mcp-tools").phase == m.StepPhase.PENDING
    assert sim.tool_jobs() == [] and sim.sent == []
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    assert decision.requeue_after == ex.WAIT_SECONDS  # the pass that stops waiting
    sim.advance(ex.WAIT_SECONDS - 1)
    sim.settle()
    assert sim.tool_jobs() == []
    sim.advance(1)
    sim.settle()
    (job,) = sim.tool_jobs()
    assert job.step == "t0-mcp-tools" and sim.sent == []
    assert sim.step_status("t0-mcp-tools").executor_pod is None
    _discover(sim)
    assert sim.agent.turn == 1


def test_without_the_executor_a_discovery_is_a_job_at_once() -> None:
    sim = ExecutorSim(agent_run(mcpServers=[MCP_SERVER]))
    sim.config = dataclasses.replace(
        sim.config, agent=dataclasses.replace(sim.config.agent, executor=False)
    )
    sim.granted = frozenset({MCP_SECRET})
    sim.settle()
    assert [j.step for j in sim.tool_jobs()] == ["t0-mcp-tools"] and not sim.executors


def test_a_call_of_an_mcp_tool_goes_to_the_executor_which_holds_the_header_secret() -> None:
    sim = _mcp_sim()
    executor_job = turns.executor_name(sim.run, 1)
    assert sim.executors[executor_job].started
    # The executor's Job takes the header's Secret under a name of its own.
    step = turn_steps.executor_step(sim.run, sim.agent, sim.config.agent)
    ref = m.SecretKeySelector(name="mcp", key="token")
    held = next(e for e in step.container.env or [] if e.name == turns.executor_secret_env(ref))
    assert held.value_from is not None and held.value_from.secret_key_ref == ref
    sim.executor_answers("", [call("lookup", {"word": "latency"}, "c1")])
    st = sim.step_status("t1-0-lookup")
    assert st.executor_pod == "executor-pod-1" and st.job_name not in sim.jobs
    (sent,) = {s for s in sim.sent if s.step == "t1-0-lookup"}
    assert (sent.program, sent.executor, sent.parts) == (ex.MCP_CALL, executor_job, 0)
    env = dict(sent.env)
    assert json.loads(env[loop.ENV_TOOL_ARGS]) == {"word": "latency"}
    assert json.loads(env[turns.ENV_MCP_PINNED])["digest"] == mcp.tool_digest(LOOKUP)
    assert dict(sent.secret_env) == {f"{turns.ENV_MCP_HEADER}0": turns.executor_secret_env(ref)}
    assert sent.digest == ex.call_digest(dict(sent.env), dict(sent.secret_env))
    assert sent.idempotency_key == st.idempotency_key
    # Asked again on every pass until it answers (the shell sends once per process).
    decision = reconcile(sim.run, sim.observed(), sim.now, sim.config)
    again = [s for s in decision.after_commit if isinstance(s, SendTurn)]
    assert [(s.job_name, s.program) for s in again] == [(st.job_name, ex.MCP_CALL)]
    recorded = {"isError": False, "content": [{"type": "text", "text": "latency: delay"}]}
    sim.answers[st.job_name or ""] = (0, tool_envelope(json.dumps(recorded), "latency: delay"))
    sim.settle()
    assert sim.agent.turn == 2
    (outcome,) = sim.transcript()[0]["toolCalls"]
    assert outcome["outcome"] == "Succeeded" and json.loads(outcome["result"]) == recorded
    assert not [j for j in sim.creations if "lookup" in j]


def test_the_history_says_a_call_and_a_turn_run_on_the_executor_never_as_a_job() -> None:
    sim = _mcp_sim()
    executor_job = turns.executor_name(sim.run, 1)
    sim.executor_answers("", [call("lookup", {"word": "latency"}, "c1")])
    sim.advance(sim.config.running_after_seconds + 1)
    sim.settle()  # the call has run long enough to be Running
    sim.answers[sim.step_status("t1-0-lookup").job_name or ""] = (0, tool_envelope("{}", "ok"))
    sim.settle()
    sim.advance(sim.config.running_after_seconds + 1)
    sim.settle()  # and so has turn 2
    started = {t.step: t.message or "" for t in sim.status.history or [] if t.reason == "Started"}
    assert set(started) == {"t1-0-lookup", "t2-model"}
    for step in ("t1-0-lookup", "t2-model"):
        assert started[step] == (
            f"step {step}: attempt 1 running on the run's executor {executor_job} "
            "(pod executor-pod-1)"
        )
    assert not [name for name in sim.creations if "lookup" in name or "t2-model" in name]


def test_without_the_header_secrets_confirmed_there_is_no_executor_and_calls_are_jobs() -> None:
    sim = _mcp_sim(granted=False)
    assert sim.agent.executor is None and not sim.executors
    sim.answer("", [call("lookup", {"word": "latency"}, "c1")])
    assert [j.step for j in sim.tool_jobs()] == ["t1-0-lookup"]
    assert sim.step_status("t1-0-lookup").executor_pod is None


def test_a_call_whose_variable_the_executor_does_not_hold_is_not_sent_to_it() -> None:
    sim = _mcp_sim()
    step = turn_steps.executor_step(sim.run, sim.agent, sim.config.agent)
    other = m.SecretKeySelector(name="other", key="token")
    source = m.EnvVarSource(secret_key_ref=m.SecretKeySelector(name="other", key="token"))
    foreign = step.model_copy(
        update={
            "container": step.container.model_copy(
                update={"env": [m.EnvVar(name=f"{turns.ENV_MCP_HEADER}0", value_from=source)]}
            )
        }
    )
    assert turns.executor_secret_env(other) not in turn_steps.executor_secrets(sim.run.spec.agent)
    assert ex.call_env(sim.run, foreign) is None
