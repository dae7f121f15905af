"""What the core asks the shell to do. Plain data: the shell decides how."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.api.models import EnvVar, Step
from agentrun.core.context import Stored
from agentrun.core.observed import PodRef


@dataclass(frozen=True)
class CreateJob:
    """Create the Job of a committed launch intent. Safe to repeat: the name is deterministic,
    so a second create meets AlreadyExists and the existing Job is adopted."""

    step: Step
    attempt: int
    job_name: str
    idempotency_key: str
    args_hash: str
    input_env: tuple[EnvVar, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class PrepareTurn:
    """Create the next model turn's Job (attempt 1, under the name its intent will commit)
    while the current turn runs, so that its pod has started and waits for its request
    when the turn begins. Nothing runs before the request (:class:`SendTurn`), which is sent
    only after the turn's intent is committed. A run that no longer needs it lets it go as a
    Job no attempt accounts for (:class:`agentrun.core.observed.StrayJob`)."""

    step: Step
    job_name: str


@dataclass(frozen=True)
class PrepareExecutor:
    """Create the run's executor (the Job ``job_name`` of ``step``, named in
    ``status.agent.executor`` before this): one pod that takes the run's model turns, each
    by request once its intent is committed (:class:`SendTurn` with ``executor`` set). Its
    pod is let start like a step's (:class:`StartPod`)."""

    step: Step
    job_name: str
    generation: int


@dataclass(frozen=True)
class SendTurn:
    """Send a model turn's pod its request: the turn's context (the run's ConfigMap
    ``context_name``, checked against ``digest``) and idempotency key, with the one-time token
    its Job names. Safe to repeat: the pod takes one request in its life and answers a
    repeat with the digest it took (an executor, one request per attempt). Sent to the run's
    executor, the attempt may also be a call of an MCP server's tool (``program``)."""

    job_name: str
    step: str
    attempt: int
    address: str
    idempotency_key: str
    context_name: str
    parts: int
    digest: str
    executor: str = ""
    """The Job of the run's executor (whose pod is at ``address``) when sent to it; then
    ``job_name`` names the attempt, not a Job. The executor takes each attempt once and keeps
    its outcome, which the shell asks for until it has it."""
    turn: int = 0
    program: str = ""
    """Empty for a model turn; ``mcp-call`` for a call of an MCP server's tool sent to the
    run's executor (:func:`agentrun.core.executor.call_request`): then there is no context
    (``parts`` 0), ``env`` holds the call step's own variables, ``secret_env`` names, for each
    of its variables taken from a Secret, the executor's variable holding that Secret's
    value, and ``digest`` is the sha256 of both (the executor takes an attempt once, with
    one request)."""
    env: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[tuple[str, str], ...] = ()
    timeout_seconds: int | None = None
    """The call's own limit (the step's timeoutSeconds): the executor stops it then."""


@dataclass(frozen=True)
class DeleteJob:
    """Delete a step Job, its pods first (so none runs on while the Job is held). The
    operator's finalizer stays on it until the deletion grace has passed (a later DeleteJob
    with ``release``), so that an operator stalled between its fence write and that Job's
    create cannot create it again."""

    job_name: str
    reason: str
    release: bool = False
    """Also remove the operator's finalizer (the Job's outcome is recorded, and it has been
    deleting for the grace)."""


@dataclass(frozen=True)
class StartPod:
    """Let the one pod of an attempt start: remove the operator's scheduling gate from it
    (only if it is still that pod, by uid). No other pod of the attempt is ever let go, so a
    second pod the Job controller made never runs the step's command."""

    job_name: str
    pod: PodRef


@dataclass(frozen=True)
class ReleaseJob:
    """A finished step Job whose outcome is committed: remove the operator's finalizer and
    set its ``ttlSecondsAfterFinished``, so that Kubernetes' TTL controller deletes it (and
    its pods) ``ttl_seconds`` after it finished. One write, and no pass of the run later."""

    job_name: str
    ttl_seconds: int


@dataclass(frozen=True)
class StoreResult:
    """Write a result too large for status into a ConfigMap owned by the run.

    Runs *before* the status that references it is committed, so a committed reference
    never points at nothing. Idempotent: same name, same content.
    """

    name: str
    step: str
    attempt: int
    data: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class StoreRecord:
    """Write a ConfigMap of an agent run's memory, owned by the run: a finished turn's
    transcript record (``kind`` "transcript") or a turn's context (``kind`` "context").

    Runs *before* the status that references it is committed. Idempotent: the name is a
    function of the content (a context) or of committed records only (a transcript record),
    so a repeated create meets AlreadyExists with the same content.
    """

    name: str
    kind: str
    turn: int
    data: tuple[tuple[str, str], ...]
    stored: Stored | None = field(default=None, compare=False, repr=False)
    """A context's document as stored (``data`` holds its parts), which the shell keeps
    beside the data (``Observed.contexts``)."""


@dataclass(frozen=True)
class EmitEvent:
    """A Kubernetes Event on the run."""

    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteRun:
    """Delete the run itself (retention: ttlSecondsAfterFinished passed)."""

    reason: str


@dataclass(frozen=True)
class CreateChild:
    """Create the child AgentRun of a sub-agent call (its committed intent's manifest); one
    already there under its name is left alone (the core decides whether it is the child)."""

    step: str
    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class PatchChild:
    """Set ``spec.cancel`` and ``spec.suspend`` of the child with this name and uid."""

    name: str
    uid: str
    cancel: bool
    suspend: bool


Action = (
    CreateJob
    | CreateChild
    | PatchChild
    | DeleteJob
    | StartPod
    | ReleaseJob
    | StoreResult
    | StoreRecord
    | EmitEvent
    | DeleteRun
    | PrepareExecutor
    | PrepareTurn
    | SendTurn
)
