"""A namespace with running steps can always be deleted: with the operator running (whose
janitor finishes what kopf no longer watches once the namespace is terminating), with the
operator down until it comes back, and after an uninstall (``agentrun release``, by hand or as
the Helm chart's pre-delete hook, with no operator at all).

Each test deletes a namespace of its own (not the fixture's ``namespace``) and measures how long
the namespace takes to go: ``pytest -s`` prints it. The local control plane runs the namespace
controller (kube-controller-manager), so a namespace is really removed once nothing in it holds
a finalizer.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.settings import JOB_FINALIZER, LABEL_RUN_UID, RUN_FINALIZER
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.cluster import (
    TEST_LABELS,
    StartOperator,
    create_namespace,
    foreign_runs_restored,
    read_or_none,
    release_finalizers,
)
from tests.support.helm import Docs, Helm, hooks
from tests.support.runs import agentrun, create, step
from tests.support.waiting import assert_holds

DELETION_BOUND = 120.0
"""Seconds a namespace may take to go once nothing stops it (measured times are printed)."""
STUCK_FOR = 15.0
"""Seconds a namespace is shown to stay Terminating while nobody releases the finalizers."""
RELEASE = [sys.executable, "-m", "agentrun.cli", "release"]
PLUGIN = [
    sys.executable,
    "-c",
    "import sys; from agentrun.clients.plugin import main; sys.exit(main())",
]


# -- namespaces and runs ----------------------------------------------------------------------


@pytest.fixture
def doomed(kube: KubeClients, crd_installed: list[str]) -> Iterator[str]:
    """A namespace of the test's own, to be deleted by the test. If it is still there at the
    end (the test failed), the operator's finalizers are removed so that it can go."""
    name = create_namespace(kube, f"doomed-{secrets.token_hex(3)}", labels=TEST_LABELS)
    yield name
    if namespace_phase(kube, name) is not None:
        release_finalizers(kube, name)
        with contextlib.suppress(ApiException):
            kube.core.delete_namespace(name, propagation_policy="Background")


def namespace_phase(kube: KubeClients, name: str) -> str | None:
    """The namespace's phase (Active, Terminating), None once it is gone."""
    found = read_or_none(kube.core.read_namespace, name)
    return None if found is None else str(found.status.phase)


def long_run(name: str) -> dict[str, Any]:
    """Two long steps side by side, and a third after them."""
    steps = [
        step("left", "sleep 600"),
        step("right", "sleep 600"),
        step("after", "sleep 600", after=["left", "right"]),
    ]
    return agentrun(name, steps, goal="run long enough to be deleted with its namespace")


def start_steps(kube: KubeClients, namespace: str, names: tuple[str, ...] = ("long",)) -> None:
    """Create the runs and wait until each has two step pods running (its Jobs holding the
    operator's finalizer)."""
    for name in names:
        create(kube, namespace, long_run(name))
    want = 2 * len(names)

    def running() -> bool:
        jobs = kube.batch.list_namespaced_job(namespace, label_selector=LABEL_RUN_UID).items
        held = [j for j in jobs if JOB_FINALIZER in (j.metadata.finalizers or [])]
        pods = kube.core.list_namespaced_pod(namespace, label_selector=LABEL_RUN_UID).items
        return len(held) == want and sum(p.status.phase == "Running" for p in pods) == want

    wait_for(f"{want} step pods running in {namespace}", running, timeout=120)


def held(kube: KubeClients, namespace: str) -> list[str]:
    """What in the namespace still carries one of the operator's finalizers."""
    runs = kube.custom.list_namespaced_custom_object(m.GROUP, m.VERSION, namespace, m.PLURAL)
    jobs = kube.batch.list_namespaced_job(namespace, label_selector=LABEL_RUN_UID).items
    return [
        *(
            f"agentrun/{r['metadata']['name']}"
            for r in runs["items"]
            if RUN_FINALIZER in (r["metadata"].get("finalizers") or [])
        ),
        *(f"job/{j.metadata.name}" for j in jobs if JOB_FINALIZER in (j.metadata.finalizers or [])),
    ]


def delete_and_time(kube: KubeClients, namespace: str, what: str) -> float:
    """Delete the namespace (if not yet) and wait until it is gone; the seconds it took."""
    start = time.monotonic()
    with contextlib.suppress(ApiException):
        kube.core.delete_namespace(namespace)
    wait_for(
        f"namespace {namespace} to be gone ({what})",
        lambda: namespace_phase(kube, namespace) is None,
        timeout=DELETION_BOUND,
        interval=0.5,
    )
    took = time.monotonic() - start
    print(f"namespace deleted in {took:.1f}s ({what})")
    return took


def assert_stuck(kube: KubeClients, namespace: str) -> None:
    """The namespace stays Terminating while nobody releases the operator's finalizers."""
    kube.core.delete_namespace(namespace)

    def stuck() -> None:
        assert namespace_phase(kube, namespace) == "Terminating"
        assert held(kube, namespace), "nothing holds the namespace: the test shows nothing"

    assert_holds(stuck, seconds=STUCK_FOR)


# -- with the operator running ---------------------------------------------------------------


@pytest.mark.parametrize("scope", ["namespaced", "cluster-wide"])
def test_namespace_with_running_steps_is_deleted_while_the_operator_runs(
    kube: KubeClients, doomed: str, start_operator: StartOperator, scope: str
) -> None:
    cluster_wide = scope == "cluster-wide"
    with foreign_runs_restored(kube, doomed) if cluster_wide else contextlib.nullcontext():
        if cluster_wide:
            operator = start_operator(namespaces=[], all_namespaces=True)
        else:
            operator = start_operator(namespaces=[doomed])
        try:
            start_steps(kube, doomed)
            delete_and_time(kube, doomed, f"operator running, {scope}")
            assert operator.alive(), operator.logs()
        finally:
            operator.stop()


# -- with the operator down, then back -------------------------------------------------------


def test_namespace_deleted_while_the_operator_is_down_goes_when_it_comes_back(
    kube: KubeClients, doomed: str, start_operator: StartOperator
) -> None:
    operator = start_operator(namespaces=[doomed])
    start_steps(kube, doomed)
    operator.kill()
    assert_stuck(kube, doomed)
    operator.start()
    delete_and_time(kube, doomed, "operator started again after the namespace was deleted")


# -- uninstalled: agentrun release -----------------------------------------------------------


@pytest.mark.parametrize("command", ["agentrun", "kubectl-agentrun"])
def test_release_without_an_operator_releases_everything(
    cluster: TestCluster,
    kube: KubeClients,
    doomed: str,
    start_operator: StartOperator,
    command: str,
) -> None:
    operator = start_operator(namespaces=[doomed])
    start_steps(kube, doomed, ("first", "second"))
    operator.kill()
    assert held(kube, doomed)

    argv = [*(RELEASE if command == "agentrun" else [*PLUGIN, "release"]), "-n", doomed]
    proc = subprocess.run(
        [*argv, f"--kubeconfig={cluster.kubeconfig}"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert f"deleted agentrun {doomed}/first" in proc.stdout, proc.stdout
    assert f"released agentrun {doomed}/second" in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().endswith("deleted 2 runs; released 2 runs and 0 step Jobs")

    assert held(kube, doomed) == []
    assert not kube.custom.list_namespaced_custom_object(m.GROUP, m.VERSION, doomed, m.PLURAL)[
        "items"
    ]
    # What the runs owned goes as well (the Jobs once the Job controller saw them deleted).
    assert not kube.core.list_namespaced_config_map(doomed, label_selector=LABEL_RUN_UID).items
    wait_for(
        "the step Jobs to be gone",
        lambda: not kube.batch.list_namespaced_job(doomed, label_selector=LABEL_RUN_UID).items,
        timeout=60,
    )
    # Nothing left to release: a second release finds nothing, and the namespace goes.
    again = subprocess.run(
        [*argv, f"--kubeconfig={cluster.kubeconfig}"], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"{doomed}: deleted 0 runs; released 0 runs and 0 step Jobs"
    delete_and_time(kube, doomed, f"after `{command} release`, no operator")


def test_release_of_a_namespace_already_terminating(
    cluster: TestCluster, kube: KubeClients, doomed: str, start_operator: StartOperator
) -> None:
    operator = start_operator(namespaces=[doomed])
    start_steps(kube, doomed)
    operator.kill()
    assert_stuck(kube, doomed)
    proc = subprocess.run(
        [*RELEASE, "-n", doomed, f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert f"released agentrun {doomed}/long" in proc.stdout, proc.stdout
    delete_and_time(kube, doomed, "Terminating, then `agentrun release`, no operator")


# -- uninstalled: the Helm chart's pre-delete hook ---------------------------------------------


def render_hook(helm: Helm, release: str, *values: str) -> Docs:
    """The chart's pre-delete hook objects for release ``release``."""
    docs = helm.template(
        "--set", f"fullnameOverride={release}", "--set", "admissionPolicies.enabled=false",
        *values, release=release, namespace=release,
    )  # fmt: skip
    return hooks(docs, "pre-delete")


def test_the_charts_uninstall_hook_releases_the_watched_namespaces_with_its_own_rights(
    cluster: TestCluster,
    kube: KubeClients,
    doomed: str,
    namespace: str,
    start_operator: StartOperator,
    helm: Helm,
) -> None:
    """The hook's Job command, run as the hook's ServiceAccount under the hook's Role (the
    local node runs commands, not the operator image): every run of the watched namespace is
    released, with no refusal; the release's own namespace is the fixture's."""
    release = namespace
    hook = render_hook(helm, release, "--set", f"watchNamespaces={{{doomed}}}")
    kinds = sorted(d["kind"] for d in hook)
    # Two Roles: the release's in the watched namespace, and the one that lets the hook's
    # first container stop the operator (in the release's namespace).
    assert kinds == ["Job", "Role", "Role", "RoleBinding", "RoleBinding", "ServiceAccount"], kinds
    (job,) = (d for d in hook if d["kind"] == "Job")
    rbac = [d for d in hook if d["kind"] != "Job"]
    for doc in rbac:
        assert doc["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"
    assert job["metadata"]["annotations"]["helm.sh/hook-weight"] == "0"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"{release}-release"
    (container,) = pod["containers"]
    assert container["command"] == ["agentrun"]
    assert container["args"] == ["release", "--namespace", doomed]

    operator = start_operator(namespaces=[doomed])
    start_steps(kube, doomed)
    operator.kill()

    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    token = cluster.mint_serviceaccount_kubeconfig(release, f"{release}-release")
    proc = subprocess.run(
        [sys.executable, "-m", "agentrun.cli", *container["args"], f"--kubeconfig={token}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "403" not in proc.stdout + proc.stderr
    assert f"released agentrun {doomed}/long" in proc.stdout, proc.stdout
    assert held(kube, doomed) == []
    delete_and_time(kube, doomed, "after the chart's uninstall hook, no operator")
