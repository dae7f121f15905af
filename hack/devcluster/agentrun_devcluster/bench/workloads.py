"""What the benchmark runs: chains of steps as AgentRuns, the same steps as bare Jobs and as
Argo Workflows, and finished runs made without running them.

Every step, in a run or bare, is the same pod: ``busybox:1.36`` running ``sh -c`` with a
command that writes a result envelope to the termination log (on the local node, a local
``sh`` process), with the restricted security context the operator gives its step pods.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agentrun.access import audit
from agentrun.api import models as m
from agentrun.api.agent import MAX_TURNS
from agentrun.core import CoreConfig, CreateJob, DeleteJob, JobState, Observed, ObservedJob
from agentrun.core import reconcile as core_reconcile
from agentrun.execution import jobs as step_jobs
from agentrun.settings import RUN_FINALIZER
from agentrun_devcluster.modelserver import reply, tool_call

__all__ = [
    "AGENT_TOOL",
    "BENCH_LABEL",
    "IMAGE",
    "STEP_SCRIPT",
    "agent_run",
    "argo_workflow",
    "bare_job",
    "chain_run",
    "finished_run",
    "finished_status",
    "step_name",
    "turn_answer",
]

IMAGE = "busybox:1.36"
ENVELOPE = json.dumps({"ok": True, "summary": "done"})
STEP_SCRIPT = f"printf '%s' '{ENVELOPE}' > /dev/termination-log"
"""The command of every step: report a result and exit 0."""
BENCH_LABEL = "bench.agentrun.dev/case"
"""On every object the benchmark creates: the case it belongs to."""


def step_name(index: int) -> str:
    return f"s{index:03d}"


def chain_run(name: str, steps: int, case: str) -> dict[str, Any]:
    """An AgentRun of ``steps`` steps, each depending on the one before."""
    plan = []
    for i in range(steps):
        step: dict[str, Any] = {
            "name": step_name(i),
            "container": {"image": IMAGE, "command": ["sh", "-c", STEP_SCRIPT]},
        }
        if i:
            step["dependsOn"] = [step_name(i - 1)]
        plan.append(step)
    return {
        "apiVersion": f"{m.GROUP}/{m.VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name, "labels": {BENCH_LABEL: case}},
        "spec": {"goal": f"benchmark {case}", "plan": {"steps": plan}},
    }


AGENT_TOOL = "echo"
"""The one tool of the agent case: a container step like every other (:data:`STEP_SCRIPT`)."""
TURN_CALL = "turn-"
"""The prefix of the ids of :func:`turn_answer`'s calls, before the call's number."""


def agent_run(name: str, turns: int, case: str, base_url: str) -> dict[str, Any]:
    """An agent run on the model at ``base_url`` that may take ``turns`` turns: with
    :func:`turn_answer` answering, every turn but the last calls :data:`AGENT_TOOL` once."""
    return {
        "apiVersion": f"{m.GROUP}/{m.VERSION}",
        "kind": "AgentRun",
        "metadata": {"name": name, "labels": {BENCH_LABEL: case}},
        "spec": {
            "goal": f"benchmark {case}",
            "agent": {
                "model": {"baseURL": base_url, "name": "scripted"},
                "instructions": "Call the tool as often as you are told, then answer.",
                "maxTurns": min(turns + 1, MAX_TURNS),
                "tools": [
                    {
                        "name": AGENT_TOOL,
                        "description": "Reports done.",
                        "parameters": {"type": "object", "properties": {}},
                        "container": {"image": IMAGE, "command": ["sh", "-c", STEP_SCRIPT]},
                    }
                ],
            },
        },
    }


def turn_answer(turns: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A scripted model's answer (``ScriptedModel.responder``) for :func:`agent_run`: a call of
    :data:`AGENT_TOOL` until ``turns - 1`` calls were answered, then the final answer.

    Each call's id numbers it (``turn-N``), and the answers so far are read from the id the
    conversation's last tool message answers: a long run's older turns are left out of the
    context sent (``contextBytes``), so counting the tool messages would stop growing."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        tools = [msg for msg in body.get("messages") or [] if msg.get("role") == "tool"]
        answered = len(tools)
        if tools:
            number = str(tools[-1].get("tool_call_id") or "").removeprefix(TURN_CALL)
            answered = max(answered, int(number) if number.isdigit() else 0)
        if answered + 1 >= turns:
            return reply("done", prompt_tokens=10, completion_tokens=1)
        call = tool_call(AGENT_TOOL, {}, call_id=f"{TURN_CALL}{answered + 1}")
        return reply("", [call], prompt_tokens=10, completion_tokens=1)

    return answer


def bare_job(name: str, case: str) -> dict[str, Any]:
    """A Job running one step's pod, as a script would create it."""
    labels = {BENCH_LABEL: case}
    container = {
        "name": "step",
        "image": IMAGE,
        "command": ["sh", "-c", STEP_SCRIPT],
        "securityContext": step_jobs.RESTRICTED_CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "securityContext": step_jobs.RESTRICTED_POD_SECURITY,
                    "automountServiceAccountToken": False,
                },
            },
        },
    }


def argo_workflow(name: str, steps: int, case: str) -> dict[str, Any]:
    """An Argo Workflow of ``steps`` steps run one after the other, each the same container
    as a run's step: the peer leg's counterpart of :func:`chain_run`. Argo's defaults
    otherwise (its pods keep running as it makes them: an init and a wait container beside
    the step's own)."""
    labels = {BENCH_LABEL: case}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "entrypoint": "chain",
            "podMetadata": {"labels": labels},
            "securityContext": step_jobs.RESTRICTED_POD_SECURITY,
            "templates": [
                {
                    "name": "chain",
                    "steps": [[{"name": step_name(i), "template": "step"}] for i in range(steps)],
                },
                {
                    "name": "step",
                    "container": {
                        "image": IMAGE,
                        "command": ["sh", "-c", STEP_SCRIPT],
                        "securityContext": step_jobs.RESTRICTED_CONTAINER_SECURITY,
                    },
                },
            ],
        },
    }


def finished_run(name: str, case: str) -> dict[str, Any]:
    """A one-step run as the operator leaves it once finished, minus status: with the run
    finalizer it puts on every run (see :func:`finished_status` for the status)."""
    body = chain_run(name, 1, case)
    body["metadata"]["finalizers"] = [RUN_FINALIZER]
    return body


def _levelled(status: m.AgentRunStatus, name: str, uid: str | None) -> dict[str, Any]:
    """``status`` with its audit record level with its history, as the operator leaves a
    finished run once the record holds every transition (its last status write)."""
    audit_status = status.audit or m.AuditStatus()
    audit_status.record = audit.record_prefix(name, uid or "")
    audit_status.recorded_seq = status.history_seq or 0
    status.audit = audit_status
    return status.to_wire()


def finished_status(stored: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The status the core commits for ``stored`` (a run as the API server returned it, so
    with its uid) when every step's Job succeeds: the core's own reconcile output, driven
    in memory to the end, never through the cluster. Raises RuntimeError when the run does
    not end."""
    run = m.AgentRun.model_validate(stored)
    now = now or datetime.now(UTC)
    config = CoreConfig()
    found: dict[str, ObservedJob] = {}
    for _ in range(8 + 4 * len(run.spec.plan.steps if run.spec.plan else [])):
        decision = core_reconcile(run, Observed(tuple(found.values())), now, config)
        run = run.model_copy(update={"status": decision.status})
        if decision.status.phase in m.TERMINAL_RUN_PHASES:
            return _levelled(decision.status, run.metadata.name, run.metadata.uid)
        for action in (*decision.before_commit, *decision.after_commit):
            if isinstance(action, CreateJob):
                found[action.job_name] = ObservedJob(
                    name=action.job_name,
                    step=action.step.name,
                    attempt=action.attempt,
                    state=JobState.SUCCEEDED,
                    termination_message=ENVELOPE,
                    exit_code=0,
                    started_at=now,
                    finished_at=now,
                )
            elif isinstance(action, DeleteJob):
                found.pop(action.job_name, None)
    phase = run.status.phase if run.status else None
    raise RuntimeError(f"run {run.metadata.name} did not finish in memory (phase {phase})")
