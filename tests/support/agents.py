"""Tools of the agent runs the suites build: the same catalogue for the in-memory sim
(:mod:`tests.support.agent_sim`, images never run) and for the local cluster (busybox scripts
that answer with what they were given)."""

from __future__ import annotations

from typing import Any

from agentrun_devcluster.modelserver import ScriptedModel

SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
    "required": ["query"],
    "additionalProperties": False,
}
RESTART_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"service": {"type": "string"}},
    "required": ["service"],
}


def turn_asked(body: dict[str, Any]) -> int:
    """The turn a chat completion request ``body`` is for: one more than the model's answers
    it carries."""
    return 1 + sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


def tool(
    name: str, description: str, parameters: dict[str, Any], container: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """An entry of ``spec.agent.tools``; ``extra`` adds fields such as ``risk``."""
    return {
        "name": name,
        "description": description,
        "parameters": parameters,
        **extra,
        "container": container,
    }


def search(container: dict[str, Any]) -> dict[str, Any]:
    """The read-only search tool, run by ``container``."""
    return tool("search", "Search the service's logs.", SEARCH_PARAMETERS, container)


def restart(container: dict[str, Any]) -> dict[str, Any]:
    """The restart tool: external, so every call waits for a person's approval."""
    return tool(
        "restart",
        "Restart a service.",
        RESTART_PARAMETERS,
        container,
        risk="external",
        approval="required",
    )


def echo_container(name: str) -> dict[str, Any]:
    """A busybox tool that answers with its name and the arguments it got (a plain-text
    result), for runs on the local cluster."""
    script = f'echo "{name} got $AGENTRUN_TOOL_ARGS" > /dev/termination-log'
    return {"image": "busybox:1.36", "command": ["sh", "-c", script]}


SEARCH = search(echo_container("search"))
"""The search tool as the local node runs it."""
RESTART = restart(echo_container("restart"))
"""The restart tool as the local node runs it."""


def agent_run(
    name: str,
    model: ScriptedModel | str,
    *,
    tools: list[dict[str, Any]] | None = None,
    model_extra: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An agent run for the local cluster, on ``model`` (a scripted server or its base URL),
    with ``tools`` (the search tool by default); ``spec`` adds fields of the run's spec, and an
    ``agent`` entry among them fields of ``spec.agent``."""
    base_url = model if isinstance(model, str) else model.base_url
    agent = {
        "model": {"baseURL": base_url, "name": "scripted", **(model_extra or {})},
        "instructions": "You are an SRE. Use the tools, then answer.",
        "tools": tools if tools is not None else [SEARCH],
        **spec.pop("agent", {}),
    }
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"goal": "find out why checkout is slow", "agent": agent, **spec},
    }
