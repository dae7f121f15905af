"""The agent loop's launches, pure: what carries out a committed launch of a model turn or a
call (its Job's create, or the request to the run's executor, or to the Job made ahead of its
turn), the requests sent to a turn's pod and to the executor while they run, the model turns'
Jobs made ahead of their turn, and the names held by those that ended before it.

See :mod:`agentrun.core.agent_loop` for the loop itself.
"""

from __future__ import annotations

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.api.models import StepPhase as SP
from agentrun.core import executor, naming
from agentrun.core.actions import Action, CreateJob, DeleteJob, PrepareTurn, StartPod
from agentrun.core.observed import AheadJob, JobState, ObservedJob
from agentrun.core.turn_steps import current_steps, model_turn_step
from agentrun.core.turns import (
    AHEAD_LIMIT,
    AgentConfig,
    Host,
    is_model_turn,
    model_step,
    rights_confirmed,
)


def _send_turn(b: Host, ag: agent_status.AgentStatus, st: m.StepStatus) -> None:
    """Once the turn's intent is committed and its pod runs, send the pod its request (the
    executor its attempt is bound to, if any: it answers a repeat without a second call)."""
    if st.phase not in (SP.LAUNCHING, SP.RUNNING) or not st.job_name:
        return
    if st.executor_pod is not None:
        holder = executor.holding(b, st)
        if holder is not None:
            b.after.extend(executor.request(ag, st, holder))
        return
    job = next((j for j in b.observed.jobs if j.name == st.job_name), None)
    if job is not None and job.attempt == st.attempt:
        b.after.extend(_request(ag, st, job))


def _unsettled(st: m.StepStatus | None) -> bool:
    return st is None or st.phase not in m.TERMINAL_STEP_PHASES


def _send_calls(b: Host, bound: list[m.StepStatus], config: AgentConfig) -> None:
    """Send the run's executor the request of each call's (or discovery's) attempt in
    ``bound`` (bound to an executor's pod), while it runs there (it answers a repeat without
    a second call: an operator restarted while the call ran asks for its outcome so)."""
    if not bound:
        return
    steps = {x.name: x for x in current_steps(b, config)}
    for st in bound:
        holder = executor.holding(b, st) if st.phase in (SP.LAUNCHING, SP.RUNNING) else None
        step = steps.get(st.name)
        if holder is not None and step is not None:
            b.after.extend(executor.call_request(st, step, holder, b.run))


def _request(ag: agent_status.AgentStatus, st: m.StepStatus, job: ObservedJob) -> list[Action]:
    if job.state != JobState.ACTIVE:
        return []
    return executor.request_to(ag, st, job.name, job.address)


def _ahead(b: Host, name: str) -> AheadJob | None:
    """The model turn's Job ``name`` made ahead of its turn, as observed (None if none)."""
    return next((x for x in b.observed.ahead if x.job.name == name), None)


def launch_actions(
    b: Host, st: m.StepStatus, create: CreateJob, config: AgentConfig
) -> list[Action]:
    """What carries out a committed launch intent: its Job's create; for a model turn, or a
    call of an MCP server's tool or a discovery of its tools, that the run's executor takes
    (:mod:`agentrun.core.executor`),
    the request to it, once the intent (binding the attempt to the executor's pod) is
    committed; for a model turn whose
    Job this process made ahead of the turn (:class:`PrepareTurn`), none is needed, and its
    request goes as soon as the intent is committed when its pod runs already."""
    ag = b.status.agent
    model = is_model_turn(st.name)
    call = not model and executor.takes_call(b, create.step, len(create.input_env))
    holder = executor.usable(b, config) if model or call else None
    if st.executor_pod is not None:
        st.executor_pod = None  # an earlier attempt's: this one is bound anew
    if ag is not None and holder is not None:
        st.executor_pod = holder.pod_uid
        if call:
            return executor.call_request(st, create.step, holder, b.run)
        return executor.request(ag, st, holder)
    ahead = _ahead(b, create.job_name)
    if (
        ag is None
        or ahead is None
        or not ahead.trusted
        or create.attempt != 1
        or ahead.job.state != JobState.ACTIVE
        or ahead.job.deleting
    ):
        return [create]
    return _request(ag, st, ahead.job)


def clear_name(b: Host, name: str) -> bool:
    """Whether Job ``name`` is held by a stray (a model turn's Job made ahead that ended
    before its turn) or by a Job made ahead whose waiting pod ended or went before its turn
    (the Job controller has not failed it yet: a turn begun in it would fail); one that has
    ended, or lost its pod, is deleted, whatever the run's retention (no attempt ran in it),
    and let go a grace later (:func:`agentrun.core.settle.let_strays_go`)."""
    stray = next((j for j in b.observed.strays if j.name == name), None)
    if stray is not None:
        if stray.state != JobState.ACTIVE and not stray.deleting:
            b.after.append(DeleteJob(name, "EndedBeforeItsTurn"))
        return True
    ahead = _ahead(b, name)
    if ahead is None:
        return False
    if ahead.job.deleting:
        # Going, whoever deleted it: let go by the operator's finalizer, it may stay a while
        # (its pods are deleted first), and its deletion made it a generation this process
        # never created. A create under its name would meet it and take it for the attempt's.
        return True
    if not ahead.trusted:
        return False
    if ahead.job.state == JobState.ACTIVE and not ahead.job.pod_lost:
        return False
    b.after.append(DeleteJob(name, "EndedBeforeItsTurn"))
    return True


def _offers_tools(agent: a.Agent) -> bool:
    """Whether the model may call a tool: else its first answer is the run's."""
    return bool(agent.tools or agent.mcp_servers) and agent.tool_choice != "none"


def _prepare_next_turn(
    b: Host,
    agent: a.Agent,
    ag: agent_status.AgentStatus,
    config: AgentConfig,
    most: int | None = None,
) -> None:
    """While the turn runs (its model call, then its calls), have the Jobs of the next
    :attr:`AgentConfig.turns_ahead` turns (``most``, if fewer) made and their pods started,
    so that a turn waits for no pod (a pod's start takes longer than a quick turn). During
    the first turn's model call only the second turn's is made, and only if the model is
    offered a tool: a run that answers at once leaves one pod unused, or none. A run that
    ends sooner leaves them unused: they go as strays. Not while a call waits for approval
    (that may take long) or the run is held, nor past the last turn."""
    if b.run.spec.suspend or b.run.spec.cancel or config.executor:
        return  # (with an executor, the next turns go to it: no Job is made for them)
    if any(
        b.steps.get(c.step or "") is not None
        and b.steps[c.step or ""].phase == SP.WAITING_FOR_APPROVAL
        for c in ag.calls or []
    ):
        return
    committed = b.run.status.agent if b.run.status is not None else None
    if committed is None:
        return
    if committed.turn != ag.turn and (
        committed.turn != ag.turn - 1
        or committed.stage not in (agent_status.AgentStage.THINKING, agent_status.AgentStage.ACTING)
    ):
        return  # the run as read is further behind: the next pass prepares
    # In the pass that begins a turn (the run as read a turn behind, mid-turn), its Jobs are
    # made after the write that begins it: the Jobs this pass knows of (observed.ahead, from
    # the run as read) are those of the next AHEAD_LIMIT turns after the one as read.
    count = config.turns_ahead if most is None else min(most, config.turns_ahead)
    last = min(ag.turn + count, agent.max_turns, committed.turn + AHEAD_LIMIT)
    if last <= ag.turn or not rights_confirmed(b, model_turn_step(b.run, ag, last, config)):
        # A turn's pod holds what its creator must be allowed to use (the model's API key
        # Secret): made, and let start, only while the shell found that granted within the
        # rights TTL, as a turn's own launch is (else each turn's Job is made at its launch).
        return
    for turn in range(ag.turn + 1, last + 1):
        name = naming.job_name(b.run.metadata.name, b.run.metadata.uid, model_step(turn), 1)
        ahead = _ahead(b, name)
        if clear_name(b, name):
            continue  # it ended before its turn: made again once it is gone
        if ahead is None:
            b.later.append(PrepareTurn(model_turn_step(b.run, ag, turn, config), name))
        elif ahead.trusted and ahead.job.start_pod is not None:
            b.later.append(StartPod(ahead.job.name, ahead.job.start_pod))
