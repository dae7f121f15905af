"""Sub-agents, pure: the decisions around a tool call that starts a child AgentRun.

A sub-agent tool is ``spec.agent.tools[].agent``; :mod:`agentrun.core.children` moves data
between these decisions and a pass, and the shell reads the children, makes them and finds
whose rights they use (:mod:`agentrun.loop.observe`). What is decided:

Naming (:func:`child_name`, :func:`call_args_hash`)
    A call's child is named from the parent's name and a digest of the call's idempotency key
    (``{run uid}:{turn}:{call id}:{argsHash}``, the argsHash over the tool's declaration and
    the call's arguments, which an approval of the call is bound to), so the create repeated
    after a crash meets AlreadyExists, never makes a second child. Everything the child's spec
    is made of is committed with the call's intent before the create (the carved budget
    above all, which moves with the parent's usage), and a repeated create is built from
    what was committed, so it is the same spec and the child is adopted.
Limits (:func:`limit_problem`)
    A run made by a user is at depth 0; its children at 1. A call is refused (answered to the
    model as invalid, never run) when the child would be deeper than ``max_depth``
    (default :data:`DEFAULT_MAX_DEPTH`), when the turn already starts ``max_children_per_turn``
    children (default :data:`DEFAULT_MAX_CHILDREN_PER_TURN`), or when the run already started
    ``max_children`` in all (default :data:`DEFAULT_MAX_CHILDREN`). The depth is the length
    of the parent's verified chain of controllers up to a user's run (:func:`acting_creator`),
    never a label or an annotation.
Budget (:func:`carve`)
    The child's ``budget.maxTokens`` is carved out of what the parent has left: its
    ``maxTokens`` minus the tokens counted so far (its own turns and its children's), minus
    what running children may still use, minus the room the parent keeps for the turn that
    reads the child's answer (:func:`parent_keeps`). A call the budget cannot cover is
    refused. A parent without ``maxTokens`` gives the tool's declared ``max_tokens`` (or
    none).
Counting (:func:`counted_tokens`)
    A child's tokens count against the parent: the tokens in the child's status (which only
    the operator writes, and which hold the child's own children's), at most the budget carved
    for it, found by the child's uid, and never less than the parent counted before.
The child (:func:`child_manifest`)
    The AgentRun object the operator creates: the deterministic name, a controller
    ownerReference to the parent (uid, blockOwnerDeletion), the goal from the call's
    ``goal`` argument (after the declared preamble), ``spec.agent`` as the tool declares it,
    the carved budget, and the parent's policy and step template (a child never has fewer
    approvals to wait for, nor another identity, than its parent). Its approvals are its own:
    ``spec.approvals`` starts empty.
Adoption (:func:`adopt`)
    An AgentRun found under the child's name is taken as the call's child only when it
    carries the operator's proof (an HMAC, under a key only the operator holds, over the
    parent's uid, the child's name, the call's key and the digest of its spec:
    :func:`proof_bound`; the shell checks it, :attr:`ObservedChild.proven`), its controller
    ownerReference is the parent by uid and its spec digest is the one the operator would
    create (:func:`spec_digest`). Its name, owner, annotations and spec prove nothing: anyone
    who may create AgentRuns can write the exact object the operator would, first, as soon
    as the call's intent names it (a gated call names it while it waits for its approval).
    Anything else fails the call (reason ChildNameTaken) before anything of it runs, and the
    object is left alone. Once adopted, the child is known by the uid committed then.
Rights (:func:`acting_creator`)
    The operator creates the child, so the admission records the operator as its creator;
    the child's steps use the rights of the parent's creator instead, found through the
    child's controller (by uid), its call key and its name, which bind it to one call of one
    parent, and only while it carries the operator's proof (a run whose admission record
    names the operator, made without the operator's key, acts for nobody). The child is to
    take it on its first pass (as a run freezes its agent), so that a later edit of its
    ownerReferences changes nothing.
Result (:func:`child_outcome`)
    The call's result is the child's answer, read from the child whose uid the parent
    committed when it adopted it (a child deleted and made again under the same name is not
    it): Succeeded gives the answer; Failed and Cancelled give an error the model reads.
Reaching the children (:func:`child_switches`)
    A cancelled, suspended (or resumed) parent sets ``spec.cancel`` and ``spec.suspend`` of
    each running child, and a child over its carved budget is cancelled; deleting the parent
    deletes them by the ownerReference (the garbage collector, foreground or background
    alike).
The family (:func:`family`)
    What ``kubectl agentrun tree RUN`` prints (already a command of the plugin): the runs
    controlled (by uid) by the run and by its children, with phases and tokens. A run's tokens
    are its ``status.usage.tokens``, which already hold its children's as it counted them
    (see Counting): the top run's figure is the family's, and nothing is added up again.

tests/e2e/test_crash.py kills the operator while children are made; the trust table's
``child-run`` row is a child forged by someone else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import naming
from agentrun.core.observed import ObservedChild as ObservedChild
from agentrun.core.turns import AGAIN_NEXT_TURN, AgentConfig, turn_needs

DEFAULT_MAX_DEPTH = 2
"""A user's run (depth 0) may have children (1) and grandchildren (2), no deeper."""
DEFAULT_MAX_CHILDREN_PER_TURN = 4
"""Children one model turn may start (also bounded by maxToolCallsPerTurn)."""
DEFAULT_MAX_CHILDREN = 16
"""Children a run may start in all its turns."""
GOAL_ARGUMENT = "goal"
"""The argument of a sub-agent tool's call that is the child's goal."""
MAX_GOAL = 16384
"""Longest goal a child gets (the call's arguments are at most 4 KiB, the preamble more)."""
LABEL_PARENT_UID = f"{m.GROUP}/parent-uid"
"""Label of a child: its parent's uid, for selecting a family (never trusted: the
ownerReference decides)."""
ANNOTATION_CALL = f"{m.GROUP}/call"
"""Annotation of a child: the idempotency key of the call that made it."""
ANNOTATION_DEPTH = f"{m.GROUP}/depth"
"""Annotation of a child: its depth, as the operator found it when it made the child (for
people; decisions use the verified chain, :attr:`ActingFor.depth`)."""
CHILD_NAME_TAKEN = "ChildNameTaken"


@dataclass(frozen=True)
class Limits:
    """How far a family may grow."""

    max_depth: int = DEFAULT_MAX_DEPTH
    max_children_per_turn: int = DEFAULT_MAX_CHILDREN_PER_TURN
    max_children: int = DEFAULT_MAX_CHILDREN


@dataclass(frozen=True)
class SubAgentTool:
    """What a sub-agent tool declares: the child's agent, the text put before the call's
    goal, and the most tokens a child may be given."""

    agent: a.Agent | None
    """The child's spec.agent; None for a sub-agent of an Agent (``agent_ref``)."""
    preamble: str | None = None
    max_tokens: int | None = None
    agent_ref: str | None = None
    """The Agent the child runs (its spec.agentRef), by name."""

    def child_agent(self) -> dict[str, Any]:
        """The child's agent as its spec holds it: ``{"agent": ...}`` or ``{"agentRef": ...}``
        (wire form, fields at their defaults left out)."""
        if self.agent_ref is not None:
            return {"agentRef": {"name": self.agent_ref}}
        assert self.agent is not None
        wire = self.agent.model_dump(
            mode="json", by_alias=True, exclude_defaults=True, exclude_none=True
        )
        return {"agent": wire}


@dataclass(frozen=True)
class Adopted:
    uid: str


@dataclass(frozen=True)
class Refused:
    reason: str
    message: str


# -- naming and limits ---------------------------------------------------------------------------


def child_name(parent_name: str, call_key: str) -> str:
    """The child's name: readable, a DNS label, and a function of the call's idempotency key
    alone, so that every create of it after a crash names the same object."""
    return naming.dns_label(f"{parent_name}-sub", naming.sha256_text(call_key)[:12])


def call_args_hash(tool: SubAgentTool, arguments: Mapping[str, Any]) -> str:
    """The argsHash of a sub-agent call: sha256 of the tool's declaration (agent, preamble,
    most tokens) and the call's arguments, as canonical JSON."""
    wire = {
        **tool.child_agent(),
        "preamble": tool.preamble,
        "maxTokens": tool.max_tokens,
        "arguments": dict(arguments),
    }
    return naming.sha256_text(naming.canonical_json(wire))


def limit_problem(
    depth: int, this_turn: int, started: int, limits: Limits, *, again: str = AGAIN_NEXT_TURN
) -> str | None:
    """Why one more child may not be started (None: it may): ``depth`` is the parent's,
    ``this_turn`` the children already accepted in this turn, ``started`` in all turns;
    ``again`` what a call over the limit of one turn may do (:func:`agentrun.core.turns.again`:
    nothing more in the last turn)."""
    if depth + 1 > limits.max_depth:
        return (
            f"a sub-agent of this run would be at depth {depth + 1}, deeper than the "
            f"{limits.max_depth} allowed; do the work yourself"
        )
    if this_turn >= limits.max_children_per_turn:
        return (
            f"at most {limits.max_children_per_turn} sub-agents may be started in one turn; {again}"
        )
    if started >= limits.max_children:
        return f"this run already started {started} sub-agents, the most it may; answer yourself"
    return None


# -- budget ------------------------------------------------------------------------------------


def counted_tokens(
    carved: Mapping[str, int], counted: Mapping[str, int], children: Iterable[ObservedChild]
) -> dict[str, int]:
    """Tokens each child counts against the parent, by uid, for the children the parent
    committed (``carved``: their budgets; ``counted``: what it committed as counted before).
    A child's count is the tokens in its status (which only the operator writes, and which
    hold its own children's), at most its carved budget, and never less than counted before:
    a child deleted or gone does not give its tokens back to the parent's budget."""
    seen = {c.uid: c for c in children}
    out: dict[str, int] = {}
    for uid, limit in carved.items():
        before = counted.get(uid, 0)
        child = seen.get(uid)
        now = min(max(child.tokens, 0), limit) if child is not None else 0
        out[uid] = max(before, now)
    return out


@dataclass(frozen=True)
class Carve:
    """The budget of a new child, or why there is none."""

    tokens: int | None
    problem: str | None = None


def carve(
    max_tokens: int | None,
    used: int,
    outstanding: int,
    keep: int,
    wanted: int | None,
    minimum: int,
) -> Carve:
    """The child's ``budget.maxTokens``: ``wanted`` (the tool's declared most) or, when
    unset, all that is left; at most what the parent has left: ``max_tokens`` minus ``used``
    (its own and its children's counted tokens) minus ``outstanding`` (what running
    children's carved budgets may still use) minus ``keep`` (the parent's next turn). Less
    than ``minimum`` (one turn of the child's model) is refused."""
    if max_tokens is None:
        return Carve(wanted)
    left = max_tokens - used - outstanding - keep
    tokens = left if wanted is None else min(wanted, left)
    if tokens < minimum:
        return Carve(
            None,
            f"the token budget leaves {max(left, 0)} tokens for a sub-agent, less than the "
            f"{minimum} one turn of its model may use; answer with what you have",
        )
    return Carve(tokens)


def parent_keeps(
    model: a.ModelEndpoint, ctx: agent_status.ContextStatus, calls: int, config: AgentConfig
) -> int:
    """The ``keep`` of :func:`carve`: most tokens the parent's next turn may use, the turn
    that reads its children's answers. Its prompt is the current turn's request plus this
    turn's output (at most ``maxOutputTokens``) and one result per call (each cut to
    ``tool_result_bytes``), and it may write ``maxOutputTokens`` again; bytes count as in
    :func:`agentrun.core.agent_loop.turn_needs`."""
    grows = model.max_output_tokens + math.ceil(
        calls * config.tool_result_bytes / config.bytes_per_token
    )
    return turn_needs(model, ctx, config) + grows


def outstanding(carved: Mapping[str, int], children: Iterable[ObservedChild]) -> int:
    """What running children may still use of their carved budgets: ``carved`` holds the
    calls whose child has not ended as far as the parent's status says (a child not seen
    yet may use all of its budget; one seen finished nothing more)."""
    seen = {c.uid: c for c in children}
    total = 0
    for uid, limit in carved.items():
        child = seen.get(uid)
        if child is None:
            total += limit
        elif child.phase not in m.TERMINAL_RUN_PHASES:
            total += max(limit - max(child.tokens, 0), 0)
    return total


# -- the child ---------------------------------------------------------------------------------


def goal_of(tool: SubAgentTool, arguments: Mapping[str, Any]) -> str | None:
    """The child's goal from the call's arguments (None: no ``goal`` string)."""
    goal = arguments.get(GOAL_ARGUMENT)
    if not isinstance(goal, str) or not goal.strip():
        return None
    text = f"{tool.preamble}\n\n{goal}" if tool.preamble else goal
    return text[:MAX_GOAL]


def child_spec(
    parent: m.AgentRun, tool: SubAgentTool, goal: str, tokens: int | None
) -> dict[str, Any]:
    """The child's spec (wire form): the goal, the declared agent, the carved budget, and
    the parent's policy and step template. Fields at their defaults are left out: the API
    server fills them in (:func:`spec_digest` compares without them)."""
    spec: dict[str, Any] = {"goal": goal, **tool.child_agent()}
    if tokens is not None:
        spec["budget"] = {"maxTokens": tokens}
    if parent.spec.policy is not None:
        spec["policy"] = parent.spec.policy.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    if parent.spec.step_template is not None:
        spec["stepTemplate"] = parent.spec.step_template.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    return spec


def spec_digest(spec: Mapping[str, Any]) -> str | None:
    """What adoption compares: sha256 of the spec as the API model reads it, fields at their
    defaults left out (so that the defaults the API server fills in do not count); None for
    a spec the model refuses (never adopted)."""
    try:
        parsed = m.AgentRunSpec.model_validate(dict(spec))
    except ValueError:
        return None
    wire = parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True)
    return naming.sha256_text(naming.canonical_json(wire))


SWITCHES = ("cancel", "suspend")
"""The fields of a child's spec the parent sets while it runs (:func:`child_switches`): left out
of what the child's proof covers."""


def proof_bound(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """What a child's proof binds besides the parent's uid and the child's name: the call's
    key (its ``agentrun.dev/call`` annotation) and the digest of its spec without the
    parent's :data:`SWITCHES`; None when the body has no call key or no valid spec (no proof
    can verify)."""
    meta = body.get("metadata") or {}
    key = (meta.get("annotations") or {}).get(ANNOTATION_CALL)
    spec = body.get("spec")
    if not isinstance(key, str) or not key or not isinstance(spec, Mapping):
        return None
    digest = spec_digest({k: v for k, v in spec.items() if k not in SWITCHES})
    return None if digest is None else (key, digest)


def child_manifest(
    parent: m.AgentRun,
    depth: int,
    call_key: str,
    tool: SubAgentTool,
    goal: str,
    tokens: int | None,
) -> dict[str, Any]:
    """The AgentRun the operator creates for a call, owned by ``parent`` (at ``depth``, from
    :attr:`ActingFor.depth`)."""
    meta = parent.metadata
    assert meta.uid is not None and meta.name is not None
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {
            "name": child_name(meta.name, call_key),
            "namespace": meta.namespace,
            "labels": {LABEL_PARENT_UID: meta.uid},
            "annotations": {
                ANNOTATION_CALL: call_key,
                ANNOTATION_DEPTH: str(depth + 1),
            },
            "ownerReferences": [
                {
                    "apiVersion": m.API_VERSION,
                    "kind": m.KIND,
                    "name": meta.name,
                    "uid": meta.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": child_spec(parent, tool, goal, tokens),
    }


def controller_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the AgentRun that controls ``body`` (a plain body): its ownerReference
    of kind AgentRun in this API group with controller true; None when there is none."""
    for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
        if (
            isinstance(owner, Mapping)
            and owner.get("controller") is True
            and owner.get("kind") == m.KIND
            and str(owner.get("apiVersion", "")).split("/")[0] == m.GROUP
        ):
            return str(owner.get("name", "")), str(owner.get("uid", ""))
    return None


def observed_run(body: Mapping[str, Any]) -> ObservedChild:
    """An AgentRun as read from the API (a plain body), for adoption and the family: its
    controller is an ownerReference of kind AgentRun in this API group with controller true.
    The answer is taken only when inline (``status.agent.answer``); one kept by reference is
    for the shell to read and check against ``answerDigest``."""
    meta = body.get("metadata") or {}
    controller = controller_of(body)
    status = body.get("status") or {}
    usage = status.get("usage") or {}
    agent = status.get("agent") or {}
    spec = body.get("spec") or {}
    phase_text = status.get("phase")
    phase = (
        m.RunPhase(phase_text)
        if isinstance(phase_text, str) and phase_text in set(m.RunPhase)
        else None
    )
    tokens = usage.get("tokens")
    return ObservedChild(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        controller_uid=(controller[1] or None) if controller else None,
        spec_digest=spec_digest(spec) if isinstance(spec, Mapping) else None,
        phase=phase,
        tokens=tokens if type(tokens) is int and tokens >= 0 else 0,
        answer=agent.get("answer") if isinstance(agent.get("answer"), str) else None,
        message=status.get("message") if isinstance(status.get("message"), str) else None,
        cancel=spec.get("cancel") is True,
        suspend=spec.get("suspend") is True,
    )


def adopt(found: ObservedChild, parent_uid: str, expected_digest: str | None) -> Adopted | Refused:
    """Whether the AgentRun found under a child's name is the call's child."""
    if found.controller_uid != parent_uid:
        return Refused(
            CHILD_NAME_TAKEN,
            f"the AgentRun {found.name} is not controlled by this run; it was left alone and "
            "the call was not run",
        )
    if not found.proven:
        return Refused(
            CHILD_NAME_TAKEN,
            f"the AgentRun {found.name} holds the name of the call's child but was not created "
            "by the operator (it carries no valid agentrun.dev/proof, or its admission record "
            "names another creator): someone else made it under that name; it was left alone "
            "and the call was not run",
        )
    if found.spec_digest is None or found.spec_digest != expected_digest:
        return Refused(
            CHILD_NAME_TAKEN,
            f"the AgentRun {found.name} is controlled by this run but its spec is not the one "
            "the call would make; it was left alone and the call was not run",
        )
    return Adopted(found.uid)


# -- whose rights a child uses -----------------------------------------------------------------


@dataclass(frozen=True)
class ActingFor:
    """The user (and groups, as recorded: JSON text) whose rights a run's steps use, and the
    runs it was found through (the run itself first)."""

    user: str
    groups: str | None
    via: tuple[str, ...]

    @property
    def depth(self) -> int:
        """The run's depth: 0 for a user's run, 1 for its child, and so on."""
        return len(self.via) - 1


def _controller(body: Mapping[str, Any]) -> str | None:
    found = controller_of(body)
    return (found[1] or None) if found else None


def acting_creator(
    chain: Sequence[Mapping[str, Any]],
    operator_user: str,
    limits: Limits,
    proven: Callable[[Mapping[str, Any], str], bool],
) -> ActingFor | Refused:
    """Whose rights the steps of ``chain[0]`` use. ``chain`` is the run as read, then the
    run found by the uid of its controller ownerReference, then that one's, as far as the
    shell followed them (at most ``max_depth`` above the run).

    A run the admission recorded as created by someone else than the operator acts for that
    creator. A run created by the operator (a sub-agent) acts for its parent's creator, but
    only when it is the child the parent would make: its controller is the next run of the
    chain by uid, the call key it carries begins with that run's uid, and its name is
    :func:`child_name` of that run's name and that key (names cannot change, so an editor who
    points a child's ownerReference at another run does not get that run's creator), and
    ``proven(body, owner_uid)`` (the shell's check of the operator's proof) holds. Anything
    else is refused: the operator never lends its own rights."""
    if not chain:
        return Refused("Forbidden", "no run to act for")
    via: list[str] = []
    for index, body in enumerate(chain):
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        name = str(meta.get("name", ""))
        via.append(name)
        user = annotations.get(m.ANNOTATION_CREATED_BY)
        if not isinstance(user, str) or not user:
            return Refused("Forbidden", f"the run {name} has no recorded creator")
        if user != operator_user:
            groups = annotations.get(m.ANNOTATION_CREATED_BY_GROUPS)
            return ActingFor(user, groups if isinstance(groups, str) else None, tuple(via))
        if index >= limits.max_depth:
            break
        owner = chain[index + 1] if index + 1 < len(chain) else None
        owner_meta = (owner or {}).get("metadata") or {}
        owner_uid = str(owner_meta.get("uid", ""))
        key = annotations.get(ANNOTATION_CALL)
        if (
            owner is None
            or not owner_uid
            or _controller(body) != owner_uid
            or not isinstance(key, str)
            or not key.startswith(f"{owner_uid}:")
            or name != child_name(str(owner_meta.get("name", "")), key)
            or not proven(body, owner_uid)
        ):
            return Refused(
                "Forbidden",
                f"the run {name} was created by the operator but is not the sub-agent of a run "
                "it controls by uid and call; the operator never lends its own rights",
            )
    return Refused(
        "Forbidden",
        f"the runs {' -> '.join(via)} were all created by the operator, deeper than the "
        f"{limits.max_depth} levels of sub-agents allowed; none acts for a user",
    )


# -- while the child runs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """The call's outcome from its child: ``done`` with ``answer`` (the tool's result) or
    ``error`` (what the model reads); not done while the child runs."""

    done: bool
    answer: str | None = None
    error: str | None = None


def child_outcome(uid: str, children: Sequence[ObservedChild]) -> Outcome:
    """The outcome of the call whose child has ``uid``: read from that child only. A child
    gone (deleted, or replaced by another of the same name) ends the call with an error."""
    child = next((c for c in children if c.uid == uid), None)
    if child is None:
        return Outcome(True, error="the sub-agent's run is gone (deleted before it answered)")
    if child.phase == m.RunPhase.SUCCEEDED:
        if child.answer is None:
            return Outcome(False)  # its answer not read yet
        return Outcome(True, answer=child.answer)
    if child.phase in (m.RunPhase.FAILED, m.RunPhase.CANCELLED):
        why = child.message or "no message"
        return Outcome(True, error=f"the sub-agent's run {child.name} {child.phase}: {why}")
    return Outcome(False)


@dataclass(frozen=True)
class Switch:
    """Set ``spec.cancel`` and ``spec.suspend`` of one child."""

    name: str
    uid: str
    cancel: bool
    suspend: bool


def child_switches(
    parent_cancelled: bool,
    parent_suspended: bool,
    children: Iterable[ObservedChild],
    carved: Mapping[str, int],
) -> list[Switch]:
    """The children whose switches must change: a cancelled parent cancels every child not
    finished; a child's ``suspend`` follows its parent's (suspend the parent to hold the
    family: set on a child alone it is undone, since the parent waits for that child); and a
    child that counted more tokens than the budget carved for it (its own budget raised by
    an editor of the child) is cancelled, so a family never spends more than the parent's
    budget by more than one turn of a child."""
    out: list[Switch] = []
    for child in children:
        if child.phase in m.TERMINAL_RUN_PHASES:
            continue
        limit = carved.get(child.uid)
        over = limit is not None and child.tokens > limit
        cancel = child.cancel or parent_cancelled or over
        suspend = parent_suspended
        if (cancel, suspend) != (child.cancel, child.suspend):
            out.append(Switch(child.name, child.uid, cancel, suspend))
    return out


# -- the family ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One run of a family as ``kubectl agentrun tree`` shows it. ``tokens`` is the run's
    ``status.usage.tokens``: its own and those of its sub-agents (and theirs), as counted
    against its budget (:func:`counted_tokens`)."""

    name: str
    uid: str
    depth: int
    phase: str
    tokens: int
    children: tuple[Member, ...] = field(default_factory=tuple)


def family(root: ObservedChild, runs: Sequence[ObservedChild], limit: int = 256) -> Member:
    """The run ``root`` and the runs controlled by it, by its children, and so on (by
    controller uid; a run is shown once, and at most ``limit`` runs in all)."""
    by_owner: dict[str, list[ObservedChild]] = {}
    for run in runs:
        if run.controller_uid is not None:
            by_owner.setdefault(run.controller_uid, []).append(run)
    seen: set[str] = set()

    def member(run: ObservedChild, depth: int) -> Member:
        seen.add(run.uid)
        kids: list[Member] = []
        for kid in sorted(by_owner.get(run.uid, []), key=lambda r: r.name):
            if kid.uid in seen or len(seen) >= limit:
                continue
            kids.append(member(kid, depth + 1))
        return Member(
            run.name, run.uid, depth, str(run.phase or "Pending"), run.tokens, tuple(kids)
        )

    return member(root, 0)


TREE_HEADERS = ("RUN", "PHASE", "TOKENS (WITH SUB-AGENTS)")
"""The columns of :func:`tree_rows`: a run's tokens hold its sub-agents' (:class:`Member`)."""


def tree_rows(root: Member) -> list[list[str]]:
    """The family as rows (:data:`TREE_HEADERS`), parents before their children: the name
    indented two spaces a level, the phase, and the run's tokens, which already hold those of
    the runs below it (never added to them again: the top row is the family's total)."""
    rows: list[list[str]] = []

    def walk(node: Member) -> None:
        rows.append(["  " * node.depth + node.name, node.phase, str(node.tokens)])
        for kid in node.children:
            walk(kid)

    walk(root)
    return rows
