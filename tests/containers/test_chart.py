"""The install path of a platform team, with real containers: ``helm install`` of the chart
with the locally built operator image, the operator pod Ready by its readiness probe, runs
carried to Succeeded by step pods from real images, ``helm test``, every example in a
namespace that enforces the restricted Pod Security Standard, and ``helm upgrade``.

The tests share one release (module fixture); the last one upgrades it."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.settings import LABEL_RUN_UID, LABEL_STEP
from agentrun_devcluster.agent_demo import SCRIPT as AGENT_SCRIPT
from agentrun_devcluster.dockerapi import DockerEngine
from agentrun_devcluster.modelserver import ScriptedModel, reply
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.chart import (
    EXAMPLES,
    RELEASE,
    RESTRICTED_LABELS,
    Release,
    apply,
    installed,
    operator_pods,
    ready_operator_pod,
    waiting_steps,
)
from tests.support.cluster import TEST_LABELS, create_namespace, delete_namespace
from tests.support.docker import Images
from tests.support.helm import Helm
from tests.support.paths import CHART, EXAMPLES_DIR
from tests.support.plugin import kubectl_agentrun as plugin
from tests.support.pods import as_dict, status_of, terminated
from tests.support.runs import get, step_status
from tests.support.runs import status_of as run_status
from tests.support.waiting import wait_phase

SYSTEM_NAMESPACE = "agentrun-system"


@pytest.fixture(scope="module")
def release(
    docker_cluster: TestCluster, dhelm: Helm, dkube: KubeClients, images: Images
) -> Iterator[Release]:
    with installed(dhelm, dkube, images, SYSTEM_NAMESPACE) as r:
        yield r


@pytest.fixture
def restricted(dkube: KubeClients) -> Iterator[str]:
    """A fresh namespace labelled pod-security.kubernetes.io/enforce=restricted."""
    labels = {**TEST_LABELS, **RESTRICTED_LABELS}
    name = create_namespace(dkube, f"restricted-{secrets.token_hex(3)}", labels=labels)
    yield name
    delete_namespace(dkube, name)


def image_id(engine: DockerEngine, image: str) -> str:
    found = engine.image(image)
    assert found is not None, f"{image} is not in the local engine"
    return f"docker://{found['Id']}"


def test_the_operator_pod_runs_the_image_as_the_chart_says(
    release: Release, dkube: KubeClients, engine: DockerEngine, images: Images
) -> None:
    pod = ready_operator_pod(dkube, SYSTEM_NAMESPACE)  # Ready: its readiness probe passed
    status = status_of(pod, "operator")
    assert status["ready"] and status["started"] and status["restartCount"] == 0, status
    assert status["imageID"] == image_id(engine, images.operator)
    labels = {"io.kubernetes.pod.uid": pod["metadata"]["uid"]}
    found = engine.containers({**labels, "io.kubernetes.container.name": "operator"})
    assert len(found) == 1, found
    inspected = engine.inspect(str(found[0]["Id"]))
    assert inspected is not None
    config, host = inspected["Config"], inspected["HostConfig"]
    # The image's entrypoint with the chart's args; the pod's user; the chart's hardening.
    assert inspected["Path"] == "agentrun" and inspected["Args"] == ["run", "--all-namespaces"]
    assert config["User"] == "65532:65532"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == 512 * 2**20 and host["NanoCpus"] == 10**9
    mounts = {m["Destination"]: m for m in inspected["Mounts"]}
    token = mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
    assert token["RW"] is False
    assert mounts["/tmp"]["RW"] is True and "/dev/termination-log" in mounts
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert not [k for k in env if k.startswith("AGENTRUN_SERVICEACCOUNT")], env


def test_an_example_run_succeeds_with_step_pods_from_the_step_image(
    release: Release,
    docker_cluster: TestCluster,
    dkube: KubeClients,
    dnamespace: str,
    engine: DockerEngine,
    images: Images,
) -> None:
    name = apply(docker_cluster, dnamespace, EXAMPLES_DIR / "incident-investigation.yaml")
    run = wait_phase(dkube, dnamespace, name, "Succeeded", timeout=180)
    assert run_status(run)["progress"] == "3/3"
    # The second step's result reached the third through an input: real env in real pods.
    suspect = json.loads(step_status(run, "correlate-deploys")["result"])
    assert suspect == {"suspect": "checkout-v2.14"}
    assert step_status(run, "write-report")["result"] == (
        "Likely cause - checkout-v2.14. Suggest a rollback."
    )
    uid = run["metadata"]["uid"]
    pods = dkube.core.list_namespaced_pod(dnamespace, label_selector=f"{LABEL_RUN_UID}={uid}")
    step_pods = [as_dict(dkube, p) for p in pods.items]
    assert len(step_pods) == 3, [p["metadata"]["name"] for p in step_pods]
    busybox = image_id(engine, images.step)
    for pod in step_pods:
        status = status_of(pod, "step")
        assert status["image"] == images.step and status["imageID"] == busybox, status
        assert status["containerID"].startswith("docker://")
        assert terminated(pod, "step")["reason"] == "Completed"


def test_helm_test_passes(release: Release) -> None:
    proc = release.run("test", RELEASE, "--timeout", "3m", check=False)
    assert proc.returncode == 0, f"helm test failed\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Phase:          Succeeded" in proc.stdout


def test_pod_security_admission_enforces_the_restricted_standard(
    dkube: KubeClients, restricted: str
) -> None:
    loose: dict[str, Any] = {
        "metadata": {"name": "loose"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    }
    with pytest.raises(ApiException) as refused:
        dkube.core.create_namespaced_pod(restricted, loose, dry_run="All")
    assert refused.value.status == 403
    message = json.loads(refused.value.body or "{}").get("message", "")
    assert 'violates PodSecurity "restricted:latest"' in message


AGENT_EXAMPLE = "agent-investigation"
SCRIPTS = {
    AGENT_EXAMPLE: list(AGENT_SCRIPT),
    "agent-question": [reply("Paris is the capital of France.")],
    # Its tracker is not here: the model answers without calling the HTTP tools, which still
    # puts the executor (holding the tools' header Secret) in the restricted namespace.
    "agent-http-tool": [reply("T-7 is not a duplicate of another ticket; it stays open.")],
    # A ModelConfig, an Agent and a run of it (spec.agentRef): the run takes the Agent on its
    # first pass, in the restricted namespace, then asks the model once.
    "agent-ref": [reply("Paris is the capital of France.")],
}
"""What the scripted model answers, per agent example."""
SECRETS = {"agent-http-tool": ("tracker", {"token": "Bearer container-suite"})}
"""Secrets an example names, made before it is applied."""
ANSWER_ONLY = {"agent-question", "agent-http-tool", "agent-ref"}
"""Examples whose run only asks the model, on the run's executor: its pod may be gone once
the run has ended (the executor's Job goes with the run's end), leaving no pod to look at."""
STALL_SECONDS = 90
"""A run whose status does not change for this long has stalled (the operator is stuck)."""


@pytest.mark.parametrize(
    "example",
    [pytest.param(path, id=path.stem) for path in EXAMPLES],
)
def test_every_example_runs_in_a_restricted_namespace(
    example: Path,
    release: Release,
    docker_cluster: TestCluster,
    dkube: KubeClients,
    restricted: str,
    request: pytest.FixtureRequest,
) -> None:
    # An agent's model: the scripted one of `make demo-agent`, on the host (pods share its
    # network here).
    script = SCRIPTS.get(example.stem, [])
    model = ScriptedModel(script=list(script)).start()
    request.addfinalizer(model.stop)
    if example.stem in SECRETS:
        secret, data = SECRETS[example.stem]
        dkube.core.create_namespaced_secret(
            restricted, {"metadata": {"name": secret}, "stringData": data}
        )
    name = apply(docker_cluster, restricted, example, model.base_url)
    approved: list[str] = []
    last = ("", time.monotonic())

    def succeeded() -> bool:
        nonlocal last
        run = get(dkube, restricted, name)
        status = run_status(run)
        assert status.get("phase") not in ("Failed", "Cancelled"), status
        if run["metadata"]["resourceVersion"] != last[0]:
            last = (run["metadata"]["resourceVersion"], time.monotonic())
        assert time.monotonic() - last[1] < STALL_SECONDS, f"no progress: {status}"
        for step in waiting_steps(run):
            if step not in approved:
                proc = plugin(docker_cluster, "approve", name, step, "-n", restricted,
                              "--reason", "container suite")  # fmt: skip
                assert proc.returncode == 0, proc.stderr
                approved.append(step)
        return status.get("phase") == "Succeeded"

    wait_for(f"{example.name} Succeeded in {restricted}", succeeded, timeout=300, interval=1)
    # Every step attempt (model turns and tool calls too) ran as a container; only the first
    # attempt of flaky-lookup (which fails on purpose) failed. The pods of model turns made
    # ahead that the run did not need go once it ended.
    expected = ["flaky-lookup"] if example.stem == "dag-with-retries" else []

    def unsucceeded() -> list[str]:
        listed = dkube.core.list_namespaced_pod(restricted, label_selector=LABEL_RUN_UID).items
        pods = [as_dict(dkube, p) for p in listed]
        assert pods or example.stem in ANSWER_ONLY
        for pod in pods:
            for status in pod["status"].get("containerStatuses") or []:
                if "containerID" not in status and "waiting" in (status.get("state") or {}):
                    # Not created yet: a later turn's pod made ahead, going as the run ended.
                    continue
                assert str(status.get("containerID")).startswith("docker://"), status
        return [
            p["metadata"]["labels"][LABEL_STEP] for p in pods if p["status"]["phase"] != "Succeeded"
        ]

    with contextlib.suppress(TimeoutError):  # the assertion below says which did not
        wait_for("the run's pods to end", lambda: unsucceeded() == expected, timeout=120)
    failed = unsucceeded()
    assert failed == expected, failed
    if example.stem == "approval-gate":
        assert approved == ["restart-service"]
    if example.stem == AGENT_EXAMPLE:
        assert len(approved) == 1 and approved[0].endswith("-restart-service"), approved
    if example.stem == "agent-ref":
        taken = run_status(get(dkube, restricted, name))["agent"]["definition"]
        assert (taken["agent"]["name"], taken["modelConfig"]["name"]) == ("answerer", "small")
        assert taken["spec"]["maxTurns"] == 1  # the run's override, which the Agent allows
    assert len(model.completions()) == len(script)


def test_helm_upgrade_replaces_the_operator_pod_and_it_keeps_reconciling(
    release: Release, docker_cluster: TestCluster, dkube: KubeClients, dnamespace: str
) -> None:
    before = ready_operator_pod(dkube, SYSTEM_NAMESPACE)["metadata"]["uid"]
    release.run("upgrade", RELEASE, str(CHART), "--reuse-values", "--wait",
                "--timeout", "5m", "--set", "operator.resyncSeconds=15")  # fmt: skip
    after = ready_operator_pod(dkube, SYSTEM_NAMESPACE)
    assert after["metadata"]["uid"] != before
    env = {e["name"]: e.get("value") for e in after["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_RESYNC_SECONDS"] == "15"
    assert len(operator_pods(dkube, SYSTEM_NAMESPACE)) == 1
    name = apply(docker_cluster, dnamespace, EXAMPLES_DIR / "dag-with-retries.yaml")
    run = wait_phase(dkube, dnamespace, name, "Succeeded", timeout=180)
    assert run_status(run)["progress"] == "4/4"
    assert step_status(run, "flaky-lookup")["attempt"] == 2
