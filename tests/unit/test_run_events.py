"""kopf's watch lines decoded by agentrun/loop/run_events.py: the MODIFIED event of a run held
at its version is made of the line's metadata and the body held, every other line is decoded
whole, and the result is what decoding the whole line gives whenever what is held is the run
at that version. The lines the API server itself writes: tests/integration/test_run_events.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun.api import names
from agentrun.loop import handlers
from agentrun.loop.run_bodies import RunBodies
from agentrun.loop.run_events import PREFIX, PREFIXES, RunEvents
from tests.support.sim import Sim, make_run, step


def _run(version: str = "42", uid: str = "uid-1") -> dict[str, Any]:
    """A run of three steps, one succeeded, as the API server holds it."""
    sim = Sim(make_run([step("a"), step("b", "a"), step("c", "b")]))
    sim.tick()
    sim.finish(sim.step_status("a").job_name or "")
    sim.tick()
    body = sim.run.to_wire()
    body["metadata"].update(
        namespace="team", name="demo", uid=uid, resourceVersion=version, generation=1
    )
    body["metadata"]["managedFields"] = [
        {
            "apiVersion": names.API_VERSION,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:plan": {'k:{"name":"a]"}': {".": {}, "f:name": {}}}}},
            "manager": "kubectl-client-side-apply",
            "operation": "Update",
            "time": "2026-12-03T09:00:00Z",
        },
        {"manager": "agentrun-operator", "operation": "Update", "subresource": "status"},
    ]
    return body


def _unmanaged(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` without its run's ``managedFields`` (passed over, not decoded)."""
    event["object"]["metadata"].pop("managedFields", None)
    return event


def _line(body: dict[str, Any], kind: str = "MODIFIED") -> str:
    """The watch line of ``body`` as the API server writes it: compact, the object's fields
    sorted (a custom resource is a map), ``type`` before ``object``."""
    obj = json.dumps(body, separators=(",", ":"), sort_keys=True)
    return '{"type":' + json.dumps(kind) + ',"object":' + obj + "}"


def _count(decoded: str) -> float:
    return REGISTRY.get_sample_value("agentrun_run_events_total", {"decoded": decoded}) or 0.0


def _holding(*bodies: dict[str, Any]) -> RunEvents:
    held = RunBodies()
    for body in bodies:
        held.offer(body)
    return RunEvents(held.get)


def test_the_event_of_a_run_held_at_its_version_takes_the_held_spec_and_status() -> None:
    body = _run()
    line = _line(body)
    assert line.startswith(PREFIX)
    held = copy.deepcopy(body)
    events = _holding(held)
    before = _count("metadata")
    event = events.loads(line)
    assert _count("metadata") == before + 1
    assert event == _unmanaged(json.loads(line))
    assert "managedFields" not in event["object"]["metadata"]
    # Not decoded from the line: the objects held, and the metadata the line carries.
    assert event["object"]["status"] is held["status"]
    assert event["object"]["spec"] is held["spec"]
    assert event["object"]["metadata"] is not held["metadata"]


def test_the_metadata_comes_from_the_line_even_where_the_held_body_differs() -> None:
    """A status write's body as the operator keeps it has the metadata it read (the old
    ``managedFields``, a label since changed, say): the event carries the API server's."""
    body = _run()
    held = copy.deepcopy(body)
    held["metadata"]["managedFields"] = []
    held["metadata"]["labels"] = {"team": "before"}
    event = _holding(held).loads(_line(body))
    assert event["object"]["metadata"] == _unmanaged({"object": body})["object"]["metadata"]


@pytest.mark.parametrize(
    "held",
    [
        pytest.param(None, id="not held"),
        pytest.param({"resourceVersion": "41"}, id="held at an older version"),
        pytest.param({"resourceVersion": "43"}, id="held at a newer version"),
        pytest.param({"uid": "uid-2"}, id="another run of that name"),
    ],
)
def test_an_event_at_a_version_not_held_is_decoded_whole(held: dict[str, Any] | None) -> None:
    body = _run()
    line = _line(body)
    kept = []
    if held is not None:
        other = copy.deepcopy(body)
        other["metadata"].update(held)
        other["status"]["phase"] = "Other"  # would show, were it taken
        kept.append(other)
    before = _count("whole")
    event = _holding(*kept).loads(line)
    assert event == _unmanaged(json.loads(line))
    assert _count("whole") == before + 1


def test_someone_elses_annotation_naming_the_held_version_is_not_the_version() -> None:
    """The metadata is decoded as JSON, not searched: an annotation or label whose key is
    ``resourceVersion`` and whose value is the version held does not make the event of
    someone else's write (at another version) pass for the one held."""
    held = _run(version="42")
    body = copy.deepcopy(held)
    body["metadata"]["resourceVersion"] = "43"
    body["metadata"]["annotations"] = {"resourceVersion": "42"}
    body["metadata"]["labels"] = {"resourceVersion": "42"}
    body["spec"]["goal"] = "changed by an editor"
    line = _line(body)
    assert '"resourceVersion":"42"' in line
    event = _holding(held).loads(line)
    assert event == _unmanaged(json.loads(line))
    assert event["object"]["spec"]["goal"] == "changed by an editor"


@pytest.mark.parametrize("kind", ["ADDED", "DELETED"])
def test_other_events_of_a_run_are_decoded_whole_but_managed_fields(kind: str) -> None:
    """Held or not, an event that is not a MODIFIED one is the run as the line carries it."""
    body = _run()
    line = _line(body, kind)
    held = copy.deepcopy(body)
    held["status"]["phase"] = "Other"  # would show, were it taken
    event = _holding(held).loads(line + "\n")
    assert event == _unmanaged(json.loads(line))
    assert event["type"] == kind and event["object"]["status"]["phase"] != "Other"


def test_a_bookmark_is_decoded_as_kopf_decodes_it() -> None:
    line = json.dumps(
        {"type": "BOOKMARK", "object": {"apiVersion": names.API_VERSION, "kind": names.KIND,
         "metadata": {"resourceVersion": "42"}}}, separators=(",", ":"),
    )  # fmt: skip
    assert _holding(_run()).loads(line) == json.loads(line)


def test_lines_of_other_resources_and_other_forms_are_decoded_whole() -> None:
    events = _holding(_run())
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x"}}
    line = _line(lease)
    assert events.loads(line) == json.loads(line)
    spaced = _line(_run()).replace('"type":"MODIFIED"', '"type": "MODIFIED"')
    assert events.loads(spaced) == json.loads(spaced)
    assert events.loads(_line(_run()).encode()) == json.loads(_line(_run()))
    assert events.loads("[1, 2]", parse_int=str) == ["1", "2"]


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param({}, id="empty"),
        pytest.param({"namespace": "team"}, id="no managedFields"),
        pytest.param({"managedFields": [], "name": "demo"}, id="managedFields empty"),
        pytest.param(
            {"annotations": {"managedFields": "[", "x": '],"name":"y'}, "name": "demo"},
            id="look-alikes in strings",
        ),
    ],
)
def test_metadata_is_read_field_by_field(metadata: dict[str, Any]) -> None:
    from agentrun.loop.run_events import _metadata

    text = "x" + json.dumps(metadata, separators=(",", ":"), sort_keys=True) + "y"
    expected = {k: v for k, v in metadata.items() if k != "managedFields"}
    assert _metadata(text, 1) == (expected, len(text) - 1)


UNREADABLE = {
    "metadata cut short": '{"name":"demo"',
    "metadata not an object": '"not an object"}}',
    "no version": '{"name":"demo","namespace":"team"}}',
    "managedFields last": '{"managedFields":[{"a":{}}]}}',
    "spaced": '{ "name":"demo"}}',
    "spaced before a colon": '{"name" :"demo"}}',
    "spaced after a value": '{"name":"demo" }}',
    "a comma before the end": '{"name":"demo",}}',
    "the event not ended": '{"name":"demo","namespace":"team"},"spec":{}}',
    "more after it": '{"name":"demo","namespace":"team"},"spec":{}}}x',
    "spaced spec": '{"name":"demo","namespace":"team"},"spec" :{}}}',
    "a bare name": '{"name":"demo","namespace":"team"},spec:{}}}',
}
"""Ends of a run event's line after its fixed beginning that do not read as the API server
writes them, by what is wrong with them."""


@pytest.mark.parametrize("tail", list(UNREADABLE.values()), ids=list(UNREADABLE))
def test_a_line_whose_metadata_cannot_be_read_is_decoded_whole(tail: str) -> None:
    """What kopf would get from decoding it whole: its decoded value, or its error."""
    line = PREFIX + tail
    events = _holding(_run())
    try:
        expected: Any = json.loads(line)
    except json.JSONDecodeError as error:
        with pytest.raises(json.JSONDecodeError) as raised:
            events.loads(line)
        assert str(raised.value) == str(error)
    else:
        assert events.loads(line) == expected


def test_kopf_decodes_its_watch_lines_with_the_operators_decoder() -> None:
    """kopf's client module decodes each watch line with its module's ``json.loads``: the
    operator hands it the decoder, and undoing it gives kopf back the json module."""
    from kopf._cogs.clients import api

    held = RunBodies()
    body = _run()
    held.offer(copy.deepcopy(body))
    undo = handlers._kopf_reuses_held_runs(held)
    try:
        kopf_json = vars(api)["json"]
        assert kopf_json is not json
        before = _count("metadata")
        assert kopf_json.loads(_line(body)) == _unmanaged(json.loads(_line(body)))
        assert _count("metadata") == before + 1
        assert kopf_json.dumps({"a": 1}) == json.dumps({"a": 1})
    finally:
        undo()
    assert vars(api)["json"] is json


def test_the_prefixes_name_the_event_type_the_api_group_and_kind() -> None:
    assert PREFIX.startswith('{"type":"MODIFIED","object":{"apiVersion":"')
    for kind, prefix in PREFIXES.items():
        assert prefix.startswith(f'{{"type":"{kind}","object":{{"apiVersion":"')
        assert f'"{names.API_VERSION}","kind":"{names.KIND}","metadata":' in prefix
