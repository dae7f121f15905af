"""Results carried from an earlier run (``spec.carriedResults``), accepted or refused once:
when the step is first seen.

A carried result is accepted only when it is what its source run committed for the step's
current arguments (and, for a gated step, those arguments are approved in this run): the step
then counts as Succeeded and runs no Job. Otherwise the refusal is recorded and the step runs.
Dependencies are judged first, since a step's args hash covers their results.

Imports :mod:`.builder` and :mod:`.arguments`.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import naming
from agentrun.core.arguments import (
    UNHASHABLE,
    args_hash,
    decision_for,
    needs_approval,
    resolve_inputs,
)
from agentrun.core.builder import Builder, truncate


def carry_results(
    b: Builder, to_carry: Sequence[m.Step], carried: dict[str, m.CarriedResult]
) -> None:
    """Accept or refuse, once, the carried results of steps seen for the first time.

    Dependencies first: a step's args hash covers its inputs, which are its dependencies'
    results, so it is known only once they are carried (or not).
    """
    pending = list(to_carry)
    while pending:
        waiting = {s.name for s in pending}
        ready = [s for s in pending if not waiting & set(s.depends_on or [])]
        if not ready:  # pragma: no cover - the plan is acyclic (plan_problems ran first)
            ready = pending[:1]
        for step in ready:
            pending.remove(step)
            st = b.steps[step.name]
            refused = _refuse_carried(b, step, st, carried[step.name])
            if refused is None:
                _carry(b, st, carried[step.name])
            else:
                origin = carried[step.name].from_run or "an unnamed run"
                text = truncate(
                    f"step {step.name}: the result carried from {origin} is refused "
                    f"({refused}); the step runs",
                    256,
                )
                st.message = truncate(f"carried result refused: {refused}")
                b.record(step.name, None, SP.PENDING, "CarriedResultRefused", text)


def _refuse_carried(
    b: Builder, step: m.Step, st: m.StepStatus, carried: m.CarriedResult
) -> str | None:
    """Why a carried result cannot be accepted, or None when it can: it must be what its
    source run committed for the step's current arguments, and a gated step's arguments must
    be approved in this run."""
    not_carried = [d for d in step.depends_on or [] if b.steps[d].phase != SP.SUCCEEDED]
    if not_carried:
        return f"dependency {not_carried[0]} was not carried"
    if carried.args_hash is None:
        return "the entry has no argsHash"
    resolved = resolve_inputs(b, step)
    if isinstance(resolved, str):  # pragma: no cover - every dependency succeeded
        return resolved
    h = args_hash(b.run, step, resolved[1])
    if h is None:
        return UNHASHABLE
    st.args_hash = h
    if carried.args_hash != h:
        return f"it is for args {carried.args_hash[:12]}, the step now has args {h[:12]}"
    namespace = (carried.from_run or "").partition("/")[0]
    if not carried.from_run or namespace != b.run.metadata.namespace:
        return f"fromRun must name a run in namespace {b.run.metadata.namespace}"
    source = b.observed.carried_sources.get(step.name)
    if source is None or source.run != carried.from_run:
        return f"{carried.from_run} has no committed result of this step"
    if source.args_hash != carried.args_hash:
        return f"{carried.from_run} committed it for other args"
    digest = carried.result_digest
    if carried.result is not None:
        inline = naming.sha256_text(carried.result)
        if digest is not None and digest != inline:
            return "resultDigest is not the digest of result"
        digest = inline
    if digest != source.result_digest or (carried.summary or None) != (
        source.summary[:1024] if source.summary else None
    ):
        return f"it is not the result {carried.from_run} committed"
    if needs_approval(b.run, step):
        decision = decision_for(b.run, step.name, h)
        if decision is None or decision.decision != m.ApprovalDecision.APPROVE:
            return f"the step needs approval and spec.approvals does not approve args {h[:12]}"
    return None


def _carry(b: Builder, st: m.StepStatus, carried: m.CarriedResult) -> None:
    """A result committed by an earlier run: the step counts as Succeeded, runs no Job."""
    st.summary = carried.summary
    st.result = carried.result
    st.result_ref = carried.result_ref
    st.result_digest = carried.result_digest
    st.finished_at = b.now
    origin = f" of {carried.from_run}" if carried.from_run else ""
    b.move(st, SP.SUCCEEDED, "Carried", f"result carried over from the run{origin}")
