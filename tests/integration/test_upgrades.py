"""Upgrades and several installs, on a control plane of their own (docs/configuration.md,
"Upgrades and several installs").

* The documented CRD upgrade command, run verbatim from the repository after a real
  ``helm install`` of an older CRD: a plain server-side apply meets Helm's field manager, the
  documented one takes the fields over as ``agentrun-crds``, and runs again cleanly.
* The cluster-wide admission policies, installed once: two releases in two namespaces both
  install (the second leaves the first's policies alone), the policies outlive the release
  that installed them, and a release after ``kubectl apply -f manifests/admission/`` installs.

These tests install the CRD and cluster-wide policies from nothing, so they start their own
etcd and API server (the session cluster other tests share keeps its CRD and runs no
policies); with ``AGENTRUN_TEST_KUBECONFIG`` (someone else's cluster) they skip, saying so.
The operator pod is not run (``replicaCount=0``; the local node runs commands, not images).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.binaries import resolve_bin_dir
from agentrun_devcluster.controlplane import ControlPlane, wait_established
from agentrun_devcluster.testing import TEST_KUBECONFIG_ENV, wait_for
from tests.support.helm import Helm
from tests.support.paths import CHART, CRD_FILE, MANIFESTS, REPO_ROOT

CRD_NAME = "agentruns.agentrun.dev"
UPGRADE_COMMAND = (
    "kubectl apply --server-side --force-conflicts --field-manager=agentrun-crds "
    "-f charts/agentrun-operator/crds/"
)
"""The CRD upgrade as docs/configuration.md, the chart's README and its notes give it."""
POLICIES = [
    ("mutatingadmissionpolicies", "agentrun-identity"),
    ("mutatingadmissionpolicybindings", "agentrun-identity"),
    ("validatingadmissionpolicies", "agentrun-approvals"),
    ("validatingadmissionpolicybindings", "agentrun-approvals"),
    ("validatingadmissionpolicies", "agentrun-job-pods"),
    ("validatingadmissionpolicybindings", "agentrun-job-pods"),
    ("validatingadmissionpolicies", "agentrun-pod-doors"),
    ("validatingadmissionpolicybindings", "agentrun-pod-doors"),
]
KEEP = "helm.sh/resource-policy"


class Cluster:
    """A fresh control plane, kubectl and helm against it."""

    def __init__(self, control_plane: ControlPlane, helm: Helm) -> None:
        self.control_plane = control_plane
        self.helm = helm

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as a user types it in the repository's root."""
        proc = subprocess.run(
            [str(self.control_plane.kubectl), *args],
            input=input,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=self.control_plane.env(),
            timeout=120,
        )
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc

    def get(self, *args: str) -> dict[str, Any] | None:
        proc = self.kubectl(
            "get", *args, "-o", "json", "--ignore-not-found", "--show-managed-fields"
        )
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    def namespace(self, name: str) -> str:
        self.kubectl("create", "namespace", name)
        return name

    def install(self, release: str, namespace: str, *args: str, chart: Path = CHART) -> str:
        """``helm install`` without an operator pod or uninstall hook; returns its notes."""
        self.helm.run(
            "install", release, str(chart), "-n", namespace, "--wait", "--timeout", "2m",
            "--set", "replicaCount=0", "--set", "uninstall.releaseRuns=false", *args,
        )  # fmt: skip
        return self.notes(release, namespace)

    def notes(self, release: str, namespace: str) -> str:
        status = self.helm.run("status", release, "-n", namespace, "-o", "json").stdout
        notes: str = json.loads(status)["info"]["notes"]
        return notes

    def manifest_kinds(self, release: str, namespace: str) -> list[str]:
        out = self.helm.run("get", "manifest", release, "-n", namespace).stdout
        return [d["kind"] for d in yaml.safe_load_all(out) if isinstance(d, dict)]

    def policies(self) -> dict[str, dict[str, Any] | None]:
        return {f"{kind}/{name}": self.get(kind, name) for kind, name in POLICIES}


@pytest.fixture(scope="module")
def fresh(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.environ.get(TEST_KUBECONFIG_ENV):
        pytest.skip(
            "needs a control plane of its own: it installs the CRD and the cluster-wide "
            f"admission policies from nothing, which {TEST_KUBECONFIG_ENV}'s cluster may hold"
        )
    control_plane = ControlPlane(resolve_bin_dir())
    control_plane.start()
    try:
        home = tmp_path_factory.mktemp("helm-home")
        yield Cluster(control_plane, Helm(helm_binary, home, control_plane.kubeconfig))
    finally:
        control_plane.stop()


def older_chart(to: Path) -> Path:
    """The chart as an earlier release shipped it: its CRD without the ``-o wide`` columns,
    and with another description of spec.goal."""
    chart = to / "agentrun-operator"
    shutil.copytree(CHART, chart, symlinks=False)  # files/admission: the files themselves
    crd_file = chart / "crds" / CRD_FILE.name
    crd = yaml.safe_load(crd_file.read_text())
    (version,) = crd["spec"]["versions"]
    version["additionalPrinterColumns"] = [
        c for c in version["additionalPrinterColumns"] if not c.get("priority")
    ]
    goal = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["goal"]
    goal["description"] = "What the run is for (as an earlier release described it)."
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def forged(fresh: Cluster, namespace: str) -> str | None:
    """Create a run whose approval names someone else than its creator; the API server's
    refusal, or None (after deleting the run) if it was accepted."""
    run = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "forged", "namespace": namespace},
        "spec": {
            "goal": "an approval signed by someone else",
            "plan": {"steps": [{"name": "a", "container": {"image": "busybox:1.36"}}]},
            "approvals": [
                {"step": "a", "decision": "approve", "argsHash": "0" * 64, "by": "mallory"}
            ],
        },
    }
    proc = fresh.kubectl("create", "-f", "-", input=json.dumps(run), check=False)
    if proc.returncode == 0:
        fresh.kubectl("-n", namespace, "delete", "agentrun", "forged", "--wait=false")
        return None
    return proc.stderr


def managers(obj: dict[str, Any]) -> set[str]:
    return {e["manager"] for e in obj["metadata"].get("managedFields") or []}


# -- the documented command -------------------------------------------------------------------


def test_the_docs_give_the_upgrade_command_that_is_tested() -> None:
    for doc in (
        REPO_ROOT / "docs" / "configuration.md",
        CHART / "README.md",
    ):
        text = " ".join(doc.read_text().split())
        assert UPGRADE_COMMAND in text, f"{doc.relative_to(REPO_ROOT)} lost the command"
        assert "kubectl apply --server-side -f charts" not in text, doc
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert UPGRADE_COMMAND.replace("agentrun-operator", "{{ .Chart.Name }}") in notes


def test_crd_upgrade_after_helm_install(fresh: Cluster, tmp_path: Path) -> None:
    namespace = fresh.namespace("crd-upgrade")
    old = older_chart(tmp_path)
    fresh.install("agentrun", namespace, "--set", "admissionPolicies.enabled=false", chart=old)
    installed = fresh.get("crd", CRD_NAME)
    assert installed is not None and "helm" in managers(installed), managers(installed or {})
    assert "agentrun-crds" not in managers(installed)

    # What the docs said before: Helm owns the fields, and every changed one conflicts.
    plain = fresh.kubectl(
        "apply", "--server-side", "-f", "charts/agentrun-operator/crds/", check=False
    )
    assert plain.returncode != 0, plain.stdout
    assert "conflict" in plain.stderr.lower() and '"helm"' in plain.stderr, plain.stderr

    # The documented command, word for word.
    program, *args = UPGRADE_COMMAND.split()
    assert program == "kubectl"
    proc = fresh.kubectl(*args)
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME} serverside-applied" in (
        proc.stdout
    ), proc.stdout
    upgraded = fresh.get("crd", CRD_NAME)
    assert upgraded is not None
    want = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]
    (live,) = upgraded["spec"]["versions"]
    assert live["additionalPrinterColumns"] == want["additionalPrinterColumns"]
    assert live["schema"] == want["schema"]
    assert "agentrun-crds" in managers(upgraded), managers(upgraded)
    wait_established(fresh.control_plane.kubectl, fresh.control_plane.kubeconfig, CRD_NAME)

    # Again (the next upgrade, or the same one twice), and Helm carries on upgrading the rest.
    fresh.kubectl(*args)
    fresh.helm.run(
        "upgrade", "agentrun", str(CHART), "-n", namespace, "--wait", "--timeout", "2m",
        "--set", "replicaCount=0", "--set", "uninstall.releaseRuns=false",
        "--set", "admissionPolicies.enabled=false",
    )  # fmt: skip
    again = fresh.get("crd", CRD_NAME)
    assert again is not None and again["spec"]["versions"][0]["schema"] == want["schema"]
    wide = fresh.kubectl("get", "agentruns", "-A", "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    fresh.helm.run("uninstall", "agentrun", "-n", namespace, "--wait")


# -- the admission policies, once per cluster ----------------------------------------------------


def test_chart_renders_the_policies_as_the_manifests_with_keep(helm: Helm) -> None:
    rendered = [
        d for d in helm.template() if d["kind"].endswith(("AdmissionPolicy", "PolicyBinding"))
    ]
    files = [
        d
        for path in sorted((MANIFESTS / "admission").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    ]
    for doc in rendered:
        assert doc["metadata"]["annotations"] == {KEEP: "keep"}, doc["metadata"]
        del doc["metadata"]["annotations"]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(rendered, key=key) == sorted(files, key=key)


def test_admission_policies_are_installed_once_per_cluster(fresh: Cluster) -> None:
    first, second = fresh.namespace("team-a"), fresh.namespace("team-b")

    notes = fresh.install("agentrun-a", first)
    policies = fresh.policies()
    for name, obj in policies.items():
        assert obj is not None, f"{name} not installed"
        annotations = obj["metadata"]["annotations"]
        assert annotations["meta.helm.sh/release-name"] == "agentrun-a", name
        assert annotations["meta.helm.sh/release-namespace"] == first, name
        assert annotations[KEEP] == "keep", name
    assert "already installed" not in notes, notes

    # A second release in another namespace installs, and leaves them to the first.
    notes = fresh.install("agentrun-b", second)
    assert "ValidatingAdmissionPolicy agentrun-approvals was already installed by Helm " in (
        " ".join(notes.split())
    ), notes
    assert f"release agentrun-a in namespace {first}" in notes, notes
    kinds = fresh.manifest_kinds("agentrun-b", second)
    assert not [k for k in kinds if "Admission" in k], kinds
    assert "Deployment" in kinds
    fresh.helm.run(
        "upgrade", "agentrun-b", str(CHART), "-n", second, "--wait", "--timeout", "2m",
        "--set", "replicaCount=0", "--set", "uninstall.releaseRuns=false",
    )  # fmt: skip
    # The first release upgrades its own copy.
    fresh.helm.run(
        "upgrade", "agentrun-a", str(CHART), "-n", first, "--wait", "--timeout", "2m",
        "--set", "replicaCount=0", "--set", "uninstall.releaseRuns=false",
    )  # fmt: skip
    assert [k for k in fresh.manifest_kinds("agentrun-a", first) if "Admission" in k]

    # Uninstalling the release that installed them keeps them, in force: the other release
    # relies on them (an approval signed by someone else than the admin who adds it).
    fresh.helm.run("uninstall", "agentrun-a", "-n", first, "--wait")
    assert all(obj is not None for obj in fresh.policies().values()), fresh.policies()
    refused = wait_for(
        "the approval policy to refuse a forged approval", lambda: forged(fresh, second)
    )
    assert "agentrun-approvals" in refused, refused
    # kubectl applies over a copy a release installed.
    fresh.kubectl("apply", "-f", "manifests/admission/")
    fresh.helm.run("uninstall", "agentrun-b", "-n", second, "--wait")
    assert all(obj is not None for obj in fresh.policies().values())

    # The kubectl path first, then a release: it installs, and leaves them to kubectl.
    for kind, name in POLICIES:
        fresh.kubectl("delete", kind, name)
    fresh.kubectl("apply", "-f", "manifests/admission/")
    third = fresh.namespace("team-c")
    notes = fresh.install("agentrun-c", third)
    assert "was already installed by kubectl (outside Helm)" in notes, notes
    kinds = fresh.manifest_kinds("agentrun-c", third)
    assert not [k for k in kinds if "Admission" in k], kinds
    for name, obj in fresh.policies().items():
        assert obj is not None, name
        annotations = obj["metadata"].get("annotations") or {}
        assert "meta.helm.sh/release-name" not in annotations, (name, annotations)
    fresh.helm.run("uninstall", "agentrun-c", "-n", third, "--wait")
    assert all(obj is not None for obj in fresh.policies().values())
