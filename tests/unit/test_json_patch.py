"""The JSON patch a status write sends (agentrun.kubeapi.json_patch): applied to the status
read (strictly, by the benchmark's reader of status writes), it gives exactly the status
written, and it is as large as the change. That the API server applies it so is shown
against a real one (tests/integration/test_crd.py)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.kubeapi import json_patch
from agentrun_devcluster.bench.audit import apply_json_patch as apply

KEYS = st.sampled_from(["phase", "a/b", "~t", "steps", "x"])
LEAVES = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b/c~", "Running"]), st.none())
DOCS = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(DOCS, DOCS)
def test_the_patch_turns_the_old_status_into_the_new_one(old: Any, new: Any) -> None:
    before, after = {"status": old}, {"status": new}
    assert apply(before, json_patch(old, new, "/status")) == after


@settings(max_examples=200, deadline=None)
@given(st.lists(DOCS, min_size=1, max_size=8), st.integers(0, 8), st.lists(DOCS, max_size=3))
def test_a_ring_that_dropped_its_oldest_and_gained_new_entries_is_patched_so(
    ring: list[Any], dropped: int, added: list[Any]
) -> None:
    new = ring[dropped:] + added
    ops = json_patch(ring, new, "/h")
    assert apply({"h": ring}, ops) == {"h": new}


def test_the_patch_is_as_large_as_the_change_not_the_document() -> None:
    steps = [{"name": f"s{i:03d}", "phase": "Succeeded", "summary": "x" * 200} for i in range(128)]
    history = [{"seq": i, "step": f"s{i:03d}", "reason": "Succeeded"} for i in range(100)]
    old: dict[str, Any] = {
        "phase": "Running",
        "steps": steps,
        "history": history,
        "progress": "127/128",
    }
    new = copy.deepcopy(old)
    new["steps"][127]["phase"] = "Running"
    new["history"] = [*history[1:], {"seq": 100, "step": "s127", "reason": "Started"}]
    new.pop("progress")
    ops = json_patch(old, new, "/status")
    assert ops == [
        {"op": "remove", "path": "/status/progress"},
        {"op": "replace", "path": "/status/steps/127/phase", "value": "Running"},
        {"op": "remove", "path": "/status/history/0"},
        {"op": "add", "path": "/status/history/-", "value": new["history"][-1]},
    ]
    assert apply({"status": old}, ops) == {"status": new}
    assert json_patch(old, copy.deepcopy(old), "/status") == []


def test_keys_with_slashes_and_tildes_are_escaped() -> None:
    ops = json_patch({"a/b": 1, "~c": 1}, {"a/b": 2}, "/status")
    assert {"op": "replace", "path": "/status/a~1b", "value": 2} in ops
    assert {"op": "remove", "path": "/status/~0c"} in ops
