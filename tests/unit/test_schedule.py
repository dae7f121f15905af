"""The order ``make test`` hands its test groups out in (tests.support.schedule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.schedule import durations_file, load_durations, ranked_groups, save_durations


def test_groups_come_longest_first_an_unrecorded_one_as_long_as_its_suite_usually_takes() -> None:
    groups = [
        "unit/test_a.py",
        "e2e/test_fast.py",
        "integration/test_b.py",
        "e2e/test_new.py",
        "docker",
        "e2e/test_slow.py",
        "unit/test_new.py",
    ]
    recorded = {"e2e/test_slow.py": 500.0, "e2e/test_fast.py": 20.0, "unit/test_a.py": 40.0}
    assert ranked_groups(groups, recorded) == [
        "docker",  # 600 s by its suite
        "e2e/test_slow.py",
        "e2e/test_new.py",  # 60 s by its suite
        "unit/test_a.py",
        "e2e/test_fast.py",
        "integration/test_b.py",  # 10 s
        "unit/test_new.py",  # 1 s
    ]


def test_with_nothing_recorded_the_suites_order_them_and_ties_keep_their_order() -> None:
    groups = ["unit/test_a.py", "e2e/test_b.py", "integration/test_c.py", "e2e/test_a.py", "docker"]
    assert ranked_groups(groups, {}) == [
        "docker",
        "e2e/test_b.py",
        "e2e/test_a.py",
        "integration/test_c.py",
        "unit/test_a.py",
    ]
    assert ranked_groups(["other/x.py", "unit/y.py"], {}) == ["unit/y.py", "other/x.py"]


def test_saved_durations_keep_groups_this_run_did_not_run(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "test-durations.json"
    save_durations(path, {"e2e/test_a.py": 12.34}, {})
    save_durations(path, {"unit/test_b.py": 1.0}, load_durations(path))
    assert load_durations(path) == {"e2e/test_a.py": 12.3, "unit/test_b.py": 1.0}
    assert [p.name for p in path.parent.iterdir()] == ["test-durations.json"]


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"a": "slow", "b": -1, "c": 2}'])
def test_an_unreadable_file_gives_what_it_can_and_never_fails(tmp_path: Path, text: str) -> None:
    path = tmp_path / "test-durations.json"
    path.write_text(text)
    expected = {"c": 2.0} if text.startswith("{") else {}
    assert load_durations(path) == expected
    assert load_durations(tmp_path / "missing.json") == {}


def test_the_file_lives_in_the_projects_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(tmp_path / "c"))
    assert durations_file() == tmp_path / "c" / "test-durations.json"
    monkeypatch.delenv("AGENTRUN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert durations_file() == tmp_path / "x" / "agentrun" / "test-durations.json"
