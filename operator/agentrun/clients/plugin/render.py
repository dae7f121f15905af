"""What the plugin prints: pure functions from runs and timeline entries to lines of text.

Nothing here talks to the API server, so the formatting is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agentrun.api import models as m

SHORT_HASH = 12
"""Characters of an argsHash shown to people (the operator's messages use as many)."""
DETAIL_LIMIT = 120
"""Longest summary or error shown in the status tree; `result` prints the whole thing."""


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def rfc3339(value: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    return utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float) -> str:
    """A short human duration in kubectl's style: 42s, 3m7s, 2h5m, 4d3h."""
    total = max(int(seconds), 0)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        minutes, secs = divmod(total, 60)
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    if total < 86400:
        hours, rest = divmod(total, 3600)
        minutes = rest // 60
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, rest = divmod(total, 86400)
    hours = rest // 3600
    return f"{days}d{hours}h" if hours else f"{days}d"


def short_hash(args_hash: str | None) -> str:
    return (args_hash or "")[:SHORT_HASH] or "?"


def one_line(text: str | None, limit: int = DETAIL_LIMIT) -> str:
    """The text on one line, shortened to ``limit`` characters."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns aligned with two spaces between them; the last column is not padded."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


# -- the plan as a graph -----------------------------------------------------------------------


def depths(steps: Sequence[m.Step]) -> dict[str, int]:
    """How deep each step sits in the plan: 0 without dependencies, else one more than its
    deepest dependency. Unknown dependencies and cycles (which admission refuses) count 0."""
    by_name = {s.name: s for s in steps}
    found: dict[str, int] = {}

    def depth(name: str, visiting: frozenset[str]) -> int:
        if name in found:
            return found[name]
        step = by_name.get(name)
        if step is None or name in visiting:
            return -1
        deps = step.depends_on or []
        value = 1 + max((depth(d, visiting | {name}) for d in deps), default=-1)
        found[name] = value
        return value

    for s in steps:
        depth(s.name, frozenset())
    return found


# -- status ------------------------------------------------------------------------------------


def _step_duration(st: m.StepStatus | None, now: datetime) -> str:
    if st is None or st.started_at is None:
        return "-"
    end = st.finished_at or now
    return duration((utc(end) - utc(st.started_at)).total_seconds())


def step_detail(
    st: m.StepStatus | None, now: datetime, carried: m.CarriedResult | None = None
) -> str:
    """What a person wants to know about a step in one line."""
    if st is None:
        return "not looked at yet"
    phase = st.phase
    if phase == m.StepPhase.WAITING_FOR_APPROVAL:
        return f"waiting for approval (args {short_hash(st.args_hash)})"
    if st.error is not None and phase in (
        m.StepPhase.FAILED,
        m.StepPhase.BACKING_OFF,
        m.StepPhase.SKIPPED,
        m.StepPhase.CANCELLED,
    ):
        message = one_line(st.error.message)
        text = f"{st.error.reason}: {message}" if message else st.error.reason
        if phase == m.StepPhase.BACKING_OFF and st.next_attempt_at is not None:
            wait = duration((utc(st.next_attempt_at) - utc(now)).total_seconds())
            text = f"retry in {wait} after {text}"
        return text
    if phase == m.StepPhase.SUCCEEDED:
        detail = one_line(st.summary or st.result or st.message)
        if carried is not None:
            origin = f" from {carried.from_run}" if carried.from_run else ""
            detail = f"{detail} (carried{origin})".lstrip()
        elif st.decided_by:
            detail = f"{detail} [approved by {st.decided_by}]".lstrip()
        return detail
    if phase in (m.StepPhase.RUNNING, m.StepPhase.LAUNCHING) and st.decided_by:
        return f"{one_line(st.message)} [approved by {st.decided_by}]".lstrip()
    return one_line(st.message)


def status_lines(run: m.AgentRun, now: datetime) -> list[str]:
    """``kubectl agentrun status``: a header, then the plan's steps as an indented tree."""
    status = run.status or m.AgentRunStatus()
    meta = run.metadata
    age = (
        duration((utc(now) - utc(meta.creation_timestamp)).total_seconds())
        if meta.creation_timestamp
        else "-"
    )
    plan = run.spec.plan.steps
    progress = status.progress or f"0/{len(plan)}"
    lines = [
        f"agentrun/{meta.name} in namespace {meta.namespace}",
        f"  phase:    {status.phase or 'Pending (not picked up by the operator yet)'}",
        f"  progress: {progress}",
        f"  age:      {age}",
    ]
    if status.message:
        lines.append(f"  message:  {one_line(status.message, 300)}")
    if run.spec.suspend and status.phase not in m.TERMINAL_RUN_PHASES:
        lines.append("  suspended: spec.suspend is true; no new step starts")
    if run.spec.cancel and status.phase not in m.TERMINAL_RUN_PHASES:
        lines.append("  cancelling: spec.cancel is true")
    for cond in status.conditions or []:
        if cond.type == "ApprovalPending" and cond.status == m.ConditionStatus.TRUE:
            lines.append(f"  approval: {one_line(cond.message, 300)}")
    waiting = [st.name for st in status.steps or [] if st.phase == m.StepPhase.WAITING_FOR_APPROVAL]
    for name in waiting:
        lines.append(f"  decide:   kubectl agentrun approve|reject {meta.name} {name}")
    lines.append("")

    by_name = {st.name: st for st in status.steps or []}
    carried = {c.step: c for c in run.spec.carried_results or []}
    level = depths(plan)
    rows = []
    for step in plan:
        st = by_name.get(step.name)
        rows.append(
            [
                "  " * max(level.get(step.name, 0), 0) + step.name,
                str(st.phase) if st else "-",
                str(st.attempt) if st and st.attempt else "-",
                _step_duration(st, now),
                ", ".join(step.depends_on or []) or "-",
                step_detail(st, now, carried.get(step.name)),
            ]
        )
    lines.extend(table(["STEP", "PHASE", "ATTEMPT", "DURATION", "AFTER", "DETAILS"], rows))
    return lines


# -- history -----------------------------------------------------------------------------------


def transition(entry: Mapping[str, Any]) -> str:
    """``from -> to``; a new step or run has no ``from``."""
    old = entry.get("from")
    return f"{old or '(new)'} -> {entry.get('to', '?')}"


def history_rows(entries: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per timeline entry: TIME STEP TRANSITION BY REASON MESSAGE."""
    rows = []
    for e in entries:
        step = str(e.get("step") or "")
        message = str(e.get("message") or "")
        prefix = f"step {step}: "
        if step and message.startswith(prefix):
            message = message[len(prefix) :]
        rows.append(
            [
                str(e.get("at") or "-"),
                step or "(run)",
                transition(e),
                str(e.get("by") or "-"),
                str(e.get("reason") or "-"),
                one_line(message, 200) or "-",
            ]
        )
    return rows


def history_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    return table(["TIME", "STEP", "TRANSITION", "BY", "REASON", "MESSAGE"], history_rows(entries))
