"""A turn's context document as the loop stored it (agentrun.core.context.Stored), kept by the
shell beside what it wrote (agentrun.loop.written) and given to the core
(``Observed.contexts``): the pass that closes the turn continues from it rather than parsing
the parts again, only when the parts read are the ones it was stored as, and with the same
result as parsing them."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any
from unittest import mock

from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.core import Observed
from agentrun.core import context as cx
from agentrun.loop.common import Apis
from agentrun.loop.observe import Observer
from agentrun.loop.written import Written
from agentrun.settings import Settings
from tests.support.agent_sim import AgentSim, agent_run, call, tool_envelope

EARLIER_LOST = "[the earlier context could not be read]"


def _context(turns: int = 3) -> cx.Context:
    """A context of a few turns, paged to a small limit, as the loop makes one."""
    ctx = cx.Context(
        turn=1,
        messages=cx.first_messages("Be brief.", "goal é"),
        tools=cx.tool_definitions([("echo", "Echoes.", {"type": "object", "properties": {}})]),
    )
    for turn in range(1, turns + 1):
        output = cx.Output("", (cx.ToolCall(f"c{turn}", "echo", "{}"),))
        added = [
            cx.assistant_message(turn, output),
            cx.tool_message(turn, f"c{turn}", "r" * 300, f"turn {turn}: 300 bytes"),
        ]
        ctx = cx.page(ctx.extended(turn + 1, added, previous=f"digest-{turn}"), 900)
    return ctx


def test_a_stored_document_is_the_document_its_parts_read_back_as() -> None:
    ctx = _context()
    assert ctx.paged_results > 0
    stored = cx.Stored.of(ctx)
    assert (list(stored.parts), stored.digest) == ctx.encoded()
    parts = [json.loads(json.dumps(p)) for p in stored.parts]  # equal text, other objects
    taken = stored.document(parts, stored.digest)
    read = cx.Context.from_parts(parts)
    assert taken is not None and not isinstance(read, str)
    assert taken == read
    assert (taken.sizes, taken.to_json()) == (read.sizes, read.to_json())
    # A copy: what its taker changes is not the document kept.
    taken.messages.append({"role": "user", "content": "more"})
    assert taken.sizes is not None and taken.texts is not None
    taken.sizes.append(9)
    taken.texts.append("{}")
    taken.tools.clear()
    assert stored.context == ctx and stored.context.to_json() == "".join(stored.parts)


def test_a_stored_document_is_not_taken_for_other_parts_or_another_digest() -> None:
    stored = cx.Stored.of(_context())
    changed = json.loads("".join(stored.parts))
    changed["messages"][1]["content"] = "another goal"
    assert stored.document([json.dumps(changed)], stored.digest) is None
    assert stored.document([*stored.parts, ""], stored.digest) is None
    assert stored.document(list(stored.parts), "0" * 64) is None
    assert stored.document(list(stored.parts), stored.digest) is not None


# -- the loop ----------------------------------------------------------------------------------


@dataclasses.dataclass
class _NothingKept(AgentSim):
    """A shell that keeps no document (after a restart, or once it dropped them)."""

    def observed(self) -> Observed:
        return dataclasses.replace(super().observed(), contexts={})


def _turns(sim: AgentSim, turns: int) -> None:
    for turn in range(1, turns + 1):
        sim.answer(f"turn {turn}", [call("search", {"query": f"q{turn}"}, f"c{turn}")])
        sim.tools_return(lambda job: (True, tool_envelope("r" * 600, f"{job.step}: 600 r")))


def test_a_run_goes_on_the_same_whether_its_documents_are_kept_or_read_again() -> None:
    runs = [AgentSim(agent_run(contextBytes=a.MIN_CONTEXT_BYTES, maxTurns=30))]
    runs.append(_NothingKept(agent_run(contextBytes=a.MIN_CONTEXT_BYTES, maxTurns=30)))
    parsed: list[int] = []
    from_parts = cx.Context.from_parts

    def counted(parts: Any) -> cx.Context | str:
        parsed.append(1)
        return from_parts(parts)

    counts = []
    for sim in runs:
        parsed.clear()
        with mock.patch.object(cx.Context, "from_parts", side_effect=counted):
            _turns(sim, 20)
        counts.append(len(parsed))
    kept, read = runs
    assert kept.records == read.records  # every context and transcript record, digests and all
    assert kept.status.agent == read.status.agent
    assert kept.agent.context.omitted_turns > 0 and kept.agent.context.paged_results > 0
    assert counts == [0, 20], "the loop parses a context only when its document is not kept"


def test_a_context_changed_under_the_operator_is_detected_though_its_document_is_kept() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c1")])
    ctx = sim.agent.context
    assert sim.agent.stage == agent_status.AgentStage.ACTING and ctx.name in sim.contexts
    document = json.loads(sim.records[ctx.name]["part-0"])
    document["messages"][1]["content"] = "a goal someone else wrote"
    sim.records[ctx.name] = {"part-0": json.dumps(document)}
    sim.tools_return()
    nxt = sim.context()
    assert sim.agent.turn == 2
    assert [msg["content"] for msg in nxt.messages[:1]] == [EARLIER_LOST]
    assert all("someone else" not in json.dumps(msg) for msg in nxt.messages)


# -- the shell ---------------------------------------------------------------------------------


def test_the_documents_kept_are_bounded_apart_and_go_with_their_data() -> None:
    stored = cx.Stored.of(_context(1))
    written = Written(max_bytes=100, max_document_bytes=50)
    written.remember("ns", "a", {"k": "x" * 19}, stored)  # 20 characters with the key
    written.remember("ns", "b", {"k": "x" * 19}, stored)
    assert written.document("ns", "a") is stored  # a is now the more recently used
    written.remember("ns", "c", {"k": "x" * 19}, stored)
    assert written.document("ns", "b") is None and written.get("ns", "b") is not None
    assert written.document("ns", "a") is stored and written.document("ns", "c") is stored
    # Data kept but too large for a document kept; a's data goes (the least recently used of
    # the data), and its document with it.
    written.remember("ns", "d", {"k": "x" * 59}, stored)
    assert written.get("ns", "d") is not None and written.document("ns", "d") is None
    assert written.get("ns", "a") is None and written.document("ns", "a") is None
    assert written.document("ns", "c") is stored
    written.remember("ns", "e", {"k": "x" * 29}, stored)  # c's data goes, and b's
    assert written.document("ns", "c") is None and written.document("ns", "e") is stored
    assert written.size == 90 and len(written) == 2
    written.forget("ns", "e")
    assert written.document("ns", "e") is None
    written.remember("ns", "c", {"k": "y"})  # written again without one: none kept
    assert written.document("ns", "c") is None


def test_the_shell_gives_the_core_the_documents_it_keeps_with_the_parts() -> None:
    sim = AgentSim(agent_run())
    sim.answer("", [call("search", {"query": "x"}, "c1")])
    ctx = sim.agent.context
    apis = Apis(core=mock.Mock(), batch=mock.Mock(), custom=mock.Mock())
    observer = Observer(apis, Settings(), mock.Mock(), None, mock.Mock(), threading.Lock())
    ns = sim.run.metadata.namespace
    observer.written.remember(ns, ctx.name, sim.records[ctx.name], sim.contexts[ctx.name])
    observed = observer._with_documents(sim.run, Observed())
    assert observed.contexts == {ctx.name: sim.contexts[ctx.name]}
    assert observed.documents[(ctx.name, "part-0")] == sim.records[ctx.name]["part-0"]
    observer.written.forget(ns, ctx.name)
    apis.core.read_namespaced_config_map.return_value = mock.Mock(
        data=json.dumps({"data": sim.records[ctx.name]})
    )
    observed = observer._with_documents(sim.run, Observed())
    assert observed.contexts == {} and (ctx.name, "part-0") in observed.documents
