"""The operator uses third-party packages through their public API only.

A module whose name (or one of whose packages' names) starts with an underscore is private to
its distribution: it may change or vanish in any release within the version range
pyproject.toml allows, so no module of ``agentrun`` imports one (``import a._b``,
``from a._b import c``, ``from a import _b``). The standard library is not third-party.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "agentrun"
MODULES = sorted(PACKAGE.rglob("*.py"))

KNOWN = {
    # kopf marks the end of its listing of AgentRuns only inside its private watch stream;
    # /readyz hooks it, guarded: when kopf no longer has it, readiness says so in the log and
    # counts kopf's watch as listed (agentrun.telemetry.endpoints, watch_kopf_listings). Kopf
    # has no public equivalent. The same hook tells it each watch request of runs that the
    # API server ended in order (kopf's ``api.stream``), which counts as heard for a quiet
    # namespace. These are the exceptions, and they may not spread.
    "operator/agentrun/telemetry/endpoints.py": ["kopf._cogs.clients", "kopf._cogs.clients"],
}
"""Each module allowed a private import, with what it may import and why."""


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in dotted.split("."))


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def private_imports(tree: ast.AST) -> list[str]:
    """The private third-party modules ``tree`` imports, as dotted names."""
    found: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            # `from package import _module`: a private module, not a private name of a module.
            names += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and _is_module(f"{node.module}.{alias.name}")
            ]
        for name in names:
            top = name.partition(".")[0]
            if top in ("agentrun", "__future__") or top in sys.stdlib_module_names:
                continue
            if _private(name):
                found.append(name)
    return found


def test_the_walk_finds_every_form_of_a_private_import() -> None:
    source = (
        "import mcp.shared._httpx_utils\n"
        "from mcp.shared._httpx_utils import create_mcp_http_client\n"
        "from mcp.shared import _httpx_utils\n"
        "def f():\n"
        "    from pydantic._internal import _model_construction\n"
        "from mcp.client.streamable_http import streamable_http_client\n"
        "from typing import _GenericAlias\n"
        "import _thread\n"
        "from . import _local\n"
    )
    assert sorted(private_imports(ast.parse(source))) == [
        "mcp.shared._httpx_utils",
        "mcp.shared._httpx_utils",
        "mcp.shared._httpx_utils",
        "pydantic._internal",
        "pydantic._internal._model_construction",
    ]


def test_no_module_of_agentrun_imports_a_private_module_of_a_third_party_package() -> None:
    assert len(MODULES) > 50, "operator/agentrun's modules were not found"
    found = {
        str(path.relative_to(REPO)): imports
        for path in MODULES
        if (imports := private_imports(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == KNOWN, (
        f"private modules of third-party packages imported (use their public API): {found}; "
        f"the known exceptions are {KNOWN}"
    )


def test_the_mcp_http_client_has_the_sdks_default_timeouts_and_follows_no_redirect() -> None:
    from agentrun.pod.mcp import http_client

    client = http_client({"Authorization": "token"})
    assert client.headers["Authorization"] == "token"
    assert client.follow_redirects is False
    timeout = client.timeout
    assert (timeout.connect, timeout.write, timeout.pool) == (30.0, 30.0, 30.0)
    assert timeout.read == 300.0
