"""A step's arguments as the state machine judges them.

The inputs a step gets from its dependencies' results (:func:`resolve_inputs`), its args hash
over everything that decides what its pod runs and as whom (:func:`args_hash`), and the
approval rules keyed on that hash (:func:`needs_approval`, :func:`decision_for`). Launching a
step (:mod:`.launch`) and accepting a carried result (:mod:`.carried`) both ask these
questions, so they live apart from either.

Imports :mod:`.turns`, never the builder or the loop: the agent loop asks these questions too
(the argsHash it names when it accepts a tool call is the one the call's launch computes and an
approval binds to).
"""

from __future__ import annotations

import json

from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import naming
from agentrun.core.turns import Host, context_inputs

UNHASHABLE = (
    "the step's settings cannot be hashed for approval (stepTemplate.securityContext or "
    "containerSecurityContext nested too deeply)"
)


def args_hash(run: m.AgentRun, step: m.Step, input_digests: dict[str, str]) -> str | None:
    """The step's args hash: everything that decides what its pod runs and as whom (see
    :func:`naming.args_hash` for exactly what is covered); None when a free-form setting is
    nested too deeply to serialize (such a step cannot run: nothing could approve it)."""
    template = run.spec.step_template or m.StepTemplate()
    resources = step.container.resources or template.resources
    try:
        return naming.args_hash(
            step.container.image,
            step.container.command or [],
            step.container.args or [],
            [e.to_wire() for e in step.container.env or []],
            input_digests,
            working_dir=step.container.working_dir,
            resources=resources.to_wire() if resources is not None else None,
            service_account_name=template.service_account_name,
            security_context=template.security_context,
            container_security_context=template.container_security_context,
        )
    except (RecursionError, ValueError):
        return None


def needs_approval(run: m.AgentRun, step: m.Step) -> bool:
    """Whether ``step`` is gated: its approval is Required, or policy.approvalRequiredFor
    lists its risk."""
    if step.approval == m.ApprovalMode.REQUIRED:
        return True
    gated = run.spec.policy.approval_required_for if run.spec.policy else None
    return bool(gated) and step.risk in (gated or [])


def decision_for(run: m.AgentRun, step: str, args_hash: str) -> m.Approval | None:
    """The decision that counts for (step, args hash): a rejection wins over an approval."""
    matching = [a for a in run.spec.approvals or [] if a.step == step and a.args_hash == args_hash]
    rejections = [a for a in matching if a.decision == m.ApprovalDecision.REJECT]
    if rejections:
        return rejections[0]
    return matching[0] if matching else None


def resolve_inputs(b: Host, step: m.Step) -> tuple[tuple[m.EnvVar, ...], dict[str, str]] | str:
    """Env vars carrying dependency results, and the digest of each; or why one is missing."""
    env: list[m.EnvVar] = []
    digests: dict[str, str] = {}
    for inp in step.inputs or []:
        src = b.steps.get(inp.from_step)
        if src is None or src.phase != SP.SUCCEEDED:
            return f"input {inp.name}: step {inp.from_step} has not succeeded"
        if src.result_ref is not None:
            key = src.result_ref.key if inp.key is None else f"field.{inp.key}"
            env.append(
                m.EnvVar(
                    name=inp.name,
                    value_from=m.EnvVarSource(
                        config_map_key_ref=m.ConfigMapKeySelector(name=src.result_ref.name, key=key)
                    ),
                )
            )
            digests[inp.name] = naming.sha256_text(
                f"{src.result_ref.name}/{key}/{src.result_digest or ''}"
            )
            continue
        value = src.result or ""
        if inp.key is not None:
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                parsed = None
            if not isinstance(parsed, dict) or inp.key not in parsed:
                return (
                    f"input {inp.name}: the result of step {inp.from_step} has no field '{inp.key}'"
                )
            field_value = parsed[inp.key]
            value = (
                field_value if isinstance(field_value, str) else naming.canonical_json(field_value)
            )
        env.append(m.EnvVar(name=inp.name, value=value))
        digests[inp.name] = naming.sha256_text(value)
    # A model turn's context: the run's own record, passed like an input of a result kept
    # by reference (by the ConfigMap's keys; its digest is in the args hash).
    context_env, context_digests = context_inputs(b.status.agent, step.name)
    env += context_env
    digests.update(context_digests)
    return tuple(env), digests
