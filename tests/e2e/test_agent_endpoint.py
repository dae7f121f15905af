"""The model's API key never reaches an endpoint the run's creator did not set.

The attack: carol creates an agent run whose model's API key is a Secret she may read. While a
tool call of turn 1 runs, mallory, who may edit AgentRuns in the namespace (the rules of
``agentrun-edit``) but not read that Secret, patches ``spec.agent.model.baseURL`` to a server of
her own (a second scripted model here). Were the next turn built from the spec as it reads
then, its request would carry ``Authorization: Bearer <the key>`` to her server.

* Without the validating admission policies (only agentrun-identity, which records who created
  and who last changed the run), the patch is admitted: the operator itself fails the run at
  once, reason AgentSpecChanged naming the field, with a Warning Event, stops the running call
  and launches no further turn (docs/agent.md, "Fixed at creation").
* With the shipped policies, the API server refuses the patch (rule k), saying the field is
  fixed at creation, and the run goes on to its answer on carol's endpoint.

Either way mallory's server receives no request at all.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml

from agentrun_devcluster.modelserver import ScriptedModel, reply, tool_call
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.admission import creator_recorded, mutating_only, policies_bound_to
from tests.support.agents import agent_run, search
from tests.support.cluster import StartOperator, bind_role, mint_user, user_subject
from tests.support.paths import MANIFESTS
from tests.support.plugin import LLM_COMMAND
from tests.support.runs import Run, condition, get, status_of, step_status
from tests.support.waiting import assert_holds, wait_events, wait_phase, wait_step_phase

SECRET = "llm"
RUN = "investigate"
SLOW_SEARCH = search(
    {
        "image": "busybox:1.36",
        "command": [
            "sh",
            "-c",
            'sleep 8; echo "search got $AGENTRUN_TOOL_ARGS" > /dev/termination-log',
        ],
    }
)
"""A search that takes long enough for the patch to land while it runs."""


def edit_rules() -> list[dict[str, Any]]:
    """The rules of the agentrun-edit ClusterRole (manifests/user-roles.yaml), granted here by
    a Role of the test's namespace."""
    for doc in yaml.safe_load_all((MANIFESTS / "user-roles.yaml").read_text()):
        if doc and doc["metadata"]["name"] == "agentrun-edit":
            rules: list[dict[str, Any]] = doc["rules"]
            return rules
    raise AssertionError("manifests/user-roles.yaml has no agentrun-edit")


@dataclass
class Keyed:
    """The test's namespace: the API key's Secret, carol (may create runs and read the
    Secret), mallory (agentrun-edit's rules, nothing else), carol's endpoint and mallory's."""

    cluster: TestCluster
    kube: KubeClients
    namespace: str
    key: str
    users: dict[str, Path]
    model: ScriptedModel
    attacker: ScriptedModel
    operator: OperatorProcess

    def kubectl(self, user: str, *args: str, input: str | None = None) -> CompletedProcess[str]:
        return self.cluster.kubectl(
            "-n", self.namespace, *args, input=input, kubeconfig=self.users[user], check=False
        )

    def create(self) -> Run:
        """carol's run: turn 1 calls the slow search, turn 2 answers."""
        self.model.add(
            reply("searching", [tool_call("search", {"query": "latency"}, "c1")]),
            reply("the cache is cold"),
        )
        body = agent_run(
            RUN,
            self.model,
            tools=[SLOW_SEARCH],
            model_extra={"apiKeySecretRef": {"name": SECRET, "key": "api-key"}},
        )
        proc = self.kubectl("carol", "create", "-o", "json", "-f", "-", input=json.dumps(body))
        assert proc.returncode == 0, proc.stderr
        created: Run = json.loads(proc.stdout)
        assert (created["metadata"].get("annotations") or {}).get(
            "agentrun.dev/created-by"
        ) == "carol", "the identity policy did not record the creator"
        return created

    def redirect(self) -> CompletedProcess[str]:
        """mallory points the run's model at her server, while turn 1's call runs."""
        run = wait_step_phase(self.kube, self.namespace, RUN, "t1-0-search", "Running")
        assert status_of(run)["agent"]["stage"] == "Acting"
        patch = {"spec": {"agent": {"model": {"baseURL": self.attacker.base_url}}}}
        return self.kubectl(
            "mallory", "patch", f"agentrun/{RUN}", "--type=merge", "-p", json.dumps(patch),
            "-o", "json",
        )  # fmt: skip

    def nothing_reached_the_attacker(self, seconds: float) -> None:
        def silent() -> None:
            assert self.attacker.received() == [], "mallory's server received a request"

        assert_holds(silent, seconds=seconds)

    def key_nowhere(self) -> None:
        events = self.kube.core.list_namespaced_event(self.namespace).items
        seen = json.dumps(get(self.kube, self.namespace, RUN)) + json.dumps(
            [e.message for e in events]
        )
        assert self.key not in seen + self.operator.log_text()


@pytest.fixture
def keyed(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    start_operator: StartOperator,
    model: ScriptedModel,
) -> Iterator[Keyed]:
    if cluster.external:
        pytest.skip("model turns run `agentrun step llm` from this checkout (no step image)")
    operator = start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})
    key = f"sk-{secrets.token_hex(12)}"
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": SECRET}, "stringData": {"api-key": key}}
    )
    users: dict[str, Path] = {}
    for user in ("carol", "mallory"):
        users[user] = mint_user(
            cluster, user, [], cluster.kubeconfig.with_name(f"{namespace}-{user}.kubeconfig")
        )
    bind_role(kube, namespace, "mallory-edits-runs", edit_rules(), [user_subject("mallory")])
    carol = [
        {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"],
         "verbs": ["create", "get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
         "resourceNames": [SECRET]},
    ]  # fmt: skip
    bind_role(kube, namespace, "carol-runs-with-the-key", carol, [user_subject("carol")])
    # mallory's server answers like a model, so that a run sending it the key would go on.
    with ScriptedModel(responder=lambda body: reply("thanks for the key")) as attacker:
        keyed = Keyed(cluster, kube, namespace, key, users, model, attacker, operator)
        # mallory may edit runs, and may not read the key.
        denied = keyed.kubectl("mallory", "get", "secret", SECRET)
        assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied
        yield keyed


def test_without_the_policy_the_operator_fails_the_run_and_the_key_goes_nowhere(
    keyed: Keyed,
) -> None:
    recorded = creator_recorded(keyed.cluster, keyed.namespace, keyed.users["carol"])
    with policies_bound_to(keyed.cluster, keyed.namespace, recorded, keep=mutating_only):
        created = keyed.create()
        patched = keyed.redirect()
        assert patched.returncode == 0, f"the patch was refused: {patched.stderr}"
        after = json.loads(patched.stdout)
        assert after["spec"]["agent"]["model"]["baseURL"] == keyed.attacker.base_url
        assert after["metadata"]["annotations"]["agentrun.dev/last-modified-by"] == "mallory"

        run = wait_phase(keyed.kube, keyed.namespace, RUN, "Failed")
    status = status_of(run)
    assert condition(run)["reason"] == "AgentSpecChanged", status
    assert status["message"].startswith(
        "spec.agent.model.baseURL changed after the run started (baseURL was "
        f"{keyed.model.base_url}, now {keyed.attacker.base_url}): the model endpoint, its API "
        "key, the tools and the MCP servers are fixed at creation"
    ), status["message"]
    assert status["message"].endswith("(spec last changed by mallory)"), status["message"]
    # What the turns use stayed carol's.
    frozen = status["agent"]["frozen"]
    assert frozen["model"]["baseURL"] == keyed.model.base_url
    assert frozen["model"]["apiKeySecretRef"] == {"name": SECRET, "key": "api-key"}
    # The running call was stopped, and no second turn was ever launched.
    assert step_status(run, "t1-0-search")["phase"] == "Cancelled"
    launched = [t.get("step") for t in status["history"] if t["reason"] == "Launching"]
    assert launched == ["t1-model", "t1-0-search"], launched
    ended = status["history"][-1]
    assert (ended["reason"], ended["to"], ended.get("by")) == (
        "AgentSpecChanged",
        "Failed",
        "mallory",
    )

    warned = wait_events(keyed.kube, keyed.namespace, RUN, "AgentSpecChanged", warning=True)
    warnings = [e.message for e in warned]
    assert "spec.agent.model.baseURL" in warnings[0], warnings
    # carol's endpoint had turn 1, with her key; mallory's server nothing, ever.
    (turn,) = keyed.model.completions()
    assert turn.authorization == f"Bearer {keyed.key}"
    keyed.nothing_reached_the_attacker(seconds=6)
    assert keyed.model.completions() == [turn]
    assert created["metadata"]["uid"] == run["metadata"]["uid"]
    keyed.key_nowhere()


def test_with_the_policy_the_patch_is_refused_and_the_run_goes_on(keyed: Keyed) -> None:
    recorded = creator_recorded(keyed.cluster, keyed.namespace, keyed.users["carol"])
    with policies_bound_to(keyed.cluster, keyed.namespace, recorded):
        keyed.create()
        refused = keyed.redirect()
        assert refused.returncode != 0, f"the patch was admitted: {refused.stdout}"
        assert (
            "spec.agent.model.baseURL: cannot change after creation: the model endpoint, its API "
            "key Secret, the tools and the MCP servers decide where the run's Secrets are sent"
        ) in refused.stderr, refused.stderr
        run = wait_phase(keyed.kube, keyed.namespace, RUN, "Succeeded")
    assert status_of(run)["agent"]["answer"] == "the cache is cold"
    assert run["spec"]["agent"]["model"]["baseURL"] == keyed.model.base_url
    assert [r.authorization for r in keyed.model.completions()] == [f"Bearer {keyed.key}"] * 2
    keyed.nothing_reached_the_attacker(seconds=2)
    keyed.key_nowhere()
