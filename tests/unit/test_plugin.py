"""The pure parts of ``kubectl agentrun``: fork planning, the status tree, history rows,
approval patches, the audit check and argument parsing. No cluster."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.access import approvals, audit
from agentrun.api import agent_defs as d
from agentrun.api import models as m
from agentrun.clients import forks, reading
from agentrun.clients.plugin import commands, render
from agentrun.clients.plugin.kube import PluginError, Session, strip_kind
from agentrun.core import CarriedSource, agent_refs, graph, naming
from agentrun.core import fork_plan as forking
from agentrun.core.observed import Definition
from agentrun.execution import objects
from agentrun.kubeapi import Unreachable
from agentrun.settings import LABEL_KIND, LABEL_RUN_UID, LABEL_STEP
from tests.support.sim import T0, UID, Sim, make_run, step

SP = m.StepPhase
PLUGIN = Path(__file__).resolve().parents[2] / "operator" / "agentrun" / "clients" / "plugin"


def plan_steps(*steps: dict[str, Any]) -> list[m.Step]:
    return make_run(list(steps)).spec.plan.steps


def finished_run(**spec: Any) -> Sim:
    """a -> b -> c, d alone; a's result is big (kept in a ConfigMap), d's small."""
    sim = Sim(make_run([step("a"), step("b", "a"), step("c", "b"), step("d")], **spec))

    def outcome(job: Any) -> tuple[bool, str]:
        if job.step == "a":
            return True, json.dumps({"ok": True, "summary": "big", "result": "x" * 1024})
        return True, f"{job.step} done"

    sim.run_to_end(outcome)
    return sim


def gated_sim() -> Sim:
    """check (done) -> deploy, waiting for approval."""
    sim = Sim(
        make_run(
            [step("check"), step("deploy", "check", risk="external")],
            name="remediate",
            policy={"approvalRequiredFor": ["external"]},
        )
    )
    for _ in range(10):
        sim.tick()
        for job in sim.active():
            sim.finish(job.name, True, "health check failing")
        if sim.status.phase == m.RunPhase.WAITING_FOR_APPROVAL:
            return sim
    raise AssertionError(f"never waited for approval: {sim.status.phase}")


# -- the plan as a graph ------------------------------------------------------------------------


def test_downstream_follows_dependencies_transitively_and_includes_the_start() -> None:
    steps = plan_steps(
        step("a"), step("b", "a"), step("c", "b"), step("d"), step("e", "d", "c"), step("f", "a")
    )
    assert graph.downstream(steps, "b") == {"b", "c", "e"}
    assert graph.downstream(steps, "a") == {"a", "b", "c", "e", "f"}
    assert graph.downstream(steps, "e") == {"e"}
    assert graph.downstream(steps, "d") == {"d", "e"}


def test_downstream_of_a_diamond_reaches_the_join_once() -> None:
    steps = plan_steps(step("top"), step("l", "top"), step("r", "top"), step("join", "l", "r"))
    assert graph.downstream(steps, "l") == {"l", "join"}


def test_depths_are_the_longest_chain_of_dependencies() -> None:
    steps = plan_steps(step("c", "b", "a"), step("a"), step("b", "a"), step("z"))
    assert render.depths(steps) == {"a": 0, "b": 1, "c": 2, "z": 0}


# -- fork planning --------------------------------------------------------------------------------


def test_fork_carries_succeeded_steps_that_are_not_downstream() -> None:
    sim = finished_run()
    plan = forking.plan(sim.run, "b", "demo-fork-abcd")
    assert [c.step for c in plan.carry] == ["a", "d"]
    assert plan.rerun == ["b", "c"]
    assert plan.source == "default/demo"
    by_step = {c.step: c for c in plan.carry}
    assert by_step["a"].copy_name == "demo-fork-abcd-carried-a"  # a result kept by reference
    assert by_step["d"].copy_name is None  # kept inline


def test_fork_reruns_steps_that_did_not_succeed_even_upstream() -> None:
    sim = Sim(make_run([step("a"), step("b", "a"), step("c")]))
    sim.run_to_end(lambda job: (job.step != "c", f"{job.step} out"))
    assert sim.step_status("c").phase == SP.FAILED
    plan = forking.plan(sim.run, "b", "n")
    assert [c.step for c in plan.carry] == ["a"]
    assert plan.rerun == ["b", "c"]  # c is not downstream of b, but it did not succeed


def test_fork_from_an_unknown_step_names_the_steps() -> None:
    sim = finished_run()
    with pytest.raises(
        ValueError, match=r"step 'nope' is not a step of agentrun/demo .*a, b, c, d"
    ):
        forking.plan(sim.run, "nope", "x")


def test_carried_results_hold_inline_results_and_refs_to_the_copies_with_digests() -> None:
    sim = finished_run()
    plan = forking.plan(sim.run, "c", "next")
    content = "x" * 1024
    carry = {c.step: c for c in plan.carry}
    entry_a = forking.carried_result(plan, carry["a"], content)
    assert entry_a["resultRef"] == {"kind": "ConfigMap", "name": "next-carried-a", "key": "result"}
    assert entry_a["resultDigest"] == naming.sha256_text(content)
    assert entry_a["fromRun"] == "default/demo" and entry_a["summary"] == "big"
    assert "result" not in entry_a
    entry_b = forking.carried_result(plan, carry["b"], None)
    assert entry_b["result"] == "b done"
    assert entry_b["resultDigest"] == naming.sha256_text("b done")
    assert "resultRef" not in entry_b
    for entry in (entry_a, entry_b):
        m.CarriedResult.model_validate(entry)  # fits the API


def test_new_run_drops_decisions_and_switches_and_starts_suspended() -> None:
    sim = finished_run()
    old = sim.run.model_dump(mode="json", by_alias=True, exclude_none=True)
    old["metadata"]["labels"] = {"team": "sre", "agentrun.dev/run": "demo"}
    old["spec"].update(
        suspend=False,
        cancel=True,
        approvals=[
            {"step": "a", "decision": "approve", "argsHash": "0" * 64, "by": "alice"},
        ],
    )
    plan = forking.plan(sim.run, "b", "demo-fork-wxyz")
    carried = [forking.carried_result(plan, c, "x" * 1024) for c in plan.carry]
    body = forking.new_run(old, plan, carried)
    assert body["metadata"]["name"] == "demo-fork-wxyz"
    assert body["metadata"]["labels"] == {"team": "sre"}
    assert body["metadata"]["annotations"][forking.ANNOTATION_FORKED_FROM] == (
        "default/demo at step b"
    )
    spec = body["spec"]
    assert spec["suspend"] is True
    assert "approvals" not in spec and "cancel" not in spec
    assert [c["step"] for c in spec["carriedResults"]] == ["a", "d"]
    assert spec["plan"] == old["spec"]["plan"]
    assert "approvals" in old["spec"], "the old run's body is not changed"
    m.AgentRun.model_validate(body)


def test_copy_names_are_dns_labels_and_distinct_for_long_names() -> None:
    assert forking.copy_name("r", "a") == "r-carried-a"
    long_run = "r" * 60
    one = forking.copy_name(long_run, "step-" + "x" * 50 + "1")
    two = forking.copy_name(long_run, "step-" + "x" * 50 + "2")
    for name in (one, two):
        assert len(name) <= 63 and naming.dns_label("p", "s")  # sanity
        assert name == name.lower() and not name.startswith("-") and not name.endswith("-")
    assert one != two


def test_default_fork_name_has_four_random_lowercase_letters() -> None:
    suffix = forks.random_suffix()
    assert len(suffix) == 4 and suffix.isalpha() and suffix.islower()
    assert forking.default_name("remediate", "abcd") == "remediate-fork-abcd"
    assert forking.default_name("r" * 60, "abcd") == "r" * 53 + "-fork-abcd"


def test_a_copy_that_fails_deletes_the_new_run_again_and_says_why() -> None:
    sim = finished_run()
    body = sim.run.model_dump(mode="json", by_alias=True, exclude_none=True)
    calls: list[str] = []

    def unreachable(what: str) -> object:
        calls.append(what)
        raise Unreachable(f"cannot reach the Kubernetes API server at https://x to {what}")

    api = forks.ForkApi(
        get_config_map=lambda name: {"metadata": {"name": name}, "data": sim.results[name]},
        create_run=lambda run, dry: {**run, "metadata": {**run["metadata"], "uid": "u2"}},
        create_config_map=lambda cm: unreachable("copy"),
        resume_run=lambda name: calls.append("resume"),
        delete_run=lambda name: calls.append(f"delete {name}"),
    )
    with pytest.raises(forks.ForkRefused) as refused:
        forks.make(api, body, sim.run, forks.plan(sim.run, "b", "next"))
    assert calls == ["copy", "delete next"]
    assert str(refused.value) == (
        "cannot copy the result of step 'a' into ConfigMap 'next-carried-a': cannot reach the "
        "Kubernetes API server at https://x to copy; agentrun 'next' was deleted again"
    )
    api = dataclasses.replace(api, delete_run=lambda name: unreachable("delete"))
    with pytest.raises(forks.ForkRefused, match=r"'next' could not be deleted again .*: delete it"):
        forks.make(api, body, sim.run, forks.plan(sim.run, "b", "next"))


def test_result_copy_is_owned_by_the_new_run_but_not_as_its_controller() -> None:
    source = {
        "metadata": {"name": "old-a-r123-1", "namespace": "ns"},
        "data": {"result": "x", "field.n": "1"},
    }
    body = forks.result_copy(source, "new-carried-a", "new", "uid-1", "a")
    owner = body["metadata"]["ownerReferences"][0]
    assert owner == {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "name": "new",
        "uid": "uid-1",
        "controller": False,
        "blockOwnerDeletion": False,
    }
    assert body["metadata"]["labels"][LABEL_RUN_UID] == "uid-1"
    assert body["metadata"]["labels"][LABEL_KIND] == "result"
    assert body["data"] == source["data"]


def test_result_copy_lives_beside_its_source_labelled_like_the_runs_other_objects() -> None:
    source = {
        "metadata": {"name": "old-a-r123-1", "namespace": "ns"},
        "data": {"result": "x"},
        "binaryData": {"blob": "AA=="},
    }
    body = forks.result_copy(source, "c", "n" * 70, "uid-1", "a")
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["labels"] == objects.run_labels(
        objects.RunRef("n" * 70, "ns", "uid-1")
    ) | {LABEL_STEP: "a", LABEL_KIND: "result"}
    assert body["metadata"]["annotations"] == {f"{m.GROUP}/carried-from": "ns/old-a-r123-1"}
    assert body["binaryData"] == {"blob": "AA=="}


# -- status ---------------------------------------------------------------------------------------


def test_status_tree_shows_phases_indentation_dependencies_and_the_pending_approval() -> None:
    sim = gated_sim()
    lines = render.status_lines(sim.run, sim.now + timedelta(seconds=75))
    text = "\n".join(lines)
    h = sim.step_status("deploy").args_hash
    assert h
    assert lines[0] == "agentrun/remediate in namespace default"
    assert "phase:    WaitingForApproval" in text
    assert "progress: 1/2" in text
    assert f"waiting for approval (args {h[:12]})" in text
    assert "kubectl agentrun approve|reject remediate deploy" in text
    header = next(i for i, line in enumerate(lines) if line.startswith("STEP"))
    assert lines[header].split() == ["STEP", "PHASE", "ATTEMPT", "DURATION", "AFTER", "DETAILS"]
    check_row, deploy_row = lines[header + 1], lines[header + 2]
    assert check_row.startswith("check ") and "Succeeded" in check_row
    assert "health check failing" in check_row
    assert deploy_row.startswith("  deploy ")  # indented under its dependency
    assert deploy_row.split()[1:3] == ["WaitingForApproval", "-"]
    assert " check " in deploy_row  # the AFTER column


def test_status_tree_shows_errors_as_reason_and_message_and_durations() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    sim.advance(125)
    sim.finish(sim.step_status("a").job_name or "", ok=False, message="boom", exit_code=3)
    sim.run_to_end()
    lines = render.status_lines(sim.run, sim.now)
    row_a = next(line for line in lines if line.startswith("a "))
    error = sim.step_status("a").error
    assert error is not None
    assert f"{error.reason}: " in row_a and "Failed" in row_a
    assert "2m5s" in row_a
    assert "phase:    Failed" in "\n".join(lines)


def test_carried_steps_say_where_their_result_came_from() -> None:
    container = step("a")["container"]
    h = naming.args_hash(container["image"], container["command"], [], [], {})
    carried = [{"step": "a", "fromRun": "ns/old", "summary": "big", "result": "r", "argsHash": h}]
    run = make_run([step("a"), step("b", "a")], carriedResults=carried)
    run.metadata.namespace = "ns"
    sim = Sim(run)
    sim.carried_sources["a"] = CarriedSource("ns/old", h, naming.sha256_text("r"), "big")
    sim.run_to_end()
    text = "\n".join(render.status_lines(sim.run, sim.now))
    assert "big (carried from ns/old)" in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (125, "2m5s"), (3600, "1h"), (3725, "1h2m"),
     (90000, "1d1h"), (-5, "0s")],
)  # fmt: skip
def test_durations_read_like_kubectl(seconds: float, text: str) -> None:
    assert render.duration(seconds) == text


def test_table_aligns_columns_and_leaves_the_last_one_unpadded() -> None:
    lines = render.table(["A", "BB", "C"], [["xxx", "y", "long text"], ["z", "", "t"]])
    assert lines == ["A    BB  C", "xxx  y   long text", "z        t"]


# -- history --------------------------------------------------------------------------------------


def test_history_rows_show_transition_by_and_strip_the_step_prefix() -> None:
    entries = [
        {"at": "2026-11-22T09:00:00Z", "to": "Pending", "reason": "Accepted", "seq": 1},
        {
            "at": "2026-11-22T09:00:05Z",
            "step": "deploy",
            "from": "WaitingForApproval",
            "to": "Launching",
            "reason": "Launching",
            "message": "step deploy: attempt 1 launching (approved by alice)",
            "by": "alice",
            "seq": 2,
        },
    ]
    rows = render.history_rows(entries)
    assert rows[0] == ["2026-11-22T09:00:00Z", "(run)", "(new) -> Pending", "-", "Accepted", "-"]
    assert rows[1] == [
        "2026-11-22T09:00:05Z",
        "deploy",
        "WaitingForApproval -> Launching",
        "alice",
        "Launching",
        "attempt 1 launching (approved by alice)",
    ]
    lines = render.history_lines(entries)
    assert lines[0].split() == ["TIME", "STEP", "TRANSITION", "BY", "REASON", "MESSAGE"]


def test_timeline_is_the_record_then_the_newer_history() -> None:
    record = [{"seq": 1, "to": "Pending"}, {"seq": 2, "to": "Running"}]
    history = [{"seq": 2, "to": "Running"}, {"seq": 4, "to": "Failed"}, {"seq": 3, "to": "x"}]
    assert [e["seq"] for e in reading.merge_timeline(record, history)] == [1, 2, 3, 4]
    assert [e["seq"] for e in reading.merge_timeline([], history)] == [2, 3, 4]


def _recorded(sim: Sim) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    history = list(sim.status.history or [])
    entries = audit.extend(history, 0, audit.genesis(UID))
    return entries, [t.to_wire() for t in history]


def test_verify_accepts_an_intact_record_and_names_edits_and_missing_tail() -> None:
    sim = gated_sim()
    entries, history = _recorded(sim)
    assert reading.verify_record(entries, history, sim.run) == []

    edited = [dict(e) for e in entries]
    edited[1]["by"] = "mallory"
    problems = reading.verify_record(edited, history, sim.run)
    assert any("entry 2 was changed" in p for p in problems)
    assert any("entry 2 disagrees with status.history on by" in p for p in problems)

    sim.status.audit = m.AuditStatus(record="r", recorded_seq=len(entries))
    problems = reading.verify_record(entries[:-1], history, sim.run)
    assert any("entries were removed" in p for p in problems), problems


# -- approvals: agentrun.access.approvals, shared with the typed client ---------------------------


def test_a_step_waiting_for_approval_is_decidable() -> None:
    sim = gated_sim()
    st = approvals.decidable(sim.run, "deploy", force=False)
    assert st.args_hash == sim.step_status("deploy").args_hash


def test_a_step_not_waiting_is_refused_with_its_phase_and_args_hash_unless_forced() -> None:
    sim = gated_sim()
    h = sim.step_status("check").args_hash
    with pytest.raises(approvals.DecisionRefused) as caught:
        approvals.decidable(sim.run, "check", force=False)
    assert str(caught.value).startswith(
        f"step 'check' is not waiting for approval (phase Succeeded); its argsHash is {h}"
    )
    assert approvals.decidable(sim.run, "check", force=True).args_hash == h


def test_unknown_steps_and_steps_without_args_hash_are_refused() -> None:
    sim = Sim(make_run([step("a"), step("b", "a")]))
    sim.tick()
    with pytest.raises(
        approvals.DecisionRefused, match=r"step 'zz' is not a step of agentrun/demo"
    ):
        approvals.decidable(sim.run, "zz", force=True)
    with pytest.raises(
        approvals.DecisionRefused, match=r"step 'b' of agentrun/demo has no argsHash yet"
    ):
        approvals.decidable(sim.run, "b", force=True)


def test_approval_patch_tests_the_resource_version_and_appends() -> None:
    entry = approvals.approval_entry("deploy", m.ApprovalDecision.REJECT, "a" * 64, "bob", "no", T0)
    assert entry == {
        "step": "deploy",
        "decision": "reject",
        "argsHash": "a" * 64,
        "by": "bob",
        "reason": "no",
        "at": "2026-11-22T09:00:00Z",
    }
    m.Approval.model_validate(entry)
    first = approvals.append_approval_patch(
        {"metadata": {"resourceVersion": "7"}, "spec": {}}, entry
    )
    assert first == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/spec/approvals", "value": [entry]},
    ]
    more = approvals.append_approval_patch(
        {"metadata": {"resourceVersion": "8"}, "spec": {"approvals": [entry]}}, entry
    )
    assert more[1] == {"op": "add", "path": "/spec/approvals/-", "value": entry}


# -- arguments ------------------------------------------------------------------------------------


def parse(*argv: str) -> Any:
    return commands.build_parser().parse_args(list(argv))


def test_connection_flags_go_before_or_after_the_command() -> None:
    args = parse("-n", "ns1", "status", "run")
    assert (args.namespace, args.run) == ("ns1", "run")
    args = parse("status", "run", "-n", "ns2", "--context", "c", "--kubeconfig", "k")
    assert (args.namespace, args.context, args.kubeconfig) == ("ns2", "c", "k")
    args = parse("status", "run")
    assert args.namespace is None and args.context is None and args.kubeconfig is None


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate", "x"],
        ["approve", "run"],
        ["reject", "run", "step"],  # --reason is required
        ["reject", "run", "step", "--reason", "  "],
        ["fork", "run"],  # --from is required
        ["wait", "run", "--timeout", "soon"],
        ["status"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        commands.main(argv)
    assert caught.value.code == 2
    assert "usage: kubectl agentrun" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"), [("300", 300), ("90s", 90), ("5m", 300), ("1h", 3600)]
)
def test_timeouts_accept_plain_seconds_and_units(text: str, seconds: float) -> None:
    assert commands.timeout_seconds(text) == seconds


def test_run_names_may_carry_the_kind() -> None:
    assert strip_kind("agentrun/x") == "x"
    assert strip_kind("ar/x") == "x"
    assert strip_kind("agentruns.agentrun.dev/x") == "x"
    assert strip_kind("x") == "x"


def test_a_missing_kubeconfig_is_a_readable_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.kubeconfig"
    assert commands.main(["status", "run", "--kubeconfig", str(missing)]) == 1
    assert capsys.readouterr().err == f"error: kubeconfig '{missing}' does not exist\n"


def test_an_unreachable_server_is_a_readable_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team"}}
                ],
                "current-context": "ctx",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert commands.main(["status", "run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the Kubernetes API server at http://127.0.0.1:9")


def test_the_namespace_comes_from_the_flag_then_the_context(tmp_path: Path) -> None:
    from agentrun.clients.plugin.kube import Session

    config = tmp_path / "config"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team"}},
                    {"name": "b", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "a",
            }
        )
    )
    assert Session.connect(kubeconfig=str(config)).namespace == "team"
    assert Session.connect(kubeconfig=str(config), context="b").namespace == "default"
    assert Session.connect(kubeconfig=str(config), namespace="x").namespace == "x"
    with pytest.raises(PluginError, match="context 'zz' not found in the kubeconfig"):
        Session.connect(kubeconfig=str(config), context="zz")


# Fork planning is agentrun.core.fork_plan: test_layering keeps the core pure.
@pytest.mark.parametrize(
    "module", ["render.py", "transcript.py", "graphs.py", "completion.py", "logs.py"]
)
def test_formatting_stays_pure(module: str) -> None:
    imported: list[str] = []
    for node in ast.walk(ast.parse((PLUGIN / module).read_text())):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    assert not [n for n in imported if n.split(".")[0] in ("kubernetes", "urllib3")]


def test_no_module_of_the_clients_imports_one_that_imports_it_back() -> None:
    """The plugin builds on the shared modules (typed client, reading, forks), never the other
    way round; function-local imports count too."""
    clients = PLUGIN.parent
    package = clients.parents[1]

    def module(path: Path) -> str:
        return ".".join(path.relative_to(package).with_suffix("").parts).removesuffix(".__init__")

    paths = {module(path): path for path in clients.rglob("*.py")}
    graph_: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from package import module` imports the module (the package is importing)
                subs = {f"{node.module}.{a.name}" for a in node.names} & paths.keys()
                found |= subs or {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph_[name] = found & paths.keys()
    for name in graph_:
        seen, todo = set(), list(graph_[name])
        while todo:
            current = todo.pop()
            if current in seen or current not in graph_:
                continue
            seen.add(current)
            todo.extend(graph_[current])
        assert name not in seen, f"{name} imports itself back through {sorted(seen)}"
    shared = ("typed", "forks", "reading")
    for name in shared:
        assert not [n for n in graph_[f"agentrun.clients.{name}"] if ".plugin" in n], name


def test_a_run_the_operator_has_not_seen_yet_renders() -> None:
    run = make_run([step("a"), step("b", "a")])
    text = "\n".join(render.status_lines(run, T0))
    assert "phase:    Pending (not picked up by the operator yet)" in text
    assert "progress: 0/2" in text
    assert render.history_lines([]) == ["TIME  STEP  TRANSITION  BY  REASON  MESSAGE"]


class FakeSession:
    """Just enough of a Session for ``approve``: a run whose resourceVersion moves on the
    first patch, as when the operator commits status in between."""

    namespace = "default"

    def __init__(self, run: m.AgentRun, refusals: list[tuple[int, str]]) -> None:
        self.run = run
        self.version = 1
        self.refusals = refusals
        self.patches: list[list[dict[str, Any]]] = []

    def username(self) -> str:
        return "alice"

    def get_run_body(self, name: str) -> dict[str, Any]:
        body = self.run.model_dump(mode="json", by_alias=True, exclude_none=True)
        body["metadata"]["resourceVersion"] = str(self.version)
        return body

    def get_run(self, name: str) -> tuple[dict[str, Any], m.AgentRun]:
        return self.get_run_body(name), self.run

    def patch_run(self, name: str, body: Any, content_type: str) -> dict[str, Any]:
        self.patches.append(body)
        if self.refusals:
            status, message = self.refusals.pop(0)
            if status == 422 and "rejected our request" in message:
                self.version += 1  # someone else wrote in between: the test op failed
            raise ApiException(status=status, reason="x", body=json.dumps({"message": message}))
        return {}


def _approve(session: FakeSession, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = commands.build_parser().parse_args(["approve", "remediate", "deploy"])
    try:
        code = commands.cmd_approve(session, args)  # type: ignore[arg-type]
    except PluginError as error:
        code = error.code
        print(f"error: {error}", file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_approve_retries_when_the_run_moved_on_and_reports_refusals_verbatim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = gated_sim()
    h = sim.step_status("deploy").args_hash or ""
    moved = FakeSession(
        sim.run, [(422, "the server rejected our request due to an error in our request")]
    )
    code, out, _ = _approve(moved, capsys)
    assert code == 0
    assert out == f"approved step deploy of agentrun/remediate (args {h[:12]}) as alice\n"
    assert [p[0]["value"] for p in moved.patches] == ["1", "2"]  # tested the fresh version

    denied = "ValidatingAdmissionPolicy 'agentrun-approvals' denied request: by must be you"
    refused = FakeSession(sim.run, [(422, denied)])
    code, out, err = _approve(refused, capsys)
    assert code == 1 and out == ""
    assert err == f"error: the API server refused to record the decision: {denied}\n"
    assert len(refused.patches) == 1


# -- status of a run of an Agent ------------------------------------------------------------------


def ref_run(phase: str | None, taken: bool, model_config: bool = True) -> m.AgentRun:
    """A run of Agent triage (spec.agentRef), as stored: in ``phase``, and with the definition
    the operator took on its first pass when ``taken`` (from ModelConfig small, or from the
    Agent's own model)."""
    endpoint = {"baseURL": "http://models.example:8000/v1", "name": "small-model"}
    spec: dict[str, Any] = {"instructions": "Sort the ticket."}
    if model_config:
        spec["modelConfigRef"] = {"name": "small"}
    else:
        spec["model"] = endpoint
    agent = d.AgentObject.model_validate(
        {"metadata": {"name": "triage", "uid": "uid-triage", "generation": 7}, "spec": spec}
    )
    config = d.ModelConfigObject.model_validate(
        {"metadata": {"name": "small", "uid": "uid-small", "generation": 3}, "spec": endpoint}
    )
    run = m.AgentRun.model_validate(
        {
            "metadata": {"name": "sort-7", "namespace": "default", "uid": UID, "generation": 1},
            "spec": {"goal": "sort ticket 7", "agentRef": {"name": "triage"}},
        }
    )
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if taken:
        found = Definition(agent=agent, model=config if model_config else None)
        definition = agent_refs.take(run, found)
        assert isinstance(definition, d.AgentDefinition), definition
        status["agent"] = {"definition": d.wire(definition)}
    return run.model_copy(update={"status": m.AgentRunStatus.model_validate(status)})


class StoredRunSession(FakeSession):
    """A session that reads the run as the plugin's own does (a run of an Agent with the agent
    it took)."""

    get_run = Session.get_run


def _status(run: m.AgentRun, capsys: pytest.CaptureFixture[str]) -> list[str]:
    args = commands.build_parser().parse_args(["status", run.metadata.name])
    assert commands.cmd_status(StoredRunSession(run, []), args) == 0  # type: ignore[arg-type]
    return capsys.readouterr().out.splitlines()


def test_status_of_a_run_of_an_agent_names_the_agent_and_model_config_it_took(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _status(ref_run("Running", taken=True), capsys)
    at = lines.index("agent: Agent triage (generation 7), ModelConfig small (generation 3)")
    assert lines[at + 1] == "  model small-model at http://models.example:8000/v1"
    # An Agent that writes its model out has no ModelConfig to name.
    lines = _status(ref_run("Running", taken=True, model_config=False), capsys)
    assert "agent: Agent triage (generation 7)" in lines


@pytest.mark.parametrize(
    ("phase", "line"),
    [
        (None, "agent: Agent triage (spec.agentRef), not taken yet"),
        ("Pending", "agent: Agent triage (spec.agentRef), not taken yet"),
        ("Failed", "agent: Agent triage (spec.agentRef), never taken (the message says why)"),
    ],
)
def test_status_of_a_run_that_has_not_taken_its_agent_says_so(
    phase: str | None, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _status(ref_run(phase, taken=False), capsys)
    assert line in lines
    assert not [x for x in lines if x.startswith("  model ")]
