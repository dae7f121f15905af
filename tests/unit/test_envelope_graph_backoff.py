"""Result envelopes, plan graphs and backoff."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import pytest
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


def test_deeply_nested_envelopes_fail_instead_of_raising() -> None:
    nested = '{"ok": true, "result": ' + "[" * 5000 + "]" * 5000 + "}"
    env = envelope.parse(nested)
    assert not env.ok and env.problem is not None and "nested too deeply" in env.problem
    plain = "[" * 5000 + "]" * 5000  # not an object: a plain-text result, as any other text
    assert envelope.parse(plain).ok


def test_token_counts_are_clamped_and_must_be_whole_numbers() -> None:
    def tokens(value: str) -> envelope.Envelope:
        return envelope.parse('{"ok": true, "usage": {"tokens": ' + value + "}}")

    assert tokens(str(2**70)).tokens == envelope.MAX_TOKENS
    assert tokens("12").tokens == 12 and tokens("null").tokens == 0
    for bad in ("-1", "1.5", "1e400", "NaN", "Infinity", '"12"', "true", "[1]"):
        env = tokens(bad)
        assert not env.ok and env.problem is not None and "usage.tokens" in env.problem, bad
    huge = tokens("9" * 5000)  # more digits than Python converts
    assert not huge.ok and huge.problem is not None


def test_fields_of_the_wrong_type_fail_the_envelope() -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"summary": 3}, "summary"),
        ({"usage": [1]}, "usage"),
        ({"resultRef": "cm"}, "resultRef"),
        ({"resultRef": {"name": "Not A Name", "key": "k"}}, "resultRef.name"),
        ({"resultRef": {"name": "cm", "key": "a/b"}}, "resultRef.key"),
        ({"resultDigest": "x" * 65}, "resultDigest"),
        ({"resultDigest": 7}, "resultDigest"),
    ]
    for body, field in cases:
        env = envelope.parse(json.dumps({"ok": True, **body}))
        assert not env.ok and env.problem is not None and field in env.problem, body


def test_invalid_unicode_is_replaced_before_it_reaches_status() -> None:
    env = envelope.parse('{"ok": true, "summary": "a\\ud800b", "result": {"k": "\\udfff"}}')
    assert env.ok and env.summary == "a\ufffdb" and env.result == '{"k":"\ufffd"}'
    raw = envelope.parse("bytes \udcff here")  # how undecodable bytes arrive (surrogateescape)
    assert raw.result == "bytes \ufffd here"
    assert dict(envelope.result_object_data('{"k": "\\ud800"}'))["field.k"] == "\ufffd"


def test_a_message_longer_than_any_kubelet_keeps_fails_the_envelope() -> None:
    env = envelope.parse("x" * (envelope.MESSAGE_LIMIT + 1))
    assert not env.ok and env.problem is not None and "more than" in env.problem


def test_result_object_fields_are_valid_config_map_keys() -> None:
    data = dict(envelope.result_object_data(json.dumps({"ok-1": 1, "é": 2, "a/b": 3})))
    assert set(data) == {"result", "field.ok-1"}


def test_a_compressed_result_is_read_back_whole() -> None:
    text = "the cache was cold. " * 2000
    packed = json.dumps({"ok": True, "summary": "s", "resultZ": envelope.compress_result(text)})
    assert len(packed) < 1024
    read = envelope.parse(packed)
    assert (read.ok, read.problem, read.result) == (True, None, text)


@pytest.mark.parametrize(
    ("packed", "problem"),
    [
        (5, "resultZ is a int, not a string"),
        ("not base64!", "resultZ is not base64 of zlib data"),
        (base64.b64encode(b"not zlib").decode(), "resultZ is not base64 of zlib data"),
        (base64.b64encode(zlib.compress(b"x" * 100)[:-6]).decode(), "resultZ is cut short"),
        (base64.b64encode(zlib.compress(b"\xff\xfe")).decode(), "does not hold UTF-8 text"),
        # A bomb: 4 KiB that would inflate to 4 MiB is refused after the limit.
        (
            base64.b64encode(zlib.compress(b"0" * (4 * 1024 * 1024), 9)).decode(),
            f"resultZ holds more than the {envelope.MAX_INFLATED_RESULT} bytes",
        ),
    ],
)
def test_a_compressed_result_that_cannot_be_read_fails_the_attempt(
    packed: Any, problem: str
) -> None:
    read = envelope.parse(json.dumps({"ok": True, "resultZ": packed}))
    assert read.ok is False and read.problem is not None
    assert problem in read.problem
