"""agentrun.clients.typed.AgentRunClient against the real API server, without an operator.

The operator's part is played by the pure core (:class:`tests.support.sim.Sim`, the same
``reconcile`` the operator runs) on the run the client created: its status is written through
the status subresource as the operator would, result ConfigMaps and audit record chunks are
created as the operator creates them. So the argsHash a decision must name is the one the core
computed, and the core itself judges whether the client's decision counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from agentrun.access import audit
from agentrun.api import models as m
from agentrun.clients.typed import (
    FIELD_MANAGER,
    AgentRunClient,
    AgentRunError,
    DecisionError,
    RunNotFound,
    WaitTimeout,
)
from agentrun.core import naming
from agentrun.execution import objects
from agentrun.kubeapi import tolerate
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support import agent_sim
from tests.support.sim import Sim

pytestmark = pytest.mark.usefixtures("crd_installed")

IMAGE = "busybox:1.36"
BIG = "x" * (m.MAX_INLINE_RESULT + 100)
"""A result too large for status: the core keeps it in a ConfigMap."""


@pytest.fixture
def runs(kube: KubeClients, namespace: str) -> Iterator[AgentRunClient]:
    client = AgentRunClient(kube.api_client, namespace=namespace, poll_interval=0.2)
    yield client
    client.close()  # not its own connection: leaves the session's client open


def container(script: str) -> m.ContainerAction:
    return m.ContainerAction(image=IMAGE, command=["sh", "-c", script])


def gated_run(name: str) -> m.AgentRun:
    """check -> deploy, where deploy (risk external) waits for a person."""
    return m.AgentRun(
        metadata=m.ObjectMeta(name=name, labels={"team": "payments"}),
        spec=m.AgentRunSpec(
            goal="restart checkout if its health check keeps failing",
            policy=m.Policy(approval_required_for=[m.Risk.EXTERNAL]),
            plan=m.Plan(
                steps=[
                    m.Step(name="check", container=container("echo check")),
                    m.Step(
                        name="deploy",
                        depends_on=["check"],
                        risk=m.Risk.EXTERNAL,
                        container=container("echo deploy"),
                    ),
                ]
            ),
        ),
    )


class Operator:
    """The core driving one stored run; what it commits is written to the API server."""

    def __init__(self, cluster: TestCluster, kube: KubeClients, runs: AgentRunClient) -> None:
        self.cluster, self.kube, self.runs = cluster, kube, runs
        self.sim: Sim | None = None

    def drive(self, name: str, until: Callable[[Sim], bool], outcome: Callable[[str], str]) -> Sim:
        """Reconcile the stored run (finishing each step's Job with ``outcome(step)``) until
        ``until(sim)``, then write the status and the objects the operator would write."""
        stored = self.runs.get(name)
        if self.sim is None:
            self.sim = Sim(stored)
        else:  # the spec as stored now (decisions added), the status as last committed
            self.sim.run = stored.model_copy(update={"status": self.sim.run.status})
        sim = self.sim
        for _ in range(20):
            sim.tick()
            if until(sim):
                break
            for job in sim.active():
                sim.finish(job.name, True, outcome(job.step))
        else:
            raise AssertionError(f"the core never got there: {sim.status.phase}")
        self.write(sim)
        return sim

    def write(self, sim: Sim) -> None:
        ns, run = self.runs.namespace, sim.run
        for cm_name, data in sim.results.items():
            with tolerate(409):  # written by an earlier pass already
                self.kube.core.create_namespaced_config_map(
                    ns, {"metadata": {"name": cm_name}, "data": data}
                )
        self.cluster.kubectl(
            "-n", ns, "patch", "agentrun", run.metadata.name, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": sim.status.to_wire()}),
        )  # fmt: skip

    def write_audit_record(self, sim: Sim, upto: int) -> None:
        """The audit record of the first ``upto`` transitions, as the operator writes it."""
        run = sim.run
        entries = audit.extend(
            [t for t in sim.status.history or [] if t.seq <= upto],
            0,
            audit.genesis(run.metadata.uid),
        )
        prefix = audit.record_prefix(run.metadata.name, run.metadata.uid)
        data = {audit.key(int(e["seq"])): naming.canonical_json(e) for e in entries}
        body = objects.audit_config_map(objects.RunRef.of(run), audit.chunk_name(prefix, 1), data)
        self.kube.core.create_namespaced_config_map(self.runs.namespace, body)


@pytest.fixture
def operator(cluster: TestCluster, kube: KubeClients, runs: AgentRunClient) -> Operator:
    return Operator(cluster, kube, runs)


def phase(run: m.AgentRun) -> m.RunPhase | None:
    return run.status.phase if run.status else None


def waiting_for_approval(sim: Sim) -> bool:
    return sim.status.phase == m.RunPhase.WAITING_FOR_APPROVAL


def stored_approvals(kube: KubeClients, namespace: str, name: str) -> list[dict[str, object]]:
    body = kube.custom.get_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL, name)
    approvals: list[dict[str, object]] = body["spec"].get("approvals") or []
    return approvals


# -- create and get -------------------------------------------------------------------------


def test_create_from_models_and_get(runs: AgentRunClient, kube: KubeClients) -> None:
    created = runs.create(gated_run("from-model"))
    assert created.metadata.uid
    assert created.metadata.namespace == runs.namespace
    assert created.metadata.labels == {"team": "payments"}
    assert [s.name for s in created.spec.plan.steps] == ["check", "deploy"]
    assert created.status is None  # no operator here

    fetched = runs.get("from-model")
    assert fetched.metadata.uid == created.metadata.uid
    assert fetched.spec == created.spec
    raw = kube.custom.get_namespaced_custom_object(
        m.GROUP, m.VERSION, runs.namespace, m.PLURAL, "from-model"
    )
    assert [f["manager"] for f in raw["metadata"]["managedFields"]] == [FIELD_MANAGER]

    # From a spec alone, with a generated name.
    spec_only = runs.create(gated_run("unused").spec, generate_name="from-spec-")
    assert spec_only.metadata.name.startswith("from-spec-")
    assert runs.get(spec_only.metadata.name).spec == created.spec

    with pytest.raises(AgentRunError, match="already exists") as exists:
        runs.create(gated_run("from-model"))
    assert exists.value.status == 409
    with pytest.raises(
        RunNotFound, match=f"agentrun 'nope' not found in namespace '{runs.namespace}'"
    ):
        runs.get("nope")
    with pytest.raises(AgentRunError, match="needs a name or a generate_name"):
        runs.create(gated_run("x").spec)
    elsewhere = gated_run("elsewhere")
    elsewhere.metadata.namespace = "kube-system"
    with pytest.raises(AgentRunError, match="names namespace 'kube-system'"):
        runs.create(elsewhere)


# -- approve and reject -------------------------------------------------------------------


def test_approve_appends_a_decision_on_the_args_hash_that_the_core_accepts(
    runs: AgentRunClient, kube: KubeClients, operator: Operator
) -> None:
    runs.create(gated_run("approve-me"))
    sim = operator.drive("approve-me", waiting_for_approval, lambda step: f"{step} done")
    args_hash = sim.step_status("deploy").args_hash
    assert args_hash

    entry = runs.approve("approve-me", "deploy", reason="dashboard checked")
    assert (entry.step, entry.decision, entry.args_hash) == ("deploy", "approve", args_hash)
    assert entry.by == runs.whoami()
    assert entry.reason == "dashboard checked"
    stored = stored_approvals(kube, runs.namespace, "approve-me")
    assert stored == [entry.to_wire()]
    # Approving again records nothing new.
    assert runs.approve("approve-me", "deploy") == entry
    assert len(stored_approvals(kube, runs.namespace, "approve-me")) == 1

    # The core counts the decision: the step launches, and says who approved it.
    sim = operator.drive(
        "approve-me",
        lambda s: s.status.phase == m.RunPhase.SUCCEEDED,
        lambda step: f"{step} done",
    )
    assert sim.step_status("deploy").decided_by == runs.whoami()
    assert phase(runs.wait("approve-me", timeout=10)) == m.RunPhase.SUCCEEDED

    # A finished run takes no more decisions, unless forced.
    with pytest.raises(DecisionError, match=r"has already finished \(Succeeded\).*force=True"):
        runs.reject("approve-me", "deploy", "too late")
    forced = runs.reject("approve-me", "deploy", "too late", force=True)
    assert forced.decision == m.ApprovalDecision.REJECT
    assert len(stored_approvals(kube, runs.namespace, "approve-me")) == 2


def test_reject_needs_a_reason_and_names_the_args_hash(
    runs: AgentRunClient, kube: KubeClients, operator: Operator
) -> None:
    runs.create(gated_run("reject-me"))
    with pytest.raises(DecisionError, match="step 'deploy' of agentrun/reject-me has no argsHash"):
        runs.approve("reject-me", "deploy")  # the operator has not looked at it yet
    sim = operator.drive("reject-me", waiting_for_approval, lambda step: f"{step} done")
    with pytest.raises(DecisionError, match="needs a reason"):
        runs.reject("reject-me", "deploy", " ")
    with pytest.raises(DecisionError, match=r"step 'check' is not waiting for approval"):
        runs.approve("reject-me", "check")
    with pytest.raises(DecisionError, match=r"step 'nope' is not a step of agentrun/reject-me"):
        runs.approve("reject-me", "nope")
    with pytest.raises(RunNotFound):
        runs.approve("ghost", "deploy")

    entry = runs.reject("reject-me", "deploy", "not during the sale")
    assert entry.decision == m.ApprovalDecision.REJECT
    assert entry.args_hash == sim.step_status("deploy").args_hash
    assert stored_approvals(kube, runs.namespace, "reject-me") == [entry.to_wire()]
    sim = operator.drive(
        "reject-me", lambda s: s.status.phase in m.TERMINAL_RUN_PHASES, lambda step: "unused"
    )
    assert sim.status.phase == m.RunPhase.FAILED
    assert "not during the sale" in (sim.status.message or "")


# -- wait -----------------------------------------------------------------------------------


def test_wait_times_out_naming_the_phase_and_conditions(
    runs: AgentRunClient, operator: Operator
) -> None:
    runs.create(gated_run("stuck"))
    with pytest.raises(WaitTimeout) as no_status:
        runs.wait("stuck", timeout=0.5)
    assert "no status yet" in str(no_status.value)
    assert "is the operator running" in str(no_status.value)

    operator.drive("stuck", waiting_for_approval, lambda step: f"{step} done")
    with pytest.raises(TimeoutError) as caught:
        runs.wait("stuck", timeout=1)
    message = str(caught.value)
    assert message.startswith(
        f"timed out after 1s waiting for agentrun/stuck in namespace '{runs.namespace}' to "
        "reach Cancelled, Failed, Succeeded: phase WaitingForApproval"
    ), message
    assert "Succeeded=Unknown" in message, message
    assert "ApprovalPending=True" in message, message
    assert isinstance(caught.value, WaitTimeout)
    assert {c.type for c in caught.value.conditions} >= {"Succeeded", "ApprovalPending"}

    # Waiting for the phase it is in returns at once.
    waiting = runs.wait("stuck", timeout=5, for_phase=m.RunPhase.WAITING_FOR_APPROVAL)
    assert phase(waiting) == m.RunPhase.WAITING_FOR_APPROVAL


def test_wait_for_a_phase_a_finished_run_never_reaches_fails_at_once(
    runs: AgentRunClient, operator: Operator
) -> None:
    runs.create(gated_run("done"))
    operator.drive("done", waiting_for_approval, lambda step: f"{step} done")
    runs.reject("done", "deploy", "no")
    operator.drive("done", lambda s: s.status.phase == m.RunPhase.FAILED, lambda step: "x")
    with pytest.raises(AgentRunError, match="finished without reaching Running: phase Failed"):
        runs.wait("done", timeout=30, for_phase=m.RunPhase.RUNNING)
    assert phase(runs.wait("done", timeout=5)) == m.RunPhase.FAILED


# -- results and history --------------------------------------------------------------------


def test_results_inline_and_by_reference_and_the_history(
    runs: AgentRunClient, kube: KubeClients, operator: Operator
) -> None:
    run = m.AgentRun(
        metadata=m.ObjectMeta(name="results"),
        spec=m.AgentRunSpec(
            goal="produce a small and a large result",
            plan=m.Plan(
                steps=[
                    m.Step(name="small", container=container("echo small")),
                    m.Step(name="large", depends_on=["small"], container=container("echo large")),
                ]
            ),
        ),
    )
    runs.create(run)
    with pytest.raises(AgentRunError, match="step 'small' of agentrun/results has no result"):
        runs.result("results", "small")
    outcomes = {
        "small": json.dumps({"ok": True, "summary": "small", "result": "42"}),
        "large": json.dumps({"ok": True, "summary": "large", "result": BIG}),
    }
    sim = operator.drive(
        "results", lambda s: s.status.phase == m.RunPhase.SUCCEEDED, lambda step: outcomes[step]
    )
    ref = sim.step_status("large").result_ref
    assert ref is not None and sim.step_status("small").result is not None

    assert phase(runs.wait("results", timeout=5)) == m.RunPhase.SUCCEEDED
    assert runs.result("results", "small") == sim.step_status("small").result
    assert runs.result("results", "large") == BIG
    with pytest.raises(AgentRunError, match="step 'nope' is not a step of agentrun/results"):
        runs.result("results", "nope")

    # The history: the audit record (here its first three entries), then what only
    # status.history holds yet.
    transitions = sim.status.history or []
    assert len(transitions) > 3
    assert runs.history("results") == transitions  # no record yet: status.history alone
    operator.write_audit_record(sim, upto=3)
    assert runs.history("results") == transitions
    # status.history drops what the record holds: the whole trail still comes back.
    later = [t.to_wire() for t in transitions if t.seq > 3]
    operator.cluster.kubectl(
        "-n", runs.namespace, "patch", "agentrun", "results", "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"history": later}}),
    )  # fmt: skip
    assert len((runs.get("results").status or m.AgentRunStatus()).history or []) == len(later)
    assert runs.history("results") == transitions

    # A result changed after the step committed it is refused.
    kube.core.patch_namespaced_config_map(ref.name, runs.namespace, {"data": {ref.key: "forged"}})
    with pytest.raises(AgentRunError, match="does not match the digest"):
        runs.result("results", "large")


# -- forks --------------------------------------------------------------------------------------


def test_fork_from_a_step_carries_earlier_results_and_a_dry_run_makes_nothing(
    runs: AgentRunClient, kube: KubeClients, operator: Operator
) -> None:
    run = m.AgentRun(
        metadata=m.ObjectMeta(name="pipeline"),
        spec=m.AgentRunSpec(
            goal="gather, then report",
            plan=m.Plan(
                steps=[
                    m.Step(name="gather", container=container("echo gather")),
                    m.Step(name="report", depends_on=["gather"], container=container("echo r")),
                ]
            ),
        ),
    )
    runs.create(run)
    outcome = json.dumps({"ok": True, "summary": "gathered", "result": BIG})
    sim = operator.drive("pipeline", lambda s: s.status.phase == m.RunPhase.SUCCEEDED,
                         lambda step: outcome)  # fmt: skip
    ref = sim.step_status("gather").result_ref
    assert ref is not None

    shown = runs.fork("pipeline", "report", new_name="pipeline-again", dry_run=True)
    assert shown.spec.carried_results is not None
    assert [c.step for c in shown.spec.carried_results] == ["gather"]
    with pytest.raises(RunNotFound):
        runs.get("pipeline-again")

    made = runs.fork("pipeline", "report", new_name="pipeline-again")
    assert made.metadata.name == "pipeline-again" and not made.spec.suspend
    (carried,) = made.spec.carried_results or []
    assert carried.from_run == f"{runs.namespace}/pipeline"
    assert carried.result_ref is not None and carried.result_ref.name != ref.name
    copy = kube.core.read_namespaced_config_map(carried.result_ref.name, runs.namespace)
    assert copy.data[carried.result_ref.key] == BIG
    assert copy.metadata.owner_references[0].uid == made.metadata.uid
    assert copy.metadata.managed_fields[0].manager == FIELD_MANAGER
    with pytest.raises(AgentRunError, match=r"already exists .*; choose another new_name"):
        runs.fork("pipeline", "report", new_name="pipeline-again")
    with pytest.raises(AgentRunError, match="step 'nope' is not a step of agentrun/pipeline"):
        runs.fork("pipeline", "nope")


def test_fork_from_a_turn_names_the_run_its_uid_and_the_turn(
    cluster: TestCluster, runs: AgentRunClient
) -> None:
    spec = agent_sim.agent_run(name="talk").spec
    created = runs.create(spec, name="talk")
    source = agent_sim.AgentSim(created.model_copy(update={"status": None}))
    source.answer("", [agent_sim.call("search", {"query": "x"}, "c1")])
    source.tools_return()
    cluster.kubectl(
        "-n", runs.namespace, "patch", "agentrun", "talk", "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": source.status.to_wire()}),
    )  # fmt: skip

    made = runs.fork("talk", 1, new_name="talk-again")
    agent = made.spec.agent
    assert agent is not None and agent.resume_from is not None
    assert (agent.resume_from.run, agent.resume_from.uid, agent.resume_from.turn) == (
        "talk",
        created.metadata.uid,
        1,
    )
    assert (made.metadata.annotations or {})["agentrun.dev/forked-from"] == (
        f"{runs.namespace}/talk at turn 1"
    )
    with pytest.raises(AgentRunError, match="has not closed turn 2: its conversation goes up to"):
        runs.fork("talk", 2)
