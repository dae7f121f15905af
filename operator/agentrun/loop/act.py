"""Act: carry out the core's actions, before the status commit (result and record ConfigMaps)
and after it (create, delete and release Jobs, delete the run, Events).

* :class:`Events`: events.k8s.io/v1 Events on a run, best effort within a pass;
* :class:`Actor`: every other action, and the Job deletions and releases cleanup and the
  janitor ask for. What it learns on the way (a Job created, a create the API refused) it
  tells the :class:`~agentrun.loop.observe.Observer`, which feeds it to the next pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
    StoreResult,
)
from agentrun.core.actions import StoreRecord
from agentrun.execution import jobs, objects, proof
from agentrun.kubeapi import api_message, finalizer_removal, tolerate
from agentrun.loop.common import Apis, Checkpoint, log, run_fields
from agentrun.loop.observe import Observer
from agentrun.observation.watches import Wake, controller_uid
from agentrun.telemetry import events

MAX_REFUSAL = 2048
"""How much of the API's words on a refused Job the step's failure keeps."""
JOB_REFUSALS = (400, 403, 404, 422)
"""Statuses of a Job create that fail the attempt (reason JobRefused) instead of being retried:
the request itself is refused (bad request, forbidden, namespace gone, invalid)."""


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
    ) -> None:
        self.apis = apis
        self.observer = observer
        self.adoption = observer.adoption
        self.events = events
        self.checkpoint = checkpoint
        self.wake = wake
        """Wakes a run's next pass (a create met a Job already holding the name)."""

    def before_commit(self, run: m.AgentRun, actions: tuple[Action, ...]) -> None:
        """What must stand before the status that names it is committed (result and record
        ConfigMaps)."""
        stores = [a for a in actions if isinstance(a, StoreResult | StoreRecord)]
        self.act(run, actions)
        if stores:
            self.checkpoint("after-result-store")

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
        elif isinstance(action, DeleteJob):
            self.checkpoint("before-job-release")
            uid = self.adoption.deletable(run, action.job_name)
            if uid is None:
                log.info("Job %s is not the operator's (or gone): not deleted", action.job_name,
                         extra=run_fields(run))  # fmt: skip
                return
            self.delete_job(ns, action.job_name, uid, release=action.release)
            log.info("deleted Job %s (%s)", action.job_name, action.reason, extra=run_fields(run))
        elif isinstance(action, ReleaseJob):
            self.checkpoint("before-job-release")
            self._release_to_ttl(run, action)
        elif isinstance(action, StoreResult):
            self._store_result(run, action)
        elif isinstance(action, StoreRecord):
            self._store_record(run, action)
        elif isinstance(action, DeleteRun):
            log.info("deleting the run: %s", action.reason, extra=run_fields(run))
            with tolerate(404):
                self.apis.custom.delete_namespaced_custom_object(
                    m.GROUP, m.VERSION, ns, m.PLURAL, run.metadata.name
                )

    def _create_job(self, run: m.AgentRun, action: CreateJob) -> None:
        manifest = jobs.build_job(run, action)
        # The proof that the operator made it: a Job without one never counts (adoption).
        key = self.observer.job_key.get()
        proof.sign(key, run.metadata.uid, action.step.name, action.attempt, manifest)
        ctx = run_fields(run, action.step.name, action.attempt)
        with tolerate(409, *JOB_REFUSALS) as exists:
            created = self.apis.batch.create_namespaced_job(
                run.metadata.namespace, manifest, _preload_content=False
            )
        if exists.error is not None and exists.status != 409:
            # Refused for good (invalid, forbidden): the same create would be refused again.
            # The core fails the attempt on the next pass, with the API's own words.
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
        self.adoption.created(json.loads(created.data))
        self.observer.note_launched(run.metadata.uid, action.job_name)
        log.info("created Job %s", action.job_name, extra=ctx)
        self.checkpoint("after-job-create")

    def delete_job(
        self, namespace: str, name: str, uid: str | None = None, *, release: bool = True
    ) -> None:
        """Delete a step Job and (with ``release``) remove the operator's finalizer from it;
        with ``uid``, only if the Job of that name is still that one."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
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

    def _store_result(self, run: m.AgentRun, action: StoreResult) -> None:
        body = objects.result_config_map(
            objects.RunRef.of(run), action.name, action.step, action.attempt, action.data
        )
        with tolerate(409):  # written by an earlier pass from the same Job: same content
            self.apis.core.create_namespaced_config_map(run.metadata.namespace, body)

    def _store_record(self, run: m.AgentRun, action: StoreRecord) -> None:
        """A ConfigMap of an agent run's memory: a turn's transcript record or context."""
        labels = {s.LABEL_KIND: action.kind, s.LABEL_TURN: str(action.turn)}
        body = objects.owned_config_map(objects.RunRef.of(run), action.name, labels, action.data)
        with tolerate(409):  # written by an earlier pass: its name stands for its content
            self.apis.core.create_namespaced_config_map(run.metadata.namespace, body)
