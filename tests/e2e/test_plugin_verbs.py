"""The plugin's everyday verbs against the operator process and a real control plane, run as
``kubectl agentrun ...`` through kubectl's plugin discovery: ``-o json|yaml`` of the read
verbs, ``status -o mermaid``, ``wait`` on a watch (and by reading when the user may not
watch), ``logs`` finding a step attempt's pod, ``completion`` and ``--version``. (A run deleted
while ``wait`` watches it, and a watch resumed after the API server closed it, are unit
tests: tests/unit/test_plugin_verbs.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

import yaml

from agentrun.api.models import GROUP, PLURAL
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster
from tests.support.cluster import bind_role, mint_user, user_subject
from tests.support.plugin import VENV_BIN, fails, ok
from tests.support.plugin import kubectl_agentrun as plugin
from tests.support.runs import agentrun, create, envelope, get, step, step_status


def reader(cluster: TestCluster, kube: KubeClients, namespace: str, user: str) -> Path:
    """A kubeconfig of ``user``, who may get and list AgentRuns, Jobs, pods and their logs
    here, but not watch."""
    kubeconfig = mint_user(cluster, user, [], cluster.kubeconfig.with_name(f"{namespace}-{user}"))
    rules = [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "configmaps"],
         "verbs": ["get", "list"]},
    ]  # fmt: skip
    bind_role(kube, namespace, user, rules, [user_subject(user)])
    return kubeconfig


def test_read_verbs_print_json_yaml_and_the_plan_and_wait_watches(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    steps = [
        step("first", f"echo hello-from-first; sleep 6; {envelope('first done')}"),
        step("second", envelope("second done"), after=["first"]),
    ]
    carol = reader(cluster, kube, namespace, "carol")
    created = create(kube, namespace, agentrun("verbs", steps, retention={"keepJobs": "all"}))

    # While the run goes on: carol, who may not watch, waits by reading and is told so...
    polling = subprocess.Popen(
        [cluster.kubectl_path, "agentrun", "wait", "verbs", "-n", namespace,
         f"--kubeconfig={carol}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plugin_env(cluster),
    )  # fmt: skip
    try:
        # ... and the admin waits on a watch: no note, the run's last phase, exit 0.
        waited = plugin(cluster, "wait", "verbs", "--timeout", "120", "-n", namespace)
        polled_out, polled_err = polling.communicate(timeout=120)
    finally:
        polling.kill()
    assert ok(waited).startswith("agentrun/verbs Succeeded") and waited.stderr == ""
    assert polling.returncode == 0, polled_err
    assert polled_out.startswith("agentrun/verbs Succeeded")
    assert "note: cannot watch agentruns" in polled_err
    as_yaml = yaml.safe_load(ok(plugin(cluster, "wait", "verbs", "-o", "yaml", "-n", namespace)))
    assert as_yaml["status"]["phase"] == "Succeeded"

    stored = get(kube, namespace, "verbs")
    shown = json.loads(ok(plugin(cluster, "status", "verbs", "-o", "json", "-n", namespace)))
    assert shown["metadata"]["uid"] == created["metadata"]["uid"]
    assert "managedFields" not in shown["metadata"]
    assert shown["status"]["phase"] == "Succeeded"
    assert shown["status"]["steps"] == stored["status"]["steps"]
    assert (
        yaml.safe_load(ok(plugin(cluster, "status", "verbs", "-o", "yaml", "-n", namespace)))[
            "spec"
        ]
        == stored["spec"]
    )

    drawn = ok(plugin(cluster, "status", "verbs", "-o", "mermaid", "-n", namespace))
    assert drawn.splitlines()[:4] == [
        "flowchart TD",
        '    s0["first<br/>Succeeded"]',
        '    s1["second<br/>Succeeded"]',
        "    s0 --> s1",
    ]
    dot = ok(plugin(cluster, "status", "verbs", "-o", "dot", "-n", namespace))
    assert '"first" -> "second";' in dot

    history = json.loads(ok(plugin(cluster, "history", "verbs", "-o", "json", "-n", namespace)))
    assert any(e.get("step") == "second" and e.get("to") == "Succeeded" for e in history)
    family = json.loads(ok(plugin(cluster, "tree", "verbs", "-o", "json", "-n", namespace)))
    assert (family["name"], family["phase"], family["children"]) == ("verbs", "Succeeded", [])

    # logs: the pod of the step's Job is found, and its log read through the API server
    # (pods/log, which the local node serves as a kubelet does).
    logs = plugin(cluster, "logs", "verbs", "first", "-n", namespace, kubeconfig=carol)
    job = step_status(stored, "first")["jobName"]
    assert f"step first attempt 1 of agentrun/verbs: pod {job}-" in logs.stderr
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("hello-from-first\n"), logs.stdout
    assert "has no attempt 2: its attempts are 1 to 1" in fails(
        plugin(cluster, "logs", "verbs", "first", "--attempt", "2", "-n", namespace)
    )
    assert "step 'nope' is not a step of agentrun/verbs (steps: first, second)" in fails(
        plugin(cluster, "logs", "verbs", "nope", "-n", namespace)
    )


def test_version_and_completion_need_no_cluster(cluster: TestCluster) -> None:
    version = ok(plugin(cluster, "--version"))
    assert version == f"kubectl-agentrun {metadata.version('agentrun-operator')}\n"
    assert "complete -F _kubectl_agentrun kubectl-agentrun" in ok(
        plugin(cluster, "completion", "bash")
    )


def plugin_env(cluster: TestCluster) -> dict[str, str]:
    """The environment :func:`tests.support.plugin.kubectl_agentrun` runs kubectl in."""
    env = cluster.env()
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env["PATH"]])
    return env
