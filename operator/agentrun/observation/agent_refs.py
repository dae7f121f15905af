"""Reading the Agent a run names (``spec.agentRef``) and its ModelConfig, for the core
(:class:`agentrun.core.observed.Definition`; what it amounts to is
:mod:`agentrun.core.agent_refs`'s).

The reads, in their order, each only once the one before allowed it:

1. a LocalSubjectAccessReview: may the run's creator ``get`` the Agent? (before anything of it
   is read, so a refusal tells nothing about it);
2. the Agent, by name in the run's namespace;
3. for its ``modelConfigRef``: may the creator ``get`` the ModelConfig? then the ModelConfig;
4. may the creator ``get`` every Secret the two name (the model's key and its fallbacks', the
   tools' env and header Secrets, the MCP servers' header Secrets)? The steps that use them
   are checked again when launched, as every step is; this check fails the run at once, before
   any turn, and names what is missing.

Made on the run's first passes only: once the run has taken the Agent (its status holds the
definition), nothing is read again.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from agentrun.access import authz
from agentrun.api import agent_defs as d
from agentrun.api import models as m
from agentrun.core import agent_refs, rights
from agentrun.core.observed import Definition
from agentrun.kubeapi import tolerate

log = logging.getLogger("agentrun.agents")

PURPOSE = "a run uses an Agent only with its creator's rights to read it and what it names"


def read_definition(
    run: m.AgentRun, custom_api: Any, authorizer: authz.Authorizer
) -> Definition | None:
    """The Agent ``run`` names and its ModelConfig, read and checked; None when the run needs
    none (no agentRef, or it took its Agent already). An API error other than 404
    propagates (the pass is retried)."""
    if not agent_refs.needs_definition(run):
        return None
    ref = run.spec.agent_ref
    assert ref is not None
    namespace = run.metadata.namespace

    def refused(problem: str) -> Definition:
        log.info("cannot take Agent %s: %s", ref.name, problem,
                 extra={"agentrun": {"run": f"{namespace}/{run.metadata.name}"}})  # fmt: skip
        return Definition(problem=problem)

    check = rights.Check("get", d.AGENT_PLURAL, ref.name, "spec.agentRef", group=m.GROUP)
    denied = authorizer.denied(run, [check], PURPOSE)
    if denied is not None:
        return refused(denied)
    agent = _read(custom_api, namespace, d.AGENT_PLURAL, ref.name, d.AgentObject)
    if isinstance(agent, str):
        return refused(f"Agent {ref.name}: {agent}")
    model: d.ModelConfigObject | None = None
    config_ref = agent.spec.model_config_ref
    if config_ref is not None:
        check = rights.Check("get", d.MODEL_CONFIG_PLURAL, config_ref.name,
                             f"Agent {ref.name} modelConfigRef", group=m.GROUP)  # fmt: skip
        denied = authorizer.denied(run, [check], PURPOSE)
        if denied is not None:
            return refused(denied)
        read = _read(custom_api, namespace, d.MODEL_CONFIG_PLURAL, config_ref.name,
                     d.ModelConfigObject)  # fmt: skip
        if isinstance(read, str):
            return refused(
                f"ModelConfig {config_ref.name} (modelConfigRef of Agent {ref.name}): {read}"
            )
        model = read
    resolved = agent_refs.resolve(ref, agent, model)
    if isinstance(resolved, str):
        return refused(resolved)
    checks: dict[str, rights.Check] = {}
    for secret, where in agent_refs.secrets_named(resolved):
        checks.setdefault(
            secret, rights.Check("get", "secrets", secret, f"Agent {ref.name} {where}")
        )
    denied = authorizer.denied(run, list(checks.values()), PURPOSE)
    if denied is not None:
        return refused(denied)
    return Definition(agent=agent, model=model)


def _read(custom_api: Any, namespace: str, plural: str, name: str, kind: Any) -> Any:
    """The object as ``kind`` reads it; a string saying why there is none."""
    with tolerate(404) as missing:
        response = custom_api.get_namespaced_custom_object(
            m.GROUP, m.VERSION, namespace, plural, name, _preload_content=False
        )
    if missing:
        return f"not found in namespace {namespace}: create it, or name another"
    body = json.loads(response.data)
    try:
        return kind.model_validate(body)
    except ValidationError as error:
        return f"cannot be read as one: {agent_refs.first_error(error)}"
