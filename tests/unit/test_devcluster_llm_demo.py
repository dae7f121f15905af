"""``make demo-llm`` (agentrun_devcluster.llm_demo) without a cluster or llama-server: the demo
succeeds only when its run Succeeded and the server refused nothing, and otherwise says what
happened (the run's phase, reason and message) and fails."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agentrun.api import models as m
from agentrun_devcluster import llm_demo
from agentrun_devcluster.llamaserver import Exchange
from agentrun_devcluster.modelserver import reply


class FakeCluster:
    """What the demo uses of a DemoCluster: ``kubectl get`` answers with ``run``."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        self.env: dict[str, str] = {}
        self.cp = SimpleNamespace(kubectl=Path("kubectl"))

    def kubectl(self, *args: str, check: bool = True) -> SimpleNamespace:
        if args[:2] == ("get", "agentrun"):
            return SimpleNamespace(stdout=json.dumps(self.run), returncode=0)
        return SimpleNamespace(stdout="NAME  PHASE\n", returncode=0)

    def operator_log_tail(self) -> str:
        return "(operator log)"


class FakeProxy:
    base_url = "http://127.0.0.1:9/v1"

    def __init__(self, exchanges: list[Exchange]) -> None:
        self.exchanges = exchanges

    def answered(self) -> list[Exchange]:
        return list(self.exchanges)


def _run(phase: str, reason: str, message: str) -> dict[str, Any]:
    status = "True" if phase == "Succeeded" else "False"
    return {
        "status": {
            "phase": phase,
            "message": message,
            "usage": {"tokens": 60},
            "conditions": [
                {"type": "Succeeded", "status": status, "reason": reason, "message": message}
            ],
        }
    }


ANSWERED = Exchange(request={}, status=200, body=json.dumps(reply("Paris.")))
CUT_OFF = (
    "the model's answer in turn 1 was cut off at maxOutputTokens (256; finish reason length), "
    "so it is not the run's result"
)


@pytest.fixture(autouse=True)
def _no_kubectl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_demo, "_apply", lambda *args: "agentrun/agent-question created\n")
    monkeypatch.setattr(llm_demo, "_plugin", lambda *args: "")


@pytest.mark.parametrize(
    ("run", "exchanges", "said"),
    [
        (
            _run("Failed", "AnswerCutOff", CUT_OFF),
            [ANSWERED],
            f"the demo failed: the run ended Failed (reason AnswerCutOff): {CUT_OFF}",
        ),
        (
            _run("Failed", "MaxTurnsReached", "the model was still calling tools in turn 4"),
            [ANSWERED] * 4,
            "the run ended Failed (reason MaxTurnsReached): the model was still calling tools",
        ),
        (
            _run("Cancelled", "Cancelled", "cancelled by spec.cancel"),
            [ANSWERED],
            "the run ended Cancelled (reason Cancelled): cancelled by spec.cancel",
        ),
        (
            _run("Succeeded", "Succeeded", "the model answered in turn 1: Paris."),
            [ANSWERED, Exchange(request={}, status=500, body='{"error": "boom"}')],
            'llama-server refused 1 request(s), the first with HTTP 500: {"error": "boom"}',
        ),
        (
            {"status": {"phase": "Running", "message": "turn 1: thinking"}},
            [],
            "the demo failed: the run did not end in 0s (phase Running: turn 1: thinking)",
        ),
    ],
)
def test_a_run_that_did_not_succeed_fails_the_demo_saying_what_happened(
    capsys: pytest.CaptureFixture[str],
    run: dict[str, Any],
    exchanges: list[Exchange],
    said: str,
) -> None:
    """The demo printed "done" and exited 0 for a run that ended Failed (AnswerCutOff,
    MaxTurnsReached): now it says the phase, reason and message, and fails."""
    cluster, proxy = FakeCluster(run), FakeProxy(exchanges)
    timeout = 0 if run["status"]["phase"] == "Running" else 60  # an ended run: read once
    assert llm_demo._run_agent(cluster, proxy, timeout) is False  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert said in out, out
    assert "succeeded" not in out


def test_a_run_that_succeeded_on_a_server_that_refused_nothing_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _run("Succeeded", "Succeeded", "the model answered in turn 1: Paris.")
    assert llm_demo._run_agent(FakeCluster(run), FakeProxy([ANSWERED]), 60) is True  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "the run ended Succeeded (reason Succeeded): the model answered in turn 1: Paris." in out


def test_the_demo_asks_a_short_question_without_tools_with_room_to_answer() -> None:
    """A base model of 270M parameters finishes a run that asks one short question and needs
    no tool, given room for an answer of a few lines."""
    body = yaml.safe_load(llm_demo.EXAMPLE.read_text())
    run = m.AgentRun.model_validate(body)
    agent = run.spec.agent
    assert agent is not None and not agent.tools and not agent.mcp_servers
    assert not run.spec.plan.steps
    assert len(run.spec.goal) <= 80
    assert agent.model.max_output_tokens >= 512
    assert llm_demo.END_OF_TURN_BIAS[0] == "--logit-bias"
