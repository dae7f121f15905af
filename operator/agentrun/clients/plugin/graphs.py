"""Machine-readable output of the read verbs (``-o json|yaml``) and drawings (``-o mermaid|dot``):
pure functions from runs and families to text, tested without a cluster.

* ``status -o json|yaml``: the AgentRun as stored, as ``kubectl get agentrun RUN -o yaml``
  prints it (``metadata.managedFields`` left out, as kubectl does by default).
* ``status -o mermaid|dot``: the plan's DAG, a node per step labelled with its name and phase,
  an edge from each dependency to the step that depends on it.
* ``tree -o json|yaml``: the family as nested objects; ``tree -o mermaid``: as a graph. A
  run's ``tokens`` hold its sub-agents' (``status.usage.tokens``): never summed again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from agentrun.api import models as m
from agentrun.core.subagents import Member

DATA_FORMATS = ("json", "yaml")
"""``-o`` values every read verb accepts."""
GRAPH_FORMATS = ("mermaid", "dot")
"""``-o`` values that draw the plan (status) or the family (tree: mermaid only)."""

PHASE_COLOURS: Mapping[str, str] = {
    "Succeeded": "#c8e6c9",
    "Failed": "#ffcdd2",
    "Running": "#bbdefb",
    "Launching": "#bbdefb",
    "WaitingForApproval": "#fff9c4",
    "BackingOff": "#ffe0b2",
    "Cancelled": "#e0e0e0",
    "Skipped": "#eeeeee",
}
"""Fill colours of a node by phase (others stay the renderer's default)."""


# -- json / yaml ----------------------------------------------------------------------------------


def dump(value: Any, output: str) -> str:
    """``value`` as JSON (four spaces, like kubectl) or YAML, ending in a newline."""
    if output == "json":
        return json.dumps(value, indent=4, ensure_ascii=False) + "\n"
    if output == "yaml":
        return yaml.safe_dump(value, sort_keys=False, allow_unicode=True)
    raise ValueError(f"not a data format: {output}")


def as_kubectl_shows(body: Mapping[str, Any]) -> dict[str, Any]:
    """An object as ``kubectl get -o yaml`` shows it: without ``metadata.managedFields``."""
    shown = dict(body)
    meta = dict(shown.get("metadata") or {})
    meta.pop("managedFields", None)
    shown["metadata"] = meta
    return shown


def family_object(member: Member) -> dict[str, Any]:
    """A family (``tree``) as nested objects: each run's name, uid, phase, tokens (its
    ``status.usage.tokens``, which hold its sub-agents': the top run's are the family's) and
    its children."""
    return {
        "name": member.name,
        "uid": member.uid,
        "phase": member.phase,
        "tokens": member.tokens,
        "children": [family_object(kid) for kid in member.children],
    }


# -- the plan's DAG ---------------------------------------------------------------------------


def _phases(run: m.AgentRun) -> dict[str, str]:
    steps = run.status.steps if run.status else None
    return {st.name: str(st.phase) for st in steps or []}


def _edges(steps: Sequence[m.Step]) -> list[tuple[str, str]]:
    """(dependency, dependent) for each dependsOn naming a step of the plan."""
    names = {s.name for s in steps}
    return [(dep, s.name) for s in steps for dep in s.depends_on or [] if dep in names]


def _mermaid_text(text: str) -> str:
    """Text inside a quoted Mermaid label: quotes and markup characters as entities."""
    return "".join({'"': "#quot;", "<": "#lt;", ">": "#gt;"}.get(c, c) for c in text)


def _mermaid_styles(ids_by_phase: Mapping[str, list[str]]) -> list[str]:
    lines = []
    for phase, ids in ids_by_phase.items():
        colour = PHASE_COLOURS.get(phase)
        if colour and ids:
            lines.append(f"    classDef {phase} fill:{colour}")
            lines.append(f"    class {','.join(ids)} {phase}")
    return lines


def plan_mermaid(run: m.AgentRun) -> str:
    """The plan as a Mermaid flowchart: ``sN["name<br/>phase"]``, dependency --> dependent."""
    steps = run.spec.plan.steps
    phases = _phases(run)
    ids = {s.name: f"s{i}" for i, s in enumerate(steps)}
    lines = ["flowchart TD"]
    by_phase: dict[str, list[str]] = {}
    for s in steps:
        phase = phases.get(s.name, "Pending")
        by_phase.setdefault(phase, []).append(ids[s.name])
        lines.append(f'    {ids[s.name]}["{_mermaid_text(s.name)}<br/>{phase}"]')
    lines.extend(f"    {ids[a]} --> {ids[b]}" for a, b in _edges(steps))
    lines.extend(_mermaid_styles(by_phase))
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def plan_dot(run: m.AgentRun) -> str:
    """The plan as a Graphviz digraph: a box per step labelled ``name\\nphase``."""
    steps = run.spec.plan.steps
    phases = _phases(run)
    lines = [
        f'digraph "{_dot_text(f"agentrun/{run.metadata.name}")}" {{',
        "    rankdir=TB;",
        '    node [shape=box, style="rounded,filled", fillcolor="#ffffff"];',
    ]
    for s in steps:
        phase = phases.get(s.name, "Pending")
        colour = PHASE_COLOURS.get(phase, "#ffffff")
        lines.append(
            f'    "{_dot_text(s.name)}" [label="{_dot_text(s.name)}\\n{phase}", '
            f'fillcolor="{colour}"];'
        )
    lines.extend(f'    "{_dot_text(a)}" -> "{_dot_text(b)}";' for a, b in _edges(steps))
    lines.append("}")
    return "\n".join(lines) + "\n"


def family_mermaid(root: Member) -> str:
    """A family as a Mermaid flowchart: each run with its phase and tokens (a parent's said to
    hold its sub-agents'), parent --> child."""
    lines = ["flowchart TD"]
    edges: list[str] = []
    by_phase: dict[str, list[str]] = {}
    count = 0

    def visit(member: Member) -> str:
        nonlocal count
        node = f"r{count}"
        count += 1
        by_phase.setdefault(member.phase, []).append(node)
        tokens = f"{member.tokens} tokens" + (" with sub-agents" if member.children else "")
        lines.append(f'    {node}["{_mermaid_text(member.name)}<br/>{member.phase}<br/>{tokens}"]')
        for kid in member.children:
            edges.append(f"    {node} --> {visit(kid)}")
        return node

    visit(root)
    return "\n".join([*lines, *edges, *_mermaid_styles(by_phase)]) + "\n"
