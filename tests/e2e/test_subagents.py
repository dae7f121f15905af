"""Sub-agents end to end: an agent run on the scripted model calls a sub-agent tool, the
operator makes the child AgentRun, the child's own turns run, and its answer is the call's
result; cancelling the parent cancels its children. Then what those decisions rely on against
a real control plane, with children made here as the operator makes them
(:func:`agentrun.core.subagents.child_manifest`):
the spec read back after the API server's defaulting still has the digest adoption compares,
a second create of the same call's child meets AlreadyExists, ``tree`` shows the family by
controller uid, deleting the parent deletes the family, and under the shipped admission
policies a child made by the operator's identity records it as creator and acts for the
parent's creator.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import agent as a
from agentrun.api import models as m
from agentrun.core import subagents as sa
from agentrun.core import turns
from agentrun.core.turn_steps import child_agent
from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support import child_proofs
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.agents import RESTART, SEARCH, agent_run
from tests.support.cluster import StartOperator, bind_role, mint_user, user_subject
from tests.support.paths import MANIFESTS
from tests.support.plugin import LLM_COMMAND, kubectl_agentrun, ok
from tests.support.runs import Run, create, get, gone, status_of
from tests.support.waiting import wait_events, wait_phase, wait_step_phase

pytestmark = pytest.mark.usefixtures("crd_installed")

TOOL = sa.SubAgentTool(
    agent=a.Agent.model_validate(
        {
            "model": {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"},
            "instructions": "You look things up.",
        }
    ),
    preamble="Answer in one line.",
    max_tokens=5000,
)


RESEARCHER: dict[str, Any] = {
    "name": "researcher",
    "description": "Hands one question to a researcher, who answers it.",
    "parameters": {
        "type": "object",
        "properties": {"goal": {"type": "string"}},
        "required": ["goal"],
    },
    "agent": {
        "instructions": "You research one question, then answer in one line.",
        "preamble": "Answer in one line.",
        "tools": ["search"],
        "maxTurns": 3,
        "maxTokens": 8000,
    },
}


@pytest.fixture
def loop_operator(cluster: TestCluster, start_operator: StartOperator) -> OperatorProcess:
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    return start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})


def _children(kube: KubeClients, namespace: str, parent: Run) -> list[Run]:
    uid = parent["metadata"]["uid"]
    found = kube.custom.list_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, label_selector=f"{sa.LABEL_PARENT_UID}={uid}"
    )["items"]
    return list(found)


def test_a_sub_agent_call_runs_a_child_whose_answer_is_the_result_and_tokens_count(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    """alice creates the run (the admission records her); the operator makes the child, which
    the admission records as the operator's, and whose steps act for alice."""
    model.add(
        reply("", [tool_call("researcher", {"goal": "why is the cache cold?"}, "r1")]),
        reply("The cache was flushed at 9:00."),  # the child's only turn
        reply("Checkout is slow because the cache was flushed at 9:00."),
    )
    to = cluster.kubeconfig.with_name(f"{namespace}-alice.kubeconfig")
    alice = mint_user(cluster, "alice", [], to)
    rules = [{"apiGroups": [m.GROUP], "resources": [m.PLURAL],
              "verbs": ["create", "get", "list", "watch"]}]  # fmt: skip
    bind_role(kube, namespace, "alice-runs", rules, [user_subject("alice")])
    body = agent_run("lead", model, tools=[SEARCH, RESEARCHER], budget={"maxTokens": 100000})
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body),
                               kubeconfig=alice, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        run = wait_phase(kube, namespace, "lead", "Succeeded", timeout=180)
    status = status_of(run)
    assert status["agent"]["answer"] == "Checkout is slow because the cache was flushed at 9:00."
    (child,) = _children(kube, namespace, run)
    owner = child["metadata"]["ownerReferences"][0]
    assert (owner["uid"], owner["controller"]) == (run["metadata"]["uid"], True)
    assert child["spec"]["goal"] == "Answer in one line.\n\nwhy is the cache cold?"
    assert child["spec"]["budget"]["maxTokens"] == 8000
    assert status_of(child)["phase"] == "Succeeded"
    assert status_of(child)["agent"]["answer"] == "The cache was flushed at 9:00."
    # The child's answer was the call's result, and its tokens count for the parent.
    _, second, third = model.completions()
    assert second.messages[-1]["content"] == "Answer in one line.\n\nwhy is the cache cold?"
    assert third.tool_answers["r1"] == "The cache was flushed at 9:00."
    child_tokens = status_of(child)["usage"]["tokens"]
    assert child_tokens > 0
    own = sum(t["tokens"] for t in status["agent"]["recent"])
    assert status["usage"]["tokens"] == own + child_tokens
    # One child for one call, and the family as kubectl agentrun tree shows it.
    launches = [t for t in status["history"] if t.get("reason") == "Launching"]
    assert [t["step"] for t in launches].count("t1-0-researcher") == 1
    tree = kubectl_agentrun(cluster, "tree", "lead", "-n", namespace)
    assert tree.returncode == 0, tree.stderr
    assert child["metadata"]["name"] in tree.stdout
    assert model.refused == [], "the operator sent a request a real server refuses"


def test_cancelling_the_parent_cancels_the_child_that_waits_for_an_approval(
    kube: KubeClients, namespace: str, loop_operator: OperatorProcess, model: ScriptedModel
) -> None:
    gated_child = {**RESEARCHER, "agent": {**RESEARCHER["agent"], "tools": ["restart"]}}
    model.add(
        reply("", [tool_call("researcher", {"goal": "restart checkout"}, "r1")]),
        reply("", [tool_call("restart", {"service": "checkout"}, "c1")]),  # the child's
    )
    body = agent_run(
        "lead", model, tools=[SEARCH, RESTART, gated_child], budget={"maxTokens": 100000}
    )
    create(kube, namespace, body)

    def waiting_child() -> Run | None:
        found = _children(kube, namespace, get(kube, namespace, "lead"))
        phases = [status_of(c).get("phase") for c in found]
        return found[0] if phases == ["WaitingForApproval"] else None

    child = wait_for("the child to wait for an approval", waiting_child, timeout=120)
    kube.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "lead", {"spec": {"cancel": True}}
    )
    wait_phase(kube, namespace, "lead", "Cancelled")
    cancelled = wait_phase(kube, namespace, child["metadata"]["name"], "Cancelled")
    assert cancelled["spec"]["cancel"] is True
    assert len(model.completions()) == 2  # nothing ran after the cancel


def _parent(name: str) -> Run:
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {"name": name},
        "spec": {
            "goal": "find out why checkout is slow",
            "budget": {"maxTokens": 20000},
            "policy": {"approvalRequiredFor": ["write"]},
            "agent": {"model": {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"}},
        },
    }


def _child_of(stored: Run, call: str, goal: str, tokens: int, depth: int = 0) -> dict[str, Any]:
    parent = m.AgentRun.model_validate(stored)
    h = sa.call_args_hash(TOOL, {"goal": goal})
    key = f"{parent.metadata.uid}:1:{call}:{h}"
    text = sa.goal_of(TOOL, {"goal": goal})
    assert text is not None
    return sa.child_manifest(parent, depth, key, TOOL, text, tokens)


def test_a_child_as_stored_is_adopted_and_a_second_create_meets_already_exists(
    kube: KubeClients, namespace: str
) -> None:
    parent = create(kube, namespace, _parent("digest-parent"))
    manifest = _child_of(parent, "c1", "find the slow query", 4000)
    created = create(kube, namespace, manifest)
    # The API server fills in the CRD's defaults; adoption compares without them.
    stored = get(kube, namespace, manifest["metadata"]["name"])
    assert stored["spec"] != manifest["spec"]
    found = sa.observed_run(stored)
    assert found.controller_uid == parent["metadata"]["uid"]
    expected = sa.spec_digest(manifest["spec"])
    # Unsigned, the exact object proves nothing (anyone could have made it); the operator
    # signs what it creates, and the signed spec read back verifies.
    unsigned = sa.adopt(found, parent["metadata"]["uid"], expected)
    assert isinstance(unsigned, sa.Refused) and unsigned.reason == sa.CHILD_NAME_TAKEN
    kube.custom.delete_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, manifest["metadata"]["name"]
    )
    wait_for("the unsigned child gone", lambda: gone(kube, namespace, manifest["metadata"]["name"]))
    manifest = child_proofs.sign(manifest, parent["metadata"]["uid"])
    created = create(kube, namespace, manifest)
    stored = get(kube, namespace, manifest["metadata"]["name"])
    assert child_proofs.proven(stored, parent["metadata"]["uid"])
    found = dataclasses.replace(sa.observed_run(stored), proven=True)
    assert sa.adopt(found, parent["metadata"]["uid"], expected) == sa.Adopted(
        created["metadata"]["uid"]
    )
    # The create repeated after a crash names the same object: never a second child.
    with pytest.raises(ApiException) as again:
        create(kube, namespace, manifest)
    assert again.value.status == 409
    # Another parent's view of that object refuses it.
    other = create(kube, namespace, _parent("digest-other"))
    refused = sa.adopt(found, other["metadata"]["uid"], expected)
    assert isinstance(refused, sa.Refused) and refused.reason == sa.CHILD_NAME_TAKEN


def test_tree_shows_the_family_and_deleting_the_parent_deletes_it(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    parent = create(kube, namespace, _parent("family"))
    first = create(kube, namespace, _child_of(parent, "c1", "find the slow query", 4000))
    second = create(kube, namespace, _child_of(parent, "c2", "find the slow disk", 3000))
    grandchild = create(kube, namespace, _child_of(first, "g1", "read the plan", 1000, depth=1))
    stranger = _parent("stranger")
    stranger["metadata"]["labels"] = {sa.LABEL_PARENT_UID: parent["metadata"]["uid"]}
    create(kube, namespace, stranger)  # a label claims it; no ownerReference does

    out = ok(kubectl_agentrun(cluster, "-n", namespace, "tree", "family")).splitlines()
    assert out[0].split() == ["RUN", "PHASE", "TOKENS", "(WITH", "SUB-AGENTS)"]
    rows = [(line.split(), len(line) - len(line.lstrip())) for line in out[1:]]
    first_name, second_name = first["metadata"]["name"], second["metadata"]["name"]
    expected = [(["family", "Pending", "0"], 0)]
    for kid in sorted([first_name, second_name]):  # children by name, each with its own
        expected.append(([kid, "Pending", "0"], 2))
        if kid == first_name:
            expected.append(([grandchild["metadata"]["name"], "Pending", "0"], 4))
    assert rows == expected  # the stranger, with only a label, is not there

    kube.custom.delete_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL, "family")
    family = [first, second, grandchild]
    wait_for(
        "the garbage collector to delete the parent's children and grandchildren",
        lambda: all(gone(kube, namespace, r["metadata"]["name"]) for r in family),
        timeout=120,
    )
    assert not gone(kube, namespace, "stranger")


def test_a_child_made_by_the_operators_identity_acts_for_the_parents_creator(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """Under the shipped admission policies: alice creates the parent; a user with the rights
    the operator has on runs creates the child as the operator will. The admission records
    that user as the child's creator (and lets the ownerReference, the call and depth
    annotations and the copied policy through); the child acts for alice."""
    operator_user = "agentrun-operator-like"
    users: dict[str, Path] = {}
    rules = {
        "alice": [
            {"apiGroups": [m.GROUP], "resources": [m.PLURAL], "verbs": ["create", "get"]},
        ],
        operator_user: [
            {"apiGroups": [m.GROUP], "resources": [m.PLURAL], "verbs": ["create", "get"]},
            {"apiGroups": [m.GROUP], "resources": [f"{m.PLURAL}/finalizers"], "verbs": ["update"]},
        ],
    }
    for user, granted in rules.items():
        to = cluster.kubeconfig.with_name(f"{namespace}-{user}.kubeconfig")
        users[user] = mint_user(cluster, user, [], to)
        bind_role(kube, namespace, f"{user}-runs", granted, [user_subject(user)])

    def create_as(user: str, body: dict[str, Any]) -> Run:
        proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body),
                               kubeconfig=users[user], check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return get(kube, namespace, body["metadata"]["name"])

    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        parent = create_as("alice", _parent("alices"))
        assert parent["metadata"]["annotations"][m.ANNOTATION_CREATED_BY] == "alice"
        made = _child_of(parent, "c1", "find the slow query", 4000)
        child = create_as(operator_user, child_proofs.sign(made, parent["metadata"]["uid"]))
    annotations = child["metadata"]["annotations"]
    assert annotations[m.ANNOTATION_CREATED_BY] == operator_user
    assert annotations[sa.ANNOTATION_DEPTH] == "1"
    proven = child_proofs.proven
    acting = sa.acting_creator([child, parent], operator_user, sa.Limits(), proven)
    assert isinstance(acting, sa.ActingFor), acting
    assert (acting.user, acting.depth) == ("alice", 1)
    # Without the operator's proof (made by its identity, not with its key): nobody's.
    annotations_unsigned = {k: v for k, v in annotations.items() if k != "agentrun.dev/proof"}
    unsigned = {**child, "metadata": {**child["metadata"], "annotations": annotations_unsigned}}
    refused = sa.acting_creator([unsigned, parent], operator_user, sa.Limits(), proven)
    assert isinstance(refused, sa.Refused), refused
    # Read by another operator identity, the same child is a user's run of its own.
    other = sa.acting_creator([child, parent], "someone-else", sa.Limits(), proven)
    assert other == sa.ActingFor(operator_user, annotations.get(m.ANNOTATION_CREATED_BY_GROUPS),
                                 (child["metadata"]["name"],))  # fmt: skip


def _agentrun_edit(cluster: TestCluster, kube: KubeClients, namespace: str, user: str) -> Path:
    """A kubeconfig of ``user``, who holds only manifests/user-roles.yaml's agentrun-edit."""
    for doc in yaml.safe_load_all((MANIFESTS / "user-roles.yaml").read_text()):
        if doc and doc["metadata"]["name"] == "agentrun-edit":
            bind_role(kube, namespace, f"{user}-edit", doc["rules"], [user_subject(user)])
            return mint_user(cluster, user, [], cluster.kubeconfig.with_name(f"{namespace}-{user}"))
    raise AssertionError("manifests/user-roles.yaml has no agentrun-edit")


def _mimic_child(parent: Run, step_name: str) -> dict[str, Any]:
    """The exact child the operator would make for the call ``step_name`` of ``parent``,
    computed as an attacker can: from the parent's spec and status (the call's idempotency
    key, its arguments and the budget carved for it) and the code's own naming."""
    run = m.AgentRun.model_validate(parent)
    assert run.status is not None and run.status.agent is not None and run.spec.agent is not None
    st = next(x for x in run.status.steps or [] if x.name == step_name)
    call = next(c for c in run.status.agent.calls or [] if c.step == step_name)
    tool = next(t for t in run.spec.agent.tools or [] if t.name == call.tool)
    assert tool.agent is not None and call.child is not None and st.args_hash
    key = turns.idempotency_key(run, run.status.agent, step_name, st.args_hash)
    assert key is not None
    declared = sa.SubAgentTool(
        agent=child_agent(run.spec.agent, run.status.agent, tool),
        preamble=tool.agent.preamble,
        max_tokens=tool.agent.max_tokens,
    )
    goal = sa.goal_of(declared, json.loads(call.arguments or "{}"))
    assert goal is not None
    return sa.child_manifest(run, 0, key, declared, goal, call.child.tokens)


def test_a_child_made_under_a_gated_calls_name_before_its_approval_is_never_adopted(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    loop_operator: OperatorProcess,
    model: ScriptedModel,
) -> None:
    """The mimic of a sub-agent's child: while a gated call waits for its approval, mallory
    (agentrun-edit only) creates the exact AgentRun the operator would make for it (its name
    from the call's key, its spec, the parent as controller). Her run is hers and runs as
    hers; the parent never adopts it: once approved, the call fails ChildNameTaken, and her
    child's answer is never the call's result."""
    gated = {**RESEARCHER, "approval": "required"}
    model.add(
        reply("", [tool_call("researcher", {"goal": "why is the cache cold?"}, "r1")]),
        reply("FORGED ANSWER: the cache is fine, ship it"),  # the forged child's own turn
        reply("done without the researcher"),
    )
    mallory = _agentrun_edit(cluster, kube, namespace, "mallory")
    create(kube, namespace, agent_run("lead", model, tools=[SEARCH, gated],
                                      budget={"maxTokens": 100000}))  # fmt: skip
    step_name = "t1-0-researcher"
    parent = wait_step_phase(kube, namespace, "lead", step_name, "WaitingForApproval")
    forged = _mimic_child(parent, step_name)
    proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(forged),
                           kubeconfig=mallory, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    name = forged["metadata"]["name"]
    ran = wait_phase(kube, namespace, name, "Succeeded", timeout=120)  # hers: it runs as hers
    assert status_of(ran)["agent"]["answer"].startswith("FORGED ANSWER")

    shown = next(x for x in status_of(parent)["steps"] if x["name"] == step_name)["argsHash"]
    approval = {"step": step_name, "decision": "approve", "argsHash": shown, "by": "admin"}
    kube.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, namespace, m.PLURAL, "lead", {"spec": {"approvals": [approval]}}
    )
    run = wait_phase(kube, namespace, "lead", "Succeeded", timeout=120)
    status = status_of(run)
    failed = [h for h in status["history"] if h.get("step") == step_name and h["to"] == "Failed"]
    assert [h["reason"] for h in failed] == [sa.CHILD_NAME_TAKEN], status["history"]
    assert "not created by the operator" in failed[0]["message"], failed
    started = [h for h in status["history"] if h.get("reason") == "SubAgentStarted"]
    assert not started, started  # never adopted
    assert "FORGED" not in json.dumps(status), "the forged child's answer reached the parent"
    assert status["agent"]["answer"] == "done without the researcher"
    third = model.completions()[2]
    assert "FORGED" not in json.dumps(third.messages)
    assert sa.CHILD_NAME_TAKEN in third.tool_answers["r1"]
    wait_events(kube, namespace, "lead", sa.CHILD_NAME_TAKEN)
    # Left alone: still hers, as she made it.
    assert get(kube, namespace, name)["metadata"]["uid"] == ran["metadata"]["uid"]
