"""Observe: what a pass knows of a run besides the run itself, assembled into the core's
:class:`~agentrun.core.Observed` (the latest body of each run, as watched or as this process
wrote it, is kept by :class:`~agentrun.loop.run_bodies.RunBodies`).

* :class:`Observer`: the run's Jobs from the watch view (only those adoption verifies as the
  operator's), the Jobs of attempts in flight that vanished, the records an agent run's loop
  asks for, what the creator may not launch and the Jobs the API refused, carried results'
  sources and the conversation a run resumes.

The Observer keeps what this process learnt beyond the cluster's view and feeds it to the
core: the Jobs it launched (:meth:`Observer.note_launched`), the creates the API refused
(:meth:`Observer.note_refused`) and how far each run's audit record is known to reach
(:meth:`Observer.note_recorded`). Those caches share the one lock of the passes' caches.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agentrun import settings as s
from agentrun.access import audit, authz
from agentrun.api import models as m
from agentrun.core import (
    CarriedSource,
    JobState,
    Observed,
    ObservedJob,
    StrayJob,
    agent_loop,
    executor,
    naming,
    subagents,
    turns,
)
from agentrun.core import agent_refs as agent_refs_core
from agentrun.core.context import Stored
from agentrun.execution import inputs, jobs, objects, proof
from agentrun.kubeapi import list_items, tolerate
from agentrun.loop.common import Apis, log, run_fields
from agentrun.loop.decide import core_config
from agentrun.loop.ledger import Ledger
from agentrun.loop.signing import JobKey
from agentrun.loop.written import Written
from agentrun.observation import agent_refs
from agentrun.observation import conversation as resume
from agentrun.observation.adoption import Adoption
from agentrun.observation.view import ClusterView

V = TypeVar("V")

Report = Callable[[m.AgentRun, str, str], None]
"""``report(run, reason, message)``: a Warning about the run, logged and posted as an Event."""


class Observer:
    """Assembles what a pass observes of a run. Safe to call concurrently for different runs."""

    def __init__(
        self,
        apis: Apis,
        settings: s.Settings,
        ledger: Ledger,
        view: ClusterView | None,
        report: Report,
        guard: threading.Lock,
    ) -> None:
        self.apis = apis
        self.settings = settings
        self.agent_config = core_config(settings).agent
        """What the core builds the run's executor with: a Job of the executor's name this
        process did not make counts as the operator's only if it is what that builds."""
        self.ledger = ledger
        self.view = view
        """The watched step Jobs, pods and pod refusals (agentrun.observation.view); a pass
        waits until it is synced. Only deletion cleanup works without one."""
        self.job_key = JobKey(apis, settings.operator_namespace)
        """The key that signs the step Jobs this operator creates and verifies those it finds."""
        self.adoption = Adoption(
            view or ClusterView(),
            self._dry_run_job,
            self.read_job,
            self._list_pods,
            report,
            self.job_key.get,
            bind=lambda run, intent: inputs.bind_inputs(run, intent, self.read_config_map),
        )
        self._guard = guard
        self._authorizer: authz.Authorizer | None = None
        self._job_refusals: dict[str, dict[str, str]] = {}
        """Run uid -> Job name -> the API's message refusing its create (fed to the core)."""
        self._tampered: dict[str, dict[str, str]] = {}
        """Run uid -> Job name -> why a result by reference of that attempt (its own, or an
        input) is not what was committed (fed to the core: Observed.tampered)."""
        self._answers: dict[str, dict[str, tuple[int, str]]] = {}
        """Run uid -> attempt name -> the outcome (exit code, termination message) the run's
        executor answered for that attempt (agentrun.core.executor.attempts_on)."""
        self._launched: dict[str, set[str]] = {}
        """Run uid -> Jobs of attempts still Launching that this process created or saw: one
        gone without a trace is lost, not to be created again (Observed.vanished)."""
        self._operator_user: str | None = None
        self._acting: dict[str, subagents.ActingFor | str] = {}
        """Run uid -> whose rights its steps use (a sub-agent's, found through its parents)."""
        self._recorded: dict[str, int] = {}
        """Run uid -> the last transition this process found or stored in the run's audit
        record, until a commit carries it into status.audit.recordedSeq."""
        self.written = Written()
        """The context ConfigMaps this process created (agentrun.loop.written): read from
        here, not from the API server, while kept."""

    def observe(self, run: m.AgentRun) -> Observed:
        """Everything the core is given besides the run and the time."""
        observed = self._observe(run)
        observed = self._with_documents(run, observed)
        observed = self._with_verdicts(run, observed)
        observed = self._with_tampered(run, observed)
        observed = self._with_carried_sources(run, observed)
        observed = self._with_children(run, observed)
        observed = self._with_definition(run, observed)
        return self._with_resume_source(run, observed)

    # -- what the other parts of a pass tell it --------------------------------------------

    def note_launched(self, run_uid: str, job_name: str) -> None:
        """This process created ``job_name`` for an attempt of the run."""
        with self._guard:
            self._launched.setdefault(run_uid, set()).add(job_name)

    def note_refused(self, run_uid: str, job_name: str, message: str) -> None:
        """The API refused to create ``job_name``, saying ``message`` (for good, or for now:
        the core tells, :func:`agentrun.core.refusals.refusal_may_pass`)."""
        with self._guard:
            self._job_refusals.setdefault(run_uid, {})[job_name] = message

    def note_tampered(self, run_uid: str, job_name: str, message: str) -> None:
        """A result by reference of the attempt of ``job_name`` (its own, or an input) is not
        the content committed for it: the next pass fails the attempt, saying ``message``."""
        with self._guard:
            self._tampered.setdefault(run_uid, {})[job_name] = message

    def note_answer(self, run_uid: str, attempt: str, code: int, message: str) -> None:
        """The run's executor answered attempt ``attempt`` (a model turn's): the next pass
        settles it from this outcome, as from a pod's."""
        with self._guard:
            self._answers.setdefault(run_uid, {})[attempt] = (code, message)

    def _answers_of(self, run: m.AgentRun) -> dict[str, tuple[int, str]]:
        """The executor's answers for the run's attempts still in flight (others dropped)."""
        in_flight = {
            st.job_name
            for st in (run.status.steps if run.status else None) or []
            if st.job_name and st.executor_pod is not None and st.phase in m.ACTIVE_STEP_PHASES
        }
        return self._kept(self._answers, run.metadata.uid, in_flight)

    def _kept(self, notes: dict[str, dict[str, V]], run_uid: str, names: set[str]) -> dict[str, V]:
        """The run's entries of ``notes`` for ``names`` (attempts still in flight); the
        others are dropped."""
        with self._guard:
            known = notes.get(run_uid, {})
            kept = {k: v for k, v in known.items() if k in names}
            if kept:
                notes[run_uid] = dict(kept)
            else:
                notes.pop(run_uid, None)
        return kept

    def refusals_of(self, run_uid: str) -> dict[str, str]:
        """Jobs of the run whose create the API refused, or whose inputs were not passed on
        (still current), with why."""
        with self._guard:
            return {**self._job_refusals.get(run_uid, {}), **self._tampered.get(run_uid, {})}

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """ConfigMap ``name`` as stored now (the API's JSON), None when there is none."""
        with tolerate(404) as gone:
            response = self.apis.core.read_namespaced_config_map(
                name, namespace, _preload_content=False
            )
        if gone:
            return None
        found: dict[str, Any] = json.loads(response.data)
        return found

    def written_data(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The data of ConfigMap ``name``: as this process created it, while it keeps that
        (:class:`agentrun.loop.written.Written`), else as stored now; None when there is none."""
        kept = self.written.get(namespace, name)
        if kept is not None:
            return kept
        found = self.read_config_map(namespace, name)
        return None if found is None else (found.get("data") or {})

    def recorded(self, run_uid: str) -> int | None:
        """The last transition this process knows its audit record to hold."""
        with self._guard:
            return self._recorded.get(run_uid)

    def note_recorded(self, run_uid: str, seq: int) -> None:
        """The run's audit record is known to hold the transitions up to ``seq``."""
        with self._guard:
            self._recorded[run_uid] = seq

    def drop_recorded(self, run_uid: str) -> None:
        """Status says how far the record reaches: nothing to remember."""
        with self._guard:
            self._recorded.pop(run_uid, None)

    # -- observing ------------------------------------------------------------------------

    def _observe(self, run: m.AgentRun) -> Observed:
        """The run's Jobs, the Jobs of attempts still Launching that vanished, and how far
        its audit record is known to reach (from memory: the record itself is read only when
        transitions are appended to it)."""
        found = self._observe_jobs(run)
        uid = run.metadata.uid
        wanted = turns.executor_wanted(run)
        holder = (
            self.adoption.observe_executor(
                run, wanted, lambda: executor.creation(run, self.agent_config)
            )
            if wanted is not None
            else None
        )
        bound = executor.attempts_on(run, holder.job if holder else None, self._answers_of(run))
        found = (*found, *bound)
        launching = launching_jobs(run)
        present = {j.name for j in found}
        with self._guard:
            known = self._launched.get(uid, set()) & launching
            vanished = frozenset(known - present)
            known |= present & launching
            if known:
                self._launched[uid] = known
            else:
                self._launched.pop(uid, None)
            recorded = self._recorded.get(uid)
        if vanished:
            log.warning("Job(s) %s of attempts in flight vanished", ", ".join(sorted(vanished)),
                        extra=run_fields(run))  # fmt: skip
        ahead = tuple(
            found_ahead
            for name in turns.ahead_names(run)
            if (found_ahead := self.adoption.observe_ahead(run, name)) is not None
        )
        strays = self._strays(run, found, wanted)
        running = self._running(uid, {j.name for j in found} | {j.name for j in strays})
        observed = Observed(found, ahead, strays=strays, running=running, vanished=vanished,
                            executor=holder)  # fmt: skip
        if recorded is None:
            return observed
        prefix = audit.record_prefix(run.metadata.name, uid)
        return dataclasses.replace(observed, recorded_seq=recorded, record_name=prefix)

    def _running(self, run_uid: str, names: set[str]) -> frozenset[str]:
        """Those of the run's Jobs ``names`` with a pod of their own (running the Job's
        template) that has not terminated yet."""
        view = self.view
        assert view is not None  # _observe_jobs, before, made sure
        running = set()
        for job in view.jobs_of_run(run_uid):
            meta = job.get("metadata") or {}
            if meta.get("name") not in names:
                continue
            if any(_running_pod(job, p) for p in view.pods_of_job(str(meta.get("uid")))):
                running.add(str(meta.get("name")))
        return frozenset(running)

    def _strays(
        self, run: m.AgentRun, found: tuple[ObservedJob, ...], executor: str | None = None
    ) -> tuple[StrayJob, ...]:
        """The run's Jobs adoption could not tell (no committed intent describes them: their
        step was removed or changed, or a later attempt superseded theirs, or a model turn's
        made ahead that the run no longer needs), not someone else's, and still held by the
        operator's finalizer: nothing else would let them go, and one still running would
        run on. Their outcome is never read. A later turn's Job made before its turn, still
        waiting while the run may need it, is not one (:func:`agentrun.core.turns.made_ahead`);
        one that ended or is being deleted before its turn is: the turn waits until it is
        gone, then makes its Job again. Neither is the run's ``executor`` while the run may
        still send it turns (:func:`agentrun.core.turns.executor_wanted`); an earlier one is."""
        uid = run.metadata.uid
        steps = (run.status.steps if run.status else None) or []
        skip = {j.name for j in found} | {
            st.job_name for st in steps if st.job_name and st.phase in m.ACTIVE_STEP_PHASES
        }
        if executor is not None:
            skip.add(executor)
        view = self.view
        assert view is not None  # _observe_jobs, before, made sure
        strays = []
        for job in view.jobs_of_run(uid):
            if (job.get("metadata") or {}).get("name", "") in skip:
                continue  # accounted for: not parsed again on every pass
            if not jobs.is_held(job):
                continue  # released: told before it is parsed
            seen = jobs.observe_job(job, None)
            if seen is None or not seen.held:
                continue
            waiting = seen.state == JobState.ACTIVE and not seen.deleting
            if waiting and turns.made_ahead(run, seen.name, seen.step):
                continue  # a later turn's, made ahead and still waiting for it
            if self.adoption.is_rejected(job, uid):
                continue  # someone else's: left alone
            strays.append(
                StrayJob(
                    name=seen.name,
                    step=seen.step,
                    attempt=seen.attempt,
                    state=seen.state,
                    deleting=seen.deleting,
                    deleted_at=seen.deleted_at,
                )
            )
        return tuple(strays)

    def _with_tampered(self, run: m.AgentRun, observed: Observed) -> Observed:
        """``observed`` plus the attempts in flight whose result, or input, by reference was
        found not to be what was committed (dropped once the attempt is no longer in flight)."""
        steps = (run.status.steps if run.status else None) or []
        in_flight = {
            st.job_name
            for st in steps
            if st.job_name and st.phase in (m.StepPhase.LAUNCHING, m.StepPhase.RUNNING)
        }
        tampered = self._kept(self._tampered, run.metadata.uid, in_flight)
        return dataclasses.replace(observed, tampered=tampered) if tampered else observed

    def _with_carried_sources(self, run: m.AgentRun, observed: Observed) -> Observed:
        """What each carried result's ``fromRun`` really committed for its step, read from that
        run in the same namespace: the core accepts a carried result only against it. Read
        only while a carried step has no status yet (carried results are decided once)."""
        known = {st.name for st in (run.status.steps if run.status else None) or []}
        pending = [c for c in run.spec.carried_results or [] if c.from_run and c.step not in known]
        if not pending:
            return observed
        runs: dict[str, m.AgentRun | None] = {}
        sources: dict[str, CarriedSource] = {}
        for carried in pending:
            origin = carried.from_run or ""  # "namespace/name", written by kubectl agentrun fork
            namespace, _, name = origin.partition("/")
            if namespace != run.metadata.namespace or not name:
                continue  # the core refuses it, saying why
            if name not in runs:
                runs[name] = self._read_source_run(namespace, name)
            source = runs[name]
            steps = (source.status.steps if source and source.status else None) or []
            for st in steps:
                if st.name == carried.step:
                    found = CarriedSource.from_step_status(origin, st)
                    if found is not None:
                        sources[carried.step] = found
        return dataclasses.replace(observed, carried_sources=sources)

    def _with_definition(self, run: m.AgentRun, observed: Observed) -> Observed:
        """The Agent spec.agentRef names and its ModelConfig, read with the creator's rights
        checked (agentrun.observation.agent_refs), until the run has taken them."""
        found = agent_refs.read_definition(run, self.apis.custom, self.authorizer)
        return observed if found is None else dataclasses.replace(observed, definition=found)

    def _with_resume_source(self, run: m.AgentRun, observed: Observed) -> Observed:
        """The conversation spec.agent.resumeFrom names, read from that run and verified
        (agentrun.observation.conversation), until the run's first turn has taken it."""
        source = resume.read_source(run, self.apis.core, self._read_source_run, self.authorizer)
        return observed if source is None else dataclasses.replace(observed, resume=source)

    def _read_source_run(self, namespace: str, name: str) -> m.AgentRun | None:
        body = self.ledger.read(namespace, name)
        if body is None:
            return None
        try:
            return agent_refs_core.effective(m.AgentRun.model_validate(body))
        except ValueError:  # not a run this operator can read: nothing to carry from it
            return None

    def _observe_jobs(self, run: m.AgentRun) -> tuple[ObservedJob, ...]:
        """The run's Jobs from the view (agentrun.observation.adoption: only those the operator
        made)."""
        if self.view is None:
            raise RuntimeError("a reconcile pass needs the view of the cluster")
        while not self.view.wait_synced(timeout=30):
            log.warning("waiting for the watches of Jobs and pods to list", extra=run_fields(run))
        return self.adoption.observe(run)

    def _dry_run_job(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        response = self.apis.batch.create_namespaced_job(
            namespace, manifest, dry_run="All", _preload_content=False
        )
        job: dict[str, Any] = json.loads(response.data)
        return job

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Job ``name`` as the API server holds it now, None when it is gone."""
        with tolerate(404) as gone:
            response = self.apis.batch.read_namespaced_job(name, namespace, _preload_content=False)
        if gone:
            return None
        job: dict[str, Any] = json.loads(response.data)
        return job

    def _list_pods(self, namespace: str, run_uid: str) -> list[dict[str, Any]]:
        return list_items(
            self.apis.core.list_namespaced_pod(
                namespace, label_selector=objects.owned_by(run_uid), _preload_content=False
            )
        )

    # -- verdicts fed to the core ------------------------------------------------------------

    @property
    def authorizer(self) -> authz.Authorizer:
        """SubjectAccessReviews on behalf of runs' creators (see :mod:`agentrun.access.authz`)."""
        if self._authorizer is None:
            api = self.apis.authorization
            if api is None:
                from kubernetes import client as kube_client

                api = kube_client.AuthorizationV1Api(self.apis.core.api_client)
            self._authorizer = authz.Authorizer(
                api, ttl=self.settings.rights_ttl_seconds, creator=self.acting_creator
            )
        return self._authorizer

    # -- sub-agents ---------------------------------------------------------------------------

    def operator_user(self) -> str:
        """The user the API server knows this operator as (a SelfSubjectReview, asked once):
        the creator the admission records on the children it makes."""
        with self._guard:
            if self._operator_user is not None:
                return self._operator_user
        from kubernetes import client as kube_client

        api: Any = kube_client.AuthenticationV1Api(self.apis.core.api_client)
        review = api.create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            _preload_content=False,
        )
        user = (json.loads(review.data).get("status") or {}).get("userInfo", {}).get("username")
        if not isinstance(user, str) or not user:
            raise RuntimeError("the API server did not say who the operator is")
        with self._guard:
            self._operator_user = user
        return user

    def acting_for(self, run: m.AgentRun) -> subagents.ActingFor | str:
        """Whose rights the run's steps use and the run's depth: its recorded creator (depth
        0); for a run the operator created, the creator of the run it is the verified
        sub-agent of (agentrun.core.subagents.acting_creator), or why there is none."""
        creator = authz.creator_of(run)
        if isinstance(creator, str):
            return creator
        groups = (run.metadata.annotations or {}).get(m.ANNOTATION_CREATED_BY_GROUPS)
        if not _has_controller_run(run) or creator.user != self.operator_user():
            return subagents.ActingFor(creator.user, groups, (run.metadata.name,))
        with self._guard:
            known = self._acting.get(run.metadata.uid)
        if known is not None:
            return known
        limits = subagents.Limits()
        body = self.ledger.read(run.metadata.namespace, run.metadata.name)
        chain: list[dict[str, Any]] = [body] if body is not None else []
        while chain and len(chain) <= limits.max_depth:
            parent = subagents.controller_of(chain[-1])
            if parent is None:
                break
            found = self.ledger.read(run.metadata.namespace, parent[0])
            if found is None or (found.get("metadata") or {}).get("uid") != parent[1]:
                break
            chain.append(found)
        verdict = subagents.acting_creator(chain, creator.user, limits, self.child_proven)
        result: subagents.ActingFor | str = (
            verdict.message if isinstance(verdict, subagents.Refused) else verdict
        )
        with self._guard:
            self._acting[run.metadata.uid] = result
        return result

    def acting_creator(self, run: m.AgentRun) -> authz.Creator | str:
        found = self.acting_for(run)
        if isinstance(found, str):
            return found
        return authz.creator_from(found.user, found.groups)

    def _with_children(self, run: m.AgentRun, observed: Observed) -> Observed:
        """The AgentRuns labelled as the run's children, while a sub-agent call of its
        current turn is in flight, with each one's answer (read by reference when it is not
        inline, and checked against its digest); and the run's depth."""
        ag = run.status.agent if run.status else None
        calls = [c for c in (ag.calls if ag is not None else None) or [] if c.child]
        depth = 0
        if run.spec.agent is not None and any(t.agent for t in run.spec.agent.tools or []):
            acting = self.acting_for(run)
            depth = acting.depth if isinstance(acting, subagents.ActingFor) else 0
        if not calls:
            return dataclasses.replace(observed, depth=depth) if depth else observed
        selector = f"{subagents.LABEL_PARENT_UID}={run.metadata.uid}"
        listed = list_items(
            self.apis.custom.list_namespaced_custom_object(
                m.GROUP,
                m.VERSION,
                run.metadata.namespace,
                m.PLURAL,
                label_selector=selector,
                _preload_content=False,
            )
        )
        children = [self._with_answer(run.metadata.namespace, body) for body in listed]
        return dataclasses.replace(observed, children=tuple(children), depth=depth)

    def child_proven(self, body: Mapping[str, Any], parent_uid: str) -> bool:
        """Whether ``body`` (an AgentRun as read) is a child the operator created for a call
        of the run ``parent_uid``: its proof verifies under the operator's key, over the
        parent's uid, its name, its call key and its spec (:func:`subagents.proof_bound`),
        and the creator the admission recorded, if any, is the operator."""
        bound = subagents.proof_bound(body)
        meta = body.get("metadata") or {}
        recorded = (meta.get("annotations") or {}).get(m.ANNOTATION_CREATED_BY)
        if bound is None or (recorded is not None and recorded != self.operator_user()):
            return False
        problem = proof.object_proof_problem(self.job_key.get(), body, "child", parent_uid, *bound)
        return problem is None

    def _with_answer(self, namespace: str, body: dict[str, Any]) -> subagents.ObservedChild:
        child = subagents.observed_run(body)
        if child.controller_uid is not None:
            child = dataclasses.replace(child, proven=self.child_proven(body, child.controller_uid))
        agent = (body.get("status") or {}).get("agent") or {}
        ref = agent.get("answerRef")
        if child.answer is not None or not isinstance(ref, dict):
            return child
        stored = self.read_config_map(namespace, str(ref.get("name", "")))
        text = ((stored or {}).get("data") or {}).get(str(ref.get("key", "")))
        if isinstance(text, str) and naming.sha256_text(text) == agent.get("answerDigest"):
            return dataclasses.replace(child, answer=text)
        return child

    def _with_verdicts(self, run: m.AgentRun, observed: Observed) -> Observed:
        """``observed`` plus the steps the creator may not have launched, the Jobs the API
        refused (still current: an attempt's refusal is dropped once it is no longer
        Launching), and for an agent run the permissions its creator was found to have."""
        refusals = self.authorizer.refusals(run)
        if self.settings.executor:  # what its executor's pod would hold, made without a step
            self.authorizer.refresh(run, agent_loop.executor_checks(run))
        launching = launching_jobs(run)
        with self._guard:
            known = self._job_refusals.get(run.metadata.uid, {})
            job_refusals = {k: v for k, v in known.items() if k in launching}
            if job_refusals:
                self._job_refusals[run.metadata.uid] = dict(job_refusals)
            else:
                self._job_refusals.pop(run.metadata.uid, None)
        granted = self.authorizer.granted(run) if agent_loop.is_agent_run(run) else frozenset()
        if not refusals and not job_refusals and not granted:
            return observed
        return dataclasses.replace(
            observed, refusals=refusals, job_refusals=job_refusals, granted=granted
        )

    def _with_documents(self, run: m.AgentRun, observed: Observed) -> Observed:
        """The records an agent run's loop asks for (agentrun.core.agent_loop.wanted_documents),
        read from the run's ConfigMaps; one read per ConfigMap, none for other runs. Their
        content is checked by the core against committed digests."""
        wanted = agent_loop.wanted_documents(run)
        if not wanted:
            return observed
        maps: dict[str, dict[str, Any]] = {}
        documents: dict[tuple[str, str], str] = {}
        contexts: dict[str, Stored] = {}
        for name, key in wanted:
            if name not in maps:
                maps[name] = self.written_data(run.metadata.namespace, name) or {}
                stored = self.written.document(run.metadata.namespace, name)
                if stored is not None:
                    contexts[name] = stored
            value = maps[name].get(key)
            if isinstance(value, str):
                documents[(name, key)] = value
        return dataclasses.replace(observed, documents=documents, contexts=contexts)


def _has_controller_run(run: m.AgentRun) -> bool:
    """Whether an AgentRun controls ``run`` (only then may it be a sub-agent's run)."""
    return any(o.controller and o.kind == m.KIND for o in run.metadata.owner_references or [])


def _running_pod(job: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether ``pod`` runs ``job``'s template and has not terminated (a pod someone else
    made never holds a step back)."""
    return not jobs.pod_ended(pod) and jobs.pod_problem(job, pod) is None


def launching_jobs(run: m.AgentRun) -> set[str]:
    """Job names of the run's attempts committed as Launching."""
    steps = (run.status.steps if run.status else None) or []
    return {st.job_name for st in steps if st.phase == m.StepPhase.LAUNCHING and st.job_name}
