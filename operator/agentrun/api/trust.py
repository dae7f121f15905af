"""The trust table: every input that decides what a step runs, where, as whom, with what input,
or what is committed as its result; who can write it, from when it is frozen, how the operator
verifies it where it uses it, and what an attacker's change does in each phase of a step.

One list (:data:`TABLE`) is the source of three things: the "Trust table" section of
docs/design.md (``python -m agentrun.api.trust --markdown``, ``make trust-table``), the unit
tests that every field of the AgentRun CRD and every resource the operator may read has an
entry (tests/unit/test_trust.py), and the attack cases of tests/e2e/test_trust_attacks.py, one
per (entry, phase, actor, kind of attack): :func:`cases`.

The actors are the namespace users of the trust model: one holding the built-in ``edit``
ClusterRole in the run's namespace (into which ``agentrun-edit`` aggregates), one holding only
``agentrun-edit``, and one who may only create and read AgentRuns. What each may write is
:data:`WRITES` (their RBAC); an entry none of them may write is refused for all of them.

Proof of origin. An object found in a namespace proves nothing by its name, its labels or
annotations, its owner references, its immutability or its spec: every namespace user of the
trust model can write all of them, and can write them first, in the exact shape the operator or
a step would (the *mimic*). What the operator or a step finds counts as "the operator's own" or
"a step's own" only through a proof no namespace user can make (the operator's HMAC, keyed by a
Secret in the operator's own namespace and bound to the object's name, the attempt and the
content's digest), through a uid or a content digest the operator itself committed to status
after it made the object, or through a fact only the API server or the node writes (a pod's
termination message, written by the kubelet; the identity the API server's admission recorded
at create). Each entry says which of those routes it rests on (:attr:`Entry.proven`,
:class:`Origin`); a shape (:data:`SHAPES`) is never one. And each entry is attacked twice
(:class:`Attack`): by a *change* of what is there, and by the *mimic*: the exact object or
value the legitimate writer would write, computed from the run's status, the approval request
and the operator's own naming and manifest functions, written before that writer where the
phase allows it, and after it (the same write, or a delete-and-recreate of the exact object)
otherwise.

The vocabulary (phases, actors, checks, origins, outcomes, the actors' RBAC) is
:mod:`agentrun.api.trust_terms`; the rows are :mod:`agentrun.api.trust_run_rows` (the AgentRun:
its metadata, spec and status) and :mod:`agentrun.api.trust_object_rows` (the Jobs, pods,
ConfigMaps and Secrets around it), joined here in the order the table lists them.

Pure data: no kopf, no kubernetes client.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from agentrun.api.trust_object_rows import OBJECT_ROWS
from agentrun.api.trust_run_rows import RUN_ROWS
from agentrun.api.trust_terms import (
    NEW_RUNS,
    RUN_STATUS,
    SHAPES,
    WRITES,
    Actor,
    Attack,
    Check,
    Entry,
    Expect,
    Frozen,
    Origin,
    Outcome,
    Phase,
    Writer,
)

__all__ = [
    "BEGIN",
    "END",
    "NEW_RUNS",
    "RUN_STATUS",
    "SHAPES",
    "TABLE",
    "WRITES",
    "Actor",
    "Attack",
    "Case",
    "Check",
    "Entry",
    "Expect",
    "Frozen",
    "Origin",
    "Outcome",
    "Phase",
    "Writer",
    "cases",
    "covers",
    "entry",
    "main",
    "markdown",
    "replace_in",
    "shapes_as_proof",
    "summary",
    "uncovered",
]

TABLE: tuple[Entry, ...] = (*RUN_ROWS, *OBJECT_ROWS)
"""Every input, in the order docs/design.md's table lists them."""


@dataclass(frozen=True)
class Case:
    """One attack: ``actor`` makes an attack of ``kind`` on ``entry`` while its step is in
    ``phase``."""

    entry: Entry
    phase: Phase
    actor: Actor
    expect: Expect = field(compare=False)
    kind: Attack = Attack.CHANGE

    @property
    def id(self) -> str:
        name = f"{self.entry.id}/{self.phase.name.lower()}/{self.actor}"
        return name if self.kind is Attack.CHANGE else f"{name}/{self.kind}"


def cases(table: Sequence[Entry] = TABLE) -> Iterator[Case]:
    """Every (entry, phase, actor, kind of attack), with what it is declared to end in."""
    for kind in Attack:
        for entry in table:
            for phase in Phase:
                for actor in Actor:
                    yield Case(entry, phase, actor, entry.expect(phase, actor, kind), kind)


def shapes_as_proof(table: Sequence[Entry] = TABLE) -> list[str]:
    """The entries whose proof of origin is missing or names a shape (:data:`SHAPES`)."""
    return [e.id for e in table if not e.proven or SHAPES & set(e.proven)]


def entry(entry_id: str) -> Entry:
    return next(e for e in TABLE if e.id == entry_id)


def covers(pattern: str, path: str) -> bool:
    """Whether a ``fields`` pattern covers a CRD field path (``a.**`` covers ``a`` and below)."""
    if pattern.endswith(".**"):
        root = pattern[: -len(".**")]
        return path == root or path.startswith(root + ".") or path.startswith(root + "[]")
    return fnmatch.fnmatchcase(path, pattern.replace("[]", "[[]]"))


def uncovered(paths: Sequence[str], table: Sequence[Entry] = TABLE) -> list[str]:
    """The field paths no entry covers."""
    return [p for p in paths if not any(covers(f, p) for e in table for f in e.fields)]


# -- the table as docs/design.md shows it -------------------------------------------------------

BEGIN = "<!-- trust-table: generated by `make trust-table`; do not edit -->"
END = "<!-- end of trust-table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _outcomes(e: Entry, kind: Attack = Attack.CHANGE) -> str:
    """Per phase, what an attack of ``kind`` by an actor who may write it does: phases with
    the same outcome are joined."""
    groups: dict[Expect, list[str]] = {}
    for phase in Phase:
        groups.setdefault(e.outcomes_of(kind)[phase], []).append(phase.value)
    parts = []
    for expect, phases in groups.items():
        what = expect.outcome.value + (f" ({expect.reason})" if expect.reason else "")
        parts.append(("always" if len(phases) == len(Phase) else ", ".join(phases)) + ": " + what)
    return "; ".join(parts)


def _mimic(e: Entry) -> str:
    ends = "ends as the change does" if e.mimic is None else _outcomes(e, Attack.MIMIC)
    return f"{e.mimic_is}: {ends}"


def _may_write(e: Entry) -> str:
    actors = [a.value for a in Actor if e.resource in WRITES[a]]
    return ", ".join(actors) if actors else "none"


def summary(table: Sequence[Entry] = TABLE) -> list[str]:
    """The count of cases, by kind of attack, actor and outcome."""
    counts: dict[tuple[Attack, Actor, Outcome], int] = {}
    for case in cases(table):
        key = (case.kind, case.actor, case.expect.outcome)
        counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    lines = [
        f"{len(table)} entries, {total} attack cases (entry x phase x actor x kind of attack):",
        "",
    ]
    for kind in Attack:
        for actor in Actor:
            found = [
                f"{o.value} {counts[kind, actor, o]}" for o in Outcome if (kind, actor, o) in counts
            ]
            lines.append(f"- {kind.value}, by {actor.value}: " + ", ".join(found) + ".")
    return lines


def markdown(table: Sequence[Entry] = TABLE) -> str:
    """The table of docs/design.md, between :data:`BEGIN` and :data:`END`."""
    lines = [
        BEGIN,
        "",
        "| input | object and field | written by | of the actors, may write | frozen from "
        "| verified by | proven by | a change, by phase of the step | the mimic, by phase "
        "| known gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in table:
        gap = f"[not enforced yet](#trust-model): {e.gap} ..." if e.gap else ""
        fields = f" (CRD: `{'`, `'.join(e.fields)}`)" if e.fields else ""
        row = [
            f"`{e.id}`",
            f"{e.object} `{e.path}`{fields}",
            ", ".join(w.value for w in e.writers),
            _may_write(e),
            e.frozen.value,
            ", ".join(c.value for c in e.checks),
            ", ".join(o.value for o in e.proven),
            _outcomes(e),
            _mimic(e),
            gap,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines += ["", *summary(table), "", END]
    return "\n".join(lines) + "\n"


def replace_in(text: str, table: Sequence[Entry] = TABLE) -> str:
    """``text`` (docs/design.md) with its generated table replaced by the current one."""
    head, _, rest = text.partition(BEGIN)
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return head + markdown(table).rstrip("\n") + tail


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrun.api.trust", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--update", metavar="FILE", help="replace the table in FILE")
    args = parser.parse_args(argv)
    if args.update:
        with open(args.update, encoding="utf-8") as f:
            text = f.read()
        with open(args.update, "w", encoding="utf-8") as f:
            f.write(replace_in(text))
        return 0
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
