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
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.settings import JOB_FINALIZER, LABEL_RUN_UID, RUN_FINALIZER
from agentrun_devcluster import binaries
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agentrun-operator"
DELETION_BOUND = 120.0
"""Seconds a namespace may take to go once nothing stops it (measured times are printed)."""
STUCK_FOR = 15.0
"""Seconds a namespace is shown to stay Terminating while nobody releases the finalizers."""
RELEASE = [sys.executable, "-m", "agentrun.cli", "release"]
PLUGIN = [sys.executable, "-c", "import sys; from agentrun.plugin import main; sys.exit(main())"]

StartOperator = Callable[..., OperatorProcess]


# -- namespaces and runs ----------------------------------------------------------------------


@pytest.fixture
def doomed(kube: KubeClients, crd_installed: list[str]) -> Iterator[str]:
    """A namespace of the test's own, to be deleted by the test. If it is still there at the
    end (the test failed), the operator's finalizers are removed so that it can go."""
    name = f"doomed-{secrets.token_hex(3)}"
    kube.core.create_namespace(
        body={"metadata": {"name": name, "labels": {"agentrun.dev/test": "true"}}}
    )
    wait_for(f"ServiceAccount {name}/default", lambda: _exists(kube, name, "default"))
    yield name
    if namespace_phase(kube, name) is not None:
        _drop_finalizers(kube, name)
        with contextlib.suppress(ApiException):
            kube.core.delete_namespace(name, propagation_policy="Background")


def _exists(kube: KubeClients, namespace: str, account: str) -> bool:
    try:
        kube.core.read_namespaced_service_account(account, namespace)
        return True
    except ApiException as error:
        if error.status == 404:
            return False
        raise


def _drop_finalizers(kube: KubeClients, namespace: str) -> None:
    remove = {"metadata": {"finalizers": None}}
    with contextlib.suppress(ApiException):
        for run in kube.custom.list_namespaced_custom_object(
            m.GROUP, m.VERSION, namespace, m.PLURAL
        )["items"]:
            kube.custom.patch_namespaced_custom_object(
                m.GROUP, m.VERSION, namespace, m.PLURAL, run["metadata"]["name"], remove
            )
    with contextlib.suppress(ApiException):
        for job in kube.batch.list_namespaced_job(namespace, label_selector=LABEL_RUN_UID).items:
            kube.batch.patch_namespaced_job(job.metadata.name, namespace, remove)


def namespace_phase(kube: KubeClients, name: str) -> str | None:
    """The namespace's phase (Active, Terminating), None once it is gone."""
    try:
        return str(kube.core.read_namespace(name).status.phase)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def long_run(name: str) -> dict[str, Any]:
    """Two long steps side by side, and a third after them."""

    def sleeping(step: str, **more: Any) -> dict[str, Any]:
        container = {"image": "busybox:1.36", "command": ["sh", "-c", "sleep 600"]}
        return {"name": step, "container": container, **more}

    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {"name": name},
        "spec": {
            "goal": "run long enough to be deleted with its namespace",
            "plan": {
                "steps": [
                    sleeping("left"),
                    sleeping("right"),
                    sleeping("after", dependsOn=["left", "right"]),
                ]
            },
        },
    }


def start_steps(kube: KubeClients, namespace: str, names: tuple[str, ...] = ("long",)) -> None:
    """Create the runs and wait until each has two step pods running (its Jobs holding the
    operator's finalizer)."""
    for name in names:
        kube.custom.create_namespaced_custom_object(
            m.GROUP, m.VERSION, namespace, m.PLURAL, long_run(name)
        )
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
    time.sleep(STUCK_FOR)
    assert namespace_phase(kube, namespace) == "Terminating"
    assert held(kube, namespace), "nothing holds the namespace: the test shows nothing"


# -- with the operator running ---------------------------------------------------------------


@pytest.mark.parametrize("scope", ["namespaced", "cluster-wide"])
def test_namespace_with_running_steps_is_deleted_while_the_operator_runs(
    kube: KubeClients, doomed: str, start_operator: StartOperator, scope: str
) -> None:
    with foreign_runs_restored(kube, doomed, enabled=scope == "cluster-wide"):
        if scope == "cluster-wide":
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


def render_hook(tmp_path: Path, release: str, *values: str) -> list[dict[str, Any]]:
    """The chart's pre-delete hook objects for release ``release``."""
    home = tmp_path / "helm-home"
    env = {f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA")}
    proc = subprocess.run(
        [str(binaries.helm_binary()), "template", release, str(CHART), "-n", release,
         "--set", f"fullnameOverride={release}", "--set", "admissionPolicies.enabled=false",
         *values],
        capture_output=True, text=True, env={**os.environ, **env}, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)]
    return [
        d
        for d in docs
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"
    ]


def test_the_charts_uninstall_hook_releases_the_watched_namespaces_with_its_own_rights(
    cluster: TestCluster,
    kube: KubeClients,
    doomed: str,
    namespace: str,
    start_operator: StartOperator,
    tmp_path: Path,
) -> None:
    """The hook's Job command, run as the hook's ServiceAccount under the hook's Role (the
    local node runs commands, not the operator image): every run of the watched namespace is
    released, with no refusal; the release's own namespace is the fixture's."""
    release = namespace
    hook = render_hook(tmp_path, release, "--set", f"watchNamespaces={{{doomed}}}")
    kinds = sorted(d["kind"] for d in hook)
    assert kinds == ["Job", "Role", "RoleBinding", "ServiceAccount"], kinds
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


# -- cluster-wide operators in a shared cluster ------------------------------------------------


@contextlib.contextmanager
def foreign_runs_restored(kube: KubeClients, namespace: str, *, enabled: bool) -> Iterator[None]:
    """A cluster-wide operator also puts its finalizer on runs that other tests left in other
    namespaces; take it off again after the block (which stops the operator)."""
    if not enabled:
        yield
        return

    def finalized() -> dict[str, tuple[str, str]]:
        items = kube.custom.list_cluster_custom_object(m.GROUP, m.VERSION, m.PLURAL)["items"]
        return {
            i["metadata"]["uid"]: (i["metadata"]["namespace"], i["metadata"]["name"])
            for i in items
            if i["metadata"]["namespace"] != namespace
            and RUN_FINALIZER in (i["metadata"].get("finalizers") or [])
        }

    before = finalized()
    try:
        yield
    finally:
        for uid, (ns, name) in finalized().items():
            if uid in before:
                continue
            with contextlib.suppress(ApiException):
                run = kube.custom.get_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, name
                )
                left = [f for f in run["metadata"]["finalizers"] if f != RUN_FINALIZER]
                kube.custom.patch_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, name,
                    {"metadata": {"finalizers": left or None}},
                )  # fmt: skip
