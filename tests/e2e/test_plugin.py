"""``kubectl agentrun`` driven through kubectl's own plugin discovery, against the operator
process and a real control plane.

Every command runs as ``kubectl agentrun ...`` (the real kubectl finds ``kubectl-agentrun`` on
PATH, in this virtualenv's bin dir). kubectl refuses flags placed before a plugin's name, so
``--kubeconfig`` (another user) and ``-n`` go after it; the session kubeconfig comes through
``$KUBECONFIG``, as for a person.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from agentrun.api.models import GROUP, PLURAL
from agentrun.core.naming import job_name
from agentrun.settings import LABEL_KIND, LABEL_RUN_UID
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, job_creations, wait_for
from tests.support.admission import APPROVERS, policies_bound_to
from tests.support.cluster import bind_role, mint_user, user_subject
from tests.support.plugin import fails, ok
from tests.support.plugin import kubectl_agentrun as plugin
from tests.support.runs import (
    TIMEOUT,
    Run,
    agentrun,
    audit_record,
    create,
    delete,
    envelope,
    get,
    gone,
    jobs_of,
    step,
    step_status,
)
from tests.support.waiting import assert_holds, wait_step_phase, wait_until

# -- runs and users -------------------------------------------------------------------------------


def gated(kube: KubeClients, namespace: str, name: str) -> Run:
    """Like examples/approval-gate.yaml: an external step gated by policy."""
    return create(
        kube,
        namespace,
        agentrun(
            name,
            [
                step(
                    "check-health",
                    "echo 'health check failing for 12 minutes' > /dev/termination-log",
                ),
                step(
                    "restart-service",
                    "echo 'restarted deployment/checkout' > /dev/termination-log",
                    after=["check-health"],
                    risk="external",
                ),
            ],
            policy={"approvalRequiredFor": ["write", "external"]},
        ),
    )


def user_kubeconfig(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    user: str,
    verbs: list[str],
    groups: Iterable[str] = (APPROVERS,),
) -> Path:
    """A kubeconfig of ``user`` in ``groups``, allowed ``verbs`` on AgentRuns here and to read
    ConfigMaps."""
    to = cluster.kubeconfig.with_name(f"{namespace}-{user}.kubeconfig")
    kubeconfig = mint_user(cluster, user, groups, to)
    rules = [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": verbs},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
    ]
    bind_role(kube, namespace, user, rules, [user_subject(user)])
    return kubeconfig


def line_with(text: str, *parts: str) -> str:
    """The first line of ``text`` holding every one of ``parts``."""
    for line in text.splitlines():
        if all(p in line for p in parts):
            return line
    raise AssertionError(f"no line with {parts} in:\n{text}")


APPROVER = ["get", "list", "watch", "patch"]


# -- the tests ------------------------------------------------------------------------------------


def test_approve_lets_the_gated_step_run_and_status_and_history_show_it(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    alice = user_kubeconfig(cluster, kube, namespace, "alice", APPROVER)
    uid = gated(kube, namespace, "remediate")["metadata"]["uid"]
    run = wait_step_phase(kube, namespace, "remediate", "restart-service", "WaitingForApproval")
    h = step_status(run, "restart-service")["argsHash"]

    status = ok(plugin(cluster, "status", "remediate", "-n", namespace))
    assert "phase:    WaitingForApproval" in status
    assert "progress: 1/2" in status
    assert line_with(status, "check-health", "Succeeded", "health check failing for 12 minutes")
    gate = line_with(status, "restart-service", "WaitingForApproval")
    assert gate.startswith("  restart-service"), "a dependent step is indented under its parent"
    assert f"waiting for approval (args {h[:12]})" in gate
    assert "check-health" in gate  # AFTER

    refused = fails(plugin(cluster, "approve", "remediate", "check-health", "-n", namespace))
    assert "step 'check-health' is not waiting for approval (phase Succeeded); its argsHash is" in (
        refused
    )

    approved = plugin(
        cluster, "approve", "remediate", "restart-service", "--reason", "change window",
        "-n", namespace, kubeconfig=alice,
    )  # fmt: skip
    assert ok(approved) == (
        f"approved step restart-service of agentrun/remediate (args {h[:12]}) as alice\n"
    )
    decision = get(kube, namespace, "remediate")["spec"]["approvals"][0]
    assert decision["by"] == "alice" and decision["argsHash"] == h
    assert decision["decision"] == "approve" and decision["reason"] == "change window"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", decision["at"])

    waited = ok(plugin(cluster, "wait", "remediate", "--timeout", "120", "-n", namespace))
    assert waited.startswith("agentrun/remediate Succeeded")

    status = ok(plugin(cluster, "status", "remediate", "-n", namespace))
    assert "phase:    Succeeded" in status and "progress: 2/2" in status
    assert line_with(status, "restart-service", "Succeeded", "approved by alice")

    history = plugin(cluster, "history", "remediate", "-n", namespace)
    timeline = ok(history)
    assert timeline.splitlines()[0].split() == [
        "TIME",
        "STEP",
        "TRANSITION",
        "BY",
        "REASON",
        "MESSAGE",
    ]
    assert line_with(timeline, "restart-service", "WaitingForApproval -> Launching", "alice")
    # A command shorter than AGENTRUN_RUNNING_AFTER_SECONDS goes from Launching to Succeeded.
    assert line_with(timeline, "check-health", "-> Succeeded")
    assert line_with(timeline, "(run)", "-> Succeeded")

    verified = plugin(cluster, "history", "remediate", "--verify", "-n", namespace)
    if audit_record(kube, namespace, uid):
        assert re.search(r"^audit record intact: \d+ entries$", ok(verified), re.M), verified
    else:  # the operator keeps no record yet: the plugin says so, from status.history
        assert "has no audit record" in fails(verified)
        assert "has no audit record" in history.stderr


def test_reject_ends_the_run_with_the_reason_and_refusals_are_reported(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    alice = user_kubeconfig(cluster, kube, namespace, "alice", APPROVER)
    bob = user_kubeconfig(cluster, kube, namespace, "bob", ["get", "list"])
    gated(kube, namespace, "risky")
    run = wait_step_phase(kube, namespace, "risky", "restart-service", "WaitingForApproval")
    h = step_status(run, "restart-service")["argsHash"]

    # bob may read the run but not change it: the API server's refusal, in its own words.
    refused = plugin(
        cluster, "reject", "risky", "restart-service", "--reason", "no", "-n", namespace,
        kubeconfig=bob,
    )  # fmt: skip
    err = fails(refused)
    assert "the API server refused to record the decision" in err
    assert 'User "bob" cannot patch resource "agentruns"' in err
    assert "approvals" not in get(kube, namespace, "risky")["spec"]

    rejected = plugin(
        cluster, "reject", "risky", "restart-service", "--reason", "not during the sale",
        "-n", namespace, kubeconfig=alice,
    )  # fmt: skip
    assert ok(rejected) == (
        f"rejected step restart-service of agentrun/risky (args {h[:12]}) as alice: "
        "not during the sale\n"
    )
    waited = plugin(cluster, "wait", "risky", "-n", namespace)
    assert fails(waited) == ""
    assert waited.stdout.startswith("agentrun/risky Failed")
    assert "not during the sale" in waited.stdout

    status = ok(plugin(cluster, "status", "risky", "-n", namespace))
    assert line_with(status, "restart-service", "Failed", "Rejected: rejected by alice: not during")
    timeline = ok(plugin(cluster, "history", "risky", "-n", namespace))
    assert line_with(
        timeline, "restart-service", "WaitingForApproval -> Failed", "alice", "Rejected"
    )


def test_result_prints_a_config_map_result_and_an_inline_one_raw(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    big = "z" * 1024
    steps = [
        step("big", envelope("a kibibyte", big)),
        step("small", "printf 'small result' > /dev/termination-log"),
        step("quiet", "true"),
    ]
    create(kube, namespace, agentrun("results", steps))
    ok(plugin(cluster, "wait", "results", "-n", namespace))
    run = get(kube, namespace, "results")
    assert step_status(run, "big").get("resultRef"), "1 KiB must be kept in a ConfigMap"
    assert step_status(run, "small").get("result") == "small result"

    assert ok(plugin(cluster, "result", "results", "big", "-n", namespace)) == big
    assert ok(plugin(cluster, "result", "agentrun/results", "small", "-n", namespace)) == (
        "small result"
    )
    assert "error: step 'quiet' of agentrun/results has no result (phase Succeeded)" in fails(
        plugin(cluster, "result", "results", "quiet", "-n", namespace)
    )
    assert "step 'nope' is not a step of agentrun/results" in fails(
        plugin(cluster, "result", "results", "nope", "-n", namespace)
    )


def test_suspend_resume_cancel_and_wait(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    steps = [
        step("first", f"sleep 4; {envelope('first')}"),
        step("second", envelope("second"), after=["first"]),
    ]
    create(kube, namespace, agentrun("pausable", steps))
    wait_step_phase(kube, namespace, "pausable", "first", "Running")
    suspended = ok(plugin(cluster, "suspend", "pausable", "-n", namespace))
    assert suspended.startswith("suspended agentrun/pausable (spec.suspend: true)")
    wait_until(
        kube, namespace, "pausable", "Suspended with first done",
        lambda r: (r.get("status") or {}).get("phase") == "Suspended"
        and step_status(r, "first").get("phase") == "Succeeded",
    )  # fmt: skip

    def second_step_held() -> None:
        run = get(kube, namespace, "pausable")
        assert run["status"]["phase"] == "Suspended"
        assert step_status(run, "second")["phase"] == "Pending"

    assert_holds(second_step_held, seconds=6)  # more than a resync: the second step stays put
    status = ok(plugin(cluster, "status", "pausable", "-n", namespace))
    assert "phase:    Suspended" in status and "spec.suspend is true" in status
    assert "already suspended" in ok(plugin(cluster, "suspend", "pausable", "-n", namespace))

    assert ok(plugin(cluster, "resume", "pausable", "-n", namespace)).startswith(
        "resumed agentrun/pausable"
    )
    assert ok(plugin(cluster, "wait", "pausable", "-n", namespace)).startswith(
        "agentrun/pausable Succeeded"
    )

    create(
        kube,
        namespace,
        agentrun("endless", [step("long", "sleep 120"), step("next", "true", after=["long"])]),
    )
    wait_step_phase(kube, namespace, "endless", "long", "Running")
    timed_out = fails(plugin(cluster, "wait", "endless", "--timeout", "2s", "-n", namespace))
    assert "timed out after 2s waiting for agentrun/endless to finish (phase Running" in timed_out
    cancelled = ok(plugin(cluster, "cancel", "endless", "-n", namespace))
    assert cancelled.startswith("cancelled agentrun/endless (spec.cancel: true)")
    assert "stops long" in cancelled
    waited = plugin(cluster, "wait", "endless", "-n", namespace)
    fails(waited)
    assert waited.stdout.startswith("agentrun/endless Cancelled")
    assert get(kube, namespace, "endless")["spec"]["cancel"] is True
    assert "has already finished (Cancelled)" in ok(
        plugin(cluster, "cancel", "endless", "-n", namespace)
    )


def test_wait_fails_for_a_failed_run(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    create(kube, namespace, agentrun("broken", [step("boom", "echo 'disk full' >&2; exit 3")]))
    waited = plugin(cluster, "wait", "broken", "--timeout", "120", "-n", namespace)
    fails(waited)
    assert waited.stdout.startswith("agentrun/broken Failed")
    status = ok(plugin(cluster, "status", "broken", "-n", namespace))
    assert line_with(status, "boom", "Failed")


def test_fork_runs_the_step_and_what_follows_and_keeps_earlier_results(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    big = "q" * 1024
    steps = [
        step("gather", envelope("gathered", big)),
        step(
            "analyse",
            'printf "analysed %s bytes" "${#GATHERED}" > /dev/termination-log',
            after=["gather"],
            inputs=[{"name": "GATHERED", "fromStep": "gather"}],
        ),
        step("report", envelope("reported", "done"), after=["analyse"]),
        step("side", envelope("side", "independent")),
    ]
    old = create(kube, namespace, agentrun("source", steps, retention={"keepJobs": "all"}))
    ok(plugin(cluster, "wait", "source", "-n", namespace))
    old_ref = step_status(get(kube, namespace, "source"), "gather")["resultRef"]

    forked = plugin(cluster, "fork", "source", "--from", "analyse", "-n", namespace)
    new = ok(forked).strip()
    assert re.fullmatch(r"source-fork-[a-z]{4}", new), forked.stdout
    assert "carried gather, side" in forked.stderr

    # The carried result must outlive the run it came from.
    delete(kube, namespace, "source")
    wait_for("the source run to be deleted", lambda: gone(kube, namespace, "source"), TIMEOUT)
    wait_for(
        "the source run's result ConfigMap to be collected",
        lambda: (
            not kube.core.list_namespaced_config_map(
                namespace, field_selector=f"metadata.name={old_ref['name']}"
            ).items
        ),
        timeout=TIMEOUT,
    )

    waited = ok(plugin(cluster, "wait", new, "-n", namespace))
    assert waited.startswith(f"agentrun/{new} Succeeded")
    run = get(kube, namespace, new)
    uid = run["metadata"]["uid"]
    assert not run["spec"].get("suspend")
    for carried in ("gather", "side"):
        st = step_status(run, carried)
        assert st["phase"] == "Succeeded" and not st.get("attempt"), st
    assert step_status(run, "analyse")["result"] == "analysed 1024 bytes"
    assert step_status(run, "report")["attempt"] == 1

    jobs = jobs_of(kube, namespace, uid)
    assert sorted(j.metadata.name for j in jobs) == sorted(
        job_name(new, uid, s, 1) for s in ("analyse", "report")
    )
    if not cluster.external:
        created = job_creations(cluster, namespace)
        for carried in ("gather", "side"):
            assert job_name(new, uid, carried, 1) not in created
        assert created[job_name(new, uid, "analyse", 1)] == 1

    copy = kube.core.read_namespaced_config_map(f"{new}-carried-gather", namespace)
    assert copy.metadata.labels[LABEL_RUN_UID] == uid
    assert copy.metadata.labels[LABEL_KIND] == "result"
    (owner,) = copy.metadata.owner_references
    assert (owner.uid, owner.kind, owner.controller, owner.block_owner_deletion) == (
        uid,
        "AgentRun",
        False,
        False,
    )
    carried_results = {c["step"]: c for c in run["spec"]["carriedResults"]}
    assert carried_results["gather"]["resultRef"]["name"] == f"{new}-carried-gather"
    assert carried_results["gather"]["fromRun"] == f"{namespace}/source"
    assert carried_results["side"]["result"] == "independent"

    assert ok(plugin(cluster, "result", new, "gather", "-n", namespace)) == big
    assert ok(plugin(cluster, "result", new, "side", "-n", namespace)) == "independent"
    status = ok(plugin(cluster, "status", new, "-n", namespace))
    assert line_with(status, "gather", "Succeeded", f"carried from {namespace}/source")
    assert old["metadata"]["uid"] != uid


def test_missing_runs_and_bad_usage_give_readable_errors(
    cluster: TestCluster, crd_installed: list[str], namespace: str, tmp_path: Path
) -> None:
    for args in (
        ["status", "ghost"],
        ["history", "ghost"],
        ["approve", "ghost", "deploy"],
        ["result", "ghost", "deploy"],
        ["wait", "ghost"],
        ["fork", "ghost", "--from", "deploy"],
        ["cancel", "ghost"],
    ):
        err = fails(plugin(cluster, *args, "-n", namespace))
        assert err == f"error: agentrun 'ghost' not found in namespace '{namespace}'\n", args

    # The kubeconfig context's namespace counts when -n is not given, as with kubectl.
    config = tmp_path / "kubeconfig"
    shutil.copy(cluster.kubeconfig, config)
    cluster.kubectl(
        "config", "set-context", "--current", f"--namespace={namespace}", kubeconfig=config
    )
    err = fails(plugin(cluster, "status", "ghost", kubeconfig=config))
    assert err == f"error: agentrun 'ghost' not found in namespace '{namespace}'\n"

    usage = fails(plugin(cluster, "reject", "ghost", "deploy", "-n", namespace), code=2)
    assert "the following arguments are required: --reason" in usage
    fails(plugin(cluster, "frobnicate"), code=2)


# -- with the shipped admission policies ----------------------------------------------------------


@pytest.fixture
def admission_policies(cluster: TestCluster, namespace: str) -> Iterator[None]:
    """The policies of manifests/admission, as copies bound only to this test's namespace (the
    rest of the session creates runs and signs approvals freely)."""
    approval = {"step": "s", "decision": "approve", "argsHash": "a" * 64, "by": "x"}
    probe = agentrun("probe", [step("s")], goal="probe", approvals=[approval])

    def enforced() -> bool:
        proc = cluster.kubectl(
            "-n", namespace, "create", "--dry-run=server", "-f", "-",
            input=json.dumps(probe), check=False,
        )  # fmt: skip
        return proc.returncode != 0 and "must be signed by the requesting user" in proc.stderr

    with policies_bound_to(cluster, namespace, enforced):
        yield


def test_admission_refusals_come_through_and_a_fork_needs_a_new_approval(
    operator: OperatorProcess,
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    admission_policies: None,
) -> None:
    editor = [*APPROVER, "create"]
    alice = user_kubeconfig(cluster, kube, namespace, "alice", editor)
    bob = user_kubeconfig(cluster, kube, namespace, "bob", editor)
    carol = user_kubeconfig(cluster, kube, namespace, "carol", APPROVER, groups=["dev"])
    steps = [
        step("check-health", envelope("failing")),
        step("restart", envelope("restarted"), after=["check-health"], risk="external"),
    ]
    policy = {
        "approvalRequiredFor": ["external"],
        "approverGroups": [APPROVERS],
        "requireSecondPerson": True,
    }
    goal = "restart checkout, with a second person's approval"
    body = agentrun("guarded", steps, goal=goal, policy=policy)
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body), kubeconfig=alice)
    wait_step_phase(kube, namespace, "guarded", "restart", "WaitingForApproval")

    def approve(run: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
        return plugin(cluster, "approve", run, "restart", "-n", namespace, kubeconfig=kubeconfig)

    err = fails(approve("guarded", alice))
    assert err.startswith("error: the API server refused to record the decision: ")
    assert (
        "policy.requireSecondPerson: alice created this run and cannot approve or reject its "
        "steps; another person must"
    ) in err
    err = fails(approve("guarded", carol))
    assert "carol may not approve or reject steps of this run" in err
    assert "policy.approverGroups allows only members of agentrun-approvers" in err
    assert "approvals" not in get(kube, namespace, "guarded")["spec"]

    assert ok(approve("guarded", bob)).endswith(" as bob\n")
    ok(plugin(cluster, "wait", "guarded", "-n", namespace))
    timeline = ok(plugin(cluster, "history", "guarded", "-n", namespace))
    assert line_with(timeline, "restart", "WaitingForApproval -> Launching", "bob")

    # bob forks from the gated step: he created the fork, so now alice must approve.
    forked = plugin(
        cluster, "fork", "guarded", "--from", "restart", "--name", "guarded-again",
        "-n", namespace, kubeconfig=bob,
    )  # fmt: skip
    new = ok(forked).strip()
    assert new == "guarded-again"
    run = wait_step_phase(kube, namespace, new, "restart", "WaitingForApproval")
    assert run["metadata"]["annotations"]["agentrun.dev/created-by"] == "bob"
    assert step_status(run, "check-health")["phase"] == "Succeeded"
    assert "requireSecondPerson: bob created this run" in fails(approve(new, bob))
    assert ok(approve(new, alice)).endswith(" as alice\n")
    assert ok(plugin(cluster, "wait", new, "-n", namespace)).startswith(f"agentrun/{new} Succeeded")
