"""assert_holds: "nothing happens" is checked for the whole window, and fails at once."""

from __future__ import annotations

import time

import pytest

from tests.support.waiting import assert_holds


def test_the_check_runs_through_the_whole_window_and_last_at_its_end() -> None:
    calls: list[float] = []
    start = time.monotonic()
    held = assert_holds(lambda: calls.append(time.monotonic()), seconds=0.3, interval=0.05)
    assert held == len(calls) >= 4
    assert calls[0] - start < 0.05, "the first check comes at once"
    assert calls[-1] - start >= 0.3, "the last check comes at the end of the window"


def test_the_first_violation_fails_at_once_and_says_when() -> None:
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1
        assert calls < 3, "the step started"

    start = time.monotonic()
    with pytest.raises(AssertionError, match="the step started") as failed:
        assert_holds(check, seconds=30, interval=0.01)
    assert time.monotonic() - start < 5, "it waited for the window instead of failing"
    assert calls == 3
    assert any("held 2 times, then failed" in note for note in failed.value.__notes__)
