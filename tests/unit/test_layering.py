"""Imports go wiring -> shell -> core, never back: the core and the API import neither kopf
nor the kubernetes client, nor anything that performs I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
