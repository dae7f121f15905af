"""Result envelopes, plan graphs and backoff."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentrun.api import models as m
from agentrun.core import envelope, graph
from agentrun.core.backoff import backoff_seconds
from tests.support.sim import step


def test_json_envelope_is_read() -> None:
    env = envelope.parse(
        json.dumps({"ok": True, "summary": "done", "result": {"a": 1}, "usage": {"tokens": 12}})
    )
    assert env.ok and env.summary == "done" and env.result == '{"a":1}' and env.tokens == 12


def test_plain_text_is_a_result_with_its_first_line_as_summary() -> None:
    env = envelope.parse("line one\nline two\n")
    assert env.ok and env.summary == "line one" and env.result == "line one\nline two"


def test_json_without_ok_is_plain_text() -> None:
    env = envelope.parse('{"value": 3}')
    assert env.result == '{"value": 3}' and env.ok


def test_step_written_reference_is_kept() -> None:
    env = envelope.parse(
        json.dumps({"ok": True, "resultRef": {"name": "cm", "key": "k"}, "resultDigest": "abc"})
    )
    assert env.result_ref == ("cm", "k") and env.result_digest == "abc" and env.result is None


@given(st.text(max_size=5000))
def test_parse_never_raises(text: str) -> None:
    env = envelope.parse(text)
    assert env.summary is None or len(env.summary) <= envelope.SUMMARY_LIMIT


def _steps(*specs: tuple[str, tuple[str, ...]]) -> list[m.Step]:
    return [m.Step.model_validate(step(name, *deps)) for name, deps in specs]


def test_cycle_is_named_in_run_order() -> None:
    steps = _steps(("a", ("c",)), ("b", ("a",)), ("c", ("b",)))
    assert graph.find_cycle(steps) == ["a", "b", "c", "a"]
    assert graph.plan_problems(steps) == ["dependency cycle: a -> b -> c -> a"]


def test_acyclic_plan_has_no_problems() -> None:
    assert graph.plan_problems(_steps(("a", ()), ("b", ("a",)), ("c", ("a", "b")))) == []


def test_problems_are_said_plainly() -> None:
    steps = _steps(("a", ("a",)), ("a", ()), ("b", ("zzz",)))
    problems = graph.plan_problems(steps)
    assert "step name 'a' is used more than once" in problems
    assert "step 'a' depends on itself" in problems
    assert "step 'b' dependsOn 'zzz' which is not a step of this plan" in problems


def test_backoff_grows_caps_and_is_reproducible() -> None:
    policy = m.Backoff(initial_seconds=10, factor=2, max_seconds=100)
    delays = [backoff_seconds(policy, k, seed=1, run_uid="u", step="s") for k in range(1, 8)]
    assert delays == [
        backoff_seconds(policy, k, seed=1, run_uid="u", step="s") for k in range(1, 8)
    ]
    for k, d in enumerate(delays, start=1):
        nominal = min(100, 10 * 2 ** (k - 1))
        assert 0.8 * nominal <= d <= nominal
    assert delays != [
        backoff_seconds(policy, k, seed=2, run_uid="u", step="s") for k in range(1, 8)
    ]
