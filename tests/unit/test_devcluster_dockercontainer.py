"""The local node's docker runtime without an engine: the container config it asks Docker
for (agentrun_devcluster.dockercontainer), volumes, probes, the engine client's stream
format, and how the runtime is chosen."""

from __future__ import annotations

import http.server
import os
import stat
import struct
import threading
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from agentrun_devcluster.dockerapi import DockerError, demux, engine_from_env
from agentrun_devcluster.dockercontainer import (
    LIFECYCLE_CALLS,
    NODE_LABEL,
    NODE_PID_LABEL,
    DockerRuntime,
    container_user,
    create_config,
    parse_quantity,
)
from agentrun_devcluster.node import select_runtime
from agentrun_devcluster.podenv import ConfigError
from agentrun_devcluster.ports import lease_ports
from agentrun_devcluster.probes import probe_once, resolve_port
from agentrun_devcluster.process import ProcessRuntime
from agentrun_devcluster.runtime import PodContext, RuntimeUnavailable
from agentrun_devcluster.serviceaccount import ServiceAccountVolume
from agentrun_devcluster.volumes import PodVolumes

POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": {}}


def pod_with(**spec: Any) -> dict[str, Any]:
    return {**POD, "spec": spec}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512Mi", 512 * 2**20),
        ("1", 1),
        ("100m", Fraction(1, 10)),
        ("1.5", Fraction(3, 2)),
        ("2G", 2 * 10**9),
        ("1e3", 1000),
        ("64Ki", 65536),
    ],
)
def test_quantities(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown suffix"):
        parse_quantity("5Qi")


# -- the user -------------------------------------------------------------------------------------


def test_user_is_the_image_s_unless_the_pod_says_otherwise() -> None:
    c = {"name": "c"}
    assert container_user(POD, c, "65532:65532") == "65532:65532"
    assert container_user(POD, c, "") == ""
    assert container_user(pod_with(securityContext={"runAsUser": 1000}), c, "65532:65532") == "1000"
    both = pod_with(securityContext={"runAsUser": 1000, "runAsGroup": 3000})
    assert container_user(both, c, "65532:65532") == "1000:3000"
    group_only = pod_with(securityContext={"runAsGroup": 3000})
    assert container_user(group_only, c, "nonroot") == "nonroot:3000"
    assert container_user(group_only, c, "") == "0:3000"
    # The container's context wins over the pod's.
    own = {"name": "c", "securityContext": {"runAsUser": 7}}
    assert container_user(pod_with(securityContext={"runAsUser": 1000}), own, "") == "7"


@pytest.mark.parametrize(
    ("image_user", "run_as_user", "message"),
    [
        ("", None, "container has runAsNonRoot and image will run as root"),
        ("root", None, "container has runAsNonRoot and image will run as root"),
        ("0:0", None, "container has runAsNonRoot and image will run as root"),
        (
            "nonroot",
            None,
            "container has runAsNonRoot and image has non-numeric user (nonroot), cannot verify "
            "user is non-root",
        ),
        ("65532", 0, "container's runAsUser breaks non-root policy"),
    ],
)
def test_run_as_non_root_is_checked(image_user: str, run_as_user: int | None, message: str) -> None:
    context: dict[str, Any] = {"runAsNonRoot": True}
    if run_as_user is not None:
        context["runAsUser"] = run_as_user
    with pytest.raises(ConfigError) as error:
        container_user(pod_with(securityContext=context), {"name": "c"}, image_user)
    assert str(error.value) == f'{message} (pod: "p_ns(u-1)", container: c)'


def test_run_as_non_root_passes_for_a_numeric_non_root_user() -> None:
    pod = pod_with(securityContext={"runAsNonRoot": True})
    assert container_user(pod, {"name": "c"}, "65532:65532") == "65532:65532"
    assert container_user(pod, {"name": "c", "securityContext": {"runAsUser": 5}}, "") == "5"


# -- the container config -------------------------------------------------------------------------


def config(container: dict[str, Any], pod: dict[str, Any] = POD, **env: str) -> dict[str, Any]:
    return create_config(
        image="img:1",
        pod=pod,
        container={"name": "c", **container},
        user="",
        env=env,
        mounts=[],
        labels={"l": "v"},
    )


def test_command_replaces_the_entrypoint_and_args_the_cmd() -> None:
    neither = config({})
    assert "Entrypoint" not in neither and "Cmd" not in neither
    command_only = config({"command": ["sh", "-c", "echo $(A)"]}, A="x")
    assert command_only["Entrypoint"] == ["sh", "-c", "echo x"]
    assert "Cmd" not in command_only  # the engine then drops the image's CMD
    args_only = config({"args": ["--flag", "$(A)", "$$(A)"]}, A="x")
    assert "Entrypoint" not in args_only and args_only["Cmd"] == ["--flag", "x", "$(A)"]
    both = config({"command": ["a"], "args": ["b"], "workingDir": "/w"})
    assert (both["Entrypoint"], both["Cmd"], both["WorkingDir"]) == (["a"], ["b"], "/w")


def test_env_network_and_labels() -> None:
    c = config({}, A="1", B="two words")
    assert c["Env"] == ["A=1", "B=two words"]
    assert c["HostConfig"]["NetworkMode"] == "host"
    assert c["Labels"] == {"l": "v"}


def test_security_context_and_resources() -> None:
    container = {
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        },
        "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}, "requests": {"cpu": "250m"}},
    }
    pod = pod_with(
        securityContext={
            "supplementalGroups": [4000],
            "fsGroup": 2000,
            "seccompProfile": {"type": "Unconfined"},
        }
    )
    host = config(container, pod)["HostConfig"]
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == ["NET_BIND_SERVICE"]
    assert host["SecurityOpt"] == ["no-new-privileges", "seccomp=unconfined"]
    assert host["GroupAdd"] == ["4000", "2000"]
    assert (host["Memory"], host["NanoCpus"], host["CpuShares"]) == (64 * 2**20, 5 * 10**8, 256)


def test_runtime_default_seccomp_is_the_engine_default_and_localhost_is_refused() -> None:
    default = {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
    assert "SecurityOpt" not in config(default)["HostConfig"]
    local = {"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "x"}}}
    with pytest.raises(ConfigError, match="seccompProfile Localhost is not supported"):
        config(local)


# -- the engine client and the choice of runtime --------------------------------------------------


def test_demux_joins_the_frames_of_a_multiplexed_stream() -> None:
    def frame(stream: int, data: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(data)) + data

    assert demux(frame(1, b"out ") + frame(2, b"err ") + frame(1, b"out")) == b"out err out"
    assert demux(b"plain tty output") == b"plain tty output"


def test_auto_falls_back_to_processes_without_an_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    runtime, why = select_runtime("auto", tmp_path)
    assert isinstance(runtime, ProcessRuntime)
    assert why.startswith("--runtime auto: no Docker engine (the Docker engine at unix://")
    with pytest.raises(RuntimeUnavailable, match="--runtime docker: the Docker engine at"):
        select_runtime("docker", tmp_path)
    assert select_runtime("process", tmp_path)[1] == "--runtime process"
    with pytest.raises(RuntimeUnavailable, match="expected one of process, docker, auto"):
        select_runtime("podman", tmp_path)


def test_docker_host_with_tls_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DockerError, match="only unix:// and tcp:// without TLS"):
        engine_from_env({"DOCKER_HOST": "tcp://h:2376", "DOCKER_TLS_VERIFY": "1"})
    assert engine_from_env({}).socket_path == "/var/run/docker.sock"
    assert engine_from_env({"DOCKER_HOST": "tcp://h:2375"}).address == "tcp://h:2375"


# -- probes ---------------------------------------------------------------------------------------


@pytest.fixture
def http_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 500)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def no_exec(argv: list[str], timeout: float) -> tuple[int, bytes]:
    raise AssertionError("no exec expected")


def test_http_and_tcp_probes_by_port_number_or_name(http_server: int) -> None:
    c = {"name": "c", "ports": [{"name": "healthz", "containerPort": http_server}]}
    assert resolve_port("healthz", c) == http_server
    ok, detail = probe_once(
        {"httpGet": {"path": "/healthz", "port": "healthz"}}, c, "127.0.0.1", no_exec
    )
    assert ok, detail
    ok, detail = probe_once(
        {"httpGet": {"path": "/other", "port": http_server}}, c, "127.0.0.1", no_exec
    )
    assert not ok and detail.endswith(": 500")
    assert probe_once({"tcpSocket": {"port": http_server}}, c, "127.0.0.1", no_exec)[0]
    with lease_ports(1) as closed:  # leased and never bound: connections are refused
        assert not probe_once({"tcpSocket": {"port": closed.port}}, c, "127.0.0.1", no_exec)[0]
    assert not probe_once({"tcpSocket": {"port": "nope"}}, c, "127.0.0.1", no_exec)[0]


def test_exec_and_grpc_probes() -> None:
    def run(argv: list[str], timeout: float) -> tuple[int, bytes]:
        return (0 if argv == ["true"] else 1), b"said something"

    c = {"name": "c"}
    assert probe_once({"exec": {"command": ["true"]}}, c, "127.0.0.1", run)[0]
    ok, detail = probe_once({"exec": {"command": ["false"]}}, c, "127.0.0.1", run)
    assert not ok and detail == "exec ['false']: exit code 1: said something"
    ok, detail = probe_once({"grpc": {"port": 1}}, c, "127.0.0.1", run)
    assert not ok and "not supported" in detail


# -- volumes --------------------------------------------------------------------------------------


def volumes(tmp_path: Path, spec_volumes: list[dict[str, Any]]) -> PodVolumes:
    data = {("ConfigMap", "cfg"): {"a": "alpha", "b": "beta"}}
    pod = {**POD, "spec": {"volumes": spec_volumes}}
    token = ServiceAccountVolume(
        api=None,  # type: ignore[arg-type]  # not asked for a token here
        pod=pod,
        directory=tmp_path / "sa",
        lookup=lambda kind, name: data.get((kind, name)),
        service_host="127.0.0.1",
        service_port="6443",
        cluster_ca=b"",
    )
    return PodVolumes(
        pod,
        tmp_path,
        lookup=lambda kind, name: data.get((kind, name)),
        token_volume=token,
        node_name="n",
        node_ip="127.0.0.1",
    )


def test_empty_dir_config_map_and_downward_api_become_bind_mounts(tmp_path: Path) -> None:
    v = volumes(
        tmp_path,
        [
            {"name": "scratch", "emptyDir": {}},
            {
                "name": "cfg",
                "configMap": {"name": "cfg", "items": [{"key": "b", "path": "x/b", "mode": 0o600}]},
            },
            {
                "name": "info",
                "downwardAPI": {
                    "items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
                },
            },
        ],
    )
    mounts = v.mounts(
        {
            "volumeMounts": [
                {"name": "scratch", "mountPath": "/s"},
                {"name": "cfg", "mountPath": "/c"},
                {"name": "info", "mountPath": "/i", "readOnly": True},
                {"name": "scratch", "mountPath": "/sub", "subPath": "deep/er"},
            ]
        }
    )
    root = tmp_path / "volumes"
    assert mounts == [
        {"Type": "bind", "Source": str(root / "scratch"), "Target": "/s", "ReadOnly": False},
        {"Type": "bind", "Source": str(root / "cfg"), "Target": "/c", "ReadOnly": True},
        {"Type": "bind", "Source": str(root / "info"), "Target": "/i", "ReadOnly": True},
        {
            "Type": "bind",
            "Source": str(root / "scratch/deep/er"),
            "Target": "/sub",
            "ReadOnly": False,
        },
    ]
    assert stat.S_IMODE(os.stat(root / "scratch").st_mode) == 0o777
    assert (root / "cfg/x/b").read_text() == "beta" and not (root / "cfg/a").exists()
    assert stat.S_IMODE(os.stat(root / "cfg/x/b").st_mode) == 0o600
    assert (root / "info/name").read_text() == "p"
    v.remove()
    assert not root.exists()


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        ({"configMap": {"name": "missing"}}, 'configmap "missing" not found'),
        ({"configMap": {"name": "cfg", "items": [{"key": "zz"}]}}, "couldn't find key zz"),
        (
            {"persistentVolumeClaim": {"claimName": "x"}},
            "persistentVolumeClaim volumes are not supported",
        ),
        (
            {"projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
            "projected serviceAccountToken",
        ),
    ],
)
def test_what_cannot_be_mounted_is_a_config_error(
    tmp_path: Path, volume: dict[str, Any], message: str
) -> None:
    v = volumes(tmp_path, [{"name": "v", **volume}])
    with pytest.raises(ConfigError, match=message):
        v.mounts({"volumeMounts": [{"name": "v", "mountPath": "/v"}]})


def test_optional_sources_that_are_missing_mount_empty(tmp_path: Path) -> None:
    v = volumes(tmp_path, [{"name": "v", "secret": {"secretName": "gone", "optional": True}}])
    [mount] = v.mounts({"volumeMounts": [{"name": "v", "mountPath": "/v"}]})
    assert list(Path(mount["Source"]).iterdir()) == []


# -- containers left behind -----------------------------------------------------------------------


class FakeEngine:
    def __init__(self, containers: list[dict[str, Any]]) -> None:
        self.listed = containers
        self.removed: list[str] = []

    def containers(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [c for c in self.listed if all(c["Labels"].get(k) == v for k, v in labels.items())]

    def remove(self, container: str) -> None:
        self.removed.append(container)


def test_a_starting_node_removes_what_dead_nodes_left(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    alive, dead = str(os.getpid()), "999999999"

    def made_by(state: Path, pid: str) -> dict[str, str]:
        return {NODE_LABEL: str(state), NODE_PID_LABEL: pid}

    engine = FakeEngine(
        [
            {"Id": "previous-node-here", "Labels": made_by(mine, dead)},
            {"Id": "other-node-running", "Labels": made_by(other, alive)},
            {"Id": "other-node-killed", "Labels": made_by(other, dead)},
            {"Id": "state-dir-removed", "Labels": made_by(tmp_path / "gone", alive)},
            {"Id": "not-ours", "Labels": {}},
        ]
    )
    runtime = DockerRuntime(engine, str(mine))  # type: ignore[arg-type]
    runtime.start()
    assert engine.removed == ["previous-node-here", "other-node-killed", "state-dir-removed"]
    engine.removed.clear()
    engine.listed.append({"Id": "mine-running", "Labels": made_by(mine, alive)})
    runtime.stop()
    assert engine.removed == ["previous-node-here", "mine-running"]


class SlowEngine:
    """Counts the lifecycle calls in flight; each takes a moment."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.removed: list[str] = []

    def logs(self, container: str) -> bytes:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        threading.Event().wait(0.05)
        with self.lock:
            self.in_flight -= 1
        return b""

    def remove(self, container: str) -> None:
        with self.lock:
            self.removed.append(container)


def test_a_node_has_a_few_container_lifecycle_calls_in_flight_at_once(tmp_path: Path) -> None:
    engine = SlowEngine()
    runtime = DockerRuntime(engine, str(tmp_path))  # type: ignore[arg-type]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
    ctx = PodContext(pod, tmp_path, "node", {}, "127.0.0.1", "6443", mock.Mock(), mock.Mock())
    containers = []
    for i in range(4 * LIFECYCLE_CALLS):
        c = runtime.container({"name": f"c{i}", "image": "busybox:1.36"}, "container", ctx)
        c.container_id, c._removed = f"id-{i}", False
        containers.append(c)
    threads = [threading.Thread(target=c._save_logs_and_remove) for c in containers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(engine.removed) == sorted(c.container_id for c in containers)
    assert engine.most == LIFECYCLE_CALLS, "as many as allowed, never more"
