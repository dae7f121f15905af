"""The key of step Jobs' proofs (agentrun.loop.signing): read from the operator's Secret, made
once when missing, the other process's taken when both make it, and refused when unusable."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.execution import proof
from agentrun.loop.common import Apis
from agentrun.loop.signing import DATA_KEY, JobKey


class FakeCore:
    """Secrets in one namespace; ``race`` makes another process's Secret appear on create."""

    def __init__(self, secrets: dict[str, bytes] | None = None, race: bytes | None = None) -> None:
        self.secrets = dict(secrets or {})
        self.race = race
        self.reads = 0
        self.created: list[dict[str, Any]] = []

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        self.reads += 1
        if name not in self.secrets:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data={DATA_KEY: base64.b64encode(self.secrets[name]).decode()})

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if self.race is not None:
            self.secrets[name] = self.race
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append(body)
        self.secrets[name] = base64.b64decode(body["data"][DATA_KEY])


def key_of(core: FakeCore) -> JobKey:
    return JobKey(Apis(core=core, batch=None, custom=None), "agentrun-system")


def test_an_existing_key_is_read_once() -> None:
    core = FakeCore({s.SIGNING_SECRET: b"k" * 32})
    key = key_of(core)
    assert key.get() == key.get() == b"k" * 32
    assert core.reads == 1 and core.created == []


def test_a_missing_key_is_made_once_at_random() -> None:
    core = FakeCore()
    made = key_of(core).get()
    (body,) = core.created
    assert len(made) == proof.KEY_BYTES and made != bytes(proof.KEY_BYTES)
    assert body["metadata"]["namespace"] == "agentrun-system"
    assert body["metadata"]["name"] == s.SIGNING_SECRET
    assert key_of(FakeCore()).get() != made


def test_when_two_processes_make_it_both_use_the_one_stored() -> None:
    core = FakeCore(race=b"t" * 32)
    assert key_of(core).get() == b"t" * 32


def test_a_short_key_or_a_refused_read_stops_the_pass_saying_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="delete it and the operator makes a new one"):
        key_of(FakeCore({s.SIGNING_SECRET: b"short"})).get()

    class Forbidden(FakeCore):
        def read_namespaced_secret(self, name: str, namespace: str) -> Any:
            raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(RuntimeError, match="grant the operator get and create"):
        key_of(Forbidden()).get()
