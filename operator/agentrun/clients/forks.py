"""Making a fork: one implementation for ``kubectl agentrun fork`` and
:meth:`agentrun.clients.typed.AgentRunClient.fork`; and a follow-up, a fork after an agent
run's answer that asks the next question (:func:`ask`, for ``kubectl agentrun ask`` and
:meth:`agentrun.clients.typed.AgentRunClient.ask`).

What a fork keeps and runs is planned by :mod:`agentrun.core.fork_plan` (pure). Making it:

1. read the results it carries that are kept by reference (ConfigMaps of the old run), each
   checked against the digest its step committed;
2. create the new run, suspended (with ``dry_run``: a server-side dry run, so admission checks
   it, and nothing is created or copied);
3. copy those results into ConfigMaps owned by the new run (its uid is known only now); a copy
   that fails deletes the new run again;
4. resume the new run.

A fork from an agent run's turn copies nothing of the conversation: the new run names the old
one in ``spec.agent.resumeFrom``, and the operator reads the conversation from the old run's
own records (:mod:`agentrun.observation.conversation`). The API calls are the caller's
(:class:`ForkApi`), so
each client keeps its own connection; a refusal becomes :class:`ForkRefused`, whose message
says what to do. Also here: the new run's default name and the copy of a result ConfigMap.

A follow-up (:mod:`agentrun.core.follow_up` plans it) copies nothing and carries nothing: it
is created once, under the name given or the first free default name (one that exists is
skipped for the next).
"""

from __future__ import annotations

import copy
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import follow_up, naming
from agentrun.core import fork_plan as forking
from agentrun.execution import objects
from agentrun.kubeapi import Unreachable, api_message


class ForkRefused(Exception):
    """The fork cannot be made; the message says why."""


class NameTaken(ForkRefused):
    """The new run's name is taken in the namespace."""


@dataclass(frozen=True)
class ForkApi:
    """The calls a fork makes, in the caller's namespace; each raises ``ApiException`` when
    the API server refuses (copies and deletes may also raise :class:`Unreachable`)."""

    get_config_map: Callable[[str], dict[str, Any] | None]
    """A ConfigMap as plain JSON, None when there is none."""
    create_run: Callable[[dict[str, Any], bool], dict[str, Any]]
    """Create an AgentRun (the second argument: as a server-side dry run); the run as stored."""
    create_config_map: Callable[[dict[str, Any]], object]
    resume_run: Callable[[str], object]
    """Set ``spec.suspend`` of the named run to false."""
    delete_run: Callable[[str], object]


@dataclass(frozen=True)
class Forked:
    """A fork made (or, for a dry run, checked)."""

    plan: forking.ForkPlan
    run: dict[str, Any]
    """The new run: as the API server stored it; for a dry run, the manifest as it would be
    once made (not suspended)."""
    copies: list[str] = field(default_factory=list)
    """The ConfigMaps the carried results were (or would be) copied into."""
    dry_run: bool = False

    def note(self) -> str:
        """One line saying what the fork keeps and runs."""
        plan = self.plan
        carried = ", ".join(c.step for c in plan.carry) or "nothing"
        made = "would fork" if self.dry_run else "forked"
        head = f"{made} agentrun/{plan.source.partition('/')[2]} at {plan.starts_at}"
        if plan.from_turn is None:
            return f"{head}: carried {carried}; runs {', '.join(plan.rerun)}"
        runs = f"; runs {', '.join(plan.rerun)} first" if plan.rerun else ""
        return (
            f"{head}: agentrun/{plan.name} continues its conversation after turn "
            f"{plan.from_turn} (read by the operator from its records); carried plan steps: "
            f"{carried}{runs}; approvals are not carried"
        )


def random_suffix(length: int = 4) -> str:
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(length))


def fork_name(run: str, given: str | None = None) -> str:
    """``given``, else ``RUN-fork-<4 random letters>``."""
    return given or forking.default_name(run, random_suffix())


def plan(run: m.AgentRun, start: str, name: str) -> forking.ForkPlan:
    """The fork of ``run`` from ``start``: a turn (a number, for an agent run) or a step."""
    turn = forking.turn_of(run, start)
    try:
        if turn is not None:
            return forking.plan_turn(run, turn, name)
        return forking.plan(run, start, name)
    except ValueError as error:
        raise ForkRefused(str(error)) from None


def make(
    api: ForkApi,
    body: dict[str, Any],
    run: m.AgentRun,
    fork: forking.ForkPlan,
    *,
    dry_run: bool = False,
    name_option: str = "--name",
) -> Forked:
    """Make ``fork`` of ``run`` (``body``: the run as stored)."""
    namespace = run.metadata.namespace
    sources: dict[str, dict[str, Any]] = {}
    contents: dict[str, str] = {}
    for carry in fork.carry:
        ref = carry.status.result_ref
        if carry.copy_name is None or ref is None:
            continue
        try:
            cm = api.get_config_map(ref.name) if ref.kind == "ConfigMap" else None
        except ApiException as error:
            raise ForkRefused(
                f"cannot read the result of step '{carry.step}' from ConfigMap '{ref.name}': "
                f"{api_message(error)}"
            ) from None
        data = (cm or {}).get("data") or {}
        if cm is None or ref.key not in data:
            instead = (
                f"; fork from '{carry.step}' or an earlier step instead"
                if fork.from_turn is None
                else ""
            )
            raise ForkRefused(
                f"cannot carry the result of step '{carry.step}': {ref.kind} '{ref.name}' "
                f"(key {ref.key}) is gone{instead}"
            )
        content = str(data[ref.key])
        digest = carry.status.result_digest
        if digest and naming.sha256_text(content) != digest:
            raise ForkRefused(
                f"cannot carry the result of step '{carry.step}': ConfigMap '{ref.name}' no "
                f"longer matches the digest {digest} the step committed"
            )
        sources[carry.step], contents[carry.step] = cm, content
    entries = [forking.carried_result(fork, c, contents.get(c.step)) for c in fork.carry]
    manifest = forking.new_run(body, fork, entries)
    copies = [c.copy_name for c in fork.carry if c.step in sources and c.copy_name]

    created = _create(api.create_run, manifest, namespace, name_option, dry_run)
    if dry_run:
        shown = copy.deepcopy(manifest)
        shown["spec"].pop("suspend", None)
        return Forked(fork, shown, copies, dry_run=True)

    uid = str((created.get("metadata") or {}).get("uid", ""))
    for carry in fork.carry:
        if carry.step not in sources or carry.copy_name is None:
            continue
        body_copy = result_copy(sources[carry.step], carry.copy_name, fork.name, uid, carry.step)
        try:
            api.create_config_map(body_copy)
        except (ApiException, Unreachable) as error:
            why = api_message(error) if isinstance(error, ApiException) else str(error)
            raise ForkRefused(
                f"cannot copy the result of step '{carry.step}' into ConfigMap "
                f"'{carry.copy_name}': {why}; {_delete_again(api, fork.name)}"
            ) from None
    try:
        resumed = api.resume_run(fork.name)
    except ApiException as error:
        raise ForkRefused(
            f"created agentrun '{fork.name}' (suspended) but cannot resume it: "
            f"{api_message(error)}; run `kubectl agentrun resume {fork.name}`"
        ) from None
    stored = resumed if isinstance(resumed, dict) else created
    return Forked(fork, stored, copies)


def _create(
    create_run: Callable[[dict[str, Any], bool], dict[str, Any]],
    manifest: dict[str, Any],
    namespace: str,
    name_option: str,
    dry_run: bool = False,
) -> dict[str, Any]:
    """The new run as the API server stored it; :class:`NameTaken` when one of its name
    exists, :class:`ForkRefused` when it is refused otherwise."""
    name = manifest["metadata"]["name"]
    try:
        return create_run(manifest, dry_run)
    except ApiException as error:
        if error.status == 409:
            raise NameTaken(
                f"agentrun '{name}' already exists in namespace '{namespace}'; "
                f"choose another {name_option}"
            ) from None
        raise ForkRefused(f"cannot create agentrun '{name}': {api_message(error)}") from None


@dataclass(frozen=True)
class Asked:
    """A follow-up made."""

    run: dict[str, Any]
    """The new run as the API server stored it."""
    source: str
    """The name of the run asked."""
    turn: int
    """The turn it answered in, which the new run continues after."""

    @property
    def name(self) -> str:
        return str(self.run["metadata"]["name"])

    def note(self) -> str:
        """One line saying what the follow-up continues."""
        return (
            f"asked agentrun/{self.source} the next question: agentrun/{self.name} continues "
            f"its conversation after its answer in turn {self.turn} (read by the operator from "
            "its records)"
        )


def ask(
    create_run: Callable[[dict[str, Any], bool], dict[str, Any]],
    body: dict[str, Any],
    run: m.AgentRun,
    question: str,
    name: str | None = None,
    *,
    name_option: str = "--name",
) -> Asked:
    """Make the follow-up of ``run`` (``body``: the run as stored) asking ``question``: named
    ``name``, else the first default name not taken (:func:`agentrun.core.follow_up.names`).
    :class:`ForkRefused` saying why when it cannot be made."""
    problem = follow_up.question_problem(question) or follow_up.ask_problem(run)
    if problem is not None:
        raise ForkRefused(f"cannot ask agentrun/{run.metadata.name}: {problem}")
    tried = [name] if name else list(follow_up.names(run))
    for candidate in tried:
        manifest = follow_up.new_run(body, run, question, candidate)
        try:
            created = _create(create_run, manifest, run.metadata.namespace, name_option)
        except NameTaken:
            if name:
                raise
            continue
        return Asked(created, run.metadata.name, follow_up.answered_turn(run))
    raise NameTaken(
        f"agentrun {tried[0]} to {tried[-1]} all exist in namespace "
        f"'{run.metadata.namespace}'; name the new run with {name_option}"
    )


def _delete_again(api: ForkApi, name: str) -> str:
    """Delete the new run after a failed copy; what happened, for the message."""
    try:
        api.delete_run(name)
    except (ApiException, Unreachable) as error:
        why = api_message(error) if isinstance(error, ApiException) else str(error)
        return f"agentrun '{name}' could not be deleted again ({why}): delete it"
    return f"agentrun '{name}' was deleted again"


def result_copy(
    source: Mapping[str, Any], name: str, run_name: str, run_uid: str, step: str
) -> dict[str, Any]:
    """A copy of a result ConfigMap, owned by the new run (not as its controller: whoever forks
    may not block the run's deletion) in the namespace of the source."""
    meta = source.get("metadata") or {}
    body = objects.owned_config_map(
        objects.RunRef(run_name, str(meta.get("namespace") or ""), run_uid),
        name,
        {s.LABEL_STEP: step, s.LABEL_KIND: "result"},
        source.get("data") or {},
        annotations={
            f"{m.GROUP}/carried-from": f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        },
        controller=False,
    )
    if source.get("binaryData"):
        body["binaryData"] = dict(source["binaryData"])
    body["immutable"] = True  # as the source: a result never changes (its digest is checked)
    return body
