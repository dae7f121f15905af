"""In-cluster API access from pods: the service-account token volume.

The local node materializes the projected ``kube-api-access-*`` volume the ServiceAccount
admission plugin adds (a bound token, the cluster CA, the namespace) and exports
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``, so a pod talks to the API server as
its ServiceAccount, as on a real node. Pods that opt out of automounting get none of it.

The commands are ``python3 -c`` scripts that also run in a real ``python`` image: they read
the token from the usual mount path (the local node maps that path to its per-pod
directory) and write what they found to the termination log.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support import jobs
from tests.support.cluster import bind_role, service_account_subject
from tests.support.jobs import TIMEOUT, run_job

IMAGE = "python:3.12-alpine"  # ignored by the local node; real on kind
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"

# Reads ConfigMap $CM_NAME with the pod's token, tries a list it is not allowed, asks the
# API server who it is, and reports all of it (plus the namespace file) as JSON.
READ_CONFIGMAP = f"""
import json, os, ssl, urllib.error, urllib.request
sa = os.environ.get("AGENTRUN_SERVICEACCOUNT_DIR", "{SA_PATH}")
token = open("{SA_PATH}/token").read().strip()
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
base = "https://" + host + ":" + port
ns = open(sa + "/namespace").read().strip()
def call(path, body=None):
    req = urllib.request.Request(
        base + path, headers={{"Authorization": "Bearer " + token,
        "Content-Type": "application/json"}},
        data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, None
status, cm = call("/api/v1/namespaces/" + ns + "/configmaps/" + os.environ["CM_NAME"])
list_status, _ = call("/api/v1/namespaces/" + ns + "/configmaps")
_, review = call("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                 {{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}})
user = (review or {{}}).get("status", {{}}).get("userInfo", {{}})
out = {{"status": status, "data": (cm or {{}}).get("data"), "namespace": ns,
       "list_status": list_status, "username": user.get("username"),
       "pod_name": (user.get("extra") or {{}}).get("authentication.kubernetes.io/pod-name")}}
open("/dev/termination-log", "w").write(json.dumps(out))
"""

# Decodes the claims of the token at the usual mount path.
TOKEN_CLAIMS = f"""
import base64, json
token = open("{SA_PATH}/token").read().strip()
payload = token.split(".")[1]
claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
out = {{"aud": claims.get("aud"), "lifetime": claims["exp"] - claims["iat"],
       "pod": claims.get("kubernetes.io", {{}}).get("pod", {{}}).get("name")}}
open("/dev/termination-log", "w").write(json.dumps(out))
"""

# Reports which of the API-access variables it got and whether a token is at the mount path.
NO_ACCESS = """
printf '%s|%s|%s' "${AGENTRUN_SERVICEACCOUNT_DIR-unset}" "${KUBERNETES_SERVICE_HOST-unset}" \
  "$(test -e /var/run/secrets/kubernetes.io/serviceaccount/token && echo token || echo none)" \
  > /dev/termination-log
"""


def job_manifest(name: str, command: list[str], **options: Any) -> dict[str, Any]:
    """A Job of the ``python`` image (the scripts here need python3 on a real cluster)."""
    return jobs.job_manifest(name, command, image=IMAGE, **options)


def succeeded(term: Any) -> Any:
    """The parsed JSON termination message of a container that exited 0."""
    assert term.exit_code == 0, f"{term.reason} ({term.exit_code}): {term.message}"
    return json.loads(term.message)


def pod_state_dir(cluster: TestCluster, pod: Any) -> Path | None:
    """The local node's directory of ``pod`` (None on an external cluster)."""
    if cluster.node is None:
        return None
    meta = pod.metadata
    return cluster.node.state_dir / "pods" / f"{meta.namespace}_{meta.name}_{meta.uid}"


def create_reader(kube: KubeClients, namespace: str, name: str, **sa_fields: Any) -> None:
    """ServiceAccount ``name`` allowed only to ``get`` ConfigMap ``greeting``."""
    kube.core.create_namespaced_service_account(
        namespace, {"metadata": {"name": name}, **sa_fields}
    )
    rules = [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["greeting"],
         "verbs": ["get"]},
    ]  # fmt: skip
    bind_role(kube, namespace, name, rules, [service_account_subject(name, namespace)])


def test_pod_reads_a_configmap_with_its_serviceaccount_token(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    create_reader(kube, namespace, "reader")
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "greeting"}, "data": {"hello": "from the API"}}
    )
    pod, term = run_job(
        kube,
        namespace,
        job_manifest(
            "reads-cm",
            ["python3", "-c", READ_CONFIGMAP],
            service_account="reader",
            env=[{"name": "CM_NAME", "value": "greeting"}],
        ),
    )
    out = succeeded(term)
    assert out["status"] == 200, out
    assert out["data"] == {"hello": "from the API"}
    assert out["namespace"] == namespace
    # It is the ServiceAccount (not the node's admin identity), with a token bound to the pod.
    assert out["list_status"] == 403, out
    assert out["username"] == f"system:serviceaccount:{namespace}:reader"
    assert out["pod_name"] == [pod.metadata.name]

    assert any((v.name or "").startswith("kube-api-access-") for v in pod.spec.volumes or []), (
        "the ServiceAccount admission plugin added no token volume"
    )
    pod_dir = pod_state_dir(cluster, pod)
    if pod_dir is not None:
        # The local node unmounts the volume once the pod's processes are gone.
        wait_for(
            "the pod's serviceaccount dir to be removed",
            lambda: not (pod_dir / "serviceaccount").exists(),
            timeout=30,
        )


def test_token_volume_honours_audience_expiration_and_mount_path(
    kube: KubeClients, namespace: str
) -> None:
    create_reader(kube, namespace, "reader")
    volume = {
        "name": "kube-api-access-custom",
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": "agentrun-test",
                        "expirationSeconds": 900,
                        "path": "token",
                    }
                }
            ]
        },
    }
    mount = {"name": "kube-api-access-custom", "mountPath": SA_PATH, "readOnly": True}
    pod, term = run_job(
        kube,
        namespace,
        job_manifest(
            "custom-token",
            ["python3", "-c", TOKEN_CLAIMS],
            service_account="reader",
            volumes=[volume],
            mounts=[mount],
        ),
    )
    out = succeeded(term)
    assert out["aud"] == ["agentrun-test"]
    assert out["lifetime"] == 900
    assert out["pod"] == pod.metadata.name


@pytest.mark.parametrize("opt_out", ["pod", "serviceaccount"])
def test_pod_without_automount_gets_no_api_access(
    cluster: TestCluster, kube: KubeClients, namespace: str, opt_out: str
) -> None:
    if opt_out == "pod":
        create_reader(kube, namespace, "reader")
        job = job_manifest("no-token", ["sh", "-c", NO_ACCESS], automount=False)
        job["spec"]["template"]["spec"]["serviceAccountName"] = "reader"
    else:
        create_reader(kube, namespace, "reader", automountServiceAccountToken=False)
        job = job_manifest("no-token", ["sh", "-c", NO_ACCESS], service_account="reader")
    pod, term = run_job(kube, namespace, job)
    assert term.exit_code == 0, term.message
    sa_dir, host, token = term.message.split("|")
    assert sa_dir == "unset"
    assert token == "none"
    assert not any((v.name or "").startswith("kube-api-access-") for v in pod.spec.volumes or [])
    if not cluster.external:
        assert host == "unset"  # a kubelet sets it for every pod; the local node does not
        pod_dir = pod_state_dir(cluster, pod)
        assert pod_dir is not None and not (pod_dir / "serviceaccount").exists()


def test_missing_serviceaccount_token_is_a_config_error_not_a_crash(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """A token request the API refuses (here: the node asks for an audience-bound token of a
    ServiceAccount deleted after admission) fails the container with a clear reason."""
    if cluster.external:
        pytest.skip("a real kubelet keeps the pod in ContainerCreating instead")
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "short-lived"}})
    # Admission needs the ServiceAccount to exist; delete it once the pod is admitted but
    # before the node starts it (the pod is gated, so nothing binds it yet).
    pod_body = {
        "metadata": {"name": "orphan"},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "short-lived",
            "schedulingGates": [{"name": "agentrun.dev/test"}],
            "containers": [{"name": "main", "image": IMAGE, "command": ["true"]}],
        },
    }
    kube.core.create_namespaced_pod(namespace, pod_body)
    try:
        kube.core.delete_namespaced_service_account("short-lived", namespace)
    except ApiException as e:
        if e.status != 404:
            raise
    kube.core.patch_namespaced_pod("orphan", namespace, {"spec": {"schedulingGates": None}})

    def terminated() -> Any:
        pod = kube.core.read_namespaced_pod("orphan", namespace)
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.terminated:
                return cs.state.terminated
        return None

    term = wait_for("the orphan pod's container to fail", terminated, TIMEOUT)
    assert term.reason == "CreateContainerConfigError"
    assert "short-lived" in term.message and "404" in term.message, term.message


def test_token_file_decodes_as_a_jwt_bound_to_the_pod(
    cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    """The node writes the token where AGENTRUN_SERVICEACCOUNT_DIR points, next to ca.crt."""
    if cluster.external:
        pytest.skip("AGENTRUN_SERVICEACCOUNT_DIR is the local node's")
    script = (
        'cat "$AGENTRUN_SERVICEACCOUNT_DIR/token" > /dev/termination-log; '
        'grep -q "BEGIN CERTIFICATE" "$AGENTRUN_SERVICEACCOUNT_DIR/ca.crt"'
    )
    pod, term = run_job(kube, namespace, job_manifest("token-file", ["sh", "-c", script]))
    assert term.exit_code == 0, term.message
    payload = term.message.strip().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{namespace}:default"
    assert claims["kubernetes.io"]["pod"] == {"name": pod.metadata.name, "uid": pod.metadata.uid}
