"""Acting with the rights of the run's creator, never with the operator's own.

The operator may create Jobs in every namespace it watches, and the Job controller gives their
pods whatever they reference. Left at that, a user allowed only to create AgentRuns could have
a step read a Secret she may not read (``env.valueFrom.secretKeyRef``) or run as a more
powerful ServiceAccount of the namespace (``stepTemplate.serviceAccountName``): the operator
would lend its authority. So before a step is launched, what it would use is checked against
the creator's own rights, with a LocalSubjectAccessReview per permission (:func:`checks_for`):

* ``get secrets/<name>`` for every ``env[].valueFrom.secretKeyRef`` of the step's container;
* ``get configmaps/<name>`` for every ``env[].valueFrom.configMapKeyRef``;
* ``impersonate serviceaccounts/<name>`` for ``stepTemplate.serviceAccountName``.

A run that continues another's conversation (``spec.agent.resumeFrom``) has its creator
checked the same way, once, before the operator hands it that conversation: ``get
agentruns.agentrun.dev/<source>`` and ``get configmaps/<the source's context>``
(:mod:`agentrun.observation.conversation`).

The env vars that carry inputs from earlier steps are not checked: the core derives them from
``step.inputs`` (``resolve_inputs``), and those that are references name the run's own result
objects only: a step's envelope may reference no other ConfigMap (reason ResultRefRefused,
agentrun.core.attempts), and each is passed on only once its content has the digest committed
for it (agentrun.execution.inputs). Only what the user wrote in ``container.env`` is.

Why ``impersonate`` for a ServiceAccount: a pod running as a ServiceAccount gets its token and
acts as it against the API, and acting as someone else is what ``impersonate`` grants.
Kubernetes itself lets anyone who may create pods name any ServiceAccount of the namespace,
which is exactly the lending refused here. The built-in ``edit`` and ``admin`` roles grant
``impersonate`` on ``serviceaccounts`` in their namespace, ``view`` does not, and a Role can
grant it for one ServiceAccount (``resourceNames``). ``get serviceaccounts`` would be too weak
(``view`` has it: reading is not acting); ``create serviceaccounts/token`` names a token
request rather than acting as the account.

Whose rights: the user and groups the admission policies record at creation
(:data:`~agentrun.api.models.ANNOTATION_CREATED_BY` and
:data:`~agentrun.api.models.ANNOTATION_CREATED_BY_GROUPS`; manifests/admission). They are
trustworthy because the MutatingAdmissionPolicy overwrites whatever the client sent and the
ValidatingAdmissionPolicy refuses any later change; without those policies anyone could write
them. A run with no recorded creator fails closed: a step that references a Secret, a ConfigMap
or a ServiceAccount is refused, with a message saying the admission policies must be installed;
a step that references none needs no check (the operator lends nothing) and runs. A groups
annotation that is missing counts as no groups (fewer rights, never more); one that is not a
JSON array of strings fails closed like a missing creator.

Why LocalSubjectAccessReview (``localsubjectaccessreviews``, ``create``, the one rule the
operator's RBAC gains): it asks about one namespace, the run's, and is itself namespaced, so a
Role in each watched namespace grants it (the chart's namespaced mode); a SubjectAccessReview
is cluster-scoped and would need a ClusterRole that can ask about any namespace.

Cost: a verdict is cached per (run uid, creator, permission), so a plan of many steps reading
the same Secret costs one review, and a run that references nothing costs none. A permission
held is asked again when a launch needs it more than ``AGENTRUN_RIGHTS_TTL_SECONDS`` (60) after
it was last confirmed, so a right revoked while a run goes on stops its later launches within
that time. A refusal is kept for the run's life: a permission granted after a refusal does not
revive the failed step.

The refusal fails the step before any Job exists (the core reads it from
:attr:`~agentrun.core.Observed.refusals`), with reason ``Forbidden`` and a message naming what
is missing, e.g. ``creator alice may not get secrets/db-password in team-a``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.api import models as m
from agentrun.core import agent_loop
from agentrun.core.rights import Check, Permission, checks_for

RUNS_REMEMBERED = 4096
"""Runs whose verdicts are kept (least recently used first out)."""

ADMISSION_HINT = (
    "install the admission policies of manifests/admission (the chart's admissionPolicies) so "
    "that runs record their creator, and create the run again"
)

PENDING_PHASES = (
    None,
    m.StepPhase.PENDING,
    m.StepPhase.WAITING_FOR_APPROVAL,
    m.StepPhase.BACKING_OFF,
)
"""Step phases from which the core may launch an attempt: the steps checked in a pass."""


@dataclass(frozen=True)
class Creator:
    """Who created the run, as recorded at admission."""

    user: str
    groups: tuple[str, ...] = ()


def creator_of(run: m.AgentRun) -> Creator | str:
    """The run's recorded creator, or why there is none to act for."""
    annotations = run.metadata.annotations or {}
    user = annotations.get(m.ANNOTATION_CREATED_BY)
    if not user:
        return f"the run has no recorded creator (annotation {m.ANNOTATION_CREATED_BY})"
    return creator_from(user, annotations.get(m.ANNOTATION_CREATED_BY_GROUPS))


def creator_from(user: str, raw: str | None) -> Creator | str:
    """``user`` with the groups recorded beside it (JSON text, as the admission writes them;
    None: none recorded), or why they cannot be read."""
    if raw is None:
        return Creator(user)
    try:
        groups = json.loads(raw)
    except (ValueError, RecursionError):
        groups = None
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return (
            f"the run's annotation {m.ANNOTATION_CREATED_BY_GROUPS} is not a JSON array of strings"
        )
    return Creator(user, tuple(groups))


def refusal(namespace: str, creator: Creator, denied: Iterable[Check]) -> str:
    """The message of a step refused for ``denied``."""
    what = ", ".join(f"{c.describe()} in {namespace} ({c.source})" for c in denied)
    return (
        f"creator {creator.user} may not {what}; a step uses Secrets, ConfigMaps and "
        "ServiceAccounts with the rights of the run's creator"
    )


def no_creator(why: str, needed: Iterable[Check]) -> str:
    """The message of a step refused because there is no creator to check."""
    what = ", ".join(f"{c.describe()} ({c.source})" for c in needed)
    return f"{why}, so the operator cannot check that its creator may {what}: {ADMISSION_HINT}"


def review(namespace: str, creator: Creator, check: Check) -> dict[str, Any]:
    """The LocalSubjectAccessReview asking whether ``creator`` may do ``check``."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "LocalSubjectAccessReview",
        "metadata": {"namespace": namespace},
        "spec": {
            "user": creator.user,
            "groups": list(creator.groups),
            "resourceAttributes": {
                "namespace": namespace,
                "verb": check.verb,
                "group": check.group,
                "resource": check.resource,
                "name": check.name,
            },
        },
    }


def _allowed(response: Any) -> bool:
    """Whether a review's answer allows (anything else, an evaluation error too, denies)."""
    status = response.get("status") if isinstance(response, Mapping) else response.status
    if status is None:
        return False
    allowed = status.get("allowed") if isinstance(status, Mapping) else status.allowed
    return allowed is True


class Authorizer:
    """Finds the steps of a run that may not be launched on its creator's behalf.

    ``api`` is an ``AuthorizationV1Api``. Safe to use from several threads.
    """

    def __init__(
        self,
        api: Any,
        *,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        creator: Callable[[m.AgentRun], Creator | str] | None = None,
    ) -> None:
        self.api = api
        self.creator = creator or creator_of
        """Whose rights a run's steps use (or why none): its recorded creator; for a
        sub-agent's run, the creator its parent acts for (see the Observer)."""
        self.ttl = ttl
        """Seconds a granted permission is trusted before it is asked again."""
        self.clock = clock
        self._verdicts: OrderedDict[str, dict[tuple[Creator, Permission], tuple[bool, float]]] = (
            OrderedDict()
        )
        """run uid -> (creator, permission) -> (allowed, when it was asked)."""
        self._guard = threading.Lock()
        self.reviews = 0
        """Reviews asked so far (the API cost, for tests)."""

    def refusals(self, run: m.AgentRun) -> dict[str, str]:
        """Step name -> why it may not be launched, for the steps the core may launch next
        (not yet launched, or between attempts, their dependencies done). Reviews are asked
        only for permissions not decided before for this run; an API error propagates (the
        pass is retried)."""
        if run.status is not None and run.status.phase in m.TERMINAL_RUN_PHASES:
            return {}
        phases = {st.name: st.phase for st in (run.status.steps if run.status else None) or []}
        namespace = run.metadata.namespace
        creator: Creator | str | None = None
        out: dict[str, str] = {}
        statuses = {st.name: st for st in (run.status.steps if run.status else None) or []}
        # An agent run's current model turn (its API key Secret) and tool calls too.
        current = agent_loop.dynamic_steps(run, statuses, agent_loop.AgentConfig())
        for step in [*run.spec.plan.steps, *current]:
            if phases.get(step.name) not in PENDING_PHASES:
                continue
            if any(phases.get(d) != m.StepPhase.SUCCEEDED for d in step.depends_on or []):
                continue  # not launched before they succeed: asked then (most of a long plan)
            needed = checks_for(run, step)
            if not needed:
                continue
            if creator is None:
                creator = self.creator(run)
            if isinstance(creator, str):
                out[step.name] = no_creator(creator, needed)
                continue
            denied = [c for c in needed if not self._may(run.metadata.uid, namespace, creator, c)]
            if denied:
                out[step.name] = refusal(namespace, creator, denied)
        return out

    def granted(self, run: m.AgentRun) -> frozenset[Permission]:
        """The permissions the run's creator was found to have, each confirmed by a review less
        than the TTL ago. No review is asked here: these are the verdicts of earlier steps of
        the run. A step of the loop that a pass makes (a new turn's model step, a tool call)
        and whose every check is among them is launched in that pass
        (:func:`agentrun.core.turns.rights_confirmed`); one that needs another waits until it
        is committed and :meth:`refusals` asked about it."""
        creator = self.creator(run)
        if isinstance(creator, str):
            return frozenset()
        now = self.clock()
        with self._guard:
            verdicts = list(self._verdicts.get(run.metadata.uid, {}).items())
        return frozenset(
            permission
            for (who, permission), (allowed, asked) in verdicts
            if who == creator and allowed and now - asked < self.ttl
        )

    def refresh(self, run: m.AgentRun, needed: list[Check]) -> None:
        """Have the verdicts on ``needed`` current (each asked again once older than the TTL),
        so that :meth:`granted` holds those granted: for what the core makes without a step
        of its own to be refused (a run's executor, whose pod holds the model's and the MCP
        servers' Secrets). An API error propagates."""
        if needed:
            self.denied(run, needed, "")

    def denied(self, run: m.AgentRun, needed: list[Check], purpose: str) -> str | None:
        """Why the run's creator may not do all of ``needed`` in the run's namespace (a
        message ending with ``purpose``, what the rights are for); None when they may. Cached
        like the verdicts on steps; an API error propagates."""
        creator = self.creator(run)
        if isinstance(creator, str):
            what = ", ".join(c.describe() for c in needed)
            return (
                f"{creator}, so the operator cannot check that its creator may {what} "
                f"({purpose}): {ADMISSION_HINT}"
            )
        namespace = run.metadata.namespace
        refused = [c for c in needed if not self._may(run.metadata.uid, namespace, creator, c)]
        if not refused:
            return None
        what = ", ".join(f"{c.describe()} in {namespace} ({c.source})" for c in refused)
        return f"creator {creator.user} may not {what}; {purpose}"

    def _may(self, run_uid: str, namespace: str, creator: Creator, check: Check) -> bool:
        cache_key = (creator, check.permission)
        now = self.clock()
        with self._guard:
            cached = self._verdicts.get(run_uid, {}).get(cache_key)
            if run_uid in self._verdicts:
                self._verdicts.move_to_end(run_uid)
        if cached is not None:
            allowed, asked = cached
            if not allowed or now - asked < self.ttl:  # a refusal is final for the run
                return allowed
        response = self.api.create_namespaced_local_subject_access_review(
            namespace, review(namespace, creator, check)
        )
        allowed = _allowed(response)
        with self._guard:
            self.reviews += 1
            self._verdicts.setdefault(run_uid, {})[cache_key] = (allowed, now)
            self._verdicts.move_to_end(run_uid)
            while len(self._verdicts) > RUNS_REMEMBERED:
                self._verdicts.popitem(last=False)
        return allowed
