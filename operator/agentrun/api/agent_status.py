"""The agent loop's part of the status: ``status.agent``.

Where the loop is (:class:`AgentStage`), the current turn's calls (:class:`ToolCallStatus`,
a sub-agent's :class:`ChildCall`), its context (:class:`ContextStatus`), the recent turns
(:class:`TurnSummary`), the conversation a run continues (:class:`ResumedFrom`), what of
``spec.agent`` the operator took on its first pass (:class:`FrozenAgent`) and the run's
executor (:class:`ExecutorStatus`), all under :class:`AgentStatus`.

These models are part of :mod:`agentrun.api.models` (which imports :class:`AgentStatus`); they
build on :mod:`agentrun.api.base` and the spec's models and limits of
:mod:`agentrun.api.agent`, never on the models of the run. Every field carries a description
for ``kubectl explain``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from agentrun.api.agent import (
    MAX_ANSWER,
    MAX_RECENT_TURNS,
    MAX_SUMMARY,
    MAX_TOOL_ARGUMENTS,
    ModelEndpoint,
)
from agentrun.api.agent_defs import AgentDefinition
from agentrun.api.base import ApiModel, ResultRef, Timestamp
from agentrun.api.mcp import MAX_SERVER_TOOLS, MAX_SERVERS, PinnedTool


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
    model: str | None = Field(
        default=None,
        description=(
            "The name of the model that answered the turn (spec.agent.model.name, or a "
            "fallback's name); unset when that is not known (a turn with fallbacks whose pod "
            "did not say which answered)."
        ),
        max_length=253,
    )
    fallback: int | None = Field(
        default=None,
        ge=1,
        le=3,  # agent.MAX_FALLBACKS
        description=(
            "Set when a fallback answered the turn: its index in spec.agent.model.fallbacks, "
            "from 1 (the models before it failed; a Warning Event ModelFallback says why)."
        ),
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
    definition: AgentDefinition | None = Field(
        default=None,
        description=(
            "For a run of an Agent (spec.agentRef): the agent as the operator took it on its "
            "first pass, from which Agent and ModelConfig (uid, generation), with its digest. "
            "Every turn of the run uses this copy."
        ),
    )
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
