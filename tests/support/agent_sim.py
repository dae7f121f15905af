"""The in-memory cluster of :mod:`tests.support.sim`, for agent runs: it also keeps the loop's
records (transcript and context ConfigMaps) and hands the core exactly the documents it asks
for, as the shell does. Helpers build agent runs and the envelopes of model turns and tools.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.access import authz
from agentrun.api import models as m
from agentrun.core import Observed, ResumeSource, envelope, subagents, turns
from agentrun.core import agent_loop as loop
from agentrun.core import context as cx
from agentrun.core.actions import CreateChild, PatchChild, StoreRecord
from agentrun.core.naming import canonical_json
from agentrun.observation import conversation as resume

from . import agents, child_proofs
from .sim import UID, Sim, SimJob

SEARCH = agents.search({"image": "ghcr.io/acme/search:1", "command": ["search"]})
"""The search tool of in-memory runs (its image never runs)."""
RESTART = agents.restart({"image": "ghcr.io/acme/ops:1", "command": ["restart"]})
"""The restart tool of in-memory runs."""


def agent_run(
    *,
    tools: Sequence[dict[str, Any]] = (SEARCH,),
    plan: Sequence[dict[str, Any]] = (),
    name: str = "agent",
    model: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **agent: Any,
) -> m.AgentRun:
    """An agent run with these tools (and plan steps before the agent)."""
    body: dict[str, Any] = {
        "goal": "find out why checkout is slow",
        "agent": {
            "model": model or {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"},
            "instructions": "You are an SRE. Use the tools.",
            "tools": list(tools),
            **agent,
        },
        **(spec or {}),
    }
    if plan:
        body["plan"] = {"steps": list(plan)}
    return m.AgentRun.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": UID, "generation": 1},
            "spec": body,
        }
    )


def call(name: str, arguments: Any, call_id: str | None = None) -> cx.ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return cx.ToolCall(call_id or f"call-{name}-{abs(hash(text)) % 10_000}", name, text)


def turn_envelope(
    content: str = "",
    calls: Sequence[cx.ToolCall] = (),
    prompt: int = 100,
    completion: int = 20,
    finish: str | None = None,
    packed: bool = False,
) -> str:
    """The termination message of a model turn, as ``agentrun step llm`` writes it (with its
    result compressed, ``resultZ``, when ``packed``)."""
    output = cx.Output(
        content=content,
        tool_calls=tuple(calls),
        finish_reason=finish or ("tool_calls" if calls else "stop"),
        prompt_tokens=prompt,
        completion_tokens=completion,
        model="scripted",
    )
    body: dict[str, Any] = {
        "ok": True,
        "summary": cx.output_summary(output),
        "result": cx.output_result(output),
        "usage": {"tokens": prompt + completion},
    }
    if packed:
        body[envelope.RESULT_Z] = envelope.compress_result(canonical_json(body.pop("result")))
    return json.dumps(body)


def tool_envelope(result: str, summary: str | None = None) -> str:
    body: dict[str, Any] = {"ok": True, "result": result}
    if summary is not None:
        body["summary"] = summary
    return json.dumps(body)


def _observed_child(body: dict[str, Any]) -> subagents.ObservedChild:
    """A child as the shell observes it: with whether it carries the operator's proof."""
    child = subagents.observed_run(body)
    parent = child.controller_uid
    return dataclasses.replace(
        child, proven=parent is not None and child_proofs.proven(body, parent)
    )


@dataclass
class AgentSim(Sim):
    records: dict[str, dict[str, str]] = field(default_factory=dict)
    record_kinds: dict[str, str] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)
    read_resume: Callable[[m.AgentRun], ResumeSource | None] | None = None
    """The shell's read of the conversation spec.agent.resumeFrom names (:class:`Sources`)."""
    children: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Child AgentRuns by name, as the API server holds them (bodies)."""
    child_creates: list[str] = field(default_factory=list)
    """Every CreateChild carried out, by name (a repeated one met AlreadyExists)."""
    depth: int = 0
    contexts: dict[str, cx.Stored] = field(default_factory=dict)
    """The context documents as the core stored them, by ConfigMap name, which the shell keeps
    beside what it wrote (Observed.contexts); a test may drop or change them."""

    def observed(self) -> Observed:
        base = super().observed()
        stored = {**self.results, **self.records}
        documents: dict[tuple[str, str], str] = {}
        contexts: dict[str, cx.Stored] = {}
        for key in loop.wanted_documents(self.run):
            self.asked.append(key)
            value = stored.get(key[0], {}).get(key[1])
            if value is not None:
                documents[key] = value
            if key[0] in self.contexts:
                contexts[key[0]] = self.contexts[key[0]]
        source = self.read_resume(self.run) if self.read_resume is not None else None
        ag = self.run.status.agent if self.run.status else None
        in_flight = any(c.child for c in (ag.calls if ag is not None else None) or [])
        children = (
            tuple(_observed_child(body) for body in self.children.values()) if in_flight else None
        )
        return dataclasses.replace(
            base,
            documents=documents,
            contexts=contexts,
            resume=source,
            children=children,
            depth=self.depth,
        )

    def config_maps(self) -> dict[str, dict[str, Any]]:
        """The run's records as the API server returns them: controlled by the run."""
        owner = {"apiVersion": m.API_VERSION, "kind": m.KIND, "name": self.run.metadata.name,
                 "uid": self.run.metadata.uid, "controller": True}  # fmt: skip
        return {
            name: {
                "metadata": {"name": name, "namespace": "default", "ownerReferences": [owner]},
                "data": dict(data),
            }
            for name, data in {**self.results, **self.records}.items()
        }

    def apply(self, action: object) -> None:
        if isinstance(action, CreateChild):
            body = json.loads(json.dumps(dict(action.manifest)))
            name = body["metadata"]["name"]
            self.child_creates.append(name)
            if name not in self.children:
                body["metadata"]["uid"] = f"child-uid-{len(self.children)}"
                self.children[name] = child_proofs.sign(body, self.run.metadata.uid or "")
            return
        if isinstance(action, PatchChild):
            body = self.children.get(action.name)
            if body is not None and body["metadata"]["uid"] == action.uid:
                body["spec"]["cancel"] = action.cancel
                body["spec"]["suspend"] = action.suspend
            return
        if isinstance(action, StoreRecord):
            existing = self.records.get(action.name)
            assert existing is None or existing == dict(action.data), "a record changed"
            self.records[action.name] = dict(action.data)
            self.record_kinds[action.name] = action.kind
            if action.stored is not None:
                self.contexts[action.name] = action.stored
            return
        super().apply(action)

    # -- reading the loop ---------------------------------------------------------------------

    @property
    def agent(self) -> Any:
        assert self.status.agent is not None
        return self.status.agent

    def model_job(self) -> SimJob | None:
        return next((j for j in self.active() if j.step.endswith("-model")), None)

    def tool_jobs(self) -> list[SimJob]:
        return [j for j in self.active() if not j.step.endswith("-model")]

    def transcript(self) -> list[dict[str, Any]]:
        """The turn records, in turn order."""
        names = sorted(n for n, k in self.record_kinds.items() if k == loop.KIND_TRANSCRIPT)
        return [json.loads(self.records[n]["turn"]) for n in names]

    def context(self, turn: int | None = None) -> cx.Context:
        """The context document of ``turn`` (the current one by default)."""
        ctx = self.agent.context
        assert ctx is not None
        if turn is not None and turn != ctx.turn:
            found = [
                n
                for n, k in self.record_kinds.items()
                if k == loop.KIND_CONTEXT and n.endswith(f"-{turn:04d}")
            ]
            assert len(found) == 1, found
            data = self.records[found[0]]
        else:
            data = self.records[ctx.name]
        parts = [data[f"part-{i}"] for i in range(len(data))]
        doc = cx.Context.from_parts(parts)
        assert isinstance(doc, cx.Context), doc
        return doc

    def request(self, turn: int | None = None) -> dict[str, Any]:
        """The chat completion request the model turn of ``turn`` sends (the current one by
        default), as ``agentrun step llm`` builds it from the context and the frozen model."""
        agent = self.run.spec.agent
        assert agent is not None
        model = turns.model_of(agent, self.agent)
        return cx.request_body(
            self.context(turn),
            model.name,
            model.max_output_tokens,
            model.temperature,
            turns.tool_choice_of(agent, self.agent),
        )

    # -- driving it ---------------------------------------------------------------------------

    def settle(self, limit: int = 20) -> None:
        """Tick until nothing changes (:meth:`progress`: and no Job is left to create)."""
        for _ in range(limit):
            before = self.progress()
            self.tick()
            if self.progress() == before:
                return
        raise AssertionError("the run did not settle")

    def progress(self) -> tuple[object, ...]:
        """What a tick that did something changed: the status written, the Jobs made."""
        return (self.version, len(self.jobs))

    def answer(self, content: str = "", calls: Sequence[cx.ToolCall] = (), **usage: Any) -> None:
        """The running model turn returns (``usage``: the keywords of :func:`turn_envelope`);
        then the run settles."""
        self.settle()
        job = self.model_job()
        assert job is not None, f"no model turn running: {self.status.message}"
        self.finish(job.name, True, turn_envelope(content, calls, **usage))
        self.settle()

    def child_ends(
        self, name: str, phase: str = "Succeeded", answer: str | None = None, tokens: int = 0
    ) -> None:
        """The child AgentRun ``name`` ends (or reports ``tokens`` while running); then the
        run settles."""
        body = self.children[name]
        status: dict[str, Any] = {"phase": phase, "usage": {"tokens": tokens}}
        if answer is not None:
            status["agent"] = {"answer": answer}
        if phase == "Failed":
            status["message"] = "the child failed"
        body["status"] = status
        self.version += 1
        self.settle()

    def tools_return(self, outcome: Any = None) -> None:
        """Every running tool call returns (``outcome(job) -> (ok, message)``, default: ok
        with a result naming the call); then the run settles."""
        self.settle()
        for job in self.tool_jobs():
            if outcome is None:
                ok, message = True, tool_envelope(f"result of {job.step}", f"{job.step} done")
            else:
                ok, message = outcome(job)
            self.finish(job.name, ok, message)
        self.settle()


# -- runs that continue another's conversation (spec.agent.resumeFrom) -------------------------

FORK_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


class _Reviews:
    """LocalSubjectAccessReviews answered from a set of denied (verb, resource, name)."""

    def __init__(self, denied: set[tuple[str, str, str]]) -> None:
        self.denied = denied
        self.asked: list[dict[str, Any]] = []

    def create_namespaced_local_subject_access_review(
        self, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.asked.append(body)
        attrs = body["spec"]["resourceAttributes"]
        resource = f"{attrs['resource']}.{attrs['group']}" if attrs["group"] else attrs["resource"]
        allowed = (attrs["verb"], resource, attrs["name"]) not in self.denied
        return {"status": {"allowed": allowed}}


@dataclass
class Sources:
    """The namespace as the shell sees it when it reads a conversation to continue: source
    runs (their :class:`AgentSim`) by name, and ConfigMaps laid over theirs (forgeries,
    edits; None deletes one). :meth:`read` is :func:`agentrun.observation.conversation.read_source`
    against them,
    with the creator's rights from ``denied``."""

    runs: dict[str, AgentSim] = field(default_factory=dict)
    maps: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    reads: list[str] = field(default_factory=list)

    def read_namespaced_config_map(
        self, name: str, namespace: str, _preload_content: bool = True
    ) -> Any:
        self.reads.append(name)
        found: dict[str, Any] | None = None
        for sim in self.runs.values():
            found = sim.config_maps().get(name, found)
        found = self.maps.get(name, found)
        if found is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(found).encode())

    def read_run(self, namespace: str, name: str) -> m.AgentRun | None:
        sim = self.runs.get(name)
        return sim.run.model_copy(deep=True) if sim is not None else None

    def read(self, run: m.AgentRun) -> ResumeSource | None:
        authorizer = authz.Authorizer(_Reviews(self.denied))
        return resume.read_source(run, self, self.read_run, authorizer)


def fork_run(
    source: m.AgentRun,
    turn: int,
    *,
    uid: str | None = None,
    name: str = "fork",
    run_uid: str = FORK_UID,
    creator: str | None = "alice",
    **agent: Any,
) -> m.AgentRun:
    """An agent run with ``source``'s spec that continues its conversation after ``turn``."""
    body = source.spec.to_wire()
    body["agent"] = {
        **body["agent"],
        "resumeFrom": {"run": source.metadata.name, "uid": uid or source.metadata.uid,
                       "turn": turn},
        **agent,
    }  # fmt: skip
    annotations = {m.ANNOTATION_CREATED_BY: creator} if creator else {}
    return m.AgentRun.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": run_uid, "generation": 1,
                         "annotations": annotations},
            "spec": body,
        }
    )  # fmt: skip
