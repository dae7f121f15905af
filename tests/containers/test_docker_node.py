"""The local node's docker runtime, pod by pod: images with their entrypoint and user, the
command/args rules, env, the service-account token at its real path, the termination log as
a real file, security contexts, limits, volumes, probes and restarts."""

from __future__ import annotations

from typing import Any

from agentrun_devcluster.testing import KubeClients
from tests.support.docker import Images
from tests.support.paths import CRD_FILE
from tests.support.pods import (
    RESTRICTED,
    condition,
    container,
    create_pod,
    finished,
    status_of,
    terminated,
    wait_pod,
    waiting,
)


def test_command_replaces_the_entrypoint_and_drops_the_image_cmd(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    # The operator image: ENTRYPOINT ["agentrun"], CMD ["run", "--all-namespaces"], USER 65532.
    script = 'id -u > /dev/termination-log; echo "args: $# $*" >> /dev/termination-log'
    create_pod(dkube, dnamespace, "cmd", [container("main", images.operator, script)])
    pod = finished(dkube, dnamespace, "cmd")
    state = terminated(pod, "main")
    assert state["exitCode"] == 0, state
    assert state["message"] == "65532\nargs: 0 \n"  # no CMD appended after the script
    assert status_of(pod, "main")["imageID"].startswith("docker://sha256:")
    assert status_of(pod, "main")["containerID"].startswith("docker://")


def test_args_replace_the_image_cmd_and_keep_its_entrypoint(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    main = container("main", images.operator, args=["crd", "-o", "/dev/termination-log"])
    create_pod(dkube, dnamespace, "args", [main])
    state = terminated(finished(dkube, dnamespace, "args"), "main")
    assert state["exitCode"] == 0, state
    # `agentrun crd -o FILE` wrote the CRD; a kubelet reports its last 4096 bytes.
    assert state["message"] == CRD_FILE.read_bytes()[-4096:].decode()


def test_env_is_resolved_and_expanded_in_the_command(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    # $(VAR) is the pod's expansion (an undefined one stays as written); $POD is the shell's.
    script = "echo $(GREETING) $POD $KUBERNETES_SERVICE_HOST '$(UNDEFINED)' > /dev/termination-log"
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    create_pod(dkube, dnamespace, "env", [container("main", images.step, script, env=env)])
    state = terminated(finished(dkube, dnamespace, "env"), "main")
    assert state["message"] == "hello env 127.0.0.1 $(UNDEFINED)\n"


IN_CLUSTER = """
import pathlib
from kubernetes import client, config
config.load_incluster_config()
review = client.AuthenticationV1Api().create_self_subject_review(
    {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
)
sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
files = ",".join(sorted(p.name for p in sa.iterdir()))
namespace = (sa / "namespace").read_text()
pathlib.Path("/dev/termination-log").write_text(
    f"{review.status.user_info.username} {namespace} {files}"
)
"""


def test_in_cluster_config_uses_the_token_and_ca_at_the_real_path(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    """The kubernetes client's in-cluster configuration, unchanged: KUBERNETES_SERVICE_HOST
    and _PORT, TLS verified with the mounted ca.crt, authenticated with the mounted token."""
    main = container(
        "main",
        images.operator,
        command=["python3", "-c", IN_CLUSTER],
        terminationMessagePolicy="FallbackToLogsOnError",
        securityContext={**RESTRICTED, "readOnlyRootFilesystem": True},
    )
    create_pod(dkube, dnamespace, "in-cluster", [main])
    state = terminated(finished(dkube, dnamespace, "in-cluster"), "main")
    assert state["exitCode"] == 0, state
    assert state["message"] == (
        f"system:serviceaccount:{dnamespace}:default {dnamespace} ca.crt,namespace,token"
    )


def test_a_missing_image_waits_with_a_message_saying_what_to_do(
    dkube: KubeClients, dnamespace: str
) -> None:
    never = container("main", "agentrun/not-built:1", "true")
    create_pod(dkube, dnamespace, "never", [never])
    pulled = {**never, "imagePullPolicy": "IfNotPresent", "image": "agentrun.invalid/nope:1"}
    create_pod(dkube, dnamespace, "pulled", [pulled])

    def never_pulled(p: dict[str, Any]) -> bool:
        return waiting(p, "main").get("reason") == "ErrImageNeverPull"

    pod = wait_pod(dkube, dnamespace, "never", "ErrImageNeverPull", never_pulled)
    state = waiting(pod, "main")
    assert (
        'Container image "agentrun/not-built:1" is not present with pull policy of Never'
        in (state["message"])
    )
    assert "build or load the image" in state["message"]
    assert pod["status"]["phase"] == "Pending"

    def pull_failed(p: dict[str, Any]) -> bool:
        return waiting(p, "main").get("reason") in ("ErrImagePull", "ImagePullBackOff")

    pod = wait_pod(dkube, dnamespace, "pulled", "ErrImagePull", pull_failed)
    assert 'failed to pull image "agentrun.invalid/nope:1": ' in waiting(pod, "main")["message"]
    assert pod["status"]["phase"] == "Pending"


def test_run_as_non_root_is_checked_against_the_image_user(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    nonroot = {"runAsNonRoot": True}
    # busybox:1.36 runs as root: refused before it starts.
    create_pod(
        dkube, dnamespace, "root", [container("main", images.step, "true")], securityContext=nonroot
    )
    # The operator image runs as 65532 (numeric): allowed without runAsUser.
    script = "id -u > /dev/termination-log"
    create_pod(
        dkube,
        dnamespace,
        "nonroot",
        [container("main", images.operator, script)],
        securityContext=nonroot,
    )

    def refused(p: dict[str, Any]) -> bool:
        state = waiting(p, "main") or terminated(p, "main")
        return state.get("reason") == "CreateContainerConfigError"

    pod = wait_pod(dkube, dnamespace, "root", "CreateContainerConfigError", refused)
    state = waiting(pod, "main") or terminated(pod, "main")
    assert "container has runAsNonRoot and image will run as root" in state["message"]
    ran = terminated(finished(dkube, dnamespace, "nonroot"), "main")
    assert (ran["exitCode"], ran["message"]) == (0, "65532\n")


def test_security_context_and_limits_reach_the_container(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    script = (
        "exec > /dev/termination-log; id; (touch /x 2>/dev/null && echo rw) || echo ro; "
        "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
        "|| cat /sys/fs/cgroup/memory.max"
    )
    main = container(
        "main",
        images.step,
        script,
        securityContext={**RESTRICTED, "readOnlyRootFilesystem": True, "runAsGroup": 3000},
        resources={"limits": {"memory": "64Mi", "cpu": "500m"}, "requests": {"cpu": "100m"}},
    )
    create_pod(
        dkube,
        dnamespace,
        "secured",
        [main],
        securityContext={"runAsUser": 1000, "supplementalGroups": [4000]},
    )
    state = terminated(finished(dkube, dnamespace, "secured"), "main")
    assert state["exitCode"] == 0, state
    lines = state["message"].splitlines()
    assert lines[0].startswith("uid=1000 gid=3000 groups=3000,4000"), lines
    assert lines[1] == "ro"
    assert lines[2].split() == ["CapEff:", "0000000000000000"]
    assert lines[3].split() == ["NoNewPrivs:", "1"]
    assert lines[4] == str(64 * 1024 * 1024)


def test_volumes_init_containers_and_a_termination_message_path_of_its_own(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    dkube.core.create_namespaced_config_map(
        dnamespace, {"metadata": {"name": "cfg"}, "data": {"greeting": "from a configmap"}}
    )
    work = {"name": "work", "mountPath": "/work"}
    init = container(
        "prepare",
        images.step,
        "echo from the init container > /work/note",
        volumeMounts=[work],
        securityContext=RESTRICTED | {"runAsUser": 65532},
    )
    main = container(
        "main",
        images.step,
        "cat /work/note /cfg/greeting > /run/result",
        volumeMounts=[work, {"name": "cfg", "mountPath": "/cfg"}],
        terminationMessagePath="/run/result",
        securityContext=RESTRICTED | {"runAsUser": 65532, "readOnlyRootFilesystem": True},
    )
    create_pod(
        dkube,
        dnamespace,
        "volumes",
        [main],
        initContainers=[init],
        volumes=[{"name": "work", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cfg"}}],
    )
    pod = finished(dkube, dnamespace, "volumes")
    assert terminated(pod, "prepare", init=True)["exitCode"] == 0
    state = terminated(pod, "main")
    assert (state["exitCode"], state["message"]) == (0, "from the init container\nfrom a configmap")


def test_readiness_probe_gates_ready_and_on_failure_restarts(
    images: Images, dkube: KubeClients, dnamespace: str
) -> None:
    # First run: fail. Second run (after the 10 s back-off): become ready after a while.
    script = (
        "if [ ! -f /data/ran ]; then touch /data/ran; echo first > /dev/termination-log; "
        "exit 1; fi; sleep 2; touch /data/ready; sleep 300"
    )
    main = container(
        "main",
        images.step,
        script,
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
        readinessProbe={"exec": {"command": ["test", "-f", "/data/ready"]}, "periodSeconds": 1},
    )
    create_pod(
        dkube,
        dnamespace,
        "restarts",
        [main],
        restartPolicy="OnFailure",
        volumes=[{"name": "data", "emptyDir": {}}],
    )

    def running_again(p: dict[str, Any]) -> bool:
        return status_of(p, "main").get("restartCount") == 1 and "running" in (
            status_of(p, "main").get("state") or {}
        )

    pod = wait_pod(dkube, dnamespace, "restarts", "restarted once", running_again, timeout=60)
    last = status_of(pod, "main")["lastState"]["terminated"]
    assert (last["exitCode"], last["message"]) == (1, "first\n")
    assert pod["status"]["phase"] == "Running"
    ready = wait_pod(
        dkube, dnamespace, "restarts", "Ready", lambda p: condition(p, "Ready") == "True", 30
    )
    assert status_of(ready, "main")["ready"] is True
    assert status_of(ready, "main")["restartCount"] == 1
