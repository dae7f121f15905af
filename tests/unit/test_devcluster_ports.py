"""Ports handed to the local cluster's processes (agentrun_devcluster.ports): leased below the
kernel's ephemeral range, never to two leases at once, never one something listens on; a start
that fails on a taken port is retried on new ones. No module picks a port any other way."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentrun_devcluster import ports
from agentrun_devcluster.ports import (
    PortsExhausted,
    ephemeral_range,
    lease_ports,
    port_clash,
    retry_port_clash,
    usable_range,
)
from tests.support.paths import REPO_ROOT


def test_the_usable_range_lies_outside_the_ephemeral_one() -> None:
    assert usable_range(range(32768, 61000)) == range(20000, 32768)
    assert usable_range(range(15000, 61000)) == range(61000, 65536)
    assert usable_range(range(1024, 65536)) == range(1024, 65536)


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    sysctl = tmp_path / "ip_local_port_range"
    sysctl.write_text("40000\t50000\n")
    assert ephemeral_range(sysctl) == range(40000, 50001)
    assert ephemeral_range(tmp_path / "missing") == range(32768, 61000)


def test_leases_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    held = [lease_ports(3) for _ in range(20)]
    try:
        every = [port for lease in held for port in lease.ports]
        assert len(set(every)) == len(every) == 60
        assert all(port in usable_range(ephemeral_range()) for port in every)
        assert all(port not in ephemeral_range() for port in every)
    finally:
        for lease in held:
            lease.release()


_OTHER_PROCESS = """
import sys
from agentrun_devcluster.ports import PortsExhausted, lease_ports
port = int(sys.argv[1])
try:
    lease_ports(1, candidates=range(port, port + 1), tries=20)
except PortsExhausted:
    print("refused")
else:
    print("leased")
"""


def _lease_in_another_process(port: int) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(port)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.strip()


def test_a_held_port_is_leased_to_no_other_process_until_released() -> None:
    lease = lease_ports(1)
    assert _lease_in_another_process(lease.port) == "refused"
    lease.release()
    lease.release()  # idempotent
    assert _lease_in_another_process(lease.port) == "leased"


def test_a_held_port_is_leased_to_no_other_lease_of_the_same_process() -> None:
    with (
        lease_ports(1) as lease,
        pytest.raises(PortsExhausted, match=f"found 0 of 1 free ports in {lease.port}"),
    ):
        lease_ports(1, candidates=range(lease.port, lease.port + 1), tries=5)
    with lease_ports(1, candidates=range(lease.port, lease.port + 1), tries=5) as again:
        assert again.port == lease.port


def test_a_port_something_listens_on_is_skipped() -> None:
    with lease_ports(1) as lease:
        port = lease.port
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with pytest.raises(PortsExhausted):
            lease_ports(1, candidates=range(port, port + 1), tries=5)


def test_a_start_that_met_a_taken_port_is_retried_and_other_errors_are_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def clashes_twice() -> str:
        calls.append(len(calls))
        if len(calls) <= 2:
            raise RuntimeError("listen tcp 127.0.0.1:20001: bind: address already in use")
        return "started"

    assert retry_port_clash(clashes_twice, what="etcd") == "started"
    assert len(calls) == 3
    assert "etcd: a port was taken before it was bound" in caplog.text

    def broken() -> str:
        calls.append(-1)
        raise RuntimeError("no such file")

    calls.clear()
    with pytest.raises(RuntimeError, match="no such file"):
        retry_port_clash(broken, what="etcd")
    assert calls == [-1]

    def always_clashes() -> str:
        calls.append(0)
        raise OSError("[Errno 98] Address already in use")

    calls.clear()
    with pytest.raises(OSError, match="Address already in use"):
        retry_port_clash(always_clashes, what="etcd", attempts=3)
    assert len(calls) == 3
    assert port_clash("cannot serve /metrics on 127.0.0.1:60853: Address already in use")


def _picks_a_port_itself(path: Path) -> list[str]:
    """Where ``path`` binds port 0 or calls a former free-port helper."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            args = [ast.unparse(a) for a in node.args]
            if name.endswith(".bind") and args and args[0].endswith(", 0)"):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            if name.split(".")[-1] in ("free_port", "free_ports"):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_port_given_to_a_process_is_leased() -> None:
    """A port found by binding port 0 and closing the socket may be taken before the process
    it is given to binds it. Only an in-process server may bind port 0 (it reads back the
    port it holds): the scripted model server."""
    in_process = {REPO_ROOT / "hack/devcluster/agentrun_devcluster/modelserver.py"}
    roots = [REPO_ROOT / "hack", REPO_ROOT / "tests", REPO_ROOT / "operator"]
    offenders = [
        line
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if path not in in_process and path != Path(ports.__file__).resolve()
        for line in _picks_a_port_itself(path)
    ]
    assert not offenders, "\n".join(offenders)
