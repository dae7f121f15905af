"""How the local control plane launches its components, without running them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster.controlplane import ControlPlane, controller_manager_flags

TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for tool in TOOLS:
        (d / tool).write_text("#!/bin/sh\nexit 1\n")
        (d / tool).chmod(0o755)
    return d


def controller_manager_argv(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The argv :meth:`ControlPlane._start_controller_manager` would start."""
    started: list[tuple[str, list[str]]] = []

    def record(name: str, argv: list[str], *_: object) -> None:
        started.append((name, argv))

    monkeypatch.setattr(cp, "_start_component", record)
    cp.server = "https://127.0.0.1:6443"
    cp._start_controller_manager({})
    [(name, argv)] = started
    assert name == "kube-controller-manager"
    assert argv[0] == str(cp.bin_dir / "kube-controller-manager")
    return argv


def test_controller_manager_rate_limit_defaults_lift_the_upstream_cap(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = ControlPlane(bin_dir, state_dir=tmp_path / "state")
    argv = controller_manager_argv(cp, monkeypatch)
    assert "--kube-api-qps=100" in argv
    assert "--kube-api-burst=200" in argv


def test_controller_manager_rate_limit_is_a_setting(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = ControlPlane(
        bin_dir,
        state_dir=tmp_path / "state",
        controller_manager_qps=7,
        controller_manager_burst=9,
        extra_controller_manager_args=["--v=2"],
    )
    argv = controller_manager_argv(cp, monkeypatch)
    assert "--kube-api-qps=7" in argv
    assert "--kube-api-burst=9" in argv
    assert argv[-1] == "--v=2"  # extra flags come last, so they can override
    assert not [a for a in argv if a.startswith("--kube-api-qps=") and a != "--kube-api-qps=7"]


def test_controller_manager_flags_run_only_the_listed_controllers(tmp_path: Path) -> None:
    flags = controller_manager_flags(
        tmp_path / "kcm.kubeconfig",
        port=10257,
        cert_dir=tmp_path / "certs",
        controllers=["job-controller", "garbage-collector-controller"],
        service_account_key=tmp_path / "sa.key",
        root_ca=tmp_path / "ca.crt",
        qps=50,
        burst=60,
    )
    assert "--controllers=job-controller,garbage-collector-controller" in flags
    assert "--leader-elect=false" in flags
    assert f"--kubeconfig={tmp_path / 'kcm.kubeconfig'}" in flags
    assert flags[-2:] == ["--kube-api-qps=50", "--kube-api-burst=60"]
