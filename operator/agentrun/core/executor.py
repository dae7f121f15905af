"""The run's executor: one pod that takes an agent run's model turns, and the calls of its MCP
servers' tools and of its HTTP tools, instead of a Job each.

A model turn in a Job of its own pays a pod's start and the import of the model client for
one call (:mod:`agentrun.pod.executor` says how much). With ``AgentConfig.executor`` on, the
loop keeps one executor per run while the run may still take turns:

- **Named before it is made.** ``status.agent.executor`` names it (generation ``n``, Job
  ``executor_name(run, n)``); the Job is created after that write
  (:class:`agentrun.core.actions.PrepareExecutor`), signed and owned as every step Job, its
  pod held by the operator's gate and let start by this process only (:class:`StartPod`).
- **A turn is bound to the pod it is sent to.** A model turn's attempt whose launch finds
  the executor running (made by this process, or verified as the operator's after a restart:
  :attr:`agentrun.core.observed.AheadJob.trusted`; its pod started and with an address) commits
  ``executorPod``, the pod's uid, with its intent, and its request goes to that pod once the
  intent is committed (:class:`SendTurn` with ``executor``). Only that pod is asked for the
  attempt's outcome: the shell observes the attempt as a Job whose termination message is
  the executor's answer (:mod:`agentrun.loop.turn_requests`), so it is settled as a step
  from its pod is; an attempt whose pod is gone without an answer failed (``ExecutorLost``),
  and the retry policy decides, as for a pod that died.
- **MCP calls the same way, and HTTP tools' calls.** A call of an MCP server's tool or of an
  HTTP tool runs the operator's program as a turn does, so a launch that finds the executor
  running binds it too; its request carries the call step's variables, and for its header
  variables the executor's own variables that hold those Secrets' values (:func:`call_env`:
  the executor's Job takes every header Secret of the run's MCP servers and HTTP tools; the
  operator never reads one).
- **A turn waits for one that is coming.** The executor is named in the pass that begins
  the first turn, so that turn finds it starting: a model turn's launch waits for an
  executor named in status that is coming (:func:`awaits`: up to :data:`WAIT_SECONDS` from
  the write that named it; a timer brings the pass that stops waiting), then binds it. The
  wait costs what a Job of its own would have (a pod's start), once per executor.
- **Otherwise a Job, as before.** A turn that finds no executor coming (the setting off, the
  creator's rights to the Secrets its pod holds not confirmed, its pod refused, lost or
  ended) or waited that long runs as a Job of its own.
- **Discovery too.** A run with MCP servers has its executor made before their tools are
  discovered (steps of their own, before the first turn). A discovery step waits for it as
  a turn does and is sent to it as a call is (program :data:`MCP_DISCOVER`), so the first
  turn finds it running too.
- **Replaced when it ends or is lost.** An executor whose Job ended (it ends itself after an
  hour without a request; none is made again while a call waits for approval), is being
  deleted or lost its pod, or one not known to be the operator's (neither made by this
  process nor verified: say an operator restarted with other settings for the turns' image,
  whose dry-run create differs), once no attempt in flight is bound to it, is replaced by the
  next generation; the old one, no longer named in status, goes as a stray.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import naming
from agentrun.core.actions import Action, CreateJob, PrepareExecutor, SendTurn, StartPod
from agentrun.core.observed import AheadJob, JobState, ObservedJob
from agentrun.core.pod_env import ENV_HTTP_TOOL
from agentrun.core.turn_steps import executor_secrets, executor_step
from agentrun.core.turns import (
    DISCOVERY,
    AgentConfig,
    Host,
    call_of,
    dynamic_names,
    executor_name,
    executor_secret_env,
    is_model_turn,
    keeps_executor,
    mcp_tools_of,
    rights_granted,
    turn_of_step,
)


def creation(run: m.AgentRun, config: AgentConfig) -> CreateJob | None:
    """The create of the executor ``status.agent.executor`` names, as the shell makes it of
    :class:`PrepareExecutor`: what a Job of that name must be to be the run's executor when
    this process did not make it (the shell compares the two, as for an attempt's Job). None
    when status names none."""
    ag = run.status.agent if run.status is not None else None
    if run.spec.agent is None or ag is None or ag.executor is None:
        return None
    step = executor_step(run, ag, config)
    return executor_create(PrepareExecutor(step, ag.executor.job_name, ag.executor.generation))


def executor_create(action: PrepareExecutor) -> CreateJob:
    """The Job create of ``action``: the executor's step, its generation as the attempt, no
    idempotency key and no args hash (no intent is committed for it)."""
    return CreateJob(action.step, action.generation, action.job_name, "", "")


def _gone(job: ObservedJob) -> bool:
    return job.state != JobState.ACTIVE or job.deleting or job.pod_lost


def _bound(b: Host, pod_uid: str | None) -> bool:
    """Whether an attempt in flight is bound to the executor pod ``pod_uid``."""
    return pod_uid is not None and any(
        st.executor_pod == pod_uid and st.phase in m.ACTIVE_STEP_PHASES for st in b.steps.values()
    )


def keep(b: Host, agent: a.Agent, ag: agent_status.AgentStatus, config: AgentConfig) -> None:
    """Have the run's executor made, let start, or replaced (see the module's doc)."""
    if not config.executor or b.run.spec.suspend or b.run.spec.cancel:
        return
    if not keeps_executor(ag, b.steps) or b.halt is not None:
        return
    if any(st.phase == m.StepPhase.WAITING_FOR_APPROVAL for st in b.steps.values()):
        return  # that may take long: one that ended meanwhile is made again once it is over
    step = executor_step(b.run, ag, config)
    if not rights_granted(b, step):
        # Its pod holds what its creator must be allowed to use (the model's API key Secret,
        # the MCP servers' header Secrets): made, and let start, only while the shell found
        # that granted.
        return
    current = ag.executor
    found = b.observed.executor
    if found is not None and found.job.name != (current.job_name if current else None):
        found = None  # not the one named in status (the shell observes only that one)
    replace = current is None or (
        found is not None
        and (_gone(found.job) or not found.trusted)
        and not _bound(b, found.job.pod_uid)
    )
    if replace:
        generation = current.generation + 1 if current is not None else 1
        name = executor_name(b.run, generation)
        ag.executor = agent_status.ExecutorStatus(
            generation=generation, job_name=name, named_at=b.now
        )
        b.later.append(PrepareExecutor(step, name, generation))
        return
    assert current is not None
    if found is None:
        # Named in status, not found: created after that write, and again by a later pass
        # (the shell creates each name once per process; one that exists already is found).
        b.later.append(PrepareExecutor(step, current.job_name, current.generation))
    elif found.trusted and found.job.start_pod is not None:
        b.later.append(StartPod(found.job.name, found.job.start_pod))


def usable(b: Host, config: AgentConfig) -> ObservedJob | None:
    """The executor a new model turn's attempt may be sent to: the one named in status, made
    by this process or verified (:attr:`AheadJob.trusted`), running with an address; None when
    there is none."""
    if not config.executor:
        return None
    current = b.status.agent.executor if b.status.agent is not None else None
    found: AheadJob | None = b.observed.executor
    if current is None or found is None or found.job.name != current.job_name:
        return None
    job = found.job
    if not found.trusted or _gone(job) or job.address is None or job.pod_uid is None:
        return None
    return job


def holding(b: Host, st: m.StepStatus) -> ObservedJob | None:
    """The executor whose pod the attempt ``st`` is bound to, while it runs; None when it is
    gone (the shell then observes the attempt as lost)."""
    found = b.observed.executor
    if found is None or st.executor_pod is None or found.job.pod_uid != st.executor_pod:
        return None
    return None if _gone(found.job) or found.job.address is None else found.job


def request(ag: agent_status.AgentStatus, st: m.StepStatus, executor: ObservedJob) -> list[Action]:
    """The request of the model turn's attempt ``st`` to ``executor``."""
    return request_to(ag, st, st.job_name or "", executor.address, executor.name)


def request_to(
    ag: agent_status.AgentStatus,
    st: m.StepStatus,
    name: str,
    address: str | None,
    executor: str = "",
) -> list[Action]:
    """The request of the model turn's attempt ``st`` (named ``name``) to the pod at
    ``address``: the turn's own pod, or the run's ``executor``; none without an address."""
    ctx = ag.context
    if ctx is None or address is None:
        return []
    return [
        SendTurn(
            job_name=name,
            step=st.name,
            attempt=st.attempt,
            address=address,
            idempotency_key=st.idempotency_key or "",
            context_name=ctx.name,
            parts=ctx.parts,
            digest=ctx.digest,
            executor=executor,
            turn=turn_of_step(st.name) or ag.turn,
        )
    ]


MCP_CALL = "mcp-call"
"""The program of a call of an MCP server's tool sent to the executor (``agentrun step llm``
as the executor runs it: :mod:`agentrun.pod.executor`)."""
MCP_DISCOVER = "mcp-discover"
"""The program of the discovery of an MCP server's tools sent to the executor."""
HTTP_CALL = "http-call"
"""The program of a call of an HTTP tool sent to the executor (``agentrun step http`` as the
executor runs it)."""


def call_env(
    run: m.AgentRun, step: m.Step
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] | None:
    """The variables of the MCP call's ``step`` as its request to the executor carries them:
    the literal ones, and for each one from a Secret the executor's variable holding that
    Secret's value (:func:`agentrun.core.turns.executor_secret_env`); None when the executor
    holds no such variable (then the call is a Job of its own)."""
    held = executor_secrets(run.spec.agent)
    plain: list[tuple[str, str]] = []
    secret: list[tuple[str, str]] = []
    for env in step.container.env or []:
        source = env.value_from
        if source is None:
            plain.append((env.name, env.value or ""))
            continue
        ref = source.secret_key_ref
        if ref is None or executor_secret_env(ref) not in held:
            return None
        secret.append((env.name, executor_secret_env(ref)))
    return tuple(plain), tuple(secret)


def call_digest(env: Mapping[str, object], secret_env: Mapping[str, object]) -> str:
    """The sha256 a call's request carries, of its variables and of the executor's variables
    its headers take: computed by the operator for the request, and by the executor
    (:mod:`agentrun.pod.executor`) to check it."""
    return naming.sha256_text(naming.canonical_json({"env": env, "secretEnv": secret_env}))


def takes_call(b: Host, step: m.Step, inputs: int) -> bool:
    """Whether ``step``, of a committed launch intent with ``inputs`` input variables, is a
    call of an MCP server's tool or of an HTTP tool, or the discovery of a server's tools,
    that the run's executor can run."""
    agent = b.run.spec.agent
    if agent is None or inputs or call_env(b.run, step) is None:
        return False
    if _discovers(b, step.name):
        return True
    call = call_of(b.status.agent, step.name)
    if call is None:
        return False
    http = {t.name for t in agent.tools or [] if t.http is not None}
    return call.tool in http or call.tool in mcp_tools_of(agent, b.status.agent)


def _program(st: m.StepStatus, env: tuple[tuple[str, str], ...]) -> str:
    """The executor's program of a call's (or a discovery's) attempt ``st`` with ``env``."""
    if st.name.startswith(DISCOVERY):
        return MCP_DISCOVER
    return HTTP_CALL if any(name == ENV_HTTP_TOOL for name, _ in env) else MCP_CALL


def _discovers(b: Host, name: str) -> bool:
    """Whether ``name`` is the discovery step of one of the run's MCP servers, before the
    first turn."""
    ag = b.status.agent
    return ag is not None and ag.turn == 0 and name in dynamic_names(ag, b.run.spec.agent)


WAIT_SECONDS = 30
"""How long a model turn or a discovery waits for the run's executor, from the write that
named it."""


def awaits(b: Host, step: m.Step, config: AgentConfig) -> bool:
    """Whether the launch of ``step`` waits for the run's executor: a model turn, or a
    discovery (it has no inputs) the executor can run (:func:`takes_call`), while the
    executor named in status is coming (not running with an address yet, neither ended,
    lost nor refused its pod) and was named less than :data:`WAIT_SECONDS` ago. A timer
    brings the pass that stops waiting."""
    ag = b.status.agent
    current = ag.executor if ag is not None else None
    if (
        not config.executor
        or current is None
        or current.named_at is None
        or not _would_take(b, step)
        or usable(b, config) is not None
    ):
        return False
    found = b.observed.executor
    if found is not None and found.job.name == current.job_name:
        job = found.job
        if _gone(job) or job.pod_refused is not None:
            return False
    due = current.named_at + timedelta(seconds=WAIT_SECONDS)
    if b.now >= due:
        return False
    b.timer(due)
    return True


def _would_take(b: Host, step: m.Step) -> bool:
    """Whether the run's executor takes ``step`` once it runs: a model turn, or the
    discovery of an MCP server's tools that it can run (it holds the variables the
    discovery's step takes from Secrets: :func:`takes_call`'s test for a discovery)."""
    if is_model_turn(step.name):
        return True
    return _discovers(b, step.name) and call_env(b.run, step) is not None


def call_request(
    st: m.StepStatus, step: m.Step, executor: ObservedJob, run: m.AgentRun
) -> list[Action]:
    """The request of the MCP call's (or discovery's) attempt ``st`` (of ``step``) to
    ``executor``."""
    found = call_env(run, step)
    if found is None or executor.address is None or not st.job_name:
        return []
    env, secret = found
    return [
        SendTurn(
            job_name=st.job_name,
            step=st.name,
            attempt=st.attempt,
            address=executor.address,
            idempotency_key=st.idempotency_key or "",
            context_name="",
            parts=0,
            digest=call_digest(dict(env), dict(secret)),
            executor=executor.name,
            turn=turn_of_step(st.name) or 0,
            program=_program(st, env),
            env=env,
            secret_env=secret,
            timeout_seconds=step.timeout_seconds,
        )
    ]


LOST = "ExecutorLost"
"""The reason of a model turn's attempt whose executor pod went without its outcome."""


def attempts_on(
    run: m.AgentRun,
    executor: ObservedJob | None,
    answers: Mapping[str, tuple[int, str]],
) -> tuple[ObservedJob, ...]:
    """The attempts in flight of ``run`` bound to an executor, as the core observes them: as
    Jobs named after the attempt, Succeeded or Failed with the executor's answer (its exit
    code and termination message, keyed in ``answers`` by the attempt's name) once there is
    one, running while the executor ``executor`` (as found: the one status names) is the pod
    the attempt is bound to and runs, else Failed (:data:`LOST`)."""
    found = []
    for st in (run.status.steps if run.status else None) or []:
        if st.executor_pod is None or not st.job_name or st.phase not in m.ACTIVE_STEP_PHASES:
            continue
        name, answer = st.job_name, answers.get(st.job_name)
        if answer is not None:
            code, message = answer
            state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
            found.append(ObservedJob(name, st.name, st.attempt, state, termination_message=message,
                                     exit_code=code, held=False, expires=True))  # fmt: skip
        elif executor is not None and executor.pod_uid == st.executor_pod and not _gone(executor):
            found.append(
                ObservedJob(
                    name,
                    st.name,
                    st.attempt,
                    JobState.ACTIVE,
                    held=False,
                    expires=True,
                    address=executor.address,
                    pod_uid=executor.pod_uid,
                    running_since=executor.running_since,
                )
            )
        else:
            message = (
                f"the executor pod {st.executor_pod} that took attempt {st.attempt} is gone "
                "without its outcome"
            )
            found.append(ObservedJob(name, st.name, st.attempt, JobState.FAILED, reason=LOST,
                                     message=message, held=False, expires=True))  # fmt: skip
    return tuple(found)
