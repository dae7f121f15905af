"""A typed Python client for AgentRuns: create a run, read it, wait for it, decide on its gated
steps, read a step's result and the run's history. Runs go in and come out as the pydantic
models of :mod:`agentrun.api.models`, the same ones the operator reads.

    from agentrun.api import models as m
    from agentrun.clients.typed import AgentRunClient

    with AgentRunClient(namespace="demo") as runs:
        run = runs.create(m.AgentRun.model_validate(yaml.safe_load(manifest)))
        runs.wait(run.metadata.name, for_phase=m.RunPhase.WAITING_FOR_APPROVAL)
        runs.approve(run.metadata.name, "restart-service", reason="checked the dashboard")
        done = runs.wait(run.metadata.name, timeout=600)

:meth:`AgentRunClient.fork` makes a fork exactly as ``kubectl agentrun fork`` does (the shared
:mod:`agentrun.clients.forks`): from a plan step, or after a turn of an agent run.
:meth:`AgentRunClient.ask` asks an agent run that answered the next question of its
conversation, as ``kubectl agentrun ask`` does:

    with AgentRunClient(namespace="demo") as runs:
        follow_up = runs.ask("review", "And what about the cache?")
        runs.wait(follow_up.metadata.name)
        print(runs.result(follow_up.metadata.name))   # its answer

Results, history and waiting are read as ``kubectl agentrun result|history|wait`` read them (the
shared :mod:`agentrun.clients.reading`).

Decisions are recorded exactly as ``kubectl agentrun approve|reject`` records them (the shared
:mod:`agentrun.access.approvals`): bound to the step's current argsHash, signed with the name the
API server knows the caller by, appended by a resourceVersion-guarded JSON patch. Every write
names the field manager ``agentrun-client``. The client never writes status: that is the
operator's.

Errors: :class:`RunNotFound` for a run that does not exist, :class:`DecisionError` for a
decision that cannot be recorded (the step is not waiting, or the API server refused it),
:class:`WaitTimeout` (a :class:`TimeoutError`) when a run does not get where :meth:`wait` waits
for it, with the run's last phase and conditions; any other refusal of the API server is an
:class:`AgentRunError` carrying its message and HTTP status.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from agentrun.access import approvals
from agentrun.api import models as m
from agentrun.clients import forks, reading
from agentrun.core import agent_refs
from agentrun.kubeapi import (
    JSON_PATCH,
    MERGE_PATCH,
    api_message,
    list_items,
    load_cluster,
    tolerate,
)

__all__ = [
    "FIELD_MANAGER",
    "AgentRunClient",
    "AgentRunError",
    "DecisionError",
    "RunNotFound",
    "WaitTimeout",
    "describe_conditions",
]

FIELD_MANAGER = "agentrun-client"
"""The field manager of the client's writes (metadata.managedFields names who set what)."""


class AgentRunError(Exception):
    """A request about a run that could not be done; ``status`` is the API server's HTTP
    status when it refused (None when the client itself refused)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RunNotFound(AgentRunError, LookupError):
    """No run of that name in the client's namespace."""


class DecisionError(AgentRunError):
    """An approval or rejection that was not recorded: the step cannot be decided now, or the
    API server (its admission policies) refused the decision."""


class WaitTimeout(TimeoutError):
    """:meth:`AgentRunClient.wait` gave up; ``run`` is the run as last read."""

    def __init__(self, message: str, run: m.AgentRun) -> None:
        super().__init__(message)
        self.run = run

    @property
    def conditions(self) -> list[m.Condition]:
        """The run's conditions when the wait gave up."""
        return list((self.run.status.conditions if self.run.status else None) or [])


def describe_conditions(run: m.AgentRun) -> str:
    """The run's phase, message and conditions in one line, for errors and logs."""
    status = run.status
    if status is None or status.phase is None:
        return "no status yet (phase Pending): is the operator running and watching this namespace?"
    text = f"phase {status.phase}"
    if status.message:
        text += f" ({status.message})"
    conditions = [
        f"{c.type}={c.status}"
        + (f" {c.reason}" if c.reason else "")
        + (f": {c.message}" if c.message else "")
        for c in status.conditions or []
    ]
    return text + "; conditions: " + ("; ".join(conditions) if conditions else "none")


def default_api_client() -> Any:
    """A client from $KUBECONFIG (or ~/.kube/config), else the in-cluster ServiceAccount."""
    return load_cluster(fall_back=True).api_client()


class AgentRunClient:
    """AgentRuns in one namespace.

    ``api_client`` is a ``kubernetes.client.ApiClient``; without one the client loads
    $KUBECONFIG (else ~/.kube/config, else the in-cluster ServiceAccount) and closes that
    connection in :meth:`close` (or at the end of a ``with`` block).
    """

    def __init__(
        self,
        api_client: Any | None = None,
        namespace: str = "default",
        *,
        poll_interval: float = 1.0,
    ) -> None:
        self._owns_client = api_client is None
        self.api_client: Any = default_api_client() if api_client is None else api_client
        self.namespace = namespace
        self.poll_interval = poll_interval
        self._custom: Any = kube_client.CustomObjectsApi(self.api_client)
        self._core: Any = kube_client.CoreV1Api(self.api_client)
        self._user: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection if the client opened it."""
        if self._owns_client:
            self.api_client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- create and read ---------------------------------------------------------------------

    def create(
        self,
        run: m.AgentRun | m.AgentRunSpec,
        *,
        name: str | None = None,
        generate_name: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> m.AgentRun:
        """Create a run in the client's namespace and return it as stored.

        ``run`` is a whole :class:`~agentrun.api.models.AgentRun` (its name, labels and
        annotations are used; status is never sent) or just a spec, which needs ``name`` or
        ``generate_name``. ``name``, ``labels`` and ``annotations`` given here win.
        """
        if isinstance(run, m.AgentRun):
            meta = run.metadata
            if "namespace" in meta.model_fields_set and meta.namespace != self.namespace:
                raise AgentRunError(
                    f"agentrun '{meta.name}' names namespace '{meta.namespace}' but this client "
                    f"works in '{self.namespace}': use AgentRunClient(namespace="
                    f"'{meta.namespace}')"
                )
            spec = run.spec
            name = name or (None if generate_name else meta.name)
            labels = {**(meta.labels or {}), **(labels or {})}
            annotations = {**(meta.annotations or {}), **(annotations or {})}
        else:
            spec = run
            if not (name or generate_name):
                raise AgentRunError("a run created from a spec needs a name or a generate_name")
        metadata: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
        if labels:
            metadata["labels"] = labels
        if annotations:
            metadata["annotations"] = annotations
        body = {
            "apiVersion": m.API_VERSION,
            "kind": m.KIND,
            "metadata": metadata,
            "spec": spec.to_wire(),
        }
        what = f"agentrun '{name or generate_name}'"
        with self._refusals(f"cannot create {what} in namespace '{self.namespace}'"):
            created = self._custom.create_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, body, field_manager=FIELD_MANAGER
            )
        return self._parse(created)

    def get(self, name: str) -> m.AgentRun:
        """The run as stored now; :class:`RunNotFound` if there is none."""
        return self._parse(self._read(name))

    # -- wait ----------------------------------------------------------------------------------

    def wait(
        self,
        name: str,
        timeout: float = 300.0,
        *,
        for_phase: m.RunPhase | Iterable[m.RunPhase] | None = None,
    ) -> m.AgentRun:
        """Poll the run until its phase is one of ``for_phase`` (default: a terminal phase,
        Succeeded, Failed or Cancelled) and return it. A run that finishes in another phase
        first raises :class:`AgentRunError`; after ``timeout`` seconds :class:`WaitTimeout`
        says where the run stood: its phase, message and conditions."""
        if for_phase is None:
            wanted = frozenset(m.TERMINAL_RUN_PHASES)
        elif isinstance(for_phase, m.RunPhase):
            wanted = frozenset({for_phase})
        else:
            wanted = frozenset(for_phase)
        goal = ", ".join(sorted(str(p) for p in wanted))
        waited = reading.wait(lambda: self.get(name), wanted, timeout, self.poll_interval)
        run = waited.run
        if waited.timed_out:
            raise WaitTimeout(
                f"timed out after {timeout:g}s waiting for agentrun/{name} in namespace "
                f"'{self.namespace}' to reach {goal}: {describe_conditions(run)}",
                run,
            )
        if waited.phase not in wanted:
            raise AgentRunError(
                f"agentrun/{name} in namespace '{self.namespace}' finished without reaching "
                f"{goal}: {describe_conditions(run)}"
            )
        return run

    # -- decisions -----------------------------------------------------------------------------

    def approve(
        self, name: str, step: str, reason: str | None = None, *, force: bool = False
    ) -> m.Approval:
        """Approve ``step`` of run ``name`` (it must be waiting for approval unless ``force``)
        and return the entry in spec.approvals. Approving again what this user approved
        already records nothing and returns the existing entry."""
        return self._decide(name, step, m.ApprovalDecision.APPROVE, reason, force)

    def reject(self, name: str, step: str, reason: str, *, force: bool = False) -> m.Approval:
        """Reject ``step`` of run ``name``, saying why (``reason`` is required), and return the
        entry in spec.approvals."""
        if not reason or not reason.strip():
            raise DecisionError(f"rejecting step '{step}' of agentrun/{name} needs a reason")
        return self._decide(name, step, m.ApprovalDecision.REJECT, reason, force)

    def whoami(self) -> str:
        """The user name the API server knows this client by (a SelfSubjectReview); decisions
        are signed with it."""
        if self._user is None:
            api = kube_client.AuthenticationV1Api(self.api_client)
            body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            with self._refusals("cannot find out who this client is (SelfSubjectReview)"):
                review = api.create_self_subject_review(body=body)
            user = review.status.user_info if review.status is not None else None
            name = getattr(user, "username", None)
            if not name:
                raise AgentRunError("the API server did not say who this client is")
            self._user = str(name)
        return self._user

    def _decide(
        self, name: str, step: str, decision: m.ApprovalDecision, reason: str | None, force: bool
    ) -> m.Approval:
        user = self.whoami()

        def read() -> tuple[dict[str, Any], m.AgentRun]:
            body = self._read(name)
            return body, self._parse(body)

        def patch(ops: list[dict[str, Any]]) -> object:
            return self._custom.patch_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, name, ops,
                field_manager=FIELD_MANAGER, _content_type=JSON_PATCH,
            )  # fmt: skip

        try:
            recorded = approvals.record(
                name, read, patch, step=step, decision=decision, by=user, reason=reason,
                force=force, now=lambda: datetime.now(UTC), force_hint="force=True",
            )  # fmt: skip
        except approvals.DecisionRefused as error:
            raise DecisionError(str(error)) from None
        except ApiException as error:
            if error.status == 404:
                raise self._not_found(name) from None
            raise DecisionError(
                f"the API server refused to record the {decision} of step '{step}' of "
                f"agentrun/{name} by {user}: {api_message(error)}",
                error.status,
            ) from None
        return recorded.entry

    # -- forks -----------------------------------------------------------------------------------

    def fork(
        self, name: str, start: str | int, *, new_name: str | None = None, dry_run: bool = False
    ) -> m.AgentRun:
        """A new run from run ``name`` and return it as stored.

        ``start`` is a plan step (that step and what follows it run again; every other step
        that succeeded keeps its result, copied when kept in a ConfigMap) or, for an agent
        run, a turn (an ``int``): the new run carries the plan's results and continues the
        conversation after that turn (``spec.agent.resumeFrom``; the operator reads the
        conversation from the old run's records). Approvals are not carried. ``new_name``
        defaults to ``NAME-fork-<4 letters>``. With ``dry_run`` the API server checks the new
        run (a server-side dry run) and nothing is created: the run returned is the manifest.
        A fork that cannot be made raises :class:`AgentRunError` saying why.
        """
        body = self._read(name)
        run = agent_refs.effective(self._parse(body))
        target = forks.fork_name(name, new_name)

        def resume_run(run_name: str) -> object:
            return self._custom.patch_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, run_name,
                {"spec": {"suspend": False}}, field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )  # fmt: skip

        api = forks.ForkApi(
            get_config_map=self._config_map,
            create_run=self._create_run,
            create_config_map=lambda cm: self._core.create_namespaced_config_map(
                self.namespace, cm, field_manager=FIELD_MANAGER
            ),
            resume_run=resume_run,
            delete_run=lambda run_name: self._custom.delete_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, run_name
            ),
        )
        try:
            forked = forks.make(
                api, body, run, forks.plan(run, str(start), target), dry_run=dry_run,
                name_option="new_name",
            )  # fmt: skip
        except forks.ForkRefused as error:
            raise AgentRunError(str(error)) from None
        return self._parse(forked.run)

    def ask(self, name: str, question: str, *, new_name: str | None = None) -> m.AgentRun:
        """Ask agent run ``name``, which answered, the next question of its conversation: a
        new run with its spec (model, tools, instructions, limits, budget; not its plan, whose
        results the conversation holds) and ``question`` as its goal, which continues the
        conversation after the answer (``spec.agent.resumeFrom`` names ``name``, its uid and
        the turn it answered in). Its first model turn sees the whole conversation, the answer,
        then the question. Returns the new run as stored; :meth:`wait` for it, then
        :meth:`result` without a step reads its answer.

        ``new_name`` defaults to ``BASE-2`` (``BASE-3``, ... when taken), BASE being ``name``
        or, for a run that is itself a follow-up, its conversation's first run's name
        (:mod:`agentrun.core.follow_up`). :class:`RunNotFound` when there is no run ``name``;
        :class:`AgentRunError` saying why when it cannot be asked: the question is empty or too
        long, the run is not an agent run, has not finished, or ended without an answer.
        """
        body = self._read(name)
        try:
            run = agent_refs.effective(self._parse(body))
            asked = forks.ask(self._create_run, body, run, question, new_name,
                              name_option="new_name")  # fmt: skip
        except forks.ForkRefused as error:
            raise AgentRunError(str(error)) from None
        return self._parse(asked.run)

    def start(
        self,
        agent: str,
        goal: str,
        *,
        name: str | None = None,
        overrides: dict[str, int] | None = None,
        max_tokens: int | None = None,
    ) -> m.AgentRun:
        """Start a run of Agent ``agent`` of the namespace with ``goal`` (``spec.agentRef``),
        as ``kubectl agentrun start`` does: named ``name``, else ``AGENT-<5 letters>`` by the
        API server; ``overrides`` (maxTurns, maxToolCallsPerTurn, contextBytes: only those the
        Agent's allowOverrides lists) and ``max_tokens`` (its spec.budget.maxTokens). The
        operator takes the Agent as it is when the run starts (docs/agents.md). Returns the
        run as stored; :class:`AgentRunError` when the goal is empty or too long."""
        problem = agent_refs.goal_problem(goal)
        if problem is not None:
            raise AgentRunError(f"cannot start a run of Agent {agent}: {problem}")
        body = agent_refs.run_of(agent, goal, name=name, overrides=overrides,
                                 max_tokens=max_tokens)  # fmt: skip
        return self._parse(self._create_run(body, False))

    def _create_run(self, manifest: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        extra = {"dry_run": "All"} if dry_run else {}
        created: dict[str, Any] = self._custom.create_namespaced_custom_object(
            m.GROUP, m.VERSION, self.namespace, m.PLURAL, manifest,
            field_manager=FIELD_MANAGER, **extra,
        )  # fmt: skip
        return created

    def _config_map(self, cm_name: str) -> dict[str, Any] | None:
        with tolerate(404) as missing:
            found = self._core.read_namespaced_config_map(cm_name, self.namespace)
        if missing:
            return None
        plain: dict[str, Any] = self.api_client.sanitize_for_serialization(found)
        return plain

    # -- results and history -------------------------------------------------------------------

    def result(self, name: str, step: str | None = None) -> str:
        """The full result of ``step``: inline in status, or from the ConfigMap status refers
        to (checked against the digest the step committed). Without ``step``, the answer of
        an agent run (its result)."""
        run = self.get(name)
        what = "the answer" if step is None else f"the result of step '{step}'"
        try:
            if step is None:
                stored = reading.answer(run, self._config_map)
            else:
                stored = reading.step_result(run, step, self._config_map)
        except reading.NotAStep as error:
            raise AgentRunError(
                f"step '{step}' is not a step of agentrun/{name} (steps: {', '.join(error.steps)})"
            ) from None
        except reading.NoResult as error:
            raise AgentRunError(
                f"step '{step}' of agentrun/{name} has no result (phase {error.phase})"
            ) from None
        except reading.Unreadable as error:
            raise AgentRunError(str(error), error.status) from None
        # Only a result kept by reference is checked: status is written by the operator alone,
        # a ConfigMap by anyone who may write ConfigMaps.
        if stored.ref is not None and not stored.intact:
            raise AgentRunError(
                f"{what} of agentrun/{name} in ConfigMap '{stored.ref.name}' does not match "
                f"the digest {stored.digest} {'the model' if step is None else 'the step'} "
                "committed: it was changed afterwards"
            )
        return stored.content

    def history(self, name: str) -> list[m.Transition]:
        """Every transition of the run, oldest first: its audit record, followed by the
        transitions of status.history the record does not hold yet."""

        def list_config_maps(selector: str) -> list[dict[str, Any]]:
            with self._refusals(f"cannot read the audit record of agentrun/{name}"):
                found = self._core.list_namespaced_config_map(
                    self.namespace, label_selector=selector, _preload_content=False
                )
            return list_items(found)

        transitions = []
        for entry in reading.history(lambda: self.get(name), list_config_maps).timeline:
            fields = {k: v for k, v in entry.items() if k not in ("prev", "hash")}
            try:
                transitions.append(m.Transition.model_validate(fields))
            except ValidationError as error:
                raise AgentRunError(
                    f"the audit record of agentrun/{name} holds an unreadable entry "
                    f"{dict(entry)}: {error}"
                ) from None
        return transitions

    # -- internals -----------------------------------------------------------------------------

    def _read(self, name: str) -> dict[str, Any]:
        try:
            body: dict[str, Any] = self._custom.get_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                raise self._not_found(name, api_message(error)) from None
            raise AgentRunError(
                f"cannot read agentrun '{name}' in namespace '{self.namespace}': "
                f"{api_message(error)}",
                error.status,
            ) from None
        return body

    def _not_found(self, name: str, message: str = "") -> RunNotFound:
        if "could not find the requested resource" in message:
            return RunNotFound(
                f"the AgentRun API ({m.API_VERSION}) is not installed in this cluster: apply "
                "crds/ first",
                404,
            )
        return RunNotFound(f"agentrun '{name}' not found in namespace '{self.namespace}'", 404)

    def _parse(self, body: dict[str, Any]) -> m.AgentRun:
        try:
            return m.AgentRun.model_validate(body)
        except ValidationError as error:
            name = (body.get("metadata") or {}).get("name")
            raise AgentRunError(
                f"agentrun '{name}' in namespace '{self.namespace}' does not match the API this "
                f"client knows ({m.API_VERSION}); is the client older than the operator?\n{error}"
            ) from None

    @contextmanager
    def _refusals(self, what: str) -> Iterator[None]:
        """A refusal of the API server becomes an AgentRunError: '<what>: <its message>'."""
        try:
            yield
        except ApiException as error:
            raise AgentRunError(f"{what}: {api_message(error)}", error.status) from None
