"""The operator image (Dockerfile) and the step image busybox:1.36, built from Debian packages.

``hack/build-images.sh`` brings up a Docker engine (``hack/docker-up.sh``: Debian's docker.io,
installed and started when the machine allows), builds the base images with debootstrap
(``hack/build-base-images.sh``) and the operator image on them; later runs reuse all of it.
The image is then checked as a cluster would run it:

* as uid 65532 with a read-only root filesystem (``/tmp`` writable, as the chart gives it):
  ``--help``, ``agentrun crd`` equal to ``crds/``, the step runner's result envelope;
* bytecode compiled at build time: importing every module writes no ``.pyc``;
* nothing of the local test cluster inside (no ``agentrun_devcluster``, no fault injection,
  no development packages).

These tests skip, saying why, only when no Docker engine can be had here (the script exits
3: not root, no apt, dockerd cannot start); ``AGENTRUN_REQUIRE_DOCKER=1`` makes that a
failure. ``AGENTRUN_TEST_IMAGE`` tests an image built elsewhere instead of building one.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.docker import hack_script

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "agentrun.dev_agentruns.yaml"
DEFAULT_TAG = "agentrun-operator:dev"
STEP_IMAGE = "busybox:1.36"
RUN_TIMEOUT = 120


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} exited with {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return proc


@pytest.fixture(scope="module")
def image() -> str:
    """The operator image: AGENTRUN_TEST_IMAGE, or built (or reused) by hack/build-images.sh."""
    given = os.environ.get("AGENTRUN_TEST_IMAGE")
    if given:
        hack_script("docker-up.sh")
        return given
    built = hack_script("build-images.sh", DEFAULT_TAG)
    assert built == DEFAULT_TAG
    return built


@pytest.fixture(scope="module")
def step_image() -> str:
    hack_script("docker-up.sh")
    hack_script("build-base-images.sh")
    return STEP_IMAGE


def run_locked_down(
    image: str, *args: str, entrypoint: str | None = None, env: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``docker run`` as a pod of the chart runs it: uid 65532, read-only root, /tmp writable,
    no capabilities, no network."""
    options = ["--rm", "--read-only", "--tmpfs", "/tmp", "--user", "65532"]
    options += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--network", "none"]
    if entrypoint is not None:
        options += ["--entrypoint", entrypoint]
    for item in env:
        options += ["-e", item]
    return docker("run", *options, image, *args, check=False)


def test_image_defaults(image: str) -> None:
    config = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", image).stdout)
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["agentrun"]
    assert config["Cmd"] == ["run", "--all-namespaces"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]


def test_help_runs_read_only_as_65532(image: str) -> None:
    # Exactly the brief's command: no writable /tmp at all.
    proc = docker("run", "--rm", "--read-only", "--user", "65532", image, "--help")
    assert proc.stdout.startswith("usage: agentrun")
    for command in ("run", "step", "crd"):
        assert command in proc.stdout


def test_runs_as_uid_65532_with_debian_python(image: str) -> None:
    proc = docker("run", "--rm", "--read-only", "--entrypoint", "id", image, "-u")
    assert proc.stdout.strip() == "65532"
    proc = run_locked_down(
        image,
        "-c",
        "import sys; print(sys.executable, '%d.%d' % sys.version_info[:2], sys.prefix)",
        entrypoint="python3",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["/opt/agentrun/bin/python3", "3.11", "/opt/agentrun"]


def test_crd_output_equals_the_checked_in_crd(image: str) -> None:
    proc = run_locked_down(image, "crd")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == CRD_FILE.read_text(encoding="utf-8"), (
        "`agentrun crd` in the image differs from crds/agentrun.dev_agentruns.yaml: run "
        "`make crds`, then rebuild the image (hack/build-images.sh)"
    )


def step(image: str, script_text: str) -> tuple[int, str, dict[str, object]]:
    """Run ``agentrun step -- sh -c SCRIPT`` in the image; return its exit code, its output and
    the envelope it left as termination message (a file under /tmp: the root is read-only)."""
    termination = "/tmp/termination-log"
    proc = run_locked_down(
        image,
        "-c",
        'agentrun step -- sh -c "$1"; code=$?; echo; echo "envelope: $(cat /tmp/termination-log)"; '
        "exit $code",
        "sh",
        script_text,
        entrypoint="sh",
        env=[f"AGENTRUN_TERMINATION_MESSAGE_PATH={termination}"],
    )
    output, _, envelope = proc.stdout.rpartition("envelope: ")
    assert envelope, f"no envelope\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    parsed = json.loads(envelope)
    assert isinstance(parsed, dict)
    return proc.returncode, output, parsed


def test_step_runner_reports_stdout_as_the_result(image: str) -> None:
    code, output, envelope = step(image, "echo hi")
    assert code == 0
    assert output.strip() == "hi"
    assert envelope == {"ok": True, "summary": "hi", "result": "hi"}


def test_step_runner_reports_the_result_file_and_the_exit_code(image: str) -> None:
    code, _, envelope = step(image, 'echo "from the file" > "$AGENTRUN_RESULT_FILE"; exit 3')
    assert code == 3
    assert envelope == {"ok": False, "summary": "from the file", "result": "from the file"}


def test_bytecode_is_compiled_at_build_time(image: str) -> None:
    """Import every module of the image's site-packages with bytecode writing allowed, on a
    writable root: no .pyc may appear (they were all compiled by the build)."""
    name = f"agentrun-bytecode-{secrets.token_hex(4)}"
    importer = (
        "import importlib, pkgutil, agentrun\n"
        "for m in pkgutil.walk_packages(agentrun.__path__, 'agentrun.'):\n"
        "    importlib.import_module(m.name)\n"
        "import kopf, kubernetes, pydantic, yaml\n"
        "print('imported')\n"
    )
    docker(
        "run", "--name", name, "--user", "65532", "-e", "PYTHONDONTWRITEBYTECODE=",
        "--entrypoint", "python3", image, "-c", importer,
    )  # fmt: skip
    try:
        changed = docker("diff", name).stdout.splitlines()
    finally:
        docker("rm", "-f", name, check=False)
    written = [line for line in changed if line.endswith(".pyc") or "__pycache__" in line]
    assert written == [], f"bytecode written at run time: {written[:20]}"


def test_no_local_cluster_or_development_code(image: str) -> None:
    check = (
        "import importlib.util, importlib.metadata, json, pathlib\n"
        "mods = ['agentrun_devcluster', 'agentrun_devcluster.faults', 'pytest', 'hypothesis',"
        " 'mypy']\n"
        "found = {m: importlib.util.find_spec(m.split('.')[0]) is not None for m in mods}\n"
        "dists = sorted(d.metadata['Name'] for d in importlib.metadata.distributions())\n"
        "files = sorted(str(p) for p in pathlib.Path('/opt/agentrun').rglob('*')"
        " if p.name.split('.')[0] == 'faults' or 'devcluster' in p.name)\n"
        "print(json.dumps({'found': found, 'dists': dists, 'files': files}))\n"
    )
    proc = run_locked_down(image, "-c", check, entrypoint="python3")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert not any(report["found"].values()), report["found"]
    assert "agentrun-operator" in report["dists"]
    assert "agentrun-devcluster" not in report["dists"]
    assert report["files"] == []
    proc = run_locked_down(image, "-c", "import agentrun_devcluster", entrypoint="python3")
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'agentrun_devcluster'" in proc.stderr


def test_busybox_step_image_runs_sh(step_image: str) -> None:
    proc = docker("run", "--rm", step_image, "sh", "-c", "echo ok")
    assert proc.stdout == "ok\n"


def test_busybox_step_image_runs_read_only_as_65532(step_image: str) -> None:
    proc = docker(
        "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--user", "65532", step_image,
        "sh", "-c", "id -u; echo x > /tmp/x && cat /tmp/x; ls /bin/echo /usr/bin/env",
    )  # fmt: skip
    assert proc.stdout.split() == ["65532", "x", "/bin/echo", "/usr/bin/env"]
