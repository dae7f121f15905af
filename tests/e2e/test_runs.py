"""AgentRuns carried through by the real operator process against a real control plane.

Each test builds its AgentRun with :mod:`tests.support.runs` (``sh -c`` busybox steps, run as
local processes by the stand-in node, or as real containers on a real cluster) and polls with
generous timeouts. Nothing asserts on speed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.core.naming import job_name
from agentrun.settings import LABEL_RUN_UID, RUN_FINALIZER
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import (
    KubeClients,
    TestCluster,
    job_creations,
    job_deletions,
    wait_for,
)
from tests.support.cluster import Kubectl
from tests.support.jobs import job_manifest
from tests.support.runs import (
    IMAGE,
    TERMINAL,
    TIMEOUT,
    Run,
    agentrun,
    condition,
    create,
    delete,
    envelope,
    event_reasons,
    get,
    gone,
    jobs_of,
    patch_spec,
    status_of,
    step,
    step_status,
    timestamp,
)
from tests.support.waiting import (
    assert_holds,
    wait_events,
    wait_phase,
    wait_step_phase,
    wait_until,
)

# -- the audit log --------------------------------------------------------------------------


def check_jobs_created_once(cluster: TestCluster, namespace: str, expected: Iterable[str]) -> None:
    """Invariant 1 of docs/design.md where the audit log is readable: each expected Job
    created exactly once, no other Job created. (A test of its own skips on external
    clusters.)"""
    if cluster.external:
        return
    want = {name: 1 for name in expected}

    def recorded() -> Counter[str] | None:
        counts = job_creations(cluster, namespace)
        return counts if set(counts) >= set(want) else None

    counts = wait_for(f"audit records of {sorted(want)}", recorded, timeout=30)
    assert dict(counts) == want


# -- the tests ------------------------------------------------------------------------------


def test_sequential_run_succeeds_with_results_progress_history_and_events(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    name = "seq"
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step("fetch", envelope("fetched", {"n": 1}, tokens=5)),
                step("analyse", envelope("analysed", {"n": 2}), after=["fetch"]),
                step("report", "echo 'all good' > /dev/termination-log", after=["analyse"]),
            ],
        ),
    )
    uid = created["metadata"]["uid"]

    proc = cluster.kubectl(
        "-n", namespace, "wait", "--for=condition=Succeeded", f"agentrun/{name}",
        "--timeout=120s", check=False, timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr

    run = get(kube, namespace, name)
    status = status_of(run)
    assert status["phase"] == "Succeeded"
    assert status["progress"] == "3/3"
    assert condition(run)["status"] == "True"
    assert condition(run)["reason"] == "Succeeded"
    assert status.get("startedAt") and status.get("completedAt")
    assert json.loads(step_status(run, "fetch")["result"]) == {"n": 1}
    assert json.loads(step_status(run, "analyse")["result"]) == {"n": 2}
    assert step_status(run, "report")["result"] == "all good"
    assert step_status(run, "fetch")["summary"] == "fetched"
    for st in status["steps"]:
        assert st["phase"] == "Succeeded" and st["attempt"] == 1, st
        assert st["idempotencyKey"].startswith(f"{uid}:{st['name']}:{IMAGE}:")
    assert status["usage"]["tokens"] == 5
    assert status["usage"]["steps"] == 3
    assert status.get("history"), "history is empty"
    assert status["history"][-1]["to"] == "Succeeded"
    assert RUN_FINALIZER in run["metadata"].get("finalizers", [])

    # Events mark what a person acts on (here, the run's end); history has every transition.
    wait_events(kube, namespace, name, "Succeeded")
    routine = {"Launching", "Started", "StepSucceeded"}
    assert not routine & event_reasons(kube, namespace, name)
    assert {"Launching", "StepSucceeded"} <= {t["reason"] for t in status["history"]}

    check_jobs_created_once(
        cluster, namespace, (job_name(name, uid, s, 1) for s in ("fetch", "analyse", "report"))
    )


def test_parallel_branches_run_at_the_same_time_and_join_after_both(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    name = "dag"
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step("start", envelope("started")),
                step("left", f"sleep 3; {envelope('left', {'side': 'left'})}", after=["start"]),
                step("right", f"sleep 3; {envelope('right', {'side': 'right'})}", after=["start"]),
                step("join", envelope("joined"), after=["left", "right"]),
            ],
        ),
    )
    uid = created["metadata"]["uid"]
    branch_jobs = {job_name(name, uid, s, 1) for s in ("left", "right")}
    seen_together = False

    def done() -> Run | None:
        nonlocal seen_together
        if not seen_together:
            active = {
                j.metadata.name
                for j in jobs_of(kube, namespace, uid)
                if not (j.status and (j.status.succeeded or j.status.failed))
            }
            seen_together = branch_jobs <= active
        run = get(kube, namespace, name)
        return run if status_of(run).get("phase") in TERMINAL else None

    run = wait_for(f"{name} to finish", done, timeout=TIMEOUT, interval=0.2)
    assert status_of(run)["phase"] == "Succeeded", status_of(run).get("message")

    left, right, join = (step_status(run, s) for s in ("left", "right", "join"))
    starts = [timestamp(left["startedAt"]), timestamp(right["startedAt"])]
    ends = [timestamp(left["finishedAt"]), timestamp(right["finishedAt"])]
    overlapping = max(starts) < min(ends)
    assert seen_together or overlapping, (
        f"branches did not run in parallel: left {left['startedAt']}..{left['finishedAt']}, "
        f"right {right['startedAt']}..{right['finishedAt']}"
    )
    assert timestamp(join["startedAt"]) >= max(ends), (join, left, right)
    check_jobs_created_once(
        cluster, namespace, (job_name(name, uid, s, 1) for s in ("start", "left", "right", "join"))
    )


RETRY_FAST = {"limit": 2, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 2}}


def test_failing_step_is_retried_and_succeeds_on_attempt_two(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    name = "retry-ok"
    script = (
        'if [ "$AGENTRUN_ATTEMPT" = 1 ]; then '
        "echo 'flaky: first attempt fails' > /dev/termination-log; exit 3; fi; "
        + envelope("second attempt worked", {"attempt": 2})
    )
    created = create(kube, namespace, agentrun(name, [step("flaky", script, retry=RETRY_FAST)]))
    uid = created["metadata"]["uid"]

    run = wait_phase(kube, namespace, name, "Succeeded")
    st = step_status(run, "flaky")
    assert st["phase"] == "Succeeded"
    assert st["attempt"] == 2
    assert "error" not in st, st["error"]
    assert json.loads(st["result"]) == {"attempt": 2}
    assert st["jobName"] == job_name(name, uid, "flaky", 2)
    assert status_of(run)["usage"]["attempts"] == 2
    history = status_of(run)["history"]
    assert any(h.get("reason") == "RetryScheduled" for h in history), history
    check_jobs_created_once(cluster, namespace, (job_name(name, uid, "flaky", a) for a in (1, 2)))


def test_step_that_exhausts_its_retries_fails_the_run_with_its_message(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    name = "retry-fail"
    script = "echo 'boom: the disk is on fire' > /dev/termination-log; exit 7"
    retry = {"limit": 1, "backoff": {"initialSeconds": 1}}
    create(
        kube,
        namespace,
        agentrun(
            name, [step("doomed", script, retry=retry), step("never", "true", after=["doomed"])]
        ),
    )

    run = wait_phase(kube, namespace, name, "Failed")
    st = step_status(run, "doomed")
    assert st["phase"] == "Failed"
    assert st["attempt"] == 2
    assert st["error"]["reason"] == "Error"
    assert st["error"]["exitCode"] == 7
    assert "the disk is on fire" in st["error"]["message"]
    assert step_status(run, "never").get("attempt", 0) == 0
    assert step_status(run, "never")["phase"] == "Skipped"
    cond = condition(run)
    assert cond["status"] == "False"
    assert cond["reason"] == "Error"
    assert "the disk is on fire" in cond["message"], cond


def test_step_past_its_timeout_fails_with_step_timeout(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    name = "slow-step"
    create(kube, namespace, agentrun(name, [step("slow", "sleep 30", timeoutSeconds=2)]))

    run = wait_phase(kube, namespace, name, "Failed")
    st = step_status(run, "slow")
    assert st["phase"] == "Failed"
    assert st["error"]["reason"] == "StepTimeout", st["error"]
    assert condition(run)["status"] == "False"


def test_run_past_its_deadline_fails_and_its_job_is_stopped(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    name = "deadline"
    created = create(
        kube,
        namespace,
        agentrun(name, [step("forever", "sleep 60")], budget={"maxWallTimeSeconds": 5}),
    )
    uid = created["metadata"]["uid"]
    wait_until(kube, namespace, name, "a Job exists", lambda _: bool(jobs_of(kube, namespace, uid)))

    run = wait_phase(kube, namespace, name, "Failed")
    cond = condition(run)
    assert cond["status"] == "False"
    assert cond["reason"] == "DeadlineExceeded", cond
    assert step_status(run, "forever")["phase"] == "Cancelled"
    wait_for(
        "the step's Job to be gone or deleting",
        lambda: all(j.metadata.deletion_timestamp for j in jobs_of(kube, namespace, uid)),
        timeout=60,
    )


def test_large_result_is_kept_in_a_config_map_and_read_by_the_next_step(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    """A ~1 KiB result: over the 256 B inline limit, under kubelet's 4 KiB termination-message
    limit. Results over 4 KiB need the step to write the ConfigMap itself; the stand-in node
    gives pods no API access, so that case is not tested here."""
    name = "big-result"
    blob = "x" * 1000
    consume = (
        'printf \'{"ok": true, "result": {"length": %d, "answer": "%s"}}\' '
        '"${#BLOB}" "$ANSWER" > /dev/termination-log'
    )
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step("produce", envelope("big", {"blob": blob, "answer": 42})),
                step(
                    "consume",
                    consume,
                    after=["produce"],
                    inputs=[
                        {"name": "BLOB", "fromStep": "produce", "key": "blob"},
                        {"name": "ANSWER", "fromStep": "produce", "key": "answer"},
                    ],
                ),
            ],
        ),
    )
    uid = created["metadata"]["uid"]

    run = wait_phase(kube, namespace, name, "Succeeded")
    produced = step_status(run, "produce")
    assert "result" not in produced, "a 1 KiB result must not be inline"
    ref = produced["resultRef"]
    assert ref["kind"] == "ConfigMap" and ref["key"] == "result"
    assert produced.get("resultDigest")

    cm = kube.core.read_namespaced_config_map(ref["name"], namespace)
    assert cm.metadata.labels[LABEL_RUN_UID] == uid
    assert any(o.uid == uid and o.kind == "AgentRun" for o in cm.metadata.owner_references)
    assert json.loads(cm.data["result"]) == {"answer": 42, "blob": blob}
    assert cm.data["field.blob"] == blob

    consumed = json.loads(step_status(run, "consume")["result"])
    assert consumed == {"length": 1000, "answer": "42"}


def test_suspend_holds_the_next_step_and_resume_finishes_the_run(
    operator: OperatorProcess, kubectl: Kubectl, kube: KubeClients, namespace: str
) -> None:
    name = "suspend"
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step("first", f"sleep 6; {envelope('first')}"),
                step("second", envelope("second"), after=["first"]),
            ],
        ),
    )
    uid = created["metadata"]["uid"]
    wait_step_phase(kube, namespace, name, "first", "Running")
    patch_spec(kubectl, namespace, name, suspend=True)

    wait_phase(kube, namespace, name, "Suspended")
    run = wait_step_phase(kube, namespace, name, "first", "Succeeded")
    assert status_of(run)["phase"] == "Suspended"

    second_job = job_name(name, uid, "second", 1)

    def second_step_held() -> None:
        run = get(kube, namespace, name)
        assert status_of(run)["phase"] == "Suspended", status_of(run)
        assert step_status(run, "second").get("attempt", 0) == 0, step_status(run, "second")
        assert step_status(run, "second")["phase"] == "Pending"
        assert second_job not in {j.metadata.name for j in jobs_of(kube, namespace, uid)}

    # Two resync periods and more: the second step must not start while suspended.
    assert_holds(second_step_held, seconds=12, interval=0.5)

    patch_spec(kubectl, namespace, name, suspend=False)
    run = wait_phase(kube, namespace, name, "Succeeded")
    assert step_status(run, "second")["attempt"] == 1


def test_cancel_stops_the_running_step_and_ends_the_run_cancelled(
    operator: OperatorProcess, kubectl: Kubectl, kube: KubeClients, namespace: str
) -> None:
    name = "cancel"
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [step("long", "sleep 60"), step("after", envelope("after"), after=["long"])],
        ),
    )
    uid = created["metadata"]["uid"]
    wait_step_phase(kube, namespace, name, "long", "Running")
    running = jobs_of(kube, namespace, uid)
    assert [j.metadata.name for j in running] == [job_name(name, uid, "long", 1)]

    patch_spec(kubectl, namespace, name, cancel=True)
    run = wait_phase(kube, namespace, name, "Cancelled")
    cond = condition(run)
    assert cond["status"] == "False"
    assert cond["reason"] == "Cancelled"
    assert step_status(run, "long")["phase"] == "Cancelled"
    assert step_status(run, "after")["phase"] == "Skipped"

    wait_for("the running step's Job to be deleted", lambda: not jobs_of(kube, namespace, uid))
    wait_for(
        "the running step's pod to be gone",
        lambda: not kube.core.list_namespaced_pod(namespace).items,
    )


def test_deleting_a_run_mid_run_leaves_nothing_behind(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    name = "doomed-run"
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step("produce", envelope("big", {"blob": "y" * 1000})),
                step("long", "sleep 60", after=["produce"]),
            ],
        ),
    )
    uid = created["metadata"]["uid"]
    selector = f"{LABEL_RUN_UID}={uid}"
    wait_step_phase(kube, namespace, name, "long", "Running")
    assert kube.core.list_namespaced_config_map(namespace, label_selector=selector).items
    run = get(kube, namespace, name)
    assert RUN_FINALIZER in run["metadata"].get("finalizers", [])

    delete(kube, namespace, name)
    wait_for(f"{name} to be gone (finalizer released)", lambda: gone(kube, namespace, name))

    def leftovers() -> list[str]:
        jobs = jobs_of(kube, namespace, uid)
        cms = kube.core.list_namespaced_config_map(namespace, label_selector=selector).items
        pods = kube.core.list_namespaced_pod(namespace).items
        return [f"Job {o.metadata.name}" for o in jobs] + [
            f"{kind} {o.metadata.name}"
            for kind, objs in (("ConfigMap", cms), ("Pod", pods))
            for o in objs
        ]

    wait_for("no Job, pod or ConfigMap of the run", lambda: not leftovers(), timeout=30)


def test_finished_run_is_deleted_after_its_ttl(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    name = "short-lived"
    create(
        kube,
        namespace,
        agentrun(name, [step("only", envelope("done"))], retention={"ttlSecondsAfterFinished": 3}),
    )
    run = wait_phase(kube, namespace, name, "Succeeded")
    assert status_of(run).get("completedAt")
    wait_for(f"{name} to be deleted after its TTL", lambda: gone(kube, namespace, name), timeout=60)
    wait_events(kube, namespace, name, "Succeeded")


def test_each_step_attempt_job_is_created_exactly_once(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """Invariant 1, counted in the API server's audit log: retries make new Jobs, resyncs and
    re-reconciles never create a Job again (a repeated create would show up as a second 201)."""
    cluster.require_audit_log()
    name = "once"
    script = 'if [ "$AGENTRUN_ATTEMPT" -lt 3 ]; then exit 1; fi; ' + envelope("third time lucky")
    created = create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step("a", envelope("a")),
                step("b", script, after=["a"], retry=RETRY_FAST),
                step("c", "sleep 6", after=["b"]),  # spans at least one resync
            ],
        ),
    )
    uid = created["metadata"]["uid"]
    wait_phase(kube, namespace, name, "Succeeded")
    expected = [job_name(name, uid, "a", 1), job_name(name, uid, "c", 1)]
    expected += [job_name(name, uid, "b", n) for n in (1, 2, 3)]
    check_jobs_created_once(cluster, namespace, expected)


def test_audit_log_counts_every_job_creation(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """The helper behind the test above: a refused create (AlreadyExists) is no creation; a
    Job deleted and created again under the same name was created twice."""
    cluster.require_audit_log()
    body = job_manifest("audited", ["true"])
    kube.batch.create_namespaced_job(namespace, body)
    with pytest.raises(ApiException) as refused:
        kube.batch.create_namespaced_job(namespace, body)
    assert refused.value.status == 409
    kube.batch.delete_namespaced_job("audited", namespace, propagation_policy="Foreground")
    wait_for("Job audited to be gone", lambda: not kube.batch.list_namespaced_job(namespace).items)
    kube.batch.create_namespaced_job(namespace, body)

    def recorded() -> Counter[str] | None:
        counts = job_creations(cluster, namespace)
        return counts if counts["audited"] >= 2 else None

    counts = wait_for("two audited creations", recorded, timeout=30)
    assert dict(counts) == {"audited": 2}
    assert job_creations(cluster, "some-other-namespace") == Counter()
    assert job_deletions(cluster, namespace)["audited"] == 1
