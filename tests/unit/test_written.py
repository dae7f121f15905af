"""The context documents a process wrote, kept so that it does not read them back
(agentrun.loop.written)."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any
from unittest import mock

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.core import naming
from agentrun.core.actions import SendTurn, StoreRecord
from agentrun.core.turns import KIND_CONTEXT, KIND_TRANSCRIPT
from agentrun.loop.act import Actor
from agentrun.loop.common import Apis
from agentrun.loop.observe import Observer
from agentrun.loop.turn_requests import TurnSender
from agentrun.loop.written import Written
from agentrun.settings import Settings
from tests.support.agent_sim import AgentSim, agent_run


def test_what_was_written_is_given_back_as_a_copy() -> None:
    written = Written()
    written.remember("ns", "run-ctx-1", {"part-0": "abc"})
    got = written.get("ns", "run-ctx-1")
    assert got == {"part-0": "abc"}
    assert got is not None
    got["part-0"] = "changed by a reader"
    assert written.get("ns", "run-ctx-1") == {"part-0": "abc"}
    assert written.get("other", "run-ctx-1") is None
    assert written.get("ns", "run-ctx-2") is None


def test_the_least_recently_used_goes_first_once_the_bytes_are_over_the_bound() -> None:
    written = Written(max_bytes=100)
    written.remember("ns", "a", {"k": "x" * 39})  # 40 characters with the key
    written.remember("ns", "b", {"k": "x" * 39})
    assert written.get("ns", "a") is not None  # a is now the more recently used
    written.remember("ns", "c", {"k": "x" * 39})
    assert written.get("ns", "b") is None
    assert written.get("ns", "a") is not None and written.get("ns", "c") is not None
    assert written.size == 80 and len(written) == 2


def test_data_larger_than_the_bound_is_not_kept_and_a_name_written_again_replaces_it() -> None:
    written = Written(max_bytes=100)
    written.remember("ns", "a", {"k": "x" * 10})
    written.remember("ns", "a", {"k": "y" * 20})
    assert written.get("ns", "a") == {"k": "y" * 20}
    assert written.size == 21
    written.remember("ns", "a", {"k": "z" * 200})
    assert written.get("ns", "a") is None and written.size == 0
    written.remember("ns", "b", {"k": "x"})
    written.forget("ns", "b")
    assert written.get("ns", "b") is None and len(written) == 0


# -- the shell: a context written is kept, and read from there ---------------------------------


def _context_record() -> tuple[m.AgentRun, StoreRecord]:
    """An agent run's first pass, and the StoreRecord of its first context."""
    sim = AgentSim(agent_run())
    decision, _ = sim.decide()
    (store,) = [
        x for x in decision.before_commit if isinstance(x, StoreRecord) and x.kind == KIND_CONTEXT
    ]
    return sim.run, store


def _observer(core: Any) -> Observer:
    apis = Apis(core=core, batch=mock.Mock(), custom=mock.Mock())
    return Observer(apis, Settings(), mock.Mock(), None, mock.Mock(), threading.Lock())


@pytest.mark.parametrize("taken", [False, True], ids=["created", "name-taken"])
def test_a_context_created_is_read_back_from_memory_and_one_found_is_read_from_the_api(
    taken: bool,
) -> None:
    run, store = _context_record()
    core = mock.Mock()
    if taken:
        core.create_namespaced_config_map.side_effect = ApiException(status=409)
    stored = {"metadata": {"name": store.name}, "data": {"part-0": "as stored"}}
    core.read_namespaced_config_map.return_value = mock.Mock(data=json.dumps(stored))
    observer = _observer(core)
    actor = Actor(observer.apis, observer, mock.Mock(), lambda point: None)
    assert actor.before_commit(run, (store,)) is True
    ns = run.metadata.namespace
    data = observer.written_data(ns, store.name)
    if taken:  # someone else's object under the name: read, and checked where it is used
        assert data == {"part-0": "as stored"}
        core.read_namespaced_config_map.assert_called_once_with(
            store.name, ns, _preload_content=False
        )
    else:
        assert data == dict(store.data)
        core.read_namespaced_config_map.assert_not_called()
    # The turn's request is built from the same data, checked against the committed digest:
    # the operator's own text is sent; another object under the name is refused.
    texts = [text for _, text in store.data]
    send = SendTurn("job", "m1", 1, "10.0.0.1", "key", store.name, len(texts),
                    naming.sha256_text("".join(texts)))  # fmt: skip
    parts = TurnSender(observer)._parts(run, send)
    if taken:
        assert isinstance(parts, str) and "does not match the digest committed" in parts
    else:
        assert parts == texts
        core.read_namespaced_config_map.assert_not_called()


def test_records_other_than_contexts_are_not_kept() -> None:
    run, store = _context_record()
    transcript = dataclasses.replace(store, name=f"{store.name}-t", kind=KIND_TRANSCRIPT)
    observer = _observer(mock.Mock())
    actor = Actor(observer.apis, observer, mock.Mock(), lambda point: None)
    actor.before_commit(run, (transcript,))
    assert observer.written.get(run.metadata.namespace, transcript.name) is None
