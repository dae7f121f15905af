"""The agent loop's tokens, pure: whether the budget covers the next turn before it begins
(else the loop is paused), and what a turn is counted for (what the endpoint reported, never
more than the turn could have used; a count it did not report, as estimated).

See :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

from dataclasses import replace

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import context as cx
from agentrun.core.turns import AgentConfig, Host, model_of, model_step, prompt_ceiling, turn_needs


def counted_tokens(b: Host, step: str, reported: int) -> int:
    """The tokens a model turn's step is counted for: what the endpoint reported, but never
    more than the turn could have used (its maxOutputTokens and :func:`prompt_ceiling`). A
    report over that is recorded (a transition ReportedUsageRefused, a Warning Event, and
    ``status.agent.overReportedTurns``)."""
    agent = b.run.spec.agent
    ag = b.status.agent
    ctx = ag.context if ag is not None else None
    if agent is None or ag is None or ctx is None or step != model_step(ag.turn):
        return reported
    if ctx.turn != ag.turn:  # pragma: no cover - a turn runs with its own context
        return reported
    model = model_of(agent, ag)
    ceiling = model.max_output_tokens + prompt_ceiling(ctx)
    if reported <= ceiling:
        return reported
    ag.over_reported_turns += 1
    b.record(
        step,
        None,
        "Counted",
        "ReportedUsageRefused",
        f"turn {ag.turn}: the endpoint reported {reported} tokens, more than the turn could "
        f"have used (maxOutputTokens {model.max_output_tokens} + a prompt of at most "
        f"{prompt_ceiling(ctx)}); {ceiling} counted",
    )
    return ceiling


USAGE_NOT_REPORTED = "UsageNotReported"
"""The reason of the transition (and Warning Event) of a turn whose endpoint reported no usage,
or only part of it."""


def _note_unreported(b: Host, ag: agent_status.AgentStatus, output: cx.Output) -> None:
    """Say on the run that turn ``ag.turn``'s endpoint reported no usage (or only part of it),
    and how it was counted: ``agentrun step llm`` estimated each missing count at
    :data:`agentrun.core.context.BYTES_PER_TOKEN` bytes a token (of the request sent, of the
    output), so that budget.maxTokens still holds; a transition UsageNotReported, a Warning
    Event, and ``status.agent.unreportedUsageTurns``."""
    ag.unreported_usage_turns += 1
    if len(output.unreported) == len(cx.USAGE_COUNTS):
        missing = "usage"
    else:
        missing = " and ".join(f"usage.{key}" for key in output.unreported)
    b.record(
        model_step(ag.turn),
        None,
        "Counted",
        USAGE_NOT_REPORTED,
        f"turn {ag.turn}: the model endpoint reported no {missing}; counted as estimated at "
        f"{cx.BYTES_PER_TOKEN} bytes a token instead ({output.prompt_tokens} prompt + "
        f"{output.completion_tokens} completion tokens against budget.maxTokens)",
    )


def _begin_turn(b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig) -> None:
    ctx = ag.context
    if ctx is None or ctx.turn != ag.turn:  # pragma: no cover - a context comes with each turn
        ag.stage = agent_status.AgentStage.WAITING if ag.turn == 0 else ag.stage
        return
    if b.run.spec.suspend:
        return
    need = turn_needs(model_of(agent, ag), ctx, config)
    budget = b.run.spec.budget or m.Budget()
    usage = b.status.usage or m.Usage()
    note = ""
    if budget.max_tokens is not None:
        left = budget.max_tokens - usage.tokens
        if need > left:
            ag.stage = agent_status.AgentStage.PAUSED
            return
        note = f"; {max(left, 0)} of budget.maxTokens {budget.max_tokens} left"
    resumed = (
        " (resumed: the budget covers it now)" if ag.stage == agent_status.AgentStage.PAUSED else ""
    )
    name = model_step(ag.turn)
    b.steps[name] = m.StepStatus(name=name, phase=SP.PENDING)
    b.record(
        name,
        None,
        SP.PENDING,
        "TurnStarted",
        f"model turn {ag.turn} of {agent.max_turns}{resumed}: context {ctx.bytes} bytes, "
        f"needs up to {need} tokens{note}",
    )
    ag.stage = agent_status.AgentStage.THINKING
    ag.turn_image = config.llm_image
    ag.turn_command = list(config.llm_command)
    ag.calls = None
    ag.finish_reason = None


def paused_message(
    agent: a.Agent, run: m.AgentRun, status: m.AgentRunStatus, cfg: AgentConfig
) -> str:
    ag = status.agent
    budget = run.spec.budget or m.Budget()
    used = (status.usage or m.Usage()).tokens
    if ag is None or ag.context is None or budget.max_tokens is None:
        return "paused"
    model = model_of(agent, ag)
    need = turn_needs(model, ag.context, cfg)
    return (
        f"paused before turn {ag.turn}: it may use {need} tokens (maxOutputTokens "
        f"{model.max_output_tokens} + about {need - model.max_output_tokens} of "
        f"prompt) but {max(budget.max_tokens - used, 0)} of budget.maxTokens "
        f"{budget.max_tokens} are left; raise spec.budget.maxTokens to resume"
    )


def _bounded(agent: a.Agent, ag: agent_status.AgentStatus, output: cx.Output) -> cx.Output:
    """``output`` with its usage at most what the turn could have used (the reported numbers
    kept in ``reported_tokens``)."""
    ctx = ag.context
    if ctx is None:  # pragma: no cover - every turn has its context
        return output
    prompt = min(output.prompt_tokens, prompt_ceiling(ctx))
    completion = min(output.completion_tokens, model_of(agent, ag).max_output_tokens)
    if (prompt, completion) == (output.prompt_tokens, output.completion_tokens):
        return output
    reported = min(output.prompt_tokens + output.completion_tokens, m.MAX_TOKENS)
    return replace(
        output, prompt_tokens=prompt, completion_tokens=completion, reported_tokens=reported
    )
