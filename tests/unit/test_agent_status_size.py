"""Status stays bounded for long agent runs (invariant 7 of docs/design.md): a closed turn's
steps leave status for its transcript record, and only counters, the current turn and the last
turns' summaries stay."""

from __future__ import annotations

import json
from dataclasses import dataclass

from agentrun.api import models as m
from tests.support.agent_sim import AgentSim, agent_run, call, tool_envelope

LIMIT = 256 * 1024


@dataclass(frozen=True)
class Measured:
    largest_status: int
    phase: m.RunPhase
    turns: int
    context_bytes: int
    context_messages: int
    paged_results: int
    omitted_turns: int


def measure_agent_run(turns: int = 300, calls: int = 3) -> Measured:
    """Drive an agent run of ``turns`` turns with ``calls`` parallel tool calls each (every
    result 1 KiB, over the inline limit, so kept by reference), the model answering in the
    last; return the largest status seen and what the last turn's context held."""
    sim = AgentSim(agent_run(name="a-rather-long-run-name-for-measuring-status", maxTurns=turns))
    largest = 0

    def measure() -> None:
        nonlocal largest
        largest = max(largest, len(json.dumps(sim.status.to_wire())))

    for turn in range(1, turns):
        sim.answer(
            f"turn {turn}: looking further",
            [call("search", {"query": f"q{turn}-{i}"}, f"call-{turn}-{i}") for i in range(calls)],
        )
        measure()
        sim.tools_return(
            lambda job: (True, tool_envelope("x" * 1024, f"{job.step}: 1 KiB of findings"))
        )
        measure()
    context = sim.context()
    sim.answer("the answer")
    measure()
    return Measured(
        largest_status=largest,
        phase=sim.status.phase or m.RunPhase.PENDING,
        turns=len(sim.transcript()),
        context_bytes=context.bytes,
        context_messages=len(context.messages),
        paged_results=context.paged_results,
        omitted_turns=context.omitted_turns,
    )


def test_status_of_a_long_agent_run_stays_small_and_stops_growing() -> None:
    """hack/measure-status-size.py drives 300 turns (about half a minute here); 40 show the
    same: after the first turns fill the ring of recent turns and the history, status does
    not grow with the number of turns."""
    short = measure_agent_run(20, 3)
    long = measure_agent_run(40, 3)
    assert long.phase == m.RunPhase.SUCCEEDED and long.turns == 40
    assert long.largest_status < LIMIT // 8, f"status grew to {long.largest_status} bytes"
    assert long.largest_status - short.largest_status < 512, (short, long)
    assert long.context_bytes <= 64 * 1024
