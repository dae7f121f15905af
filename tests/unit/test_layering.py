"""Imports go wiring -> shell -> core, never back: the core and the API import neither kopf
nor the kubernetes client, nor anything that performs I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.docker import DOCKER_MODULES

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "agentrun"
PURE = sorted([*(PACKAGE / "core").rglob("*.py"), *(PACKAGE / "api").rglob("*.py")])
FORBIDDEN = (
    "kopf",
    "kubernetes",
    "agentrun_devcluster",
    "agentrun.cli",
    "subprocess",
    "socket",
    "requests",
    "urllib3",
    "aiohttp",
)


def _imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def test_pure_modules_exist() -> None:
    assert len(PURE) >= 8


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_module_imports_nothing_impure(path: Path) -> None:
    bad = [
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    ]
    assert not bad, f"{path.name} imports {bad}: the core and the API must stay pure"


def test_api_does_not_import_the_core() -> None:
    for path in (PACKAGE / "api").rglob("*.py"):
        assert not [n for n in _imports(path) if n.startswith("agentrun.core")], path.name


def test_test_modules_import_only_support_and_conftest() -> None:
    """What tests share lives in tests/support (and fixtures in conftest.py): a test module
    that imported another would run that module's tests' imports and couple the two."""
    tests = Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        if path.is_relative_to(tests / "support"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    offenders.append(f"{path.relative_to(tests)} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_every_docker_test_module_shares_the_docker_group() -> None:
    """Tests of the Docker engine run on one pytest-xdist worker (tests/conftest.py groups
    them): two workers would install docker.io and build the same images at once."""
    tests = Path(__file__).resolve().parents[1]
    using = {
        path
        for path in tests.rglob("test_*.py")
        if "tests.support.docker" in _imports(path) or "hack_script" in path.read_text()
    }
    outside = sorted(
        str(p.relative_to(tests))
        for p in using - DOCKER_MODULES
        if tests / "containers" not in p.parents and p != Path(__file__).resolve()
    )
    assert not outside, f"add to tests/conftest.py's DOCKER_MODULES: {outside}"
    assert all(p.exists() for p in DOCKER_MODULES), DOCKER_MODULES
