"""The vocabulary of the trust table (:mod:`agentrun.api.trust`): the phases of a step an
attack meets, the actors who make it, who can write an input, from when it is frozen, how it is
verified and proven, the two kinds of attack and what they end in; the resources the actors
may write (:data:`WRITES`, their RBAC), the known gaps the entries name, and the outcomes many
entries share.

Pure data: no kopf, no kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    """The phase of the step an attacker's change meets."""

    PENDING = "pending"
    LAUNCHING = "launching"
    RUNNING = "running"
    WAITING = "waiting for approval"
    FINISHED = "finished"


class Actor(StrEnum):
    """Who makes the change (see the module's docstring)."""

    EDIT = "edit"
    AGENTRUN_EDIT = "agentrun-edit"
    RUNS_ONLY = "runs-only"


class Writer(StrEnum):
    """Who can write an input."""

    OPERATOR = "operator"
    API_SERVER = "API server"
    CREATOR = "run creator"
    NAMESPACE_ADMIN = "namespace admin"
    EDITOR = "namespace editor"
    STEP_POD = "step's pod"
    EXECUTOR = "operator's executor pod"
    NODE = "node"
    JOB_CONTROLLER = "Job controller"
    CLUSTER_ADMIN = "cluster admin"


class Frozen(StrEnum):
    """From when an input no longer changes what the operator does."""

    CREATION = "creation"
    FIRST_PASS = "first pass"
    LAUNCH = "launch (argsHash)"
    COMMIT = "commit (digest)"
    CREATE = "create (proof)"
    NEVER = "never"


class Check(StrEnum):
    """How the operator verifies an input where it uses it."""

    ADMISSION = "frozen by admission"
    CRD_RULE = "frozen by the CRD's validation rule"
    FROZEN_STEPS = "frozen in status.steps[].frozen"
    FROZEN_STATUS = "frozen in status.agent.frozen"
    ARGS_HASH = "bound into argsHash"
    DIGEST = "digest checked"
    OWNER_UID = "owner uid checked"
    PROOF = "proof HMAC"
    DRY_RUN = "dry-run comparison"
    JOB_UID = "tracked by Job uid"
    POD_TEMPLATE = "pod checked against its Job's template"
    ONE_POD = "one pod per attempt let start (the operator's scheduling gate)"
    CREATOR_RIGHTS = "creator's rights (LocalSubjectAccessReview)"
    STATUS_ONLY = "status subresource (operator only)"
    RBAC = "RBAC of namespace users"
    LIVE = "read as written (an editor's to set)"
    NOT_USED = "not used"


class Origin(StrEnum):
    """How what the operator or a step finds is proven to be the operator's own or a step's
    own, or why it needs no such proof. The last five are shapes, which anyone who may write
    the object can give it: never a proof (:data:`SHAPES`)."""

    HMAC = "the operator's HMAC proof"
    COMMITTED_UID = "a uid the operator committed to status"
    COMMITTED_DIGEST = "a content digest the operator committed to status"
    API_SERVER = "a fact only the API server writes (admission's record, immutable metadata)"
    NODE = "a fact only the node writes (a pod's status, its termination message)"
    RBAC = "no namespace user may write it"
    EDITORS = "an editor's to write: read as written, nothing rests on who wrote it"
    NOT_USED = "not used"
    NAME = "its name"
    LABELS = "its labels or annotations"
    OWNER_REFERENCE = "its owner references"
    IMMUTABLE = "its immutability"
    SPEC = "its spec"


SHAPES = frozenset({Origin.NAME, Origin.LABELS, Origin.OWNER_REFERENCE, Origin.IMMUTABLE,
                    Origin.SPEC})  # fmt: skip
"""What a namespace user can write, first and exactly as the legitimate writer would: no
entry's :attr:`Entry.proven` may name one."""


class Attack(StrEnum):
    """The two kinds of attack made on every entry."""

    CHANGE = "change"
    """What is there is changed (or deleted, or made under a name before its writer)."""
    MIMIC = "mimic"
    """The legitimate writer's exact object or value, written before that writer where the
    phase allows it, else again after it."""


class Outcome(StrEnum):
    """What an attacker's change ends in."""

    UNAFFECTED = "unaffected"
    """What runs and what is committed stay as they were."""
    APPLIES = "applies"
    """The change takes effect as written: it is an editor's to make, and what it changes is
    still approved, checked against the creator's rights, and never hands out a secret."""
    REGATED = "re-gated"
    """The step waits for an approval of its new argsHash; nothing runs before it."""
    FAILED_CLOSED = "failed closed"
    """The step, or the run, ends with the reason named; the change is not used."""
    KNOWN_GAP = "known gap"
    """What the entry's gap (docs/design.md, "Not enforced yet") says happens; never an
    unapproved command, a forged input or a wrong result."""
    REFUSED_RBAC = "refused by RBAC"
    REFUSED_API = "refused by the API server"
    """Refused by the API server: the admission policies, immutability, validation, or a name
    already taken."""
    NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Expect:
    """The outcome of a change in one phase: its class, the reason a failure names (or what a
    refusal says), and why, for not applicable."""

    outcome: Outcome
    reason: str = ""
    alternative: Outcome | None = None
    """A race decides between ``outcome`` and this one (a change made as the step launches)."""

    @property
    def reasons(self) -> tuple[str, ...]:
        """The reasons a failure may name: the words before the first colon, "A or B"."""
        head = self.reason.split(":", 1)[0] if ":" in self.reason else ""
        found = tuple(r.strip() for r in head.split(" or "))
        return found if all(r.isalnum() and r[:1].isupper() for r in found) else ()


@dataclass(frozen=True)
class Entry:
    """One input. ``fields`` are the AgentRun CRD field paths it covers (``**``: the subtree
    under a path, the path included; ``[]``: every item of an array); ``resource`` is the
    (apiGroup, resource) it lives in; ``outcomes`` gives, per phase, what a change by an actor
    allowed to write it does (an actor who may not is refused by RBAC); ``gap`` names the
    bullet of docs/design.md's "Not enforced yet" a known gap is listed under."""

    id: str
    object: str
    path: str
    decides: str
    resource: tuple[str, str]
    writers: tuple[Writer, ...]
    frozen: Frozen
    checks: tuple[Check, ...]
    outcomes: Mapping[Phase, Expect]
    proven: tuple[Origin, ...]
    """The routes by which what the operator or a step finds here is proven to be the
    operator's own or a step's own (or why it needs no proof): never a shape."""
    fields: tuple[str, ...] = ()
    agent: bool = False
    """An input of agent runs (its attack cases use an agent run)."""
    gap: str = ""
    mimic_is: str = "the same write as the legitimate writer's"
    """What the mimic writes (see :class:`Attack`)."""
    mimic: Mapping[Phase, Expect] | None = None
    """Per phase, what the mimic ends in; None: as the change does (:attr:`outcomes`)."""

    def outcomes_of(self, kind: Attack) -> Mapping[Phase, Expect]:
        if kind is Attack.MIMIC and self.mimic is not None:
            return self.mimic
        return self.outcomes

    def expect(self, phase: Phase, actor: Actor, kind: Attack = Attack.CHANGE) -> Expect:
        """What an attack of ``kind`` on this input by ``actor`` in ``phase`` ends in."""
        found = self.outcomes_of(kind)[phase]
        if found.outcome is Outcome.NOT_APPLICABLE:
            return found
        if self.resource not in WRITES[actor]:
            return Expect(Outcome.REFUSED_RBAC, f"{actor} may not write {plural(self.resource)}")
        return found


def plural(resource: tuple[str, str]) -> str:
    group, plural = resource
    return f"{plural}.{group}" if group else plural


RUNS = ("agentrun.dev", "agentruns")
RUN_STATUS = ("agentrun.dev", "agentruns/status")
JOBS = ("batch", "jobs")
PODS = ("", "pods")
POD_STATUS = ("", "pods/status")
CONFIGMAPS = ("", "configmaps")
SECRETS = ("", "secrets")
EVENTS = ("", "events")
SIGNING_KEY = ("", "secrets (operator's namespace)")
NEW_RUNS = ("agentrun.dev", "agentruns (a new one)")
"""A run made anew, which everyone in the trust model may create (a run-only user too)."""
SHARD_LEASES = ("coordination.k8s.io", "leases (operator's namespace)")
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")
POD_DOORS = ("", "pods/exec, pods/attach, pods/portforward")
"""The doors into a running pod that the built-in ``edit`` role opens (not
``pods/ephemeralcontainers``, which it does not grant)."""

WRITES: Mapping[Actor, frozenset[tuple[str, str]]] = {
    # The built-in edit ClusterRole bound in the namespace, agentrun-edit aggregated into it.
    Actor.EDIT: frozenset({RUNS, NEW_RUNS, JOBS, PODS, POD_DOORS, CONFIGMAPS, SECRETS, EVENTS}),
    # manifests/user-roles.yaml: AgentRuns, not their status.
    Actor.AGENTRUN_EDIT: frozenset({RUNS, NEW_RUNS}),
    # create, get, list and watch of AgentRuns: no change of anything that exists.
    Actor.RUNS_ONLY: frozenset({NEW_RUNS}),
}
"""What each actor may change in the run's namespace (its RBAC)."""

ALL = tuple(Phase)
GAP_PROOF = "A proof binds a Job's name, not its uid"
GAP_DRY_RUN = "A Job the operator did not create in this process"
GAP_JOB_PODS = "Without the `agentrun-job-pods` policy"
GAP_POD_GATE = "Only the operator should remove a step pod's `agentrun.dev/start` gate"
GAP_FIRST_PASS = "A change of `spec.agent.model` or `spec.agent.tools` between"
GAP_RIGHTS = "Rights are checked at launch"
GAP_REFERENCED = "The content of a ConfigMap or Secret a step's `env` references"
GAP_TRANSCRIPT = "An agent run's transcript records"
GAP_POD_DOORS = "Without the `agentrun-pod-doors` policy"


def every(expect: Expect) -> dict[Phase, Expect]:
    return dict.fromkeys(ALL, expect)


def by_phase(default: Expect, **by_phase: Expect) -> dict[Phase, Expect]:
    found = every(default)
    for name, expect in by_phase.items():
        found[Phase[name.upper()]] = expect
    return found


NO_JOB = Expect(Outcome.NOT_APPLICABLE, "no Job of the attempt exists before its launch")
NO_POD = Expect(Outcome.NOT_APPLICABLE, "no pod of the attempt exists before its launch")
STATUS = Expect(Outcome.REFUSED_RBAC, "only the operator writes agentruns/status")
TAKEN = Expect(Outcome.REFUSED_API, "AlreadyExists: the operator's Job holds the name")
REGATED = Expect(
    Outcome.REGATED,
    "argsHash changed: the approval of the old one does not count (a step needing no approval "
    "runs what an editor writes, with none of the creator's rights: see step-references)",
)
UNAFFECTED = Expect(Outcome.UNAFFECTED)
STARTED = Expect(
    Outcome.UNAFFECTED,
    "the attempt launched is the approved one: it runs to its end and is committed, and the "
    "change never runs (a finished step never runs again; an operator restarted meanwhile, "
    "which did not create the Job, stops it instead and the step waits for a new approval)",
    alternative=Outcome.REGATED,
)
APPLIES = Expect(Outcome.APPLIES)
SAME = Expect(Outcome.UNAFFECTED, "the same value as written: nothing changes")
FIXED = "cannot change after creation"
