"""Asking an agent run the next question (``kubectl agentrun ask``, ``AgentRunClient.ask``):
the run the verb builds, its name, its refusals and what the verb prints. No cluster: the API
calls are fakes that keep what they were given (the operator's side, reading the conversation
after the answer, is in test_agent_resume.py)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.clients import forks
from agentrun.clients.plugin import commands, completion
from agentrun.clients.plugin.kube import PluginError
from agentrun.clients.typed import AgentRunClient, AgentRunError, RunNotFound
from agentrun.core import agent_refs, follow_up
from tests.support.agent_sim import AgentSim, agent_run, call
from tests.support.sim import UID

QUESTION = "and is the cache cold in every region?"


def _answered(name: str = "review", **agent: Any) -> AgentSim:
    """An agent run that answered in turn 2, after a plan step and a tool call."""
    gather = {"name": "gather", "container": {"image": "busybox:1.36", "command": ["true"]}}
    sim = AgentSim(agent_run(name=name, plan=[gather], **agent))
    sim.settle()
    for job in sim.active():
        sim.finish(job.name, True, "gathered")
    sim.answer("", [call("search", {"query": "latency"}, "c1")])
    sim.tools_return()
    sim.answer("the cache is cold")
    assert sim.status.phase == m.RunPhase.SUCCEEDED
    return sim


def _stored(sim: AgentSim, **metadata: Any) -> dict[str, Any]:
    """The run as the API server returns it."""
    body = sim.run.to_wire()
    body.update(apiVersion=m.API_VERSION, kind=m.KIND)
    body["metadata"].update(metadata)
    return body


class Created:
    """``create_run`` of a namespace holding ``taken`` names: what was created, in order."""

    def __init__(self, *taken: str, refuse: ApiException | None = None) -> None:
        self.taken = set(taken)
        self.refuse = refuse
        self.tried: list[str] = []
        self.made: list[dict[str, Any]] = []

    def __call__(self, manifest: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        assert not dry_run
        name = manifest["metadata"]["name"]
        self.tried.append(name)
        if self.refuse is not None:
            raise self.refuse
        if name in self.taken:
            raise ApiException(status=409, reason="AlreadyExists")
        self.taken.add(name)
        stored: dict[str, Any] = json.loads(json.dumps(manifest))
        stored["metadata"].update(namespace="default", uid=f"uid-{name}", resourceVersion="1")
        self.made.append(stored)
        return stored


# -- the run it makes --------------------------------------------------------------------------


def test_the_follow_up_has_the_agent_spec_the_question_and_resumes_after_the_answer() -> None:
    sim = _answered(maxTurns=5, contextBytes=8192)
    approval = {"step": "t1-0-search", "decision": "approve", "argsHash": "a" * 64, "by": "bob"}
    old = _stored(sim, labels={"team": "sre", "agentrun.dev/run-uid": UID})
    old["spec"].update(
        approvals=[approval], actor="carol", budget={"maxTokens": 5000}, suspend=False,
    )  # fmt: skip
    manifest = follow_up.new_run(old, sim.run, QUESTION, "review-2")

    spec = manifest["spec"]
    assert spec["goal"] == QUESTION
    agent = dict(spec["agent"])
    assert agent.pop("resumeFrom") == {"run": "review", "uid": UID, "turn": 2}
    assert agent == old["spec"]["agent"]  # model, tools, instructions, limits as they were
    assert spec["budget"] == {"maxTokens": 5000}
    # The plan's results are in the conversation already; decisions and switches are not kept.
    for gone in ("plan", "carriedResults", "approvals", "actor", "suspend", "cancel"):
        assert gone not in spec, gone
    assert manifest["metadata"] == {
        "name": "review-2",
        "labels": {"team": "sre"},
        "annotations": {
            follow_up.ANNOTATION_CONVERSATION: "review",
            follow_up.ANNOTATION_ASKED_AFTER: "default/review at turn 2",
        },
    }
    parsed = m.AgentRun.model_validate(manifest)  # admission's schema takes it
    assert parsed.spec.agent is not None and parsed.spec.agent.resume_from is not None
    assert old["spec"]["goal"] == "find out why checkout is slow"  # the old body is unchanged


def _run_named(name: str, conversation: str | None = None) -> m.AgentRun:
    annotations = {follow_up.ANNOTATION_CONVERSATION: conversation} if conversation else {}
    return m.AgentRun.model_validate(
        {"metadata": {"name": name, "annotations": annotations}, "spec": {"goal": "g", "agent": {
            "model": {"baseURL": "http://127.0.0.1:9/v1", "name": "m"}}}}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "conversation", "first"),
    [
        ("review", None, ["review-2", "review-3"]),
        ("review-2", "review", ["review-3", "review-4"]),  # the next of its conversation
        ("review-7", "review", ["review-8", "review-9"]),
        ("followup", "review", ["review-2", "review-3"]),  # a follow-up named with --name
        ("node-7", None, ["node-7-2", "node-7-3"]),  # not a follow-up: its number is its name's
        ("a" * 63, None, ["a" * 61 + "-2", "a" * 61 + "-3"]),
    ],
)
def test_default_names_count_the_questions_of_the_conversation(
    name: str, conversation: str | None, first: list[str]
) -> None:
    found = list(follow_up.names(_run_named(name, conversation)))
    assert found[:2] == first
    assert len(found) == follow_up.MAX_NAMES
    assert all(len(n) <= 63 for n in found)


def test_a_taken_name_gives_the_next_and_a_given_one_is_kept_or_refused() -> None:
    sim = _answered()
    created = Created("review-2", "review-3")
    asked = forks.ask(created, _stored(sim), sim.run, QUESTION)
    assert created.tried == ["review-2", "review-3", "review-4"]
    assert (asked.name, asked.source, asked.turn) == ("review-4", "review", 2)
    assert asked.run is created.made[0]
    assert asked.note() == (
        "asked agentrun/review the next question: agentrun/review-4 continues its conversation "
        "after its answer in turn 2 (read by the operator from its records)"
    )

    created = Created("mine")
    with pytest.raises(forks.NameTaken) as taken:
        forks.ask(created, _stored(sim), sim.run, QUESTION, "mine")
    assert str(taken.value) == (
        "agentrun 'mine' already exists in namespace 'default'; choose another --name"
    )
    assert created.tried == ["mine"]

    every = Created(*follow_up.names(sim.run))
    with pytest.raises(forks.NameTaken) as full:
        forks.ask(every, _stored(sim), sim.run, QUESTION)
    assert str(full.value) == (
        "agentrun review-2 to review-101 all exist in namespace 'default'; name the new run "
        "with --name"
    )

    refused = ApiException(status=422, reason="Invalid")
    refused.body = json.dumps({"message": "spec.goal: Too long"})
    with pytest.raises(forks.ForkRefused) as invalid:
        forks.ask(Created(refuse=refused), _stored(sim), sim.run, QUESTION)
    assert str(invalid.value) == "cannot create agentrun 'review-2': spec.goal: Too long"


# -- what cannot be asked -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "said"),
    [
        ("", "the question is empty: give the next question to ask (it becomes the new run's "
             "spec.goal)"),
        (" \n\t", "the question is empty: give the next question to ask (it becomes the new "
                  "run's spec.goal)"),
        ("x" * 4097, "the question is 4097 characters; a run's spec.goal, which it becomes, holds "
                     "at most 4096: ask a shorter one"),
    ],
)  # fmt: skip
def test_an_empty_or_too_long_question_is_refused_before_anything_is_made(
    question: str, said: str
) -> None:
    assert follow_up.question_problem(question) == said
    sim = _answered()
    created = Created()
    with pytest.raises(forks.ForkRefused) as refused:
        forks.ask(created, _stored(sim), sim.run, question)
    assert str(refused.value) == f"cannot ask agentrun/review: {said}"
    assert created.tried == []
    assert follow_up.question_problem("x" * 4096) is None


def _out_of_turns() -> AgentSim:
    sim = AgentSim(agent_run(name="review", maxTurns=2))
    for turn in (1, 2):
        sim.answer("", [call("search", {"query": f"q{turn}"}, f"c{turn}")])
        sim.tools_return()
    return sim


def test_only_a_run_that_answered_can_be_asked_and_the_refusal_says_what_to_do() -> None:
    running = AgentSim(agent_run(name="review"))
    running.answer("", [call("search", {"query": "latency"}, "c1")])
    assert follow_up.ask_problem(running.run) == (
        "agentrun/review has not finished (phase Running: running t1-0-search): ask once it has "
        "answered; kubectl agentrun wait review waits for it"
    )
    failed = _out_of_turns()
    assert follow_up.ask_problem(failed.run) == (
        "agentrun/review ended Failed without an answer (the model was still calling tools in "
        "turn 2, the last one (spec.agent.maxTurns 2), and gave no answer): there is no answer "
        "to ask the next question of; continue its conversation after a turn it closed with "
        "kubectl agentrun fork review --from TURN (TURN 1 to 2), or create a new run"
    )
    cancelled = m.AgentRun.model_validate(
        {**_stored(_answered()), "status": {"phase": "Cancelled", "message": "cancelled"}}
    )
    assert follow_up.ask_problem(cancelled) == (
        "agentrun/review ended Cancelled without an answer (cancelled): there is no answer to "
        "ask the next question of; create a new run with the question as its goal"
    )
    plan_only = _run_named("nightly").model_copy(deep=True)
    plan_only.spec.agent = None
    assert follow_up.ask_problem(plan_only) == (
        "agentrun/nightly is not an agent run (it has no spec.agent): only an agent run's "
        "conversation can be asked the next question; create an agent run with the question as "
        "its spec.goal instead"
    )
    answered = _answered()
    assert follow_up.ask_problem(answered.run) is None
    # A run whose spec.agent changed after it started: its spec is not what its turns used.
    changed = answered.run.model_copy(deep=True)
    assert changed.spec.agent is not None
    changed.spec.agent.model.name = "another-model"
    assert follow_up.ask_problem(changed) == (
        "agentrun/review: its spec.agent.model.name changed after it started, so its spec is "
        "not what its turns used and a follow-up would copy the change; create a new run instead"
    )
    for run in (running.run, failed.run, cancelled, plan_only, changed):
        created = Created()
        with pytest.raises(forks.ForkRefused, match=r"^cannot ask agentrun/"):
            forks.ask(created, run.to_wire(), run, QUESTION)
        assert created.tried == []


# -- kubectl agentrun ask ----------------------------------------------------------------------


class Session:
    """The plugin's session over one namespace: runs by name; ``create_run`` keeps them, and
    ``ending`` is what a created run's status reads as afterwards (the operator's work)."""

    namespace = "default"

    def __init__(self, *runs: dict[str, Any], ending: dict[str, Any] | None = None) -> None:
        self.runs = {r["metadata"]["name"]: r for r in runs}
        self.ending = ending
        self.created = Created(*self.runs)

    def get_run_body(self, name: str) -> dict[str, Any]:
        if name not in self.runs:
            raise PluginError(f"agentrun '{name}' not found in namespace '{self.namespace}'")
        body: dict[str, Any] = json.loads(json.dumps(self.runs[name]))
        return body

    def get_run(self, name: str) -> tuple[dict[str, Any], m.AgentRun]:
        body = self.get_run_body(name)
        return body, m.AgentRun.model_validate(body)

    def create_run(self, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        stored = self.created(body, dry_run)
        if self.ending is not None:
            self.runs[stored["metadata"]["name"]] = {**stored, "status": self.ending}
        else:
            self.runs[stored["metadata"]["name"]] = stored
        return stored

    def get_config_map(self, name: str) -> dict[str, Any] | None:
        return None

    @contextlib.contextmanager
    def reporting(self, what: str) -> Iterator[None]:
        yield


def _kubectl(
    session: Session, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    args = commands.build_parser().parse_args(list(argv))
    try:
        code = args.func(session, args)
    except PluginError as error:
        code = error.code
        print(f"error: {error}", file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ask_creates_the_follow_up_and_prints_its_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = Session(_stored(_answered()))
    code, out, err = _kubectl(session, capsys, "ask", "agentrun/review", QUESTION)
    assert (code, out) == (0, "review-2\n")
    assert "asked agentrun/review the next question: agentrun/review-2 continues" in err
    (made,) = session.created.made
    assert made["spec"]["goal"] == QUESTION
    assert made["spec"]["agent"]["resumeFrom"] == {"run": "review", "uid": UID, "turn": 2}

    code, out, _ = _kubectl(session, capsys, "ask", "review", QUESTION, "-o", "name")
    assert (code, out) == (0, "agentrun.agentrun.dev/review-3\n")
    code, out, _ = _kubectl(session, capsys, "ask", "review", "since when?", "-o", "json")
    shown = json.loads(out)
    assert code == 0 and shown["metadata"]["name"] == "review-4"
    assert shown["spec"]["goal"] == "since when?"
    assert shown["metadata"]["annotations"][follow_up.ANNOTATION_CONVERSATION] == "review"
    code, out, _ = _kubectl(session, capsys, "ask", "review", QUESTION, "--name", "why")
    assert (code, out) == (0, "why\n")


def test_ask_says_what_was_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    session = Session(_stored(_answered()), _stored(_out_of_turns(), name="broken"))
    code, out, err = _kubectl(session, capsys, "ask", "review", "  ")
    assert (code, out) == (2, "")
    assert err == (
        "error: cannot ask agentrun/review: the question is empty: give the next question to "
        "ask (it becomes the new run's spec.goal)\n"
    )
    code, _, err = _kubectl(session, capsys, "ask", "nobody", QUESTION)
    assert (code, err) == (1, "error: agentrun 'nobody' not found in namespace 'default'\n")
    code, _, err = _kubectl(session, capsys, "ask", "broken", QUESTION)
    assert code == 1
    assert err.startswith("error: cannot ask agentrun/broken: agentrun/broken ended Failed ")
    code, _, err = _kubectl(session, capsys, "ask", "review", QUESTION, "--name", "broken")
    assert (code, err) == (
        1,
        "error: agentrun 'broken' already exists in namespace 'default'; choose another --name\n",
    )
    assert session.created.made == []


def test_ask_wait_prints_the_answer_or_says_how_the_follow_up_ended(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answered = {"phase": "Succeeded", "agent": {"answer": "only in eu-west", "turn": 1}}
    session = Session(_stored(_answered()), ending=answered)
    code, out, err = _kubectl(session, capsys, "ask", "review", QUESTION, "--wait")
    assert (code, out) == (0, "only in eu-west")
    assert "waiting for agentrun/review-2 to answer" in err
    code, out, _ = _kubectl(session, capsys, "ask", "review", QUESTION, "--wait", "-o", "yaml")
    assert code == 0 and "answer: only in eu-west" in out and "name: review-3" in out

    failed = {"phase": "Failed", "message": "the model endpoint is down"}
    session = Session(_stored(_answered()), ending=failed)
    code, out, err = _kubectl(session, capsys, "ask", "review", QUESTION, "--wait")
    assert (code, out) == (1, "")
    assert err.endswith(
        "error: agentrun/review-2 Failed: the model endpoint is down; it gave no answer "
        "(kubectl agentrun transcript review-2 shows its turns)\n"
    )


def test_completion_knows_ask_its_arguments_and_outputs() -> None:
    parser = commands.build_parser()
    verbs = {v.name: v for v in completion.verbs(parser)}
    ask = verbs["ask"]
    assert ask.positionals == ["RUN", "QUESTION"]
    assert {"--wait"} <= ask.flags and "--name" in ask.options and "--timeout" in ask.options
    assert ask.choices["-o"] == ["name", "json", "yaml"]
    for shell in completion.SHELLS:
        assert "ask" in completion.script(parser, shell)


# -- AgentRunClient.ask --------------------------------------------------------------------------


class CustomObjects:
    """The part of CustomObjectsApi the typed client's ask uses, over runs in memory."""

    def __init__(self, *runs: dict[str, Any]) -> None:
        self.runs = {r["metadata"]["name"]: r for r in runs}
        self.created = Created(*self.runs)
        self.managers: list[str] = []

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        if name not in self.runs:
            raise ApiException(status=404, reason="Not Found")
        return self.runs[name]

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any],
        field_manager: str, **extra: Any,
    ) -> dict[str, Any]:  # fmt: skip
        self.managers.append(field_manager)
        stored = self.created(body, bool(extra.get("dry_run")))
        self.runs[stored["metadata"]["name"]] = stored
        return stored


def test_the_typed_client_asks_as_the_plugin_does() -> None:
    client = AgentRunClient(api_client=object(), namespace="default")
    custom = CustomObjects(_stored(_answered()), _stored(_out_of_turns(), name="broken"))
    client._custom = custom
    made = client.ask("review", QUESTION)
    assert made.metadata.name == "review-2" and made.spec.goal == QUESTION
    assert made.spec.agent is not None and made.spec.agent.resume_from is not None
    assert made.spec.agent.resume_from.turn == 2
    assert custom.managers == ["agentrun-client"]
    assert client.ask("review", QUESTION, new_name="why").metadata.name == "why"
    with pytest.raises(AgentRunError, match="choose another new_name"):
        client.ask("review", QUESTION, new_name="why")
    with pytest.raises(RunNotFound, match="agentrun 'nobody' not found in namespace 'default'"):
        client.ask("nobody", QUESTION)
    with pytest.raises(AgentRunError, match="agentrun/broken ended Failed without an answer"):
        client.ask("broken", QUESTION)
    with pytest.raises(AgentRunError, match="the question is empty"):
        client.ask("review", "")
    # Without a step, result reads an agent run's answer (to show the follow-up's, once ended).
    assert client.result("review") == "the cache is cold"
    with pytest.raises(AgentRunError, match="agentrun/review-2 has no answer"):
        client.result("review-2")


# -- kubectl agentrun start: a run of an Agent -------------------------------------------------


def test_start_makes_a_run_of_the_agent_with_the_goal_and_its_overrides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = Session()
    code, out, err = _kubectl(
        session, capsys, "start", "triage", "sort ticket 7", "--name", "t7",
        "--max-turns", "3", "--max-tokens", "20000",
    )  # fmt: skip
    assert (code, out) == (0, "t7\n")
    assert "started agentrun/t7, a run of Agent triage" in err
    (made,) = session.created.made
    assert made["spec"] == {
        "goal": "sort ticket 7",
        "agentRef": {"name": "triage", "overrides": {"maxTurns": 3}},
        "budget": {"maxTokens": 20000},
    }
    assert m.AgentRun.model_validate(made).spec.agent_ref is not None

    answered = {"phase": "Succeeded", "agent": {"answer": "a duplicate of 5", "turn": 1}}
    session = Session(ending=answered)
    code, out, _ = _kubectl(session, capsys, "start", "triage", "and 8?", "--name", "t8", "--wait")
    assert (code, out) == (0, "a duplicate of 5")

    code, out, err = _kubectl(Session(), capsys, "start", "triage", "   ")
    assert (code, out) == (2, "")
    assert "cannot start a run of Agent triage: the goal is empty" in err


def test_a_run_of_an_agent_without_a_name_is_named_by_the_api_server() -> None:
    body = agent_refs.run_of("triage", "sort ticket 7")
    assert body["metadata"] == {"generateName": "triage-"}
    assert body["spec"] == {"goal": "sort ticket 7", "agentRef": {"name": "triage"}}
    assert agent_refs.goal_problem("x" * (m.MAX_GOAL + 1)) is not None


def test_the_typed_client_starts_a_run_of_an_agent() -> None:
    client = AgentRunClient(api_client=object(), namespace="default")
    custom = CustomObjects()
    client._custom = custom
    made = client.start("triage", "sort ticket 7", name="t7", overrides={"contextBytes": 8192})
    assert made.metadata.name == "t7" and made.spec.goal == "sort ticket 7"
    assert made.spec.agent_ref is not None and made.spec.agent_ref.name == "triage"
    assert made.spec.agent_ref.overrides is not None
    assert made.spec.agent_ref.overrides.context_bytes == 8192
    with pytest.raises(AgentRunError, match="the goal is empty"):
        client.start("triage", "")
