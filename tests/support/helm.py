"""helm for tests: its own config, cache and data dirs (the user's are never touched), and the
chart's rendered objects.

The binary comes from ``hack/build-helm.sh`` (the ``helm_binary`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .paths import CHART

Docs = list[dict[str, Any]]

RELEASE = "agentrun-operator"
SYSTEM_NAMESPACE = "agentrun-system"


class Helm:
    """helm with its own home under ``home``; against ``kubeconfig`` if given."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``helm ARGS``; with ``check``, a non-zero exit fails the test with helm's output."""
        cmd = [str(self.binary), *args]
        if self.kubeconfig is not None:
            cmd.append(f"--kubeconfig={self.kubeconfig}")
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, stdin=subprocess.DEVNULL, timeout=300
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited with {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def template(
        self, *args: str, release: str = RELEASE, namespace: str = SYSTEM_NAMESPACE
    ) -> Docs:
        """The chart's objects as ``helm template`` renders them with ``args``."""
        proc = self.run("template", release, str(CHART), "-n", namespace, *args)
        return [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)]

    def install(self, release: str, namespace: str, *args: str) -> None:
        """``helm install --wait`` of the chart."""
        self.run(
            "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "2m", *args
        )

    def uninstall(self, release: str, namespace: str) -> None:
        self.run("uninstall", release, "-n", namespace, "--wait")


def without_hooks(docs: Docs) -> Docs:
    """The objects helm installs (not its hooks, such as the ``helm test`` pod)."""
    return [
        d
        for d in docs
        if "helm.sh/hook" not in ((d.get("metadata") or {}).get("annotations") or {})
    ]


def kinds(docs: Docs) -> list[str]:
    return [d["kind"] for d in docs]


def one(docs: Docs, kind: str) -> dict[str, Any]:
    """The one object of ``kind`` among ``docs``."""
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}: {kinds(docs)}"
    return found[0]


def hooks(docs: Docs, event: str) -> Docs:
    """The objects of helm hook ``event`` (e.g. ``pre-delete``)."""
    return [
        d
        for d in docs
        if ((d.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook") == event
    ]
