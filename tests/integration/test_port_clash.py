"""A control plane whose port is taken between its lease and etcd's bind starts again on new
ports instead of failing (agentrun_devcluster.ports)."""

from __future__ import annotations

import subprocess

import pytest

from agentrun_devcluster import binaries, controlplane
from agentrun_devcluster.controlplane import ControlPlane
from tests.support.ports import first_lease_taken


def test_a_control_plane_whose_port_was_taken_starts_on_new_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bin_dir = binaries.resolve_bin_dir()
    with first_lease_taken(monkeypatch, controlplane) as asked, ControlPlane(bin_dir) as cp:
        etcd_log = (cp.logs_dir / "etcd.log").read_text()
        assert "address already in use" in etcd_log
        ready = subprocess.run(
            [str(cp.kubectl), "get", "--raw", "/readyz"],
            env=cp.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert ready.stdout.strip() == "ok"
    # etcd's client and peer ports twice (the first pair was taken), then the API server's
    # and the controller-manager's.
    assert asked == [2, 2, 1, 1]
