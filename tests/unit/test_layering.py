"""Imports go wiring -> shell -> core, never back, and never around in a circle.

* The core and the API import neither kopf nor the kubernetes client, nor anything that
  performs I/O.
* No module of ``agentrun`` or ``agentrun_devcluster`` imports, through any chain of imports,
  itself: a circle makes what a module finds at import time depend on which module was
  imported first.
* Each package of ``agentrun`` imports only the packages its row of :data:`ALLOWED` names
  (each package's docstring says why); the clients and the in-pod programs are imported by
  nobody else.
* docs/development.md's layout lists exactly the packages and top-level modules of agentrun.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docker import DOCKER_MODULES

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "agentrun"
# Each product package and the directory on sys.path it is imported from.
SOURCES = {"agentrun": REPO / "operator", "agentrun_devcluster": REPO / "hack" / "devcluster"}
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

_BELOW = frozenset({"api", "core", "kubeapi", "settings"})
_ALL = frozenset(
    {
        "agentrun",
        "api",
        "core",
        "kubeapi",
        "settings",
        "observation",
        "execution",
        "access",
        "telemetry",
        "pod",
        "loop",
        "clients",
        "cli",
    }
)
ALLOWED: dict[str, frozenset[str]] = {
    # The root package holds only __version__, which any part may report.
    "agentrun": frozenset(),
    # The models alone: the CRD is generated from them, and everything else reads them.
    "api": frozenset(),
    # The pure state machine decides from the models alone.
    "core": frozenset({"api"}),
    # The API refusals a caller lets pass: about the kubernetes client, no model.
    "kubeapi": frozenset(),
    # Settings from the environment, and the names put on objects (the API's group).
    "settings": frozenset({"api"}),
    # Builders and parsers of what the operator creates; the loop makes the calls.
    "execution": _BELOW,
    # Rights, people's decisions and the audit record.
    "access": _BELOW,
    # What the operator tells; it never decides what a run does.
    "telemetry": _BELOW,
    # Reads only: the Job parsers of execution, and access's review of the creator's rights (a
    # LocalSubjectAccessReview is a read) before a conversation is resumed from another run.
    "observation": _BELOW | {"execution", "access"},
    # In a step's pod: the result ConfigMap is made by execution's builder, the one whose
    # layout the operator reads back.
    "pod": _BELOW | {"execution"},
    # The top of the operator: everything but the clients and the in-pod programs.
    "loop": _ALL - {"clients", "pod", "cli"},
    # For people and programs beside the operator, as their docstring lists: never the loop,
    # the observation or the in-pod programs.
    "clients": _BELOW | {"execution", "access"},
    # The command wires it all: the operator, the in-pod programs, the release.
    "cli": _ALL,
}

EXCEPTIONS: dict[tuple[str, str], str] = {
    # `kubectl agentrun release` uninstalls: it finishes every deletion with the operator's
    # own cleanup, as `agentrun release` and the chart's pre-delete hook do. One
    # implementation, imported inside that command only, so no other command loads the loop.
    ("agentrun.clients.plugin.commands", "agentrun.loop.janitor"): "release",
}
"""Single imports allowed beyond a row of :data:`ALLOWED`, with the reason."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    package: bool
    """An ``__init__.py``: relative imports start from the package itself."""


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for top, root in SOURCES.items():
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            found[name] = Module(name, path, package)
    return found


MODULES = _modules()


def _named(node: ast.AST, module: Module) -> list[str]:
    """The modules one import statement names: ``from pkg import mod`` names the submodule
    ``pkg.mod`` when there is one, else ``pkg`` (a package's name is its ``__init__``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        here = module.name.split(".") if module.package else module.name.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join([*here, *([node.module] if node.module else [])])
    subs = [f"{base}.{alias.name}" for alias in node.names]
    return [sub if sub in MODULES else base for sub in subs]


def _imports_of(module: Module) -> Iterator[tuple[str, int, bool]]:
    """(module imported, line, whether only implied) for every import statement in
    ``module`` (in functions and under TYPE_CHECKING too), of the modules above. Importing
    ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` first, so those are implied, unless
    ``module`` is inside them (they are already being imported when it runs)."""
    parts = module.name.split(".")
    enclosing = {".".join(parts[:i]) for i in range(1, len(parts))}
    for node in ast.walk(ast.parse(module.path.read_text())):
        for name in _named(node, module):
            steps = name.split(".")
            for i in range(1, len(steps) + 1):
                target = ".".join(steps[:i])
                implied = i < len(steps)
                if target not in MODULES or target == module.name:
                    continue
                if not (implied and target in enclosing):
                    yield target, getattr(node, "lineno", 0), implied


def _edges(module: Module) -> dict[str, int]:
    """What ``module`` imports, named or implied, with the line of the first import."""
    edges: dict[str, int] = {}
    for target, line, _ in sorted(_imports_of(module), key=lambda found: found[1]):
        edges.setdefault(target, line)
    return edges


GRAPH = {name: _edges(module) for name, module in MODULES.items()}


def _components(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): every circle lies
    inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every circle of imports (each module in it once), from its first module in name order."""
    found: list[list[str]] = []
    for component in _components(graph):
        for start in sorted(component):
            _walk(graph, component, [start], found)
    return sorted(found)


def _walk(
    graph: dict[str, dict[str, int]], component: set[str], path: list[str], found: list[list[str]]
) -> None:
    """The circles through ``path[0]`` that go on from ``path`` over later modules only, so
    that each circle is found once, from its first module."""
    for w in sorted(graph[path[-1]]):
        if w == path[0]:
            found.append(list(path))
        elif w in component and w > path[0] and w not in path:
            _walk(graph, component, [*path, w], found)


def _show(circle: list[str]) -> str:
    """A circle, each module with the line of its import of the next."""
    hops = zip(circle, [*circle[1:], circle[0]], strict=True)
    return " -> ".join(f"{a} (line {GRAPH[a][b]})" for a, b in hops) + f" -> {circle[0]}"


def _layer(name: str) -> str:
    """The row of :data:`ALLOWED` a module of agentrun is in: its package, or its own name."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _product_imports() -> Iterator[tuple[str, str, int]]:
    """(module, module it names, line) for every import of agentrun by agentrun."""
    for name, module in sorted(MODULES.items()):
        if name.split(".")[0] == "agentrun":
            for target, line, implied in sorted(set(_imports_of(module))):
                if target.split(".")[0] == "agentrun" and not implied:
                    yield name, target, line


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


def test_no_module_imports_itself_around_a_circle() -> None:
    found = circles(GRAPH)
    assert not found, f"{len(found)} import circle(s):\n" + "\n".join(map(_show, found))


def test_the_circle_check_finds_circles() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2, "a": 3}, "c": {"a": 4}, "d": {"a": 5}}
    assert circles(graph) == [["a", "b"], ["a", "b", "c"]]


def test_the_import_graph_counts_every_kind_of_import() -> None:
    cli, tracing = GRAPH["agentrun.cli"], GRAPH["agentrun.telemetry.tracing"]
    # In a function: `from pkg import module` is the module, and pkg's __init__ runs first.
    assert "agentrun.api.crd" in cli and "agentrun.api" in cli
    assert "agentrun" in tracing  # `from agentrun import __version__`, in a method
    assert "agentrun.settings" in tracing  # under TYPE_CHECKING
    assert "agentrun_devcluster.runtime" in GRAPH["agentrun_devcluster.process"]  # relative
    # The package a module is in is already being imported when the module runs.
    assert "agentrun.api" not in GRAPH["agentrun.api.models"]


def test_every_package_and_top_level_module_has_a_row() -> None:
    assert {_layer(name) for name in MODULES if name.split(".")[0] == "agentrun"} == set(ALLOWED)
    assert set(ALLOWED) == _ALL


def test_each_package_imports_only_what_its_row_allows() -> None:
    offenders = [
        f"{name} (line {line}) imports {target}: {_layer(name)} may import only "
        + ", ".join(sorted(ALLOWED[_layer(name)]) or ["itself"])
        for name, target, line in _product_imports()
        if _layer(target) not in ALLOWED[_layer(name)] | {_layer(name), "agentrun"}
        and (name, target) not in EXCEPTIONS
    ]
    assert not offenders, "\n".join(offenders)


def test_nothing_outside_the_clients_imports_them() -> None:
    offenders = [
        f"{name} (line {line}) imports {target}"
        for name, target, line in _product_imports()
        if _layer(target) == "clients" and _layer(name) != "clients"
    ]
    assert not offenders, "\n".join(offenders)


def test_nothing_but_the_command_imports_the_in_pod_programs() -> None:
    offenders = [
        f"{name} (line {line}) imports {target}"
        for name, target, line in _product_imports()
        if _layer(target) == "pod" and _layer(name) not in ("pod", "cli")
    ]
    assert not offenders, "\n".join(offenders)


def _documented_layout() -> list[str]:
    """The agentrun paths docs/development.md's Layout block lists, in its order."""
    text = (REPO / "docs" / "development.md").read_text()
    block = text.split("\n## Layout\n", 1)[1].split("```", 2)[1]
    return [
        line.split()[0].rstrip("/")
        for line in block.splitlines()
        if line.startswith("operator/agentrun/")
    ]


def test_the_documented_layout_lists_every_package_and_top_level_module() -> None:
    actual = {
        f"operator/agentrun/{path.name}"
        for path in PACKAGE.iterdir()
        if (path / "__init__.py").is_file() or (path.suffix == ".py" and path.stem != "__init__")
    }
    listed = Counter(_documented_layout())
    assert not (missing := sorted(actual - set(listed))), f"not in the layout: {missing}"
    assert not (gone := sorted(set(listed) - actual)), f"listed, not in agentrun: {gone}"
    assert not (twice := sorted(p for p, n in listed.items() if n > 1)), f"listed twice: {twice}"


@pytest.mark.parametrize("program", ["agentrun.pod.llm", "agentrun.pod.runner"])
def test_a_step_pods_program_loads_no_models(program: str) -> None:
    """A model turn's pod and a step's runner read the API's names (agentrun.api.names), not
    its models: building the models' validators is CPU every such pod would pay at its start
    (the step's own client, openai for a model turn, loads what it needs itself)."""
    code = (
        f"import sys, {program}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' "
        "or m in ('agentrun.api.models', 'agentrun.core.machine', 'kubernetes')))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert found == "[]", f"{program} loads {found}"
