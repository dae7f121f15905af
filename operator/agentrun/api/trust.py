"""The trust table: every input that decides what a step runs, where, as whom, with what input,
or what is committed as its result; who can write it, from when it is frozen, how the operator
verifies it where it uses it, and what an attacker's change does in each phase of a step.

One list (:data:`TABLE`) is the source of three things: the "Trust table" section of
docs/design.md (``python -m agentrun.api.trust --markdown``, ``make trust-table``), the unit
tests that every field of the AgentRun CRD and every resource the operator may read has an
entry (tests/unit/test_trust.py), and the attack cases of tests/e2e/test_trust_attacks.py, one
per (entry, phase, actor, kind of attack): :func:`cases`.

The actors are the namespace users of the trust model: one holding the built-in ``edit``
ClusterRole in the run's namespace (into which ``agentrun-edit`` aggregates), one holding only
``agentrun-edit``, and one who may only create and read AgentRuns. What each may write is
:data:`WRITES` (their RBAC); an entry none of them may write is refused for all of them.

Proof of origin. An object found in a namespace proves nothing by its name, its labels or
annotations, its owner references, its immutability or its spec: every namespace user of the
trust model can write all of them, and can write them first, in the exact shape the operator or
a step would (the *mimic*). What the operator or a step finds counts as "the operator's own" or
"a step's own" only through a proof no namespace user can make (the operator's HMAC, keyed by a
Secret in the operator's own namespace and bound to the object's name, the attempt and the
content's digest), through a uid or a content digest the operator itself committed to status
after it made the object, or through a fact only the API server or the node writes (a pod's
termination message, written by the kubelet; the identity the API server's admission recorded
at create). Each entry says which of those routes it rests on (:attr:`Entry.proven`,
:class:`Origin`); a shape (:data:`SHAPES`) is never one. And each entry is attacked twice
(:class:`Attack`): by a *change* of what is there, and by the *mimic*: the exact object or
value the legitimate writer would write, computed from the run's status, the approval request
and the operator's own naming and manifest functions, written before that writer where the
phase allows it, and after it (the same write, or a delete-and-recreate of the exact object)
otherwise.

Pure data: no kopf, no kubernetes client.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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
            return Expect(Outcome.REFUSED_RBAC, f"{actor} may not write {_plural(self.resource)}")
        return found


def _plural(resource: tuple[str, str]) -> str:
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


def _every(expect: Expect) -> dict[Phase, Expect]:
    return dict.fromkeys(ALL, expect)


def _phases(default: Expect, **by_phase: Expect) -> dict[Phase, Expect]:
    found = _every(default)
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

TABLE: tuple[Entry, ...] = (
    # -- the run: its type and metadata -----------------------------------------------------------
    Entry(
        id="run-type",
        object="AgentRun",
        path="apiVersion, kind",
        decides="which object is a run",
        resource=RUNS,
        writers=(Writer.API_SERVER,),
        frozen=Frozen.CREATION,
        checks=(Check.NOT_USED,),
        proven=(Origin.API_SERVER,),
        mimic_is="apiVersion and kind as the API server keeps them",
        outcomes=_every(
            Expect(Outcome.UNAFFECTED, "the API server keeps an object's apiVersion and kind")
        ),
        fields=("apiVersion", "kind"),
    ),
    Entry(
        id="run-metadata",
        object="AgentRun",
        path="metadata (name, namespace, uid, generation, resourceVersion)",
        decides="which run a step belongs to: Job names, owners and proofs bind the run's uid",
        resource=RUNS,
        writers=(Writer.API_SERVER,),
        frozen=Frozen.CREATION,
        checks=(Check.OWNER_UID, Check.PROOF),
        proven=(Origin.API_SERVER,),
        mimic_is="name, namespace and uid as the API server wrote them",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "name, namespace and uid cannot change")),
        fields=("metadata.**",),
    ),
    Entry(
        id="run-identity",
        object="AgentRun",
        path="metadata.annotations[agentrun.dev/created-by, created-by-groups, last-modified-by]",
        decides="whose rights a step's references are checked against",
        resource=RUNS,
        writers=(Writer.API_SERVER,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER,),
        mimic_is="the annotations as the admission recorded them (the creator's own name)",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "agentrun.dev/created-by cannot be changed")),
    ),
    Entry(
        id="run-labels",
        object="AgentRun",
        path="metadata.labels, metadata.annotations (others, kopf's bookkeeping)",
        decides="nothing: the operator derives every pass from spec and status",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR, Writer.OPERATOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the labels and annotations as they are",
        outcomes=_every(UNAFFECTED),
    ),
    Entry(
        id="run-shard-label",
        object="AgentRun",
        path="metadata.labels[agentrun.dev/shard]",
        decides=(
            "nothing a pass decides: with shards (AGENTRUN_SHARDS), which replica's watch "
            "delivers the run's events; a run labelled with another shard is labelled again by "
            "the replica that finds it, one labelled with none is watched by every replica"
        ),
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR, Writer.OPERATOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the shard label the operator would write, written before it",
        outcomes=_every(UNAFFECTED),
    ),
    Entry(
        id="run-owners",
        object="AgentRun",
        path="metadata.ownerReferences, metadata.finalizers",
        decides="nothing a step does: when the run's objects are garbage-collected",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR, Writer.OPERATOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the owner references and finalizers as they are",
        outcomes=_every(UNAFFECTED),
    ),
    # -- the run's spec ---------------------------------------------------------------------------
    Entry(
        id="run-goal",
        object="AgentRun",
        path="spec.goal, spec.actor",
        decides="what an agent run's first context says (plan steps never receive it)",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.DIGEST,),
        proven=(Origin.EDITORS, Origin.COMMITTED_DIGEST),
        mimic_is="the creator's goal and actor, as written",
        mimic=_every(SAME),
        outcomes=_phases(
            Expect(Outcome.UNAFFECTED, "taken into the first context, chained by digest"),
            pending=Expect(
                Outcome.APPLIES,
                "an agent run's first context is assembled after the plan's steps, from the "
                "spec then; plan steps never receive it",
            ),
        ),
        fields=("spec", "spec.goal", "spec.actor"),
    ),
    Entry(
        id="step-container",
        object="AgentRun",
        path="spec.plan.steps[].container, spec.plan.steps[].inputs[]",
        decides="what a plan step runs and receives",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.LAUNCH,
        checks=(Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.EDITORS, Origin.API_SERVER),
        mimic_is="the creator's plan, as written",
        mimic=_every(SAME),
        gap=GAP_RIGHTS,
        outcomes=_phases(
            REGATED,
            launching=STARTED,
            running=STARTED,
            finished=Expect(Outcome.UNAFFECTED, "a finished step never runs again"),
        ),
        fields=(
            "spec.plan",
            "spec.plan.steps",
            "spec.plan.steps[]",
            "spec.plan.steps[].container.**",
            "spec.plan.steps[].inputs.**",
        ),
    ),
    Entry(
        id="step-references",
        object="AgentRun",
        path=(
            "spec.plan.steps[] added or changed, using a Secret or ConfigMap "
            "(container.env[].valueFrom) or the run's ServiceAccount"
        ),
        decides="with whose rights a step reads a Secret or ConfigMap, or acts as the account",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.ADMISSION, Check.FROZEN_STEPS, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="the creator's step that reads the Secret and the ConfigMap, as written",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(
                Outcome.REFUSED_API,
                "only the run's creator may add or change a step that uses a Secret, a "
                "ConfigMap or the run's ServiceAccount (without the policy: the step fails, "
                "Forbidden)",
            )
        ),
        fields=("spec.plan.steps[].container.env[].valueFrom.**",),
        gap=GAP_RIGHTS,
    ),
    Entry(
        id="step-gate",
        object="AgentRun",
        path="spec.plan.steps[].approval, spec.plan.steps[].risk",
        decides="whether a step waits for a person",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION,),
        proven=(Origin.API_SERVER,),
        mimic_is="the step's approval and risk, as written",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "approval of a plan step cannot be lowered")),
        fields=("spec.plan.steps[].approval", "spec.plan.steps[].risk"),
    ),
    Entry(
        id="step-shape",
        object="AgentRun",
        path="spec.plan.steps[].name, dependsOn, description, onRejection",
        decides="which steps exist and in which order (removing a step stops it)",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="the plan's steps, as written",
        mimic=_every(SAME),
        outcomes=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "RemovedFromPlan: a step removed from the plan is cancelled, its Job stopped",
            ),
            finished=Expect(Outcome.UNAFFECTED, "a finished step is forgotten, never rerun"),
        ),
        gap=GAP_RIGHTS,
        fields=(
            "spec.plan.steps[].name",
            "spec.plan.steps[].dependsOn.**",
            "spec.plan.steps[].description",
            "spec.plan.steps[].onRejection",
        ),
    ),
    Entry(
        id="step-limits",
        object="AgentRun",
        path="spec.plan.steps[].retry, spec.plan.steps[].timeoutSeconds",
        decides="how often and how long the same approved step may run",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="the step's retry and timeout, as written",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(Outcome.APPLIES, "attempts keep the approved argsHash and idempotency key")
        ),
        fields=("spec.plan.steps[].retry.**", "spec.plan.steps[].timeoutSeconds"),
    ),
    Entry(
        id="step-template",
        object="AgentRun",
        path="spec.stepTemplate",
        decides="as whom and with which security settings every step runs",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER,),
        mimic_is="spec.stepTemplate as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.stepTemplate " + FIXED)),
        fields=("spec.stepTemplate.**",),
    ),
    Entry(
        id="run-policy",
        object="AgentRun",
        path="spec.policy",
        decides="which steps need approval, by whom, which images may run",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION,),
        proven=(Origin.API_SERVER,),
        mimic_is="spec.policy as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.policy " + FIXED)),
        fields=("spec.policy.**",),
    ),
    Entry(
        id="run-approvals",
        object="AgentRun",
        path="spec.approvals[]",
        decides="which gated step runs, bound to its argsHash",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.ADMISSION, Check.ARGS_HASH),
        proven=(Origin.API_SERVER,),
        mimic_is=(
            "the approval the approver would write: the waiting step, its argsHash from status, "
            "signed with the approver's name"
        ),
        outcomes=_every(
            Expect(
                Outcome.REFUSED_API,
                "a decision outside spec.policy.approverGroups, signed by another user, or an "
                "edit of an earlier one, is refused",
            )
        ),
        fields=("spec.approvals.**",),
    ),
    Entry(
        id="run-carried",
        object="AgentRun",
        path="spec.carriedResults[]",
        decides="results a fork takes instead of running a step again",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.ARGS_HASH, Check.DIGEST),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.carriedResults as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.carriedResults " + FIXED)),
        fields=("spec.carriedResults.**",),
    ),
    Entry(
        id="run-controls",
        object="AgentRun",
        path="spec.suspend, spec.cancel, spec.budget, spec.retention",
        decides="whether more steps launch, and how long the run's objects stay",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="suspend, cancel, budget and retention as written",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(
                Outcome.APPLIES,
                "it only stops or allows launches of approved steps (cancel: Cancelled)",
            )
        ),
        fields=("spec.suspend", "spec.cancel", "spec.budget.**", "spec.retention.**"),
    ),
    # -- the run's spec.agent ---------------------------------------------------------------------
    Entry(
        id="agent-model",
        object="AgentRun",
        path="spec.agent.model (baseURL, name, apiKeySecretRef, settings), spec.agent presence",
        decides="where a model turn sends the API key, and which model it asks",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.model as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.agent.model." + "baseURL: " + FIXED)),
        fields=("spec.agent", "spec.agent.model.**"),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-tools",
        object="AgentRun",
        path="spec.agent.tools[]",
        decides="which tools a model turn is offered and what a call runs",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.ARGS_HASH),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.tools as the creator wrote them",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.agent.tools: " + FIXED)),
        fields=("spec.agent.tools.**",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-tool-choice",
        object="AgentRun",
        path="spec.agent.toolChoice",
        decides="whether a model turn may, must or must not call a tool, or which one",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.toolChoice as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.agent.toolChoice: " + FIXED)),
        fields=("spec.agent.toolChoice",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="agent-mcp-servers",
        object="AgentRun",
        path="spec.agent.mcpServers[] (url, header Secrets, allowed tools, risk, approval)",
        decides="where discovery and calls connect, which header Secrets they send, which tools "
        "a model turn is offered and which calls wait for approval",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.ADMISSION, Check.FROZEN_STATUS, Check.ARGS_HASH, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.mcpServers as the creator wrote them",
        mimic=_every(SAME),
        outcomes=_every(Expect(Outcome.REFUSED_API, "spec.agent.mcpServers: " + FIXED)),
        fields=("spec.agent.mcpServers.**",),
        agent=True,
        gap=GAP_FIRST_PASS,
    ),
    Entry(
        id="child-run",
        object="AgentRun (a sub-agent's child)",
        path="a new run naming the run as its controller (ownerReferences, label "
        "agentrun.dev/parent-uid, annotations agentrun.dev/call and agentrun.dev/proof)",
        decides="a sub-agent call's result, the tokens it counts, whose rights its steps use",
        resource=NEW_RUNS,
        writers=(Writer.OPERATOR, Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.PROOF, Check.OWNER_UID, Check.DIGEST, Check.CREATOR_RIGHTS),
        proven=(Origin.HMAC, Origin.COMMITTED_UID, Origin.API_SERVER),
        outcomes=_every(
            Expect(
                Outcome.UNAFFECTED,
                "a run under another name is no call's child: a call's child is only the run "
                "under the name the call's key gives, carrying the operator's proof; its "
                "outcome and tokens are read from the uid committed at adoption, and its steps "
                "act for the parent's creator only through that name",
            )
        ),
        mimic_is=(
            "the call's exact child: under the name committed with the call, the spec the call "
            "makes and the run as controller (its proof it cannot make), before the operator "
            "creates it"
        ),
        mimic=_phases(
            Expect(Outcome.REFUSED_API, "AlreadyExists: the call's child holds the name"),
            pending=Expect(
                Outcome.NOT_APPLICABLE, "the call, and so its child's name, comes with a turn"
            ),
            waiting=Expect(
                Outcome.FAILED_CLOSED,
                "ChildNameTaken: made while the gated call waits (its child's name is "
                "committed), it carries no proof of the operator's: the call fails once "
                "approved, nothing of it runs, the forged child's answer is never the result",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "ChildNameTaken: made before the operator's create, it is not adopted; after "
                "it, the name is taken",
                alternative=Outcome.REFUSED_API,
            ),
        ),
        agent=True,
    ),
    Entry(
        id="agent-instructions",
        object="AgentRun",
        path="spec.agent.instructions",
        decides="the system message of the first context",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.DIGEST,),
        proven=(Origin.EDITORS, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.instructions as the creator wrote them",
        mimic=_every(SAME),
        outcomes=_phases(
            Expect(Outcome.UNAFFECTED, "taken into the first context, chained by digest"),
            pending=Expect(
                Outcome.APPLIES,
                "the first context is assembled after the plan's steps, from the spec then",
            ),
        ),
        fields=("spec.agent.instructions",),
        agent=True,
    ),
    Entry(
        id="agent-limits",
        object="AgentRun",
        path="spec.agent.maxTurns, maxToolCallsPerTurn, contextBytes",
        decides="how many turns and calls, and how much context, the model gets",
        resource=RUNS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.LIVE,),
        proven=(Origin.EDITORS,),
        mimic_is="the agent's limits as written",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(Outcome.APPLIES, "turns go to the frozen endpoint; calls are still gated")
        ),
        fields=(
            "spec.agent.maxTurns",
            "spec.agent.maxToolCallsPerTurn",
            "spec.agent.contextBytes",
        ),
        agent=True,
    ),
    Entry(
        id="agent-resume",
        object="AgentRun",
        path="spec.agent.resumeFrom",
        decides="which conversation a fork continues",
        resource=RUNS,
        writers=(Writer.CREATOR,),
        frozen=Frozen.CREATION,
        checks=(Check.CRD_RULE, Check.OWNER_UID, Check.DIGEST, Check.CREATOR_RIGHTS),
        proven=(Origin.API_SERVER, Origin.COMMITTED_UID, Origin.COMMITTED_DIGEST),
        mimic_is="spec.agent.resumeFrom as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(
                Outcome.REFUSED_API,
                "spec.agent.resumeFrom can only be set when the run is created (else the "
                "conversation it names is verified, or the run fails ResumeRefused)",
            )
        ),
        fields=("spec.agent.resumeFrom.**",),
        agent=True,
    ),
    # -- the run's status -------------------------------------------------------------------------
    Entry(
        id="status-steps",
        object="AgentRun",
        path="status.steps[] (phase, attempt, jobName, argsHash, result, resultRef, resultDigest)",
        decides="what is committed as a step's result, and which Job is an attempt's",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.COMMIT,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=_every(STATUS),
        fields=("status", "status.steps.**", "status.usage.**"),
    ),
    Entry(
        id="status-agent",
        object="AgentRun",
        path="status.agent (frozen model, tools and MCP servers digests, pinned MCP tools, "
        "context digest, turn image, calls)",
        decides="what a model turn calls and reads, and which calls run",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.FIRST_PASS,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=_every(STATUS),
        fields=("status.agent.**",),
        agent=True,
    ),
    Entry(
        id="status-audit",
        object="AgentRun",
        path="status.audit, status.history[], status.historySeq",
        decides="the anchor of the audit chain",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.COMMIT,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=_every(STATUS),
        fields=("status.audit.**", "status.history.**", "status.historySeq"),
    ),
    Entry(
        id="status-run",
        object="AgentRun",
        path="status (phase, conditions, message, progress, times, observedGeneration)",
        decides="what the run reports",
        resource=RUN_STATUS,
        writers=(Writer.OPERATOR,),
        frozen=Frozen.COMMIT,
        checks=(Check.STATUS_ONLY,),
        proven=(Origin.RBAC,),
        mimic_is="the status as the operator wrote it",
        outcomes=_every(STATUS),
        fields=(
            "status.observedGeneration",
            "status.phase",
            "status.conditions.**",
            "status.message",
            "status.progress",
            "status.currentStep",
            "status.startedAt",
            "status.completedAt",
        ),
    ),
    # -- step Jobs --------------------------------------------------------------------------------
    Entry(
        id="job-create",
        object="Job",
        path="a Job under an attempt's name, made by someone else (before or after the launch)",
        decides="whose Job counts as the attempt",
        resource=JOBS,
        writers=(Writer.EDITOR,),
        frozen=Frozen.CREATE,
        checks=(Check.PROOF, Check.DRY_RUN),
        proven=(Origin.HMAC,),
        outcomes=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: the attempt fails, its retry runs under a new name",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: made before the operator's create, the attempt fails; after it, "
                "the name is taken",
                alternative=Outcome.REFUSED_API,
            ),
            running=TAKEN,
            finished=TAKEN,
        ),
        mimic_is=(
            "the operator's exact Job for the approved attempt (the core's own decision, "
            "jobs.build_job), made before the operator creates it: all but the proof"
        ),
        mimic=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: it carries no proof of the operator's; the attempt fails, its "
                "retry runs under a new name",
            ),
            pending=Expect(
                Outcome.NOT_APPLICABLE,
                "the exact Job binds the input the earlier step has not committed yet",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "JobNameTaken: made before the operator's create, the attempt fails; after it, "
                "the name is taken",
                alternative=Outcome.REFUSED_API,
            ),
            running=TAKEN,
            finished=TAKEN,
        ),
        gap=GAP_PROOF,
    ),
    Entry(
        id="job-proof",
        object="Job",
        path="metadata.annotations[agentrun.dev/proof]",
        decides="whether a Job found under an attempt's name is the operator's",
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.JOB_UID, Check.PROOF),
        proven=(Origin.HMAC,),
        mimic_is="the operator's own proof, written again",
        outcomes=_phases(UNAFFECTED, pending=NO_JOB, waiting=NO_JOB, launching=NO_JOB),
        gap=GAP_PROOF,
    ),
    Entry(
        id="job-labels",
        object="Job",
        path=(
            "metadata.labels[agentrun.dev/run-uid, step, attempt, shard], metadata.ownerReferences"
        ),
        decides=(
            "nothing: a Job this process created is its attempt's by uid (the shard label only "
            "which replica's watch delivers it; read directly when a watch loses it)"
        ),
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.JOB_UID,),
        proven=(Origin.HMAC,),
        mimic_is="the operator's own labels and owner references, written again",
        outcomes=_phases(UNAFFECTED, pending=NO_JOB, waiting=NO_JOB, launching=NO_JOB),
        gap=GAP_PROOF,
    ),
    Entry(
        id="job-spec",
        object="Job",
        path="spec (parallelism, activeDeadlineSeconds, suspend; the template is immutable)",
        decides="how many pods run the step, and for how long",
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.JOB_UID, Check.DRY_RUN, Check.POD_TEMPLATE, Check.ONE_POD),
        proven=(Origin.HMAC,),
        mimic_is="the operator's own parallelism, written again",
        outcomes=_phases(
            Expect(Outcome.UNAFFECTED, "a finished Job starts no pod"),
            running=Expect(
                Outcome.UNAFFECTED,
                "parallelism raised: the Job controller's second pod of the attempt is held by "
                "the operator's scheduling gate and never starts; the approved command runs once",
            ),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=NO_JOB,
        ),
    ),
    Entry(
        id="job-finalizer",
        object="Job",
        path="metadata.finalizers[agentrun.dev/outcome], deletion",
        decides="whether an attempt's outcome is seen before its Job goes",
        resource=JOBS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.JOB_UID,),
        proven=(Origin.HMAC,),
        outcomes=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "JobLost: a deleted attempt counts as lost, its retry is a new attempt",
            ),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=NO_JOB,
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
        mimic_is=(
            "the attempt's Job deleted (its outcome finalizer removed) and made again exactly, "
            "its proof copied"
        ),
        mimic=_phases(
            Expect(
                Outcome.KNOWN_GAP,
                "a proof binds the name, not the uid: while the operator that created or "
                "verified the attempt's Job runs, it knows that Job's uid and the copy holds "
                "the name in vain (JobNameTaken), or the deletion is seen first (JobLost); an "
                "operator restarted in between takes the copy as the same attempt, which may "
                "run the approved command again with the same idempotency key",
            ),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=NO_JOB,
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
        gap=GAP_PROOF,
    ),
    # -- step pods --------------------------------------------------------------------------------
    Entry(
        id="pod-create",
        object="Pod",
        path="a pod carrying a step Job's selector label (batch.kubernetes.io/controller-uid)",
        decides="which pod's end is the attempt's outcome",
        resource=PODS,
        writers=(Writer.JOB_CONTROLLER, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.ADMISSION, Check.POD_TEMPLATE),
        proven=(Origin.API_SERVER,),
        mimic_is=(
            "the Job controller's pod: the Job's template, its selector labels and the Job as "
            "controller"
        ),
        outcomes=_phases(
            Expect(
                Outcome.REFUSED_API,
                "only the Job controller may create a pod with a Job's selector label",
            ),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
        ),
        gap=GAP_JOB_PODS,
    ),
    Entry(
        id="pod-spec",
        object="Pod",
        path="Pod spec.containers (image), metadata.labels, deletion",
        decides="what the step's pod runs",
        resource=PODS,
        writers=(Writer.JOB_CONTROLLER, Writer.EDITOR),
        frozen=Frozen.CREATE,
        checks=(Check.POD_TEMPLATE,),
        proven=(Origin.API_SERVER,),
        mimic_is="the pod's labels as the Job controller wrote them",
        mimic=_phases(SAME, pending=NO_POD, waiting=NO_POD, launching=NO_POD),
        outcomes=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "RetryScheduled: the attempt whose pod is gone fails, the step's retry policy "
                "applies (a pod that does not run its Job's template never counts); a command "
                "that ends within its pod's grace period was the approved one, run once, and "
                "its result counts",
                alternative=Outcome.UNAFFECTED,
            ),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
        gap=GAP_JOB_PODS,
    ),
    Entry(
        id="pod-gate",
        object="Pod",
        path="Pod spec.schedulingGates[agentrun.dev/start]",
        decides="which pod of an attempt runs its command",
        resource=PODS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.ONE_POD,),
        proven=(Origin.API_SERVER,),
        mimic_is="the operator's own write: the gate removed from the attempt's pods (the change)",
        outcomes=_phases(
            Expect(Outcome.NOT_APPLICABLE, "a finished Job makes no second pod"),
            running=Expect(
                Outcome.UNAFFECTED,
                "the attempt's one pod was let start already, and an editor cannot make the Job "
                "start another (completions 1; the job-pods policy refuses pods with its label): "
                "a held second pod exists only when the Job controller made one",
            ),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
            finished=Expect(Outcome.NOT_APPLICABLE, "a finished Job makes no second pod"),
        ),
        gap=GAP_POD_GATE,
    ),
    Entry(
        id="pod-status",
        object="Pod",
        path="status (container states, termination message: the step's envelope)",
        decides="a step's outcome and result",
        resource=POD_STATUS,
        writers=(Writer.NODE, Writer.STEP_POD),
        frozen=Frozen.COMMIT,
        checks=(Check.RBAC, Check.POD_TEMPLATE),
        proven=(Origin.NODE, Origin.RBAC),
        mimic_is=(
            "the kubelet's status: the step's container terminated, exit 0, its genuine envelope"
        ),
        outcomes=_phases(
            Expect(Outcome.REFUSED_RBAC, "namespace users may not write pods/status"),
            pending=NO_POD,
            waiting=NO_POD,
            launching=NO_POD,
        ),
    ),
    Entry(
        id="pod-refusals",
        object="Event",
        path="the Job controller's FailedCreate Events about a step Job",
        decides="whether an attempt failed because its pod was refused",
        resource=EVENTS,
        writers=(Writer.JOB_CONTROLLER, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.JOB_UID,),
        proven=(Origin.EDITORS,),
        mimic_is="the Job controller's own FailedCreate Event about the Job's uid (the change)",
        outcomes=_phases(
            Expect(Outcome.UNAFFECTED, "a refusal counts only while the Job has no pod"),
            pending=NO_JOB,
            waiting=NO_JOB,
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "PodRefused: an Event about the Job's uid while it has no pod fails the attempt "
                "and deletes its Job (as a deletion would): at once, or, for a refusal that may "
                "pass (a ServiceAccount not made yet, an exceeded quota, an overloaded API "
                "server), once AGENTRUN_REFUSAL_GRACE_SECONDS after its intent if the Job "
                "still has no pod; the step's retry policy applies",
                alternative=Outcome.UNAFFECTED,
            ),
            finished=Expect(Outcome.UNAFFECTED, "the outcome is committed"),
        ),
    ),
    Entry(
        id="pod-doors",
        object="Pod",
        path=(
            "subresources exec, attach, portforward, proxy, ephemeralcontainers of step and "
            "executor pods"
        ),
        decides="what runs inside a step's or an executor's pod besides its command, and so the "
        "result it reports (its termination message, the executor's answer)",
        resource=POD_DOORS,
        writers=(Writer.EDITOR, Writer.CLUSTER_ADMIN),
        frozen=Frozen.NEVER,
        checks=(Check.ADMISSION,),
        proven=(Origin.API_SERVER,),
        outcomes=_phases(
            NO_POD,
            running=Expect(
                Outcome.REFUSED_API,
                "the agentrun-pod-doors admission policy refuses exec, attach, port-forward, "
                "proxy and ephemeral containers into step and executor pods for all but "
                "cluster admins (without the policy, an exec can rewrite the result before the "
                "pod ends)",
            ),
            finished=Expect(Outcome.NOT_APPLICABLE, "the step's pod has ended: nothing runs in it"),
        ),
        mimic_is="the same doors: the step's own process is the only writer of its result",
        gap=GAP_POD_DOORS,
    ),
    # -- ConfigMaps and Secrets -------------------------------------------------------------------
    Entry(
        id="result-object",
        object="ConfigMap (result)",
        path="data.result of a step's result object",
        decides="a large result, and the input of the steps that read it",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.STEP_POD, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.OWNER_UID, Check.DIGEST, Check.PROOF, Check.ARGS_HASH),
        proven=(Origin.COMMITTED_DIGEST, Origin.HMAC, Origin.NODE),
        outcomes=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: a result object made or changed by someone else is not used; "
                "the step reading it fails before its Job exists",
            ),
            launching=Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: changed before the reading step's Job is built, it is not "
                "used; after, the Job holds the verified bytes",
                alternative=Outcome.UNAFFECTED,
            ),
            running=Expect(Outcome.UNAFFECTED, "the reading step's Job holds the verified bytes"),
            finished=Expect(Outcome.UNAFFECTED, "the reading step's Job held the verified bytes"),
        ),
        mimic_is=(
            "the step runner's exact result object for the attempt of a step whose result is "
            "over 3 KiB (its name, labels, `agentrun.dev/complete`, immutable, the run as "
            "controller), its content forged, made before the runner stores it"
        ),
        mimic=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: the runner never takes an object found under the attempt's "
                "name as an earlier attempt's (no replay): the step's command runs, and its "
                "store meets a name it did not take, so the attempt fails and nothing is "
                "referenced",
            ),
            finished=Expect(
                Outcome.UNAFFECTED,
                "the result and its digest are committed; an object made again under the name "
                "is never read as it",
            ),
        ),
    ),
    Entry(
        id="executor-result",
        object="ConfigMap (executor result)",
        path="data.result of a model turn's or an MCP call's result object, written by the "
        "run's executor under the attempt's result object name (an output over 3 KiB)",
        decides="a model turn's output (its message and tool calls) or an MCP call's result",
        resource=CONFIGMAPS,
        writers=(Writer.EXECUTOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.DIGEST, Check.OWNER_UID),
        proven=(Origin.COMMITTED_DIGEST, Origin.NODE),
        outcomes=_phases(
            Expect(
                Outcome.UNAFFECTED,
                "turn 1's outcome is committed (by its digest when by reference): an object "
                "made or changed under its name after is never read as it",
            ),
            pending=Expect(
                Outcome.FAILED_CLOSED,
                "ResultTampered: made before the executor stores the turn's output (the mimic), "
                "or changed after it stored it and before the operator read it: the executor's "
                "answer carries the digest of what it stored, the executor never takes an "
                "object it did not create, and the attempt fails; the forged output is never "
                "committed",
            ),
        ),
        mimic_is=(
            "the executor's exact result object for turn 1 (name, labels, `agentrun.dev/"
            "complete`, immutable, the run as controller), its content forged, before the "
            "executor stores it (the change)"
        ),
        agent=True,
    ),
    Entry(
        id="agent-context",
        object="ConfigMap (context)",
        path="data.part-N of an agent run's context document",
        decides="what the next model turn is sent",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.DIGEST,),
        proven=(Origin.COMMITTED_DIGEST,),
        mimic_is="the context document as the operator wrote it, its messages the attacker's",
        outcomes=_phases(
            Expect(
                Outcome.FAILED_CLOSED,
                "the changed context is never sent: the operator that wrote it sends and "
                "continues from its own copy while it keeps it; one that reads it (restarted) "
                "finds it changed, and the next turn's context says the earlier one could not "
                "be read (a model turn checks its own against the digest)",
            ),
            pending=Expect(
                Outcome.NOT_APPLICABLE,
                "a turn's context is made when the turn starts, under a name its content decides",
            ),
            finished=Expect(
                Outcome.UNAFFECTED,
                "read again by forks only, checked against the chain of digests",
            ),
        ),
        agent=True,
    ),
    Entry(
        id="agent-transcript",
        object="ConfigMap (transcript)",
        path="data.turn of an agent run's transcript record",
        decides="nothing the operator does: what `kubectl agentrun transcript` shows",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.NOT_USED,),
        proven=(Origin.NOT_USED,),
        mimic_is="the turn's record under its name, as the operator writes one (the change)",
        outcomes=_every(UNAFFECTED),
        agent=True,
        gap=GAP_TRANSCRIPT,
    ),
    Entry(
        id="audit-record",
        object="ConfigMap (audit)",
        path="data of a run's audit record chunks",
        decides="nothing a step does: the record `history --verify` checks",
        resource=CONFIGMAPS,
        writers=(Writer.OPERATOR, Writer.EDITOR),
        frozen=Frozen.COMMIT,
        checks=(Check.DIGEST,),
        proven=(Origin.COMMITTED_DIGEST,),
        mimic_is=(
            "the chunk as the operator wrote it, written again (before there is one: a chunk "
            "in its shape, made first)"
        ),
        mimic=_every(
            Expect(
                Outcome.UNAFFECTED,
                "the same content: the chain still verifies (one made first is no chunk of the "
                "record: ignored and reported)",
            )
        ),
        outcomes=_every(
            Expect(Outcome.UNAFFECTED, "the run goes on; `history --verify` reports the change")
        ),
    ),
    Entry(
        id="referenced-configmap",
        object="ConfigMap (referenced)",
        path="a ConfigMap a step's env references (configMapKeyRef)",
        decides="what the step's program receives",
        resource=CONFIGMAPS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.CREATOR_RIGHTS,),
        proven=(Origin.EDITORS,),
        mimic_is="the ConfigMap's content as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(Outcome.APPLIES, "the argsHash binds the reference, the pod reads the content")
        ),
        gap=GAP_REFERENCED,
    ),
    Entry(
        id="referenced-secret",
        object="Secret (referenced)",
        path="a Secret a step's env, spec.agent.model.apiKeySecretRef or an MCP server's "
        "header references",
        decides="what the step's program receives, which key a model turn sends",
        resource=SECRETS,
        writers=(Writer.CREATOR, Writer.EDITOR),
        frozen=Frozen.NEVER,
        checks=(Check.CREATOR_RIGHTS, Check.FROZEN_STATUS),
        proven=(Origin.EDITORS,),
        mimic_is="the Secret's content as the creator wrote it",
        mimic=_every(SAME),
        outcomes=_every(
            Expect(
                Outcome.APPLIES,
                "the argsHash binds the reference; the key goes only to the frozen endpoint",
            )
        ),
        gap=GAP_REFERENCED,
    ),
    Entry(
        id="signing-key",
        object="Secret agentrun-job-signing",
        path="data.key, in the operator's namespace",
        decides="which Jobs carry a valid proof",
        resource=SIGNING_KEY,
        writers=(Writer.OPERATOR, Writer.CLUSTER_ADMIN),
        frozen=Frozen.CREATION,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the key as the operator made it",
        outcomes=_every(
            Expect(Outcome.REFUSED_RBAC, "it lives in the operator's namespace, not the run's")
        ),
    ),
    Entry(
        id="shard-leases",
        object="Lease agentrun-shard-N, agentrun-member-ID",
        path="spec.holderIdentity, in the operator's namespace",
        decides="which replica decides a shard's runs (never what a step runs: a run decided "
        "by a stale holder is fenced by its resourceVersion, a Job by its name)",
        resource=SHARD_LEASES,
        writers=(Writer.OPERATOR, Writer.CLUSTER_ADMIN),
        frozen=Frozen.NEVER,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the holder as the operator wrote it",
        outcomes=_every(
            Expect(Outcome.REFUSED_RBAC, "it lives in the operator's namespace, not the run's")
        ),
    ),
    Entry(
        id="crd",
        object="CustomResourceDefinition",
        path="agentruns.agentrun.dev (schema, validation)",
        decides="which runs the API server accepts",
        resource=CRDS,
        writers=(Writer.CLUSTER_ADMIN,),
        frozen=Frozen.NEVER,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the CRD as installed",
        outcomes=_every(Expect(Outcome.REFUSED_RBAC, "cluster-scoped")),
    ),
    Entry(
        id="namespaces",
        object="Namespace",
        path="the watched namespaces (the chart's kopf discovery)",
        decides="which runs the operator serves",
        resource=NAMESPACES,
        writers=(Writer.CLUSTER_ADMIN,),
        frozen=Frozen.NEVER,
        checks=(Check.RBAC,),
        proven=(Origin.RBAC,),
        mimic_is="the namespace as it is",
        outcomes=_every(Expect(Outcome.REFUSED_RBAC, "cluster-scoped")),
    ),
)
"""Every input, in the order docs/design.md's table lists them."""


@dataclass(frozen=True)
class Case:
    """One attack: ``actor`` makes an attack of ``kind`` on ``entry`` while its step is in
    ``phase``."""

    entry: Entry
    phase: Phase
    actor: Actor
    expect: Expect = field(compare=False)
    kind: Attack = Attack.CHANGE

    @property
    def id(self) -> str:
        name = f"{self.entry.id}/{self.phase.name.lower()}/{self.actor}"
        return name if self.kind is Attack.CHANGE else f"{name}/{self.kind}"


def cases(table: Sequence[Entry] = TABLE) -> Iterator[Case]:
    """Every (entry, phase, actor, kind of attack), with what it is declared to end in."""
    for kind in Attack:
        for entry in table:
            for phase in Phase:
                for actor in Actor:
                    yield Case(entry, phase, actor, entry.expect(phase, actor, kind), kind)


def shapes_as_proof(table: Sequence[Entry] = TABLE) -> list[str]:
    """The entries whose proof of origin is missing or names a shape (:data:`SHAPES`)."""
    return [e.id for e in table if not e.proven or SHAPES & set(e.proven)]


def entry(entry_id: str) -> Entry:
    return next(e for e in TABLE if e.id == entry_id)


def covers(pattern: str, path: str) -> bool:
    """Whether a ``fields`` pattern covers a CRD field path (``a.**`` covers ``a`` and below)."""
    if pattern.endswith(".**"):
        root = pattern[: -len(".**")]
        return path == root or path.startswith(root + ".") or path.startswith(root + "[]")
    return fnmatch.fnmatchcase(path, pattern.replace("[]", "[[]]"))


def uncovered(paths: Sequence[str], table: Sequence[Entry] = TABLE) -> list[str]:
    """The field paths no entry covers."""
    return [p for p in paths if not any(covers(f, p) for e in table for f in e.fields)]


# -- the table as docs/design.md shows it -------------------------------------------------------

BEGIN = "<!-- trust-table: generated by `make trust-table`; do not edit -->"
END = "<!-- end of trust-table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _outcomes(e: Entry, kind: Attack = Attack.CHANGE) -> str:
    """Per phase, what an attack of ``kind`` by an actor who may write it does: phases with
    the same outcome are joined."""
    groups: dict[Expect, list[str]] = {}
    for phase in Phase:
        groups.setdefault(e.outcomes_of(kind)[phase], []).append(phase.value)
    parts = []
    for expect, phases in groups.items():
        what = expect.outcome.value + (f" ({expect.reason})" if expect.reason else "")
        parts.append(("always" if len(phases) == len(Phase) else ", ".join(phases)) + ": " + what)
    return "; ".join(parts)


def _mimic(e: Entry) -> str:
    ends = "ends as the change does" if e.mimic is None else _outcomes(e, Attack.MIMIC)
    return f"{e.mimic_is}: {ends}"


def _may_write(e: Entry) -> str:
    actors = [a.value for a in Actor if e.resource in WRITES[a]]
    return ", ".join(actors) if actors else "none"


def summary(table: Sequence[Entry] = TABLE) -> list[str]:
    """The count of cases, by kind of attack, actor and outcome."""
    counts: dict[tuple[Attack, Actor, Outcome], int] = {}
    for case in cases(table):
        key = (case.kind, case.actor, case.expect.outcome)
        counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    lines = [
        f"{len(table)} entries, {total} attack cases (entry x phase x actor x kind of attack):",
        "",
    ]
    for kind in Attack:
        for actor in Actor:
            found = [
                f"{o.value} {counts[kind, actor, o]}" for o in Outcome if (kind, actor, o) in counts
            ]
            lines.append(f"- {kind.value}, by {actor.value}: " + ", ".join(found) + ".")
    return lines


def markdown(table: Sequence[Entry] = TABLE) -> str:
    """The table of docs/design.md, between :data:`BEGIN` and :data:`END`."""
    lines = [
        BEGIN,
        "",
        "| input | object and field | written by | of the actors, may write | frozen from "
        "| verified by | proven by | a change, by phase of the step | the mimic, by phase "
        "| known gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in table:
        gap = f"[not enforced yet](#trust-model): {e.gap} ..." if e.gap else ""
        fields = f" (CRD: `{'`, `'.join(e.fields)}`)" if e.fields else ""
        row = [
            f"`{e.id}`",
            f"{e.object} `{e.path}`{fields}",
            ", ".join(w.value for w in e.writers),
            _may_write(e),
            e.frozen.value,
            ", ".join(c.value for c in e.checks),
            ", ".join(o.value for o in e.proven),
            _outcomes(e),
            _mimic(e),
            gap,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines += ["", *summary(table), "", END]
    return "\n".join(lines) + "\n"


def replace_in(text: str, table: Sequence[Entry] = TABLE) -> str:
    """``text`` (docs/design.md) with its generated table replaced by the current one."""
    head, _, rest = text.partition(BEGIN)
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return head + markdown(table).rstrip("\n") + tail


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrun.api.trust", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--update", metavar="FILE", help="replace the table in FILE")
    args = parser.parse_args(argv)
    if args.update:
        with open(args.update, encoding="utf-8") as f:
            text = f.read()
        with open(args.update, "w", encoding="utf-8") as f:
            f.write(replace_in(text))
        return 0
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
