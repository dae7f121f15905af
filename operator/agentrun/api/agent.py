"""The agent loop's part of the API: ``spec.agent`` (its ``status.agent`` is in
:mod:`agentrun.api.agent_status`).

An agent run has a model (any OpenAI-compatible Chat Completions endpoint) and tools (containers,
described to the model by a JSON Schema of their arguments). The operator runs the model as a
step Job (a *model turn*), validates every tool call the model proposes, runs the valid ones as
steps of their own (a *tool call*: committed intent, deterministic Job, idempotency key, approval
bound to the arguments when the tool is gated), answers every call to the model on the next turn,
and ends the run when the model answers without calling a tool.

These models are part of :mod:`agentrun.api.models` (which imports them); they live here to
keep the loop's API in one place, and build on :mod:`agentrun.api.base`, never on the models of
the run. Every field carries a description for ``kubectl explain``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from agentrun.api import names
from agentrun.api.base import (
    ApiModel,
    ApprovalMode,
    ContainerAction,
    RetryPolicy,
    Risk,
    SecretKeySelector,
)
from agentrun.api.http_tool import HttpRequest
from agentrun.api.mcp import MAX_SERVERS, McpServer
from agentrun.api.names import TOOL_CHOICE_MODES as TOOL_CHOICE_MODES

MAX_TOOLS = 32
MAX_TURNS = 1000
MAX_CALLS_PER_TURN = 16
MAX_TOOL_ARGUMENTS = 4096
"""Longest arguments (JSON text, in bytes) a tool call may have; a longer call is answered to
the model as invalid. They are kept in status while the call is current, and passed to the
tool's container in an environment variable."""
MIN_CONTEXT_BYTES = 4096
MAX_CONTEXT_BYTES = 256 * 1024
"""The context is handed to the model turn's pod in environment variables (from a ConfigMap),
which the kernel limits to 128 KiB each and about 2 MiB in all; 256 KiB stays well inside."""
DEFAULT_CONTEXT_BYTES = 64 * 1024
MAX_RECENT_TURNS = 10
MAX_ANSWER = 4096
"""Longest answer kept in status; a longer one is kept in the last turn's transcript record."""
MAX_ANSWER_BYTES = 512 * 1024
"""Largest answer (UTF-8 bytes) a run accepts as its result. It is stored once, in the last
turn's transcript record (a ConfigMap, at most 1 MiB); a larger one fails the run (reason
AnswerTooLarge)."""
MAX_SUMMARY = 1024
TOOL_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]{0,47}$"
"""A function name as Chat Completions accepts it, at most 48 characters (so that the tool call's
step name, ``t{turn}-{index}-{tool}``, stays a DNS label)."""
UID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
"""metadata.uid as the API server assigns it."""
RUN_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An object name (a DNS subdomain): no namespace, no slash."""
DYNAMIC_NAME_RULE = "^t[0-9]+-"
"""Plan steps of an agent run may not have names like this: they are the names of model turns
(``t3-model``) and tool calls (``t3-0-search``)."""


MAX_FALLBACKS = 3
"""Most fallback models a model endpoint may have."""
BASE_URL_PATTERN = r"^https?://[^\s]+$"
FALLBACK_REASONS = (
    "an HTTP 5xx status, no answer within the time left (a timeout) or no connection, or an "
    "HTTP 429 once the turn's own patience is over (a Retry-After of at most 60 s in all is "
    "waited for and the model asked again, as far as the turn's deadline, timeoutSeconds, "
    "allows)"
)
"""When the next model of fallbacks is tried (the descriptions of both fields say so)."""


class ModelFallback(ApiModel):
    """A model tried, within the same turn attempt, when the one before it is unavailable
    (an entry of fallbacks)."""

    base_url: str = Field(
        alias="baseURL",
        description=(
            "Base URL of the fallback's API, up to and including its version path, e.g. "
            "https://api.openai.com/v1 or http://vllm.models.svc:8000/v1: its "
            "{baseURL}/chat/completions is posted the turn's request."
        ),
        min_length=1,
        max_length=2048,
        pattern=BASE_URL_PATTERN,
    )
    name: str = Field(
        description="The model, as that endpoint names it (e.g. gpt-4o-mini, qwen2.5:7b).",
        min_length=1,
        max_length=253,
    )
    api_key_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description=(
            "The fallback's own API key: a key of a Secret in the run's namespace, given to "
            "the model turn's pod as an environment variable of its own (never written to "
            "status, events or logs), and sent only to this fallback's baseURL. The run's "
            "creator must be allowed to get that Secret, as for the first model's key. No key "
            "is sent when unset (a local server); the first model's key is never sent to it."
        ),
    )
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description=(
            "Sampling temperature sent to this fallback; the endpoint's default when unset "
            "(the first model's temperature is not carried over)."
        ),
    )


class ModelEndpoint(ApiModel):
    """An OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, llama.cpp's server,
    LiteLLM, KubeAI, ...), and the models tried after it when it is unavailable."""

    base_url: str = Field(
        alias="baseURL",
        description=(
            "Base URL of the API, up to and including its version path, e.g. "
            "https://api.openai.com/v1 or http://vllm.models.svc:8000/v1. The model turn's pod "
            "calls {baseURL}/chat/completions."
        ),
        min_length=1,
        max_length=2048,
        pattern=BASE_URL_PATTERN,
    )
    name: str = Field(
        description="The model, as the endpoint names it (e.g. gpt-4o-mini, qwen2.5:7b).",
        min_length=1,
        max_length=253,
    )
    api_key_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description=(
            "The API key: a key of a Secret in the run's namespace, given to the model turn's "
            "pod as an environment variable (never written to status, events or logs). No key "
            "is sent when unset (a local server)."
        ),
    )
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="Sampling temperature; the endpoint's default when unset.",
    )
    max_output_tokens: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description=(
            "Most tokens one model turn may produce (max_tokens of the request). The token "
            "budget counts it before a turn starts."
        ),
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=86400,
        description=(
            "Deadline of one model turn attempt, its fallbacks included (the Job's "
            "activeDeadlineSeconds)."
        ),
    )
    retry: RetryPolicy | None = Field(
        default=None,
        description=(
            "Retries of a failed model turn (the endpoint down, an error or an answer that is "
            "not a chat completion); the turn runs once when unset. A turn that fails after "
            "its retries fails the run. A failed turn's reason says why: "
            f"{', '.join(names.TURN_FAILURES)}."
        ),
    )
    fallbacks: list[ModelFallback] | None = Field(
        default=None,
        description=(
            "Models tried in order, within the same turn attempt, when the one before fails "
            f"with {FALLBACK_REASONS}. The first model that answers answers the turn; the "
            "turn records which (its name, baseURL and index: 0 this model, 1 the first "
            "fallback, ...), and why each before it failed, in status.agent.recent and the "
            "turn's transcript record, and a Warning Event ModelFallback names them. An HTTP "
            "4xx other than 429, or an answer that is not a valid chat completion, is no "
            "reason to fall back: the next model would be sent the same request, and such an "
            "answer says the request, the key or the endpoint is wrong, not that the model is "
            "unavailable; the turn fails with its reason, as without fallbacks. A turn whose "
            "every model failed fails with the reason of the last one, its message naming "
            "each. maxOutputTokens, timeoutSeconds and retry are this model's and hold for "
            "the whole turn: the fallbacks share its deadline, and a retry of the turn begins "
            "with this model again. At most 3."
        ),
        max_length=MAX_FALLBACKS,
    )


class SubAgent(ApiModel):
    """A sub-agent: every call of the tool starts a child AgentRun, whose answer is the call's
    result."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.agentRef) || (!has(self.instructions) && !has(self.tools))",
                    "message": (
                        "a sub-agent of agentRef runs that Agent's instructions and tools: set "
                        "agentRef, or instructions and tools, not both"
                    ),
                }
            ]
        }
    )

    agent_ref: str | None = Field(
        default=None,
        description=(
            "An Agent of this namespace the child runs (its spec.agentRef), instead of "
            "instructions and tools: the child takes the Agent, its ModelConfig and tools as "
            "they are when the child starts, with the rights of this run's creator checked; "
            "maxTurns is then the Agent's own. Unset: the child runs this run's model with "
            "instructions and tools."
        ),
        min_length=1,
        max_length=253,
        pattern=RUN_NAME_PATTERN,
    )
    instructions: str | None = Field(
        default=None,
        description="The child's system prompt (its spec.agent.instructions).",
        max_length=32768,
    )
    preamble: str | None = Field(
        default=None,
        description=(
            "Text put before the call's goal argument in the child's spec.goal (what every "
            "child of this tool is told first)."
        ),
        max_length=4096,
    )
    tools: list[Annotated[str, Field(min_length=1, max_length=48)]] | None = Field(
        default=None,
        description=(
            "Names of other entries of spec.agent.tools the child may call (copied into its "
            "spec.agent.tools); none: the child only answers. A sub-agent tool named here "
            "gives the child children of its own, as deep as the operator allows (2 levels)."
        ),
        max_length=MAX_TOOLS,
    )
    max_turns: int = Field(
        default=10,
        ge=1,
        le=MAX_TURNS,
        description="The child's spec.agent.maxTurns.",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        le=2**53 - 1,
        description=(
            "Most tokens one child may be given. The child's spec.budget.maxTokens is this, "
            "or what the run's budget has left when less (a call the budget cannot cover is "
            "answered as invalid); its tokens count against this run's budget."
        ),
    )


class AgentTool(ApiModel):
    """A tool the model may call: a container that receives the call's arguments as JSON, a
    sub-agent (a child AgentRun) that receives them as its goal, or one HTTP request made
    from them (http)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.parameters.type) && self.parameters.type == 'object'",
                    "message": "parameters must be a JSON Schema of an object (type: object)",
                },
                {
                    "rule": (
                        "(has(self.container) ? 1 : 0) + (has(self.agent) ? 1 : 0) "
                        "+ (has(self.http) ? 1 : 0) == 1"
                    ),
                    "message": (
                        "a tool has a container, an agent (a sub-agent) or http (an HTTP "
                        "request), exactly one"
                    ),
                },
            ]
        }
    )

    name: str = Field(
        description=(
            "The function name the model calls, unique among the tools: a letter, then "
            "letters, digits, '_' or '-' (at most 48)."
        ),
        min_length=1,
        max_length=48,
        pattern=TOOL_NAME_PATTERN,
    )
    description: str = Field(
        description="What the tool does and when to use it, for the model.",
        min_length=1,
        max_length=4096,
    )
    parameters: dict[str, Any] = Field(
        description=(
            "JSON Schema of the arguments (an object), as in the function-calling format: "
            "{type: object, properties: {...}, required: [...]}. Every call's arguments are "
            "validated against it; a call that does not match is not run and the model is told "
            "what was wrong."
        ),
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            # Declared so that the CEL rule can read it; everything else is kept as written.
            "properties": {"type": {"type": "string", "description": "The JSON type: object."}},
        },
    )
    container: ContainerAction | None = Field(
        default=None,
        description=(
            "The container that runs a call (or set agent or http instead). Besides the usual "
            "AGENTRUN_* identity and idempotency variables it gets AGENTRUN_TOOL_ARGS (the "
            "arguments, JSON text), AGENTRUN_TOOL_NAME, AGENTRUN_TOOL_CALL_ID and "
            "AGENTRUN_TURN; under `agentrun step --` the arguments are also in the file named "
            "by AGENTRUN_TOOL_ARGS_FILE. Its result envelope (or output) is the answer the "
            "model reads."
        ),
    )
    agent: SubAgent | None = Field(
        default=None,
        description=(
            "A sub-agent (instead of a container): every valid call starts a child AgentRun "
            "owned by this run, named from the call's idempotency key (a crash never makes "
            "two), with the call's string argument goal as its goal, this run's frozen model, "
            "policy and stepTemplate, and a token budget carved from this run's. Its approvals "
            "are its own; its answer is the call's result. parameters must require a string "
            "property goal. Cancelling or suspending this run reaches the children; deleting "
            "it deletes them."
        ),
    )
    http: HttpRequest | None = Field(
        default=None,
        description=(
            "An HTTP tool (instead of a container or an agent): every valid call is one "
            "request to a host of allowedHosts, its URL and body filled from the arguments, "
            "made by the operator's program (agentrun step http) on the run's executor or in "
            "a pod of its own, never from the operator's pod. Header values from Secrets stay "
            "in that pod. The request carries the call's idempotency key in the header "
            "Idempotency-Key, the same in every attempt. The response (status, Content-Type, "
            "body cut at maxResponseBytes) is what the model reads; a status that is not 2xx "
            "is an error the model reads, while a request that could not be made (no "
            "connection, timeoutSeconds passed) fails the attempt and is retried per retry. "
            "The call's argsHash covers the method, the URL, the headers (values or Secret "
            "references), the body and the arguments."
        ),
    )
    risk: Risk = Field(
        default=Risk.READ,
        description=(
            "read, write or external, as for plan steps: policy.approvalRequiredFor decides "
            "which risks need approval."
        ),
    )
    approval: ApprovalMode = Field(
        default=ApprovalMode.AUTO,
        description=(
            "required: every call waits for an approval in spec.approvals naming the call's "
            "step and argsHash (kubectl agentrun approve RUN STEP); a rejection is answered to "
            "the model as the call's result."
        ),
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 86400,
        description=(
            "Deadline of one attempt of a call (the Job's activeDeadlineSeconds); for an http "
            "tool also the request's own deadline (30 s when unset)."
        ),
    )
    retry: RetryPolicy | None = Field(
        default=None,
        description=(
            "Retries of a failed call; none when unset. A call that still fails is answered to "
            "the model as an error; the run goes on."
        ),
    )


class ResumeFrom(ApiModel):
    """Another agent run's conversation, continued by this run (kubectl agentrun fork RUN
    --from TURN)."""

    run: str = Field(
        description=(
            "Name of the agent run whose conversation this run continues. It must be in this "
            "run's namespace (a name, not namespace/name)."
        ),
        min_length=1,
        max_length=253,
        pattern=RUN_NAME_PATTERN,
    )
    uid: str = Field(
        description=(
            "metadata.uid of that run: the conversation is taken only from the run of that "
            "name that has this uid, so a run deleted and made again under the same name is "
            "never mistaken for it."
        ),
        pattern=UID_PATTERN,
    )
    turn: int = Field(
        ge=1,
        le=MAX_TURNS,
        description=(
            "The last of its turns to keep. This run's first model turn sees exactly the "
            "messages that run's turn turn+1 saw (or would have seen): the system and first "
            "user message, and every assistant message, tool call and tool result up to and "
            "including this turn, as the operator committed them (paged again only if this "
            "run's contextBytes is smaller). The operator reads them from "
            "that run's own records and checks them against the digests it committed; a run "
            "that is gone, a turn it has not closed, or a record that does not verify fails "
            "this run (reason ResumeRefused) before any model turn. The turn that run answered "
            "in asks it the next question (kubectl agentrun ask): the messages that turn saw, "
            "its answer, then this run's goal as a user message."
        ),
    )


TOOL_CHOICE_RULES: list[Any] = [
    {
        "rule": (
            "!has(self.toolChoice) || self.toolChoice in ['auto', 'none'] || "
            "(has(self.tools) && (self.toolChoice == 'required' || "
            "self.tools.exists(t, t.name == self.toolChoice))) || "
            "(has(self.mcpServers) && (self.toolChoice == 'required' || "
            "self.mcpServers.exists(s, s.tools.exists(t, t.name == self.toolChoice))))"
        ),
        "message": (
            "toolChoice must be auto, none, required or the name of one of the "
            "tools of spec.agent.tools or spec.agent.mcpServers (required and a "
            "tool's name need tools)"
        ),
        "fieldPath": ".toolChoice",
    },
    {
        "rule": (
            "!has(self.tools) || !self.tools.exists(t, t.name in ['auto', 'none', 'required'])"
        ),
        "message": (
            "a tool may not be named auto, none or required: those are the modes of toolChoice"
        ),
        "fieldPath": ".tools",
    },
]
"""CEL rules of an agent's toolChoice and tool names (spec.agent here; the Agent kind's spec
has them too)."""


class Agent(ApiModel):
    """A model that decides the next steps while the run runs, and the tools it may call."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": TOOL_CHOICE_RULES})

    model: ModelEndpoint = Field(
        description=(
            "The model that reasons. Fixed at creation: it decides where the API key is sent, "
            "so the operator builds every turn from the copy it took on its first pass "
            "(status.agent.frozen), and a run whose model changes fails (reason "
            "AgentSpecChanged) before its next turn."
        )
    )
    instructions: str | None = Field(
        default=None,
        description="The system prompt. The run's goal (and the plan's results) is the first "
        "user message.",
        max_length=32768,
    )
    tools: list[AgentTool] | None = Field(
        default=None,
        description=(
            "The tools the model may call; none: the model only answers. Fixed at creation "
            "like model: a run whose tools change fails (reason AgentSpecChanged)."
        ),
        max_length=MAX_TOOLS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    mcp_servers: list[McpServer] | None = Field(
        default=None,
        description=(
            "MCP servers (streamable HTTP) whose tools the model may call besides "
            "spec.agent.tools: only the tools each entry lists. Before the first turn, one step "
            "per server (t0-mcp-SERVER, in the operator's image, in the run's namespace and "
            "with its identity: never from the operator's pod) lists the server's tools; their "
            "definitions are offered to the model and pinned by digest in "
            "status.agent.mcpTools. Every call is a step of its own (t{turn}-{index}-{tool}) "
            "that lists the tools again and is refused, unsent, when the tool's definition "
            "changed; it sends the call's idempotency key in _meta. A tool name must be unique "
            "among spec.agent.tools and all servers. Fixed at creation like model and tools."
        ),
        max_length=MAX_SERVERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    tool_choice: str | None = Field(
        default=None,
        description=(
            "Whether the model must, may or may not call a tool in a turn, sent as the "
            "tool_choice of every chat completion request: auto (it decides), none (it "
            "answers without calling a tool), required (it calls at least one tool), or a "
            "tool's name (it calls that tool). Unset: not sent, so the endpoint's default "
            "(auto when tools are offered). With required or a tool's name the model cannot "
            "answer, so the run ends when maxTurns is reached (MaxTurnsReached). Not every "
            "server honours every value (docs/agent.md). Fixed at creation like model and "
            "tools."
        ),
        min_length=1,
        max_length=48,
        pattern=TOOL_NAME_PATTERN,
    )
    max_turns: int = Field(
        default=20,
        ge=1,
        le=MAX_TURNS,
        description=(
            "Most model turns. A model that still calls tools in its last turn fails the run "
            "with reason MaxTurnsReached."
        ),
    )
    max_tool_calls_per_turn: int = Field(
        default=4,
        ge=1,
        le=MAX_CALLS_PER_TURN,
        description=(
            "Most tool calls run per turn; further calls of the same turn are answered to the "
            "model as invalid."
        ),
    )
    context_bytes: int = Field(
        default=DEFAULT_CONTEXT_BYTES,
        ge=MIN_CONTEXT_BYTES,
        le=MAX_CONTEXT_BYTES,
        description=(
            "Most bytes of messages sent to the model in one turn. Older tool results are "
            "replaced by their summaries first, then the oldest turns are left out; the full "
            "transcript stays in the run's ConfigMaps (kubectl agentrun transcript)."
        ),
    )
    resume_from: ResumeFrom | None = Field(
        default=None,
        description=(
            "Continue the conversation of another agent run of this namespace after one of its "
            "turns, instead of starting from the goal (kubectl agentrun fork RUN --from TURN). "
            "The plan, if any, still runs first (a fork carries its results), but the first "
            "turn's messages are that run's: instructions and goal included. maxTurns and the "
            "token budget count from this run's first turn; approvals are never carried: a "
            "gated call of this run needs its own. The creator of this run must be allowed to "
            "get that run and the ConfigMap holding its conversation. Fixed at creation."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "resumeFrom cannot change"}
            ]
        },
    )
