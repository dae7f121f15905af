"""A container as a local process (agentrun_devcluster.process): its command line,
environment and termination message, without a cluster."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from agentrun_devcluster.process import (
    PASSTHROUGH_ENV,
    ContainerProcess,
    container_argv,
    exit_code_of,
    process_env,
    read_termination_message,
    terminate,
    working_dir,
)


def test_argv_expands_variables_then_maps_container_paths() -> None:
    spec = {
        "command": ["sh", "-c"],
        "args": ["echo $(GREETING) > /dev/termination-log; cat /sa/token $(UNSET)"],
    }
    argv = container_argv(
        spec,
        {"GREETING": "hi"},
        {"/dev/termination-log": "/tmp/pod/main.termination-log", "/sa": "/tmp/pod/sa"},
    )
    assert argv == [
        "sh",
        "-c",
        "echo hi > /tmp/pod/main.termination-log; cat /tmp/pod/sa/token $(UNSET)",
    ]


def test_process_env_passes_through_only_a_few_variables_and_later_layers_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("SECRET_OF_THE_NODE", "x")
    env = process_env({"HOSTNAME": "pod", "A": "service"}, {"A": "container"})
    assert env["PATH"] == "/usr/bin"
    assert "SECRET_OF_THE_NODE" not in env
    assert env["HOSTNAME"] == "pod"
    assert env["A"] == "container"
    assert set(env) <= {*PASSTHROUGH_ENV, "HOSTNAME", "A"}


def test_working_dir_falls_back_when_it_does_not_exist(tmp_path: Path) -> None:
    assert working_dir({"workingDir": str(tmp_path)}, Path("/fallback")) == tmp_path
    assert working_dir({"workingDir": "/no/such/dir"}, tmp_path) == tmp_path
    assert working_dir({}, tmp_path) == tmp_path


def test_exit_code_of_a_signal_is_128_plus_it() -> None:
    assert exit_code_of(3) == 3
    assert exit_code_of(-signal.SIGKILL) == 137


def test_termination_message_falls_back_to_the_log_only_on_failure(tmp_path: Path) -> None:
    message, log = tmp_path / "m", tmp_path / "log"
    message.write_bytes(b"")
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert read_termination_message(message, log, policy="File", failed=True) == ""
    fallback = read_termination_message(message, log, policy="FallbackToLogsOnError", failed=True)
    assert fallback.startswith("line 20\n") and fallback.endswith("line 99\n")
    assert (
        read_termination_message(message, log, policy="FallbackToLogsOnError", failed=False) == ""
    )
    message.write_bytes(b"x" * 5000 + b"end")
    assert read_termination_message(message, log, policy="File", failed=False) == (
        "x" * 4093 + "end"
    )


def test_container_without_command_fails_without_starting(tmp_path: Path) -> None:
    c = ContainerProcess({"name": "main", "image": "busybox"}, "regular", tmp_path)
    assert c.fail_without_command()
    terminated = c.state["terminated"]
    assert terminated["reason"] == "NoCommand"
    assert "'busybox'" in terminated["message"]


def test_process_runs_reports_its_message_and_is_killed_for_a_deadline(tmp_path: Path) -> None:
    ok = ContainerProcess({"name": "ok", "command": ["x"]}, "regular", tmp_path)
    ok.start(
        [sys.executable, "-c", f"open({str(ok.message_path)!r}, 'w').write('done')"],
        {},
        tmp_path,
    )
    sleeper = ContainerProcess({"name": "sleeper", "command": ["x"]}, "regular", tmp_path)
    sleeper.start([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path)
    assert sleeper.running
    assert ok.proc is not None
    ok.proc.wait(30)
    assert ok.poll()
    assert ok.state["terminated"]["exitCode"] == 0
    assert ok.state["terminated"]["reason"] == "Completed"
    assert ok.state["terminated"]["message"] == "done"
    terminate([ok, sleeper], 5.0, reason="DeadlineExceeded")
    killed = sleeper.state["terminated"]
    assert killed["reason"] == "DeadlineExceeded"
    assert killed["exitCode"] == 128 + signal.SIGTERM
    assert killed["signal"] == signal.SIGTERM


def test_missing_executable_is_a_start_error(tmp_path: Path) -> None:
    c = ContainerProcess({"name": "main", "command": ["x"]}, "regular", tmp_path)
    c.start(["no-such-program-here"], {"PATH": str(tmp_path)}, tmp_path)
    assert c.state["terminated"]["reason"] == "StartError"
    assert "executable file not found" in c.state["terminated"]["message"]
