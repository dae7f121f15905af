"""The benchmark's pure parts (agentrun_devcluster.bench): percentiles, reading the audit log
and /proc, the finished runs it makes without running them, its command line. No cluster, and
nothing here times anything."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from agentrun.api.agent import MAX_TURNS
from agentrun_devcluster.argo import controller_configmap, executor_rbac
from agentrun_devcluster.bench import cases as bench_cases
from agentrun_devcluster.bench import cpulimit
from agentrun_devcluster.bench import main as bench_main
from agentrun_devcluster.bench import peer as bench_peer
from agentrun_devcluster.bench.audit import (
    AuditLog,
    Request,
    by_verb_and_resource,
    job_completions,
    parse_requests,
    parse_time,
    run_finishes,
    step_commits,
    step_marks,
)
from agentrun_devcluster.bench.cases import (
    PASS_SECONDS,
    PASSES,
    WAIT_SECONDS,
    WAITS,
    AgentResult,
    CaseResult,
    ReplicaResult,
    RestResult,
    TurnSample,
    steady_windows,
)
from agentrun_devcluster.bench.peer import (
    EXECUTOR_USER,
    PeerResult,
    PeerRow,
    all_writes,
    engine_writes,
    workflow_finished,
    workloads,
)
from agentrun_devcluster.bench.procstat import parse_cpu_seconds, parse_rss_bytes
from agentrun_devcluster.bench.report import Report, requests_breakdown, speedups
from agentrun_devcluster.bench.session import sample, shard_env
from agentrun_devcluster.bench.stats import medians_by_size, percentile, ratio, summarize
from agentrun_devcluster.bench.workloads import (
    AGENT_TOOL,
    TURN_CALL,
    agent_run,
    argo_workflow,
    bare_job,
    chain_run,
    finished_run,
    finished_status,
    turn_answer,
)

# -- percentiles ------------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_percentile_refuses_nothing_and_bad_ranks() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_and_ratio() -> None:
    assert summarize([]) is None
    s = summarize([float(i) for i in range(1, 101)])
    assert s is not None
    assert (s.count, s.max) == (100, 100.0)
    assert s.p50 == pytest.approx(50.5)
    assert s.p99 == pytest.approx(99.01)
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None


# -- the audit log ----------------------------------------------------------------------------


def event(
    audit_id: str,
    verb: str,
    resource: str,
    *,
    user: str = "agentrun-operator",
    stage: str = "ResponseComplete",
    group: str = "",
    namespace: str | None = "ns",
    name: str | None = None,
    subresource: str | None = None,
    code: int = 200,
    received: str = "2026-01-02T03:04:05.000000Z",
    done: str = "2026-01-02T03:04:05.250000Z",
    body: dict[str, Any] | list[dict[str, Any]] | None = None,
) -> str:
    ref: dict[str, Any] = {"resource": resource, "apiGroup": group}
    if namespace:
        ref["namespace"] = namespace
    if name:
        ref["name"] = name
    if subresource:
        ref["subresource"] = subresource
    data: dict[str, Any] = {
        "auditID": audit_id,
        "stage": stage,
        "verb": verb,
        "user": {"username": user},
        "objectRef": ref,
        "requestReceivedTimestamp": received,
        "stageTimestamp": done,
    }
    if stage == "ResponseComplete":
        data["responseStatus"] = {"code": code}
    if body is not None:
        data["requestObject"] = body
    return json.dumps(data)


def test_parse_time_keeps_microseconds() -> None:
    later = parse_time("2026-01-02T03:04:05.250001Z")
    assert later - parse_time("2026-01-02T03:04:05Z") == pytest.approx(0.250001)


def test_a_watch_is_one_request_and_its_completion_wins() -> None:
    lines = [
        event("w", "watch", "jobs", stage="ResponseStarted"),
        event("g", "get", "agentruns", group="agentrun.dev", name="r"),
        event("w", "watch", "jobs"),
        '{"auditID": "cut", "stage": "Respon',  # a line still being written
        "",
    ]
    requests = parse_requests(lines)
    assert [(r.audit_id, r.verb, r.code) for r in requests] == [
        ("w", "watch", 200),
        ("g", "get", 200),
    ]
    started_only = parse_requests([event("w", "watch", "pods", stage="ResponseStarted")])
    assert started_only[0].code is None
    assert started_only[0].completed is None


def test_counts_by_verb_and_resource_with_subresources() -> None:
    requests = parse_requests(
        [
            event("1", "update", "agentruns", subresource="status", group="agentrun.dev"),
            event("2", "update", "agentruns", subresource="status", group="agentrun.dev"),
            event("3", "create", "events"),
            event("4", "list", "configmaps"),
        ]
    )
    counts = by_verb_and_resource(requests)
    assert counts[("update", "agentruns/status")] == 2
    assert counts[("create", "events")] == 1
    assert [r.write for r in requests] == [True, True, True, False]
    table = "\n".join(requests_breakdown([("run", requests, 1.0), ("per step", requests, 2.0)]))
    assert "update agentruns/status" in table
    writes = next(line for line in table.splitlines() if "= writes" in line)
    assert writes.split()[-2:] == ["3.00", "1.50"]


def test_rows_that_round_to_nothing_in_every_column_are_counted_not_shown() -> None:
    requests = parse_requests(
        [event(str(i), "create", "jobs", group="batch") for i in range(300)]
        + [event("w", "watch", "leases", group="coordination.k8s.io")]
    )
    table = requests_breakdown([("per step", requests, 300.0)])
    assert not [line for line in table if "watch leases" in line], table
    assert "    (1 more verb and resource pair, 0.00 in every column)" in table, table
    total = next(line for line in table if "= all requests" in line)
    assert total.split()[-1] == "1.00", total  # 301 / 300: the hidden row is summed


def job_status(conditions: list[dict[str, str]]) -> dict[str, Any]:
    return {"kind": "Job", "status": {"conditions": conditions}}


def run_status(phase: str, steps: list[dict[str, str]]) -> dict[str, Any]:
    return {"kind": "AgentRun", "status": {"phase": phase, "steps": steps}}


def test_job_completion_is_the_first_write_that_sets_complete() -> None:
    lines = [
        event(
            "1", "update", "jobs", group="batch", name="j", subresource="status",
            user="system:kube-controller-manager", done="2026-01-02T03:04:05.100000Z",
            body=job_status([{"type": "SuccessCriteriaMet", "status": "True"}]),
        ),
        event(
            "2", "update", "jobs", group="batch", name="j", subresource="status",
            user="system:kube-controller-manager", done="2026-01-02T03:04:05.400000Z",
            body=job_status([{"type": "Complete", "status": "True"}]),
        ),
        event(
            "3", "update", "jobs", group="batch", name="j", subresource="status",
            user="system:kube-controller-manager", done="2026-01-02T03:04:06.000000Z",
            body=job_status([{"type": "Complete", "status": "True"}]),
        ),
        event(
            "4", "update", "jobs", group="batch", name="k", subresource="status", code=409,
            body=job_status([{"type": "Failed", "status": "True"}]),
        ),
    ]  # fmt: skip
    done = job_completions(parse_requests(lines))
    assert done == {"ns/j": parse_time("2026-01-02T03:04:05.400000Z")}


def test_step_commit_and_run_finish_from_the_operators_status_writes() -> None:
    running = {"name": "a", "jobName": "r-a-1", "phase": "Running"}
    finished = {**running, "phase": "Succeeded", "finishedAt": "2026-01-02T03:04:06Z"}
    lines = [
        event(
            "1", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            done="2026-01-02T03:04:05.500000Z", body=run_status("Running", [running]),
        ),
        event(
            "2", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            user="someone-else", done="2026-01-02T03:04:05.600000Z",
            body=run_status("Succeeded", [finished]),
        ),
        event(
            "3", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            done="2026-01-02T03:04:05.700000Z", body=run_status("Succeeded", [finished]),
        ),
        event(
            "4", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            done="2026-01-02T03:04:05.900000Z", body=run_status("Succeeded", [finished]),
        ),
    ]  # fmt: skip
    requests = parse_requests(lines)
    at = parse_time("2026-01-02T03:04:05.700000Z")
    assert step_commits(requests, "agentrun-operator") == {"ns/r-a-1": at}
    assert run_finishes(requests, "agentrun-operator") == {"ns/r": at}
    assert step_commits(requests) == {"ns/r-a-1": parse_time("2026-01-02T03:04:05.600000Z")}


def test_step_marks_follow_the_operators_status_patches_in_the_order_they_were_made() -> None:
    """The operator writes status as JSON patches: each is applied to what the run's writes
    before it left, in the order of the versions they were fenced by (not as logged), and a
    run whose first write is missing from the log is left out rather than guessed."""
    launching = {"name": "a", "phase": "Launching", "jobName": "r-a-1"}

    def patch(audit_id: str, version: str, done: str, *ops: dict[str, Any], name: str = "r") -> str:
        fence = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
        return event(
            audit_id, "patch", "agentruns", group="agentrun.dev", name=name,
            subresource="status", done=done, body=[fence, *ops],
        )  # fmt: skip

    whole = {"op": "add", "path": "/status", "value": {"phase": "Running", "steps": [launching]}}
    lines = [
        patch("2", "11", "2026-01-02T03:04:06.000000Z",
              {"op": "replace", "path": "/status/steps/0/phase", "value": "Succeeded"},
              {"op": "add", "path": "/status/steps/0/finishedAt", "value": "2026-01-02T03:04:06Z"},
              {"op": "replace", "path": "/status/phase", "value": "Succeeded"}),
        patch("1", "10", "2026-01-02T03:04:05.500000Z", whole),
        patch("3", "20", "2026-01-02T03:04:07.000000Z",
              {"op": "replace", "path": "/status/phase", "value": "Succeeded"}, name="unseen"),
    ]  # fmt: skip
    requests = parse_requests(lines)
    intent, done = parse_time("2026-01-02T03:04:05.500000Z"), parse_time("2026-01-02T03:04:06Z")
    assert step_marks(requests, "agentrun-operator") == {("ns", "r", "a"): (intent, done)}
    assert run_finishes(requests) == {"ns/r": done}
    assert step_commits(requests) == {"ns/r-a-1": done}


def test_audit_log_reads_slices_and_leaves_a_cut_line_out(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    assert log.mark() == 0
    assert log.read(0) == []
    path.write_text(event("1", "get", "pods") + "\n")
    middle = log.mark()
    with path.open("a") as f:
        f.write(event("2", "list", "pods") + "\n" + event("3", "create", "pods")[:40])
    assert [r.audit_id for r in log.read(0, middle)] == ["1"]
    assert [r.audit_id for r in log.read(middle)] == ["2"]
    assert [r.audit_id for r in log.read(0)] == ["1", "2"]


# -- /proc ------------------------------------------------------------------------------------


def test_rss_and_cpu_from_proc_text() -> None:
    status = "Name:\tpython\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\nThreads:\t4\n"
    assert parse_rss_bytes(status) == 2048 * 1024
    with pytest.raises(ValueError):
        parse_rss_bytes("Name:\tkthreadd\n")
    # the command name may hold spaces and parentheses; utime 150, stime 50 ticks
    stat = "4242 (python (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 4 0"
    assert parse_cpu_seconds(stat, clock_ticks=100) == pytest.approx(2.0)


# -- workloads --------------------------------------------------------------------------------


def test_a_chain_and_its_bare_jobs_run_the_same_command() -> None:
    run = chain_run("r", 3, "case")
    steps = run["spec"]["plan"]["steps"]
    assert [s.get("dependsOn") for s in steps] == [None, ["s000"], ["s001"]]
    job = bare_job("j", "case")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == steps[0]["container"]["command"]
    assert container["image"] == steps[0]["container"]["image"]
    assert job["spec"]["backoffLimit"] == 0


def test_finished_status_is_the_cores_output_for_a_succeeded_run() -> None:
    stored = finished_run("done-1", "rest")
    stored["metadata"].update(
        namespace="bench", uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", generation=1
    )
    status = finished_status(stored)
    assert status["phase"] == "Succeeded"
    assert [s["phase"] for s in status["steps"]] == ["Succeeded"]
    assert status["steps"][0]["idempotencyKey"].startswith(stored["metadata"]["uid"])
    assert stored["metadata"]["finalizers"] == ["agentrun.dev/cleanup"]
    assert status["audit"]["recordedSeq"] == status["historySeq"] > 0, "left level, as runs are"
    assert status["audit"]["record"].startswith("done-1-audit")


def test_step_marks_are_a_steps_first_intent_and_result_writes() -> None:
    launching = {"name": "t1-echo-1", "phase": "Launching", "jobName": "r-t1-1"}
    pending = {"name": "t2-model", "phase": "Pending"}
    done = {**launching, "phase": "Succeeded", "finishedAt": "2026-01-02T03:04:06Z"}
    lines = [
        event(
            "1", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            done="2026-01-02T03:04:05.500000Z", body=run_status("Running", [launching, pending]),
        ),
        event(
            "2", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            done="2026-01-02T03:04:05.800000Z", body=run_status("Running", [done, pending]),
        ),
        event(
            "3", "update", "agentruns", group="agentrun.dev", name="r", subresource="status",
            done="2026-01-02T03:04:05.900000Z", body=run_status("Running", [done, pending]),
        ),
    ]  # fmt: skip
    marks = step_marks(parse_requests(lines), "agentrun-operator")
    assert marks[("ns", "r", "t1-echo-1")] == (
        parse_time("2026-01-02T03:04:05.500000Z"),
        parse_time("2026-01-02T03:04:05.800000Z"),
    )
    assert marks[("ns", "r", "t2-model")] == (None, None)


def test_the_agent_cases_model_calls_the_tool_until_its_last_turn() -> None:
    answer = turn_answer(3)
    first = answer({"messages": [{"role": "user", "content": "go"}]})
    call = first["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == AGENT_TOOL
    tool = {"role": "tool", "tool_call_id": call["id"], "content": "done"}
    second = answer({"messages": [tool]})
    assert second["choices"][0]["message"].get("tool_calls")
    tool2 = {"role": "tool", "tool_call_id": second["choices"][0]["message"]["tool_calls"][0]["id"]}
    last = answer({"messages": [tool, tool2]})
    assert not last["choices"][0]["message"].get("tool_calls")
    body = agent_run("a", 3, "agent", "http://127.0.0.1:1/v1")
    assert body["spec"]["agent"]["maxTurns"] == 4
    assert [t["name"] for t in body["spec"]["agent"]["tools"]] == [AGENT_TOOL]


def test_a_long_agent_run_ends_though_its_older_turns_are_left_out_of_the_context() -> None:
    answer = turn_answer(1000)
    # The context of turn 999 holds only the latest calls: the answer still knows the turn.
    latest = [{"role": "tool", "tool_call_id": f"{TURN_CALL}{n}"} for n in (997, 998)]
    second_last = answer({"messages": latest})
    assert second_last["choices"][0]["message"]["tool_calls"][0]["id"] == f"{TURN_CALL}999"
    latest.append({"role": "tool", "tool_call_id": f"{TURN_CALL}999"})
    assert not answer({"messages": latest})["choices"][0]["message"].get("tool_calls")
    body = agent_run("a", 1000, "agent", "http://127.0.0.1:1/v1")
    assert body["spec"]["agent"]["maxTurns"] == MAX_TURNS, "within what the API allows"


# -- the command line -------------------------------------------------------------------------


def test_quick_is_small_and_flags_win() -> None:
    quick = bench_main.parse_args(["--quick", "--runs", "2,4"])
    assert quick.runs == (2, 4)
    assert quick.finished == bench_main.QUICK["finished"]
    assert quick.chains == ()
    full = bench_main.parse_args(["--operator-env", "AGENTRUN_WORKERS=4", "--chains", ""])
    assert full.runs == (100, 200)
    assert full.chains == ()
    env = full.env()
    assert env.pop("AGENTRUN_LLM_COMMAND").endswith("step llm"), "turns run from this checkout"
    assert env == {"AGENTRUN_WORKERS": "4"}
    assert (quick.turns, full.turns) == ((5,), (20, 20, 20, 1000))
    assert bench_main.parse_args(["--turns", "30"]).turns == (30,)
    assert quick.env()["AGENTRUN_JOB_DELETION_GRACE_SECONDS"] == "5"
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--operator-env", "NOPE"])
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--turns", f"20,{MAX_TURNS + 1}"])


def test_the_agent_case_model_answers_at_once_unless_told_to_think() -> None:
    """By default the scripted model answers at once; --model-delay makes it think."""
    assert bench_main.parse_args([]).model_delay == (0.0, 0.0)
    assert bench_main.parse_args(["--quick"]).model_delay == (0.0, 0.0)
    assert bench_main.parse_args(["--model-delay", "0"]).model_delay == (0.0, 0.0)
    assert bench_main.parse_args(["--model-delay", "0.2-3"]).model_delay == (0.2, 3.0)
    for bad in ("2-1", "-1", "soon"):
        with pytest.raises(SystemExit):
            bench_main.parse_args(["--model-delay", bad])


def test_quick_leaves_the_peer_leg_out_unless_only_names_it_and_says_why() -> None:
    quick = bench_main.parse_args(["--quick"])
    assert quick.only == frozenset(bench_main.CASES) - {"peer"}
    (note,) = quick.skipped
    assert note.startswith("peer: ") and "Docker" in note and "--only peer" in note
    # Asked for, by its name or as argo: only what --only names runs, nothing said skipped.
    for only in ("peer", "argo", "p1,argo", "peer,argo"):
        asked = bench_main.parse_args(["--quick", "--only", only])
        assert "peer" in asked.only and asked.skipped == ()
    assert bench_main.parse_args(["--quick", "--only", "p1,p2"]).only == {"p1", "p2"}
    # The full run runs every case, the peer leg included.
    full = bench_main.parse_args([])
    assert (full.only, full.skipped) == (frozenset(bench_main.CASES), ())
    assert bench_main.parse_args(["--only", "argo"]).only == {"peer"}
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--quick", "--only", "nope"])
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--only", ","])


def test_a_quick_run_without_docker_starts_no_peer_leg_and_exits_0() -> None:
    config = bench_main.parse_args(["--quick", "--only", "p2", "--record", ""])
    config = dataclasses.replace(config, skipped=bench_main.select_cases(None, True)[1])
    bench = mock.MagicMock()
    with (
        mock.patch.object(bench_main, "BenchCluster", return_value=bench),
        mock.patch.object(bench_cases, "operator_runs", return_value=None),
        mock.patch.object(bench_cases, "bare_chains", return_value=None),
        mock.patch.object(bench_cases, "delete_runs"),
        mock.patch.object(bench_cases, "delete_bare"),
        mock.patch.object(bench_peer, "peer_leg") as peer_leg,
        mock.patch.object(bench_main, "header", return_value=[]),
        mock.patch.object(bench_main, "meta", return_value={}),
        mock.patch.object(bench_main, "say") as say,
        mock.patch("builtins.print"),
    ):
        assert bench_main.run(config) == 0
    peer_leg.assert_not_called()
    said = [c.args[0] for c in say.call_args_list]
    assert any(line.startswith("skipped peer: ") for line in said), said


def test_the_slowest_model_request_is_named_by_its_turn() -> None:
    agent = AgentResult(mock.Mock(), 4, [0.1, 0.9, 0.2], [], into_turns=[2, 3, 4])
    assert agent.slowest_into == 3
    assert AgentResult(mock.Mock(), 1, [], []).slowest_into is None


def _agent(turns: int, cpu: float) -> AgentResult:
    """An agent run's result of ``turns`` turns and ``cpu`` operator CPU seconds."""
    run = mock.Mock(cpu={"operator": cpu}, makespan=turns * 0.5)
    return AgentResult(run, turns, [0.1, 0.2], [0.3], into_turns=[2, 3])


def test_the_report_sets_cpu_per_turn_of_the_longest_agent_run_beside_the_shortest() -> None:
    report = Report(agents=[_agent(20, 1.0), _agent(1000, 80.0)])
    text = report.render()
    assert "one run of 20 model turns" in text and "one run of 1000 model turns" in text
    assert "operator CPU 50 ms per turn" in text and "operator CPU 80 ms per turn" in text
    row = next(line for line in text.splitlines() if "CPU per turn, 1000 / 20 turns" in line)
    assert "1.60 x" in row and "<= 1.20x" in row
    overhead = [line for line in text.splitlines() if "agent turn overhead" in line]
    # the first run's and the longest run's
    assert [line.count("(20 turns)") for line in overhead] == [1, 1, 0, 0]
    assert [line.count("(1000 turns)") for line in overhead] == [0, 0, 1, 1]
    single = Report(agents=[_agent(20, 1.0)]).render()
    assert len([line for line in single.splitlines() if "agent turn overhead" in line]) == 2


def test_a_size_run_several_times_counts_by_its_median() -> None:
    # 50, 100 and 60 ms per turn at 20 turns: the median, 60, divides the 1,000-turn run's 80.
    agents = [_agent(20, 1.0), _agent(20, 2.0), _agent(20, 1.2), _agent(1000, 80.0)]
    row = next(line for line in Report(agents=agents).render().splitlines()
               if "CPU per turn, 1000 / 20 turns" in line)  # fmt: skip
    assert "(medians; runs: 3 x 20)" in row and "1.33 x" in row

    def chain(steps: int, cpu: float) -> CaseResult:
        return CaseResult(f"chain-{steps}", "operator", 1, steps, 1.0, 1, 0, {"operator": cpu})

    # per step: 30, 20 and 40 ms at 10 steps, 45 at 50, 50 at 128: 50 / 30, not 50 / 20.
    chains = [chain(10, 0.3), chain(10, 0.2), chain(10, 0.4), chain(50, 2.25), chain(128, 6.4)]
    row = next(line for line in Report(chains=chains).render().splitlines()
               if "CPU per step, 128 / 10 steps" in line)  # fmt: skip
    assert "(medians; runs: 3 x 10)" in row and "1.67 x" in row
    once = Report(chains=[chain(10, 0.3), chain(50, 3.0), chain(128, 6.4)]).render()
    row = next(line for line in once.splitlines() if "CPU per step, 128 / 10 steps" in line)
    assert "medians" not in row and "1.67 x" in row, "the largest plan's, not the costliest's"


def _sampled(
    turns: int, per_turn: Callable[[int], float], seconds: float = 0.2
) -> list[TurnSample]:
    """Samples of a run of ``turns`` turns, one per turn ``seconds`` apart, turn ``n`` costing
    ``per_turn(n)`` operator CPU seconds."""
    samples, cpu = [], 0.0
    for n in range(1, turns + 1):
        cpu += per_turn(n)
        samples.append(TurnSample((n - 1) * seconds, n, cpu))
    return samples


def test_a_long_agent_run_compares_its_late_turns_with_its_early_ones() -> None:
    # 0.2 s a turn: the early window starts at turn 201 (40 s in), the late one ends 20
    # before the last; 50 ms a turn until 600, 60 after.
    samples = _sampled(1000, lambda n: 0.05 if n <= 600 else 0.06)
    found = steady_windows(samples)
    assert found is not None
    early, late = found
    assert (early.first, early.last, late.first, late.last) == (201, 401, 780, 980)
    assert early.cpu_per_turn == pytest.approx(0.05) and late.cpu_per_turn == pytest.approx(0.06)
    # a cost that only the run's first turns pay (its start) is in neither window
    assert steady_windows(_sampled(1000, lambda n: 2.0 if n <= 5 else 0.05)) is not None
    # too short for two windows apart, or not sampled: none
    assert steady_windows(_sampled(400, lambda n: 0.05)) is None
    assert steady_windows([]) is None
    agent = _agent(1000, 55.0)
    agent.samples = samples
    text = Report(agents=[_agent(20, 1.0), agent]).render()
    assert "turns 201-401 50 ms, turns 780-980 60 ms" in text
    row = next(line for line in text.splitlines() if "turns 780-980 / 201-401" in line)
    assert "of the 1000-turn run" in row and "1.20 x" in row and "<= 1.20x" in row
    assert "within the run" not in Report(agents=[_agent(20, 1.0)]).render()


def test_medians_by_size_and_repeated_sizes_named_apart() -> None:
    assert medians_by_size([(20, 3.0), (1000, 5.0), (20, 1.0), (20, 2.0)]) == {20: 2.0, 1000: 5.0}
    assert medians_by_size([(10, 1.0), (10, 2.0)]) == {10: 1.5}
    assert medians_by_size([]) == {}
    assert bench_main._named((20, 20, 1000, 20), "agent") == [
        (20, "agent-20"), (20, "agent-20-2"), (1000, "agent-1000"), (20, "agent-20-3"),
    ]  # fmt: skip
    full = bench_main.parse_args(["--only", "agent"])
    assert full.turns == (20, 20, 20, 1000)
    assert bench_main.parse_args(["--only", "chains"]).chains == (10, 10, 10, 50, 128)


# -- replicas sharing the runs ----------------------------------------------------------------


def test_replica_options_and_their_quick_defaults() -> None:
    full = bench_main.parse_args(["--only", "replicas", "--replica-runs", "100"])
    assert (full.only, full.replica_runs, full.replicas) == (
        frozenset({"replicas"}),
        100,
        (1, 2, 3),
    )
    assert (full.replica_cpu, full.shards) == (bench_main.REPLICA_CPU, bench_main.SHARDS)
    quick = bench_main.parse_args(["--quick", "--replicas", "1,3", "--replica-cpu", "0"])
    assert (quick.replica_runs, quick.replicas, quick.replica_cpu) == (20, (1, 3), 0.0)
    assert "replicas" in bench_main.parse_args([]).only, "the full run has the case"
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--shards", "0"])
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--replicas", "0,2"])


def test_a_replica_shares_the_runs_with_its_leases_in_one_namespace() -> None:
    assert shard_env(12, "bench-2x-1") == {
        "AGENTRUN_SHARDS": "12",
        "AGENTRUN_IDENTITY": "bench-2x-1",
        "AGENTRUN_OPERATOR_NAMESPACE": "default",
    }


def test_a_gauge_is_read_from_metrics_text() -> None:
    text = (
        "# HELP agentrun_shards_owned Shards.\n# TYPE agentrun_shards_owned gauge\n"
        "agentrun_shards_owned 4.0\n"
        "# HELP agentrun_shard_changes_total C.\n# TYPE agentrun_shard_changes_total counter\n"
        'agentrun_shard_changes_total{change="gained"} 4.0\n'
    )
    assert sample(text, "agentrun_shards_owned") == 4.0
    assert sample(text, "agentrun_shard_changes_total") is None, "labelled samples are not it"
    assert sample(text, "agentrun_shard_changes_total", {"change": "gained"}) == 4.0
    assert sample(text, "agentrun_shard_changes_total", {"change": "lost"}) is None
    assert sample("", "agentrun_shards_owned") is None


def test_speedups_are_over_the_fewest_replicas() -> None:
    assert speedups({1: 5.0, 2: 9.0, 3: None}) == {1: 1.0, 2: 1.8, 3: None}
    assert speedups({3: 6.0, 2: 4.0}) == {3: 1.5, 2: 1.0}
    assert speedups({1: None, 2: 3.0}) == {1: None, 2: None}
    assert speedups({}) == {}


def test_a_replica_case_sums_the_cpu_of_its_replicas() -> None:
    cpu = {"replica 1": 30.0, "replica 2": 10.0, "kube-apiserver": 99.0}
    run = CaseResult("r", "operator", 10, 10, 100.0, 10, 0, cpu)
    result = ReplicaResult(2, run, [6.0, 6.0], 0.4)
    assert run.operator_cpu == 40.0
    assert result.cores_per_replica == pytest.approx(0.2)
    unfinished = ReplicaResult(2, CaseResult("r", "operator", 10, 10, None, 3, 0, {}), [], None)
    assert (unfinished.run.operator_cpu, unfinished.cores_per_replica) == (None, None)
    assert CaseResult("o", "operator", 1, 1, 1.0, 1, 0, {"operator": 2.5}).operator_cpu == 2.5


def test_the_cpu_hierarchy_is_v1s_cpu_first_then_v2s_root(tmp_path: Path) -> None:
    assert cpulimit.find_hierarchy(tmp_path) is None
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    assert cpulimit.find_hierarchy(tmp_path) is None, "v2 without the cpu controller"
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert cpulimit.find_hierarchy(tmp_path) == cpulimit.Hierarchy(2, tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpulimit.find_hierarchy(tmp_path) == cpulimit.Hierarchy(1, tmp_path / "cpu")


def test_throttled_periods_from_cpu_stat_of_v1_and_v2() -> None:
    v1 = "nr_periods 31\nnr_throttled 30\nthrottled_time 2365914760\nnr_bursts 0\n"
    v2 = "usage_usec 1\nuser_usec 1\nsystem_usec 0\nnr_periods 8\nnr_throttled 2\n"
    assert cpulimit.parse_cpu_stat(v1) == (31, 30)
    assert cpulimit.parse_cpu_stat(v2 + "throttled_usec 5\n") == (8, 2)
    assert cpulimit.parse_cpu_stat("") == (0, 0)


def test_a_cpu_limit_is_a_quota_per_period() -> None:
    v1 = cpulimit.Hierarchy(1, Path("/sys/fs/cgroup/cpu"))
    assert v1.limit(0.4) == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "40000"}
    assert v1.limit(0.001)["cpu.cfs_quota_us"] == "1000", "the kernel's smallest quota"
    assert cpulimit.Hierarchy(2, Path("/sys/fs/cgroup")).limit(1.5) == {"cpu.max": "150000 100000"}
    assert "cpu.cfs_quota_us 40000" in v1.describe(0.4)


def test_without_a_writable_hierarchy_nothing_is_limited(tmp_path: Path) -> None:
    assert cpulimit.probe(0) == (None, "no CPU limit (--replica-cpu 0)")
    hierarchy, note = cpulimit.probe(0.4, tmp_path)
    assert hierarchy is None
    assert note.startswith("no CPU limit: no cgroup")
    with cpulimit.limited(None, 0.4, "bench", 3) as groups:
        groups.place(2, 12345)  # no group: nothing happens
        assert groups.periods() is None


def test_a_v2_group_enables_cpu_in_the_root_and_writes_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    hierarchy = cpulimit.find_hierarchy(tmp_path)
    assert hierarchy is not None
    assert cpulimit.probe(0.4, tmp_path)[1].startswith("no CPU limit: cgroup v2"), (
        "no cgroup.subtree_control: not a writable hierarchy"
    )
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    # A plain directory is no cgroupfs: the groups stay (rmdir fails on their files, quietly).
    with cpulimit.limited(hierarchy, 0.25, "bench", 2) as groups:
        groups.place(1, 4242)
        assert groups.periods() is None, "no cpu.stat yet"
        for index, stat in ((1, "nr_periods 10\nnr_throttled 4\n"), (2, "nr_periods 5\n")):
            (tmp_path / f"bench-{index}" / "cpu.stat").write_text(stat)
        assert groups.periods() == (15, 4)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "bench-1" / "cpu.max").read_text() == "25000 100000"
    assert (tmp_path / "bench-2" / "cgroup.procs").read_text() == "4242"


# -- the peer leg -----------------------------------------------------------------------------


def test_a_workflow_runs_the_steps_of_a_chain_one_after_the_other() -> None:
    workflow = argo_workflow("w", 3, "case")
    run = chain_run("r", 3, "case")
    chain, step = workflow["spec"]["templates"]
    assert workflow["spec"]["entrypoint"] == chain["name"]
    assert chain["steps"] == [[{"name": f"s00{i}", "template": step["name"]}] for i in range(3)]
    assert step["container"]["command"] == run["spec"]["plan"]["steps"][0]["container"]["command"]
    assert step["container"]["image"] == run["spec"]["plan"]["steps"][0]["container"]["image"]
    assert workflow["metadata"]["labels"] == workflow["spec"]["podMetadata"]["labels"]
    assert workflow["spec"]["securityContext"]["runAsNonRoot"] is True


def test_argos_pods_may_report_their_results_and_its_metrics_use_the_port_given() -> None:
    role, binding = executor_rbac("wf")
    assert role["rules"] == [
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["workflowtaskresults"],
            "verbs": ["create", "patch"],
        }
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "default", "namespace": "wf"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]  # type: ignore[index]
    data = controller_configmap(23456)["data"]
    assert data == {"metricsConfig": "port: 23456\nsecure: false\n"}


def test_a_workflow_is_finished_in_argos_terminal_phases_only() -> None:
    for phase, finished in [
        ("Succeeded", True),
        ("Failed", True),
        ("Error", True),
        ("Running", False),
        ("Pending", False),
    ]:
        assert workflow_finished({"status": {"phase": phase}}) is finished
    assert not workflow_finished({})


def _request(user: str, verb: str, resource: str, code: int = 200) -> Request:
    return Request("id", user, verb, "", resource, "ns", "n", code, 0.0, 1.0)


def test_each_legs_engine_writes_are_its_own() -> None:
    requests = [
        _request("agentrun-operator", "create", "jobs"),
        _request("agentrun-operator", "patch", "agentruns/status"),
        _request("agentrun-operator", "get", "agentruns"),
        _request("argo-workflow-controller", "update", "workflows"),
        _request("argo-workflow-controller", "create", "pods"),
        _request(EXECUTOR_USER, "create", "workflowtaskresults"),
        _request("admin", "create", "jobs"),
        _request("admin", "create", "jobs", code=409),
        _request("admin", "update", "pods/status"),
        _request("system:kube-controller-manager", "create", "pods"),
    ]
    assert engine_writes("operator", requests) == 2
    assert engine_writes("argo", requests) == 3
    assert engine_writes("bare", requests) == 2, "the script's Job creates (both answered)"
    assert all_writes("operator", requests) == 6, "not Argo's 3"
    assert all_writes("argo", requests) == 7, "not the operator's 2"
    assert all_writes("bare", requests) == 4, "neither engine's"


def test_the_peer_workloads_are_one_step_a_chain_and_many_runs() -> None:
    assert workloads(200, 10, 20) == [
        ("one 1-step run", 1, 1),
        ("one 20-step sequential run", 1, 20),
        ("200 concurrent 10-step runs", 200, 10),
    ]
    full = bench_main.parse_args(["--only", "peer"])
    assert (full.peer_runs, full.peer_steps, full.peer_chain) == (200, 10, 20)
    assert full.argo_env == (), "Argo with its release's defaults"
    quick = bench_main.parse_args(["--quick", "--peer-runs", "7", "--argo-env", "A=2s"])
    assert (quick.peer_runs, quick.peer_steps) == (7, bench_main.QUICK["peer_steps"])
    assert quick.argo_env == (("A", "2s"),)
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--argo-env", "NOPE"])
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--peer-runs", "0"])
    assert "peer" in bench_main.parse_args([]).only, "the full run has the peer leg"


def test_the_peer_report_compares_writes_and_throughput_with_argo() -> None:
    op_requests = [_request("agentrun-operator", "patch", "agentruns/status")] * 20
    argo_requests = [_request("argo-workflow-controller", "update", "workflows")] * 50
    argo_requests += [_request(EXECUTOR_USER, "create", "workflowtaskresults")] * 50
    legs: dict[str, CaseResult | None] = {
        "operator": CaseResult("o", "operator", 2, 5, 10.0, 2, 0, {"operator": 3.0}, op_requests),
        "bare": CaseResult("b", "bare", 2, 5, 5.0, 10, 0, {}),
        "argo": CaseResult("a", "argo", 2, 5, 20.0, 2, 0, {"argo controller": 4.0}, argo_requests),
    }
    row = PeerRow("2 concurrent 5-step runs", 2, 5, legs, {"operator": 100 * 2**20})
    text = Report(peer=PeerResult([row], ["Argo Workflows v4.0.5"])).render()
    assert "Argo Workflows v4.0.5" in text
    assert "operator / Argo writes per step, 2 x 5" in text
    ratios = [line for line in text.splitlines() if "operator / Argo" in line]
    assert "0.20" in ratios[0] and "target <= 0.20" in ratios[0], "2 against 10 per step"
    assert "2.00 x" in ratios[1] and "target >= 1.00x" in ratios[1], "1.0 against 0.5 steps/s"
    assert "100 MiB" in text
    assert "(did not complete)" not in text
    costs = text.splitlines()[
        text.splitlines().index(
            next(line for line in text.splitlines() if "CPU seconds of each process" in line)
        )
        + 1
    ]
    assert costs.split()[-2:] == ["operator", "argo"], "Argo's controller has its column"
    p3 = Report(p3=[(2, legs["operator"], legs["bare"])]).render()
    assert " argo " not in p3, "no Argo column where it did not run"
    unrun = Report(peer=PeerResult([], ["not run: no Docker engine"])).render()
    assert "not run: no Docker engine" in unrun and "operator / Argo" not in unrun


def test_p3_shows_the_controller_managers_requests_per_step_of_each_leg() -> None:
    manager = "system:kube-controller-manager"
    op_requests = [_request(manager, "delete", "jobs")] * 20 + [
        _request(manager, "create", "pods")
    ] * 20
    op_requests += [_request("agentrun-operator", "create", "jobs")] * 20
    bare_requests = [_request(manager, "create", "pods")] * 10
    op = CaseResult("p3-2-op", "operator", 2, 5, 10.0, 2, 0, {"operator": 3.0}, op_requests)
    bare = CaseResult("p3-2-bare", "bare", 2, 5, 5.0, 10, 0, {}, bare_requests)
    lines = Report(p3=[(2, op, bare)]).render().splitlines()
    start = next(i for i, line in enumerate(lines) if "the controller manager's requests" in line)
    rows = [line.split() for line in lines[start + 2 :] if len(line.split()) == 4]
    table = {f"{verb} {resource}": values for verb, resource, *values in rows}
    assert lines[start + 1].split() == ["p3-2-op", "p3-2-bare"]
    assert table["delete jobs"] == ["2.00", "0.00"], "20 deletes over 10 steps; none bare"
    assert table["create pods"] == ["2.00", "1.00"]
    assert "create jobs" not in table, "the operator's own requests are not the manager's"


def test_p3_shows_the_operators_passes_and_their_wait_for_a_worker() -> None:
    samples = {PASSES: 25.0, PASS_SECONDS: 2.5, WAITS: 20.0, WAIT_SECONDS: 8.0}
    op = CaseResult("p3-2-op", "operator", 2, 5, 10.0, 2, 0, {}, samples=samples)
    bare = CaseResult("p3-2-bare", "bare", 2, 5, 5.0, 10, 0, {})
    unscraped = CaseResult("p3-3-op", "operator", 3, 5, 10.0, 3, 0, {})
    lines = Report(p3=[(2, op, bare), (3, unscraped, None)]).render().splitlines()
    start = lines.index("    the operator's passes (its /metrics):")
    expected = "p3-2-op 2.50 passes/step, each 0.100 s on a worker after 0.400 s waiting for one"
    # 25 passes over 10 steps, 2.5 s of them, 8 s waited by 20
    assert " ".join(lines[start + 1].split()) == expected + " (mean)"
    assert "p3-2-bare" not in lines[start + 2] and "p3-3-op" not in lines[start + 2]


def test_p3_targets_set_the_api_servers_cpu_and_every_clients_requests_beside_bare() -> None:
    manager = "system:kube-controller-manager"
    op_requests = [_request(manager, "delete", "jobs")] * 30 + [
        _request("agentrun-operator", "create", "jobs")
    ] * 30
    bare_requests = [_request(manager, "create", "pods")] * 40
    op = CaseResult(
        "p3-200-op", "operator", 2, 10, 10.0, 2, 0, {"kube-apiserver": 13.0}, op_requests
    )
    bare = CaseResult(
        "p3-200-bare", "bare", 2, 10, 5.0, 20, 0, {"kube-apiserver": 10.0}, bare_requests
    )
    report = Report(p3=[(200, op, bare)], controller_manager_qps=500)
    rows = {label: (value, target) for label, value, target in report._target_rows()}
    at = "at 200 runs, controller manager QPS 500"
    assert rows[f"P3 API server CPU, operator / bare, {at}"] == ("1.30 x", "<= 1.30x")
    # 60 requests over 20 steps against 40 over 20
    assert rows[f"P3 requests per step, every client, operator / bare, {at}"] == (
        "1.50 x",
        "<= 1.30x",
    )
    assert rows[f"P3 throughput, operator / bare, {at}"][1] == ">= 0.80"
    small = Report(p3=[(100, op, bare)])._target_rows()
    assert all(target == "" for label, _, target in small if label.startswith("P3")), small


def test_p5_memory_target_follows_the_count_of_finished_runs() -> None:
    def rest(finished: int) -> RestResult:
        return RestResult(
            finished, 0, 1.0, 2.0, 3.0, 4.0, 5.0, [], None, 60.0, [], None, [100 * 2**20]
        )

    rows = Report(rests=[rest(20_000), rest(2_000), rest(100)])._target_rows()
    memory = [target for label, _, target in rows if label.startswith("RSS at rest")]
    assert memory == ["<= 300 MiB", "<= 150 MiB", ""]
    assert sum(1 for label, _, _ in rows if label.startswith("first Job after start")) == 3


def test_the_busiest_replicas_whole_decoding_is_put_over_one_replicas() -> None:
    def case(replicas: int, decoded: list[float]) -> ReplicaResult:
        run = CaseResult("r", "operator", 10, 10, 100.0, 10, 0, {})
        return ReplicaResult(replicas, run, [12.0 / replicas] * replicas, None, decoded=decoded)

    report = Report()
    report.replicas = [case(1, [900.0]), case(2, [500.0, 420.0]), case(3, [310.0, 280.0, 300.0])]
    rows = {label: (value, target) for label, value, target in report._target_rows()}
    assert rows["run events decoded whole by each of 3 replicas / by 1 (busiest: 310 of 900)"] == (
        "0.34 x",
        "<= 0.34x",
    )
    assert rows["run events decoded whole by each of 2 replicas / by 1 (busiest: 500 of 900)"][
        0
    ] == ("0.56 x")
    report.replicas = [case(1, []), case(3, [1.0, 1.0, 1.0])]
    assert not [r for r in report._target_rows() if r[0].startswith("run events")]
