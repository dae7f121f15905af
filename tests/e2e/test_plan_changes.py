"""A step removed from the plan while it runs is stopped: its Job is deleted pods first (the
operator's finalizer holds the Job for the deletion grace, and a Job deleted in the background
would keep its pod running as long, or to its end), its finalizer is released once the grace
has passed, and the Job goes. Added back, the step starts again as its next attempt only once
the pod of the last one has stopped: two attempts of a step never overlap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrun.settings import JOB_FINALIZER
from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.cluster import Kubectl, StartOperator, read_or_none
from tests.support.jobs import job_pods
from tests.support.runs import agentrun, create, patch_spec, step, step_status
from tests.support.waiting import wait_step_phase

GRACE = 10
"""The operator's deletion grace here: longer than a pod takes to stop."""
STOPPED_WITHIN = 6.0
"""Seconds for a removed step's pod to stop: well within the grace."""


def _long(ledger: Path) -> dict[str, Any]:
    """Two minutes of work that writes when each attempt starts and stops (on SIGTERM)."""
    script = (
        f'record() {{ echo "$1 $AGENTRUN_ATTEMPT $(date +%s.%N)" >> {ledger}; }}; '
        "record start; trap 'record stop; exit 143' TERM; sleep 120 & wait $!"
    )
    return step("long", script)


def _times(ledger: Path) -> dict[str, float]:
    """``{"start 1": t, "stop 1": t, ...}`` from the ledger."""
    found: dict[str, float] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        what, attempt, at = line.split()
        found[f"{what} {attempt}"] = float(at)
    return found


def _running(kube: KubeClients, namespace: str, job: str) -> bool:
    """Whether a pod of ``job`` still runs (its container has not terminated)."""
    for pod in job_pods(kube, namespace, job):
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            continue
        statuses = (pod.status.container_statuses if pod.status else None) or []
        if not statuses or any(not (cs.state and cs.state.terminated) for cs in statuses):
            return True
    return False


def test_a_step_removed_while_running_stops_and_its_job_goes(
    start_operator: StartOperator,
    kube: KubeClients,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    start_operator(env={"AGENTRUN_JOB_DELETION_GRACE_SECONDS": str(GRACE)})
    ledger = tmp_path / "attempts.log"
    long, stay = _long(ledger), step("stay", "sleep 120")
    create(kube, namespace, agentrun("shrinks", [long, stay]))
    run = wait_step_phase(kube, namespace, "shrinks", "long", "Running", timeout=60)
    first = step_status(run, "long")["jobName"]
    wait_for("attempt 1 to start", lambda: "start 1" in _times(ledger), timeout=30)

    patch_spec(kubectl, namespace, "shrinks", plan={"steps": [stay]})
    run = wait_step_phase(kube, namespace, "shrinks", "long", "Cancelled", timeout=30)
    assert step_status(run, "long")["message"] == "the step was removed from the plan", run
    patch_spec(kubectl, namespace, "shrinks", plan={"steps": [long, stay]})  # back at once

    wait_for(
        f"the pod of {first} to stop",
        lambda: not _running(kube, namespace, first),
        timeout=STOPPED_WITHIN,
    )
    held = read_or_none(kube.batch.read_namespaced_job, first, namespace)
    assert held is not None and held.metadata.deletion_timestamp, "deleted, yet kept a while"
    assert JOB_FINALIZER in (held.metadata.finalizers or []), held.metadata.finalizers

    wait_for("attempt 2 to start", lambda: "start 2" in _times(ledger), timeout=60)
    times = _times(ledger)
    assert "stop 1" in times, times  # stopped by SIGTERM, not run to its end
    assert times["stop 1"] <= times["start 2"], f"attempts 1 and 2 overlapped: {times}"
    second = step_status(wait_step_phase(kube, namespace, "shrinks", "long", "Running",
                                         "Launching", timeout=30), "long")  # fmt: skip
    assert second["attempt"] == 2 and second["jobName"] != first, second

    wait_for(
        f"Job {first} to go once its finalizer is released",
        lambda: read_or_none(kube.batch.read_namespaced_job, first, namespace) is None,
        timeout=GRACE + 30,
    )
