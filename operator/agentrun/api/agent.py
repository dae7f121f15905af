"""The agent loop's part of the API: ``spec.agent`` and ``status.agent``.

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

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from agentrun.api import names
from agentrun.api.base import (
    ApiModel,
    ApprovalMode,
    ContainerAction,
    ResultRef,
    RetryPolicy,
    Risk,
    SecretKeySelector,
    Timestamp,
)
from agentrun.api.http_tool import HttpRequest
from agentrun.api.mcp import MAX_SERVER_TOOLS, MAX_SERVERS, McpServer, PinnedTool
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


class ModelEndpoint(ApiModel):
    """An OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, llama.cpp's server,
    LiteLLM, KubeAI, ...)."""

    base_url: str = Field(
        alias="baseURL",
        description=(
            "Base URL of the API, up to and including its version path, e.g. "
            "https://api.openai.com/v1 or http://vllm.models.svc:8000/v1. The model turn's pod "
            "calls {baseURL}/chat/completions."
        ),
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
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
        description="Deadline of one model turn attempt (the Job's activeDeadlineSeconds).",
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


class SubAgent(ApiModel):
    """A sub-agent: every call of the tool starts a child AgentRun, whose answer is the call's
    result."""

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


class Agent(ApiModel):
    """A model that decides the next steps while the run runs, and the tools it may call."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
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
                        "!has(self.tools) || "
                        "!self.tools.exists(t, t.name in ['auto', 'none', 'required'])"
                    ),
                    "message": (
                        "a tool may not be named auto, none or required: those are the "
                        "modes of toolChoice"
                    ),
                    "fieldPath": ".tools",
                },
            ]
        }
    )

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


# --------------------------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------------------------


class AgentStage(StrEnum):
    """Where the agent loop is."""

    WAITING = "Waiting"
    """The plan's steps run first."""
    READY = "Ready"
    """The next turn's context is assembled; the turn starts when the budget allows."""
    PAUSED = "Paused"
    """The token budget does not cover the next turn: raise spec.budget.maxTokens."""
    THINKING = "Thinking"
    """A model turn is running."""
    ACTING = "Acting"
    """The turn's tool calls are running or waiting for approval."""
    ANSWERED = "Answered"
    """The model answered without calling a tool: the answer is the run's result."""
    STOPPED = "Stopped"
    """The loop ended without an answer (the run failed or was cancelled)."""


class ChildCall(ApiModel):
    """The child AgentRun of a call of a sub-agent tool."""

    name: str | None = Field(
        default=None,
        description="The child's name (from the call's idempotency key), once launched.",
        max_length=253,
    )
    uid: str | None = Field(
        default=None,
        description=(
            "The child's metadata.uid, once adopted: its outcome and tokens are read from the "
            "run with this uid only."
        ),
        max_length=64,
    )
    tokens: int | None = Field(
        default=None,
        ge=0,
        description="The budget carved for the child (its spec.budget.maxTokens); unset: none.",
    )
    counted: int = Field(
        default=0,
        ge=0,
        description="The child's tokens counted against this run's budget so far.",
    )


class ToolCallStatus(ApiModel):
    """One tool call of the current turn."""

    id: str = Field(description="The call's id, as the model gave it.", max_length=128)
    tool: str = Field(description="The tool the model called (as it named it).", max_length=128)
    step: str | None = Field(
        default=None,
        description="The step that runs the call (t{turn}-{index}-{tool}); unset when invalid.",
        max_length=63,
    )
    arguments: str = Field(
        default="",
        description=(
            f"The arguments (JSON text) as the model wrote them, up to {MAX_TOOL_ARGUMENTS} "
            "bytes (an invalid call's are cut short)."
        ),
        max_length=MAX_TOOL_ARGUMENTS,
    )
    child: ChildCall | None = Field(
        default=None, description="The child AgentRun of a sub-agent tool's call."
    )
    problem: str | None = Field(
        default=None,
        description=(
            "Why the call is invalid and was not run (unknown tool, arguments not valid against "
            "the tool's parameters, image not allowed, too many calls, budget); answered to the "
            "model as the call's result."
        ),
        max_length=1024,
    )


class ContextStatus(ApiModel):
    """The context the current (or next) model turn is given."""

    turn: int = Field(ge=1, description="The turn it was assembled for.")
    name: str = Field(description="The ConfigMap holding it.", max_length=253)
    parts: int = Field(ge=1, description="Keys part-0 ... of that ConfigMap.")
    digest: str = Field(description="sha256 of the context (parts and tools).", max_length=64)
    bytes: int = Field(
        ge=0,
        description=(
            "Size of the request the turn sends (messages, tools and settings, as JSON): what "
            "the token estimate before the turn counts."
        ),
    )
    messages: int = Field(ge=0, description="Messages sent.")
    paged_results: int = Field(
        default=0, ge=0, description="Tool results replaced by their summaries to fit."
    )
    omitted_turns: int = Field(
        default=0, ge=0, description="Oldest turns left out to fit contextBytes."
    )


class TurnSummary(ApiModel):
    """What one finished turn did."""

    turn: int = Field(ge=1, description="The turn.")
    tool_calls: int = Field(default=0, ge=0, description="Calls the model made.")
    invalid_calls: int = Field(default=0, ge=0, description="Calls not run because invalid.")
    tokens: int = Field(
        default=0,
        ge=0,
        description=(
            "Tokens counted for the turn: what the endpoint reported, at most what the turn "
            "could have used (reportedTokens says when it reported more)."
        ),
    )
    reported_tokens: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Set when the endpoint reported more tokens than the turn could have used "
            "(maxOutputTokens plus a prompt of one token per byte sent plus what a chat "
            "template adds): what it reported. tokens is what was counted."
        ),
    )
    finish_reason: str | None = Field(
        default=None, description="The model's finish reason.", max_length=64
    )
    summary: str | None = Field(
        default=None, description="The first line of what the model said.", max_length=MAX_SUMMARY
    )


class ResumedFrom(ApiModel):
    """The conversation this run continues, as the operator took it (spec.agent.resumeFrom)."""

    run: str = Field(description="namespace/name of the run continued.", max_length=317)
    uid: str = Field(description="Its metadata.uid.", max_length=64)
    turn: int = Field(ge=1, description="Its last turn kept.")
    context_digest: str = Field(
        description=(
            "sha256 of its context document the messages were taken from (the one of its turn "
            "turn+1; of turn itself when it answered in turn), as verified against its "
            "committed records."
        ),
        max_length=64,
    )
    earlier_turns: int = Field(
        ge=0,
        description=(
            "Turns of the conversation before this run's first: turn, plus the earlier turns "
            "of that run itself when it too continued another. This run's turn k is turn k + "
            "earlierTurns of the conversation (the numbers the context's notes use)."
        ),
    )


class FrozenAgent(ApiModel):
    """What of ``spec.agent`` decides where the API key is sent and what the model may call,
    as the operator took it on its first pass of the run: model turns are built from this copy,
    never from the spec as it reads later."""

    model: ModelEndpoint = Field(
        description=(
            "spec.agent.model as it was: every model turn's Job gets its endpoint, model name, "
            "API key Secret reference and settings from here."
        )
    )
    tools_digest: str = Field(
        description=(
            "sha256 of spec.agent.tools as it was (canonical JSON): every pass checks the spec "
            "against it before a tool is offered or a call is run."
        ),
        max_length=64,
    )
    tool_choice: str | None = Field(
        default=None,
        description=("spec.agent.toolChoice as it was: every model turn sends it as tool_choice."),
        max_length=48,
    )
    mcp_servers_digest: str | None = Field(
        default=None,
        description=(
            "sha256 of spec.agent.mcpServers as it was (canonical JSON); unset when it had "
            "none. Every pass checks the spec against it before a server is listed or called."
        ),
        max_length=64,
    )
    generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec it was taken from."
    )


class ExecutorStatus(ApiModel):
    """The run's executor: one pod serving its model turns (``agentrun step llm`` in the
    operator's image), made by the operator as a Job of the run."""

    generation: int = Field(
        ge=1,
        description=(
            "Counts the executors of the run: a new one is made, under a new name, when the "
            "last one ended or was lost."
        ),
    )
    job_name: str = Field(description="The executor's Job.", max_length=63)
    named_at: Timestamp | None = Field(
        default=None,
        description=(
            "When this executor was named (its Job is made after that write). A model turn, "
            "or the discovery of an MCP server's tools, waits up to 30 seconds from then for "
            "it to run, and is sent to it; after that, or once it is lost, either runs as a "
            "Job of its own."
        ),
    )


class AgentStatus(ApiModel):
    """The agent loop: bounded counters and the current turn; the transcript is kept by
    reference in ConfigMaps owned by the run (label agentrun.dev/object=transcript)."""

    stage: AgentStage = Field(default=AgentStage.WAITING, description="Where the loop is.")
    frozen: FrozenAgent | None = Field(
        default=None,
        description=(
            "spec.agent.model, digests of spec.agent.tools and spec.agent.mcpServers, and "
            "spec.agent.toolChoice, taken "
            "on the operator's first pass of the run: fixed at creation. A run whose "
            "spec.agent no longer matches them fails (reason AgentSpecChanged, naming the "
            "field) before any further turn."
        ),
    )
    turn: int = Field(
        default=0, ge=0, description="The current (or last) model turn; 0 before the first."
    )
    mcp_tools: list[PinnedTool] | None = Field(
        default=None,
        description=(
            "The tools of spec.agent.mcpServers as discovered before the first turn, each "
            "pinned by the digest of its definition: the model is offered these, and a call "
            "is sent only while the server still lists the tool with this digest."
        ),
        max_length=MAX_SERVERS * MAX_SERVER_TOOLS,
    )
    context: ContextStatus | None = Field(
        default=None, description="The context of the current or next turn."
    )
    turn_image: str | None = Field(
        default=None,
        description=(
            "Image of the current turn's model step (the operator's own, as configured when "
            "the turn started)."
        ),
        max_length=512,
    )
    turn_command: list[Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None, description="Command of the current turn's model step.", max_length=16
    )
    calls: list[ToolCallStatus] | None = Field(
        default=None,
        description="The tool calls of the current turn, once the model proposed them.",
        max_length=64,
    )
    finish_reason: str | None = Field(
        default=None, description="The current turn's finish reason.", max_length=64
    )
    tool_calls: int = Field(default=0, ge=0, description="Tool calls proposed in all turns.")
    children_started: int = Field(
        default=0, ge=0, description="Sub-agents (child AgentRuns) started in all turns."
    )
    invalid_tool_calls: int = Field(
        default=0, ge=0, description="Tool calls not run because they were invalid."
    )
    over_reported_turns: int = Field(
        default=0,
        ge=0,
        description=(
            "Turns whose endpoint reported more tokens than they could have used; what they "
            "could have used was counted instead (an Event ReportedUsageRefused says so)."
        ),
    )
    unreported_usage_turns: int = Field(
        default=0,
        ge=0,
        description=(
            "Turns whose endpoint reported no token usage, or only part of it; what it left "
            "out was counted as estimated at 4 bytes a token of the request and of the output "
            "(a Warning Event UsageNotReported says so)."
        ),
    )
    prompt_tokens: int = Field(default=0, ge=0, description="Prompt tokens of all turns.")
    completion_tokens: int = Field(default=0, ge=0, description="Completion tokens of all turns.")
    recent: list[TurnSummary] | None = Field(
        default=None,
        description=f"The last {MAX_RECENT_TURNS} finished turns, oldest first.",
        max_length=MAX_RECENT_TURNS,
    )
    answer: str | None = Field(
        default=None,
        description="The model's final answer (the run's result), when small enough.",
        max_length=MAX_ANSWER,
    )
    answer_ref: ResultRef | None = Field(
        default=None, description="Where the whole answer is kept."
    )
    answer_digest: str | None = Field(
        default=None, description="sha256 of the whole answer.", max_length=64
    )
    transcript: str | None = Field(
        default=None,
        description="Name prefix of the run's transcript ConfigMaps (one per finished turn).",
        max_length=253,
    )
    resumed_from: ResumedFrom | None = Field(
        default=None,
        description="The conversation this run continues (spec.agent.resumeFrom), once taken.",
    )
    executor: ExecutorStatus | None = Field(
        default=None,
        description=(
            "The executor the run's model turns are sent to, once the operator made one "
            "(its name is committed before its Job is created)."
        ),
    )
