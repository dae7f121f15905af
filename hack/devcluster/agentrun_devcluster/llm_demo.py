"""``make demo-llm``: an agent run end to end on a real model, offline.

As ``make demo-agent`` (:mod:`agentrun_devcluster.agent_demo`), but the model is llama.cpp's
``llama-server`` running Gemma 3 270M on this machine's CPU
(:mod:`agentrun_devcluster.llamaserver`: built and fetched by the project's scripts on first
use, then cached), behind a recording proxy. Applies ``examples/agent-investigation.yaml``
pointed at it, approves each gated call as it comes, follows the run to its end and prints
``kubectl get agentruns``, the transcript, and what the server was asked and answered.

A model this small answers as it does: the demo succeeds (exit 0) when the run ended with a
reason and the server refused nothing it was sent, whatever the run's phase; otherwise it exits
1 with the logs. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from .agent_demo import EXAMPLE, VENV_BIN, _apply, _plugin, llm_command
from .democluster import NAMESPACE, REPO, DemoCluster, demo_cluster
from .llamaserver import MODEL_NAME, LlamaServer, RecordingProxy, build_llama

TERMINAL = ("Succeeded", "Failed", "Cancelled")


def _say(message: str) -> None:
    print(f"demo-llm: {message}", flush=True)


def run_demo(timeout: int) -> int:
    started = time.monotonic()
    _say("building or reusing llama-server and the model (hack/build-llama-server.sh, "
         "hack/fetch-model.sh)")  # fmt: skip
    binary, model = build_llama()
    state = Path(tempfile.mkdtemp(prefix="agentrun-demo-llm-"))
    with LlamaServer(binary, model, log_path=state / "llama-server.log") as server:
        _say(f"llama-server at {server.base_url} (log: {server.log_path})")
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
                return 1
    _say(f"done in {time.monotonic() - started:.1f}s")
    return 0


def _run_agent(cluster: DemoCluster, proxy: RecordingProxy, timeout: int) -> bool:
    """Apply the example pointed at the proxy, approve its gated calls, follow it to its end
    and print what it did; False (after printing why) if the run did not end or the server
    refused a request."""
    kubectl, env = cluster.kubectl, cluster.env
    body = yaml.safe_load(EXAMPLE.read_text())
    name = body["metadata"]["name"]
    model = body["spec"]["agent"]["model"]
    model.update(baseURL=proxy.base_url, name=MODEL_NAME, maxOutputTokens=256, timeoutSeconds=900)
    body["spec"]["agent"]["maxTurns"] = 4
    _say(f"applying {EXAMPLE.relative_to(REPO)} (baseURL: llama-server, through the proxy)")
    print(_apply(cluster.cp.kubectl, env, body), end="")
    deadline = time.monotonic() + timeout
    approved: set[str] = set()
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = json.loads(kubectl("get", "agentrun", name, "-n", NAMESPACE, "-o", "json").stdout)
        status = run.get("status") or {}
        if status.get("phase") in TERMINAL:
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
        f"phase {status.get('phase')}: {status.get('message')}; tokens in status "
        f"{(status.get('usage') or {}).get('tokens')}, reported by the server {tokens}"
    )
    if status.get("phase") not in TERMINAL:
        _say(f"the run did not end in {timeout}s; operator log tail:")
        print(cluster.operator_log_tail())
        return False
    refused = [e for e in exchanges if e.status != 200]
    if refused:
        _say(f"llama-server refused {len(refused)} request(s): {refused[0].body[:300]}")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrun_devcluster.llm_demo",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--timeout", type=int, default=1800, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_demo(args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
