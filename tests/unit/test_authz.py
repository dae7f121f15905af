"""Acting with the creator's rights: which permissions a step needs (agentrun.access.authz), the
verdicts asked and cached, and how the core fails a refused step."""

from __future__ import annotations

import json
from typing import Any

from agentrun.access import authz
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.core import CreateJob, EmitEvent, Observed, reconcile, rights, turn_steps
from tests.support.agent_sim import agent_run
from tests.support.executor_sim import ExecutorSim
from tests.support.sim import T0, Sim, make_run, step

SP = m.StepPhase
NS = "default"


def secret_env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": "value"}}}


def config_env(name: str, config_map: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": config_map, "key": "k"}}}


def with_env(name: str, *env: dict[str, Any], deps: tuple[str, ...] = (), **extra: Any) -> Any:
    body = step(name, *deps, **extra)
    body["container"]["env"] = list(env)
    return body


def created_by(run: m.AgentRun, user: str | None, groups: Any = None) -> m.AgentRun:
    annotations: dict[str, str] = {}
    if user is not None:
        annotations[m.ANNOTATION_CREATED_BY] = user
    if groups is not None:
        annotations[m.ANNOTATION_CREATED_BY_GROUPS] = (
            groups if isinstance(groups, str) else json.dumps(groups)
        )
    run.metadata.annotations = annotations or None
    return run


class FakeAuthorization:
    """An AuthorizationV1Api answering LocalSubjectAccessReviews from a set of grants."""

    def __init__(self, grants: set[tuple[str, str, str, str]]) -> None:
        self.grants = grants
        """(user or group, verb, resource, name) allowed."""
        self.asked: list[dict[str, Any]] = []

    def create_namespaced_local_subject_access_review(
        self, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        assert body["kind"] == "LocalSubjectAccessReview"
        assert body["metadata"]["namespace"] == namespace
        self.asked.append(body)
        spec = body["spec"]
        attrs = spec["resourceAttributes"]
        assert attrs["namespace"] == namespace
        who = [spec["user"], *spec["groups"]]
        allowed = any(
            (w, attrs["verb"], attrs["resource"], attrs["name"]) in self.grants for w in who
        )
        return {"status": {"allowed": allowed}}


# -- which permissions a step uses ----------------------------------------------------------------


def test_env_references_and_the_service_account_are_checked_each_once() -> None:
    run = make_run(
        [
            with_env(
                "a",
                secret_env("DB", "db-password"),
                secret_env("DB_AGAIN", "db-password"),
                config_env("SETTINGS", "settings"),
                {"name": "LITERAL", "value": "not a reference"},
            )
        ],
        stepTemplate={"serviceAccountName": "deployer"},
    )
    checks = rights.checks_for(run, run.spec.plan.steps[0])
    assert [c.describe() for c in checks] == [
        "get secrets/db-password",
        "get configmaps/settings",
        "impersonate serviceaccounts/deployer",
    ]
    assert [c.source for c in checks] == [
        "env DB",
        "env SETTINGS",
        "stepTemplate.serviceAccountName",
    ]


def test_inputs_from_earlier_steps_are_the_runs_own_results_and_not_checked() -> None:
    run = make_run(
        [step("a"), step("b", "a", inputs=[{"name": "ROWS", "fromStep": "a", "key": "rows"}])]
    )
    assert rights.checks_for(run, run.spec.plan.steps[1]) == []
    assert rights.checks_for(run, run.spec.plan.steps[0]) == []


def test_the_creator_is_read_from_the_admission_annotations() -> None:
    run = make_run([step("a")])
    assert isinstance(authz.creator_of(created_by(run, None)), str)
    assert authz.creator_of(created_by(run, "alice")) == authz.Creator("alice")
    assert authz.creator_of(created_by(run, "alice", ["team", "system:authenticated"])) == (
        authz.Creator("alice", ("team", "system:authenticated"))
    )
    for bad in ('{"a": 1}', "[1]", "not json", '["a", null]'):
        why = authz.creator_of(created_by(run, "alice", bad))
        assert isinstance(why, str) and m.ANNOTATION_CREATED_BY_GROUPS in why, bad


# -- verdicts ----------------------------------------------------------------------------------


def test_a_permission_the_creator_lacks_refuses_the_step_naming_it() -> None:
    run = created_by(
        make_run(
            [with_env("read", secret_env("DB", "db-password")), step("plain")],
            stepTemplate=None,
        ),
        "alice",
        ["system:authenticated"],
    )
    api = FakeAuthorization(set())
    refusals = authz.Authorizer(api).refusals(run)
    assert list(refusals) == ["read"], "a step that references nothing needs no check"
    assert refusals["read"].startswith(
        f"creator alice may not get secrets/db-password in {NS} (env DB)"
    )
    spec = api.asked[0]["spec"]
    assert spec["user"] == "alice" and spec["groups"] == ["system:authenticated"]
    assert spec["resourceAttributes"] == {
        "namespace": NS,
        "verb": "get",
        "group": "",
        "resource": "secrets",
        "name": "db-password",
    }


def test_a_grant_to_the_creator_or_one_of_their_groups_lets_the_step_run() -> None:
    run = make_run(
        [with_env("read", secret_env("DB", "db-password"))],
        stepTemplate={"serviceAccountName": "deployer"},
    )
    grants = {
        ("alice", "get", "secrets", "db-password"),
        ("deployers", "impersonate", "serviceaccounts", "deployer"),
    }
    run = created_by(run, "alice", ["deployers"])
    assert authz.Authorizer(FakeAuthorization(grants)).refusals(run) == {}
    only_alice = created_by(run.model_copy(deep=True), "alice", [])
    refused = authz.Authorizer(FakeAuthorization(grants)).refusals(only_alice)
    assert "may not impersonate serviceaccounts/deployer" in refused["read"]
    assert "secrets" not in refused["read"]


def test_verdicts_are_cached_per_run_and_permission() -> None:
    steps = [with_env(f"s{i}", secret_env("DB", "shared")) for i in range(5)]
    run = created_by(make_run(steps), "alice", [])
    api = FakeAuthorization({("alice", "get", "secrets", "shared")})
    authorizer = authz.Authorizer(api)
    for _ in range(3):
        assert authorizer.refusals(run) == {}
    assert authorizer.reviews == 1 and len(api.asked) == 1
    other = run.model_copy(deep=True)
    other.metadata.uid = "another-run"
    authorizer.refusals(other)
    assert authorizer.reviews == 2, "verdicts belong to one run"


def test_a_right_revoked_while_the_run_goes_on_stops_its_later_launches() -> None:
    run = created_by(make_run([with_env("read", secret_env("DB", "db"))]), "alice", [])
    grants = {("alice", "get", "secrets", "db")}
    now = [0.0]
    authorizer = authz.Authorizer(FakeAuthorization(grants), ttl=60, clock=lambda: now[0])
    assert authorizer.refusals(run) == {}
    grants.clear()  # revoked
    now[0] = 59.0
    assert authorizer.refusals(run) == {}, "a grant is trusted for the ttl"
    assert authorizer.reviews == 1
    now[0] = 60.0
    assert "may not get secrets/db" in authorizer.refusals(run)["read"]
    assert authorizer.reviews == 2
    grants.add(("alice", "get", "secrets", "db"))
    now[0] = 1000.0
    assert "read" in authorizer.refusals(run), "a refusal is final for the run"
    assert authorizer.reviews == 2


def test_granted_is_what_the_creator_was_found_to_have_within_the_ttl_asking_nothing() -> None:
    """What a step of the loop made in a pass may be launched with in that pass
    (agentrun.core.turns.rights_confirmed): the verdicts of earlier steps, only grants, only
    the current creator's, only within the ttl; never a review of its own."""
    run = created_by(
        make_run([with_env("a", secret_env("DB", "db")), with_env("b", secret_env("K", "key"))]),
        "alice",
        [],
    )
    now = [0.0]
    api = FakeAuthorization({("alice", "get", "secrets", "db")})
    authorizer = authz.Authorizer(api, ttl=60, clock=lambda: now[0])
    assert authorizer.granted(run) == frozenset()  # nothing asked yet
    assert authorizer.reviews == 0
    assert set(authorizer.refusals(run)) == {"b"}
    assert authorizer.granted(run) == {("get", "secrets", "db")}  # not the refused key
    assert authorizer.reviews == 2
    someone_else = created_by(run.model_copy(deep=True), "mallory", [])
    assert authorizer.granted(someone_else) == frozenset()
    assert authorizer.granted(created_by(run.model_copy(deep=True), None)) == frozenset()
    now[0] = 60.0
    assert authorizer.granted(run) == frozenset(), "a grant older than the ttl is asked again"
    assert authorizer.reviews == 2


def test_no_recorded_creator_fails_closed_without_asking() -> None:
    run = make_run(
        [with_env("read", config_env("S", "settings")), step("plain")],
        stepTemplate={"serviceAccountName": "deployer"},
    )
    api = FakeAuthorization(set())
    refusals = authz.Authorizer(api).refusals(run)
    assert set(refusals) == {"read", "plain"}, "the ServiceAccount applies to every step"
    assert "no recorded creator" in refusals["read"]
    assert "admission policies" in refusals["read"]
    assert "get configmaps/settings" in refusals["read"]
    assert "impersonate serviceaccounts/deployer" in refusals["plain"]
    assert api.asked == []
    plain = make_run([step("plain")])
    assert authz.Authorizer(api).refusals(plain) == {}


def test_only_steps_that_may_still_launch_are_checked() -> None:
    sim = Sim(created_by(make_run([with_env("a", secret_env("DB", "db"))]), "alice", []))
    api = FakeAuthorization({("alice", "get", "secrets", "db")})
    sim.tick()
    assert sim.step_status("a").phase == SP.LAUNCHING
    assert authz.Authorizer(api).refusals(sim.run) == {}
    assert api.asked == [], "a launched step was checked before its launch"
    finished = sim.run.model_copy(deep=True)
    assert finished.status is not None
    finished.status.phase = m.RunPhase.FAILED
    finished.status.steps = [m.StepStatus(name="a", phase=SP.PENDING)]
    assert authz.Authorizer(api).refusals(finished) == {}
    assert api.asked == []


def test_a_step_is_checked_once_its_dependencies_succeeded() -> None:
    """The core launches a step only then, so a review asked before is a review for nothing,
    and walking the rest of a long plan on every pass a cost for nothing."""
    run = created_by(
        make_run([step("a"), with_env("b", secret_env("DB", "db"), deps=("a",))]), "alice", []
    )
    api = FakeAuthorization(set())
    authorizer = authz.Authorizer(api)
    run.status = m.AgentRunStatus(
        phase=m.RunPhase.RUNNING,
        steps=[m.StepStatus(name="a", phase=SP.RUNNING), m.StepStatus(name="b", phase=SP.PENDING)],
    )
    assert authorizer.refusals(run) == {}
    assert api.asked == [], "a step waiting for its dependencies was checked"
    run.status.steps = [
        m.StepStatus(name="a", phase=SP.SUCCEEDED),
        m.StepStatus(name="b", phase=SP.PENDING),
    ]
    (refusal,) = authorizer.refusals(run).items()
    assert refusal[0] == "b" and "may not get secrets/db" in refusal[1]
    assert len(api.asked) == 1


# -- the core acts on the verdicts -----------------------------------------------------------------


def test_a_refused_step_fails_forbidden_before_any_job() -> None:
    run = make_run([step("read"), step("after", "read")])
    message = "creator alice may not get secrets/db-password in default (env DB)"
    decision = reconcile(run, Observed(refusals={"read": message}), T0)
    read = next(s for s in decision.status.steps or [] if s.name == "read")
    assert read.phase == SP.FAILED and read.attempt == 0 and read.job_name is None
    assert read.error is not None and read.error.reason == "Forbidden"
    assert read.error.message == message
    assert not [a for a in decision.after_commit if isinstance(a, CreateJob)]
    assert decision.status.phase == m.RunPhase.FAILED
    warnings = [
        a for a in decision.after_commit if isinstance(a, EmitEvent) and a.type == "Warning"
    ]
    assert any(w.reason == "Forbidden" and "db-password" in w.message for w in warnings)


def test_a_refusal_of_a_step_not_ready_yet_waits_for_it() -> None:
    sim = Sim(make_run([step("first"), step("second", "first")]))
    refused = {"second": "creator alice may not impersonate serviceaccounts/x in default"}
    sim.observed = lambda: Observed(  # type: ignore[method-assign]
        tuple(Sim.observed(sim).jobs), refusals=refused
    )
    sim.tick()
    assert sim.step_status("first").phase == SP.LAUNCHING
    assert sim.step_status("second").phase == SP.PENDING
    sim.tick()
    sim.finish(sim.job_of("first").name)
    sim.tick()
    assert sim.step_status("second").phase == SP.FAILED
    assert sim.creations.keys() == {sim.job_of("first").name}


def test_the_rights_a_runs_executor_needs_are_kept_current_without_a_step_using_them() -> None:
    """An agent run's executor holds the MCP servers' header Secrets, which only a discovery
    or a call of theirs would have checked: the shell asks for them (refresh) while the run
    may take turns, so that an operator restarted mid-run makes an executor at once."""
    server = {
        "name": "tools",
        "url": "http://tools.team.svc:8000/mcp",
        "headers": [{"name": "Authorization", "secretKeyRef": {"name": "mcp", "key": "token"}}],
        "tools": [{"name": "lookup"}],
    }
    sim = ExecutorSim(agent_run(mcpServers=[server]))
    sim.settle()
    assert (
        sim.agent.stage == agent_status.AgentStage.WAITING
    )  # discovering: the executor starts beside
    checks = turn_steps.executor_checks(sim.run)
    assert ("get", "secrets", "mcp") in {c.permission for c in checks}
    run = created_by(sim.run.model_copy(deep=True), "alice", [])
    api = FakeAuthorization({("alice", "get", "secrets", "mcp")})
    authorizer = authz.Authorizer(api)
    assert authorizer.granted(run) == frozenset()
    authorizer.refresh(run, checks)
    assert authorizer.granted(run) == {("get", "secrets", "mcp")}
    authorizer.refresh(run, checks)
    assert authorizer.reviews == 1, "asked again only after the ttl"
    sim.status.phase = m.RunPhase.FAILED
    assert turn_steps.executor_checks(sim.run) == [], "a run that ended keeps no executor"


def test_the_executors_rights_are_asked_before_the_first_turn_begins() -> None:
    """Its verdicts are wanted in the pass that begins the first turn (which waits for the
    executor instead of running as a Job of its own), so the shell asks for them from the
    run's first pass; not while its plan still runs (the first turn is further off)."""
    keyed = {"baseURL": "http://127.0.0.1:9/v1", "name": "m",
             "apiKeySecretRef": {"name": "llm-key", "key": "token"}}  # fmt: skip
    fresh = agent_run(model=keyed)
    assert fresh.status is None
    key = ("get", "secrets", "llm-key")
    assert key in {c.permission for c in turn_steps.executor_checks(fresh)}
    planned = ExecutorSim(agent_run(model=keyed, plan=[step("prepare")]))
    planned.settle()
    assert planned.step_status("prepare").phase == SP.LAUNCHING
    assert turn_steps.executor_checks(planned.run) == []
    planned.finish(planned.job_of("prepare").name)
    planned.settle()  # the plan done: the first turn begins once the rights are confirmed
    assert key in {c.permission for c in turn_steps.executor_checks(planned.run)}
