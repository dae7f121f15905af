"""Sub-agents in the pure core: a child's name, limits, carved budget, manifest, adoption,
outcome, switches and family (agentrun.core.subagents; not wired into a pass yet)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from agentrun import settings as s
from agentrun.api import agent as a
from agentrun.api import agent_status
from agentrun.api import models as m
from agentrun.clients.plugin import commands
from agentrun.core import subagents as sa
from agentrun.core.agent_loop import AgentConfig
from agentrun.core.naming import sha256_text
from tests.support import child_proofs
from tests.support.agent_sim import agent_run
from tests.support.sim import UID

OTHER_UID = "00000000-0000-4000-8000-00000000beef"
CHILD_UID = "00000000-0000-4000-8000-00000000c001"

TOOL = sa.SubAgentTool(
    agent=a.Agent.model_validate(
        {
            "model": {"baseURL": "http://127.0.0.1:9/v1", "name": "scripted"},
            "instructions": "You look things up.",
        }
    ),
    preamble="Answer in one line.",
    max_tokens=5000,
)
KEY = f"{UID}:1:call-a:0123abcd"


def _parent(**spec: Any) -> m.AgentRun:
    return agent_run(spec=spec or None)


def _child(**kw: Any) -> sa.ObservedChild:
    values: dict[str, Any] = {
        "name": "agent-sub-x",
        "uid": CHILD_UID,
        "controller_uid": UID,
        "spec_digest": "d",
        "proven": True,
    }
    values.update(kw)
    return sa.ObservedChild(**values)


def test_a_child_is_named_from_the_call_key_alone_as_a_dns_label() -> None:
    name = sa.child_name("agent", KEY)
    assert name == sa.child_name("agent", KEY)
    assert name != sa.child_name("agent", KEY.replace("call-a", "call-b"))
    assert name.startswith("agent-sub-")
    long = sa.child_name("x" * 200, KEY)
    assert len(long) <= 63 and long.endswith(name.rsplit("-", 1)[1])


@pytest.mark.parametrize(
    ("depth", "this_turn", "started", "refused"),
    [
        (0, 0, 0, None),
        (1, 3, 15, None),
        (2, 0, 0, "depth 3"),
        (0, 4, 4, "in one turn"),
        (0, 0, 16, "already started 16"),
    ],
)
def test_depth_and_fan_out_are_limited_by_the_defaults(
    depth: int, this_turn: int, started: int, refused: str | None
) -> None:
    problem = sa.limit_problem(depth, this_turn, started, sa.Limits())
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem


def test_the_budget_is_carved_from_what_the_parent_has_left() -> None:
    # 10000 - 3000 used - 1500 still open to running children - 500 for the parent's next turn
    assert sa.carve(10_000, 3000, 1500, 500, None, 100) == sa.Carve(5000)
    assert sa.carve(10_000, 3000, 1500, 500, 2000, 100) == sa.Carve(2000)
    refused = sa.carve(10_000, 9000, 900, 50, 2000, 100)
    assert refused.tokens is None and refused.problem is not None and "50 tokens" in refused.problem
    assert sa.carve(None, 3000, 0, 500, 2000, 100) == sa.Carve(2000)
    assert sa.carve(None, 3000, 0, 500, None, 100) == sa.Carve(None)


def test_children_count_against_the_parent_by_uid_and_at_most_their_carve() -> None:
    carved = {CHILD_UID: 1000, OTHER_UID: 500}
    children = [
        _child(tokens=400, phase=m.RunPhase.RUNNING),
        _child(uid=OTHER_UID, tokens=10**9, phase=m.RunPhase.SUCCEEDED),  # a raised budget
        _child(uid="00000000-0000-4000-8000-0000000000ff", tokens=777),  # not a committed child
    ]
    assert sa.counted_tokens(carved, {}, children) == {CHILD_UID: 400, OTHER_UID: 500}
    # A child gone keeps what was counted; a count never goes down.
    assert sa.counted_tokens(carved, {CHILD_UID: 400, OTHER_UID: 500}, children[1:]) == {
        CHILD_UID: 400,
        OTHER_UID: 500,
    }
    # A running child may still use the rest of its carve; a finished one nothing more.
    assert sa.outstanding(carved, children) == 600
    assert sa.outstanding(carved, []) == 1500


def test_the_child_is_owned_by_the_parent_with_the_declared_agent_and_the_parents_policy() -> None:
    parent = _parent(policy={"approvalRequiredFor": ["write"]}, stepTemplate={})
    goal = sa.goal_of(TOOL, {"goal": "find the slow query"})
    assert goal == "Answer in one line.\n\nfind the slow query"
    assert sa.goal_of(TOOL, {"goal": "  "}) is None
    assert sa.goal_of(TOOL, {"query": "x"}) is None
    child = sa.child_manifest(parent, 0, KEY, TOOL, goal, 4000)
    assert child["metadata"]["name"] == sa.child_name("agent", KEY)
    assert child["metadata"]["ownerReferences"] == [
        {
            "apiVersion": m.API_VERSION,
            "kind": m.KIND,
            "name": "agent",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = child["spec"]
    assert spec["budget"] == {"maxTokens": 4000}
    assert spec["policy"] == {"approvalRequiredFor": ["write"]}
    assert spec["agent"]["instructions"] == "You look things up."
    assert "approvals" not in spec  # a child's approvals are its own
    # It is a valid AgentRun.
    m.AgentRun.model_validate({"metadata": child["metadata"], "spec": spec})


def test_a_child_is_adopted_only_when_it_is_the_parents_by_uid_and_by_spec() -> None:
    spec = sa.child_spec(_parent(), TOOL, "g", 4000)
    digest = sa.spec_digest(spec)
    assert sa.adopt(_child(spec_digest=digest), UID, digest) == sa.Adopted(CHILD_UID)
    stranger = sa.adopt(_child(spec_digest=digest, controller_uid=OTHER_UID), UID, digest)
    assert isinstance(stranger, sa.Refused) and "not controlled" in stranger.message
    unowned = sa.adopt(_child(spec_digest=digest, controller_uid=None), UID, digest)
    assert isinstance(unowned, sa.Refused)
    other = sa.child_spec(_parent(), TOOL, "another goal", 4000)
    changed = sa.adopt(_child(spec_digest=sa.spec_digest(other)), UID, digest)
    assert isinstance(changed, sa.Refused) and changed.reason == sa.CHILD_NAME_TAKEN
    # The mimic: the exact child the call makes (its controller, spec and all), made by
    # someone else first. It carries no proof of the operator's: never the call's child.
    mimic = sa.adopt(_child(spec_digest=digest, proven=False), UID, digest)
    assert isinstance(mimic, sa.Refused) and mimic.reason == sa.CHILD_NAME_TAKEN
    assert "not created by the operator" in mimic.message


def test_a_childs_proof_covers_its_parent_name_call_and_spec_but_not_the_switches() -> None:
    parent = agent_run(spec=None)
    body = sa.child_manifest(parent, 0, KEY, TOOL, "g", 4000)
    assert not child_proofs.proven(body, UID)  # the exact object, unsigned: no proof
    child_proofs.sign(body, UID)
    assert child_proofs.proven(body, UID)
    body["spec"]["cancel"] = True  # the parent's switch: still the child it made
    body["spec"]["suspend"] = True
    assert child_proofs.proven(body, UID)
    assert not child_proofs.proven(body, OTHER_UID)  # another parent's
    copied = json.loads(json.dumps(body))
    copied["spec"]["goal"] = "FORGED"  # the proof copied onto another goal
    assert not child_proofs.proven(copied, UID)
    renamed = json.loads(json.dumps(body))
    renamed["metadata"]["name"] = "agent-sub-other"
    assert not child_proofs.proven(renamed, UID)
    rekeyed = json.loads(json.dumps(body))
    rekeyed["metadata"]["annotations"][sa.ANNOTATION_CALL] = f"{UID}:2:other:00"
    assert not child_proofs.proven(rekeyed, UID)
    forged = json.loads(json.dumps(body))
    child_proofs.sign(forged, UID, key=b"x" * 32)  # signed with a key of someone else's
    assert not child_proofs.proven(forged, UID)


def test_the_result_is_read_from_the_child_by_uid_never_by_name() -> None:
    same_name = _child(uid=OTHER_UID, phase=m.RunPhase.SUCCEEDED, answer="not it")
    assert sa.child_outcome(CHILD_UID, [same_name]).error is not None
    running = _child(phase=m.RunPhase.RUNNING)
    assert sa.child_outcome(CHILD_UID, [same_name, running]) == sa.Outcome(False)
    unread = _child(phase=m.RunPhase.SUCCEEDED)
    assert sa.child_outcome(CHILD_UID, [unread]) == sa.Outcome(False)
    answered = _child(phase=m.RunPhase.SUCCEEDED, answer="it was the index")
    assert sa.child_outcome(CHILD_UID, [same_name, answered]) == sa.Outcome(
        True, answer="it was the index"
    )
    failed = _child(phase=m.RunPhase.FAILED, message="MaxTurnsReached")
    outcome = sa.child_outcome(CHILD_UID, [failed])
    assert outcome.done and outcome.error is not None and "MaxTurnsReached" in outcome.error


def test_cancel_and_suspend_of_the_parent_reach_running_children() -> None:
    running = _child(phase=m.RunPhase.RUNNING)
    done = _child(uid=OTHER_UID, phase=m.RunPhase.SUCCEEDED)
    assert sa.child_switches(False, False, [running, done], {}) == []
    assert sa.child_switches(True, False, [running, done], {}) == [
        sa.Switch(running.name, CHILD_UID, True, False)
    ]
    assert sa.child_switches(False, True, [running], {}) == [
        sa.Switch(running.name, CHILD_UID, False, True)
    ]
    suspended = _child(phase=m.RunPhase.SUSPENDED, suspend=True)
    assert sa.child_switches(False, False, [suspended], {}) == [
        sa.Switch(running.name, CHILD_UID, False, False)
    ]
    # A cancelled child stays cancelled when the parent is resumed.
    cancelled = _child(phase=m.RunPhase.RUNNING, cancel=True)
    assert sa.child_switches(False, False, [cancelled], {}) == []


def test_a_child_over_its_carved_budget_is_cancelled() -> None:
    at = _child(phase=m.RunPhase.RUNNING, tokens=1000)
    assert sa.child_switches(False, False, [at], {CHILD_UID: 1000}) == []
    over = _child(phase=m.RunPhase.RUNNING, tokens=1001)
    assert sa.child_switches(False, False, [over], {CHILD_UID: 1000}) == [
        sa.Switch(over.name, CHILD_UID, True, False)
    ]
    finished = _child(phase=m.RunPhase.SUCCEEDED, tokens=5000)
    assert sa.child_switches(False, False, [finished], {CHILD_UID: 1000}) == []


def test_the_family_is_found_by_controller_uid_with_phases_and_tokens() -> None:
    root = _child(name="agent", uid=UID, controller_uid=None, tokens=100)
    kid = _child(name="agent-sub-1", tokens=40, phase=m.RunPhase.SUCCEEDED)
    grandkid = _child(name="agent-sub-1-sub-1", uid=OTHER_UID, controller_uid=CHILD_UID, tokens=5)
    labelled_only = _child(name="imposter", uid="u-x", controller_uid=None, tokens=9)
    # A cycle of owner references never loops.
    loop = _child(name="agent", uid=UID, controller_uid=OTHER_UID, tokens=100)
    tree = sa.family(root, [kid, grandkid, labelled_only, loop])
    assert [c.name for c in tree.children] == ["agent-sub-1"]
    assert tree.children[0].children[0].depth == 2
    # Each run's own status.usage.tokens, which hold its children's: never summed again.
    assert sa.tree_rows(tree) == [
        ["agent", "Pending", "100"],
        ["  agent-sub-1", "Succeeded", "40"],
        ["    agent-sub-1-sub-1", "Pending", "5"],
    ]


def _body(name: str, uid: str, owner: dict[str, Any] | None, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": meta,
        "spec": {"goal": f"goal of {name}"},
        "status": status,
    }


def _owner(uid: str, **over: Any) -> dict[str, Any]:
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "name": "agent",
        "uid": uid,
        "controller": True,
        **over,
    }


def test_a_run_read_from_the_api_counts_only_its_agentrun_controller() -> None:
    kid = sa.observed_run(
        _body("k", CHILD_UID, _owner(UID), phase="Running", usage={"tokens": 42}, message="m")
    )
    assert (kid.controller_uid, kid.phase, kid.tokens, kid.message) == (
        UID,
        m.RunPhase.RUNNING,
        42,
        "m",
    )
    for owner in (
        _owner(UID, controller=False),
        _owner(UID, kind="Job"),
        _owner(UID, apiVersion="example.com/v1alpha1"),
    ):
        assert sa.observed_run(_body("k", CHILD_UID, owner)).controller_uid is None
    odd = sa.observed_run(_body("k", CHILD_UID, None, phase="Sleeping", usage={"tokens": -5}))
    assert (odd.phase, odd.tokens) == (None, 0)
    odder = sa.observed_run(_body("k", CHILD_UID, None, phase={"a": 1}, usage={"tokens": True}))
    assert (odder.phase, odder.tokens) == (None, 0)


def test_the_spec_digest_ignores_the_defaults_the_api_server_fills_in() -> None:
    spec = sa.child_spec(_parent(), TOOL, "g", 4000)
    stored = m.AgentRunSpec.model_validate(spec).model_dump(mode="json", by_alias=True)
    assert stored != spec  # the defaults written out, as read back
    assert sa.spec_digest(stored) == sa.spec_digest(spec) is not None
    assert sa.spec_digest({"goal": "g", "unknown": 1}) is None
    unparsable = sa.observed_run({**_body("k", CHILD_UID, _owner(UID)), "spec": {"x": 1}})
    assert isinstance(sa.adopt(unparsable, UID, sa.spec_digest(spec)), sa.Refused)


class _Runs:
    namespace = "default"

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies

    def get_run_body(self, name: str) -> dict[str, Any]:
        return next(b for b in self.bodies if b["metadata"]["name"] == name)

    def list_runs(self) -> list[dict[str, Any]]:
        return self.bodies


def test_kubectl_agentrun_tree_prints_the_family_by_controller_uid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = _Runs(
        [
            _body("agent", UID, None, phase="Running", usage={"tokens": 300}),
            _body("agent-sub-b", OTHER_UID, _owner(UID), phase="Running", usage={"tokens": 20}),
            _body("agent-sub-a", CHILD_UID, _owner(UID), phase="Succeeded", usage={"tokens": 80}),
            _body("labelled", "u-1", _owner(UID, controller=False), usage={"tokens": 5}),
        ]
    )
    args = commands.build_parser().parse_args(["tree", "agentrun/agent"])
    assert commands.cmd_tree(session, args) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines() == [
        "RUN            PHASE      TOKENS (WITH SUB-AGENTS)",
        "agent          Running    300",
        "  agent-sub-a  Succeeded  80",
        "  agent-sub-b  Running    20",
    ]


OPERATOR = "system:serviceaccount:agentrun-system:agentrun-operator"


def _made(parent: dict[str, Any], call: str, by: str = OPERATOR) -> dict[str, Any]:
    """The child the operator makes for ``call`` of ``parent``, as stored after admission."""
    run = m.AgentRun.model_validate(parent)
    depth = int(parent["metadata"].get("annotations", {}).get(sa.ANNOTATION_DEPTH, "0"))
    key = f"{parent['metadata']['uid']}:1:{call}:ab"
    body = sa.child_manifest(run, depth, key, TOOL, "g", None)
    body["metadata"]["uid"] = f"00000000-0000-4000-8000-{sha256_text(call)[:12]}"
    body["metadata"]["annotations"][m.ANNOTATION_CREATED_BY] = by
    return child_proofs.sign(body, parent["metadata"]["uid"]) if by == OPERATOR else body


def test_a_child_acts_for_its_parents_creator_only_when_it_is_that_parents_child() -> None:
    user = _body("agent", UID, None)
    user["metadata"]["annotations"] = {
        m.ANNOTATION_CREATED_BY: "alice",
        m.ANNOTATION_CREATED_BY_GROUPS: '["devs"]',
    }
    assert sa.acting_creator([user], OPERATOR, sa.Limits(), child_proofs.proven) == sa.ActingFor(
        "alice", '["devs"]', ("agent",)
    )
    child = _made(user, "c1")
    grandchild = _made(child, "c2")
    found = sa.acting_creator([grandchild, child, user], OPERATOR, sa.Limits(), child_proofs.proven)
    assert isinstance(found, sa.ActingFor) and found.user == "alice" and found.depth == 2
    assert grandchild["metadata"]["annotations"][sa.ANNOTATION_DEPTH] == "2"
    # The depth decides from the chain: an annotation edited back to 0 changes nothing.
    grandchild["metadata"]["annotations"][sa.ANNOTATION_DEPTH] = "0"
    again = sa.acting_creator([grandchild, child, user], OPERATOR, sa.Limits(), child_proofs.proven)
    assert isinstance(again, sa.ActingFor) and again.depth == 2
    assert sa.limit_problem(again.depth, 0, 0, sa.Limits()) is not None
    assert found.via == (grandchild["metadata"]["name"], child["metadata"]["name"], "agent")
    # One level deeper than allowed: no user is reached within max_depth.
    great = _made(grandchild, "c3")
    deep = sa.acting_creator(
        [great, grandchild, child, user], OPERATOR, sa.Limits(), child_proofs.proven
    )
    assert isinstance(deep, sa.Refused) and "deeper" in deep.message
    # A run made by someone else is theirs, whatever it claims.
    by_bob = _made(user, "c1", by="bob")
    assert sa.acting_creator(
        [by_bob, user], OPERATOR, sa.Limits(), child_proofs.proven
    ) == sa.ActingFor("bob", None, (by_bob["metadata"]["name"],))


def test_a_child_pointed_at_another_parent_or_orphaned_acts_for_nobody() -> None:
    user = _body("agent", UID, None)
    user["metadata"]["annotations"] = {m.ANNOTATION_CREATED_BY: "alice"}
    admin = _body("admin-run", OTHER_UID, None)
    admin["metadata"]["annotations"] = {m.ANNOTATION_CREATED_BY: "root"}
    child = _made(user, "c1")
    assert (
        sa.acting_creator([child], OPERATOR, sa.Limits(), child_proofs.proven).__class__
        is sa.Refused
    )
    moved = {**child, "metadata": {**child["metadata"], "ownerReferences": [_owner(OTHER_UID)]}}
    assert isinstance(
        sa.acting_creator([moved, admin], OPERATOR, sa.Limits(), child_proofs.proven), sa.Refused
    )
    # Its call key re-pointed as well: the name still binds it to its own parent.
    rekeyed = {
        **moved,
        "metadata": {
            **moved["metadata"],
            "annotations": {
                **moved["metadata"]["annotations"],
                sa.ANNOTATION_CALL: f"{OTHER_UID}:1:c1:ab",
            },
        },
    }
    assert isinstance(
        sa.acting_creator([rekeyed, admin], OPERATOR, sa.Limits(), child_proofs.proven), sa.Refused
    )
    unrecorded = _body("x", CHILD_UID, None)
    assert isinstance(
        sa.acting_creator([unrecorded], OPERATOR, sa.Limits(), child_proofs.proven), sa.Refused
    )
    assert isinstance(sa.acting_creator([], OPERATOR, sa.Limits(), child_proofs.proven), sa.Refused)
    # The exact child, its admission record forged as the operator's (no policy installed),
    # without the operator's proof: it acts for nobody.
    unsigned = _made(user, "c1")
    unsigned["metadata"]["annotations"].pop(s.ANNOTATION_PROOF)
    assert isinstance(
        sa.acting_creator([unsigned, user], OPERATOR, sa.Limits(), child_proofs.proven), sa.Refused
    )


def test_the_parent_keeps_room_for_the_turn_that_reads_the_answers() -> None:
    model = a.ModelEndpoint.model_validate(
        {"baseURL": "http://127.0.0.1:9/v1", "name": "m", "maxOutputTokens": 500}
    )
    ctx = agent_status.ContextStatus(turn=1, name="c", parts=1, digest="d", bytes=4000, messages=2)
    config = AgentConfig(tool_result_bytes=8000, bytes_per_token=4)
    # This turn: 500 + 1000 of prompt; the next: that prompt, this turn's 500, two results
    # of at most 2000 tokens each, and 500 more of output.
    assert sa.parent_keeps(model, ctx, 2, config) == 500 + 1000 + 500 + 4000
    assert sa.parent_keeps(model, ctx, 1, config) < sa.parent_keeps(model, ctx, 2, config)


def test_a_repeated_create_is_the_same_child_only_from_the_committed_carve() -> None:
    h = sa.call_args_hash(TOOL, {"goal": "find the slow query"})
    assert h == sa.call_args_hash(TOOL, {"goal": "find the slow query"})
    assert h != sa.call_args_hash(TOOL, {"goal": "find the slow disk"})
    other_tool = sa.SubAgentTool(agent=TOOL.agent, preamble="Be brief.", max_tokens=5000)
    assert h != sa.call_args_hash(other_tool, {"goal": "find the slow query"})
    key = f"{UID}:1:call-a:{h}"
    parent = _parent()
    first = sa.child_manifest(parent, 0, key, TOOL, "g", 4000)
    again = sa.child_manifest(parent, 0, key, TOOL, "g", 4000)
    assert first == again
    signed = child_proofs.sign(json.loads(json.dumps(first)), UID)
    stored = sa.observed_run({**signed, "metadata": {**signed["metadata"], "uid": CHILD_UID}})
    stored = dataclasses.replace(stored, proven=child_proofs.proven(signed, UID))
    assert sa.adopt(stored, UID, sa.spec_digest(again["spec"])) == sa.Adopted(CHILD_UID)
    # Carved again from usage that moved on, the spec differs: the carve must be the
    # committed one, or the run's own child would be refused.
    recarved = sa.child_manifest(parent, 0, key, TOOL, "g", 3900)
    assert recarved["metadata"]["name"] == first["metadata"]["name"]
    assert isinstance(sa.adopt(stored, UID, sa.spec_digest(recarved["spec"])), sa.Refused)
