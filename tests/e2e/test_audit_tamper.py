"""The audit record is tamper-evident against someone who may write ConfigMaps in the namespace.

* An edited entry whose hashes are recomputed after it (so the chain alone still verifies) is
  caught by ``kubectl agentrun history --verify``: the chain no longer ends at the head the
  operator anchored in ``status.audit``, which only it can write.
* ConfigMaps that carry the record's labels but are not the run's own chunks (not owned by
  it, or entries far past its latest transition) are ignored: ``recordedSeq`` does not move,
  a Warning Event reports each once, and ``--verify`` lists them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentrun.access import audit
from agentrun.api.models import API_VERSION, KIND
from agentrun.core.naming import canonical_json
from agentrun.settings import LABEL_KIND, LABEL_RUN_UID
from agentrun_devcluster.operator import OperatorProcess
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.plugin import kubectl_agentrun as plugin
from tests.support.runs import Run, agentrun, audit_record, create, envelope, step
from tests.support.waiting import wait_phase, wait_until

FORGED_SEQ = 1_000_000


def two_steps(name: str, pause: int = 0) -> Run:
    first = f"sleep {pause}; " if pause else ""
    return agentrun(
        name,
        [
            step("inspect", first + envelope("looked around")),
            step("report", envelope("all good"), after=["inspect"]),
        ],
    )


def fully_recorded(kube: KubeClients, namespace: str, name: str) -> Run:
    """Wait until the run finished and its record holds every transition."""
    wait_phase(kube, namespace, name, "Succeeded")

    def recorded(run: Run) -> bool:
        status = run.get("status") or {}
        a = status.get("audit") or {}
        seq = status.get("historySeq")
        return bool(seq) and a.get("recordedSeq") == seq and a.get("headSeq") == seq

    return wait_until(kube, namespace, name, "its record complete and anchored", recorded)


def rechain(entries: list[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    """What someone who can write ConfigMaps can do: recompute every hash of the chain."""
    prev = audit.genesis(uid)
    out = []
    for e in entries:
        body = {k: v for k, v in e.items() if k != "hash"}
        body["prev"] = prev
        digest = hashlib.sha256((prev + canonical_json(body)).encode()).hexdigest()
        out.append({**body, "hash": digest})
        prev = digest
    return out


def test_a_rechained_edit_is_detected_by_verify(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    uid = create(kube, namespace, two_steps("edited"))["metadata"]["uid"]
    fully_recorded(kube, namespace, "edited")
    intact = plugin(cluster, "history", "edited", "--verify", "-n", namespace)
    assert intact.returncode == 0, intact.stderr
    assert "audit record intact" in intact.stdout

    [chunk] = audit_record(kube, namespace, uid)
    entries = audit.parse([chunk.data])
    assert len(entries) >= 4
    # A field status.history does not compare: only the anchor can tell.
    entries[1] = {**entries[1], "message": "nothing happened here"}
    forged = rechain(entries, uid)
    assert audit.verify(forged, uid) == [], "the re-chained record verifies on its own"
    chunk.data = {audit.key(e["seq"]): canonical_json(e) for e in forged}
    kube.core.replace_namespaced_config_map(chunk.metadata.name, namespace, chunk)

    verified = plugin(cluster, "history", "edited", "--verify", "-n", namespace)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "is NOT intact" in verified.stderr
    assert "does not end at the head anchored in status.audit" in verified.stderr


def forged_entry(seq: int) -> dict[str, str]:
    entry = {"seq": seq, "at": "2026-01-01T00:00:00Z", "to": "Succeeded", "reason": "Forged"}
    return {audit.key(seq): json.dumps({**entry, "prev": "0" * 64, "hash": "0" * 64})}


def test_foreign_audit_configmaps_are_ignored_and_reported(
    operator: OperatorProcess, cluster: TestCluster, kube: KubeClients, namespace: str
) -> None:
    name = "watched"
    created = create(kube, namespace, two_steps(name, pause=3))
    uid = created["metadata"]["uid"]
    labels = {LABEL_RUN_UID: uid, LABEL_KIND: "audit"}
    owner = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid}
    squatter = audit.chunk_name(audit.record_prefix(name, uid), FORGED_SEQ)
    for cm, refs in (
        ("forged-audit", []),  # labels only
        (squatter, [{**owner, "controller": True}]),  # owned, named as a chunk, far ahead
    ):
        kube.core.create_namespaced_config_map(
            namespace,
            {
                "metadata": {"name": cm, "labels": labels, "ownerReferences": refs},
                "data": forged_entry(FORGED_SEQ),
            },
        )

    run = fully_recorded(kube, namespace, name)
    status = run["status"]
    assert status["audit"]["recordedSeq"] == status["historySeq"] < FORGED_SEQ, status["audit"]

    def reported() -> set[str]:
        events = kube.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        messages = [e.message for e in events if e.reason == "ForeignAuditObject"]
        assert all(e.type == "Warning" for e in events if e.reason == "ForeignAuditObject")
        return {cm for cm in ("forged-audit", squatter) if any(cm in m for m in messages)}

    wait_for("both foreign ConfigMaps reported", lambda: reported() == {"forged-audit", squatter})
    again = fully_recorded(kube, namespace, name)
    assert again["status"]["audit"]["recordedSeq"] == status["historySeq"]

    verified = plugin(cluster, "history", name, "--verify", "-n", namespace)
    assert verified.returncode == 0, verified.stderr
    assert "audit record intact" in verified.stdout
    assert "ignored ConfigMap forged-audit" in verified.stderr
    assert f"ignored ConfigMap {squatter}" in verified.stderr
    assert "Forged" not in verified.stdout, "a foreign entry entered the timeline"
