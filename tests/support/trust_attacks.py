"""The attacks of tests/e2e/test_trust_attacks.py: for each entry of the trust table
(:data:`agentrun.api.trust.TABLE`) the change an attacker makes to it (:data:`ATTACKS`), the
runs they are made on, and how a refusal is told apart.

A change is made with the actor's own client; a refusal comes back as the API's error. The
runs and their checks live in the test module; what here is the same for every run: which run
a case goes to (:func:`bundle_of`), and the markers a step's command leaves in the ledger (a
file on the machine, which the local node's step processes append to).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.api import trust
from agentrun.api.trust import Actor, Case, Outcome, Phase
from agentrun.core.naming import job_name, result_object_name
from agentrun.core.turns import record_name
from agentrun.settings import ANNOTATION_PROOF, LABEL_KIND, LABEL_RUN_UID
from agentrun_devcluster.modelserver import reply, tool_call
from agentrun_devcluster.testing import KubeClients

from .jobs import let_pods_start
from .runs import IMAGE, Run, envelope, get, status_of, step_status

GATED = "gated"
"""The plan step every plan run's attacks are about: approval required, reads ``first``."""
TOOL_STEP = "t1-0-act"
"""The gated tool call of every agent run's first turn."""
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
    """"plan" or "agent"."""
    ledger: Path
    admin: KubeClients
    decoy_uid: str
    """The uid of a ConfigMap anyone may name as an owner."""
    uid: str = ""
    seen_hash: str | None = None
    """The gated step's argsHash as the approver saw it before the attack."""
    users: dict[int, str] = field(default_factory=dict)
    """The user name of each actor's client (by ``id``): an approval is signed by its sender."""

    @property
    def gated(self) -> str:
        return GATED if self.kind == "plan" else TOOL_STEP

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
    """The model of the attacked agent runs: turn 1 calls the gated tool; once the model has
    its answer, it answers (served in a process of its own: tests.support.model_process)."""
    if any(msg.get("role") == "tool" for msg in body.get("messages") or []):
        return reply("done")
    return reply("acting", [tool_call("act", {"query": "latency"}, "c1")])


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


def _namespace(t: Target, c: KubeClients) -> None:
    c.core.patch_namespace(t.namespace, {"metadata": {"labels": {"forged": "true"}}})


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
    "result-object": _result_object,
    "agent-context": _context,
    "agent-transcript": _transcript,
    "audit-record": _audit,
    "referenced-configmap": _referenced_configmap,
    "referenced-secret": _referenced_secret,
    "signing-key": _signing_key,
    "shard-leases": _shard_lease,
    "crd": _crd,
    "namespaces": _namespace,
}
"""The change an attacker makes to each entry of the trust table."""

ISOLATED = frozenset({"job-spec", "result-object"})
"""Entries whose unaffected cases get a run of their own rather than the shared one: a second
pod of the step's Job would confound the others' check that the step ran once, and a changed
input that the running attempt no longer reads fails the retry that the shared run's deleted
pod (``pod-spec``) brings, closed (ResultTampered), which the others' check would take for
their own outcome."""


def bundle_of(case: Case) -> str:
    """Which run a case's change is made on: ``shared-<actor>`` (every change that should
    change nothing, refused or not: made one after the other on one run; the runs-only actor's
    on the edit actor's), ``applies-<actor>``, or one run of its own."""
    expect = case.expect
    alone = case.entry.id in ISOLATED and expect.outcome is Outcome.UNAFFECTED
    if expect.alternative is None and not alone:
        shared = Actor.EDIT if case.actor is Actor.RUNS_ONLY else case.actor
        if expect.outcome in (Outcome.UNAFFECTED, Outcome.REFUSED_RBAC, Outcome.REFUSED_API):
            return f"shared-{shared}"
        if expect.outcome is Outcome.APPLIES:
            return f"applies-{case.actor}"
    return f"{case.entry.id}-{case.actor}"


LAST = ("step-shape", "pod-spec", "job-finalizer")
"""Changes that remove the step from the plan, or delete its pods or its Job: made after the
others on a shared run."""


def in_order(cases: Iterable[Case]) -> list[Case]:
    """A bundle's cases in the order they are made: those of :data:`LAST` at the end."""
    refused = (Outcome.REFUSED_RBAC, Outcome.REFUSED_API)

    def order(c: Case) -> tuple[int, bool]:
        last = LAST.index(c.entry.id) if c.entry.id in LAST else -1
        return last, c.expect.outcome not in refused  # an entry's refused changes first

    return sorted(cases, key=order)


def kind_of(entry: trust.Entry) -> str:
    return "agent" if entry.agent else "plan"


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
        key = (case.phase, kind_of(case.entry), bundle_of(case))
        found.setdefault(key, []).append(case)
    return {key: in_order(cases) for key, cases in found.items()}


def phase_label(phase: Phase) -> str:
    return phase.name.lower()[:4]


def status_phase(run: Run) -> str | None:
    found = status_of(run).get("phase")
    return str(found) if found is not None else None
