"""The environment of model turns' and tool calls' pods (besides the ``AGENTRUN_*`` identity
of every step): the names the operator sets on their Jobs and the programs in those pods read
(``agentrun step llm``, ``agentrun step --``).

Plain constants, no imports: a step's pod reads them without loading the core's models.
"""

from __future__ import annotations

ENV_TOOL_ARGS = "AGENTRUN_TOOL_ARGS"
ENV_TOOL_NAME = "AGENTRUN_TOOL_NAME"
ENV_TOOL_CALL_ID = "AGENTRUN_TOOL_CALL_ID"
ENV_TURN = "AGENTRUN_TURN"
ENV_MODEL_BASE_URL = "AGENTRUN_MODEL_BASE_URL"
ENV_MODEL_NAME = "AGENTRUN_MODEL_NAME"
ENV_MODEL_TEMPERATURE = "AGENTRUN_MODEL_TEMPERATURE"
ENV_MODEL_MAX_OUTPUT_TOKENS = "AGENTRUN_MODEL_MAX_OUTPUT_TOKENS"
ENV_MODEL_API_KEY = "AGENTRUN_MODEL_API_KEY"
ENV_MODEL_TOOL_CHOICE = "AGENTRUN_MODEL_TOOL_CHOICE"
ENV_MODEL_TIMEOUT_SECONDS = "AGENTRUN_MODEL_TIMEOUT_SECONDS"
"""The turn's deadline in seconds (spec.agent.model.timeoutSeconds), when it has one: how long
a 429's Retry-After may be waited for, and how long the models after the first may take."""
ENV_MODEL_FALLBACKS = "AGENTRUN_MODEL_FALLBACKS"
"""How many fallback models the turn has (spec.agent.model.fallbacks), when it has any."""
ENV_MODEL_FALLBACK = "AGENTRUN_MODEL_FALLBACK_"
"""The prefix of fallback ``i``'s variables (from 1, in order): ``AGENTRUN_MODEL_FALLBACK_1_``
then one of :data:`FALLBACK_FIELDS` (:func:`fallback_env`)."""
FALLBACK_FIELDS = ("BASE_URL", "NAME", "TEMPERATURE", "API_KEY")


def fallback_env(index: int, field: str) -> str:
    """The variable holding ``field`` (of :data:`FALLBACK_FIELDS`) of fallback ``index``
    (1 is the first): ``AGENTRUN_MODEL_FALLBACK_1_API_KEY``."""
    return f"{ENV_MODEL_FALLBACK}{index}_{field}"


ENV_CONTEXT_PARTS = "AGENTRUN_CONTEXT_PARTS"
ENV_CONTEXT_SHA256 = "AGENTRUN_CONTEXT_SHA256"
ENV_CONTEXT_PART = "AGENTRUN_CONTEXT_PART_"
"""``AGENTRUN_CONTEXT_PART_0`` ... : the parts of the context document."""
ENV_EXECUTOR_SECRET = "AGENTRUN_EXECUTOR_SECRET_"
"""The prefix of a run's executor's variables holding the values of its MCP servers' header
Secrets (:func:`agentrun.core.turns.executor_secret_env`)."""
ENV_HTTP_TOOL = "AGENTRUN_HTTP_TOOL"
"""The declaration of an HTTP tool (its entry of spec.agent.tools, JSON) in the environment of
``agentrun step http`` (:mod:`agentrun.pod.http_tool`)."""
ENV_HTTP_HEADER = "AGENTRUN_HTTP_HEADER_"
"""``AGENTRUN_HTTP_HEADER_0`` ...: the values of an HTTP tool's headers from Secrets, by the
header's index in the tool's headers."""
ENV_CALL_TIMEOUT = "AGENTRUN_CALL_TIMEOUT_SECONDS"
"""A call's deadline in seconds, as the run's executor passes it on (the tool's
timeoutSeconds)."""
