"""The local control plane + local node behave like a cluster where it matters to us:
Jobs run and report termination messages and exit codes, garbage collection and
deadlines work, env reaches processes, and minted credentials authenticate as intended.

Everything polls with generous timeouts; nothing asserts on speed.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import Kubectl
from tests.support.jobs import TIMEOUT, job_manifest, job_pods, terminated_container
from tests.support.runs import IMAGE


def job_condition(kube: KubeClients, namespace: str, name: str, ctype: str) -> Any:
    job = kube.batch.read_namespaced_job_status(name, namespace)
    for cond in job.status.conditions or []:
        if cond.type == ctype and cond.status == "True":
            return cond
    return None


def processes_matching(marker: str) -> list[int]:
    """PIDs of local processes whose command line contains ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def test_job_completes_with_termination_message(kube: KubeClients, namespace: str) -> None:
    kube.batch.create_namespaced_job(
        namespace, job_manifest("writes-message", ["sh", "-c", "echo done > /dev/termination-log"])
    )
    wait_for(
        "Job Complete", lambda: job_condition(kube, namespace, "writes-message", "Complete"), 60
    )
    _, term = terminated_container(kube, namespace, "writes-message")
    assert term.exit_code == 0
    assert term.reason == "Completed"
    assert term.message.strip() == "done"
    (pod,) = job_pods(kube, namespace, "writes-message")
    assert pod.status.phase == "Succeeded"
    assert pod.spec.node_name


def test_termination_message_path_env(kube: KubeClients, namespace: str) -> None:
    script = 'printf via-env > "$AGENTRUN_TERMINATION_MESSAGE_PATH"'
    kube.batch.create_namespaced_job(namespace, job_manifest("via-env", ["sh", "-c", script]))
    wait_for("Job Complete", lambda: job_condition(kube, namespace, "via-env", "Complete"), 60)
    _, term = terminated_container(kube, namespace, "via-env")
    assert term.message == "via-env"


def test_failing_job_reports_exit_code(kube: KubeClients, namespace: str) -> None:
    kube.batch.create_namespaced_job(
        namespace,
        job_manifest(
            "exits-one",
            ["sh", "-c", "echo boom; exit 1"],
            termination_message_policy="FallbackToLogsOnError",
        ),
    )
    cond = wait_for(
        "Job Failed", lambda: job_condition(kube, namespace, "exits-one", "Failed"), TIMEOUT
    )
    assert cond.reason == "BackoffLimitExceeded"
    _, term = terminated_container(kube, namespace, "exits-one")
    assert term.exit_code == 1
    assert term.reason == "Error"
    assert term.message.strip() == "boom"  # FallbackToLogsOnError: tail of the output
    (pod,) = job_pods(kube, namespace, "exits-one")
    assert pod.status.phase == "Failed"


def test_container_without_command_fails_clearly(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    if cluster.external:
        pytest.skip("images run on a real cluster; the NoCommand rule is the local node's")
    job = job_manifest("no-command", [])
    del job["spec"]["template"]["spec"]["containers"][0]["command"]
    kube.batch.create_namespaced_job(namespace, job)
    wait_for("Job Failed", lambda: job_condition(kube, namespace, "no-command", "Failed"), TIMEOUT)
    _, term = terminated_container(kube, namespace, "no-command")
    assert term.reason == "NoCommand"
    assert "runs commands, not images" in term.message


def test_deleting_owner_garbage_collects_jobs_and_pods(
    kube: KubeClients, namespace: str, kubectl: Kubectl
) -> None:
    owner = kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owner"}, "data": {"k": "v"}}
    )
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    jobs = ["owned-a", "owned-b"]
    for name in jobs:
        kube.batch.create_namespaced_job(namespace, job_manifest(name, ["sleep", "30"], owner=ref))
    for name in jobs:

        def running(name: str = name) -> bool:
            pods = job_pods(kube, namespace, name)
            return any(p.status.phase == "Running" for p in pods)

        wait_for(f"a running pod of {name}", running, TIMEOUT)

    kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=foreground", "--wait=false")

    def all_gone() -> bool:
        remaining_jobs = kube.batch.list_namespaced_job(namespace).items
        remaining_pods = kube.core.list_namespaced_pod(namespace).items
        try:
            kube.core.read_namespaced_config_map("owner", namespace)
            owner_left = True
        except ApiException as e:
            owner_left = e.status != 404
        return not remaining_jobs and not remaining_pods and not owner_left

    wait_for("the owner, its Jobs and their pods to be deleted", all_gone, TIMEOUT)


def test_job_active_deadline_kills_pod(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    marker = f"agentrun-deadline-{secrets.token_hex(4)}"
    kube.batch.create_namespaced_job(
        namespace,
        job_manifest("deadline", ["sh", "-c", f"sleep 60; : {marker}"], active_deadline=2),
    )
    cond = wait_for(
        "Job Failed", lambda: job_condition(kube, namespace, "deadline", "Failed"), TIMEOUT
    )
    assert cond.reason == "DeadlineExceeded"

    def pod_stopped() -> bool:
        return all(
            p.status.phase in ("Failed", "Succeeded") for p in job_pods(kube, namespace, "deadline")
        )

    wait_for("the Job's pod to stop or go away", pod_stopped, TIMEOUT)
    if not cluster.external:
        wait_for("the pod's process to be killed", lambda: not processes_matching(marker), TIMEOUT)


def test_pod_active_deadline_enforced_by_node(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    marker = f"agentrun-pod-deadline-{secrets.token_hex(4)}"
    kube.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "deadline"},
            "spec": {
                "restartPolicy": "Never",
                "activeDeadlineSeconds": 2,
                "containers": [
                    {
                        "name": "main",
                        "image": IMAGE,
                        "command": ["sh", "-c", f"sleep 60; : {marker}"],
                    }
                ],
            },
        },
    )

    def failed() -> Any:
        pod = kube.core.read_namespaced_pod_status("deadline", namespace)
        return pod if pod.status.phase == "Failed" else None

    pod = wait_for("the pod to fail", failed, TIMEOUT)
    assert pod.status.reason == "DeadlineExceeded"
    if not cluster.external:
        assert not processes_matching(marker)


def test_env_from_field_refs_config_maps_and_secrets(kube: KubeClients, namespace: str) -> None:
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"color": "blue", "size": "xl"}}
    )
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        {
            "name": "COLOR",
            "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "color"}},
        },
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "GREETING", "value": "hi-$(TEAM)"},
    ]
    env_from = [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}]
    script = (
        'printf "%s|%s|%s|%s|%s|%s|%s" "$POD_NAME" "$POD_NS" "$TEAM" "$COLOR" "$TOKEN" '
        '"$GREETING" "$CFG_size" > /dev/termination-log'
    )
    kube.batch.create_namespaced_job(
        namespace,
        job_manifest("env", ["sh", "-c", script], env=env, env_from=env_from, labels={"team": "a"}),
    )
    wait_for("Job Complete", lambda: job_condition(kube, namespace, "env", "Complete"), TIMEOUT)
    _, term = terminated_container(kube, namespace, "env")
    (pod,) = job_pods(kube, namespace, "env")
    assert term.message == f"{pod.metadata.name}|{namespace}|a|blue|s3cret|hi-a|xl"


def whoami(kubectl: Kubectl, kubeconfig: Path) -> dict[str, Any]:
    out = kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout
    return dict(json.loads(out)["status"]["userInfo"])


def test_minted_user_kubeconfig_authenticates_without_rights(
    cluster: TestCluster, kubectl: Kubectl, namespace: str
) -> None:
    if cluster.external:
        pytest.skip("minting client certificates needs the local control plane's CA")
    kubeconfig = cluster.mint_user_kubeconfig("alice", ["dev-team"])
    info = whoami(kubectl, kubeconfig)
    assert info["username"] == "alice"
    assert "dev-team" in info["groups"]
    denied = kubectl("get", "secrets", "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    can_i = kubectl(
        "auth", "can-i", "list", "secrets", "-n", namespace, kubeconfig=kubeconfig, check=False
    )
    assert can_i.stdout.strip() == "no"


def test_serviceaccount_kubeconfig_authenticates(
    cluster: TestCluster, kubectl: Kubectl, kube: KubeClients, namespace: str
) -> None:
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "robot"}})
    kubeconfig = cluster.mint_serviceaccount_kubeconfig(namespace, "robot")
    info = whoami(kubectl, kubeconfig)
    assert info["username"] == f"system:serviceaccount:{namespace}:robot"
    assert "system:serviceaccounts" in info["groups"]


def test_cli_mints_kubeconfig_from_state_dir(cluster: TestCluster, kubectl: Kubectl) -> None:
    if cluster.control_plane is None:
        pytest.skip("needs the local control plane's state dir")
    proc = subprocess.run(
        [
            sys.executable, "-m", "agentrun_devcluster.cli", "kubeconfig",
            "--state-dir", str(cluster.control_plane.state_dir),
            "--user", "bob", "--group", "qa",
        ],
        capture_output=True,
        text=True,
        check=True,
    )  # fmt: skip
    info = whoami(kubectl, Path(proc.stdout.strip()))
    assert info["username"] == "bob"
    assert "qa" in info["groups"]


def test_node_is_ready_and_leased(cluster: TestCluster, kube: KubeClients) -> None:
    if cluster.node is None:
        pytest.skip("no local node")
    node = kube.core.read_node(cluster.node.name)
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    assert node.status.allocatable["pods"]
    out = cluster.kubectl(
        "get",
        "lease",
        cluster.node.name,
        "-n",
        "kube-node-lease",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ).stdout
    assert out == cluster.node.name


def test_crds_establish(crd_installed: list[str], kube: KubeClients) -> None:
    if not crd_installed:
        pytest.skip("crds/ holds no CustomResourceDefinition yet")
    for name in crd_installed:
        crd = kube.apiext.read_custom_resource_definition(name)
        assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)


def test_a_second_api_server_shares_the_cluster_and_leaves_the_first_intact(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    control_plane = cluster.control_plane
    assert control_plane is not None, "the test cluster is a local control plane"
    first_log = control_plane.logs_dir / "kube-apiserver.log"
    logged = first_log.stat().st_size
    issued = {
        p: p.stat().st_mtime_ns for p in control_plane.pki.directory.rglob("*") if p.is_file()
    }
    with control_plane.add_apiserver() as second:
        assert second.server != control_plane.server
        name = f"via-{secrets.token_hex(3)}"
        cluster.kubectl("-n", namespace, "create", "configmap", name, "--from-literal=k=v",
                        kubeconfig=second.kubeconfig)  # fmt: skip
        assert kube.core.read_namespaced_config_map(name, namespace).data == {"k": "v"}
    # The first API server still serves, with the certificates it started with: none was
    # issued again (it reloads changed files, and a key and certificate written apart fail).
    assert {p: p.stat().st_mtime_ns for p in issued} == issued
    kube.core.read_namespaced_config_map(name, namespace)
    with first_log.open("rb") as log:
        log.seek(logged)
        assert b"private key does not match" not in log.read()
    assert cluster.kubectl("get", "--raw=/readyz").stdout.strip() == "ok"
