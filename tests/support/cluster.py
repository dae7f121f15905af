"""Cluster objects tests set up around what they test: namespaces, roles, minted users; and
the types of the session fixtures (tests/conftest.py, tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any, Protocol, TypeVar

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.settings import JOB_FINALIZER, LABEL_RUN_UID, RUN_FINALIZER
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for

_T = TypeVar("_T")

#: The ``kubectl`` fixture: ``kubectl(*args, input=None, check=True) -> CompletedProcess``.
Kubectl = Callable[..., CompletedProcess[str]]

#: Labels of the namespaces tests create.
TEST_LABELS = {"agentrun.dev/test": "true"}

#: Environment of every operator under test: short resync and Job-deletion grace.
OPERATOR_TEST_ENV: dict[str, str] = {
    "AGENTRUN_RESYNC_SECONDS": "5",
    "AGENTRUN_JOB_DELETION_GRACE_SECONDS": "2",
}


class StartOperator(Protocol):
    """The ``start_operator`` fixture of tests/e2e."""

    def __call__(
        self,
        *,
        namespaces: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        kubeconfig: Path | None = None,
        **kwargs: Any,
    ) -> OperatorProcess: ...


def read_or_none(read: Callable[..., _T], *args: Any) -> _T | None:
    """``read(*args)``, or None if the object does not exist (404)."""
    try:
        return read(*args)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


# -- namespaces ---------------------------------------------------------------------------------


def kube_clients(cluster: TestCluster) -> Iterator[KubeClients]:
    """API clients of ``cluster`` for a fixture to yield from; closed at its teardown."""
    clients = KubeClients.from_kubeconfig(cluster.kubeconfig)
    try:
        yield clients
    finally:
        clients.close()


def fresh_namespace(request: pytest.FixtureRequest, kube: KubeClients) -> Iterator[str]:
    """A namespace named after the test, for a fixture to yield from; deleted at its
    teardown."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = create_namespace(kube, f"{base or 't'}-{secrets.token_hex(3)}", labels=TEST_LABELS)
    try:
        yield name
    finally:
        delete_namespace(kube, name)


def create_namespace(
    kube: KubeClients, name: str, *, labels: Mapping[str, str] | None = None
) -> str:
    """Create namespace ``name`` and wait for its ``default`` ServiceAccount (pods need it)."""
    kube.core.create_namespace(body={"metadata": {"name": name, "labels": dict(labels or {})}})
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: read_or_none(kube.core.read_namespaced_service_account, "default", name),
    )
    return name


def delete_namespace(kube: KubeClients, name: str) -> None:
    """Delete namespace ``name`` in the background (gone already is fine)."""
    try:
        kube.core.delete_namespace(name, propagation_policy="Background")
    except ApiException as error:
        if error.status != 404:
            raise


# -- who may do what ------------------------------------------------------------------------------


def user_subject(name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


def service_account_subject(name: str, namespace: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def bind_role(
    kube: KubeClients,
    namespace: str,
    name: str,
    rules: list[dict[str, Any]],
    subjects: Iterable[dict[str, str]],
) -> None:
    """A Role ``name`` with ``rules`` in ``namespace``, and a RoleBinding of it to ``subjects``."""
    kube.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": list(subjects),
        },
    )


def bind_edit(kube: KubeClients, namespace: str, user: str) -> None:
    """A RoleBinding of the built-in ``edit`` ClusterRole to ``user`` in ``namespace`` (the
    ordinary namespace editor of the trust model; agentrun-edit aggregates into it)."""
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{user}-edits"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "edit"},
            "subjects": [user_subject(user)],
        },
    )  # fmt: skip


def editor(
    cluster: TestCluster, kube: KubeClients, namespace: str, user: str, to: Path
) -> KubeClients:
    """Clients of ``user``, given the built-in ``edit`` role in ``namespace``; close them after."""
    bind_edit(kube, namespace, user)
    return KubeClients.from_kubeconfig(mint_user(cluster, user, [], to))


def mint_user(cluster: TestCluster, user: str, groups: Iterable[str], to: Path) -> Path:
    """A client-certificate kubeconfig of ``user`` in ``groups``, copied to ``to`` at once
    (minting the same user again, in another test, overwrites the minted file). Skips the test
    on an external cluster: minting needs the local control plane's CA."""
    if cluster.external:
        pytest.skip("minting user certificates needs the local control plane")
    to.write_bytes(cluster.mint_user_kubeconfig(user, list(groups)).read_bytes())
    return to


# -- the operator's finalizers ----------------------------------------------------------------


def release_finalizers(kube: KubeClients, namespace: str) -> None:
    """Last resort once no operator runs: drop the finalizers of the runs in ``namespace`` and
    of the step Jobs that hold the operator's, so that they and the namespace can go."""
    remove = {"metadata": {"finalizers": None}}
    with contextlib.suppress(ApiException):
        runs = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        for run in runs["items"]:
            kube.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, run["metadata"]["name"], remove
            )
    with contextlib.suppress(ApiException):
        for job in kube.batch.list_namespaced_job(namespace, label_selector=LABEL_RUN_UID).items:
            if JOB_FINALIZER in (job.metadata.finalizers or []):
                kube.batch.patch_namespaced_job(job.metadata.name, namespace, remove)


@contextlib.contextmanager
def foreign_runs_restored(kube: KubeClients, namespace: str) -> Iterator[None]:
    """An operator watching every namespace also puts its finalizer on runs other tests left
    behind (e.g. in namespaces still being deleted); take it off again after the block, which
    stops that operator."""

    def finalized() -> dict[str, tuple[str, str]]:
        items = kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
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
                run = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                left = [f for f in run["metadata"]["finalizers"] if f != RUN_FINALIZER]
                kube.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, name, {"metadata": {"finalizers": left or None}}
                )
