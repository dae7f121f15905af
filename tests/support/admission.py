"""The admission policies of manifests/admission, bound to one test's namespace.

Other tests of the session create runs as the admin user and sign approvals with any name, so
the shipped policies are never bound cluster-wide in tests: a test installs copies under names
of its own, bound only to its namespace (by a label), and deletes them afterwards.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from agentrun_devcluster.testing import TestCluster, wait_for

from .paths import ADMISSION_DIR

SCOPE_LABEL = "agentrun.dev/admission-test"
CREATED_BY = "agentrun.dev/created-by"
APPROVERS = "agentrun-approvers"
"""The approver group of the tests' runs (``policy.approverGroups``)."""

Docs = list[dict[str, Any]]


def shipped_policies() -> Docs:
    """The policies and bindings of manifests/admission, as shipped."""
    docs: Docs = []
    for path in sorted(ADMISSION_DIR.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def mutating_only(doc: dict[str, Any]) -> bool:
    """A ``keep`` for :func:`policies_bound_to`: only the agentrun-identity policy, which
    records who created and last changed a run, and none of the validating policies (what the
    operator must hold on its own is tested with this)."""
    return bool(doc["kind"].startswith("Mutating"))


def scoped_copies(namespace: str, keep: Callable[[dict[str, Any]], bool] | None = None) -> Docs:
    """The shipped policies and bindings (those ``keep`` keeps, all by default), renamed
    ``<name>-<namespace>``, the bindings restricted to the namespace labelled
    ``SCOPE_LABEL=namespace``."""
    out = []
    for doc in shipped_policies():
        if keep is not None and not keep(doc):
            continue
        doc["metadata"]["name"] = f"{doc['metadata']['name']}-{namespace}"
        if doc["kind"].endswith("Binding"):
            doc["spec"]["policyName"] = f"{doc['spec']['policyName']}-{namespace}"
            doc["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {SCOPE_LABEL: namespace}}
            }
        out.append(doc)
    return out


@contextlib.contextmanager
def policies_bound_to(
    cluster: TestCluster,
    namespace: str,
    enforced: Callable[[], bool],
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> Iterator[Docs]:
    """Apply :func:`scoped_copies` for ``namespace`` (those ``keep`` keeps), wait until
    ``enforced()`` (policies take a moment to act), and delete them again afterwards."""
    docs = scoped_copies(namespace, keep)
    assert docs, f"{ADMISSION_DIR} holds no policies"
    cluster.kubectl("label", "namespace", namespace, f"{SCOPE_LABEL}={namespace}")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        wait_for(f"the admission policies to act on {namespace}", enforced, timeout=60)
        yield docs
    finally:
        # The validating policies go first, and the mutating one only once they no longer
        # act: the API server drops deleted policies a moment later each, and a validating
        # policy still acting without the mutating one refuses every change of a run's spec
        # (its rule j wants the last-modified-by the mutating policy writes).
        validating = [d for d in docs if d["kind"].startswith("Validating")]
        _delete(cluster, validating)
        # Bounded, and never raised from here: a teardown must not hide the test's own error
        # (a namespace already going refuses the probe for good).
        with contextlib.suppress(TimeoutError):
            if validating:
                wait_for(
                    f"the validating policies to stop acting on {namespace}",
                    _hand_set_identity_admitted(cluster, namespace),
                    timeout=30,
                )
        _delete(cluster, [d for d in docs if d not in validating])


def _delete(cluster: TestCluster, docs: Docs) -> None:
    for doc in reversed(docs):
        cluster.kubectl(
            "delete", f"{doc['kind'].lower()}.admissionregistration.k8s.io",
            doc["metadata"]["name"], "--ignore-not-found", "--wait=false", check=False,
        )  # fmt: skip


def _hand_set_identity_admitted(cluster: TestCluster, namespace: str) -> Callable[[], bool]:
    """Whether a dry-run create of a run carrying a last-modified-by set by hand is admitted:
    the agentrun-approvals policy refuses it while it acts (rule j)."""
    probe = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "probe", "annotations": {"agentrun.dev/last-modified-by": "x"}},
        "spec": {
            "goal": "probe the admission policies",
            "plan": {"steps": [{"name": "probe", "container": {"image": "busybox:1.36"}}]},
        },
    }

    def admitted() -> bool:
        proc = cluster.kubectl(
            "-n", namespace, "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(probe), check=False,
        )  # fmt: skip
        return proc.returncode == 0

    return admitted


def creator_recorded(
    cluster: TestCluster, namespace: str, kubeconfig: Path | None = None
) -> Callable[[], bool]:
    """An ``enforced`` check for :func:`policies_bound_to`: a dry-run create of a run in
    ``namespace`` (as ``kubeconfig``'s user, else the admin) comes back with its creator
    recorded by the mutating policy."""
    probe = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "probe"},
        "spec": {
            "goal": "probe the admission policies",
            "plan": {"steps": [{"name": "probe", "container": {"image": "busybox:1.36"}}]},
        },
    }

    def recorded() -> bool:
        proc = cluster.kubectl(
            "-n", namespace, "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(probe), kubeconfig=kubeconfig, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            return False
        annotations = json.loads(proc.stdout)["metadata"].get("annotations") or {}
        return bool(annotations.get(CREATED_BY))

    return recorded
