"""What ships: the operator's wheel holds the product and nothing of the local test cluster or
of the crash tests' fault injection (those live in the agentrun-devcluster distribution)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    result = subprocess.run(
        [str(ROOT / "hack" / "ensure-uv.sh")], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [_uv(), "build", "--wheel", "--package", "agentrun-operator", "-o", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("agentrun_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_holds_the_product(wheel_files: list[str]) -> None:
    for module in (
        "agentrun/cli.py",
        "agentrun/loop/handlers.py",
        "agentrun/loop/reconciler.py",
        "agentrun/pod/runner.py",
        "agentrun/core/machine.py",
        "agentrun/api/models.py",
        "agentrun/clients/plugin/commands.py",
    ):
        assert module in wheel_files


def test_wheel_holds_no_test_cluster_or_fault_injection(wheel_files: list[str]) -> None:
    leaked = [
        name
        for name in wheel_files
        if "devcluster" in name or "crashpoint" in name or "faults" in name
    ]
    assert not leaked, f"test-only code in the operator wheel: {leaked}"
    packages = {name.split("/")[0] for name in wheel_files}
    assert packages == {"agentrun", *(p for p in packages if p.endswith(".dist-info"))}


def test_product_sources_do_not_import_the_test_cluster() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "operator" / "agentrun").rglob("*.py")
        if "agentrun_devcluster" in path.read_text() or "crashpoints" in path.read_text()
    ]
    assert not offenders, f"product modules naming test-only code: {offenders}"


def test_the_operators_own_commands_load_no_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    # `agentrun run` and `agentrun step` (every step pod) never import what other
    # distributions add to the command (in a checkout: the local cluster's `devcluster`).
    from agentrun import cli

    loaded: list[str] = []

    def entry_points(group: str) -> list[object]:
        loaded.append(group)
        return []

    monkeypatch.setattr(cli, "entry_points", entry_points)
    assert cli.main(["crd", "--output", "/dev/null"]) == 0
    assert loaded == []
    with pytest.raises(SystemExit):
        cli.main(["devcluster", "--help"])  # not the operator's own: extensions are looked up
    assert loaded == [cli.EXTENSION_GROUP]


def test_the_wheel_and_the_sdist_carry_the_license(tmp_path: Path) -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "[yyyy]" not in license_text, "the appendix's copyright line names the project"
    subprocess.run(
        [_uv(), "build", "--package", "agentrun-operator", "-o", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("agentrun_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (licensed,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licensed).decode() == license_text
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().partition("\n\n")[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    (sdist,) = tmp_path.glob("agentrun_operator-*.tar.gz")
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert member is not None
        assert member.read().decode() == license_text
