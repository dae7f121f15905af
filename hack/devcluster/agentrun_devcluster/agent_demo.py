"""``make demo-agent``: an agent run end to end, offline, on a scripted model.

Starts the local control plane and node, installs the CRD, starts the operator (model turns
run ``agentrun step llm`` from this checkout) and a scripted OpenAI-compatible model on
127.0.0.1 (:mod:`agentrun_devcluster.modelserver`), then applies
``examples/agent-investigation.yaml`` pointed at that model. The model, answering from its
script, calls two tools at once (one call with arguments its JSON Schema refuses, which the
model is told about), asks to restart a service (a gated tool: the demo approves the call with
``kubectl agentrun approve``), and answers. Prints ``kubectl get agentruns``, ``kubectl agentrun
transcript`` and ``kubectl agentrun result``, shuts everything down, exits 0 (non-zero, with the
logs, when anything fails). Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from .democluster import NAMESPACE, REPO, DemoCluster, demo_cluster
from .modelserver import ScriptedModel, reply, tool_call

EXAMPLE = REPO / "examples" / "agent-investigation.yaml"
VENV_BIN = Path(sys.executable).parent

SCRIPT = [
    reply(
        "p99 jumped at 09:12. Searching the checkout logs for cache and timeout errors.",
        [
            tool_call("search_logs", {"service": "checkout", "pattern": "cache", "since": "09:00"}),
            tool_call("search_logs", {"service": "checkout", "pattern": "timeout", "since": "9am"}),
        ],
        prompt_tokens=420,
        completion_tokens=60,
    ),
    reply(
        "The cache miss ratio went to 0.97 right after checkout-v2.14. Restarting checkout.",
        [tool_call("restart-service", {"service": "checkout"})],
        prompt_tokens=610,
        completion_tokens=40,
    ),
    reply(
        "p99 doubled because checkout-v2.14 started with a cold cache (miss ratio 0.97 from "
        "09:12). Checkout was restarted with approval, which refills the cache.",
        prompt_tokens=700,
        completion_tokens=45,
    ),
]


def _say(message: str) -> None:
    print(f"demo-agent: {message}", flush=True)


def llm_command() -> list[str]:
    """The command of a model turn's step, from this checkout's virtualenv."""
    agentrun = VENV_BIN / "agentrun"
    if agentrun.exists():
        return [str(agentrun), "step", "llm"]
    return [sys.executable, "-m", "agentrun.cli", "step", "llm"]


def run_demo(timeout: int) -> int:
    started = time.monotonic()
    state = Path(tempfile.mkdtemp(prefix="agentrun-demo-agent-"))
    with ScriptedModel(script=list(SCRIPT)) as model:
        _say(f"scripted model at {model.base_url}")
        with demo_cluster(
            state,
            _say,
            timeout=timeout,
            path_first=[VENV_BIN],
            operator_env={"AGENTRUN_LLM_COMMAND": shlex.join(llm_command())},
        ) as cluster:
            if not _run_agent(cluster, model, timeout):
                return 1
    _say(f"succeeded in {time.monotonic() - started:.1f}s")
    return 0


def _run_agent(cluster: DemoCluster, model: ScriptedModel, timeout: int) -> bool:
    """Apply the example pointed at ``model``, approve its gated call, follow it to the end
    and print what it did; False (after printing why) if it did not succeed."""
    kubectl, env = cluster.kubectl, cluster.env

    def run_json() -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            kubectl("get", "agentrun", name, "-n", NAMESPACE, "-o", "json").stdout
        )
        return found

    body = yaml.safe_load(EXAMPLE.read_text())
    name = body["metadata"]["name"]
    body["spec"]["agent"]["model"]["baseURL"] = model.base_url
    _say(f"applying {EXAMPLE.relative_to(REPO)} (baseURL: the scripted model)")
    print(_apply(cluster.cp.kubectl, env, body), end="")
    deadline = time.monotonic() + timeout
    gated = None
    while time.monotonic() < deadline and gated is None:
        status = run_json().get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed", "Cancelled"):
            break
        gated = next(
            (
                s["name"]
                for s in status.get("steps") or []
                if s.get("phase") == "WaitingForApproval"
            ),
            None,
        )
        time.sleep(1)
    if gated is not None:
        _say(f"{gated} waits for approval:")
        print(_plugin(env, "status", name, "-n", NAMESPACE), end="")
        _say(f"kubectl agentrun approve {name} {gated}")
        print(
            _plugin(env, "approve", name, gated, "-n", NAMESPACE,
                    "--reason", "the logs point at a cold cache"),
            end="",
        )  # fmt: skip
    waited = kubectl(
        "wait", "-n", NAMESPACE, "--for=condition=Succeeded", f"agentrun/{name}",
        f"--timeout={max(int(deadline - time.monotonic()), 1)}s", check=False,
    )  # fmt: skip
    print(kubectl("get", "agentruns", "-n", NAMESPACE).stdout, end="")
    _say(f"kubectl agentrun transcript {name}")
    print(_plugin(env, "transcript", name, "-n", NAMESPACE), end="")
    if waited.returncode != 0:
        _say(f"the run did not succeed: {waited.stderr.strip()}")
        _say("operator log tail:\n" + cluster.operator_log_tail())
        return False
    _say(f"kubectl agentrun result {name}")
    print(_plugin(env, "result", name, "-n", NAMESPACE))
    _say(f"the model was asked {len(model.completions())} times; nothing left this machine")
    return True


def _apply(kubectl_path: Path, env: dict[str, str], body: dict[str, Any]) -> str:
    proc = subprocess.run(
        [str(kubectl_path), "apply", "-n", NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(body), env=env, text=True, capture_output=True, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl apply failed:\n{proc.stderr}")
    return proc.stdout


def _plugin(env: dict[str, str], *args: str) -> str:
    """``kubectl agentrun ARGS`` (the plugin from this checkout's virtualenv)."""
    proc = subprocess.run(
        [str(VENV_BIN / "kubectl-agentrun"), *args], env=env, text=True, capture_output=True,
        timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl agentrun {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrun_devcluster.agent_demo",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--timeout", type=int, default=240, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_demo(args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
