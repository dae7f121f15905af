"""What status tools make of a run, computed by the tools' own code over what the API server
returns (docs/gitops.md).

Each run is driven into its phase by the pure core (:mod:`tests.support.phases`), its status
written through the status subresource of the real API server as the operator's ledger writes
it. Then ``kubectl get -o json`` of the run goes to:

* ``kstatus``: ``status.Compute`` of sigs.k8s.io/cli-utils (the library behind Flux's health
  checks and Helm 4's ``--wait``), built from hack/kstatus by ``hack/build-kstatus.sh``;
* ``argocd-health``: the Argo CD health check docs/gitops.md ships, run in gopher-lua, the Lua
  interpreter Argo CD embeds.

Both are built from pinned Go modules (a few seconds once the modules are in the Go module
cache); a build failure fails the tests, it never skips them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api import models as m
from agentrun_devcluster import binaries
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.agent_sim import AgentSim
from tests.support.paths import REPO_ROOT
from tests.support.phases import (
    EXPECTED,
    PHASES,
    ClusterAgentSim,
    ClusterSim,
    condition_status,
)
from tests.support.sim import Sim, make_run, step

GITOPS_DOC = REPO_ROOT / "docs" / "gitops.md"
HEALTH_KEY = "resource.customizations.health.agentrun.dev_AgentRun"


@pytest.fixture(scope="module")
def status_tools() -> Path:
    """The bin dir of ``kstatus`` and ``argocd-health``."""
    return binaries.kstatus_bin_dir()


@pytest.fixture(scope="module")
def health_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Lua of the Argo CD health check, as docs/gitops.md gives it."""
    blocks = re.findall(r"```yaml\n(.*?)```", GITOPS_DOC.read_text(), flags=re.S)
    found = [
        doc["data"][HEALTH_KEY]
        for doc in (yaml.safe_load(block) for block in blocks)
        if isinstance(doc, dict) and HEALTH_KEY in (doc.get("data") or {})
    ]
    assert len(found) == 1, f"docs/gitops.md should give {HEALTH_KEY} once, found {len(found)}"
    path = tmp_path_factory.mktemp("argocd") / "health.lua"
    path.write_text(found[0])
    return path


def _tool(bin_dir: Path, *args: str, stdin: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"{args[0]} failed: {proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def kstatus(bin_dir: Path, obj: str) -> dict[str, Any]:
    """kstatus's ``{status, message, conditions}`` for the object (JSON)."""
    return _tool(bin_dir, "kstatus", stdin=obj)


def argocd_health(bin_dir: Path, script: Path, obj: str) -> dict[str, Any]:
    """The ``{status, message}`` the Argo CD health check returns for the object (JSON)."""
    return _tool(bin_dir, "argocd-health", str(script), stdin=obj)


def as_stored(cluster: TestCluster, namespace: str, name: str) -> str:
    """The run as a client reads it from the API server."""
    return cluster.kubectl("-n", namespace, "get", f"agentrun/{name}", "-o", "json").stdout


def factories(
    kube: KubeClients, namespace: str
) -> tuple[Callable[[m.AgentRun], Sim], Callable[[m.AgentRun], AgentSim]]:
    def plan_run(run: m.AgentRun) -> Sim:
        sim = ClusterSim(run)
        sim.attach(kube, namespace)
        return sim

    def agent_run(run: m.AgentRun) -> AgentSim:
        sim = ClusterAgentSim(run)
        sim.attach(kube, namespace)
        return sim

    return plan_run, agent_run


@pytest.mark.parametrize("case", sorted(PHASES))
def test_tools_read_each_phase(
    case: str,
    cluster: TestCluster,
    kube: KubeClients,
    crd_installed: list[str],
    namespace: str,
    status_tools: Path,
    health_script: Path,
) -> None:
    sim = PHASES[case](*factories(kube, namespace))
    want = EXPECTED[case]
    name = sim.run.metadata.name
    stored = as_stored(cluster, namespace, name)
    run = m.AgentRun.model_validate(json.loads(stored))
    assert run.status is not None and run.status.phase == want.phase, run.status
    assert run.status.observed_generation == run.metadata.generation
    assert (
        condition_status(run, "Ready"),
        condition_status(run, "Reconciling"),
        condition_status(run, "Stalled"),
    ) == (want.ready, want.reconciling, want.stalled)

    computed = kstatus(status_tools, stored)
    assert computed["status"] == want.kstatus, computed
    if want.kstatus == "Failed":
        (stalled,) = computed["conditions"]
        assert stalled["type"] == "Stalled" and stalled["reason"], computed
        assert computed["message"] == run.status.message

    health = argocd_health(status_tools, health_script, stored)
    assert health["status"] == want.argocd, health
    assert health["message"], health


def test_a_spec_change_reads_in_progress_until_the_core_observes_it(
    cluster: TestCluster,
    kube: KubeClients,
    crd_installed: list[str],
    namespace: str,
    status_tools: Path,
    health_script: Path,
) -> None:
    sim = PHASES["succeeded"](*factories(kube, namespace))
    name = sim.run.metadata.name
    assert kstatus(status_tools, as_stored(cluster, namespace, name))["status"] == "Current"

    sim.spec_update(goal="the same run, a new goal")  # generation 2, observed 1
    stored = as_stored(cluster, namespace, name)
    computed = kstatus(status_tools, stored)
    assert computed["status"] == "InProgress", computed
    assert computed["conditions"][0]["reason"] == "LatestGenerationNotObserved", computed
    assert argocd_health(status_tools, health_script, stored)["status"] == "Progressing"

    sim.tick()  # the core's next pass records the generation it saw
    stored = as_stored(cluster, namespace, name)
    run = m.AgentRun.model_validate(json.loads(stored))
    assert run.status is not None and run.status.observed_generation == run.metadata.generation
    assert kstatus(status_tools, stored)["status"] == "Current"
    assert argocd_health(status_tools, health_script, stored)["status"] == "Healthy"


def test_a_run_without_status_yet(
    cluster: TestCluster,
    kube: KubeClients,
    crd_installed: list[str],
    namespace: str,
    status_tools: Path,
    health_script: Path,
) -> None:
    """Before the operator's first pass there is no status: kstatus reads an object without
    conditions as Current (docs/gitops.md says so and what to wait for instead); the Argo CD
    check reads it as Progressing."""
    plan_run, _ = factories(kube, namespace)
    sim = plan_run(make_run([step("a")], name="fresh"))
    stored = as_stored(cluster, namespace, sim.run.metadata.name)
    assert "status" not in json.loads(stored)
    assert kstatus(status_tools, stored)["status"] == "Current"
    assert argocd_health(status_tools, health_script, stored)["status"] == "Progressing"


def _column(header: str, name: str) -> int:
    """Where column ``name`` starts in ``header`` (a whole word: AGE is not AGENT)."""
    found = re.search(rf"(?<!\S){name}(?!\S)", header)
    assert found is not None, header
    return found.start()


def test_wide_output_shows_attempts_tokens_the_wait_and_the_reason(
    cluster: TestCluster, kube: KubeClients, crd_installed: list[str], namespace: str
) -> None:
    new_plan, new_agent = factories(kube, namespace)
    for case in ("waiting-for-approval", "failed", "budget-paused"):
        PHASES[case](new_plan, new_agent)
    out = cluster.kubectl("-n", namespace, "get", "agentruns", "-o", "wide").stdout
    header, *rows = out.splitlines()
    columns = header.split()
    assert columns == [
        "NAME",
        "PHASE",
        "PROGRESS",
        "STEP",
        "ATTEMPTS",
        "TOKENS",
        "WAITING",
        "REASON",
        "AGENT",
        "AGE",
        "MESSAGE",
    ], header
    starts = [_column(header, c) for c in columns]

    def cells(row: str) -> dict[str, str]:
        bounds = [*starts[1:], len(row) + 1]
        return {c: row[a:b].strip() for c, a, b in zip(columns, starts, bounds, strict=True)}

    table = {cells(r)["NAME"]: cells(r) for r in rows}
    waiting = table["waiting-for-approval"]
    assert waiting["ATTEMPTS"] == "0" and waiting["REASON"] == "WaitingForApproval", waiting
    assert re.fullmatch(r"\d+[smhd]\S*", waiting["WAITING"]), waiting
    failed = table["failed"]
    assert failed["ATTEMPTS"] == "1" and failed["WAITING"] == "", failed
    assert failed["REASON"] not in ("", "<none>", "Succeeded"), failed
    paused = table["budget-paused"]
    assert int(paused["TOKENS"]) >= 1000 and paused["REASON"] == "BudgetExhausted", paused
