"""The trust table, attacked: every (entry, phase, actor, kind of attack) of
:data:`agentrun.api.trust.TABLE`.

For each case the actor (eve: the built-in ``edit`` role in the namespace, into which
``agentrun-edit`` aggregates; mallory: ``agentrun-edit`` only; rita: may only create and read
AgentRuns) makes the entry's change (:data:`tests.support.trust_attacks.ATTACKS`) or its mimic
(:data:`tests.support.trust_attacks.MIMICS`: the legitimate writer's exact object or value,
before that writer where the phase allows it) while the step it is about is in the case's
phase, with the shipped admission policies bound to the namespace, and the test checks the
outcome the table declares:

* refused by RBAC or by the API server: the change comes back refused, and the run it was
  tried on ends as if nothing happened;
* unaffected: the run ends Succeeded, its gated step ran its approved command once with the
  genuine input, and committed its own result;
* applies: the change was admitted and nothing unapproved ran;
* re-gated: the gated step waits for an approval of a new argsHash, and the approval of the
  one the approver saw runs nothing;
* failed closed: the reason the table names is recorded, and nothing the attacker made was
  used.

Whatever the case, no command of the attacker's ever runs as a step (the ``ATTACK`` marker its
command would write to the ledger), no forged input reaches a step (``FORGED``), no forged
context reaches the model, no step commits a result it did not make, and no object an attacker
made in its legitimate writer's exact shape (a sub-agent's child, a result object) is ever
committed to the run's status. Cases whose phase does not apply are not applicable by the
table's data; the summary counts them too.

Changes that should change nothing are made one after the other on one run per (phase, kind of
run, actor) (:func:`tests.support.trust_attacks.bundle_of`); the others get a run each. All runs
go at once, on one operator. Steps are held in their phase by files the test creates (the local
node runs them as processes on this machine).

One more test makes the step-references attack with only the identity policy bound: what the
operator holds on its own (an added step that would print a Secret fails, Forbidden).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api import models as m
from agentrun.api import trust
from agentrun.api.trust import Actor, Attack, Case, Outcome, Phase
from agentrun.core.naming import job_name
from agentrun_devcluster.testing import KubeClients, TestCluster, wait_for
from tests.support.admission import APPROVERS, creator_recorded, mutating_only, policies_bound_to
from tests.support.agents import agent_run, tool
from tests.support.cluster import (
    StartOperator,
    bind_role,
    mint_user,
    read_or_none,
    service_account_subject,
    user_subject,
)
from tests.support.model_process import ModelProcess
from tests.support.paths import MANIFESTS
from tests.support.plugin import LLM_COMMAND
from tests.support.runs import TERMINAL, Run, agentrun, envelope, get, status_of, step, step_status
from tests.support.trust_attacks import (
    API_KEY_SECRET,
    ATTACK,
    ATTACKS,
    FORGED,
    GENUINE,
    HELPER,
    HTTP_TOOL,
    LARGE,
    LARGE_DIGEST,
    REFERENCED,
    SECRET_VALUE,
    STEP_ACCOUNT,
    SUB_STEP,
    Target,
    attack_of,
    phase_label,
    planned,
    refusal,
)
from tests.support.waiting import assert_holds

RETRY = {"limit": 1, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 1}}
#: ``agentrun step --`` as the node's processes can run it.
AGENTRUN_STEP = (
    ["agentrun", "step", "--"]
    if shutil.which("agentrun")
    else [sys.executable, "-m", "agentrun.cli", "step", "--"]
)
HOLD_CAP = 600
"""Rounds of 0.2 s a held step waits for its release at most (so that nothing waits forever)."""
"""Seconds ``first`` runs in the pending phase: the gated step stays Pending meanwhile."""


def _held(hold: Path) -> str:
    """The start of a step's script: wait until the test creates ``hold`` (it holds the step
    in its phase while the attacks are made)."""
    return f"i=0; while [ ! -e {hold} ] && [ $i -lt {HOLD_CAP} ]; do sleep 0.2; i=$((i+1)); done; "


ADMITTED = "admitted"
USERS = {Actor.EDIT: "eve", Actor.AGENTRUN_EDIT: "mallory", Actor.RUNS_ONLY: "rita"}
TIMEOUT = 300.0
"""Seconds a run may take to reach a phase. Every bundle's run goes at once (89), each
through two or three pod starts with a Python process: on two cores beside the rest of the
suite, a wave of them takes minutes."""


def _edit_rules() -> list[dict[str, Any]]:
    for doc in yaml.safe_load_all((MANIFESTS / "user-roles.yaml").read_text()):
        if doc and doc["metadata"]["name"] == "agentrun-edit":
            rules: list[dict[str, Any]] = doc["rules"]
            return rules
    raise AssertionError("manifests/user-roles.yaml has no agentrun-edit")


@dataclass
class World:
    cluster: TestCluster
    kube: KubeClients
    namespace: str
    ledger: Path
    holds: Path
    model: ModelProcess
    creator: KubeClients
    approver: KubeClients
    actors: dict[Actor, KubeClients]
    decoy_uid: str


@pytest.fixture
def world(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    start_operator: StartOperator,
    tmp_path: Path,
) -> Iterator[World]:
    """The namespace with the shipped admission policies bound to it."""
    yield from _world(cluster, kube, namespace, start_operator, tmp_path, None)


@pytest.fixture
def world_without_validation(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    start_operator: StartOperator,
    tmp_path: Path,
) -> Iterator[World]:
    """The same, with only the policy that records who created and changed a run: what the
    operator holds on its own."""
    yield from _world(cluster, kube, namespace, start_operator, tmp_path, mutating_only)


def _world(
    cluster: TestCluster,
    kube: KubeClients,
    namespace: str,
    start_operator: StartOperator,
    tmp_path: Path,
    keep: Callable[[dict[str, Any]], bool] | None,
) -> Iterator[World]:
    if cluster.external:
        pytest.skip("users are minted with the local control plane's CA; turns run this checkout")
    start_operator(env={"AGENTRUN_LLM_COMMAND": shlex.join(LLM_COMMAND)})
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": REFERENCED}, "data": {"value": GENUINE}}
    )
    for secret in (REFERENCED, API_KEY_SECRET):
        kube.core.create_namespaced_secret(
            namespace, {"metadata": {"name": secret}, "stringData": {"value": SECRET_VALUE}}
        )
    decoy = kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "decoy"}})
    # The account of large-result and executor runs' steps: stores results over 3 KiB.
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": STEP_ACCOUNT}})
    bind_role(
        kube,
        namespace,
        STEP_ACCOUNT,
        [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list"]}],
        [service_account_subject(STEP_ACCOUNT, namespace)],
    )
    runs = {"apiGroups": [m.GROUP], "resources": [m.PLURAL]}
    bind_role(
        kube,
        namespace,
        "creator",
        [
            {**runs, "verbs": ["create", "get", "list", "watch"]},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get"],
                "resourceNames": [REFERENCED],
            },
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get"],
                "resourceNames": [REFERENCED, API_KEY_SECRET],
            },
            {
                "apiGroups": [""],
                "resources": ["serviceaccounts"],
                "verbs": ["impersonate"],
                "resourceNames": [STEP_ACCOUNT],
            },
        ],
        [user_subject("creator")],
    )
    bind_role(
        kube,
        namespace,
        "approver",
        [{**runs, "verbs": ["get", "list", "watch", "patch", "update"]}],
        [user_subject("approver")],
    )
    bind_role(
        kube,
        namespace,
        "agentrun-edit",
        _edit_rules(),
        [user_subject(USERS[Actor.EDIT]), user_subject(USERS[Actor.AGENTRUN_EDIT])],
    )
    bind_role(
        kube,
        namespace,
        "runs-only",
        [{**runs, "verbs": ["create", "get", "list", "watch"]}],
        [user_subject(USERS[Actor.RUNS_ONLY])],
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "eve-edits"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [user_subject(USERS[Actor.EDIT])],
        },
    )

    def client(user: str, groups: list[str]) -> KubeClients:
        path = mint_user(cluster, user, groups, tmp_path / f"{user}.kubeconfig")
        return KubeClients.from_kubeconfig(path)

    creator = client("creator", [])
    approver = client("approver", [APPROVERS])
    actors = {actor: client(user, []) for actor, user in USERS.items()}
    recorded = creator_recorded(cluster, namespace, tmp_path / "creator.kubeconfig")
    try:
        with (
            ModelProcess("tests.support.trust_attacks:respond", tmp_path / "model.jsonl") as model,
            policies_bound_to(cluster, namespace, recorded, keep),
        ):
            holds = tmp_path / "holds"
            holds.mkdir()
            yield World(
                cluster,
                kube,
                namespace,
                tmp_path / "ledger",
                holds,
                model,
                creator,
                approver,
                actors,
                decoy.metadata.uid,
            )
    finally:
        for clients in (creator, approver, *actors.values()):
            clients.close()
        # A Job whose run-uid label an attack removed is not found by it at cleanup (the
        # known gap of the trust table's job-labels entry): release every Job's finalizer.
        for job in kube.batch.list_namespaced_job(namespace).items:
            if job.metadata.finalizers:
                try:
                    kube.batch.patch_namespaced_job(
                        job.metadata.name, namespace, {"metadata": {"finalizers": None}}
                    )
                except ApiException as error:
                    if error.status != 404:  # gone meanwhile (the operator let it go)
                        raise


# -- the runs ----------------------------------------------------------------------------------


def _plan_run(name: str, ledger: Path, holds: Path) -> Run:
    first = step(
        "first",
        _held(holds / f"{name}.first") + envelope("first done", {"data": GENUINE + "x" * 300}),
    )
    # What the creator lets a step read: a Secret and a ConfigMap, by reference.
    first["container"]["env"] = [
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": REFERENCED, "key": "value"}}},
        {
            "name": "FROM_SECRET",
            "valueFrom": {"secretKeyRef": {"name": REFERENCED, "key": "value"}},
        },
    ]
    script = (
        f'case "$INPUT" in {GENUINE}*) tag=genuine;; *) tag={FORGED};; esac; '
        f'echo "ran:{name}:$tag" >> {ledger}; ' + _held(holds / f"{name}.gated")
    ) + envelope(f"approved {name}")
    gated = step(
        "gated",
        script,
        after=["first"],
        approval="required",
        retry=RETRY,
        inputs=[{"name": "INPUT", "fromStep": "first", "key": "data"}],
    )
    return agentrun(
        name,
        [first, gated],
        goal=f"trust attack {name}",
        policy={"approverGroups": [APPROVERS]},
        retention={"keepJobs": "all"},
    )


def _agent_run(name: str, ledger: Path, model: ModelProcess, holds: Path) -> Run:
    script = (
        f'echo "acted:{name}" >> {ledger}; '
        + _held(holds / f"{name}.gated")
        + 'echo "act got $AGENTRUN_TOOL_ARGS" > /dev/termination-log'
    )
    act = tool(
        "act",
        "Act on the service.",
        {"type": "object", "properties": {"query": {"type": "string"}}},
        {"image": "busybox:1.36", "command": ["sh", "-c", script]},
        approval="required",
    )
    # Offered, never called: the entry agent-http-tools changes its URL and allowedHosts.
    lookup = {
        "name": HTTP_TOOL,
        "description": "Look a thing up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        "http": {
            "url": "http://127.0.0.1:9/lookup/{query}",
            "headers": [{"name": "Accept", "value": "application/json"}],
            "allowedHosts": ["127.0.0.1:9"],
        },
    }
    return agent_run(
        name,
        model.base_url,
        tools=[act, lookup],
        model_extra={"apiKeySecretRef": {"name": API_KEY_SECRET, "key": "value"}},
        goal=f"trust attack {name}",
        plan={"steps": [step("first", _held(holds / f"{name}.first") + envelope("first done"))]},
        policy={"approverGroups": [APPROVERS]},
        retention={"keepJobs": "all"},
    )


def _subagent_run(name: str, model: ModelProcess, holds: Path) -> Run:
    """Turn 1 calls ``helper``, a gated sub-agent tool: its child answers at once."""
    helper = {
        "name": HELPER,
        "description": "Hands one question to a helper, who answers it.",
        "parameters": {
            "type": "object",
            "properties": {"goal": {"type": "string"}},
            "required": ["goal"],
        },
        "agent": {"instructions": "Answer in one line.", "preamble": "Be brief.", "maxTurns": 2},
        "approval": "required",
    }
    return agent_run(
        name,
        model.base_url,
        tools=[helper],
        model_extra={"apiKeySecretRef": {"name": API_KEY_SECRET, "key": "value"}},
        goal=f"trust attack {name}",
        plan={"steps": [step("first", _held(holds / f"{name}.first") + envelope("first done"))]},
        policy={"approverGroups": [APPROVERS]},
        retention={"keepJobs": "all"},
    )


def _large_run(name: str, ledger: Path, holds: Path) -> Run:
    """``first``, then the gated ``gated``, which prints :data:`LARGE` through the step runner:
    stored as its first attempt's result object (no retry: a failed attempt fails the run)."""
    first = step("first", _held(holds / f"{name}.first") + envelope("first done"))
    script = (
        f'echo "ran:{name}:genuine" >> {ledger}; '
        + _held(holds / f"{name}.gated")
        + f"python3 -c \"import sys; sys.stdout.write('{LARGE[:7]}' + 'x' * {len(LARGE) - 7})\""
    )
    gated = step(
        "gated", command=[*AGENTRUN_STEP, "sh", "-c", script], after=["first"], approval="required"
    )
    return agentrun(
        name,
        [first, gated],
        goal=f"trust attack {name}",
        policy={"approverGroups": [APPROVERS]},
        retention={"keepJobs": "all"},
        stepTemplate={"serviceAccountName": STEP_ACCOUNT},
    )


# -- one run: reach the phase, attack, see what happened ---------------------------------------


class Driver:
    """One run of one bundle: its cases' changes made in its phase, then its checks."""

    def __init__(
        self, w: World, phase: Phase, kind: str, bundle: str, index: int, cases: list[Case]
    ) -> None:
        self.w, self.phase, self.kind, self.bundle, self.cases = w, phase, kind, bundle, cases
        name = f"{kind[0]}{phase_label(phase)}-{index:02d}"
        self.t = Target(w.namespace, name, kind, w.ledger, w.kube, w.decoy_uid)
        self.t.users = {id(c): USERS[a] for a, c in w.actors.items()}
        self.tried: dict[str, str] = {}

    # the run's life

    def run(self) -> Run:
        return get(self.w.kube, self.w.namespace, self.t.name)

    def gated(self) -> dict[str, Any]:
        return step_status(self.run(), self.t.gated)

    def wait(self, what: str, found: Callable[[Run], bool], timeout: float = TIMEOUT) -> Run:
        last: dict[str, Any] = {}

        def check() -> Run | None:
            run = self.run()
            last["status"] = {k: status_of(run).get(k) for k in ("phase", "message")}
            return run if found(run) else None

        try:
            # Every bundle's thread polls: once a second keeps the API server and this
            # process from spending the machine on reads of large runs.
            return wait_for(f"{self.t.name}: {what}", check, timeout=timeout, interval=1.0)
        except TimeoutError as e:
            raise AssertionError(f"{e}; last status: {last.get('status')}") from None

    def approve(self, args_hash: str) -> None:
        run = self.run()
        approvals = [
            *(run["spec"].get("approvals") or []),
            {"step": self.t.gated, "decision": "approve", "argsHash": args_hash, "by": "approver"},
        ]
        self.w.approver.custom.patch_namespaced_custom_object(
            m.GROUP,
            m.VERSION,
            self.w.namespace,
            m.PLURAL,
            self.t.name,
            {"spec": {"approvals": approvals}},
        )

    def approved(self, args_hash: str) -> bool:
        return any(
            a.get("argsHash") == args_hash and a.get("step") == self.t.gated
            for a in self.run()["spec"].get("approvals") or []
        )

    def waiting_hash(self, run: Run) -> str | None:
        st = step_status(run, self.t.gated)
        return st.get("argsHash") if st.get("phase") == "WaitingForApproval" else None

    def release(self, which: str) -> None:
        """Let the run's step ``which`` ("first" or "gated") go on."""
        (self.w.holds / f"{self.t.name}.{which}").touch()

    def create(self) -> None:
        if self.phase is not Phase.PENDING:
            self.release("first")
        if self.phase not in (Phase.LAUNCHING, Phase.RUNNING):
            self.release("gated")
        name, w = self.t.name, self.w
        if self.kind == "plan":
            body = _plan_run(name, w.ledger, w.holds)
        elif self.kind == "large":
            body = _large_run(name, w.ledger, w.holds)
        elif self.kind == "subagent":
            body = _subagent_run(name, w.model, w.holds)
        else:
            body = _agent_run(name, w.ledger, w.model, w.holds)
            if self.kind == "executor":  # turn 1's output is stored by the executor
                body["spec"]["stepTemplate"] = {"serviceAccountName": STEP_ACCOUNT}
        created = self.w.creator.custom.create_namespaced_custom_object(
            m.GROUP, m.VERSION, self.w.namespace, m.PLURAL, body
        )
        self.t.uid = created["metadata"]["uid"]

    def reach(self) -> None:
        if self.phase is Phase.PENDING:
            self.wait(
                "first running, the gated step not started",
                lambda r: (
                    step_status(r, "first").get("phase") == "Running"
                    and step_status(r, self.t.gated).get("phase") in (None, "Pending")
                ),
            )
            return
        run = self.wait("the gated step waiting", lambda r: self.waiting_hash(r) is not None)
        self.t.seen_hash = self.waiting_hash(run)
        assert self.t.seen_hash
        if self.phase is Phase.WAITING:
            return
        self.approve(self.t.seen_hash)
        if self.phase is Phase.RUNNING and self.kind == "subagent":
            # The call runs once its child is adopted (which answers at once).
            self.wait(
                "the call's child adopted",
                lambda r: any(
                    t.get("reason") == "SubAgentStarted" and t.get("step") == SUB_STEP
                    for t in status_of(r).get("history") or []
                ),
            )
        elif self.phase is Phase.RUNNING:
            self.wait(
                "the gated step running",
                lambda r: step_status(r, self.t.gated).get("phase") == "Running",
            )
        elif self.phase is Phase.FINISHED:
            self.wait("the run finished", lambda r: status_of(r).get("phase") == "Succeeded")
            # and the turn's context and transcript written (an agent run), the Job kept
            self.wait("the run's records", lambda r: bool(status_of(r).get("audit")))

    def attack(self) -> None:
        try:
            self._attack()
        finally:
            self.release("first")
            self.release("gated")

    def _attack(self) -> None:
        made: dict[tuple[str, Actor, int], str] = {}
        for case in self.cases:
            client = self.w.actors[case.actor]
            attack = attack_of(case)
            # A mimic that is the change itself, on the run the change goes to: made once.
            key = (case.entry.id, case.actor, id(attack))
            if key in made:
                self.tried[case.id] = made[key]
                continue
            try:
                attack(self.t, client)
            except ApiException as error:
                self.tried[case.id] = refusal(error).value
                DETAILS[case.id] = _message(error)
            except Exception as error:  # the attack could not be made: the case says why
                self.tried[case.id] = f"error: {error}"
            else:
                self.tried[case.id] = ADMITTED
            made[key] = self.tried[case.id]

    # after the attack

    def settle(self, stale_approval: bool = False) -> Run:
        """Carry the run to its end: approve what the gated step waits for (what the approver
        sees), unless it is a re-gated step (then the stale approval is given instead)."""

        def done(run: Run) -> bool:
            if status_of(run).get("phase") in TERMINAL:
                return True
            h = self.waiting_hash(run)
            if h is not None and not self.approved(h):
                if stale_approval:
                    return True
                self.approve(h)
            return False

        return self.wait("the run's end", done)

    def violations(self, unaffected: bool) -> list[str]:
        """What must never happen, whatever the case; with ``unaffected``, also that the run
        ended as if nothing had been changed."""
        found = []
        lines = self.t.lines()
        bad = [line for line in lines if line.startswith(ATTACK) or line.endswith(FORGED)]
        if bad:
            found.append(f"ran something unapproved or forged: {bad}")
        run = self.run()
        if SECRET_VALUE in json.dumps(status_of(run)):
            found.append("a Secret's value is in the run's status")
        st = self.gated()
        summary = st.get("summary")
        genuine = f"approved {self.t.name}"
        if self.kind == "plan" and st.get("phase") == "Succeeded" and summary != genuine:
            found.append(f"committed a result it did not make: {summary!r}")
        large_ok = st.get("resultDigest") == LARGE_DIGEST and FORGED not in json.dumps(st)
        if self.kind == "large" and st.get("phase") == "Succeeded" and not large_ok:
            found.append(f"committed a result it did not make: {st.get('resultDigest')}")
        agent = status_of(run).get("agent") or {}
        children = {(c.get("child") or {}).get("uid") for c in agent.get("calls") or []}
        started = " ".join(
            t.get("message") or ""
            for t in status_of(run).get("history") or []
            if t.get("reason") == "SubAgentStarted"
        )
        adopted = [uid for uid in self.t.forged if uid in children or uid in started]
        if adopted:
            found.append(f"adopted a child an attacker made: {adopted}")
        sent = [
            r
            for r in self.w.model.completions()
            if f"trust attack {self.t.name}" in json.dumps(r.body)
        ]
        if any(FORGED in json.dumps(r.body) for r in sent):
            found.append("the model was sent a forged context")
        if any(
            r.authorization != f"Bearer {SECRET_VALUE}" and "sk-forged" not in str(r.authorization)
            for r in sent
        ):
            found.append("a model request came without the run's key")
        if unaffected:
            if status_of(run).get("phase") != "Succeeded":
                found.append(
                    f"ended {status_of(run).get('phase')}: {status_of(run).get('message')}"
                )
            mark = "ran:" if self.kind in ("plan", "large") else "acted:"
            ran = [line for line in lines if line.startswith(mark)]
            if self.kind != "subagent" and len(ran) != 1:
                found.append(f"the approved command ran {len(ran)} times: {ran}")
            if self.kind == "plan" and self.t.seen_hash and st.get("argsHash") != self.t.seen_hash:
                found.append(f"argsHash changed: {self.t.seen_hash[:12]} -> {st.get('argsHash')}")
            answer = (status_of(run).get("agent") or {}).get("answer")
            if self.kind in ("agent", "subagent", "executor") and answer != "done":
                found.append("the agent did not answer")
        return found

    def reasons_seen(self, run: Run) -> set[str]:
        status = status_of(run)
        seen = {t.get("reason") for t in status.get("history") or []}
        seen |= {c.get("reason") for c in status.get("conditions") or []}
        for st in status.get("steps") or []:
            seen.add((st.get("error") or {}).get("reason"))
        # A failed attempt that was retried tells its reason in a Warning Event.
        events = self.w.kube.core.list_namespaced_event(
            self.w.namespace, field_selector=f"involvedObject.name={self.t.name}"
        )
        seen |= {e.reason for e in events.items if e.type == "Warning"}
        return {r for r in seen if r}

    def failed_closed(self, expect: trust.Expect) -> list[str]:
        if expect.reasons:
            wanted = set(expect.reasons)

            def reason(run: Run) -> bool:
                h = self.waiting_hash(run)
                if h is not None and not self.approved(h):
                    self.approve(h)
                return bool(wanted & self.reasons_seen(run)) or (
                    status_of(run).get("phase") in TERMINAL
                )

            run = self.wait(f"one of {sorted(wanted)}", reason)
            if not wanted & self.reasons_seen(run):
                return [f"none of {sorted(wanted)} in {sorted(self.reasons_seen(run))}"]
        else:
            self.settle()
        return self.violations(unaffected=False)

    def regated(self) -> list[str]:
        seen = self.t.seen_hash

        def waiting_anew(run: Run) -> bool:
            h = self.waiting_hash(run)
            return h is not None and h != seen

        self.wait("the gated step waiting for a new approval", waiting_anew)

        def still() -> None:
            run = self.run()
            assert waiting_anew(run), step_status(run, self.t.gated)
            assert not self.violations(unaffected=False), self.violations(unaffected=False)

        try:
            assert_holds(still, seconds=5)
        except AssertionError as e:
            return [str(e).splitlines()[0]]
        return []

    def judge(self) -> dict[str, str]:
        """Each case's observed outcome class, or what went wrong."""
        admitted = [c for c in self.cases if self.tried[c.id] == ADMITTED]
        observed = {c.id: self.tried[c.id] for c in self.cases if c not in admitted}
        expects = {c.expect for c in admitted}
        if not admitted:
            problems = self.violations(unaffected=False)
            return {k: v if not problems else f"{v}, but {problems}" for k, v in observed.items()}
        first = admitted[0].expect
        if any(e.outcome is Outcome.REGATED for e in expects):
            if self.phase is Phase.WAITING:
                assert self.t.seen_hash
                self.approve(self.t.seen_hash)
            problems, got = self.regated(), Outcome.REGATED
        elif first.outcome is Outcome.FAILED_CLOSED:
            problems, got = self.failed_closed(first), Outcome.FAILED_CLOSED
            if problems and first.alternative is Outcome.UNAFFECTED:
                self.settle()
                problems, got = self.violations(unaffected=True), Outcome.UNAFFECTED
        elif first.outcome in (Outcome.APPLIES, Outcome.KNOWN_GAP):
            self.settle()
            problems, got = self.violations(unaffected=False), first.outcome
        else:
            if self.phase is Phase.FINISHED:

                def ended_as_it_did() -> None:
                    assert status_of(self.run()).get("phase") == "Succeeded"

                assert_holds(ended_as_it_did, seconds=4)
            # Re-gated instead (the table's alternative): the new argsHash is not approved.
            regated = first.alternative is Outcome.REGATED
            if regated and self.waiting_hash(self.settle(stale_approval=True)) is not None:
                problems, got = self.regated(), Outcome.REGATED
            else:
                self.settle()
                problems, got = self.violations(unaffected=True), Outcome.UNAFFECTED
        verdict = got.value if not problems else f"violated ({got.value}): {'; '.join(problems)}"
        # Refused changes were tried on the same run: it must have ended as the others say.
        for c in self.cases:
            observed[c.id] = (
                verdict
                if c in admitted
                else (
                    observed[c.id]
                    if not problems
                    else f"{observed[c.id]}, but {'; '.join(problems)}"
                )
            )
        return observed

    def go(self) -> dict[str, str]:
        try:
            self.create()
            self.reach()
            self.attack()
            return self.judge()
        except Exception as error:  # every case of the run reports it
            text = "".join(traceback.format_exception_only(error)).strip()
            return {c.id: f"error in {self.t.name}: {text}" for c in self.cases}


DETAILS: dict[str, str] = {}
"""What the API server said to each refused change, for the report of a mismatch."""


def _message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message", ""))[:300]
    except ValueError:
        return str(error.body)[:300]


def _matches(case: Case, observed: str) -> bool:
    allowed = {case.expect.outcome.value}
    if case.expect.alternative is not None:
        allowed.add(case.expect.alternative.value)
    return observed in allowed


def test_every_case_of_the_trust_table_ends_as_it_declares(
    world: World, record_property: Callable[[str, object], None], tmp_path: Path
) -> None:
    plan = planned()
    drivers = [
        Driver(world, phase, kind, bundle, i, cases)
        for i, ((phase, kind, bundle), cases) in enumerate(sorted(plan.items()))
    ]
    with ThreadPoolExecutor(max_workers=len(drivers)) as pool:
        results = list(pool.map(Driver.go, drivers))
    observed = {k: v for found in results for k, v in found.items()}

    everything = list(trust.cases())
    rows = []
    for case in everything:
        got = observed.get(case.id, Outcome.NOT_APPLICABLE.value)
        rows.append((case, got))
    wrong = [(c, got) for c, got in rows if not _matches(c, got)]
    summary = {
        "cases": len(rows),
        "tried": len(observed),
        "runs": len(drivers),
        "declared": dict(Counter(c.expect.outcome.value for c, _ in rows)),
        "observed": dict(Counter(got if _matches(c, got) else "mismatch" for c, got in rows)),
        "mismatches": [
            f"{c.id}: declared {c.expect.outcome.value}, got {got} {DETAILS.get(c.id, '')}"
            for c, got in wrong
        ],
    }
    text = json.dumps(summary, indent=2)
    (tmp_path / "trust-attacks.json").write_text(text)
    record_property("trust_attacks", text)
    print(f"\ntrust attacks: {text}")
    assert len(rows) == len(trust.TABLE) * len(Phase) * len(Actor) * len(Attack)
    assert not wrong, "\n".join(summary["mismatches"])  # type: ignore[arg-type]


def test_without_the_validating_policy_an_editors_step_never_uses_the_creators_rights(
    world_without_validation: World,
) -> None:
    """The step-references entry as the operator holds it alone: mallory (agentrun-edit, may
    not read Secrets) adds a step that prints a Secret the creator may read. The API admits it;
    the operator fails the step before any Job of it exists, and the Secret goes nowhere."""
    w = world_without_validation
    driver = Driver(w, Phase.PENDING, "plan", "alone", 0, [])
    driver.create()
    driver.reach()
    mallory = w.actors[Actor.AGENTRUN_EDIT]
    ATTACKS["step-references"](driver.t, mallory)
    driver.release("first")
    driver.release("gated")
    run = driver.wait("the added step refused", lambda r: step_status(r, "leak").get("phase")
                      in ("Failed", "Succeeded"))  # fmt: skip
    leak = step_status(run, "leak")
    assert leak["phase"] == "Failed" and leak["error"]["reason"] == "Forbidden", leak
    assert leak["error"]["message"].startswith(
        "step leak uses secrets/team-config with the rights of the run's creator and was added "
        "to the plan after the run started (spec last changed by mallory)"
    ), leak["error"]["message"]
    never = job_name(driver.t.name, driver.t.uid, "leak", 1)
    assert read_or_none(w.kube.batch.read_namespaced_job, never, w.namespace) is None
    assert not driver.violations(unaffected=False), driver.violations(unaffected=False)
