"""The core against hostile input: whatever a step writes and whatever a namespace user puts in
a spec, ``reconcile`` returns a Decision whose status the API server accepts and that stays
small.

Step output (termination messages) comes from code the operator does not control: deeply
nested JSON, numbers past int64, invalid UTF-8, huge strings, NaN and Infinity, fields of the
wrong type, thousands of keys. Specs pass the CRD's schema but are otherwise as hostile as it
allows. The status of every decision is checked against the status schema of the checked-in
CRD (crds/agentrun.dev_agentruns.yaml), plus what that schema cannot say: integers fit int64
(the API server rejects larger ones) and strings are valid Unicode.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.api import models as m
from agentrun.core import (
    CarriedSource,
    Decision,
    JobState,
    Observed,
    ObservedJob,
    StoreResult,
    reconcile,
)
from tests.support.sim import T0, Sim, make_run, step

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "agentrun.dev_agentruns.yaml"
EXAMPLES = int(os.environ.get("AGENTRUN_HYPOTHESIS_EXAMPLES", "300")) // 2
INT64 = range(-(2**63), 2**63)
CONFIG_MAP_LIMIT = 1024 * 1024
"""The API server refuses larger ConfigMaps: a result object must stay below."""
STATUS_BOUND_BASE = 96 * 1024
STATUS_BOUND_PER_STEP = 12 * 1024
"""Bytes of status JSON allowed: a base (conditions, history ring, run message) plus, per step,
its bounded summary, inline result, message and error."""


# -- the schema ------------------------------------------------------------------------------


def _without_kubernetes_extensions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _without_kubernetes_extensions(v)
            for k, v in node.items()
            if not k.startswith("x-kubernetes-")
        }
    if isinstance(node, list):
        return [_without_kubernetes_extensions(v) for v in node]
    return node


@cache
def status_validator() -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load(CRD_FILE.read_text())
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return jsonschema.Draft202012Validator(_without_kubernetes_extensions(schema))


def _walk(value: Any, path: str = "status") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _walk(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _walk(v, f"{path}[{i}]")]
    return [(path, value)]


def assert_status_accepted(decision: Decision, n_steps: int) -> None:
    wire = decision.status.to_wire()
    errors = sorted(status_validator().iter_errors(wire), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors)
    for path, leaf in _walk(wire):
        if isinstance(leaf, int) and not isinstance(leaf, bool):
            assert leaf in INT64, f"{path} = {leaf} does not fit int64"
        if isinstance(leaf, float):
            raise AssertionError(f"{path} = {leaf} is a float")
    text = json.dumps(wire, ensure_ascii=False, allow_nan=False)
    size = len(text.encode("utf-8"))  # raises on lone surrogates: not valid Unicode
    bound = STATUS_BOUND_BASE + n_steps * STATUS_BOUND_PER_STEP
    assert size <= bound, f"status is {size} bytes, more than {bound}"
    for action in decision.before_commit:
        if isinstance(action, StoreResult):  # must be written before the status: it must fit
            stored = sum(len(k) + len(v.encode("utf-8")) for k, v in action.data)
            assert stored <= CONFIG_MAP_LIMIT, f"result object of {stored} bytes"
    for action in (*decision.before_commit, *decision.after_commit):
        message = getattr(action, "message", "")
        assert isinstance(message, str) and len(message) <= m.MAX_MESSAGE
        message.encode("utf-8")


# -- hostile step output -----------------------------------------------------------------------

any_text = st.text(
    alphabet=st.characters()
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
    max_size=300,
)
"""Unicode including lone surrogates (what undecodable bytes become)."""

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)  # NaN and Infinity as Python writes them


def _nested(depth: int, field: str) -> str:
    return f'{{"ok": true, "{field}": ' + "[" * depth + "]" * depth + "}"


number_texts = st.one_of(
    st.integers(-(2**200), 2**200).map(str),
    st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1.5", "9" * 5000]),
)

envelopes = st.one_of(
    # deep nesting, in the result or in a field with a type of its own
    st.builds(_nested, st.integers(0, 30_000), st.sampled_from(["result", "usage", "summary"])),
    st.integers(0, 30_000).map(lambda n: "[" * n + "]" * n),
    # numbers past any integer type, NaN and Infinity
    st.builds(
        lambda ok, n: f'{{"ok": {ok}, "usage": {{"tokens": {n}}}}}',
        st.sampled_from(["true", "false"]),
        number_texts,
    ),
    st.builds(lambda n: f'{{"ok": true, "result": {n}}}', number_texts),
    # huge strings, inline or as the plain text
    st.builds(
        lambda field, n: _dumps({"ok": True, field: "x" * n}),
        st.sampled_from(["summary", "result", "resultDigest"]),
        st.integers(0, 200_000),
    ),
    st.integers(0, 200_000).map(lambda n: "y" * n),
    # invalid UTF-8, raw or escaped inside JSON
    any_text,
    any_text.map(lambda t: _dumps({"ok": True, "summary": t, "result": t})),
    # fields of the wrong type
    st.fixed_dictionaries(
        {"ok": st.booleans() | json_values},
        optional={
            "summary": json_values,
            "result": json_values,
            "usage": json_values | st.fixed_dictionaries({"tokens": json_values}),
            "resultRef": json_values
            | st.fixed_dictionaries({"name": json_values, "key": json_values}),
            "resultDigest": json_values,
        },
    ).map(_dumps),
    # thousands of keys
    st.integers(0, 5000).map(
        lambda n: _dumps(
            {"ok": True, "result": {f"k{i}": i for i in range(n)}, **{f"x{i}": i for i in range(n)}}
        )
    ),
)

outcomes = st.fixed_dictionaries(
    {
        "ok": st.booleans(),
        "message": st.none() | envelopes,
        "exit_code": st.none() | st.integers(-(2**70), 2**70),
        "reason": st.none()
        | any_text
        | st.integers(0, 100_000).map(lambda n: "Reason" * n)
        | st.just("DeadlineExceeded"),
    }
)


# -- hostile specs -----------------------------------------------------------------------------

valid_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
"""What the API server can hold: valid Unicode (its JSON has no lone surrogates)."""


def _long(limit: int) -> st.SearchStrategy[str]:
    """Short text, or text at its field's maxLength."""
    return st.one_of(valid_text.filter(bool), st.just("z" * limit), st.just("é" * limit))


def _deep_object(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"leaf": True}
    for _ in range(depth):
        node = {"n": node}
    return node


pod_settings = st.one_of(
    st.none(),
    st.dictionaries(valid_text, json_values.filter(lambda v: v == v), max_size=5),
    st.integers(0, 3000),  # an object nested this deep (built in the test: too deep to print)
)


@st.composite
def specs(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    n = draw(st.integers(1, 3))
    names = [f"s{i}" for i in range(n)]
    steps: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        extra: dict[str, Any] = {"description": draw(_long(1024))}
        if i and draw(st.booleans()):
            extra["dependsOn"] = [names[i - 1]]
            if draw(st.booleans()):
                extra["inputs"] = [
                    {
                        "name": "PREV",
                        "fromStep": names[i - 1],
                        "key": draw(st.none() | _long(m.MAX_FIELD_KEY)),
                    }
                ]
        if draw(st.booleans()):
            extra["approval"] = "required"
            extra["onRejection"] = draw(st.sampled_from(["failRun", "skipStep"]))
        if draw(st.booleans()):
            extra["retry"] = {"limit": draw(st.integers(0, 3))}
        body = step(name, **extra)
        body["container"]["args"] = draw(st.lists(_long(4096), max_size=3))
        body["container"]["workingDir"] = draw(st.none() | _long(1024))
        body["container"]["env"] = [
            {"name": f"E{j}", "value": v}
            for j, v in enumerate(draw(st.lists(_long(4096), max_size=3)))
        ]
        body["container"]["image"] = draw(st.sampled_from(["busybox:1.36", "i" * 512]))
        steps.append(body)
    spec: dict[str, Any] = {
        "plan": {"steps": steps},
        "goal": draw(_long(4096)),
        "actor": draw(st.none() | _long(253)),
        "budget": {
            "maxTokens": draw(st.none() | st.integers(1, 2**100)),
            "maxAttempts": draw(st.none() | st.integers(1, 100_000)),
        },
        "retention": {"ttlSecondsAfterFinished": draw(st.none() | st.integers(0, 2**70))},
        "stepTemplate": {
            "serviceAccountName": draw(st.none() | _long(253)),
            "securityContext": draw(pod_settings),
            "containerSecurityContext": draw(pod_settings),
        },
        "policy": {
            "approvalRequiredFor": draw(st.sets(st.sampled_from(["read", "write", "external"]))),
            "approvalTimeoutSeconds": draw(st.none() | st.integers(1, 30 * 86400)),
        },
    }
    approvals = []
    for name in draw(st.lists(st.sampled_from(names), max_size=4)):
        approvals.append(
            {
                "step": name,
                "decision": draw(st.sampled_from(["approve", "reject"])),
                "argsHash": draw(st.text("0123456789abcdef", min_size=64, max_size=64)),
                "by": draw(st.just("b" * 253) | st.just("alice")),
                "reason": draw(st.none() | _long(1024)),
            }
        )
    spec["approvals"] = approvals
    carried = []
    for name in draw(st.lists(st.sampled_from(names), max_size=n, unique=True)):
        carried.append(
            {
                "step": name,
                "fromRun": draw(st.sampled_from(["default/old", "other/old", "x" * 317])),
                "argsHash": draw(st.none() | st.just("a" * 64)),
                "summary": draw(_long(1024)),
                "result": draw(st.none() | _long(4096)),
                "resultDigest": draw(st.none() | st.just("f" * 64)),
            }
        )
    if carried:
        spec["carriedResults"] = carried
    return spec, n


class SharingSim(Sim):
    """A Sim that hands the core the run itself instead of a deep copy: copy.deepcopy cannot
    walk settings nested as deep as the API server stores them, and the core never changes
    the run it is given (it works on a copy of the status)."""

    def snapshot(self) -> tuple[m.AgentRun, int]:
        return self.run, self.version


# -- the properties ----------------------------------------------------------------------------


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=specs(), rounds=st.lists(st.lists(outcomes, min_size=1, max_size=3), max_size=4))
def test_hostile_specs_and_step_output_always_give_an_acceptable_status(
    spec: tuple[dict[str, Any], int], rounds: list[list[dict[str, Any]]]
) -> None:
    body, n = spec
    template = body["stepTemplate"]
    for key in ("securityContext", "containerSecurityContext"):
        if isinstance(template[key], int):
            template[key] = _deep_object(template[key])
    run = m.AgentRun.model_validate(
        {
            "metadata": {
                "name": "r" * 253,
                "namespace": "default",
                "uid": "u",
                "generation": 2**63 - 2,
                "annotations": {m.ANNOTATION_MODIFIED_BY: "m" * 100_000},
            },
            "spec": body,
        }
    )
    sim = SharingSim(run)
    sim.carried_sources["s0"] = CarriedSource("default/old", "a" * 64, "f" * 64, "x")
    assert_status_accepted(sim.tick(), n)
    for outcomes_of_round in rounds:
        for job, outcome in zip(sim.active(), outcomes_of_round, strict=False):
            sim.finish(job.name, outcome["ok"], outcome["message"], outcome["exit_code"])
            job.exit_code = outcome["exit_code"]  # past what any container reports
            job.reason = outcome["reason"]
        sim.advance(3600)
        assert_status_accepted(sim.tick(), n)
        if sim.status.phase in m.TERMINAL_RUN_PHASES:
            break
    sim.advance(10**6)
    assert_status_accepted(sim.tick(), n)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    message=envelopes,
    exit_code=st.none() | st.integers(-(2**70), 2**70),
    state=st.sampled_from([JobState.SUCCEEDED, JobState.FAILED]),
    reason=st.none() | any_text,
    finished=st.sampled_from([None, T0, T0 + timedelta(days=365 * 7000)]),
)
def test_any_termination_message_gives_an_acceptable_status(
    message: str,
    exit_code: int | None,
    state: JobState,
    reason: str | None,
    finished: Any,
) -> None:
    sim = Sim(make_run([step("a", retry={"limit": 1}), step("b", "a")]))
    sim.tick()
    job = sim.job_of("a")
    observed = Observed(
        (
            ObservedJob(
                name=job.name,
                step="a",
                attempt=job.attempt,
                state=state,
                termination_message=message,
                exit_code=exit_code,
                reason=reason,
                message=message,
                finished_at=finished,
            ),
        )
    )
    assert sim.run.status is not None
    decision = reconcile(sim.run, observed, sim.now)
    assert_status_accepted(decision, 2)
    st_a = next(s for s in decision.status.steps or [] if s.name == "a")
    assert st_a.phase in (m.StepPhase.SUCCEEDED, m.StepPhase.BACKING_OFF), st_a.phase


def _envelope_with(**fields: Any) -> str:
    return _dumps({"ok": True, **fields})


HOSTILE_MESSAGES = {
    "nested result": _nested(20_000, "result"),
    "nested and huge": _nested(100_000, "result"),
    "nested summary": _nested(5_000, "summary"),
    "nested usage": _nested(5_000, "usage"),
    "nested plain text": "[" * 100_000 + "]" * 100_000,
    "tokens past int64": '{"ok": true, "usage": {"tokens": ' + str(2**70) + "}}",
    "tokens past float": '{"ok": true, "usage": {"tokens": 1e400}}',
    "tokens of 5000 digits": '{"ok": true, "usage": {"tokens": ' + "9" * 5000 + "}}",
    "negative tokens": '{"ok": true, "usage": {"tokens": -1}}',
    "NaN tokens": '{"ok": true, "usage": {"tokens": NaN}}',
    "Infinity in the result": '{"ok": true, "result": [Infinity, -Infinity, NaN]}',
    "huge summary": _envelope_with(summary="s" * 200_000),
    "huge result": _envelope_with(result="r" * 200_000),
    "huge plain text": "p" * 200_000,
    "result larger than a ConfigMap": _envelope_with(
        result={"a": "x" * 800_000, "b": "y" * 800_000}
    ),
    "huge digest": _envelope_with(resultRef={"name": "cm", "key": "k"}, resultDigest="d" * 10_000),
    "lone surrogates": "bad \udcff\ud800 bytes",
    "escaped surrogates": '{"ok": true, "summary": "\\ud800", "result": "\\udfff"}',
    "surrogates in a key": '{"ok": true, "result": {"\\ud800": "\\udc00"}}',
    "summary of the wrong type": _envelope_with(summary={"a": 1}),
    "usage of the wrong type": _envelope_with(usage="lots"),
    "resultRef of the wrong type": _envelope_with(resultRef=["cm", "k"]),
    "resultRef naming no ConfigMap": _envelope_with(resultRef={"name": "../x", "key": "k"}),
    "ok of the wrong type": '{"ok": "yes", "summary": "s"}',
    "thousands of keys": _dumps({"ok": True, **{f"k{i}": i for i in range(5000)}}),
    "thousands of result keys": _envelope_with(result={f"k{i}": "v" * 50 for i in range(5000)}),
}


def _finish_with(sim: Sim, message: str, state: JobState, exit_code: int | None) -> Decision:
    job = sim.job_of("a")
    observed = Observed(
        (
            ObservedJob(
                name=job.name,
                step="a",
                attempt=job.attempt,
                state=state,
                termination_message=message,
                exit_code=exit_code,
                reason="R" * 100_000,
                message=message,
            ),
        )
    )
    return reconcile(sim.run, observed, sim.now)


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED])
@pytest.mark.parametrize("kind", sorted(HOSTILE_MESSAGES))
def test_each_kind_of_hostile_output_gives_an_acceptable_status(kind: str, state: JobState) -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    decision = _finish_with(sim, HOSTILE_MESSAGES[kind], state, 2**70)
    assert_status_accepted(decision, 2)
    a = next(s for s in decision.status.steps or [] if s.name == "a")
    assert a.phase in (m.StepPhase.SUCCEEDED, m.StepPhase.FAILED)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("nested result", "nested too deeply"),
        ("tokens of 5000 digits", "cannot be read"),
        ("tokens past float", "usage.tokens"),
        ("negative tokens", "usage.tokens"),
        ("NaN tokens", "usage.tokens"),
        ("summary of the wrong type", "summary"),
        ("usage of the wrong type", "usage"),
        ("resultRef of the wrong type", "resultRef"),
        ("resultRef naming no ConfigMap", "resultRef.name"),
        ("huge digest", "resultDigest"),
    ],
)
def test_a_malformed_envelope_fails_the_attempt_and_says_why(kind: str, expected: str) -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    decision = _finish_with(sim, HOSTILE_MESSAGES[kind], JobState.SUCCEEDED, 0)
    a = next(s for s in decision.status.steps or [] if s.name == "a")
    assert a.phase == m.StepPhase.FAILED and a.error is not None
    assert a.error.reason == "InvalidEnvelope" and expected in a.error.message
    assert decision.status.phase == m.RunPhase.FAILED, "a malformed envelope never stalls a run"


HOSTILE_SPECS: dict[str, dict[str, Any]] = {
    "ttl past any date": {"retention": {"ttlSecondsAfterFinished": 2**63 - 1}},
    "token budget past int64": {"budget": {"maxTokens": 2**100}},
    "security context nested deeper than Python serializes": {
        "stepTemplate": {"securityContext": _deep_object(5000)}
    },
    "every text at its maxLength": {
        "goal": "g" * 4096,
        "actor": "a" * 253,
        "stepTemplate": {"serviceAccountName": "s" * 253},
        "approvals": [
            {"step": "a", "decision": "reject", "argsHash": "0" * 64, "by": "b" * 253}
            for _ in range(m.MAX_APPROVALS)
        ],
        "carriedResults": [
            {
                "step": "a",
                "fromRun": "f" * 317,
                "argsHash": "a" * 64,
                "summary": "s" * 1024,
                "result": "r" * 4096,
                "resultDigest": "d" * 64,
            }
        ],
    },
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_SPECS))
def test_each_kind_of_hostile_spec_gives_an_acceptable_status(kind: str) -> None:
    a = step("a", approval="required", onRejection="skipStep")
    a["container"]["args"] = ["x" * 4096] * m.MAX_ARGS
    run = m.AgentRun.model_validate(
        {
            "metadata": {
                "name": "r" * 253,
                "namespace": "default",
                "uid": "u" * 1000,
                "generation": 2**63 - 2,
                "annotations": {m.ANNOTATION_MODIFIED_BY: "m" * 100_000},
            },
            "spec": {"goal": "g", "plan": {"steps": [a, step("b", "a")]}, **HOSTILE_SPECS[kind]},
        }
    )
    sim = SharingSim(run)
    for _ in range(4):
        assert_status_accepted(sim.tick(), 2)
        for job in sim.active():
            sim.finish(job.name, True, HOSTILE_MESSAGES["huge summary"])
        sim.advance(10**6)
    sim.spec_update(cancel=True)
    assert_status_accepted(sim.tick(), 2)
    assert sim.status.phase in m.TERMINAL_RUN_PHASES
    sim.advance(10**9)
    assert_status_accepted(sim.tick(), 2)
