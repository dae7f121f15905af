"""A network partition between a process and the API server (agentrun_devcluster.partition):
the kubeconfig the partitioned process gets, its command line, the operator process in a
partition, and (as root, with ``ip``) a real partition cut and healed in each direction, its
management address reachable throughout."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from agentrun_devcluster.operator import OperatorError, OperatorProcess
from agentrun_devcluster.partition import (
    SERVICE_NAME,
    Partition,
    PartitionError,
    partition_unavailable,
    redirect_kubeconfig,
)

# -- the kubeconfig and the names, without root ------------------------------------------------


def _kubeconfig(path: Path, server: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://elsewhere:6443"}},
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": "Q0E="},
            },
        ],
        "users": [{"name": "admin", "user": {"client-certificate": "certs/admin.crt"}}],
        "contexts": [{"name": "admin@local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "admin@local",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_copied_kubeconfig_names_only_the_current_cluster_anew(tmp_path: Path) -> None:
    source = _kubeconfig(tmp_path / "admin.kubeconfig", "https://127.0.0.1:6443")
    dest = redirect_kubeconfig(
        source, tmp_path / "out" / "copy.kubeconfig", f"https://{SERVICE_NAME}:5000"
    )
    doc: dict[str, Any] = yaml.safe_load(dest.read_text())
    clusters = {c["name"]: c["cluster"] for c in doc["clusters"]}
    assert clusters["local"] == {
        "server": "https://kubernetes.default.svc:5000",
        "certificate-authority-data": "Q0E=",
    }
    assert clusters["other"] == {"server": "https://elsewhere:6443"}
    assert doc["current-context"] == "admin@local"
    # A relative file reference would point elsewhere from the copy's directory.
    assert doc["users"][0]["user"]["client-certificate"] == str(tmp_path / "certs/admin.crt")
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert yaml.safe_load(source.read_text())["clusters"][1]["cluster"]["server"] == (
        "https://127.0.0.1:6443"
    )


def test_a_kubeconfig_without_clusters_cannot_be_copied(tmp_path: Path) -> None:
    source = tmp_path / "empty.kubeconfig"
    source.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(ValueError, match="no cluster"):
        redirect_kubeconfig(source, tmp_path / "copy", "https://x:1")


def test_names_and_addresses_follow_the_index_and_need_a_started_partition(
    tmp_path: Path,
) -> None:
    partition = Partition("https://127.0.0.1:6443", tmp_path / "admin.kubeconfig", tmp_path)
    assert partition.upstream == ("127.0.0.1", 6443)
    assert partition.kubeconfig == tmp_path / "partitioned.kubeconfig"
    assert partition.connections == 0 and not partition.is_cut
    with pytest.raises(PartitionError, match="not started"):
        partition.wrap(["true"])
    partition.index = 7  # as start() would take it; nothing is made on the machine
    try:
        assert partition.name == "agentrun-part-7"
        assert (partition.host_veth, partition.netns_veth) == ("arh7", "arn7")
        assert (partition.server_host, partition.operator_api_host) == ("10.231.7.1", "10.231.7.2")
        assert (partition.management_host, partition.operator_host) == (
            "10.232.7.1",
            "10.232.7.2",
        )
        assert partition.wrap(["python", "-c", "pass"]) == [
            *("ip", "netns", "exec", "agentrun-part-7"),
            *("python", "-c", "pass"),
        ]
    finally:
        partition.index = None


def test_a_server_must_be_a_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a server URL"):
        Partition("127.0.0.1:6443", tmp_path / "k", tmp_path)


# -- the operator process in a partition, without root -----------------------------------------


@dataclass
class _StubPartition:
    """What the operator process asks of a partition."""

    kubeconfig: Path
    operator_host: str = "10.232.9.2"
    index: int | None = 9

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", "agentrun-part-9", *argv]


def _operator(tmp_path: Path, partition: _StubPartition | None) -> OperatorProcess:
    op = OperatorProcess(
        tmp_path / "admin.kubeconfig",
        namespaces=["ns"],
        log_path=tmp_path / "operator.log",
        python="python",
        extra_args=["--verbose"],
        partition=cast(Partition | None, partition),
    )
    op.liveness_port, op.metrics_port = 21000, 21001
    return op


def test_the_operator_in_a_partition_runs_in_its_namespace_and_binds_its_address(
    tmp_path: Path,
) -> None:
    op = _operator(tmp_path, _StubPartition(tmp_path / "partitioned.kubeconfig"))
    copy = str(tmp_path / "partitioned.kubeconfig")
    assert op.argv() == [
        *("ip", "netns", "exec", "agentrun-part-9"),
        *("python", "-m", "agentrun.cli", "run", "--kubeconfig", copy, "--namespace", "ns"),
        *("--liveness-port", "21000", "--liveness-host", "10.232.9.2"),
        *("--metrics-port", "21001", "--metrics-host", "10.232.9.2", "--verbose"),
    ]
    assert op.process_env()["KUBECONFIG"] == copy
    assert op.liveness_url == "http://10.232.9.2:21000/healthz"
    assert op.metrics_url == "http://10.232.9.2:21001/metrics"
    assert op.readiness_url == "http://10.232.9.2:21001/readyz"


def test_the_operator_without_a_partition_is_unchanged(tmp_path: Path) -> None:
    op = _operator(tmp_path, None)
    kubeconfig = str(tmp_path / "admin.kubeconfig")
    assert op.argv() == [
        *("python", "-m", "agentrun.cli", "run", "--kubeconfig", kubeconfig),
        *("--namespace", "ns", "--liveness-port", "21000"),
        *("--metrics-port", "21001", "--metrics-host", "127.0.0.1", "--verbose"),
    ]
    assert op.process_env()["KUBECONFIG"] == kubeconfig
    assert op.liveness_url == "http://127.0.0.1:21000/healthz"
    assert op.readiness_url == "http://127.0.0.1:21001/readyz"


def test_the_operator_refuses_a_partition_not_started(tmp_path: Path) -> None:
    op = _operator(tmp_path, _StubPartition(tmp_path / "partitioned.kubeconfig", index=None))
    with pytest.raises(OperatorError, match="not started"):
        op.start()
    assert op.proc is None


# -- a real partition (root and `ip`) ----------------------------------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on 127.0.0.1 standing in for the API server; its port."""
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def partition(tmp_path: Path, echo_port: int) -> Iterator[Partition]:
    reason = partition_unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = f"https://127.0.0.1:{echo_port}"
    kubeconfig = _kubeconfig(tmp_path / "admin.kubeconfig", server)
    with Partition(server, kubeconfig, tmp_path / "partition") as made:
        yield made


_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as s:
        s.sendall(b"ping")
        print(s.recv(4).decode())
except TimeoutError:
    print("timeout")
"""


def _ping_from_namespace(partition: Partition) -> str:
    """Connect from the namespace to the API server by its name there, as the operator would,
    and send a ping: ``ping`` (echoed) or ``timeout`` (nothing within 2 s)."""
    port = yaml.safe_load(partition.kubeconfig.read_text())["clusters"][1]["cluster"]["server"]
    assert port == f"https://{SERVICE_NAME}:{partition.forwarder_port}"
    proc = subprocess.run(
        partition.wrap(
            [sys.executable, "-c", _CLIENT, SERVICE_NAME, str(partition.forwarder_port)]
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_cut_drops_the_api_path_in_either_direction_until_healed(
    partition: Partition,
) -> None:
    assert _ping_from_namespace(partition) == "ping"
    assert partition.connections == 1
    partition.cut()
    assert partition.is_cut and partition.cut_to_server and partition.cut_to_operator
    assert _ping_from_namespace(partition) == "timeout"
    partition.heal()
    assert not partition.is_cut
    assert _ping_from_namespace(partition) == "ping"
    for to_server in (True, False):
        partition.cut(to_server=to_server, to_operator=not to_server)
        assert (partition.cut_to_server, partition.cut_to_operator) == (to_server, not to_server)
        assert _ping_from_namespace(partition) == "timeout", f"to_server={to_server}"
        partition.heal()
    assert _ping_from_namespace(partition) == "ping"
    assert partition.connections >= 3
    with pytest.raises(ValueError):
        partition.cut(to_server=False, to_operator=False)


_CONVERSATION = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
for line in sys.stdin:
    command, wait = line.split()
    s.settimeout(float(wait))
    if command == "ping":
        s.sendall(b"ping")
    try:
        print(s.recv(4).decode() or "closed", flush=True)
    except TimeoutError:
        print("timeout", flush=True)
    except OSError as e:
        print(type(e).__name__, flush=True)
"""


@contextlib.contextmanager
def _conversation(partition: Partition) -> Iterator[Callable[[str], str]]:
    """A client in the partition's namespace talking to the service through the forwarder
    over one connection: ``say(line)`` sends a line of :data:`_CONVERSATION` and returns its
    answer."""
    proc = subprocess.Popen(
        partition.wrap(
            [sys.executable, "-c", _CONVERSATION, SERVICE_NAME, str(partition.forwarder_port)]
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def say(line: str) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{line}\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    try:
        yield say
    finally:
        proc.kill()
        proc.wait(10)


def test_a_connection_lives_through_a_cut_nothing_resets_it(partition: Partition) -> None:
    with _conversation(partition) as say:
        assert say("ping 5") == "ping"
        partition.cut()
        assert say("ping 2") == "timeout"
        partition.heal()
        # The ping sent into the cut is sent again by TCP, and answered, on the same connection.
        assert say("recv 30") == "ping"
        assert partition.connections == 1


def test_a_stall_accepts_and_keeps_connections_and_answers_nothing_until_healed(
    partition: Partition,
) -> None:
    """Unlike a cut, a stall connects (the ping is sent, not refused) and hears nothing back,
    on a connection made before it as on one made during it; healed, new connections are
    answered, and one that stalled stays silent (its client must give it up)."""
    with _conversation(partition) as say:
        assert say("ping 5") == "ping"
        partition.stall()
        assert partition.stalled and not partition.is_cut
        assert say("ping 2") == "timeout"
        assert _ping_from_namespace(partition) == "timeout"  # connected, never answered
        partition.heal()
        assert not partition.stalled
        assert _ping_from_namespace(partition) == "ping"
        assert say("ping 2") == "timeout"  # the connection that stalled stays so
        assert partition.stalled_connections == 2


_SERVER = """
import socket, sys
with socket.create_server((sys.argv[1], 0)) as s:
    print(s.getsockname()[1], flush=True)
    while True:
        conn, _ = s.accept()
        with conn:
            conn.sendall(b"ok")
"""


def test_the_management_address_stays_reachable_while_cut(partition: Partition) -> None:
    server = subprocess.Popen(
        partition.wrap([sys.executable, "-c", _SERVER, partition.operator_host]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())

        def hello() -> bytes:
            with socket.create_connection((partition.operator_host, port), timeout=2) as s:
                return s.recv(2)

        assert hello() == b"ok"
        partition.cut()
        assert hello() == b"ok"
        assert _ping_from_namespace(partition) == "timeout"
    finally:
        server.kill()
        server.wait(10)


def test_stop_removes_everything_and_is_idempotent(partition: Partition) -> None:
    name, veth = partition.name, partition.host_veth
    partition.cut()
    partition.stop()
    partition.stop()
    assert partition.index is None and not partition.is_cut
    assert (
        name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    assert subprocess.run(["ip", "link", "show", "dev", veth], capture_output=True).returncode != 0
    assert not (Path("/etc/netns") / name).exists()
