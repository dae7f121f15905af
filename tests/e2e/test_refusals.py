"""A spec that admission accepts but whose Job the API server refuses fails the step, with the
API's own message and a Warning Event, instead of leaving the run Launching forever.

A refusal that may pass on its own (the step's ServiceAccount made after the run, a quota on
pods or on Jobs) does not fail the step: the attempt waits while the Job controller tries the
pod again, or the operator the Job, and runs once it is admitted.

The refusal counts as a failed attempt: the step's retry policy applies, and since an invalid
spec is refused the same way each time, the retries end with the step Failed (reason
``JobRefused``) and no more creates are asked for. A Job the Kubernetes client refuses before
sending it (an unknown securityContext key) ends the same way, never in a crash loop; a field
of the wrong type is refused earlier, by the CRD, at ``kubectl apply``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, audit_events, wait_for
from tests.support.admission import creator_recorded, policies_bound_to
from tests.support.runs import (
    Run,
    agentrun,
    condition,
    create,
    envelope,
    gone,
    status_of,
    step,
    step_status,
)
from tests.support.waiting import assert_holds, wait_events, wait_phase, wait_until

pytestmark = pytest.mark.usefixtures("crd_installed")  # a test here applies a run with no operator

SOON = 30.0
"""Seconds to wait for the refusal to end the run: a stuck run never gets there."""


def refused_run(name: str, container: dict[str, Any] | None = None, **spec: Any) -> Run:
    bad = step("bad", "echo never > /dev/termination-log")
    bad["container"].update(container or {})
    return agentrun(name, [bad], **spec)


def warnings(
    kube: KubeClients, namespace: str, name: str, enough: Callable[[list[str]], bool]
) -> list[str]:
    """The messages of the JobRefused Warning Events on the run, once ``enough`` (Events are
    posted after the status write that the test saw)."""

    def found() -> list[str] | None:
        events = kube.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        messages = [e.message for e in events if e.type == "Warning" and e.reason == "JobRefused"]
        return messages if enough(messages) else None

    return wait_for(f"the JobRefused Warning Events of {name}", found, timeout=SOON)


def job_create_codes(cluster: TestCluster, namespace: str) -> list[int]:
    events = audit_events(cluster, verb="create", resource="jobs", namespace=namespace)
    return [int((e.get("responseStatus") or {}).get("code") or 0) for e in events]


def test_requests_above_limits_fail_the_step_with_the_apis_message(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    resources = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    create(kube, namespace, refused_run("greedy", {"resources": resources}))

    run = wait_phase(kube, namespace, "greedy", "Failed", timeout=SOON)
    bad = step_status(run, "bad")
    error = bad.get("error") or {}
    assert bad["phase"] == "Failed" and error.get("reason") == "JobRefused", bad
    assert "must be less than or equal to cpu limit" in error["message"], error
    assert condition(run)["reason"] == "JobRefused", condition(run)
    found = warnings(kube, namespace, "greedy", bool)
    assert any("must be less than or equal to cpu limit" in w for w in found), found
    if not cluster.external:
        assert job_create_codes(cluster, namespace) == [422]


def test_an_invalid_security_context_is_refused_once_per_attempt_until_retries_end(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    retry = {"limit": 2, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
    run = refused_run(
        "negative-user",
        stepTemplate={"containerSecurityContext": {"runAsUser": -1}},
    )
    run["spec"]["plan"]["steps"][0]["retry"] = retry
    create(kube, namespace, run)

    done = wait_phase(kube, namespace, "negative-user", "Failed", timeout=SOON + 10)
    bad = step_status(done, "bad")
    error = bad.get("error") or {}
    assert error.get("reason") == "JobRefused" and bad["attempt"] == 3, bad
    assert "runAsUser" in error["message"], error
    found = warnings(kube, namespace, "negative-user", lambda w: len(w) >= 3)
    attempts = [w for w in found if w.startswith("step bad: the Job of attempt")]
    assert len(attempts) == 2, found  # two retried, then the step failed
    assert all("runAsUser" in w for w in attempts), attempts

    def asked_three_times() -> None:
        if not cluster.external:
            assert job_create_codes(cluster, namespace) == [422, 422, 422]
        run = wait_phase(kube, namespace, "negative-user", "Failed")
        assert step_status(run, "bad")["attempt"] == 3

    assert_holds(asked_three_times, seconds=3)


def test_a_security_context_field_of_the_wrong_type_is_refused_at_kubectl_apply(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    run = refused_run("root-by-name", stepTemplate={"securityContext": {"runAsUser": "root"}})
    proc = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(run),
                           check=False)  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    assert "spec.stepTemplate.securityContext.runAsUser" in proc.stderr, proc.stderr
    assert "integer" in proc.stderr, proc.stderr
    assert gone(kube, namespace, "root-by-name")  # never stored


def test_a_job_the_client_refuses_fails_the_step_with_its_message_not_a_crash_loop(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """An unknown key is kept by the CRD (never pruned in silence) and refused by the
    Kubernetes client before the Job's create is sent: the attempt fails, once per attempt."""
    retry = {"limit": 1, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
    template = {"securityContext": {"runAsNonRoot": True, "sandboxLevel": {"strict": True}}}
    run = refused_run("unknown-key", stepTemplate=template)
    run["spec"]["plan"]["steps"][0]["retry"] = retry
    create(kube, namespace, run)

    done = wait_phase(kube, namespace, "unknown-key", "Failed", timeout=SOON)
    bad = step_status(done, "bad")
    error = bad.get("error") or {}
    assert error.get("reason") == "JobRefused" and bad["attempt"] == 2, bad
    assert "the Kubernetes client refused the Job" in error["message"], error
    assert "securityContext.sandboxLevel: Extra inputs are not permitted" in error["message"]
    assert condition(done)["reason"] == "JobRefused", condition(done)
    found = warnings(kube, namespace, "unknown-key", bool)
    assert any("sandboxLevel" in w for w in found), found

    def nothing_sent() -> None:
        if not cluster.external:
            assert job_create_codes(cluster, namespace) == []  # refused before any request
        run = wait_phase(kube, namespace, "unknown-key", "Failed")
        assert step_status(run, "bad")["attempt"] == 2

    assert_holds(nothing_sent, seconds=3)


def test_a_pod_refused_until_its_service_account_is_made_runs_once_it_is(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """The ServiceAccount admission refuses the step's pod while ``stepTemplate.
    serviceAccountName`` names no ServiceAccount (as when the run is applied before it); the
    attempt stays Launching, saying why, and attempt 1 succeeds once the account exists."""
    run = agentrun(
        "late-account",
        [step("a", envelope("ran"))],
        stepTemplate={"serviceAccountName": "late"},
    )
    # A step runs as a ServiceAccount only on behalf of a creator who may impersonate it: the
    # admission policies record the creator (the admin).
    with policies_bound_to(cluster, namespace, creator_recorded(cluster, namespace)):
        create(kube, namespace, run)

    def says_it_waits(r: Run) -> bool:  # or has ended (then the asserts below say how)
        steps: list[dict[str, Any]] = status_of(r).get("steps") or []
        waits = any("FailedCreate" in str(st.get("message") or "") for st in steps)
        return waits or status_of(r).get("phase") in ("Failed", "Succeeded")

    waiting = wait_until(kube, namespace, "late-account", "the step waits", says_it_waits, SOON)
    a = step_status(waiting, "a")
    assert a["phase"] == "Launching" and not a.get("error"), a
    refusals = [
        e.message
        for e in kube.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={a['jobName']}"
        ).items
        if e.reason == "FailedCreate"
    ]
    assert any('serviceaccount "late" not found' in text for text in refusals), refusals

    # A Warning Event on the run says so at once.
    (event,) = wait_events(kube, namespace, "late-account", "PodRefused", warning=True)
    warning = event.message
    assert 'serviceaccount "late" not found' in warning and "until" in warning, warning

    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "late"}})
    done = wait_phase(kube, namespace, "late-account", "Succeeded", timeout=SOON * 3)
    a = step_status(done, "a")
    assert a["attempt"] == 1 and a.get("summary") == "ran" and not a.get("error"), a


def test_steps_beyond_a_pod_quota_wait_for_it_instead_of_failing(
    operator: OperatorProcess, kube: KubeClients, namespace: str
) -> None:
    """With a ResourceQuota of one pod, the second of two parallel steps has its pod refused
    (``exceeded quota``) while the first runs; it waits, and runs once the first pod ended."""
    kube.core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}
    )

    def counted() -> bool | None:  # the quota controller has set what is used
        used = kube.core.read_namespaced_resource_quota("one-pod", namespace).status.used
        return True if used is not None and "pods" in used else None

    wait_for("the quota's usage", counted, timeout=SOON)
    work = "sleep 3; " + envelope("done")
    create(kube, namespace, agentrun("quota", [step("a", work), step("b", work)]))

    done = wait_phase(kube, namespace, "quota", "Succeeded", timeout=SOON * 4)
    for name in ("a", "b"):
        st = step_status(done, name)
        assert st["attempt"] == 1 and not st.get("error"), st
    refused = [
        e.message
        for e in kube.core.list_namespaced_event(namespace).items
        if e.reason == "FailedCreate" and "exceeded quota" in (e.message or "")
    ]
    assert refused, "no pod was refused by the quota: the test did not test the wait"


def test_a_job_beyond_a_job_quota_is_created_once_the_quota_allows(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """With a ResourceQuota of one Job, the create of the second of two parallel steps' Jobs
    is refused (403, ``exceeded quota``) until the first Job is deleted after its step ended;
    the operator tries it again, and the step runs as attempt 1."""
    quota = {"metadata": {"name": "one-job"}, "spec": {"hard": {"count/jobs.batch": "1"}}}
    kube.core.create_namespaced_resource_quota(namespace, quota)

    def counted() -> bool | None:  # the quota controller has set what is used
        used = kube.core.read_namespaced_resource_quota("one-job", namespace).status.used
        return True if used is not None and "count/jobs.batch" in used else None

    wait_for("the quota's usage", counted, timeout=SOON)
    work = envelope("done")
    create(kube, namespace, agentrun("job-quota", [step("a", work), step("b", work)]))

    done = wait_phase(kube, namespace, "job-quota", "Succeeded", timeout=SOON * 4)
    for name in ("a", "b"):
        st = step_status(done, name)
        assert st["attempt"] == 1 and not st.get("error"), st
    if not cluster.external:
        codes = job_create_codes(cluster, namespace)
        assert 403 in codes, f"no create was refused by the quota: {codes}"
        assert codes.count(201) == 2, codes
