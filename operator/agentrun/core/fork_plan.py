"""Planning a fork (``kubectl agentrun fork RUN --from STEP|TURN``,
:meth:`agentrun.clients.typed.AgentRunClient.fork`): pure functions, no API calls; making it is
:mod:`agentrun.clients.forks`.

A fork is a new run with the same spec that starts again at one step. Every step of the old
run that Succeeded and is neither that step nor downstream of it keeps its result: the new
run gets it in ``spec.carriedResults`` and the operator marks it Succeeded without a Job.
A result kept in a ConfigMap is copied into a ConfigMap owned by the new run, so deleting the
old run loses nothing.

A fork of an agent run from a turn N (a number) continues its conversation after turn N: the
new run has ``spec.agent.resumeFrom`` naming the old run (name and uid) and N, and carries
the results of every plan step that succeeded (the plan ran before the conversation, which
holds its results already). The operator reads the conversation from the old run's records,
never from the new run's spec.

A fork copies the old run's spec, so it is refused when the old run's ``spec.agent`` no longer
matches what its turns used (``status.agent.frozen``, :mod:`agentrun.core.frozen`): a run that
failed with reason AgentSpecChanged holds an endpoint someone else wrote, and a fork would send
the forking person's key there.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.api import models as m
from agentrun.core import frozen as freezing
from agentrun.core import naming
from agentrun.core import resume as resuming
from agentrun.core.graph import downstream

_DNS_LABEL = re.compile(m.DNS_LABEL_PATTERN)
ANNOTATION_FORKED_FROM = f"{m.GROUP}/forked-from"
"""On a forked run: ``namespace/name`` of the run it was forked from, and the step or turn."""


@dataclass(frozen=True)
class Carry:
    """One step whose result the fork keeps."""

    step: str
    status: m.StepStatus
    copy_name: str | None = None
    """The ConfigMap of the new run the result is copied into (results kept by reference)."""


@dataclass(frozen=True)
class ForkPlan:
    """What a fork of ``source`` at ``from_step`` keeps and what it runs again."""

    source: str
    """``namespace/name`` of the run forked."""
    name: str
    from_step: str | None
    carry: list[Carry] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    """Steps the new run runs, in plan order."""
    from_turn: int | None = None
    """An agent run's turn the new run continues the conversation after."""
    source_uid: str = ""

    @property
    def starts_at(self) -> str:
        """``step S`` or ``turn N``, for messages."""
        return f"turn {self.from_turn}" if self.from_turn is not None else f"step {self.from_step}"


def suffixed(run: str, tail: str) -> str:
    """``RUN`` + ``tail``, with RUN shortened so that the whole stays within 63 characters
    (the operator puts the run's name in label values, which allow no more)."""
    return run[: naming.MAX_NAME - len(tail)].rstrip("-.") + tail


def default_name(run: str, suffix: str) -> str:
    """``RUN-fork-xxxx`` (:func:`suffixed`)."""
    return suffixed(run, f"-fork-{suffix}")


def copy_name(new_run: str, step: str) -> str:
    """``<NEW>-carried-<step>``, or a shortened, hashed form of it to stay a DNS label."""
    plain = f"{new_run}-carried-{step}"
    if len(plain) <= naming.MAX_NAME and _DNS_LABEL.match(plain):
        return plain
    digest = hashlib.sha256(f"{new_run}\x00{step}".encode()).hexdigest()[:8]
    return naming.dns_label(f"{new_run}-carried-{step}", digest)


def turn_of(run: m.AgentRun, value: str) -> int | None:
    """The turn ``--from VALUE`` names: a number, for an agent run that has no plan step of
    that name; None when it names a step."""
    if run.spec.agent is None or not value.isdigit() or run.step(value) is not None:
        return None
    return int(value)


def agent_problem(run: m.AgentRun, copy: str = "a fork") -> str | None:
    """Why ``run``'s spec cannot be copied into ``copy`` (a new run): its spec.agent changed
    after the run started, so it is not what the run's turns used (None: it is, or nothing was
    frozen)."""
    ag = run.status.agent if run.status else None
    if ag is None or ag.frozen is None:
        return None
    changed = freezing.changes(run.spec.agent, ag.frozen)
    if not changed:
        return None
    return (
        f"its {', '.join(changed)} changed after it started, so its spec is not what its "
        f"turns used and {copy} would copy the change; create a new run instead"
    )


def plan_turn(run: m.AgentRun, turn: int, name: str) -> ForkPlan:
    """A fork continuing the conversation of agent run ``run`` after ``turn``: every plan step
    that succeeded is carried. ``ValueError`` (a message for people) when ``run`` did not close
    that turn (the operator checks again, against its committed records)."""
    where = f"agentrun/{run.metadata.name}"
    problem = agent_problem(run) or resuming.turn_problem(run, turn, where)
    if problem is None and turn == resuming.answered_in(run):
        # The operator continues after an answer with the new run's goal as the next
        # question; a fork keeps the old goal, which would ask the same question again.
        earlier = (
            f"fork from an earlier turn (1 to {turn - 1})" if turn > 1 else "it has no earlier turn"
        )
        problem = (
            f"{where} answered in turn {turn}: a fork keeps its goal, so nothing new follows "
            f"the answer; ask it the next question instead (kubectl agentrun ask "
            f"{run.metadata.name} QUESTION), or {earlier}"
        )
    if problem is not None:
        raise ValueError(f"cannot fork {where} from turn {turn}: {problem}")
    carry, rerun = _carry_or_rerun(run, name)
    return ForkPlan(
        source=f"{run.metadata.namespace}/{run.metadata.name}",
        name=name,
        from_step=None,
        carry=carry,
        rerun=rerun,
        from_turn=turn,
        source_uid=run.metadata.uid,
    )


def _carry_or_rerun(
    run: m.AgentRun, name: str, again: Collection[str] = ()
) -> tuple[list[Carry], list[str]]:
    """The steps fork ``name`` carries (each that succeeded and is not in ``again``) and those
    it runs, in plan order."""
    statuses = {st.name: st for st in (run.status.steps if run.status else None) or []}
    carry: list[Carry] = []
    rerun: list[str] = []
    for step in run.spec.plan.steps:
        st = statuses.get(step.name)
        if step.name in again or st is None or st.phase != m.StepPhase.SUCCEEDED:
            rerun.append(step.name)
            continue
        target = copy_name(name, step.name) if st.result_ref is not None else None
        carry.append(Carry(step.name, st, target))
    return carry, rerun


def plan(run: m.AgentRun, from_step: str, name: str) -> ForkPlan:
    """Which steps the fork carries and which it runs. ``ValueError`` (a message for people)
    when ``from_step`` is not a step of the plan."""
    steps = run.spec.plan.steps
    names = [st.name for st in steps]
    problem = agent_problem(run)
    if problem is not None:
        raise ValueError(f"cannot fork agentrun/{run.metadata.name}: {problem}")
    if from_step not in names:
        raise ValueError(
            f"step '{from_step}' is not a step of agentrun/{run.metadata.name} "
            f"(its steps: {', '.join(names)})"
        )
    carry, rerun = _carry_or_rerun(run, name, again=downstream(steps, from_step))
    return ForkPlan(
        source=f"{run.metadata.namespace}/{run.metadata.name}",
        name=name,
        from_step=from_step,
        carry=carry,
        rerun=rerun,
    )


def carried_result(fork: ForkPlan, carry: Carry, content: str | None) -> dict[str, Any]:
    """The ``spec.carriedResults`` entry of one carried step. ``content`` is the full result
    (read from the old run's ConfigMap for results kept by reference)."""
    st = carry.status
    entry: dict[str, Any] = {"step": carry.step, "fromRun": fork.source}
    if st.args_hash:  # the operator carries the result only for these same arguments
        entry["argsHash"] = st.args_hash
    if st.summary:
        entry["summary"] = st.summary[:1024]
    if carry.copy_name is not None and st.result_ref is not None:
        entry["resultRef"] = {
            "kind": "ConfigMap",
            "name": carry.copy_name,
            "key": st.result_ref.key,
        }
    elif st.result is not None:
        entry["result"] = st.result
        content = st.result
    digest = st.result_digest or (naming.sha256_text(content) if content is not None else None)
    if digest:
        entry["resultDigest"] = digest
    return entry


def copied_spec(old: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of run ``old`` (as stored) for a new run: without its decisions
    (``approvals``), switches (``suspend``, ``cancel``) and carried results."""
    spec = copy.deepcopy(dict(old.get("spec") or {}))
    for key in ("approvals", "suspend", "cancel", "carriedResults"):
        spec.pop(key, None)
    return spec


def continuing(spec: dict[str, Any], source: str, uid: str, turn: int) -> None:
    """Make ``spec`` (of an agent run) continue the conversation of ``source`` (its name)
    after ``turn``: ``spec.agent.resumeFrom``, or ``spec.agentRef.resumeFrom`` for a run of an
    Agent (the new run takes the Agent as it is when it starts)."""
    for key in ("agent", "agentRef"):
        agent = spec.get(key)
        if isinstance(agent, dict):
            agent["resumeFrom"] = {"run": source, "uid": uid, "turn": turn}


def manifest(
    old: Mapping[str, Any], name: str, annotations: Mapping[str, str], spec: dict[str, Any]
) -> dict[str, Any]:
    """A new AgentRun ``name`` with ``spec``, ``annotations`` and run ``old``'s labels (but
    the operator's own, ``agentrun.dev/...``)."""
    meta = old.get("metadata") or {}
    labels = {
        k: v for k, v in (meta.get("labels") or {}).items() if not k.startswith(f"{m.GROUP}/")
    }
    metadata: dict[str, Any] = {"name": name, "annotations": dict(annotations)}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": metadata, "spec": spec}


def new_run(
    old: Mapping[str, Any], fork: ForkPlan, carried: list[dict[str, Any]]
) -> dict[str, Any]:
    """The new AgentRun: the old spec without decisions and switches, suspended until the
    carried results are copied, with the carried results (fixed at creation)."""
    spec = copied_spec(old)
    spec["suspend"] = True
    if carried:
        spec["carriedResults"] = carried
    if fork.from_turn is not None:
        continuing(spec, fork.source.partition("/")[2], fork.source_uid, fork.from_turn)
    annotations = {ANNOTATION_FORKED_FROM: f"{fork.source} at {fork.starts_at}"}
    return manifest(old, fork.name, annotations, spec)
