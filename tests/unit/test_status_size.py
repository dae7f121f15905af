"""Status stays bounded for large plans (invariant 7 of docs/design.md): results over the
inline limit go by reference, history is a ring, messages are truncated."""

from __future__ import annotations

import json

from agentrun.api import models as m
from tests.support.sim import Sim, make_run, step

ETCD_LIMIT = 1536 * 1024


def largest_status_for(n_steps: int, width: int = 10) -> tuple[int, m.RunPhase]:
    """Drive an n-step plan (layers of ``width`` parallel steps) to the end, every step
    returning a result right at the inline limit, and return the largest status seen."""
    steps = []
    for i in range(n_steps):
        layer = i // width
        deps = [f"step-{(layer - 1) * width + j:03d}" for j in range(width)] if layer else []
        steps.append(step(f"step-{i:03d}", *deps[:3]))
    run = make_run(steps[:1], name="a-rather-long-run-name-for-measuring-status")
    # Built without the API's maxItems so the core can be measured past the CRD's limit.
    plan = m.Plan.model_construct(steps=[m.Step.model_validate(s) for s in steps])
    run.spec = run.spec.model_copy(update={"plan": plan})
    sim = Sim(run)
    inline = "r" * sim.config.inline_result_limit
    largest = 0
    for _ in range(4 * n_steps):
        sim.tick()
        largest = max(largest, len(json.dumps(sim.status.to_wire())))
        if sim.status.phase in m.TERMINAL_RUN_PHASES:
            break
        for job in sim.active():
            sim.finish(
                job.name,
                True,
                json.dumps({"ok": True, "summary": "s" * 300, "result": inline[:-2]}),
            )
    return largest, sim.status.phase or m.RunPhase.PENDING


def test_status_of_the_largest_admissible_plan_stays_small() -> None:
    size, phase = largest_status_for(m.MAX_STEPS)
    assert phase == m.RunPhase.SUCCEEDED
    assert size < ETCD_LIMIT // 8, f"status grew to {size} bytes"


def test_status_of_a_500_step_plan_stays_far_below_the_etcd_limit() -> None:
    size, phase = largest_status_for(500)
    assert phase == m.RunPhase.SUCCEEDED
    assert size < ETCD_LIMIT // 2, f"status grew to {size} bytes"
