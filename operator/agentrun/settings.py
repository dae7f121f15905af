"""Operator settings and the names the operator puts on objects, in one place.

Settings come from the environment (``AGENTRUN_*``) and from ``agentrun run`` flags, which win.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentrun.api.names import GROUP

# Names on objects -----------------------------------------------------------------------------

RUN_FINALIZER = f"{GROUP}/cleanup"
"""On every AgentRun: released once the run's Jobs, pods and result objects are gone. The
operator adds it itself (agentrun/loop/ledger.py), before a run's first status write."""
DAEMON_FINALIZER = f"{GROUP}/daemon"
"""kopf's own, with kopf peering only: on a run while a kopf daemon drives it (kopf adds and
removes it; the janitor releases it after an uninstall)."""
JOB_FINALIZER = f"{GROUP}/outcome"
"""On every step Job: keeps a deleted Job visible until its attempt's outcome is committed."""
POD_GATE = f"{GROUP}/start"
"""The scheduling gate of every step pod: the operator removes it from one pod per attempt,
so a second pod the Job controller makes for the same attempt never starts."""
ANNOTATION_PREFIX = GROUP
"""Prefix of kopf's own bookkeeping annotations (instead of kopf.zalando.org)."""

LABEL_RUN = f"{GROUP}/run"
"""The run's name, shortened with a hash past 63 characters (see jobs.label_value)."""
ANNOTATION_RUN_NAME = f"{GROUP}/run-name"
"""The run's full name, on step Jobs."""
LABEL_RUN_UID = f"{GROUP}/run-uid"
LABEL_STEP = f"{GROUP}/step"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_KIND = f"{GROUP}/object"  # "step-job", "result", "audit", "transcript" or "context"
LABEL_TURN = f"{GROUP}/turn"
LABEL_SHARD = f"{GROUP}/shard"
"""On step Jobs and their pods when replicas share the runs (``AGENTRUN_SHARDS``): the run's
shard, ``<shard>-of-<count>`` (agentrun.core.shards.shard_label), so that a replica watches
only its shards' Jobs and pods. It routes watch events only: no proof or check covers it."""
"""On an agent run's transcript records and contexts: the model turn."""
ANNOTATION_PROOF = f"{GROUP}/proof"
"""On step Jobs: the operator's proof that it created the Job (agentrun.execution.proof)."""
SIGNING_SECRET = "agentrun-job-signing"
"""The Secret in the operator's own namespace holding the key of step Jobs' proofs."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "agentrun-operator"
FIELD_MANAGER = MANAGED_BY
"""The operator's name in managedFields (status, Jobs, ConfigMaps, Events) and as Events'
reportingController."""

DEFAULT_LLM_IMAGE = "agentrun-operator:0.1.0"
DEFAULT_LLM_COMMAND = ("agentrun", "step", "llm")

# Environment of step pods ---------------------------------------------------------------------

# Set on the step container by the operator (jobs.build_job), read by the step runner.
ENV_RUN = "AGENTRUN_RUN"
ENV_NAMESPACE = "AGENTRUN_NAMESPACE"
ENV_RUN_UID = "AGENTRUN_RUN_UID"
ENV_STEP = "AGENTRUN_STEP"
ENV_ATTEMPT = "AGENTRUN_ATTEMPT"
ENV_IDEMPOTENCY_KEY = "AGENTRUN_IDEMPOTENCY_KEY"
ENV_POD_IP = "AGENTRUN_POD_IP"
"""A model turn's pod address (``status.podIP``, by the downward API): where it takes its
request (see :mod:`agentrun.pod.llm`)."""
ENV_TURN_TOKEN_SHA256 = "AGENTRUN_TURN_TOKEN_SHA256"
"""The sha256 of the one-time token a model turn's request must carry."""
ENV_EXECUTOR_TOKEN_SHA256 = "AGENTRUN_EXECUTOR_TOKEN_SHA256"
"""The sha256 of the token every request to an agent run's executor must carry (see
:mod:`agentrun.pod.executor`)."""
TURN_PORT = 8470
"""The port a model turn's pod, or a run's executor, takes its requests on."""

ENV_RESULT_FILE = "AGENTRUN_RESULT_FILE"
"""Set by the step runner for the step's command: the file its result may be written to."""
ENV_TERMINATION_MESSAGE_PATH = "AGENTRUN_TERMINATION_MESSAGE_PATH"
"""Where the step runner leaves the envelope, when not /dev/termination-log (a local node)."""
ENV_SERVICEACCOUNT_DIR = "AGENTRUN_SERVICEACCOUNT_DIR"
"""Where the step runner finds the ServiceAccount token, when not the standard mount."""


def _env_list(name: str) -> tuple[str, ...]:
    raw = os.environ.get(name, "")
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _env_command(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = os.environ.get(name, "").strip()
    return tuple(shlex.split(raw)) if raw else default


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as error:
        raise ValueError(f"{name}={raw!r} is not a whole number") from error


def _env_switch(name: str, default: bool) -> bool:
    raw = (os.environ.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("on", "true", "1"):
        return True
    if raw in ("off", "false", "0"):
        return False
    raise ValueError(f"{name}={raw!r} is neither on nor off")


SERVICEACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _operator_namespace() -> str:
    """AGENTRUN_OPERATOR_NAMESPACE, else POD_NAMESPACE (the downward API in the chart and
    manifests), else the namespace of the pod's ServiceAccount, else ``default`` (an operator
    run outside a cluster)."""
    for name in ("AGENTRUN_OPERATOR_NAMESPACE", "POD_NAMESPACE"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    try:
        with open(SERVICEACCOUNT_NAMESPACE_FILE, encoding="utf-8") as file:
            found = file.read().strip()
    except OSError:
        found = ""
    return found or "default"


def _tracing_configured(env: Mapping[str, str]) -> bool:
    """The OpenTelemetry variables ask for an OTLP trace export (the exporter reads them)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(
        env.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


@dataclass(frozen=True)
class Settings:
    """What an operator process is configured with."""

    namespaces: tuple[str, ...] = field(default_factory=lambda: _env_list("AGENTRUN_NAMESPACES"))
    """Namespaces to watch; all namespaces when empty."""
    liveness_port: int = field(default_factory=lambda: _env_int("AGENTRUN_LIVENESS_PORT", 8080))
    """Port of the /healthz endpoint (0: none)."""
    metrics_port: int = field(default_factory=lambda: _env_int("AGENTRUN_METRICS_PORT", 8081))
    """Port of the /metrics (Prometheus) and /readyz endpoints (0: none)."""
    metrics_host: str = field(
        default_factory=lambda: os.environ.get("AGENTRUN_METRICS_HOST") or "0.0.0.0"
    )
    """Address the /metrics and /readyz endpoints listen on."""
    tracing: bool = field(default_factory=lambda: _tracing_configured(os.environ))
    """Whether spans of runs and step attempts are exported over OTLP
    (agentrun/telemetry/tracing.py):
    when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, unless
    OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none says otherwise. Needs the ``otel`` extra."""
    peering: str | None = field(default_factory=lambda: os.environ.get("AGENTRUN_PEERING"))
    """kopf peering object name; None runs standalone (no peering)."""
    shards: int = field(default_factory=lambda: _env_int("AGENTRUN_SHARDS", 0))
    """Shards the runs fall into, each decided by one replica at a time through a Lease in
    the operator's namespace (agentrun/loop/shards.py); 0: not sharded, this process decides
    every run in its namespaces. Every replica must be given the same number."""
    shard_lease_seconds: int = field(
        default_factory=lambda: _env_int("AGENTRUN_SHARD_LEASE_SECONDS", 15)
    )
    """How long a shard Lease nobody renews stays its holder's: a replica that dies loses
    its shards to the others this long after its last renewal (it renews every third)."""
    identity: str = field(
        default_factory=lambda: (
            os.environ.get("AGENTRUN_IDENTITY")
            or os.environ.get("POD_NAME")
            or f"{os.uname().nodename}-{os.getpid()}"
        )
    )
    """This replica among those sharing the runs, as its Leases name it: AGENTRUN_IDENTITY,
    else the pod's name (POD_NAME), else the host's name and process id. A process started
    again under the same identity takes its Leases back at once."""
    instance: str = field(default_factory=lambda: os.environ.get("POD_NAME") or os.uname().nodename)
    """This operator process, as Events name it (reportingInstance): the pod's name (POD_NAME,
    from the downward API in the chart and manifests), else the host's name."""
    operator_namespace: str = field(default_factory=_operator_namespace)
    """The operator's own namespace: where the key of step Jobs' proofs is kept (the Secret
    :data:`SIGNING_SECRET`, made by the operator the first time it is missing)."""
    resync_seconds: int = field(default_factory=lambda: _env_int("AGENTRUN_RESYNC_SECONDS", 30))
    """Every run is reconciled at least this often, events or not."""
    max_conflict_retries: int = field(
        default_factory=lambda: _env_int("AGENTRUN_MAX_CONFLICT_RETRIES", 8)
    )
    workers: int = field(default_factory=lambda: _env_int("AGENTRUN_WORKERS", 16))
    """Reconcile passes (with janitor sweeps, deletions and finalizer patches) run at once,
    at most.
    The API client keeps as many connections (agentrun/loop/concurrency.py)."""
    malloc_arenas: int = field(default_factory=lambda: _env_int("AGENTRUN_MALLOC_ARENAS", 2))
    """Most arenas glibc's allocator keeps (agentrun/loop/memory.py); 0 leaves its default,
    eight per core."""
    cleanup_timeout_seconds: int = field(
        default_factory=lambda: _env_int("AGENTRUN_CLEANUP_TIMEOUT_SECONDS", 60)
    )
    """How long deletion cleanup may keep failing before the run's finalizer is released."""
    janitor_seconds: int = field(default_factory=lambda: _env_int("AGENTRUN_JANITOR_SECONDS", 30))
    """Period of the janitor (agentrun/loop/janitor.py), which finishes deletions no watch
    delivered: runs deleted in a namespace being deleted or while the operator was down."""
    jitter_seed: int = field(default_factory=lambda: _env_int("AGENTRUN_JITTER_SEED", 0))
    job_deletion_grace_seconds: int = field(
        default_factory=lambda: _env_int("AGENTRUN_JOB_DELETION_GRACE_SECONDS", 30)
    )
    running_after_seconds: int = field(
        default_factory=lambda: _env_int("AGENTRUN_RUNNING_AFTER_SECONDS", 2)
    )
    """A step shows Running once its command has run this long in the attempt's pod (from
    the step container's start); shorter commands go from Launching straight to their
    outcome (a status write fewer per step), however long their pods took to start."""
    refusal_grace_seconds: int = field(
        default_factory=lambda: _env_int("AGENTRUN_REFUSAL_GRACE_SECONDS", 75)
    )
    """How long an attempt whose pod or Job the API server refuses for a reason that may pass
    (a ServiceAccount not made yet, an exceeded quota, an overloaded API server) waits for the
    next tries (the Job controller's, or the operator's every 5 s) before it fails (reason
    PodRefused or JobRefused). Other refusals (Pod Security, a LimitRange, an invalid Job)
    fail it at once."""
    rights_ttl_seconds: int = field(
        default_factory=lambda: _env_int("AGENTRUN_RIGHTS_TTL_SECONDS", 60)
    )
    """How long a run creator's right, once confirmed by a review, is taken as still held
    before a later launch that needs it asks again (a revoked right is noticed this late)."""
    llm_image: str = field(
        default_factory=lambda: os.environ.get("AGENTRUN_LLM_IMAGE") or DEFAULT_LLM_IMAGE
    )
    """Image of agent runs' model turns: the operator's own (the chart sets it to the image
    the operator runs), which has ``agentrun step llm``."""
    llm_command: tuple[str, ...] = field(
        default_factory=lambda: _env_command("AGENTRUN_LLM_COMMAND", DEFAULT_LLM_COMMAND)
    )
    """Command of model turns (AGENTRUN_LLM_COMMAND, split like a shell line)."""
    turns_ahead: int = field(default_factory=lambda: _env_int("AGENTRUN_TURNS_AHEAD", 2))
    """How many turns ahead an agent run's model turn Jobs are made, so that their pods have
    started when their turn begins (0 to 4; 0: each at its turn). Each is a pod that waits."""
    executor: bool = field(default_factory=lambda: _env_switch("AGENTRUN_EXECUTOR", True))
    """Whether an agent run's model turns (and its MCP servers' tool calls) go to one executor
    pod per run (AGENTRUN_EXECUTOR, ``on`` by default) instead of a Job each (``off``; see
    :mod:`agentrun.core.executor`)."""


def sharding_problem(settings: Settings) -> str | None:
    """What is wrong with the sharding settings, said for the person who set them; None if
    nothing."""
    if settings.shards < 0:
        return f"--shards (AGENTRUN_SHARDS) must be 0 or more, not {settings.shards}"
    if settings.shards and settings.peering is not None:
        return (
            "--shards (AGENTRUN_SHARDS) and --peering (AGENTRUN_PEERING) exclude each other: "
            "sharded replicas are all active, kopf peering keeps one active; choose one"
        )
    if settings.shards and settings.shard_lease_seconds < 3:
        return (
            "AGENTRUN_SHARD_LEASE_SECONDS must be 3 or more (Leases are renewed every third "
            f"of it), not {settings.shard_lease_seconds}"
        )
    return None
