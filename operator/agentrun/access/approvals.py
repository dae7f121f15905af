"""Recording a person's decision on a gated step: an entry appended to ``spec.approvals``.

One implementation for every client that decides: ``kubectl agentrun approve|reject`` and
:class:`agentrun.clients.typed.AgentRunClient`. A decision

* names the step's current ``argsHash`` (from status), so it covers exactly the arguments the
  person saw; a step without one cannot be decided yet;
* names a step of the plan, or a step of an agent run's current turn (a tool call such as
  ``t3-0-restart``);
* is signed (``by``) by the user the API server knows the caller as; the admission policies
  refuse any other signature (manifests/admission/validating-policy.yaml);
* is appended by a JSON patch whose first op tests ``metadata.resourceVersion``: the patch
  applies to the run exactly as it was read, or fails (409, or 422 for a failed test op), and
  is then re-derived from a fresh read. A decision already recorded (same step, hash, decision
  and user) is not appended twice.

The API calls are the caller's (``read`` and ``patch``), so each client keeps its own
connection and its own error messages; refusals of the patch other than "the run moved on"
propagate as the ``ApiException`` the caller's ``patch`` raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.core import agent_loop, agent_refs

CONFLICT_RETRIES = 5
"""Fresh reads before giving up on a run that keeps changing under the decision."""

ReadRun = Callable[[], tuple[dict[str, Any], m.AgentRun]]
"""The run as stored (for the patch's resourceVersion test) and parsed."""
PatchRun = Callable[[list[dict[str, Any]]], object]
"""Apply a JSON patch to the run; raises ``ApiException`` when refused."""


class DecisionRefused(Exception):
    """The decision cannot be recorded now; the message says why and what to do."""


@dataclass(frozen=True)
class Recorded:
    """A decision in ``spec.approvals``: the entry, and whether it was there already."""

    run: m.AgentRun
    """The run as read just before the entry was appended (or found)."""
    entry: m.Approval
    already: bool


def _ref(run: m.AgentRun) -> str:
    return f"agentrun/{run.metadata.name}"


def _step_status(run: m.AgentRun, step: str) -> m.StepStatus | None:
    steps = run.status.steps if run.status else None
    return next((st for st in steps or [] if st.name == step), None)


def decidable(
    run: m.AgentRun, step: str, force: bool, *, force_hint: str = "--force"
) -> m.StepStatus:
    """The status of ``step`` if a decision on it can be recorded now; else
    :class:`DecisionRefused` saying why not. ``force`` accepts a step that is not waiting for
    approval (or a finished run), as long as it has an argsHash; ``force_hint`` is how the
    caller's user asks for that (a flag, an argument)."""
    agent = agent_refs.effective(run).spec.agent  # a run of an Agent: the agent it took
    current = agent_loop.dynamic_names(run.status.agent if run.status else None, agent)
    if run.step(step) is None and step not in current:
        names = ", ".join([*(s.name for s in run.spec.plan.steps), *sorted(current)])
        raise DecisionRefused(
            f"step '{step}' is not a step of {_ref(run)} in namespace "
            f"'{run.metadata.namespace}' (its steps: {names})"
        )
    st = _step_status(run, step)
    phase = st.phase if st else "not evaluated yet"
    if st is None or not st.args_hash:
        raise DecisionRefused(
            f"step '{step}' of {_ref(run)} has no argsHash yet (phase {phase}): the operator "
            "computes it once the step's dependencies have succeeded; a decision must name it"
        )
    if force:
        return st
    run_phase = run.status.phase if run.status else None
    if run_phase in m.TERMINAL_RUN_PHASES:
        raise DecisionRefused(
            f"{_ref(run)} has already finished ({run_phase}); its argsHash is "
            f"{st.args_hash}; use {force_hint} to record a decision anyway"
        )
    if st.phase != m.StepPhase.WAITING_FOR_APPROVAL:
        raise DecisionRefused(
            f"step '{step}' is not waiting for approval (phase {st.phase}); its argsHash is "
            f"{st.args_hash}; use {force_hint} to record a decision on these arguments anyway"
        )
    return st


def approval_entry(
    step: str,
    decision: m.ApprovalDecision,
    args_hash: str,
    by: str,
    reason: str | None,
    at: datetime,
) -> dict[str, Any]:
    """The ``spec.approvals`` entry, as JSON (an empty reason is left out)."""
    return m.Approval(
        step=step, decision=decision, args_hash=args_hash, by=by, reason=reason or None, at=at
    ).to_wire()


def append_approval_patch(body: dict[str, Any], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch appending ``entry`` to spec.approvals, only if the run is unchanged."""
    version = (body.get("metadata") or {}).get("resourceVersion")
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version}
    ]
    if (body.get("spec") or {}).get("approvals") is None:
        ops.append({"op": "add", "path": "/spec/approvals", "value": [entry]})
    else:
        ops.append({"op": "add", "path": "/spec/approvals/-", "value": entry})
    return ops


def record(
    name: str,
    read: ReadRun,
    patch: PatchRun,
    *,
    step: str,
    decision: m.ApprovalDecision,
    by: str,
    reason: str | None,
    force: bool,
    now: Callable[[], datetime],
    force_hint: str = "--force",
) -> Recorded:
    """Append ``by``'s decision on ``step`` of run ``name`` to spec.approvals (see the module
    docstring). Raises :class:`DecisionRefused` when the step cannot be decided, the list is
    full or the run kept changing; the ``ApiException`` of any other refusal of the patch."""
    for attempt in range(CONFLICT_RETRIES):
        if attempt:
            time.sleep(0.2 * attempt)
        body, run = read()
        args_hash = str(decidable(run, step, force, force_hint=force_hint).args_hash)
        approvals = run.spec.approvals or []
        for existing in approvals:
            if (existing.step, existing.args_hash, existing.decision, existing.by) == (
                step,
                args_hash,
                decision,
                by,
            ):
                return Recorded(run, existing, already=True)
        if len(approvals) >= m.MAX_APPROVALS:
            raise DecisionRefused(
                f"{_ref(run)} already holds {m.MAX_APPROVALS} decisions (spec.approvals is "
                "full); fork the run to start over"
            )
        entry = approval_entry(step, decision, args_hash, by, reason, now())
        try:
            patch(append_approval_patch(body, entry))
        except ApiException as error:
            if error.status == 409 or (error.status == 422 and _changed_since(read, body)):
                continue  # someone else changed the run meanwhile: read it again
            raise
        return Recorded(run, m.Approval.model_validate(entry), already=False)
    raise DecisionRefused(
        f"agentrun '{name}' kept changing while the decision was being recorded "
        f"({CONFLICT_RETRIES} tries); try again"
    )


def _changed_since(read: ReadRun, body: dict[str, Any]) -> bool:
    """Whether a refused patch failed its resourceVersion test (the run moved on), rather
    than being refused by validation or admission."""
    try:
        now, _ = read()
    except Exception:  # the run cannot be read again: report the refusal as it came
        return False
    old = (body.get("metadata") or {}).get("resourceVersion")
    return bool((now.get("metadata") or {}).get("resourceVersion") != old)
