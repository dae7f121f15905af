"""The plan as a graph: what is wrong with it, in which order it can run, what follows a step."""

from __future__ import annotations

from collections.abc import Sequence

from agentrun.api.models import Step


def find_cycle(steps: Sequence[Step]) -> list[str] | None:
    """A dependency cycle as a closed path ``[a, b, a]``, or None when the plan is acyclic."""
    deps = {s.name: [d for d in (s.depends_on or []) if d != s.name] for s in steps}
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(deps, white)
    for root in deps:
        if colour[root] != white:
            continue
        path: list[str] = [root]
        iters = [iter(deps[root])]
        colour[root] = grey
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = black
                iters.pop()
                continue
            if nxt not in colour:
                continue
            if colour[nxt] == grey:
                start = path.index(nxt)
                # path follows dependsOn edges: a depends on b; report in run order.
                cycle = [*path[start:], nxt]
                cycle.reverse()
                return cycle
            if colour[nxt] == white:
                colour[nxt] = grey
                path.append(nxt)
                iters.append(iter(deps[nxt]))
    return None


def downstream(steps: Sequence[Step], start: str) -> set[str]:
    """``start`` and every step that depends on it, directly or through other steps."""
    dependents: dict[str, list[str]] = {}
    for s in steps:
        for d in s.depends_on or []:
            dependents.setdefault(d, []).append(s.name)
    found = {start}
    todo = [start]
    while todo:
        for child in dependents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def plan_problems(steps: Sequence[Step]) -> list[str]:
    """Everything that makes a plan impossible to run, each said so a person can fix it.

    Admission (the CRD's CEL rules) rejects most of these already; the core checks again so a
    plan that slipped through (an older CRD, a direct etcd write) ends with a clear reason
    instead of hanging.
    """
    problems: list[str] = []
    names = [s.name for s in steps]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            problems.append(f"step name '{name}' is used more than once")
        seen.add(name)
    for step in steps:
        for dep in step.depends_on or []:
            if dep == step.name:
                problems.append(f"step '{step.name}' depends on itself")
            elif dep not in seen:
                problems.append(
                    f"step '{step.name}' dependsOn '{dep}' which is not a step of this plan"
                )
        for inp in step.inputs or []:
            if inp.from_step not in (step.depends_on or []):
                problems.append(
                    f"step '{step.name}' input '{inp.name}' reads step '{inp.from_step}', "
                    "which is not in its dependsOn"
                )
    if not problems:
        cycle = find_cycle(steps)
        if cycle is not None:
            problems.append("dependency cycle: " + " -> ".join(cycle))
    return problems
