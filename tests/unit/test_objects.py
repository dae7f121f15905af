"""Objects a run owns: labels, owner references and the run-owned ConfigMaps."""

from __future__ import annotations

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.execution import objects

RUN = objects.RunRef(name="r" * 70, namespace="ns", uid="uid-1")


def test_long_run_names_are_shortened_with_a_hash_in_labels() -> None:
    assert objects.label_value("short") == "short"
    label = objects.run_labels(RUN)[s.LABEL_RUN]
    assert len(label) <= 63 and label.startswith("r" * 50)
    assert label != objects.label_value("r" * 71)


def test_result_config_map_is_labelled_and_controlled_by_the_run() -> None:
    body = objects.result_config_map(RUN, "cm", "a", 2, [("result", "x"), ("field.n", "1")])
    assert body == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "cm",
            "namespace": "ns",
            "labels": {
                s.LABEL_RUN: objects.label_value(RUN.name),
                s.LABEL_RUN_UID: "uid-1",
                s.LABEL_MANAGED_BY: s.MANAGED_BY,
                s.LABEL_STEP: "a",
                s.LABEL_ATTEMPT: "2",
                s.LABEL_KIND: "result",
            },
            "ownerReferences": [
                {
                    "apiVersion": m.API_VERSION,
                    "kind": m.KIND,
                    "name": RUN.name,
                    "uid": "uid-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"result": "x", "field.n": "1"},
        "immutable": True,
    }


def test_objects_written_without_the_operators_rights_do_not_block_the_runs_deletion() -> None:
    body = objects.result_config_map(
        RUN, "cm", "a", 1, {"result": "x"}, labels={"k": "v"}, annotations={"a": "b"},
        block=False,
    )  # fmt: skip
    (owner,) = body["metadata"]["ownerReferences"]
    assert owner["uid"] == "uid-1"
    assert owner["controller"] is True and owner["blockOwnerDeletion"] is False
    assert body["immutable"] is True
    assert body["metadata"]["labels"]["k"] == "v"
    assert body["metadata"]["labels"][s.LABEL_KIND] == "result"
    assert body["metadata"]["annotations"] == {"a": "b"}


def test_audit_chunks_are_run_owned_config_maps_of_their_own_kind() -> None:
    body = objects.audit_config_map(RUN, "r-audit-1", {"00000001": "{}"})
    assert body["metadata"]["labels"][s.LABEL_KIND] == "audit"
    assert body["metadata"]["labels"][s.LABEL_RUN_UID] == "uid-1"
    assert body["metadata"]["ownerReferences"][0]["controller"] is True
    assert body["data"] == {"00000001": "{}"}
    assert "annotations" not in body["metadata"]


def test_objects_of_a_run_are_selected_by_its_uid_and_kind() -> None:
    assert objects.owned_by("uid-1") == f"{s.LABEL_RUN_UID}=uid-1"
    assert objects.owned_by("uid-1", "audit") == f"{s.LABEL_RUN_UID}=uid-1,{s.LABEL_KIND}=audit"
    labels = objects.audit_config_map(RUN, "r-audit-1", {})["metadata"]["labels"]
    for term in objects.owned_by(RUN.uid, "audit").split(","):
        key, value = term.split("=")
        assert labels[key] == value
