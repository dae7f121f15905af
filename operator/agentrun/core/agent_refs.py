"""Runs of an Agent by reference (``spec.agentRef``), pure: what the Agent and its ModelConfig
amount to, what a run may override, and the run as every pass reads it.

The shell reads the objects with the creator's rights checked
(:mod:`agentrun.observation.agent_refs`) and hands the core a :class:`~agentrun.core.observed.
Definition`; on the run's first pass :func:`take` commits what it resolved to
``status.agent.definition``. From then on :func:`effective` gives every part of the operator
the run with ``spec.agent`` filled from that copy (in memory only: the operator never writes a
run's spec), so model turns, tool calls, approvals and the freeze of
:mod:`agentrun.core.frozen` work as for a run that wrote its agent out. Nothing is read from the
Agent again: a change of it, or of its ModelConfig, or its deletion, changes no run that
started.

A run whose ``spec.agentRef`` changes after its first pass fails with reason
``AgentSpecChanged`` (its digest is committed with the definition), as one whose
``spec.agent`` changes does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from agentrun.api import agent as a
from agentrun.api import agent_defs as d
from agentrun.api import models as m
from agentrun.api.base import SecretKeySelector
from agentrun.core import naming
from agentrun.core.observed import Definition

REFUSED = "AgentRefRefused"
"""Reason of a run whose Agent could not be taken."""
CHANGED = "AgentSpecChanged"
WAIT_SECONDS = 5
"""A run whose Agent the shell did not hand over in a pass is passed again after this long (the
shell reads it whenever :func:`needs_definition`; an API error fails the pass, which is
retried)."""


def ref_digest(ref: d.AgentRef) -> str:
    """sha256 of ``spec.agentRef`` (canonical JSON, defaults left out)."""
    return naming.sha256_text(naming.canonical_json(d.wire(ref)))


def definition_of(run: m.AgentRun) -> d.AgentDefinition | None:
    """The definition the run's status holds, if any."""
    agent = run.status.agent if run.status is not None else None
    return agent.definition if agent is not None else None


def needs_definition(run: m.AgentRun) -> bool:
    """Whether the shell must read the Agent ``run`` names: it names one, has not taken it yet,
    and has not ended."""
    if run.spec.agent_ref is None or definition_of(run) is not None:
        return False
    return run.status is None or run.status.phase not in m.TERMINAL_RUN_PHASES


def effective(run: m.AgentRun) -> m.AgentRun:
    """``run`` as the operator reads it: with ``spec.agent`` from ``status.agent.definition``
    when it names an Agent and took it; ``run`` itself otherwise (nothing is copied)."""
    return as_decided(run, run.status) if run.status is not None else run


def as_decided(run: m.AgentRun, status: m.AgentRunStatus) -> m.AgentRun:
    """``run`` as the actions of a pass that committed ``status`` must read it: with the agent
    the pass took, when it was the pass that took it (its first, usually)."""
    taken = status.agent.definition if status.agent is not None else None
    if run.spec.agent_ref is None or run.spec.agent is not None or taken is None:
        return run
    return with_definition(run, taken)


def with_definition(run: m.AgentRun, taken: d.AgentDefinition) -> m.AgentRun:
    """``run`` with ``spec.agent`` from ``taken`` (a shallow copy: ``run`` is unchanged)."""
    spec = run.spec.model_copy(update={"agent": taken.spec})
    return run.model_copy(update={"spec": spec})


def waiting_message(run: m.AgentRun) -> str:
    """The run's message while the shell has not read the Agent it names."""
    name = run.spec.agent_ref.name if run.spec.agent_ref is not None else ""
    return f"reading Agent {name} (spec.agentRef)"


def changed(run: m.AgentRun) -> str | None:
    """Why the run must stop: its ``spec.agentRef`` is not the one its definition was taken
    for (None when it is, or the run took none)."""
    taken = definition_of(run)
    ref = run.spec.agent_ref
    if taken is None:
        return None
    if ref is None:
        return (
            f"spec.agentRef was removed after the run started (it ran Agent {taken.agent.name}): "
            "the agent is fixed at creation; create a new run"
        )
    if ref_digest(ref) != taken.ref_digest:
        return (
            f"spec.agentRef changed after the run started (it ran Agent {taken.agent.name}, "
            f"generation {taken.agent.generation}): the agent is fixed at creation, so no "
            "further model turn or tool call runs; create a new run"
        )
    return None


def first_error(error: ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message``."""
    first = error.errors()[0]
    return ".".join(str(p) for p in first["loc"]) + f": {first['msg']}"


def resolve(
    ref: d.AgentRef, agent: d.AgentObject, model: d.ModelConfigObject | None
) -> a.Agent | str:
    """The ``spec.agent`` that Agent ``agent`` (with ModelConfig ``model``, None when it writes
    its model out) amounts to for a run with ``ref``; or why there is none."""
    spec = agent.spec
    allowed = set(spec.allow_overrides or [])
    wanted = d.wire(ref.overrides) if ref.overrides is not None else {}
    refused = sorted(k for k in wanted if d.Override(k) not in allowed)
    if refused:
        may = ", ".join(sorted(o.value for o in allowed)) or "nothing"
        return (
            f"spec.agentRef.overrides sets {', '.join(refused)}, which Agent "
            f"{agent.metadata.name} does not allow (its allowOverrides: {may}); remove them "
            "or ask its owners to allow them"
        )
    if spec.model_config_ref is not None:
        if model is None:  # pragma: no cover - the shell reads it or refuses
            return f"ModelConfig {spec.model_config_ref.name} was not read"
        endpoint = model.spec
    elif spec.model is not None:
        endpoint = spec.model
    else:  # pragma: no cover - the CRD requires one of them
        return f"Agent {agent.metadata.name} has neither modelConfigRef nor model"
    body = d.wire(spec)
    for key in ("modelConfigRef", "model", "allowOverrides"):
        body.pop(key, None)
    body["model"] = d.wire(endpoint)
    body.update(wanted)
    if ref.resume_from is not None:
        body["resumeFrom"] = d.wire(ref.resume_from)
    try:
        resolved = a.Agent.model_validate(body)
    except ValidationError as error:
        return f"Agent {agent.metadata.name} is not a valid agent: {first_error(error)}"
    size = len(naming.canonical_json(d.wire(resolved)))
    if size > d.MAX_DEFINITION_BYTES:
        return (
            f"Agent {agent.metadata.name} amounts to {size} bytes, more than the "
            f"{d.MAX_DEFINITION_BYTES} a run takes into its status; shorten its instructions, "
            "tools or descriptions"
        )
    return resolved


def secrets_named(agent: a.Agent) -> Iterator[tuple[str, str]]:
    """(Secret name, where) for every Secret ``agent`` names: the model's key and its
    fallbacks', the tools' env and header Secrets, the MCP servers' header Secrets."""
    for key, where in _model_keys(agent.model):
        yield key.name, where
    for tool in agent.tools or []:
        if tool.container is not None:
            for env in tool.container.env or []:
                source = env.value_from
                if source is not None and source.secret_key_ref is not None:
                    yield source.secret_key_ref.name, f"tool {tool.name} env {env.name}"
        if tool.http is not None:
            for header in tool.http.headers or []:
                if header.secret_key_ref is not None:
                    yield header.secret_key_ref.name, f"tool {tool.name} header {header.name}"
    for server in agent.mcp_servers or []:
        for mcp_header in server.headers or []:
            yield (
                mcp_header.secret_key_ref.name,
                f"MCP server {server.name} header {mcp_header.name}",
            )


def _model_keys(model: a.ModelEndpoint) -> Iterator[tuple[SecretKeySelector, str]]:
    """The API key Secrets of the model and of its fallbacks, in order."""
    if model.api_key_secret_ref is not None:
        yield model.api_key_secret_ref, "model"
    for index, fallback in enumerate(model.fallbacks or [], start=1):
        if fallback.api_key_secret_ref is not None:
            yield fallback.api_key_secret_ref, f"model fallback {index}"


def take(run: m.AgentRun, found: Definition | None) -> d.AgentDefinition | str | None:
    """What a pass commits for a run that names an Agent and has not taken it: the definition
    (the shell read and checked it), why the run fails (a string), or None when the shell has
    not read it in this pass (the pass waits)."""
    ref = run.spec.agent_ref
    if ref is None or found is None:
        return None
    if found.problem is not None:
        return found.problem
    if found.agent is None:  # pragma: no cover - a Definition has one or a problem
        return None
    resolved = resolve(ref, found.agent, found.model)
    if isinstance(resolved, str):
        return resolved
    model = found.model
    return d.AgentDefinition(
        agent=_source(found.agent.metadata),
        model_config_source=_source(model.metadata) if model is not None else None,
        ref_digest=ref_digest(ref),
        digest=naming.sha256_text(naming.canonical_json(d.wire(resolved))),
        spec=resolved,
    )


def _source(meta: d.DefinitionMeta) -> d.DefinitionSource:
    return d.DefinitionSource(
        name=meta.name,
        uid=meta.uid,
        generation=meta.generation,
        resource_version=meta.resource_version,
    )


# -- starting a run of an Agent (kubectl agentrun start, AgentRunClient.start) -----------------


def goal_problem(goal: str) -> str | None:
    """Why ``goal`` cannot be a run's goal; None when it can."""
    if not goal.strip():
        return "the goal is empty: say what the run is for (it becomes spec.goal)"
    if len(goal) > m.MAX_GOAL:
        return f"the goal is {len(goal)} characters; spec.goal holds at most {m.MAX_GOAL}"
    return None


def run_of(
    agent: str,
    goal: str,
    *,
    name: str | None = None,
    overrides: dict[str, int] | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """A new run of Agent ``agent`` with ``goal`` (named ``name``, else by the API server from
    ``AGENT-``), ``overrides`` (wire names: maxTurns, ...) and a token budget."""
    ref: dict[str, Any] = {"name": agent}
    if overrides:
        ref["overrides"] = dict(overrides)
    spec: dict[str, Any] = {"goal": goal, "agentRef": ref}
    if max_tokens is not None:
        spec["budget"] = {"maxTokens": max_tokens}
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": f"{agent[:57]}-"}
    return {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": metadata, "spec": spec}
