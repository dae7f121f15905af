"""A second pod of one step attempt never runs the step's command.

The Job controller may make two pods for one attempt: when the answer to a pod create is lost
(a kube-apiserver restart mid-request), it cannot tell that the first pod exists and makes
another; both ran the step's command before the controller noticed. A step Job's pods are
therefore created held by the operator's scheduling gate (``agentrun.dev/start``), and the
operator lets exactly one pod per attempt start (``agentrun.execution.jobs.choose_pod``).

Here the second pod is made the way the Job controller makes it (the Job's pod template, the
Job as controller), once while the first pod runs and once while the operator is down before
either pod started. Either way exactly one pod of the attempt is ever given a node and the run
ends Succeeded with that pod's result, in its first attempt. (The Job controller itself soon
deletes the surplus pod; held, it never ran.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentrun.core.naming import job_name
from agentrun.execution.jobs import is_gated
from agentrun.settings import POD_GATE
from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.cluster import StartOperator
from tests.support.runs import agentrun, create, envelope, get, status_of, step, step_status
from tests.support.waiting import wait_phase

SLEEP = 4


class Bindings:
    """Every pod of a Job that was ever given a node, as seen by polling the Job's pods."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None


@contextmanager
def pods_bound(kube: KubeClients, namespace: str, job: str) -> Iterator[Bindings]:
    """Follow the pods of Job ``job`` for as long as the block runs."""
    found = Bindings()

    def follow() -> None:
        # Every 0.1 s: a pod given a node keeps it until it is gone, which takes the node
        # longer than that (it stops the pod's container first).
        try:
            while not found.stop.wait(0.1):
                for pod in the_jobs_pods(kube, namespace, job):
                    name = pod["metadata"]["name"]
                    found.seen.add(name)
                    if pod["spec"].get("nodeName"):
                        found.bound.add(name)
        except BaseException as error:  # reported by the test, not lost in the thread
            found.error = error

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.stop.set()
        thread.join(timeout=10)
    assert found.error is None, f"following {job}'s pods failed: {found.error!r}"


def the_jobs_pods(kube: KubeClients, namespace: str, job: str) -> list[dict[str, Any]]:
    pods = kube.core.list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
    ).items
    return [kube.api_client.sanitize_for_serialization(p) for p in pods]


def make_second_pod(kube: KubeClients, namespace: str, job_name_: str) -> str:
    """A second pod of the Job, as the Job controller makes one: its template, the Job as
    controller (so the controller counts it), its tracking finalizer, a generated name."""
    job = kube.api_client.sanitize_for_serialization(
        kube.batch.read_namespaced_job(job_name_, namespace)
    )
    template = job["spec"]["template"]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{job_name_}-",
            "labels": template["metadata"]["labels"],
            # As the Job controller's own pods: it counts the pod's end before it goes.
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name_,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    assert {"name": POD_GATE} in body["spec"]["schedulingGates"], "the template holds its pods"
    created = kube.core.create_namespaced_pod(namespace, body)
    return str(created.metadata.name)


def one_step_run(name: str) -> dict[str, Any]:
    script = f"sleep {SLEEP}; {envelope('ran once', {'ran': 1})}"
    return agentrun(name, [step("only", script)])


def test_a_second_pod_made_while_the_first_runs_never_starts(
    kube: KubeClients, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    run = create(kube, namespace, one_step_run("dup-running"))
    uid = run["metadata"]["uid"]
    job = job_name("dup-running", uid, "only", 1)
    wait_for("the Job of attempt 1", lambda: the_jobs_pods(kube, namespace, job), timeout=60)
    with pods_bound(kube, namespace, job) as pods:
        first = wait_for(
            "the attempt's pod to be let start",
            lambda: [p for p in the_jobs_pods(kube, namespace, job) if not is_gated(p)],
            timeout=60,
        )[0]["metadata"]["name"]
        second = make_second_pod(kube, namespace, job)
        done = wait_phase(kube, namespace, "dup-running", "Succeeded", timeout=120)
    assert pods.bound == {first}, f"pods given a node: {sorted(pods.bound)}, not only {first}"
    assert second in pods.seen
    assert json.loads(step_status(done, "only")["result"]) == {"ran": 1}
    assert step_status(done, "only")["attempt"] == 1


def test_two_pods_made_while_the_operator_was_down_only_the_first_starts(
    kube: KubeClients, namespace: str, start_operator: StartOperator
) -> None:
    # The operator dies right after it created the Job: its pod waits, held.
    op = start_operator(env={"AGENTRUN_CRASH_AT": "after-job-create:1"})
    run = create(kube, namespace, one_step_run("dup-down"))
    uid = run["metadata"]["uid"]
    job = job_name("dup-down", uid, "only", 1)
    op.wait_exit(timeout=60)
    with pods_bound(kube, namespace, job) as pods:
        first_pod = wait_for(
            "the Job's pod", lambda: the_jobs_pods(kube, namespace, job), timeout=60
        )[0]
        assert is_gated(first_pod), "nobody let the pod start while the operator was down"
        second = make_second_pod(kube, namespace, job)
        assert status_of(get(kube, namespace, "dup-down")).get("phase") != "Succeeded"
        start_operator()
        done = wait_phase(kube, namespace, "dup-down", "Succeeded", timeout=120)
    first = first_pod["metadata"]["name"]
    assert len(pods.bound) == 1, f"pods given a node: {sorted(pods.bound)}"
    assert pods.bound <= {first, second}
    assert json.loads(step_status(done, "only")["result"]) == {"ran": 1}
