"""What the shell observed in the cluster, reduced to what the core needs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from agentrun.api import agent_defs as d
from agentrun.api import models as m
from agentrun.core.context import Stored
from agentrun.core.naming import sha256_text


class JobState(StrEnum):
    ACTIVE = "Active"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class ObservedChild:
    """An AgentRun found in the parent's namespace, as the shell read it."""

    name: str
    uid: str
    controller_uid: str | None
    """The uid of its controller ownerReference (kind AgentRun), if any."""
    spec_digest: str | None
    phase: m.RunPhase | None = None
    tokens: int = 0
    answer: str | None = None
    """The child's whole answer (read by reference when not inline, checked against its
    status.agent.answerDigest by the shell); None while it has none."""
    message: str | None = None
    cancel: bool = False
    suspend: bool = False
    proven: bool = False
    """It carries the operator's proof of a child made for a call of its controller (checked
    by the shell, which holds the key: :func:`agentrun.core.subagents.proof_bound`), and no
    admission record names anyone but the operator as its creator. Its name, controller,
    annotations and spec prove nothing: anyone who may create AgentRuns can copy them."""


@dataclass(frozen=True)
class PodRef:
    """A pod, by name and uid (an action on it holds only for that uid)."""

    name: str
    uid: str


@dataclass(frozen=True)
class ObservedJob:
    """A step Job as found in the cluster: controlled by the run, and verified by the shell
    to be the Job the operator created for the attempt (see agentrun.observation.adoption)."""

    name: str
    step: str
    attempt: int
    state: JobState
    termination_message: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # e.g. Error, DeadlineExceeded, BackoffLimitExceeded
    message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    held: bool = True
    """The Job still carries the operator's finalizer (it is released once the attempt's
    outcome is committed, see :class:`agentrun.core.actions.ReleaseJob`)."""
    expires: bool = False
    """The Job has ``ttlSecondsAfterFinished``: Kubernetes deletes it once finished."""
    deleting: bool = False
    deleted_at: datetime | None = None
    """When the Job's deletion was asked for (its deletionTimestamp)."""
    """Someone deleted the Job; the operator's Job finalizer keeps it visible until the
    attempt's outcome is committed, so a deleted attempt is never mistaken for one that was
    never created (which would be created again)."""
    pod_refused: str | None = None
    """The API server refused the Job's pod (the Job controller's FailedCreate Event: Pod
    Security admission, a missing ServiceAccount, a quota), in its own words; the Job has no
    pod. The core fails the attempt (reason PodRefused) and deletes the Job."""
    start_pod: PodRef | None = None
    """The pod of the Job that may start now: every step pod is created held by a scheduling
    gate, and only one pod per attempt is ever let go (agentrun.execution.jobs.choose_pod).
    The core lets it start (:class:`agentrun.core.actions.StartPod`)."""
    address: str | None = None
    """The address (``status.podIP``) of the attempt's one started pod while it runs: where a
    model turn's pod takes its request (:class:`agentrun.core.actions.SendTurn`)."""
    pod_uid: str | None = None
    """The uid of the attempt's one started pod while it runs (with :attr:`address`)."""
    running_since: datetime | None = None
    """When the step container of that pod started running (its ``state.running.startedAt``,
    the kubelet's clock); None while no pod of the attempt runs its command."""
    held_pods: tuple[str, ...] = ()
    """Other pods of the Job that run its template and are held for good: duplicates of the
    attempt, which never start."""
    pod_lost: bool = False
    """The Job still counts as running, but the pod this process let start has ended or is
    gone (deleted, evicted, its node lost): the Job can only fail once the Job controller
    catches up. Known only for Jobs whose pod this process started."""
    name_taken: str | None = None
    """A Job the operator did not create holds the attempt's name: why it is not the
    attempt's. Nothing else of it is observed; the core fails the attempt (reason
    JobNameTaken) and leaves the Job alone."""


@dataclass(frozen=True)
class StrayJob:
    """A Job controlled by the run, still holding the operator's finalizer, that no committed
    attempt accounts for: its step was removed from the plan (or changed since its launch), or
    a later attempt superseded it. No intent describes it, so its spec cannot be verified (see
    agentrun.observation.adoption) and its outcome is never read: the core only stops it and,
    once it is no longer needed, lets it go."""

    name: str
    step: str
    attempt: int
    state: JobState
    """From the Job's conditions only."""
    deleting: bool = False
    deleted_at: datetime | None = None


@dataclass(frozen=True)
class AheadJob:
    """A Job of the run made with no committed intent: the next model turn's, made while the
    current turn runs (see :class:`agentrun.core.actions.PrepareTurn`), as found before its
    turn starts; or the run's executor (:mod:`agentrun.core.executor`)."""

    job: ObservedJob
    trusted: bool
    """A next turn's Job: this process created it (its uid is one its create returned). Only
    then is its pod let start before its turn: after a restart it waits for the turn's
    intent, which verifies it as every attempt's Job is verified
    (agentrun.observation.adoption). The run's executor: this process created it, or it is
    verified as the operator's as an attempt's Job is (signed with the operator's key, and
    what the operator would create for the executor status names, by a dry-run create), so
    that an operator restarted mid-run goes on sending turns to it."""


@dataclass(frozen=True)
class CarriedSource:
    """What the run a carried result claims to come from (its ``fromRun``) really committed
    for that step, as the shell read it from that run's status (same namespace).

    The core accepts a carried result only when it matches this: a fork may carry what its
    source committed, and nothing else.
    """

    run: str
    """``namespace/name`` of the run read."""
    args_hash: str | None
    """The step's committed argsHash in that run."""
    result_digest: str | None
    """sha256 of the step's full committed result (of the inline result when it was kept in
    status); None when the step committed no result."""
    summary: str | None = None

    @classmethod
    def from_step_status(cls, run: str, st: m.StepStatus) -> CarriedSource | None:
        """The source of a step that Succeeded in ``run``; None for any other phase (nothing
        was committed that could be carried)."""
        if st.phase != m.StepPhase.SUCCEEDED:
            return None
        digest = st.result_digest
        if st.result_ref is None and st.result is not None:
            digest = sha256_text(st.result)
        return cls(run=run, args_hash=st.args_hash, result_digest=digest, summary=st.summary)


@dataclass(frozen=True)
class ResumeSource:
    """The conversation ``spec.agent.resumeFrom`` names, as the shell read it from that run in
    the run's own namespace (:mod:`agentrun.observation.conversation`): the context document of the
    turn after ``turn`` (of ``turn`` itself, with the answer, after the turn it answered in),
    verified against the chain of digests that run committed, or why it cannot be
    continued (``problem``). The core checks the document against ``digest`` again."""

    run: str
    """``namespace/name`` of the run read."""
    uid: str
    turn: int
    document: str | None = None
    """The context document (JSON text) of that run's turn ``turn + 1``."""
    digest: str | None = None
    """sha256 of ``document`` as the chain of that run's committed digests gives it."""
    earlier_turns: int = 0
    """That run's own ``status.agent.resumedFrom.earlierTurns`` (a fork of a fork)."""
    answer: str | None = None
    """That run's answer, when ``turn`` is the turn it answered in (a follow-up question):
    then ``document`` is the context of ``turn`` itself, which the answer followed."""
    answer_digest: str | None = None
    """sha256 of ``answer`` as that run committed it (``status.agent.answerDigest``)."""
    problem: str | None = None


@dataclass(frozen=True)
class Definition:
    """The Agent ``spec.agentRef`` names and its ModelConfig, as the shell read them in the
    run's namespace once the run's creator was found allowed to get both and every Secret they
    name (:mod:`agentrun.observation.agent_refs`); or why the run cannot take them
    (``problem``)."""

    agent: d.AgentObject | None = None
    model: d.ModelConfigObject | None = None
    """None when the Agent writes its model out."""
    problem: str | None = None


@dataclass(frozen=True)
class Observed:
    """Everything observed for one run."""

    jobs: Sequence[ObservedJob] = field(default_factory=tuple)
    ahead: Sequence[AheadJob] = field(default_factory=tuple)
    """Model turns' Jobs made before their turn's intent (the current turn's, before its
    first launch is committed, and the next one's: :func:`agentrun.core.turns.ahead_names`)."""
    executor: AheadJob | None = None
    """The run's executor (the Job ``status.agent.executor`` names), as found: controlled by
    the run, and used for new turns only when this process created it."""
    recorded_seq: int | None = None
    """The highest transition seq stored in the run's audit record; None when the shell
    keeps no record (then the history is a plain ring)."""
    record_name: str | None = None
    carried_sources: Mapping[str, CarriedSource] = field(default_factory=dict)
    """Keyed by step name: for each of the run's spec.carriedResults, what its ``fromRun``
    committed for that step (:meth:`CarriedSource.from_step_status`), read by the shell from
    that run in the run's own namespace. A step left out (source not found, not Succeeded
    there) has its carried result refused. Only read on the pass that first sees the run's
    steps, when carried results are accepted or refused once and for all."""

    refusals: Mapping[str, str] = field(default_factory=dict)
    """Keyed by step name: why the step may not be launched on its creator's behalf (a
    permission the creator lacks, or no recorded creator), as the shell found before launch.
    The core fails such a step (reason Forbidden) when it would launch it; steps left out may
    be launched."""
    granted: frozenset[tuple[str, str, str]] = frozenset()
    """Permissions (verb, resource, name) the shell found the run's creator to have, each
    confirmed less than the rights TTL ago (:meth:`agentrun.access.authz.Authorizer.granted`):
    a step of the loop made in this pass whose every check (:func:`agentrun.core.rights.
    checks_for`) is among them may be launched in this pass."""
    job_refusals: Mapping[str, str] = field(default_factory=dict)
    """Keyed by Job name: the API server's message refusing the create of a committed
    attempt's Job (a 4xx other than 409). The core fails that attempt (reason JobRefused)."""
    strays: Sequence[StrayJob] = field(default_factory=tuple)
    """The run's Jobs that no committed attempt accounts for, still held by the operator's
    finalizer (:class:`StrayJob`)."""
    running: frozenset[str] = frozenset()
    """Names of the run's Jobs (verified or strays) with a pod of their own that has not
    terminated yet: a step's next attempt starts only once no Job of its earlier attempts is
    among them, so two attempts of a step never overlap."""
    tampered: Mapping[str, str] = field(default_factory=dict)
    """Keyed by Job name: why a result by reference of that attempt (its own result, as the
    operator stored it, or an input it would have been given) is not the content committed
    for it, as the shell found when storing or binding it. The core fails that attempt
    (reason ResultTampered); the content is never used."""
    vanished: frozenset[str] = frozenset()
    """Names of Jobs the shell created or observed for a committed attempt and that are now
    gone without a trace (their finalizer stripped, then deleted). The core counts such an
    attempt as lost, as it would a Running one, rather than creating its Job again."""
    resume: ResumeSource | None = None
    """For an agent run with ``spec.agent.resumeFrom`` whose first turn has not started: the
    conversation it continues, as read in this pass; None when not read (the loop waits)."""
    definition: Definition | None = None
    """For a run that names an Agent (``spec.agentRef``) and has not taken it: the Agent as
    read in this pass; None when not read (the run waits)."""
    documents: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """Keyed by (ConfigMap name, key): the records an agent run's loop asked for
    (:func:`agentrun.core.agent_loop.wanted_documents`), as the shell read them; keys not found
    are left out (the loop waits for them)."""
    contexts: Mapping[str, Stored] = field(default_factory=dict)
    """Keyed by ConfigMap name: context documents among :attr:`documents` as this process
    stored them (:class:`agentrun.core.actions.StoreRecord`), kept by the shell beside what it
    wrote. The loop takes one rather than parsing its parts again only when the parts read
    are exactly the ones it was stored as (:meth:`Stored.document`)."""

    children: Sequence[ObservedChild] | None = None
    """The AgentRuns labelled as children of this run, as read in this pass (only while a
    sub-agent call is in flight; None: not read, and a call waits). Which one is a call's
    child is decided by name, controller uid and spec (:func:`agentrun.core.subagents.adopt`),
    never by the label."""
    depth: int = 0
    """The run's depth among sub-agents (0: a user's run), from its verified chain of
    controllers (:func:`agentrun.core.subagents.acting_creator`)."""

    def job(self, name: str) -> ObservedJob | None:
        return next((j for j in self.jobs if j.name == name), None)
