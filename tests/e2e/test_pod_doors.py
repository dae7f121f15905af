"""Exec, attach, port-forward and ephemeral containers: doors into a step's pod, and the
``agentrun-pod-doors`` admission policy (manifests/admission/pod-doors-policy.yaml) that shuts
them for all but cluster admins.

Eve holds the built-in ``edit`` role in the namespace, which grants ``create`` on pods/exec,
pods/attach and pods/portforward. A run's step writes its genuine envelope to its termination
log and then waits (for a file the test makes). Every request here is real: a WebSocket
request to the API server, which runs authorization and admission and then proxies it to the
local node (:mod:`agentrun_devcluster.streaming`), which runs the command in the pod's
container.

* Without the policy the door is open: eve execs into the operator's own step pod and
  overwrites its termination log, and the operator commits her envelope as the step's result.
* With the policy her exec, attach and port-forward into the step pod are refused (403, the
  policy's message), and so is adding an ephemeral container (which ``edit`` does not grant in
  Kubernetes 1.37: with a Role that does). The admin (system:masters), and a user granted
  ``create`` on ``agentrun.dev`` ``steppods/exec``, exec into the same pod: the command runs in
  it, so the request was real and the policy is what refused eve. Eve's exec into an ordinary
  pod (a Deployment's, by its name) still works. The step's result is its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward, stream

from agentrun.api import models as m
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.admission import policies_bound_to
from tests.support.cluster import bind_role, editor, user_subject
from tests.support.pods import create_pod, wait_pod
from tests.support.runs import agentrun, create, envelope, step, step_status
from tests.support.waiting import wait_phase, wait_step_phase

EVE = "eve"
POLICY = "agentrun-pod-doors"
STEP = "hold"
CONTAINER = "step"  # agentrun.execution.jobs.CONTAINER_NAME
#: The ordinary pod: named as a Deployment's pod, its ReplicaSet hash looking like hex.
ORDINARY = "web-7d9f8b6c5d-x2k4p"


@pytest.fixture
def eve(
    cluster: TestCluster, kube: KubeClients, namespace: str, tmp_path: Path
) -> Iterator[KubeClients]:
    """A user with the built-in ``edit`` role in the namespace."""
    clients = editor(cluster, kube, namespace, EVE, tmp_path / "e.kubeconfig")
    yield clients
    clients.close()


def node_serves_exec(kube: KubeClients) -> None:
    """Wait until the local node advertises its streaming server (it starts it once the
    cluster signed its serving certificate)."""

    def port() -> int | None:
        nodes = kube.core.list_node().items
        ports = [n.status.daemon_endpoints.kubelet_endpoint.port for n in nodes]
        return next((p for p in ports if p), None)

    wait_for("the local node to serve exec", port, timeout=90)


def exec_in(client: KubeClients, namespace: str, pod: str, command: list[str]) -> str:
    """A real exec (WebSocket, the Python client's v5 then v4 offer): the command's output."""
    out: str = stream(
        client.core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container=CONTAINER if pod != ORDINARY else None,
        command=command,
        stdout=True,
        stderr=True,
        stdin=False,
        tty=False,
    )
    return out


def refusal(door: Callable[[], Any]) -> str | None:
    """What the API server answered a refused request; None if it was let through."""
    try:
        door()
    except ApiException as error:
        # A WebSocket request refused before the upgrade (status 0, the handshake's answer in
        # its reason), or a plain request (its status and body).
        return f"{error.status} {error.reason} {error.body}"
    return None


def refused(door: Callable[[], Any]) -> str:
    """What the API server answered a request that must be refused."""
    answer = refusal(door)
    assert answer is not None, "the request was let through"
    return answer


def by_the_policy(answer: str) -> bool:
    return "403" in answer and POLICY in answer


def held_step_pod(kube: KubeClients, namespace: str, name: str, release: Path, genuine: str) -> str:
    """A run whose step writes ``genuine`` as its envelope and then waits for ``release``;
    the name of the step's pod (the Job controller's, from the operator's Job) once it runs."""
    script = f"{envelope(genuine)}; while [ ! -e {release} ]; do sleep 0.2; done"
    create(kube, namespace, agentrun(name, [step(STEP, script)]))
    run = wait_step_phase(kube, namespace, name, STEP, "Running")
    job = step_status(run, STEP)["jobName"]

    def running_pod() -> str | None:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        up = [p for p in pods if p.status.phase == "Running"]
        return str(up[0].metadata.name) if up else None

    pod: str = wait_for(f"the pod of Job {job} to run", running_pod, timeout=90)
    assert pod.startswith(f"{job}-") and len(pod) == len(job) + 6, (job, pod)
    return pod


def result_of(kube: KubeClients, namespace: str, name: str, release: Path) -> str:
    """Let the step end; the summary the operator committed."""
    release.touch()
    run = wait_phase(kube, namespace, name, "Succeeded")
    return str(step_status(run, STEP)["summary"])


def test_without_the_policy_an_editor_writes_a_running_steps_result(
    kube: KubeClients, namespace: str, operator: OperatorProcess, eve: KubeClients, tmp_path: Path
) -> None:
    node_serves_exec(kube)
    release = tmp_path / "release"
    pod = held_step_pod(kube, namespace, "open-door", release, "genuine")

    out = exec_in(eve, namespace, pod, ["sh", "-c", f"{envelope('forged by eve')}; echo done"])

    assert out == "done\n", out
    assert result_of(kube, namespace, "open-door", release) == "forged by eve"


def proxy_to(clients: KubeClients, namespace: str, target: str) -> Any:
    """A GET through pods/proxy to ``target`` (a pod's name, with a port or scheme)."""
    return clients.core.connect_get_namespaced_pod_proxy(target, namespace)


def test_the_policy_shuts_the_doors_of_a_step_pod_for_all_but_cluster_admins(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    operator: OperatorProcess,
    eve: KubeClients,
    tmp_path: Path,
) -> None:
    node_serves_exec(kube)
    release = tmp_path / "release"
    pod = held_step_pod(kube, namespace, "shut-door", release, "genuine")
    forge = ["sh", "-c", f"{envelope('forged by eve')}; echo done"]

    def eves_exec_refused() -> bool:
        return by_the_policy(refusal(lambda: exec_in(eve, namespace, pod, ["true"])) or "")

    def only(doc: dict[str, Any]) -> bool:
        return bool(doc["metadata"]["name"] == POLICY)

    with policies_bound_to(cluster, namespace, eves_exec_refused, only):
        # exec, attach and port-forward: each a real WebSocket request, refused at admission.
        answer = refused(lambda: exec_in(eve, namespace, pod, forge))
        assert by_the_policy(answer), answer
        assert f"pods/{pod} is named as an agentrun step's pod" in answer, answer
        assert "exec into it is refused" in answer, answer
        assert "agentrun.dev steppods/exec" in answer, answer
        answer = refused(
            lambda: stream(
                eve.core.connect_get_namespaced_pod_attach,
                pod,
                namespace,
                container=CONTAINER,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                _preload_content=False,
            )
        )
        assert by_the_policy(answer) and "attach to it is refused" in answer, answer
        answer = refused(
            lambda: portforward(
                eve.core.connect_get_namespaced_pod_portforward, pod, namespace, ports="8080"
            )
        )
        assert by_the_policy(answer) and "port-forward to it is refused" in answer, answer
        for target in (pod, f"{pod}:8080", f"http:{pod}:8080"):  # pods/proxy, as a name or port
            answer = refused(functools.partial(proxy_to, eve, namespace, target))
            assert by_the_policy(answer) and "proxying to it is refused" in answer, answer

        # An ephemeral container: `edit` does not grant it (Kubernetes 1.37), a Role may.
        debugger = {
            "spec": {
                "ephemeralContainers": [
                    {
                        "name": "debugger",
                        "image": "busybox:1.36",
                        "command": ["sh", "-c", envelope("forged by eve")],
                        "targetContainerName": CONTAINER,
                    }
                ]
            }
        }

        def add_debugger() -> Any:
            return eve.core.patch_namespaced_pod_ephemeralcontainers(pod, namespace, debugger)

        answer = refused(add_debugger)
        assert "403" in answer and "pods/ephemeralcontainers" in answer, answer
        assert POLICY not in answer, answer  # RBAC's refusal
        bind_role(
            kube,
            namespace,
            "debugging",
            [
                {
                    "apiGroups": [""],
                    "resources": ["pods/ephemeralcontainers"],
                    "verbs": ["get", "update", "patch"],
                }
            ],
            [user_subject(EVE)],
        )

        def refused_by_the_policy() -> str | None:
            answer = refused(add_debugger)
            return answer if POLICY in answer else None  # RBAC's, until the Role takes

        answer = wait_for("the debugging Role to take", refused_by_the_policy)
        assert by_the_policy(answer), answer
        assert "adding an ephemeral container to it is refused" in answer, answer

        # The admin passes, and the command runs in the step's pod: the door is real.
        out = exec_in(kube, namespace, pod, ["sh", "-c", 'echo "admin in $HOSTNAME"'])
        assert out == f"admin in {pod}\n", out

        # So does whoever holds create on agentrun.dev steppods/exec, as the message says.
        bind_role(
            kube,
            namespace,
            "step-pod-exec",
            [{"apiGroups": [m.GROUP], "resources": ["steppods/exec"], "verbs": ["create"]}],
            [user_subject(EVE)],
        )
        wait_for(
            "eve's grant to take",
            lambda: exec_in(eve, namespace, pod, ["echo", "granted"]) == "granted\n",
        )
        answer = refused(
            lambda: portforward(
                eve.core.connect_get_namespaced_pod_portforward, pod, namespace, ports="8080"
            )
        )
        assert by_the_policy(answer), answer  # the grant is per door
        kube.rbac.delete_namespaced_role_binding("step-pod-exec", namespace)

        # An ordinary pod is not the policy's: eve's exec into it runs.
        create_pod(
            kube,
            namespace,
            ORDINARY,
            [{"name": "web", "image": "busybox:1.36", "command": ["sleep", "120"]}],
        )
        wait_pod(
            kube,
            namespace,
            ORDINARY,
            "Running",
            lambda p: (p.get("status") or {}).get("phase") == "Running",
        )
        assert exec_in(eve, namespace, ORDINARY, ["echo", "ordinary"]) == "ordinary\n"

        assert result_of(kube, namespace, "shut-door", release) == "genuine"


@pytest.mark.parametrize("role", ["edit", "admin"])
def test_edit_and_admin_may_exec_into_pods_but_not_through_the_policy(
    kube: KubeClients, namespace: str, role: str
) -> None:
    """The door exists for ``edit`` and ``admin`` (RBAC lets them exec, attach and
    port-forward), and neither passes the policy's check (no aggregated role, agentrun-edit
    included where installed, grants ``agentrun.dev`` ``steppods/*``), asked as the policy
    asks: a SubjectAccessReview of ``create`` in the pod's namespace."""
    user = f"{role}-holder"
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [user_subject(user)],
        },
    )
    authz: Any = kube_client.AuthorizationV1Api(kube.api_client)  # as KubeClients types them

    def allowed(group: str, resource: str, subresource: str) -> bool:
        review = authz.create_subject_access_review(
            {
                "spec": {
                    "user": user,
                    "groups": ["system:authenticated"],
                    "resourceAttributes": {
                        "namespace": namespace,
                        "group": group,
                        "resource": resource,
                        "subresource": subresource,
                        "verb": "create",
                    },
                }
            }
        )
        return bool(review.status.allowed)

    assert wait_for(f"the {role} binding to take", lambda: allowed("", "pods", "exec"))
    for door in ("exec", "attach", "portforward"):
        assert allowed("", "pods", door), door
    for door in ("exec", "attach", "portforward", "ephemeralcontainers"):
        assert not allowed(m.GROUP, "steppods", door), door


def test_the_node_serves_exec_over_v4_and_reports_exit_codes(
    kube: KubeClients, namespace: str
) -> None:
    """The local node's streaming server as clients use it: the v4 subprotocol asked for alone
    (passed on by the API server as it came), stdin, and an exit code on the status channel."""
    node_serves_exec(kube)
    create_pod(
        kube,
        namespace,
        "shell",
        [{"name": "sh", "image": "busybox:1.36", "command": ["sleep", "120"]}],
    )
    wait_pod(
        kube,
        namespace,
        "shell",
        "Running",
        lambda p: (p.get("status") or {}).get("phase") == "Running",
    )
    client = stream(
        kube.core.connect_get_namespaced_pod_exec,
        "shell",
        namespace,
        command=["sh", "-c", "read line; echo got $line; echo oops >&2; exit 3"],
        stdout=True,
        stderr=True,
        stdin=True,
        tty=False,
        _preload_content=False,
        _headers={"sec-websocket-protocol": "v4.channel.k8s.io"},
    )
    try:
        assert client.subprotocol == "v4.channel.k8s.io"
        client.write_stdin("hello\n")
        client.run_forever(timeout=30)
        assert client.read_stdout() == "got hello\n"
        assert client.read_stderr() == "oops\n"
        assert client.returncode == 3  # from the Status on channel 3: NonZeroExitCode
    finally:
        client.close()
