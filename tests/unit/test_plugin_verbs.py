"""The verbs people expect of a kubectl plugin, without a cluster: ``-o json|yaml``, the plan
and the family drawn (``-o mermaid|dot``), ``completion``, ``--version``, ``logs`` choosing
its pod, ``wait`` on a watch, and the krew manifest."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.clients.plugin import commands, completion, graphs, watching
from agentrun.clients.plugin import logs as steplogs
from agentrun.clients.plugin.kube import PluginError
from agentrun.core.naming import job_name
from agentrun.core.subagents import Member
from agentrun.settings import LABEL_RUN_UID
from tests.support.sim import UID

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "operator" / "agentrun" / "clients" / "plugin"


def run_body(
    steps: list[tuple[str, list[str]]],
    phases: Mapping[str, str] | None = None,
    name: str = "nightly",
    **extra_status: Any,
) -> dict[str, Any]:
    """An AgentRun as stored: steps (name, dependsOn), each with a phase in status."""
    return {
        "apiVersion": m.API_VERSION,
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": UID,
            "generation": 1,
            "resourceVersion": "7",
            "managedFields": [{"manager": "kubectl-agentrun", "operation": "Update"}],
        },
        "spec": {
            "goal": "a report",
            "plan": {
                "steps": [
                    {"name": s, "container": {"image": "busybox"}, "dependsOn": deps}
                    for s, deps in steps
                ]
            },
        },
        "status": {
            "steps": [
                {"name": s, "phase": p, **({"attempt": 1} if p != "Pending" else {})}
                for s, p in (phases or {}).items()
            ],
            **extra_status,
        },
    }


DIAMOND = [("gather", []), ("left", ["gather"]), ("right", ["gather"])]
DIAMOND.append(("report", ["left", "right"]))
DIAMOND_PHASES = {"gather": "Succeeded", "left": "Failed", "right": "Running"}


class FakeSession:
    """The reads the verbs make, from bodies in memory."""

    namespace = "default"

    def __init__(self, body: dict[str, Any], **more: Any) -> None:
        self.body = body
        self.pods: list[dict[str, Any]] = more.get("pods", [])
        self.jobs: dict[str, dict[str, Any]] = more.get("jobs", {})
        self.log: list[bytes] = more.get("log", [])
        self.logged: list[tuple[str, str | None, bool]] = []

    def get_run_body(self, name: str) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(self.body))
        return copy

    def get_run(self, name: str) -> tuple[dict[str, Any], m.AgentRun]:
        body = self.get_run_body(name)
        return body, m.AgentRun.model_validate(body)

    def list_runs(self) -> list[dict[str, Any]]:
        return [self.get_run_body("")]

    def get_job(self, name: str) -> dict[str, Any] | None:
        return self.jobs.get(name)

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        key, _, value = selector.partition("=")
        return [p for p in self.pods if p["metadata"].get("labels", {}).get(key) == value]

    @contextlib.contextmanager
    def reporting(self, what: str) -> Iterator[None]:
        yield

    def pod_log(self, pod: str, container: str | None, follow: bool) -> Iterator[bytes]:
        self.logged.append((pod, container, follow))
        yield from self.log


def call(
    session: FakeSession, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    args = commands.build_parser().parse_args(list(argv))
    try:
        code = args.func(session, args)
    except PluginError as error:
        code = error.code
        print(f"error: {error}", file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- -o json | yaml -------------------------------------------------------------------------------


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_status_prints_the_run_as_kubectl_get_would(
    output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = run_body(DIAMOND, DIAMOND_PHASES)
    code, out, _ = call(FakeSession(body), capsys, "status", "nightly", "-o", output)
    assert code == 0
    shown = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert "managedFields" not in shown["metadata"], "kubectl leaves them out by default"
    del body["metadata"]["managedFields"]
    assert shown == body
    if output == "json":
        assert out.startswith('{\n    "apiVersion"'), "four spaces, as kubectl indents"


def test_history_prints_its_entries(capsys: pytest.CaptureFixture[str]) -> None:
    entries = [
        {
            "at": "2026-01-01T00:00:00Z",
            "step": "gather",
            "from": None,
            "to": "Launching",
            "reason": "Launched",
        },
        {
            "at": "2026-01-01T00:00:05Z",
            "step": "gather",
            "from": "Launching",
            "to": "Succeeded",
            "reason": "Completed",
        },
    ]
    body = run_body(DIAMOND, DIAMOND_PHASES, history=entries)
    session = FakeSession(body)
    session.list_config_maps = lambda selector: []  # type: ignore[attr-defined]
    code, out, err = call(session, capsys, "history", "nightly", "-o", "json")
    assert code == 0 and "no audit record" in err
    assert [(e["step"], e["to"]) for e in json.loads(out)] == [
        ("gather", "Launching"),
        ("gather", "Succeeded"),
    ]
    code, out, _ = call(session, capsys, "history", "nightly", "-o", "yaml")
    assert yaml.safe_load(out)[1]["from"] == "Launching"


def test_tree_prints_the_family_nested_with_tokens_that_hold_the_sub_agents(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A parent's status.usage.tokens hold its children's: 16 for the lead, 6 of them the
    # helper's, 1 of those the deep one's.
    root = Member("lead", "u0", 0, "Running", 16, (
        Member("helper", "u1", 1, "Succeeded", 6, (Member("deep", "u2", 2, "Failed", 1),)),
        Member("other", "u3", 1, "Pending", 0),
    ))  # fmt: skip
    family = graphs.family_object(root)
    assert family["tokens"] == 16 and family["children"][0]["tokens"] == 6
    assert family["children"][0]["children"][0] == {
        "name": "deep", "uid": "u2", "phase": "Failed", "tokens": 1, "children": [],
    }  # fmt: skip
    drawn = graphs.family_mermaid(root)
    assert drawn.startswith("flowchart TD\n")
    assert 'r0["lead<br/>Running<br/>16 tokens with sub-agents"]' in drawn
    assert 'r2["deep<br/>Failed<br/>1 tokens"]' in drawn
    assert "r0 --> r1" in drawn and "r1 --> r2" in drawn and "r0 --> r3" in drawn

    body = run_body([("a", [])], {"a": "Succeeded"}, usage={"tokens": 3})
    code, out, _ = call(FakeSession(body), capsys, "tree", "nightly", "-o", "json")
    assert code == 0 and json.loads(out)["tokens"] == 3


# -- -o mermaid | dot -----------------------------------------------------------------------------


def test_status_draws_the_plan_in_mermaid_with_phases_and_dependencies() -> None:
    run = m.AgentRun.model_validate(run_body(DIAMOND, DIAMOND_PHASES))
    drawn = graphs.plan_mermaid(run)
    lines = drawn.splitlines()
    assert lines[0] == "flowchart TD"
    assert '    s0["gather<br/>Succeeded"]' in lines
    assert '    s2["right<br/>Running"]' in lines
    assert '    s3["report<br/>Pending"]' in lines, "a step not in status yet is Pending"
    edges = {line.strip() for line in lines if "-->" in line}
    assert edges == {"s0 --> s1", "s0 --> s2", "s1 --> s3", "s2 --> s3"}
    assert "    class s1 Failed" in lines and "    classDef Failed fill:#ffcdd2" in lines


def test_status_draws_the_plan_in_dot() -> None:
    run = m.AgentRun.model_validate(run_body(DIAMOND, DIAMOND_PHASES))
    drawn = graphs.plan_dot(run)
    assert drawn.startswith('digraph "agentrun/nightly" {\n') and drawn.endswith("}\n")
    assert '"left" [label="left\\nFailed", fillcolor="#ffcdd2"];' in drawn
    assert '"report" [label="report\\nPending", fillcolor="#ffffff"];' in drawn
    edges = set(re.findall(r'"(\w+)" -> "(\w+)";', drawn))
    assert edges == {("gather", "left"), ("gather", "right"), ("left", "report"),
                     ("right", "report")}  # fmt: skip
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tsvg"], input=drawn, text=True, check=True, capture_output=True)


def test_labels_cannot_break_out_of_their_quotes() -> None:
    assert graphs._mermaid_text('a"<b>') == "a#quot;#lt;b#gt;"
    assert graphs._dot_text('a"\\b') == 'a\\"\\\\b'


def test_status_o_mermaid_is_the_drawing(capsys: pytest.CaptureFixture[str]) -> None:
    body = run_body(DIAMOND, DIAMOND_PHASES)
    code, out, _ = call(FakeSession(body), capsys, "status", "nightly", "-o", "mermaid")
    assert code == 0 and out == graphs.plan_mermaid(m.AgentRun.model_validate(body))
    code, out, _ = call(FakeSession(body), capsys, "status", "nightly", "-o", "dot")
    assert code == 0 and out.startswith("digraph")


def test_output_formats_are_checked_per_verb(capsys: pytest.CaptureFixture[str]) -> None:
    parser = commands.build_parser()
    for argv in (["tree", "r", "-o", "dot"], ["history", "r", "-o", "mermaid"],
                 ["status", "r", "-o", "wide"]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        assert exited.value.code == 2, argv
    assert "invalid choice" in capsys.readouterr().err


# -- --version and completion ---------------------------------------------------------------------


def test_version_is_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        commands.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"kubectl-agentrun {metadata.version('agentrun-operator')}\n"


def test_completion_needs_no_cluster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert commands.main(["completion", "bash"]) == 0
    assert "complete -F _kubectl_agentrun kubectl-agentrun" in capsys.readouterr().out


def test_completion_knows_every_command_and_its_options() -> None:
    parser = commands.build_parser()
    verbs = {v.name: v for v in completion.verbs(parser)}
    assert {"status", "logs", "wait", "completion", "tree", "history"} <= verbs.keys()
    assert verbs["status"].choices["-o"] == ["json", "yaml", "mermaid", "dot"]
    assert verbs["logs"].positionals == ["RUN", "STEP"]
    assert {"-f", "--follow"} <= verbs["logs"].flags and "--attempt" not in verbs["logs"].flags
    assert verbs["completion"].positional_choices == {0: ["bash", "zsh", "fish"]}
    for shell in completion.SHELLS:
        text = completion.script(parser, shell)
        for name in verbs:
            assert name in text, (shell, name)
        assert "output" in text and "mermaid" in text


BASH_PROBE = """
source "$1"
kubectl() { printf 'agentrun.agentrun.dev/alpha\\nagentrun.agentrun.dev/beta\\n'; }
complete_line() {
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _kubectl_agentrun
    echo "${COMPREPLY[*]}"
}
complete_line kubectl-agentrun st
complete_line kubectl-agentrun status -o ""
complete_line kubectl-agentrun -n demo logs ""
complete_line kubectl-agentrun completion ""
complete_line kubectl-agentrun wait alpha --
"""


@pytest.mark.skipif(not shutil.which("bash"), reason="no bash")
def test_the_bash_script_completes_commands_runs_and_values(tmp_path: Path) -> None:
    script = tmp_path / "completion.bash"
    script.write_text(completion.script(commands.build_parser(), "bash"))
    subprocess.run(["bash", "-n", str(script)], check=True)
    proc = subprocess.run(
        ["bash", "-c", BASH_PROBE, "probe", str(script)], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert proc.stdout.splitlines() == [
        "status start",
        "json yaml mermaid dot",
        "alpha beta",
        "bash zsh fish",
        "--help --namespace --context --kubeconfig --timeout --output",
    ]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_zsh_and_fish_scripts_parse(shell: str, tmp_path: Path) -> None:
    if not shutil.which(shell):
        pytest.skip(f"no {shell} here")
    script = tmp_path / f"completion.{shell}"
    script.write_text(completion.script(commands.build_parser(), shell))
    subprocess.run([shell, "-n", str(script)], check=True)


# -- wait on a watch ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _body(phase: str | None, version: str) -> dict[str, Any]:
    body = run_body([("a", [])], {"a": "Running"})
    body["metadata"]["resourceVersion"] = version
    if phase:
        body["status"]["phase"] = phase
    return body


def _read(bodies: list[dict[str, Any]]) -> watching.Read:
    def read() -> tuple[dict[str, Any], m.AgentRun]:
        body = bodies.pop(0)
        return body, m.AgentRun.model_validate(body)

    return read


def test_wait_watches_from_the_version_it_read_until_the_run_ends() -> None:
    clock = Clock()
    asked: list[tuple[str, float]] = []

    def watch(version: str, seconds: float) -> Iterator[watching.Event]:
        asked.append((version, seconds))
        clock.now += 1
        yield "MODIFIED", _body("Running", "8")
        yield "BOOKMARK", {"metadata": {"resourceVersion": "9"}}
        yield "MODIFIED", _body("Succeeded", "10")
        raise AssertionError("read past the end")

    waited = watching.wait(
        _read([_body("Running", "7")]), watch, m.AgentRun.model_validate, 30, clock, clock.sleep
    )
    assert waited.phase == m.RunPhase.SUCCEEDED and not waited.timed_out
    assert asked == [("7", 30)]


def test_wait_resumes_a_closed_watch_and_reads_afresh_after_410() -> None:
    clock = Clock()
    asked: list[str] = []
    rounds: list[Any] = [
        [("MODIFIED", _body("Running", "8"))],  # the server closed it: resume from 8
        ApiException(status=410, reason="Expired"),  # too old: read again (version 20)
        [("MODIFIED", _body("Failed", "21"))],
    ]

    def watch(version: str, seconds: float) -> Iterator[watching.Event]:
        asked.append(version)
        clock.now += 2
        this = rounds.pop(0)
        if isinstance(this, Exception):
            raise this
        yield from this

    reads = [_body("Running", "7"), _body("Running", "20")]
    waited = watching.wait(_read(reads), watch, m.AgentRun.model_validate, 60, clock, clock.sleep)
    assert waited.phase == m.RunPhase.FAILED
    assert asked == ["7", "8", "20"]


def test_wait_times_out_deleted_and_refused_watches() -> None:
    clock = Clock()

    def quiet(version: str, seconds: float) -> Iterator[watching.Event]:
        clock.now += seconds
        return iter(())

    waited = watching.wait(
        _read([_body("Running", "7")]), quiet, m.AgentRun.model_validate, 5, clock, clock.sleep
    )
    assert waited.timed_out and waited.phase == m.RunPhase.RUNNING

    def deleted(version: str, seconds: float) -> Iterator[watching.Event]:
        yield "DELETED", _body("Running", "8")

    with pytest.raises(watching.Deleted, match="agentrun/nightly was deleted while waiting"):
        watching.wait(_read([_body(None, "7")]), deleted, m.AgentRun.model_validate, 5, clock)

    def refused(version: str, seconds: float) -> Iterator[watching.Event]:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(watching.WatchRefused) as caught:
        watching.wait(_read([_body(None, "7")]), refused, m.AgentRun.model_validate, 5, clock)
    assert caught.value.left == pytest.approx(5)


def test_an_ended_run_is_not_watched() -> None:
    def never(version: str, seconds: float) -> Iterator[watching.Event]:
        raise AssertionError("watched")

    waited = watching.wait(_read([_body("Cancelled", "7")]), never, m.AgentRun.model_validate, 5)
    assert waited.phase == m.RunPhase.CANCELLED


def test_wait_keeps_its_exit_codes_and_prints_the_run_with_o(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = _body("Failed", "7")
    session = FakeSession(body)
    session.watch_run = lambda *a: iter(())  # type: ignore[attr-defined]
    code, out, _ = call(session, capsys, "wait", "nightly")
    assert (code, out) == (1, "agentrun/nightly Failed\n")
    code, out, _ = call(session, capsys, "wait", "nightly", "-o", "yaml")
    assert code == 1 and yaml.safe_load(out)["status"]["phase"] == "Failed"


# -- logs -----------------------------------------------------------------------------------------


def test_logs_finds_the_job_of_the_current_attempt_and_of_earlier_ones() -> None:
    body = run_body([("a", []), ("b", ["a"])], {"a": "Running"})
    body["status"]["steps"][0].update({"attempt": 3, "jobName": "nightly-a-abc-3"})
    run = m.AgentRun.model_validate(body)
    assert steplogs.source(run, "a", None) == steplogs.Source("a", 3, "nightly-a-abc-3")
    assert steplogs.source(run, "a", 1).job_name == job_name("nightly", UID, "a", 1)
    for step, attempt, why in (
        ("a", 4, "step 'a' of agentrun/nightly has no attempt 4: its attempts are 1 to 3"),
        ("b", None, "step 'b' of agentrun/nightly has not started yet"),
        ("zz", None, "step 'zz' is not a step of agentrun/nightly (steps: a, b)"),
    ):
        with pytest.raises(steplogs.NoLog, match=re.escape(why)):
            steplogs.source(run, step, attempt)


def _pod(name: str, created: str, labels: dict[str, str], uid: str = "p") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "creationTimestamp": created, "labels": labels},
        "spec": {"containers": [{"name": "step"}]},
        "status": {"phase": "Succeeded"},
    }


def test_logs_streams_the_newest_pod_of_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    body = run_body([("a", [])], {"a": "Succeeded"})
    body["status"]["steps"][0]["jobName"] = "job-a"
    label = steplogs.JOB_UID_LABELS[0]
    session = FakeSession(
        body,
        jobs={"job-a": {"metadata": {"name": "job-a", "uid": "j1"}}},
        pods=[
            _pod("job-a-old", "2026-01-01T00:00:00Z", {label: "j1"}),
            _pod("job-a-new", "2026-01-01T00:01:00Z", {label: "j1"}),
            _pod("elsewhere", "2026-01-01T00:02:00Z", {label: "j2"}),
        ],
        log=[b"line 1\n", b"line 2\n"],
    )
    code, out, err = call(session, capsys, "logs", "nightly", "a", "-f")
    assert code == 0 and out == "line 1\nline 2\n"
    assert session.logged == [("job-a-new", "step", True)]
    assert "has 2 pods; showing the newest" in err
    assert "step a attempt 1 of agentrun/nightly: pod job-a-new (Succeeded)" in err

    session.jobs.clear()
    code, _, err = call(session, capsys, "logs", "nightly", "a")
    assert code == 1 and "the Job job-a of step a attempt 1 of agentrun/nightly is gone" in err


def test_logs_of_a_model_turn_on_the_executor_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    body = run_body([("a", [])], {"t1-model": "Succeeded"})
    body["status"]["steps"][0].update({"jobName": "nightly-t1-model-x-1", "executorPod": "e-uid"})
    executor = _pod("nightly-t0-executor-y-1-abcde", "2026-01-01T00:00:00Z",
                    {LABEL_RUN_UID: UID}, uid="e-uid")  # fmt: skip
    session = FakeSession(body, pods=[executor], log=[b"turn 1 served\n"])
    code, out, err = call(session, capsys, "logs", "nightly", "t1-model")
    assert code == 0 and out == "turn 1 served\n"
    assert (
        "is a model turn that ran on the run's executor pod nightly-t0-executor-y-1-abcde, not "
        "in a Job of its own"
    ) in err
    session.pods.clear()
    code, _, err = call(session, capsys, "logs", "nightly", "t1-model")
    assert code == 1 and "that pod is gone: its log went with it" in err


def test_logs_picks_the_container() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "side"}, {"name": "step"}]}}
    assert steplogs.container(pod, None) == "step"
    assert steplogs.container(pod, "side") == "side"
    with pytest.raises(steplogs.NoLog, match="pod p has no container 'x'"):
        steplogs.container(pod, "x")
    one = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main"}]}}
    assert steplogs.container(one, None) == "main"


@pytest.mark.parametrize("attempt", ["0", "-1", "x"])
def test_an_attempt_is_a_positive_number(attempt: str) -> None:
    with pytest.raises(SystemExit):
        commands.build_parser().parse_args(["logs", "r", "s", "--attempt", attempt])


# -- purity, docs and the krew manifest -----------------------------------------------------------


def test_docs_name_every_command_and_option() -> None:
    text = (REPO / "docs" / "plugin.md").read_text()
    missing = []
    for verb in completion.verbs(commands.build_parser()):
        if f"`{verb.name}" not in text:
            missing.append(verb.name)
        for opt in verb.options:
            if opt not in text:
                missing.append(f"{verb.name} {opt}")
    assert "--version" in text
    assert not missing, f"not in docs/plugin.md: {missing}"


def test_the_krew_manifest_names_a_reproducible_archive(tmp_path: Path) -> None:
    def make(out: Path) -> dict[str, Any]:
        subprocess.run(
            [sys.executable, str(REPO / "hack" / "krew" / "manifest.py"), "--out", str(out),
             "--base-url", "https://example.org/releases/download/"],
            check=True, capture_output=True,
        )  # fmt: skip
        loaded: dict[str, Any] = yaml.safe_load((out / "agentrun.yaml").read_text())
        return loaded

    manifest = make(tmp_path / "a")
    version = metadata.version("agentrun-operator")
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "agentrun"
    assert manifest["spec"]["version"] == f"v{version}"
    (platform,) = manifest["spec"]["platforms"]
    name = f"kubectl-agentrun-v{version}.tar.gz"
    assert platform["uri"] == f"https://example.org/releases/download/v{version}/{name}"
    data = (tmp_path / "a" / name).read_bytes()
    assert platform["sha256"] == hashlib.sha256(data).hexdigest()
    assert make(tmp_path / "b")["spec"]["platforms"][0]["sha256"] == platform["sha256"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        launcher = tar.getmember(platform["bin"])
        assert launcher.mode & 0o111
        text = (tar.extractfile(launcher) or io.BytesIO()).read().decode()
    assert f'"agentrun-operator=={version}" kubectl-agentrun "$@"' in text
