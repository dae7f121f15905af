"""Print the largest status size seen while driving plans of several sizes to the end, and an
agent run of 300 turns with 3 tool calls a turn (and what the model sees at its last turn).

uv run python hack/measure-status-size.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_agent_status_size import measure_agent_run
from tests.unit.test_status_size import largest_status_for

for n in (10, 128, 500):
    size, phase = largest_status_for(n)
    print(f"{n:4d} steps: largest status {size:8d} bytes ({size / 1024:.1f} KiB), ended {phase}")

agent = measure_agent_run(300, 3)
print(
    f"agent, {agent.turns} turns x 3 tool calls: largest status {agent.largest_status:8d} bytes "
    f"({agent.largest_status / 1024:.1f} KiB), ended {agent.phase}"
)
print(
    f"  context of turn {agent.turns}: {agent.context_bytes} bytes in {agent.context_messages} "
    f"messages; {agent.paged_results} tool results by summary, {agent.omitted_turns} oldest "
    "turns left out"
)
