"""A Job the API server refuses (invalid, forbidden), or the Kubernetes client refuses before
sending it, fails its attempt, reason JobRefused, with their message and a Warning Event; the
step's retry policy applies, so retries end. The CRD types stepTemplate's securityContexts, so
a value of the wrong type is refused at kubectl apply already."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from kubernetes import client

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import CoreConfig, CreateJob, EmitEvent, Observed, refusals
from agentrun.execution import jobs
from agentrun.loop.act import CLIENT_REFUSAL, MAX_REFUSAL, client_message
from agentrun.loop.decide import REFUSAL_REQUEUE, requeue_after
from agentrun.loop.reconciler import Apis, Reconciler
from agentrun.observation.view import ClusterView
from tests.support.schema import VALIDATOR
from tests.support.sim import Sim, make_run, step

SP = m.StepPhase


def _refused_job(sim: Sim, message: str) -> None:
    """The shell's part: the create of every Launching attempt's Job is refused."""
    launching = {st.job_name for st in sim.status.steps or [] if st.phase == SP.LAUNCHING}
    for name in launching:
        assert name is not None
        sim.jobs.pop(name, None)
    sim.observed = lambda: Observed(  # type: ignore[method-assign]
        tuple(Sim.observed(sim).jobs), job_refusals={n: message for n in launching if n}
    )


def test_a_job_the_api_refuses_fails_the_attempt_with_the_apis_message() -> None:
    sim = Sim(make_run([step("bad")]))
    sim.tick()
    message = 'Job.batch "x" is invalid: spec.template.spec.containers[0].resources.requests'
    _refused_job(sim, message)
    decision = sim.tick()
    bad = sim.step_status("bad")
    assert bad.phase == SP.FAILED and bad.error is not None
    assert bad.error.reason == "JobRefused" and bad.error.message == message
    assert sim.status.phase == m.RunPhase.FAILED
    assert any(
        isinstance(a, EmitEvent) and a.type == "Warning" and a.reason == "JobRefused"
        for a in decision.after_commit
    )


def test_a_refused_job_counts_as_a_failed_attempt_and_retries_end() -> None:
    retry = {"limit": 2, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
    sim = Sim(make_run([step("bad", retry=retry)]))
    names = []
    for attempt in (1, 2, 3):
        sim.tick()
        assert sim.step_status("bad").phase == SP.LAUNCHING
        names.append(sim.step_status("bad").job_name)
        _refused_job(sim, "invalid")
        decision = sim.tick()
        assert any(
            isinstance(a, EmitEvent) and a.type == "Warning" and a.reason == "JobRefused"
            for a in decision.after_commit
        ), f"attempt {attempt} was refused without a Warning Event"
        expected = SP.BACKING_OFF if attempt < 3 else SP.FAILED
        assert sim.step_status("bad").phase == expected
        sim.advance(2)
    bad = sim.step_status("bad")
    assert bad.attempt == 3 and len(set(names)) == 3
    assert bad.error is not None and bad.error.reason == "JobRefused"
    sim.advance(60)
    sim.tick()
    assert sim.step_status("bad").attempt == 3, "retries ended"


JOB_QUOTA = (
    'jobs.batch "r-bad-1" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
    "used: count/jobs.batch=4, limited: count/jobs.batch=4"
)


def test_a_job_refused_by_a_quota_is_created_again_until_the_grace_ends() -> None:
    sim = Sim(make_run([step("bad")]))
    sim.tick()
    started = sim.step_status("bad").attempt_started_at
    assert started is not None
    _refused_job(sim, JOB_QUOTA)

    decision = sim.tick()
    bad = sim.step_status("bad")
    assert bad.phase == SP.LAUNCHING and bad.error is None, bad
    assert bad.message is not None and "exceeded quota: jobs)" in bad.message, bad.message
    assert "used:" not in bad.message  # the same words on every try: one status write
    creates = [a for a in decision.after_commit if isinstance(a, CreateJob)]
    assert [c.job_name for c in creates] == [bad.job_name]
    assert decision.requeue_after == refusals.CREATE_RETRY_SECONDS
    refused = {bad.job_name or "": JOB_QUOTA}
    assert requeue_after(decision, refused) == refusals.CREATE_RETRY_SECONDS
    assert requeue_after(decision, {bad.job_name or "": "invalid"}) == REFUSAL_REQUEUE

    sim.advance(CoreConfig().refusal_grace_seconds)
    _refused_job(sim, JOB_QUOTA)  # the create tried again was refused again
    decision = sim.tick()
    bad = sim.step_status("bad")
    assert bad.phase == SP.FAILED and bad.error is not None, bad
    assert bad.error.reason == "JobRefused" and bad.error.message == JOB_QUOTA
    assert not [a for a in decision.after_commit if isinstance(a, CreateJob)]


# -- a Job the client refuses before sending it ------------------------------------------------


def _unreachable_reconciler() -> Reconciler:
    """A Reconciler whose Job creates go through the real Kubernetes client to a server that
    is not there: what the client refuses, it refuses before any request."""
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    batch = client.BatchV1Api(client.ApiClient(configuration))
    apis = Apis(core=mock.Mock(), batch=batch, custom=mock.Mock())
    reconciler = Reconciler(apis, s.Settings(namespaces=("default",)), view=ClusterView())
    # The Job signing key, as if read from its Secret: the client, not the key, is on trial.
    reconciler.observer.job_key = mock.Mock(**{"get.return_value": bytes(32)})
    return reconciler


def _first_create(run: m.AgentRun) -> CreateJob:
    sim = Sim(run)
    decision = sim.tick()
    (create,) = [a for a in decision.after_commit if isinstance(a, CreateJob)]
    return create


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ({"securityContext": {"runAsUser": "root"}}, "securityContext.runAsUser: Input should"),
        (
            {"containerSecurityContext": {"capabilities": {"drop": ["ALL"], "bogus": True}}},
            "securityContext.capabilities.bogus: Extra inputs are not permitted",
        ),
    ],
)
def test_a_job_the_client_refuses_before_sending_is_a_refusal_not_a_failed_pass(
    template: dict[str, Any], fragment: str
) -> None:
    run = make_run([step("bad")], stepTemplate=template)
    create = _first_create(run)
    rec = _unreachable_reconciler()

    rec.actor.act(run, (create,))  # raised before: the pass failed, again and again

    assert set(rec.observer.refusals_of(run.metadata.uid)) == {create.job_name}
    message = rec.observer._job_refusals[run.metadata.uid][create.job_name]
    assert message.startswith(CLIENT_REFUSAL) and fragment in message, message
    assert len(message) <= MAX_REFUSAL


def test_a_job_the_client_refuses_fails_the_step_with_its_words_and_a_warning() -> None:
    run = make_run([step("bad")], stepTemplate={"securityContext": {"runAsUser": "root"}})
    create = _first_create(run)
    rec = _unreachable_reconciler()
    rec.actor.act(run, (create,))
    message = rec.observer._job_refusals[run.metadata.uid][create.job_name]

    sim = Sim(run)
    sim.tick()
    _refused_job(sim, message)
    decision = sim.tick()
    bad = sim.step_status("bad")
    assert bad.phase == SP.FAILED and bad.error is not None
    assert bad.error.reason == "JobRefused" and "runAsUser" in bad.error.message
    assert any(isinstance(a, EmitEvent) and a.reason == "JobRefused" for a in decision.after_commit)


def test_unreachable_servers_still_fail_the_pass() -> None:
    """Only the client's refusal of the manifest is final: no answer is retried."""
    run = make_run([step("good")])
    rec = _unreachable_reconciler()
    rec.apis.batch.api_client.configuration.retries = 0
    with pytest.raises(Exception) as raised:
        rec.actor.act(run, (_first_create(run),))
    assert not isinstance(raised.value, ValueError | TypeError)
    assert rec.observer.refusals_of(run.metadata.uid) == {}


def test_client_message_names_each_field_and_the_value() -> None:
    with pytest.raises(ValueError) as raised:
        client.V1PodSecurityContext.model_validate({"runAsUser": "root", "fsGroup": 1.5})
    text = client_message(raised.value)
    assert "runAsUser: Input should be a valid integer (got 'root')" in text, text
    assert "fsGroup: Input should be a valid integer (got 1.5)" in text, text
    assert client_message(TypeError("not JSON")) == "not JSON"


# -- the CRD types securityContext, so a wrong type is refused at kubectl apply ----------------


def _schema_errors(template: dict[str, Any]) -> list[str]:
    body = make_run([step("a")]).to_wire()
    body.update(apiVersion=f"{m.GROUP}/{m.VERSION}", kind="AgentRun")
    body["spec"]["stepTemplate"] = template
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in VALIDATOR.iter_errors(body)]


def test_the_crd_refuses_a_security_context_field_of_the_wrong_type() -> None:
    errors = _schema_errors({"securityContext": {"runAsUser": "root"}})
    assert any("securityContext.runAsUser" in e and "integer" in e for e in errors), errors
    errors = _schema_errors({"containerSecurityContext": {"capabilities": {"drop": [1]}}})
    assert any("capabilities.drop.0" in e for e in errors), errors
    errors = _schema_errors({"securityContext": {"seccompProfile": {}}})
    assert any("'type' is a required property" in e for e in errors), errors


def test_the_crd_admits_the_restricted_defaults_and_keeps_unknown_keys() -> None:
    defaults = {
        "securityContext": jobs.RESTRICTED_POD_SECURITY,
        "containerSecurityContext": jobs.RESTRICTED_CONTAINER_SECURITY,
    }
    assert _schema_errors(defaults) == []
    # Unknown keys are kept, not pruned in silence: the Job's create refuses them, saying so.
    assert _schema_errors({"securityContext": {"runAsUser": 1, "seccompProfile": {
        "type": "RuntimeDefault", "bogus": 1}, "bogus": {"x": 1}}}) == []  # fmt: skip


@pytest.mark.parametrize(
    ("typed", "model"),
    [
        (m.POD_SECURITY_CONTEXT, client.V1PodSecurityContext),
        (m.CONTAINER_SECURITY_CONTEXT, client.V1SecurityContext),
    ],
)
def test_the_typed_fields_are_the_clients(typed: dict[str, Any], model: Any) -> None:
    """The CRD types exactly the fields the Kubernetes client knows (a new client version
    that adds one fails here: type it too)."""
    assert set(typed) == set(model.attribute_map.values())
