"""A run in each phase, as the pure core leaves it, and what status tools should read from it.

Each :data:`PHASES` entry drives a run with the core simulator (:mod:`tests.support.sim`) to
one phase; :data:`EXPECTED` says which conditions the core sets there and what kstatus
(sigs.k8s.io/cli-utils/pkg/kstatus, the library behind Flux and Helm 4's ``--wait``) and the
Argo CD health check of docs/gitops.md make of it. tests/unit/test_conditions.py checks the
conditions in memory; tests/integration/test_kstatus.py drives the same runs against the API
server (:class:`ClusterLedger`: the core's output written through the status subresource) and
runs kstatus itself on what the API server returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrun.api import models as m
from agentrun_devcluster.testing import KubeClients

from .agent_sim import AgentSim, agent_run, call
from .sim import Sim, make_run, step

SimFactory = Callable[[m.AgentRun], Sim]
"""Makes the simulator of a run: a plain :class:`Sim`, or one backed by the API server."""
AgentSimFactory = Callable[[m.AgentRun], AgentSim]


@dataclass(frozen=True)
class Expected:
    """The conditions of a run in one phase, and how tools read it."""

    phase: m.RunPhase
    ready: str
    reconciling: str
    stalled: str
    kstatus: str
    """kstatus's Compute: Current, InProgress or Failed."""
    argocd: str
    """The health the Argo CD check in docs/gitops.md returns."""


EXPECTED: dict[str, Expected] = {
    "running": Expected(m.RunPhase.RUNNING, "False", "True", "False", "InProgress", "Progressing"),
    "waiting-for-approval": Expected(
        m.RunPhase.WAITING_FOR_APPROVAL, "False", "True", "False", "InProgress", "Suspended"
    ),
    "suspended": Expected(
        m.RunPhase.SUSPENDED, "False", "False", "False", "InProgress", "Suspended"
    ),
    "budget-paused": Expected(m.RunPhase.SUSPENDED, "False", "False", "True", "Failed", "Degraded"),
    "succeeded": Expected(m.RunPhase.SUCCEEDED, "True", "False", "False", "Current", "Healthy"),
    "failed": Expected(m.RunPhase.FAILED, "False", "False", "True", "Failed", "Degraded"),
    "cancelled": Expected(m.RunPhase.CANCELLED, "False", "False", "True", "Failed", "Degraded"),
}


def running(new: SimFactory) -> Sim:
    sim = new(make_run([step("a"), step("b", "a")], name="running"))
    sim.tick()
    sim.tick()
    return sim


def waiting_for_approval(new: SimFactory) -> Sim:
    sim = new(make_run([step("deploy", approval="required")], name="waiting-for-approval"))
    sim.tick()
    return sim


def suspended(new: SimFactory) -> Sim:
    sim = new(make_run([step("a")], name="suspended", suspend=True))
    sim.tick()
    return sim


def budget_paused(new: AgentSimFactory) -> Sim:
    """An agent run whose token budget ran out before its next turn: the loop pauses it."""
    sim = new(agent_run(name="budget-paused", spec={"budget": {"maxTokens": 2000}}))
    sim.answer("", [call("search", {"query": "x"}, "c")], prompt=800, completion=200)
    sim.tools_return()
    return sim


def succeeded(new: SimFactory) -> Sim:
    sim = new(make_run([step("a"), step("b", "a")], name="succeeded"))
    sim.run_to_end()
    return sim


def failed(new: SimFactory) -> Sim:
    sim = new(make_run([step("a")], name="failed"))
    sim.run_to_end(lambda job: (False, "exit 1"))
    return sim


def cancelled(new: SimFactory) -> Sim:
    sim = new(make_run([step("a")], name="cancelled"))
    sim.tick()
    sim.spec_update(cancel=True)
    sim.tick()
    return sim


PHASES: dict[str, Callable[[SimFactory, AgentSimFactory], Sim]] = {
    "running": lambda new, _: running(new),
    "waiting-for-approval": lambda new, _: waiting_for_approval(new),
    "suspended": lambda new, _: suspended(new),
    "budget-paused": lambda _, new_agent: budget_paused(new_agent),
    "succeeded": lambda new, _: succeeded(new),
    "failed": lambda new, _: failed(new),
    "cancelled": lambda new, _: cancelled(new),
}


def condition_status(run: m.AgentRun, ctype: str) -> str | None:
    """The status (True, False, Unknown) of condition ``ctype``, None when it is not set."""
    found = [c for c in (run.status.conditions if run.status else None) or [] if c.type == ctype]
    return str(found[0].status) if found else None


# -- the same runs, their status written to the API server ---------------------------------


class ClusterLedger:
    """Mixed into a :class:`Sim`: the run lives in the API server. Each snapshot reads it,
    each commit writes the core's status through the status subresource with the
    resourceVersion read (a conflict is a failed commit, as in the ledger), and spec updates
    are patches, so ``metadata.generation`` is the API server's."""

    kube: KubeClients
    namespace: str

    def attach(self, kube: KubeClients, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        sim: Any = self
        created = kube.custom.create_namespaced_custom_object(
            m.GROUP,
            m.VERSION,
            namespace,
            m.PLURAL,
            {
                "apiVersion": m.API_VERSION,
                "kind": m.KIND,
                "metadata": {"name": sim.run.metadata.name},
                "spec": sim.run.spec.to_wire(),
            },
        )
        self._store(created)

    def _store(self, body: dict[str, Any]) -> None:
        sim: Any = self
        sim.run = m.AgentRun.model_validate(body)
        sim.version = int(body["metadata"]["resourceVersion"])

    def read(self) -> dict[str, Any]:
        sim: Any = self
        body: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            m.GROUP, m.VERSION, self.namespace, m.PLURAL, sim.run.metadata.name
        )
        return body

    def snapshot(self) -> tuple[m.AgentRun, int]:
        body = self.read()
        self._store(body)
        sim: Any = self
        return sim.run.model_copy(deep=True), sim.version

    def commit(self, decision: Any, version: int) -> bool:
        from kubernetes.client.exceptions import ApiException

        sim: Any = self
        for action in decision.before_commit:
            sim.apply(action)
        body = self.read()
        if int(body["metadata"]["resourceVersion"]) != version:
            return False
        if not decision.status_changed(sim.run.status):
            return True
        body["status"] = decision.status.to_wire()
        try:
            stored = self.kube.custom.replace_namespaced_custom_object_status(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, sim.run.metadata.name, body
            )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        self._store(stored)
        sim.commits += 1
        return True

    def spec_update(self, **changes: Any) -> None:
        sim: Any = self
        wire = sim.run.spec.model_copy(update=changes).to_wire()
        changed = {m.AgentRunSpec.model_fields[n].alias or n for n in changes}
        patched = self.kube.custom.patch_namespaced_custom_object(
            m.GROUP,
            m.VERSION,
            self.namespace,
            m.PLURAL,
            sim.run.metadata.name,
            {"spec": {k: v for k, v in wire.items() if k in changed}},
        )
        self._store(patched)


class ClusterSim(ClusterLedger, Sim):
    """A plan run whose status the core writes to the API server."""


class ClusterAgentSim(ClusterLedger, AgentSim):
    """An agent run whose status the core writes to the API server."""
