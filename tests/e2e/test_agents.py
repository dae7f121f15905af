"""Agents as objects end to end: a namespace's admins define an Agent and its ModelConfig once,
runs name it (spec.agentRef), and the operator (its own process) takes the Agent once, with the
creator's rights checked, into status.agent.definition; the scripted model server shows what
every turn was sent.

Runs are made with the admission policies bound (the creator they record is whose rights the
operator checks).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.agents import RESTART, SEARCH
from tests.support.cluster import StartOperator, bind_role, mint_user, user_subject
from tests.support.plugin import LLM_COMMAND, kubectl_agentrun
from tests.support.runs import condition, get, status_of
from tests.support.waiting import wait_phase, wait_step_phase

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
INSTRUCTIONS = "You are the triage agent. Search, then answer."


@pytest.fixture
def agents_operator(
    cluster: TestCluster, namespace: str, start_operator: StartOperator
) -> Iterator[OperatorProcess]:
    """The operator, with the admission policies bound to the test's namespace."""
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        yield start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})


def define(kube: KubeClients, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    plural = {"Agent": "agents", "ModelConfig": "modelconfigs"}[kind]
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name},
            "spec": spec}  # fmt: skip
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


def patch(kube: KubeClients, namespace: str, plural: str, name: str, spec: dict[str, Any]) -> int:
    """A merge patch of the object's spec; its new generation."""
    done = kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, name, {"spec": spec}
    )
    return int(done["metadata"]["generation"])


def run_of(name: str, agent: str = "triage", goal: str = "why is checkout slow?") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"goal": goal, "agentRef": {"name": agent}},
    }


def start(kube: KubeClients, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", body)


def test_three_runs_of_one_agent_and_a_change_of_it_mid_run_changes_nothing(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agents_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    define(kube, namespace, "ModelConfig", "small", {"baseURL": model.base_url, "name": "scripted"})
    define(kube, namespace, "Agent", "triage", {
        "instructions": INSTRUCTIONS,
        "modelConfigRef": {"name": "small"},
        "tools": [SEARCH, RESTART],
    })  # fmt: skip
    for i in (1, 2, 3):
        model.add(
            reply("searching", [tool_call("search", {"query": f"run {i}"}, f"c{i}")]),
            reply(f"answer {i}"),
        )
    for i in (1, 2, 3):
        start(kube, namespace, run_of(f"triage-{i}", goal=f"question {i}"))
        wait_phase(kube, namespace, f"triage-{i}", "Succeeded")
    for i in (1, 2, 3):
        done = get(kube, namespace, f"triage-{i}")
        taken = status_of(done)["agent"]["definition"]
        assert taken["agent"]["name"] == "triage" and taken["agent"]["generation"] == 1
        assert taken["modelConfig"]["name"] == "small"
        assert taken["spec"]["instructions"] == INSTRUCTIONS
        assert "agent" not in done["spec"], "the operator never writes a run's spec"
        assert status_of(done)["agent"]["answer"] == f"answer {i}"
    sent = model.completions()
    assert len(sent) == 6
    assert all(body.messages[0]["content"] == INSTRUCTIONS for body in sent)
    assert sorted(body.messages[1]["content"] for body in sent[::2]) == [
        "question 1", "question 2", "question 3",
    ]  # fmt: skip

    # A fourth run waits for an approval; meanwhile the admins change the Agent and the
    # ModelConfig (another endpoint, other instructions, no restart tool).
    model.add(
        reply("restarting", [tool_call("restart", {"service": "checkout"}, "r1")]),
        reply("restarted; fine now"),
    )
    start(kube, namespace, run_of("triage-4"))
    wait_step_phase(kube, namespace, "triage-4", "t1-0-restart", "WaitingForApproval")
    agent_generation = patch(kube, namespace, "agents", "triage",
                             {"instructions": "CHANGED", "tools": [SEARCH]})  # fmt: skip
    config_generation = patch(kube, namespace, "modelconfigs", "small",
                              {"baseURL": "http://127.0.0.1:9/v1"})  # fmt: skip
    assert (agent_generation, config_generation) == (2, 2)
    approved = kubectl_agentrun(cluster, "approve", "triage-4", "t1-0-restart", "-n", namespace)
    assert approved.returncode == 0, approved.stderr
    finished = wait_phase(kube, namespace, "triage-4", "Succeeded")
    taken = status_of(finished)["agent"]["definition"]
    assert (taken["agent"]["generation"], taken["modelConfig"]["generation"]) == (1, 1)
    last = model.completions()[-1]
    assert last.messages[0]["content"] == INSTRUCTIONS
    assert [t["function"]["name"] for t in last.body["tools"]] == ["search", "restart"]

    # A run started now takes the Agent as it is now (and fails: the endpoint is closed).
    start(kube, namespace, run_of("triage-5"))
    failed = wait_phase(kube, namespace, "triage-5", "Failed")
    taken = status_of(failed)["agent"]["definition"]
    assert (taken["agent"]["generation"], taken["modelConfig"]["generation"]) == (2, 2)
    assert taken["spec"]["instructions"] == "CHANGED"


def test_start_runs_an_agent_and_a_follow_up_asks_it_the_next_question(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agents_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    define(kube, namespace, "ModelConfig", "small", {"baseURL": model.base_url, "name": "scripted"})
    define(kube, namespace, "Agent", "triage",
           {"instructions": INSTRUCTIONS, "modelConfigRef": {"name": "small"}})  # fmt: skip
    model.add(reply("checkout is slow because of the cache"), reply("yes, restart it"))
    started = kubectl_agentrun(cluster, "start", "triage", "why is checkout slow?",
                               "--name", "talk", "--wait", "-n", namespace)  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "checkout is slow because of the cache"
    assert "started agentrun/talk, a run of Agent triage" in started.stderr
    wait_phase(kube, namespace, "talk", "Succeeded")
    asked = kubectl_agentrun(cluster, "ask", "talk", "should I restart it?", "-n", namespace)
    assert asked.returncode == 0, asked.stderr
    follow = asked.stdout.strip()
    run = wait_phase(kube, namespace, follow, "Succeeded")
    assert run["spec"]["agentRef"]["resumeFrom"]["run"] == "talk"
    assert status_of(run)["agent"]["answer"] == "yes, restart it"
    second = model.completions()[-1].messages
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == "checkout is slow because of the cache"
    assert second[3]["content"] == "should I restart it?"


def test_a_creator_who_may_not_read_the_agent_or_its_key_gets_a_refusal(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agents_operator: OperatorProcess,
    model: ScriptedModel,
    tmp_path: Path,
) -> None:
    key = {"name": "llm-key", "key": "token"}
    define(kube, namespace, "ModelConfig", "keyed",
           {"baseURL": model.base_url, "name": "scripted", "apiKeySecretRef": key})  # fmt: skip
    define(kube, namespace, "Agent", "triage",
           {"instructions": INSTRUCTIONS, "modelConfigRef": {"name": "keyed"}})  # fmt: skip
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "llm-key"}, "stringData": {"token": "sk-genuine"}}
    )
    config = mint_user(cluster, "rita", ["developers"], tmp_path / "rita.kubeconfig")
    runs = {"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["create", "get"]}
    bind_role(kube, namespace, "rita-runs", [runs], [user_subject("rita")])

    def as_rita(body: dict[str, Any]) -> None:
        made = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body),
                               kubeconfig=config, check=False)  # fmt: skip
        assert made.returncode == 0, made.stderr

    as_rita(run_of("no-agent"))
    refused = wait_phase(kube, namespace, "no-agent", "Failed")
    assert condition(refused)["reason"] == "AgentRefRefused"
    assert "creator rita may not get agents.agentrun.dev/triage" in status_of(refused)["message"]
    assert "definition" not in (status_of(refused).get("agent") or {})

    agents = {"apiGroups": [GROUP], "resources": ["agents", "modelconfigs"], "verbs": ["get"]}
    bind_role(kube, namespace, "rita-agents", [agents], [user_subject("rita")])
    as_rita(run_of("no-key"))
    refused = wait_phase(kube, namespace, "no-key", "Failed")
    assert condition(refused)["reason"] == "AgentRefRefused"
    assert "may not get secrets/llm-key" in status_of(refused)["message"]
    assert model.completions() == [], "no turn was sent"


def test_a_sub_agent_by_agent_reference_runs_that_agent_as_it_is_when_the_child_starts(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agents_operator: OperatorProcess,
    model: ScriptedModel,
    tmp_path: Path,
) -> None:
    define(kube, namespace, "ModelConfig", "small", {"baseURL": model.base_url, "name": "scripted"})
    define(kube, namespace, "Agent", "researcher", {
        "instructions": "You research one question, then answer in one line.",
        "modelConfigRef": {"name": "small"},
        "maxTurns": 2,
    })  # fmt: skip
    researcher = {
        "name": "researcher",
        "description": "Hands one question to the researcher Agent.",
        "parameters": {
            "type": "object",
            "properties": {"goal": {"type": "string"}},
            "required": ["goal"],
        },
        "agent": {"agentRef": "researcher", "preamble": "Answer in one line."},
    }
    define(kube, namespace, "Agent", "lead", {
        "instructions": INSTRUCTIONS,
        "modelConfigRef": {"name": "small"},
        "tools": [researcher],
    })  # fmt: skip
    model.add(
        reply("", [tool_call("researcher", {"goal": "why is the cache cold?"}, "r1")]),
        reply("The cache was flushed at 9:00."),  # the child's only turn
        reply("Checkout is slow: the cache was flushed at 9:00."),
    )
    # Made by a person (not the identity the test's operator runs as): the child acts for her.
    alice = mint_user(cluster, "alice", [], tmp_path / "alice.kubeconfig")
    rules = [
        {"apiGroups": [GROUP], "resources": ["agentruns"], "verbs": ["create", "get"]},
        {"apiGroups": [GROUP], "resources": ["agents", "modelconfigs"], "verbs": ["get"]},
    ]
    bind_role(kube, namespace, "alice-runs", rules, [user_subject("alice")])
    body = run_of("lead-run", agent="lead")
    body["spec"]["budget"] = {"maxTokens": 100000}
    made = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body),
                           kubeconfig=alice, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    run = wait_phase(kube, namespace, "lead-run", "Succeeded", timeout=180)
    assert status_of(run)["agent"]["answer"] == "Checkout is slow: the cache was flushed at 9:00."
    children = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns",
        label_selector=f"agentrun.dev/parent-uid={run['metadata']['uid']}",
    )["items"]  # fmt: skip
    (child,) = children
    assert child["spec"]["agentRef"] == {"name": "researcher"}
    assert "agent" not in child["spec"]
    taken = status_of(child)["agent"]["definition"]
    assert (taken["agent"]["name"], taken["agent"]["generation"]) == ("researcher", 1)
    assert taken["spec"]["maxTurns"] == 2
    _, second, third = model.completions()
    assert second.messages[0]["content"] == "You research one question, then answer in one line."
    assert second.messages[-1]["content"] == "Answer in one line.\n\nwhy is the cache cold?"
    assert third.tool_answers["r1"] == "The cache was flushed at 9:00."


def test_a_model_config_whose_first_model_fails_falls_back_to_the_next(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    agents_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    define(kube, namespace, "ModelConfig", "with-backup", {
        "baseURL": "http://127.0.0.1:9/v1",  # nothing listens: no connection
        "name": "primary",
        "fallbacks": [{"baseURL": model.base_url, "name": "backup"}],
    })  # fmt: skip
    define(kube, namespace, "Agent", "triage",
           {"instructions": INSTRUCTIONS, "modelConfigRef": {"name": "with-backup"}})  # fmt: skip
    model.add(reply("the backup answered"))
    start(kube, namespace, run_of("backed-up"))
    run = wait_phase(kube, namespace, "backed-up", "Succeeded")
    agent = status_of(run)["agent"]
    assert agent["answer"] == "the backup answered"
    (turn,) = agent["recent"]
    assert (turn["model"], turn["fallback"]) == ("backup", 1)
    assert agent["definition"]["spec"]["model"]["fallbacks"][0]["name"] == "backup"
    assert [c.body["model"] for c in model.completions()] == ["backup"]
