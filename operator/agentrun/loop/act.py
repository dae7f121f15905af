"""Act: carry out the core's actions, before the status commit (result and record ConfigMaps)
and after it (create, delete and release Jobs, delete the run, Events).

* :class:`Events`: events.k8s.io/v1 Events on a run, best effort within a pass;
* :class:`Actor`: every other action, and the Job deletions and releases cleanup and the
  janitor ask for. What it learns on the way (a Job created, a create the API refused) it
  tells the :class:`~agentrun.loop.observe.Observer`, which feeds it to the next pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import (
    Action,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    ReleaseJob,
    StartPod,
    StoreResult,
    executor,
    naming,
    shards,
    subagents,
)
from agentrun.core.actions import (
    CreateChild,
    PatchChild,
    PrepareExecutor,
    PrepareTurn,
    SendTurn,
    StoreRecord,
)
from agentrun.core.turns import KIND_CONTEXT
from agentrun.execution import inputs, jobs, objects, proof
from agentrun.kubeapi import api_message, finalizer_removal, tolerate
from agentrun.loop.common import Apis, Checkpoint, log, run_fields
from agentrun.loop.observe import Observer
from agentrun.loop.turn_requests import TurnSender
from agentrun.observation.view import controller_uid
from agentrun.observation.watches import Wake
from agentrun.telemetry import events

MAX_REFUSAL = 2048
"""How much of the API's words on a refused Job the step's failure keeps."""
JOB_REFUSALS = (400, 403, 404, 422)
"""Statuses of a Job create that fail the attempt (reason JobRefused) instead of being retried:
the request itself is refused (bad request, forbidden, namespace gone, invalid)."""


CLIENT_REFUSAL = "the Kubernetes client refused the Job before sending it"
"""How the failure of an attempt whose Job the client itself refused begins."""


def client_message(error: ValueError | TypeError) -> str:
    """What the client found wrong with a manifest: ``path: problem`` per error when it says
    where (its models' validation errors, e.g. ``spec.template.spec.securityContext.runAsUser:
    Input should be a valid integer (got 'root')``), else its own words."""
    errors = getattr(error, "errors", None)
    found: Any = None
    if callable(errors):
        try:
            found = errors(include_url=False)
        except TypeError:  # an errors() of another kind: its words will do
            found = None
    if not isinstance(found, list) or not found:
        return str(error) or type(error).__name__
    parts = []
    for e in found:
        path = _path(e.get("loc") or ())
        given = e.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {repr(given)[:64]})"
        parts.append(f"{path}: {e.get('msg')}{shown}" if path else f"{e.get('msg')}{shown}")
    return "; ".join(parts)


def _path(loc: Sequence[Any]) -> str:
    """``spec.containers[0].name`` from a validation error's location; the leading argument
    position the client's method validation puts first is left out."""
    parts = list(loc)
    if parts and isinstance(parts[0], int):
        parts = parts[1:]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class ResultNotStored(Exception):
    """A result's name is held by an object that is not that result (see _store_result)."""


class Events:
    """Posts Events on runs (see :mod:`agentrun.telemetry.events`)."""

    def __init__(self, apis: Apis, settings: s.Settings, clock: Callable[[], datetime]) -> None:
        self.apis = apis
        self.settings = settings
        self.clock = clock
        self.event_clock = events.EventClock()

    def post(self, namespace: str, name: str, uid: str, action: EmitEvent) -> None:
        """An events.k8s.io/v1 Event on the run."""
        at = self.event_clock.stamp(self.clock())
        body = events.event_body(
            namespace,
            name,
            uid,
            action,
            at,
            controller=s.FIELD_MANAGER,
            instance=self.settings.instance,
        )
        api = self.apis.events
        if api is None:
            from kubernetes import client as kube_client

            api = kube_client.EventsV1Api(self.apis.core.api_client)
        with tolerate(409):
            api.create_namespaced_event(namespace, body)

    def emit(self, run: m.AgentRun, action: EmitEvent) -> None:
        """Post ``action`` on ``run``; a refusal is logged, never fails the pass."""
        try:
            self.post(run.metadata.namespace, run.metadata.name, run.metadata.uid, action)
        except ApiException as error:
            log.warning(
                "could not post event %s: %s", action.reason, error.reason, extra=run_fields(run)
            )

    def report(self, run: m.AgentRun, reason: str, message: str) -> None:
        """A Warning about ``run``: logged, and posted as an Event."""
        log.warning(message, extra=run_fields(run))
        self.emit(run, EmitEvent("Warning", reason, message))


class Actor:
    """Carries out actions on a run. Safe to call concurrently for different runs."""

    def __init__(
        self,
        apis: Apis,
        observer: Observer,
        events: Events,
        checkpoint: Checkpoint,
        wake: Wake | None = None,
        shard_count: int = 0,
    ) -> None:
        """``shard_count``: ``AGENTRUN_SHARDS``; with shards, step Jobs carry their run's
        shard label (the replicas' watches select by it)."""
        self.apis = apis
        self.observer = observer
        self.adoption = observer.adoption
        self.events = events
        self.checkpoint = checkpoint
        self.wake = wake
        """Wakes a run's next pass (a create met a Job already holding the name)."""
        self.shard_count = shard_count
        self.turns = TurnSender(observer, checkpoint, wake)
        """Sends model turns' pods their requests."""

    def before_commit(self, run: m.AgentRun, actions: tuple[Action, ...]) -> bool:
        """What must stand before the status that names it is committed (result and record
        ConfigMaps). False when a result could not be stored as committed: the status that
        names it must not be written (the pass derives again, and the attempt fails)."""
        stores = [a for a in actions if isinstance(a, StoreResult | StoreRecord)]
        try:
            self.act(run, actions)
        except ResultNotStored:
            return False
        if stores:
            self.checkpoint("after-result-store")
        return True

    def act(self, run: m.AgentRun, actions: tuple[Action, ...]) -> None:
        """Carry out ``actions`` in order. A refused request stops them (the pass fails and is
        tried again), but for an Event's, which is only logged."""
        for action in actions:
            if isinstance(action, EmitEvent):  # events are best effort
                self.events.emit(run, action)
            else:
                self._apply(run, action)

    def _apply(self, run: m.AgentRun, action: Action) -> None:
        ns = run.metadata.namespace
        if isinstance(action, CreateJob):
            self._create_job(run, action)
        elif isinstance(action, PrepareTurn):
            self._prepare_turn(run, action)
        elif isinstance(action, PrepareExecutor):
            self._prepare_executor(run, action)
        elif isinstance(action, SendTurn):
            self.turns.send(run, action, self.observer.job_key.get())
        elif isinstance(action, CreateChild):
            self._create_child(run, action)
        elif isinstance(action, PatchChild):
            self._patch_child(run, action)
        elif isinstance(action, DeleteJob):
            self.checkpoint("before-job-release")
            uid = self.adoption.deletable(run, action.job_name)
            if uid is None:
                log.info("Job %s is not the operator's (or gone): not deleted", action.job_name,
                         extra=run_fields(run))  # fmt: skip
                return
            # Foreground: the garbage collector deletes its pods now, while the operator's
            # finalizer keeps the Job; in the background they would wait for the Job to go,
            # and run on for the whole deletion grace (or to their end).
            self.delete_job(ns, action.job_name, uid, release=action.release, foreground=True)
            log.info("deleted Job %s (%s)", action.job_name, action.reason, extra=run_fields(run))
        elif isinstance(action, StartPod):
            self._start_pod(run, action)
        elif isinstance(action, ReleaseJob):
            self.checkpoint("before-job-release")
            self._release_to_ttl(run, action)
        elif isinstance(action, StoreResult):
            if not self._store_result(run, action):
                raise ResultNotStored(action.name)
        elif isinstance(action, StoreRecord):
            self._store_record(run, action)
        elif isinstance(action, DeleteRun):
            log.info("deleting the run: %s", action.reason, extra=run_fields(run))
            with tolerate(404):
                self.apis.custom.delete_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, run.metadata.name
                )

    def _create_job(self, run: m.AgentRun, action: CreateJob) -> None:
        ctx = run_fields(run, action.step.name, action.attempt)
        bound = inputs.bind_inputs(run, action, self.observer.read_config_map)
        if isinstance(bound, str):  # never launched with what was not committed
            log.warning("Job %s not created: %s", action.job_name, bound, extra=ctx)
            self.observer.note_tampered(run.metadata.uid, action.job_name, bound)
            return
        action = bound
        try:
            manifest = self._signed_job(run, action)
            with tolerate(409, *JOB_REFUSALS) as exists:
                created = self.apis.batch.create_namespaced_job(
                    run.metadata.namespace, manifest, _preload_content=False
                )
        except (ValueError, TypeError) as error:
            # The client validates the body against its models before sending it (a string
            # runAsUser, an unknown key): as final as the API's refusal, and the pass would
            # otherwise fail the same way for ever, the step stuck in Launching.
            message = f"{CLIENT_REFUSAL}: {client_message(error)}"[:MAX_REFUSAL]
            log.warning("the Kubernetes client refused Job %s: %s", action.job_name, message,
                        extra=ctx)  # fmt: skip
            self.observer.note_refused(run.metadata.uid, action.job_name, message)
            return
        if exists.error is not None and exists.status != 409:
            # Refused (invalid, forbidden): the core fails the attempt on the next pass, with
            # the API's own words, or, for a refusal that may pass (a quota on Jobs), has the
            # create tried again for a while (agentrun.core.refusals.refusal_waits).
            message = api_message(exists.error)[:MAX_REFUSAL]
            log.warning("the API refused Job %s: %s", action.job_name, message, extra=ctx)
            self.observer.note_refused(run.metadata.uid, action.job_name, message)
            return
        if exists:
            # Someone made it first (an operator before a crash, another operator, or not an
            # operator at all): it counts only once verified, by the next pass.
            log.info("Job %s already exists; verifying it", action.job_name, extra=ctx)
            self.adoption.read(run.metadata.namespace, action.job_name)
            if self.wake is not None:
                self.wake(run.metadata.namespace, run.metadata.name, run.metadata.uid)
            return
        self.adoption.made(json.loads(created.data))
        self.observer.note_launched(run.metadata.uid, action.job_name)
        log.info("created Job %s", action.job_name, extra=ctx)
        self.checkpoint("after-job-create")

    def _signed_job(self, run: m.AgentRun, action: CreateJob) -> dict[str, Any]:
        """The Job of ``action``'s attempt, with the proof that the operator made it: a Job
        without one never counts (adoption)."""
        key = self.observer.job_key.get()
        manifest = jobs.step_job(run, action, key)
        count = self.shard_count
        if count:  # replicas sharing the runs watch only their shards' Jobs and pods by it
            label = shards.run_shard_label(run.metadata.namespace, run.metadata.name, count)
            jobs.with_shard_label(manifest, label)
        proof.sign(key, run.metadata.uid, action.step.name, action.attempt, manifest)
        return manifest

    def _prepare_turn(self, run: m.AgentRun, action: PrepareTurn) -> None:
        """Create the next model turn's Job before its turn (see PrepareTurn). One that exists
        already, or is refused, is left to the turn's intent to verify (its own create says)."""
        intent = CreateJob(action.step, 1, action.job_name, "", "")
        if self._create_once(run, intent):
            log.info("created Job %s ahead of its turn", action.job_name, extra=run_fields(run))
            self.checkpoint("after-turn-prepare")

    def _prepare_executor(self, run: m.AgentRun, action: PrepareExecutor) -> None:
        """Create the run's executor (see PrepareExecutor). One that exists already is found
        by the next pass (and used only once verified as the operator's)."""
        intent = executor.executor_create(action)
        if self._create_once(run, intent, warn="the run's executor"):
            log.info("created the run's executor %s", action.job_name, extra=run_fields(run))
            self.checkpoint("after-executor-create")

    def _create_once(self, run: m.AgentRun, intent: CreateJob, warn: str = "") -> bool:
        """Create ``intent``'s Job, signed, once per name in this process (no intent is
        committed for it: a Job made ahead of its turn, or a run's executor); whether this
        call created it. A refusal other than AlreadyExists is logged when ``warn`` names
        what the Job is."""
        if not self.turns.first_preparation(run.metadata.uid, intent.job_name):
            return False
        manifest = self._signed_job(run, intent)
        with tolerate(409, *JOB_REFUSALS) as refused:
            created = self.apis.batch.create_namespaced_job(
                run.metadata.namespace, manifest, _preload_content=False
            )
        if refused:
            if warn and refused.error is not None:
                log.warning("%s %s was not created: %s", warn, intent.job_name,
                            api_message(refused.error), extra=run_fields(run))  # fmt: skip
            return False
        self.adoption.made(json.loads(created.data))
        return True

    def _signed_child(self, run: m.AgentRun, action: CreateChild) -> dict[str, Any]:
        """The child's manifest with the operator's proof (agentrun.core.subagents.adopt
        takes a child found under the name only with it)."""
        manifest = json.loads(json.dumps(action.manifest))
        bound = subagents.proof_bound(manifest)
        if bound is None:  # pragma: no cover - the operator's manifests carry a call key
            raise ValueError(f"child AgentRun {manifest['metadata']['name']} has no call key")
        name = str(manifest["metadata"]["name"])
        signed = proof.object_proof(
            self.observer.job_key.get(), "child", run.metadata.uid, name, *bound
        )
        manifest["metadata"].setdefault("annotations", {})[s.ANNOTATION_PROOF] = signed
        count = self.shard_count
        if count:  # its own shard's replica watches it from its creation (no relabel)
            label = shards.run_shard_label(run.metadata.namespace, name, count)
            labels = manifest["metadata"]["labels"]
            manifest["metadata"]["labels"] = {**labels, s.LABEL_SHARD: label}
        return dict(manifest)

    def _create_child(self, run: m.AgentRun, action: CreateChild) -> None:
        """Create a sub-agent call's child AgentRun. One already holding its name is left
        alone: the next pass adopts it or fails the call (agentrun.core.subagents.adopt)."""
        ctx = run_fields(run, action.step)
        name = str(action.manifest["metadata"]["name"])
        with tolerate(409, *JOB_REFUSALS) as exists:
            self.apis.custom.create_namespaced_custom_object(
                m.GROUP,
                m.VERSION,
                run.metadata.namespace,
                m.PLURAL,
                self._signed_child(run, action),
            )
        if exists.error is not None and exists.status != 409:
            message = api_message(exists.error)[:MAX_REFUSAL]
            log.warning("the API refused AgentRun %s: %s", name, message, extra=ctx)
            self.observer.note_refused(run.metadata.uid, name, message)
            return
        log.info("%s child AgentRun %s", "found" if exists else "created", name, extra=ctx)
        if exists:
            if self.wake is not None:
                self.wake(run.metadata.namespace, run.metadata.name, run.metadata.uid)
            return
        self.checkpoint("after-child-create")

    def _patch_child(self, run: m.AgentRun, action: PatchChild) -> None:
        """Set a child's spec.cancel and spec.suspend, for the child of that uid only."""
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": action.uid},
            {"op": "add", "path": "/spec/cancel", "value": action.cancel},
            {"op": "add", "path": "/spec/suspend", "value": action.suspend},
        ]
        with tolerate(404, 409, 422):  # gone, or another run under that name: left alone
            self.apis.custom.patch_namespaced_custom_object(
                m.GROUP, m.VERSION, run.metadata.namespace, m.PLURAL, action.name, patch,
                _content_type="application/json-patch+json",
            )  # fmt: skip
        log.info("child AgentRun %s: cancel %s, suspend %s", action.name, action.cancel,
                 action.suspend, extra=run_fields(run))  # fmt: skip

    def _start_pod(self, run: m.AgentRun, action: StartPod) -> None:
        """Remove the operator's scheduling gate from the attempt's one pod: a JSON patch
        guarded by ``test`` ops (the same pod, by uid; the gate where it was seen), so a pod
        that is another, or changed since, is left as it is until the next pass."""
        ns = run.metadata.namespace
        found = self._pod_as_seen(ns, action)
        if found is None:
            return
        gates = (found.get("spec") or {}).get("schedulingGates") or []
        where = next((i for i, g in enumerate(gates) if g.get("name") == s.POD_GATE), None)
        if where is None or (found.get("metadata") or {}).get("uid") != action.pod.uid:
            return
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": action.pod.uid},
            {"op": "test", "path": f"/spec/schedulingGates/{where}/name", "value": s.POD_GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{where}"},
        ]
        with tolerate(404, 409, 422) as refused:
            patched = self.apis.core.patch_namespaced_pod(
                action.pod.name, ns, patch, _preload_content=False
            )
        if refused:
            return
        self.adoption.started(json.loads(patched.data))
        log.info("let pod %s of Job %s start", action.pod.name, action.job_name,
                 extra=run_fields(run))  # fmt: skip
        self.checkpoint("after-pod-start")

    def _pod_as_seen(self, namespace: str, action: StartPod) -> dict[str, Any] | None:
        """The pod as the view holds it (its gates are kept), else as read now."""
        view = self.observer.view
        job = view.job_named(namespace, action.job_name) if view is not None else None
        if view is not None and job is not None:
            job_uid = str((job.get("metadata") or {}).get("uid") or "")
            for pod in view.pods_of_job(job_uid):
                if (pod.get("metadata") or {}).get("uid") == action.pod.uid:
                    return pod
        with tolerate(404) as gone:
            read = self.apis.core.read_namespaced_pod(
                action.pod.name, namespace, _preload_content=False
            )
        if gone:
            return None
        answer: dict[str, Any] = json.loads(read.data)
        return answer

    def delete_job(
        self,
        namespace: str,
        name: str,
        uid: str | None = None,
        *,
        release: bool = True,
        foreground: bool = False,
    ) -> None:
        """Delete a step Job and (with ``release``) remove the operator's finalizer from it;
        with ``uid``, only if the Job of that name is still that one; with ``foreground``, its
        pods are deleted before it (not after, as in the background)."""
        policy = "Foreground" if foreground else "Background"
        body: dict[str, Any] = {"propagationPolicy": policy}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        with tolerate(404, 409) as gone:
            self.apis.batch.delete_namespaced_job(name, namespace, body=body)
        if gone or not release:
            return
        self.release_job(namespace, name)

    def release_job(self, namespace: str, name: str) -> None:
        """Remove the operator's finalizer from a Job (a JSON patch guarded by a test op)."""
        with tolerate(404) as gone:
            job = self.apis.batch.read_namespaced_job(name, namespace)
        if gone:
            return
        patch = finalizer_removal(job.metadata.finalizers or [], s.JOB_FINALIZER)
        if patch is None:
            return
        with tolerate(404, 409, 422):
            self.apis.batch.patch_namespaced_job(name, namespace, patch)

    def _release_to_ttl(self, run: m.AgentRun, action: ReleaseJob) -> None:
        """One JSON patch: the operator's finalizer off, ``ttlSecondsAfterFinished`` on,
        guarded by ``test`` ops against the Job as watched (its uid, its finalizers): a Job
        that is another, or changed since, fails the test (422) and nothing changes; its
        next change brings another pass."""
        ns = run.metadata.namespace
        view = self.observer.view
        seen = view.job_named(ns, action.job_name) if view is not None else None
        job = seen or self.observer.read_job(ns, action.job_name)
        meta = (job or {}).get("metadata") or {}
        removal = finalizer_removal(meta.get("finalizers") or [], s.JOB_FINALIZER)
        if removal is None or controller_uid(job or {}) != run.metadata.uid:
            return
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
            *removal,
            {"op": "add", "path": "/spec/ttlSecondsAfterFinished", "value": action.ttl_seconds},
        ]
        with tolerate(404, 409, 422) as refused:
            patched = self.apis.batch.patch_namespaced_job(
                action.job_name, ns, patch, _preload_content=False
            )
        if refused:
            return
        # Still the verified Job (the uid test held): its new generation needs no new check.
        self.adoption.created(json.loads(patched.data))
        log.info("released Job %s to the TTL controller (%ds after it finished)",
                 action.job_name, action.ttl_seconds, extra=run_fields(run))  # fmt: skip

    def _store_result(self, run: m.AgentRun, action: StoreResult) -> bool:
        """Store the result, signed; False when its name is held by an object whose proof
        does not verify (then the attempt fails, reason ResultTampered).

        The result object carries the operator's proof (an HMAC over the run's uid, its name,
        the attempt and the digest of its content): an object found under the name, after a
        crash between this create and the commit that names it, counts only with that proof.
        One made by someone else first, however exactly it copies what the operator would
        write, counts for nothing, even holding the same content."""
        ns = run.metadata.namespace
        uid = run.metadata.uid
        digest = naming.sha256_text(dict(action.data)["result"])
        bound = (action.step, str(action.attempt), digest)
        key = self.observer.job_key.get()
        signed = {s.ANNOTATION_PROOF: proof.object_proof(key, "result", uid, action.name, *bound)}
        body = objects.result_config_map(
            objects.RunRef.of(run),
            action.name,
            action.step,
            action.attempt,
            action.data,
            annotations=signed,
        )
        with tolerate(409) as exists:
            self.apis.core.create_namespaced_config_map(ns, body)
        if not exists:
            return True
        # Written by an earlier pass from the same Job (its proof verifies), or created
        # first by someone else (it does not).
        found = self.observer.read_config_map(ns, action.name)
        problem = (
            f"ConfigMap {action.name} is gone"
            if found is None
            else objects.result_problem(uid, found, digest, stored=True)
            or proof.object_proof_problem(key, found, "result", uid, *bound)
        )
        if problem is None:
            return True
        st = next((x for x in (run.status.steps if run.status else None) or []
                   if x.name == action.step), None)  # fmt: skip
        message = (
            f"the result of attempt {action.attempt} could not be stored: ConfigMap "
            f"{action.name} already existed and is not the operator's ({problem}); the result "
            "is not used"
        )
        log.warning(message, extra=run_fields(run, action.step, action.attempt))
        self.observer.note_tampered(run.metadata.uid, (st.job_name if st else None) or "", message)
        return False

    def _store_record(self, run: m.AgentRun, action: StoreRecord) -> None:
        """A ConfigMap of an agent run's memory: a turn's transcript record or context."""
        labels = {s.LABEL_KIND: action.kind, s.LABEL_TURN: str(action.turn)}
        body = objects.owned_config_map(objects.RunRef.of(run), action.name, labels, action.data)
        with tolerate(409) as taken:  # written by an earlier pass: its name stands for its content
            created = self.apis.core.create_namespaced_config_map(
                run.metadata.namespace, body, _preload_content=False
            )
            created.drain_conn()  # its answer (the record again, up to 64 KiB) is not decoded
        if action.kind == KIND_CONTEXT and not taken:  # read back by the next passes
            self.observer.written.remember(
                run.metadata.namespace, action.name, dict(action.data), action.stored
            )
