"""An agent run on a real model: llama.cpp's ``llama-server`` with Gemma 3 270M on the CPU,
behind a recording proxy, with the operator as its own process and tools as busybox scripts.

A model this small does not reliably do what it is asked, so nothing here asserts what it
answers or which tools it calls. What is asserted is the protocol, whatever the model does:

* the run ends (Succeeded, Failed or Cancelled) with a reason and a message;
* the tokens in status are the tokens the server reported, summed over its answers;
* every tool call the server returned is either run as a step or answered with the reason it
  was not run, recorded in the turn's transcript and answered exactly once in the next request;
* the server refused nothing the operator sent (no HTTP 4xx or 5xx).

llama-server and the model are built and fetched by ``hack/build-llama-server.sh`` and
``hack/fetch-model.sh`` (cached under ~/.cache/agentrun; the first build takes a while): when
they cannot be had, the test fails saying what is missing.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.llamaserver import (
    MODEL_NAME,
    Exchange,
    LlamaServer,
    LlamaUnavailable,
    RecordingProxy,
    build_llama,
)
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.agents import RESTART, SEARCH, agent_run
from tests.support.cluster import StartOperator
from tests.support.plugin import LLM_COMMAND, kubectl_agentrun
from tests.support.runs import TERMINAL, condition, create, status_of
from tests.support.waiting import wait_until

RUN_TIMEOUT = 1800.0
"""Seconds the run may take: turns on two busy CPU cores are slow; nothing asserts on speed."""

GOAL = (
    "Find out why the checkout service is slow. Search its logs for the word timeout with "
    "the search tool, then answer in one sentence."
)


@pytest.fixture(scope="module")
def llama() -> tuple[Path, Path]:
    """llama-server and the GGUF, from the project's scripts; a failure says what is missing."""
    try:
        return build_llama()
    except LlamaUnavailable as e:
        pytest.fail(f"no real model to test against: {e}", pytrace=False)


@pytest.fixture
def real_model(llama: tuple[Path, Path], tmp_path: Path) -> Iterator[RecordingProxy]:
    binary, model = llama
    with (
        LlamaServer(binary, model, log_path=tmp_path / "llama-server.log") as server,
        RecordingProxy(upstream=server.root_url) as proxy,
    ):
        yield proxy


@pytest.fixture
def agent_operator(cluster: TestCluster, start_operator: StartOperator) -> OperatorProcess:
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    return start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})


def _transcript(kube: KubeClients, namespace: str, uid: str) -> list[dict[str, Any]]:
    items = kube.core.list_namespaced_config_map(
        namespace, label_selector=f"agentrun.dev/run-uid={uid},agentrun.dev/object=transcript"
    ).items
    records = [json.loads(cm.data["turn"]) for cm in items]
    return sorted(records, key=lambda r: int(r["turn"]))


def _summary(status: dict[str, Any], exchanges: list[Exchange]) -> str:
    """One line of what happened, for the report and every failure message."""
    calls = sum(len(e.tool_calls) for e in exchanges if e.status == 200)
    reason = next(
        (c.get("reason") for c in status.get("conditions") or [] if c["type"] == "Succeeded"),
        None,
    )
    return (
        f"phase {status.get('phase')} ({reason}): {status.get('message')!r}; "
        f"{len(exchanges)} requests (HTTP {[e.status for e in exchanges]}), {calls} tool calls, "
        f"{(status.get('usage') or {}).get('tokens')} tokens in status"
    )


def test_a_run_on_a_real_model_keeps_the_protocol(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agent_operator: OperatorProcess,
    real_model: RecordingProxy,
) -> None:
    body = agent_run(
        "real",
        real_model,
        tools=[SEARCH, RESTART],
        model_extra={"name": MODEL_NAME, "maxOutputTokens": 128, "timeoutSeconds": 900},
        agent={"maxTurns": 3, "instructions": "You are an SRE on call. Use the tools."},
        goal=GOAL,
    )
    created = create(kube, namespace, body)
    approved: set[str] = set()

    def ended(run: dict[str, Any]) -> bool:
        """Whether the run ended; approves each call that waits (a person would)."""
        status = status_of(run)
        for st in status.get("steps") or []:
            if st.get("phase") == "WaitingForApproval" and st["name"] not in approved:
                proc = kubectl_agentrun(cluster, "approve", "real", st["name"], "-n", namespace)
                assert proc.returncode == 0, proc.stderr
                approved.add(st["name"])
        return status.get("phase") in TERMINAL

    run = wait_until(kube, namespace, "real", "a terminal phase", ended, timeout=RUN_TIMEOUT)
    status = status_of(run)
    exchanges = real_model.answered()
    summary = _summary(status, exchanges)
    print(f"\nreal model: {summary}")

    # The run ended with a reason.
    assert condition(run).get("reason"), summary
    assert status.get("message"), summary
    # Every request reached the server, through the proxy.
    assert len(real_model.sent()) == len(exchanges) >= 1, summary

    # The tokens in status are the server's, summed over its answers.
    assert status["usage"]["tokens"] == sum(e.tokens for e in exchanges if e.status == 200), summary

    # Every tool call the server returned was run as a step or answered as not run, in the
    # transcript of its turn and, when another turn followed, once in the next request.
    records = {int(r["turn"]): r for r in _transcript(kube, namespace, created["metadata"]["uid"])}
    answered = [e for e in exchanges if e.status == 200]
    for turn, exchange in enumerate(answered, start=1):
        calls = exchange.tool_calls
        if not calls:
            continue
        record = records.get(turn)
        assert record is not None, f"turn {turn} made calls and has no transcript; {summary}"
        recorded = {c["id"]: c for c in record["toolCalls"]}
        assert sorted(recorded) == sorted(c["id"] for c in calls), summary
        for call in recorded.values():
            ran = call.get("step") is not None and call["outcome"] != "Invalid"
            refused = call["outcome"] == "Invalid" and bool(call.get("problem"))
            assert ran or refused, f"call {call['id']} of turn {turn}: {call}; {summary}"
        later = exchanges[exchanges.index(exchange) + 1 :]
        if later:
            tool_ids = [
                m.get("tool_call_id") for m in later[0].request["messages"] if m["role"] == "tool"
            ]
            for call in calls:
                assert tool_ids.count(call["id"]) == 1, (
                    f"call {call['id']} answered {tool_ids.count(call['id'])} times; {summary}"
                )

    # The server refused nothing the operator sent.
    refused = [(e.status, e.body[:300]) for e in exchanges if e.status != 200]
    assert not refused, f"llama-server refused requests: {refused}; {summary}"
