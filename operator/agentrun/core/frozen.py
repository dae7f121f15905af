"""What of a run is fixed at its creation: the model an agent run's turns call and the tools
the model is offered; and which plan steps may use the creator's rights (at the end, from
:func:`step_digest`).

Every model turn sends the API key (``spec.agent.model.apiKeySecretRef``) to
``spec.agent.model.baseURL``. Were the endpoint read from the spec on every turn, anyone allowed
to edit the run (``agentrun-edit``, who need not be allowed to read the Secret) could point the
next turn at a server of theirs and receive the key; the operator's check of the creator's
rights would not notice, since the Secret stays the creator's. So:

* on its first pass of an agent run the operator takes ``spec.agent.model`` whole, digests
  of ``spec.agent.tools`` and ``spec.agent.mcpServers`` (which decides where header Secrets
  go) and ``spec.agent.toolChoice``
  (:func:`freeze`) into ``status.agent.frozen``, which only it writes
  (the status subresource);
* every model turn's Job is built from that copy (:func:`agentrun.core.turn_steps.model_turn_step`),
  never from the spec as it reads later;
* every later pass compares the spec with it first (:func:`changes`): a run whose
  ``spec.agent.model``, ``spec.agent.tools``, ``spec.agent.mcpServers`` or
  ``spec.agent.toolChoice``
  changed, or that gained or lost ``spec.agent``,
  fails at once with reason :data:`REASON` and a message naming the fields
  (:func:`refusal`), its running steps stopped, before any turn, call or retry is launched.

The admission policy (``manifests/admission/validating-policy.yaml``, rule k) refuses such an
update at the API as well; this check holds without it. What it cannot cover is a change made
between the run's creation and the operator's first pass of it (normally well under a second):
only the admission policy refuses that one.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.base import ApiModel, SecretKeySelector
from agentrun.api.mcp import McpServer
from agentrun.core import naming

REASON = "AgentSpecChanged"
_SHOWN = 96
"""Characters of a changed value a message shows (a baseURL may be 2048)."""


def _digest(entries: Sequence[ApiModel] | None) -> str:
    """sha256 of ``entries`` as canonical JSON. Fields at their defaults are left out, so that a
    field a later version adds (with a default) does not change the digest of a stored spec."""
    wire = [
        e.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True)
        for e in entries or []
    ]
    return naming.sha256_text(naming.canonical_json(wire))


def tools_digest(tools: Sequence[a.AgentTool] | None) -> str:
    """sha256 of ``spec.agent.tools`` (:func:`_digest`)."""
    return _digest(tools)


def servers_digest(servers: Sequence[McpServer] | None) -> str | None:
    """sha256 of ``spec.agent.mcpServers`` (:func:`_digest`); None without any, as frozen by
    an operator from before MCP servers."""
    return _digest(servers) if servers else None


def freeze(run: m.AgentRun) -> agent_status.FrozenAgent | None:
    """What a run's turns will use, from its spec as read now (None without ``spec.agent``)."""
    agent = run.spec.agent
    if agent is None:
        return None
    return agent_status.FrozenAgent(
        model=agent.model.model_copy(deep=True),
        tools_digest=tools_digest(agent.tools),
        tool_choice=agent.tool_choice,
        mcp_servers_digest=servers_digest(agent.mcp_servers),
        generation=run.metadata.generation,
    )


def changes(agent: a.Agent | None, frozen: agent_status.FrozenAgent) -> list[str]:
    """The fields of ``spec.agent`` that no longer match what was frozen, as paths of the
    spec (``spec.agent.model.baseURL``, ``spec.agent.tools``, ``spec.agent``); empty when
    none changed."""
    if agent is None:
        return ["spec.agent"]
    found: list[str] = []
    for name, field in a.ModelEndpoint.model_fields.items():
        if getattr(agent.model, name) != getattr(frozen.model, name):
            found.append(f"spec.agent.model.{field.alias or name}")
    if not found and agent.model != frozen.model:  # pragma: no cover - every field is compared
        found.append("spec.agent.model")
    if tools_digest(agent.tools) != frozen.tools_digest:
        found.append("spec.agent.tools")
    if servers_digest(agent.mcp_servers) != frozen.mcp_servers_digest:
        found.append("spec.agent.mcpServers")
    if agent.tool_choice != frozen.tool_choice:
        found.append("spec.agent.toolChoice")
    return found


def _show(value: object) -> str:
    if isinstance(value, SecretKeySelector):
        text = f"secret {value.name} key {value.key}"
    elif value is None:
        text = "unset"
    else:
        text = str(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


_SHOWN_FIELDS = {"base_url": "baseURL", "name": "name", "api_key_secret_ref": "apiKeySecretRef"}
"""Fields whose old and new values a message shows: where the key goes, and which key."""


def refusal(agent: a.Agent | None, frozen: agent_status.FrozenAgent, changed: Sequence[str]) -> str:
    """The run's message when ``changed`` (from :func:`changes`) is not empty."""
    if agent is None:
        head = "spec.agent was removed after the run started"
    else:
        head = ", ".join(changed) + " changed after the run started"
        shown = [
            f"{wire} was {_show(getattr(frozen.model, name))}, now "
            f"{_show(getattr(agent.model, name))}"
            for name, wire in _SHOWN_FIELDS.items()
            if f"spec.agent.model.{wire}" in changed
        ]
        if shown:
            head += " (" + "; ".join(shown) + ")"
    return (
        f"{head}: the model endpoint, its API key, the tools and the MCP servers are fixed at "
        "creation, so no further model turn or tool call runs; create a new run to use others"
    )


# -- plan steps that use the creator's rights ---------------------------------------------------

ADDED = "added"
"""``StepStatus.frozen`` of a plan step added after the operator's first pass of the run."""


def step_digest(run: m.AgentRun, step: m.Step) -> str:
    """What :func:`step_refusal` compares: the step's container and the run's ServiceAccount."""
    template = run.spec.step_template
    wire = {
        "container": step.container.model_dump(mode="json", by_alias=True, exclude_none=True),
        "serviceAccountName": template.service_account_name if template else None,
    }
    return naming.sha256_text(naming.canonical_json(wire))[:32]


def lends(run: m.AgentRun, step: m.Step) -> list[str]:
    """What ``step`` would use with the rights of the run's creator: the Secrets and ConfigMaps
    its env references and the run's ServiceAccount (``secrets/NAME``, ...)."""
    found: list[str] = []
    for env in step.container.env or []:
        source = env.value_from
        if source is not None and source.secret_key_ref is not None:
            found.append(f"secrets/{source.secret_key_ref.name}")
        if source is not None and source.config_map_key_ref is not None:
            found.append(f"configmaps/{source.config_map_key_ref.name}")
    template = run.spec.step_template
    if template is not None and template.service_account_name:
        found.append(f"serviceaccounts/{template.service_account_name}")
    return sorted(set(found))


def step_refusal(run: m.AgentRun, step: m.Step, frozen: str | None) -> str | None:
    """Why a plan step may not be launched on its creator's behalf: it uses the creator's
    rights and is not as the plan held it on the operator's first pass (``frozen``, from
    :func:`step_digest`, or :data:`ADDED`). The operator checks what a step uses against the
    rights of the run's creator, so a step an editor added or changed would otherwise read a
    Secret the creator may read and the editor may not. None when it may (``frozen`` None: a
    run an operator from before this check started, not checked)."""
    used = lends(run, step)
    if not used or frozen is None or frozen == step_digest(run, step):
        return None
    when = "added to the plan" if frozen == ADDED else "changed"
    by = (run.metadata.annotations or {}).get(m.ANNOTATION_MODIFIED_BY)
    return (
        f"step {step.name} uses {', '.join(used)} with the rights of the run's creator and was "
        f"{when} after the run started" + (f" (spec last changed by {by})" if by else "") + ": "
        "only the steps the run was created with may use its creator's rights; create a new run"
    )


def added(agent: a.Agent) -> str:
    """The run's message when ``spec.agent`` appeared after the operator's first pass."""
    return (
        f"spec.agent was added after the run started (model {_show(agent.model.name)} at "
        f"{_show(agent.model.base_url)}): the model endpoint, its API key and the tools are "
        "fixed at creation, so no model turn runs; create a new run with spec.agent"
    )
