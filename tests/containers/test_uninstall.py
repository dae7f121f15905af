"""``helm uninstall`` with runs in the cluster: the chart's pre-delete hook (a Job running the
operator image's ``agentrun release``) deletes the runs and releases the operator's
finalizers, so nothing is left that no one will ever finalize, and the namespace of the runs
can be deleted."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from agentrun.api.models import GROUP, PLURAL, VERSION
from agentrun.settings import JOB_FINALIZER, LABEL_RUN_UID, RUN_FINALIZER
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.chart import RELEASE, apply, installed, operator_pods
from tests.support.docker import Images
from tests.support.helm import Helm
from tests.support.paths import EXAMPLES_DIR
from tests.support.runs import get
from tests.support.waiting import wait_phase, wait_step_phase

NAMESPACE = "agentrun-uninstall"


def test_helm_uninstall_releases_the_runs_and_leaves_no_stuck_finalizer(
    docker_cluster: TestCluster,
    dhelm: Helm,
    dkube: KubeClients,
    images: Images,
    dnamespace: str,
) -> None:
    with installed(dhelm, dkube, images, NAMESPACE) as release:
        done = apply(docker_cluster, dnamespace, EXAMPLES_DIR / "dag-with-retries.yaml")
        wait_phase(dkube, dnamespace, done, "Succeeded", timeout=180)
        gated = apply(docker_cluster, dnamespace, EXAMPLES_DIR / "approval-gate.yaml")
        wait_step_phase(dkube, dnamespace, gated, "restart-service", "WaitingForApproval")
        for name in (done, gated):
            assert RUN_FINALIZER in get(dkube, dnamespace, name)["metadata"]["finalizers"]
        jobs = dkube.batch.list_namespaced_job(dnamespace, label_selector=LABEL_RUN_UID).items
        assert any(JOB_FINALIZER in (j.metadata.finalizers or []) for j in jobs)

        release.run("uninstall", RELEASE, "--wait", "--timeout", "5m")

        runs = dkube.custom.list_namespaced_custom_object(GROUP, VERSION, dnamespace, PLURAL)
        assert runs["items"] == [], "the pre-delete hook left runs behind"
        held = [
            j.metadata.name
            for j in dkube.batch.list_namespaced_job(dnamespace).items
            if JOB_FINALIZER in (j.metadata.finalizers or [])
        ]
        assert held == [], f"Jobs still hold the operator's finalizer: {held}"
        wait_for("the operator pod gone", lambda: not operator_pods(dkube, NAMESPACE), 60)

    dkube.core.delete_namespace(dnamespace)

    def namespace_gone() -> bool:
        try:
            dkube.core.read_namespace(dnamespace)
        except ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(f"namespace {dnamespace} deleted", namespace_gone, timeout=90)
