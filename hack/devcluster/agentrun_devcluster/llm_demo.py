"""``make demo-llm``: an agent run end to end on a real model, offline.

As ``make demo-agent`` (:mod:`agentrun_devcluster.agent_demo`), but the model is llama.cpp's
``llama-server`` running Gemma 3 270M on this machine's CPU
(:mod:`agentrun_devcluster.llamaserver`: built and fetched by the project's scripts on first
use, then cached), behind a recording proxy. Applies ``examples/agent-question.yaml`` (one short
question, no tools) pointed at it, approves any gated call as it comes, follows the run to its
end and prints ``kubectl get agentruns``, the transcript, and what the server was asked and
answered.

The demo succeeds (exit 0, ``succeeded``) only when the run Succeeded and the server refused
nothing it was sent. Otherwise it says what happened in one line (the run's phase, reason and
message; or that it did not end; or what the server refused) and exits 1, with the server's
log. Nothing leaves the machine.

Gemma 3 270M as packaged here is a base model: it was not trained to end a chat turn, and
without help writes until ``maxOutputTokens`` (in 6 of 6 tries at 1024 tokens, a short question
with no tools), which fails the run (AnswerCutOff). So the demo's server raises the logit of
Gemma's end-of-turn token (:data:`END_OF_TURN_BIAS`, llama-server's ``--logit-bias``): the
model still writes what it writes, and ends its turn after a line or two (20 of 20 tries, 8 to 52
tokens). The real-model test (tests/e2e/test_real_model.py) runs the server without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .agent_demo import VENV_BIN, _apply, _plugin, llm_command
from .democluster import NAMESPACE, REPO, DemoCluster, demo_cluster
from .llamaserver import MODEL_NAME, Exchange, LlamaServer, RecordingProxy, build_llama

EXAMPLE = REPO / "examples" / "agent-question.yaml"
TERMINAL = ("Succeeded", "Failed", "Cancelled")
END_OF_TURN_TOKEN = 106
"""``<end_of_turn>`` in Gemma 3's vocabulary."""
END_OF_TURN_BIAS = ("--logit-bias", f"{END_OF_TURN_TOKEN}+20")
"""Added to the logit of ``<end_of_turn>`` in every request the demo's server samples (see the
module's docstring): +15 ended 8 of 9 tries within 512 tokens, +20 all 20, and
+25 ended 4 of 12 at once, with an empty answer."""


def _say(message: str) -> None:
    print(f"demo-llm: {message}", flush=True)


def run_demo(timeout: int) -> int:
    started = time.monotonic()
    _say("building or reusing llama-server and the model (hack/build-llama-server.sh, "
         "hack/fetch-model.sh)")  # fmt: skip
    binary, model = build_llama()
    state = Path(tempfile.mkdtemp(prefix="agentrun-demo-llm-"))
    with LlamaServer(
        binary, model, log_path=state / "llama-server.log", extra_args=END_OF_TURN_BIAS
    ) as server:
        bias = " ".join(END_OF_TURN_BIAS)
        _say(f"llama-server at {server.base_url} ({bias}; log: {server.log_path})")
        with RecordingProxy(upstream=server.root_url) as proxy:
            with demo_cluster(
                state,
                _say,
                timeout=timeout,
                path_first=[VENV_BIN],
                operator_env={"AGENTRUN_LLM_COMMAND": shlex.join(llm_command())},
            ) as cluster:
                ok = _run_agent(cluster, proxy, timeout)
            if not ok:
                _say("llama-server log tail:\n" + server.logs())
                _say(f"failed after {time.monotonic() - started:.1f}s")
                return 1
    _say(f"succeeded in {time.monotonic() - started:.1f}s")
    return 0


def _run_agent(cluster: DemoCluster, proxy: RecordingProxy, timeout: int) -> bool:
    """Apply the example pointed at the proxy, approve its gated calls, follow it to its end
    and print what it did; False (after saying why in one line) unless the run Succeeded and
    the server refused nothing."""
    kubectl, env = cluster.kubectl, cluster.env
    body = yaml.safe_load(EXAMPLE.read_text())
    name = body["metadata"]["name"]
    body["spec"]["agent"]["model"].update(baseURL=proxy.base_url, name=MODEL_NAME)
    _say(f"applying {EXAMPLE.relative_to(REPO)} (baseURL: llama-server, through the proxy)")
    print(_apply(cluster.cp.kubectl, env, body), end="")
    deadline = time.monotonic() + timeout
    approved: set[str] = set()
    while True:  # the run as it is at the deadline too
        run = json.loads(kubectl("get", "agentrun", name, "-n", NAMESPACE, "-o", "json").stdout)
        status: dict[str, Any] = run.get("status") or {}
        if status.get("phase") in TERMINAL or time.monotonic() >= deadline:
            break
        for st in status.get("steps") or []:
            if st.get("phase") == "WaitingForApproval" and st["name"] not in approved:
                _say(f"kubectl agentrun approve {name} {st['name']}")
                print(_plugin(env, "approve", name, st["name"], "-n", NAMESPACE,
                              "--reason", "demo"), end="")  # fmt: skip
                approved.add(st["name"])
        time.sleep(2)
    print(kubectl("get", "agentruns", "-n", NAMESPACE).stdout, end="")
    _say(f"kubectl agentrun transcript {name}")
    print(_plugin(env, "transcript", name, "-n", NAMESPACE), end="")
    exchanges = proxy.answered()
    for i, e in enumerate(exchanges, start=1):
        calls = [c.get("function", {}).get("name") for c in e.tool_calls]
        _say(f"request {i}: HTTP {e.status}, {e.tokens} tokens, tool calls {calls}")
    tokens = sum(e.tokens for e in exchanges if e.status == 200)
    _say(
        f"tokens in status {(status.get('usage') or {}).get('tokens')}, reported by the server "
        f"{tokens}"
    )
    problem = verdict(status, exchanges, timeout)
    if problem is None:
        _say(f"the run {ended(status)}")
        return True
    _say(problem)
    if status.get("phase") not in TERMINAL:
        _say("operator log tail:\n" + cluster.operator_log_tail())
    return False


def ended(status: Mapping[str, Any]) -> str:
    """How the run ended, in words: ``ended Failed (reason AnswerCutOff): the model's ...``."""
    conditions: list[dict[str, Any]] = status.get("conditions") or []
    succeeded = next((c for c in conditions if c.get("type") == "Succeeded"), {})
    reason = succeeded.get("reason") or "none"
    message = status.get("message") or succeeded.get("message") or "no message"
    return f"ended {status.get('phase')} (reason {reason}): {message}"


def verdict(status: Mapping[str, Any], exchanges: Sequence[Exchange], timeout: int) -> str | None:
    """Why the demo failed, in one line; None when the run Succeeded and the server refused
    nothing it was sent."""
    phase = status.get("phase")
    if phase not in TERMINAL:
        return (
            f"the demo failed: the run did not end in {timeout}s (phase {phase or 'none'}: "
            f"{status.get('message') or 'no message'})"
        )
    refused = [e for e in exchanges if e.status != 200]
    if refused:
        return (
            f"the demo failed: llama-server refused {len(refused)} request(s), the first with "
            f"HTTP {refused[0].status}: {refused[0].body[:300]}; the run {ended(status)}"
        )
    if phase != "Succeeded":
        return f"the demo failed: the run {ended(status)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrun_devcluster.llm_demo",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--timeout", type=int, default=1800, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_demo(args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
