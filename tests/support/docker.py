"""Docker for the suites that need it: the hack/ scripts that bring up an engine and build the
images, and what their exit codes mean for a test.

A script exits :data:`NO_DOCKER` when no Docker engine can be had on this machine (not root,
no apt, dockerd does not start), its last stderr line saying why: the test skips with that
reason, unless ``AGENTRUN_REQUIRE_DOCKER=1`` makes it a failure. Any other non-zero exit is a
failure, with the script's output.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import pytest

from .paths import REPO_ROOT

HACK = REPO_ROOT / "hack"
NO_DOCKER = 3
"""The scripts' exit code for "no Docker engine can be had here"."""
BUILD_TIMEOUT = 3600
"""Seconds a script may take: a cold image build with the vfs storage driver takes minutes."""
REQUIRE_ENV = "AGENTRUN_REQUIRE_DOCKER"
DOCKER_MODULES = frozenset({REPO_ROOT / "tests" / "integration" / "test_image.py"})
"""Test modules outside tests/containers that build or run Docker images: tests/conftest.py
puts them in one pytest-xdist group with tests/containers."""


@dataclass(frozen=True)
class Images:
    """The images the container suite runs, all in the local engine."""

    operator: str
    step: str
    kubectl: str

    @property
    def operator_repository(self) -> str:
        return self.operator.rpartition(":")[0]

    @property
    def operator_tag(self) -> str:
        return self.operator.rpartition(":")[2]

    @property
    def kubectl_repository(self) -> str:
        return self.kubectl.rpartition(":")[0]

    @property
    def kubectl_tag(self) -> str:
        return self.kubectl.rpartition(":")[2]


def hack_script(name: str, *args: str) -> str:
    """Run ``hack/NAME ARGS``; its last stdout line. Skips on "no Docker here" (unless
    :data:`REQUIRE_ENV` is 1), fails on any other error."""
    proc = subprocess.run(
        [str(HACK / name), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    if proc.returncode == 0:
        lines = proc.stdout.strip().splitlines()
        return lines[-1] if lines else ""
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-8000:]}"
    if proc.returncode == NO_DOCKER:
        said = proc.stderr.strip().splitlines()
        reason = f"{said[-1] if said else 'no Docker engine'} (hack/{name})"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}\n{output}", pytrace=False)
        pytest.skip(reason)
    pytest.fail(f"hack/{name} exited with {proc.returncode}\n{output}", pytrace=False)
