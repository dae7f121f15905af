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
from agentrun.observation import adoption


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


def test_a_job_signed_for_an_earlier_version_of_its_step_is_told_from_someone_elses() -> None:
    """A Job the operator made for an attempt from what the step was then carries its proof
    over the spec digest it names: the operator's own, made from an earlier step, is told from
    a Job someone else made (which never carries a proof that verifies)."""
    key = b"k" * proof.KEY_BYTES
    manifest: dict[str, Any] = {"metadata": {"name": "r-a-0123456789-1"}, "spec": {"x": 1}}
    proof.sign(key, "uid", "a", 1, manifest)
    annotations = manifest["metadata"]["annotations"]
    assert annotations[proof.ANNOTATION_SPEC_DIGEST] == proof.spec_digest({"x": 1})
    found = {**manifest, "spec": {"x": 1, "defaulted": True}}  # as the API server keeps it
    assert proof.signed_earlier(key, "uid", "a", 1, found)
    assert not proof.signed_earlier(key, "uid", "a", 2, found)  # another attempt's
    assert not proof.signed_earlier(b"x" * proof.KEY_BYTES, "uid", "a", 1, found)
    forged = {"metadata": {"name": "r-a-0123456789-1", "annotations": {
        s.ANNOTATION_PROOF: annotations[s.ANNOTATION_PROOF],
        proof.ANNOTATION_SPEC_DIGEST: proof.spec_digest({"x": 2}),  # the digest re-pointed
    }}}  # fmt: skip
    assert not proof.signed_earlier(key, "uid", "a", 1, forged)
    mine = adoption.name_taken_message("r-a-0123456789-1", 1, "its spec differs", signed=True)
    assert "created by the operator" in mine and "not created" not in mine
    theirs = adoption.name_taken_message("r-a-0123456789-1", 1, "it carries no proof")
    assert theirs.startswith("a Job not created by the operator")


def test_an_object_proof_binds_its_kind_run_name_and_content() -> None:
    key = b"k" * proof.KEY_BYTES
    made = proof.object_proof(key, "result", "uid", "r-a-r1-1", "a", "1", "d" * 64)
    body = {"metadata": {"name": "r-a-r1-1", "annotations": {s.ANNOTATION_PROOF: made}}}
    assert proof.object_proof_problem(key, body, "result", "uid", "a", "1", "d" * 64) is None
    for kind, uid, bound in [
        ("child", "uid", ("a", "1", "d" * 64)),
        ("result", "other", ("a", "1", "d" * 64)),
        ("result", "uid", ("a", "2", "d" * 64)),
        ("result", "uid", ("a", "1", "e" * 64)),
    ]:
        problem = proof.object_proof_problem(key, body, kind, uid, *bound)
        assert problem is not None and "does not verify" in problem
    unsigned = {"metadata": {"name": "r-a-r1-1"}}
    problem = proof.object_proof_problem(key, unsigned, "result", "uid", "a", "1", "d" * 64)
    assert problem is not None and "carries no" in problem
    with pytest.raises(ValueError):
        proof.object_proof(b"short", "result", "uid", "n")
