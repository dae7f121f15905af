"""Which Jobs count as a step attempt's: never adopt what the operator did not create.

A step Job's name is a function of (run uid, step, attempt), so anyone who may create Jobs in
the namespace can compute the next attempt's name and build the operator's exact manifest
(:func:`agentrun.execution.jobs.step_job`) under it first, even before the step's approval.
Names, labels, owner references and specs can be copied; the operator's key cannot. A Job
found under an attempt's name counts as the attempt's only if

(i)  the operator created it: its uid is one this process's create returned (the fast path),
     or its ``agentrun.dev/proof`` annotation verifies (:mod:`agentrun.execution.proof`: an
     HMAC over the run uid, step, attempt, Job name and the digest of the spec the operator
     creates for the committed intent, with a key only the operator holds), and
(ii) its spec is the one the operator creates for the committed intent.

Labels decide nothing: a namespace user may change them at any time. A Job whose uid this
process created stays the attempt's whatever its labels or owner references become, and is
read directly when the watch (which finds Jobs by label) loses it, so no second attempt starts
while the first one's Job exists. Any other Job (met as AlreadyExists, created by another
operator, or found after a restart) must carry a proof that verifies, and is then checked once
per uid and generation by a server-side dry-run create (``dryRun=All``) of the operator's own
manifest for the committed intent, under ``generateName``: the API server defaults that spec
exactly as it defaulted the Job found, so the two must be equal except for what the server
derives from the name and uid (``spec.selector`` and the pod template's ``controller-uid`` and
``job-name`` labels, current and legacy). The verdict is cached per uid. A Job without a valid
proof is refused before any dry run.

A Job that fails a check never stands for the attempt: the core fails the attempt with
reason ``JobNameTaken`` and the check that failed; a Warning Event on the run names the Job;
and the Job is left alone, for it is its creator's: it never gets the outcome finalizer (the
operator puts that only on Jobs it creates), it is never deleted, its pods are never read.
Pods count only when their controller owner reference is the verified Job; a pod that only
carries the Job's name in a label is someone else's.

Jobs that claim the run as their controller but hold no name of the run's status (Jobs of
earlier attempts, found after a restart) cannot be checked (no committed intent to compare
with) and are not observed at all: they go with the run, by its owner reference.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import AheadJob, CreateJob, JobState, ObservedJob, turns
from agentrun.core.machine import committed_launch
from agentrun.execution import jobs, proof
from agentrun.observation.job_checks import (  # re-exported: the checks it runs
    DERIVED_LABELS,
    comparable_spec,
    dry_run_manifest,
    first_difference,
    name_taken_message,
    ownership_problem,
    spec_problem,
)
from agentrun.observation.view import ClusterView, controller_ref, controller_uid

__all__ = [
    "DERIVED_LABELS",
    "Adoption",
    "Verdict",
    "comparable_spec",
    "dry_run_manifest",
    "first_difference",
    "name_taken_message",
    "ownership_problem",
    "spec_problem",
]

log = logging.getLogger("agentrun.adoption")

Obj = dict[str, Any]
DryRun = Callable[[str, Obj], Obj]
"""``dry_run(namespace, manifest)``: the Job the API server would store (``dryRun=All``)."""
ReadJob = Callable[[str, str], Obj | None]
"""``read_job(namespace, name)``: the Job as stored now (a quorum read), None when absent."""
ListPods = Callable[[str, str], list[Obj]]
"""``list_pods(namespace, run_uid)``: the run's pods as stored now."""
Bind = Callable[[m.AgentRun, CreateJob], CreateJob | str]
"""``bind(run, intent)``: the intent with its inputs by reference bound to their verified
values, as the operator creates the Job (agentrun.execution.inputs), or why they cannot be."""
Expected = Callable[[], CreateJob | None]
"""``expected()``: the create of a Job made with no committed intent (the run's executor),
as the operator makes it now; None when there is none to compare with."""
Key = Callable[[], bytes]
"""``key()``: the key of step Jobs' proofs (agentrun.loop.signing)."""
Report = Callable[[m.AgentRun, str, str], None]
"""``report(run, reason, message)``: a Warning for the run's creator, called once per Job found
holding an attempt's name that is not the attempt's (reason ``JobNameTaken``) and once per pod
a step Job counts that does not run its template (reason ``UntrustedPod``)."""

CACHE_LIMIT = 20_000
OBSERVED_LIMIT = 4_096
"""Jobs whose last observation is kept: those of the runs in progress, with room to spare
(only a pass's cost depends on it: a Job not kept is checked again)."""
FRESH_SECONDS = 30.0
READ_FRESH_SECONDS = 2.0
"""How long a Job read directly stands in for the view. Short: a Job the watch no longer
selects (someone changed its labels) is read again by the next pass, so its end is seen."""


@dataclass(frozen=True)
class Verdict:
    """Whether a Job is the attempt's; ``problem`` says which check failed."""

    problem: str | None = None
    signed: bool = False
    """The Job carries the operator's proof for this attempt, over a manifest that is not the
    one the committed intent gives now (the step changed since the operator made it)."""

    @property
    def ok(self) -> bool:
        return self.problem is None


VERIFIED = Verdict()


def _passed_over(
    job: Mapping[str, Any], pods_of: Callable[[str], Iterable[Mapping[str, Any]]]
) -> bool:
    """Released after its outcome (without the operator's finalizer) and either being
    deleted, or ended and handed to the TTL controller (``ttlSecondsAfterFinished`` set) with
    no pod of it still running: nothing a pass of a run decides depends on such a Job any
    more, unless it is an attempt in flight. A long agent run has about a hundred of them
    at any time (each turn's two Jobs stay for the deletion grace), and a pass would
    otherwise check every one. A released Job whose TTL someone removed is still observed
    (the operator deletes it once the grace is over), and so is one with a pod still
    stopping (the step's next attempt waits for it). ``pods_of``: a Job uid's pods, asked
    only for a Job that is let go otherwise."""
    if jobs.is_held(job):
        return False
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return True
    if not jobs.is_finished(job) or not jobs.has_ttl(job):
        return False
    return all(jobs.pod_ended(p) for p in pods_of(_uid(job)))


def _observed_key(
    job: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    refused: str | None,
    started: str | None,
) -> str | None:
    """What an observation of ``job`` is a function of: the versions of the Job and of its
    pods, the pod refusal and the pod let start; None when an object has no version."""
    versions = []
    for obj in (job, *pods):
        meta = obj.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return None
        versions.append(f"{uid}@{version}")
    return "|".join((*versions, f"refused={refused}", f"started={started}"))


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _generation(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _held_name(job: Obj) -> str:
    """``namespace/name`` of ``job``."""
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class _Lru(OrderedDict[str, Any]):
    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


# -- observing a run's Jobs ----------------------------------------------------------------------


class Adoption:
    """Observes runs' Jobs from the view, keeping only those that pass both checks."""

    def __init__(
        self,
        view: ClusterView,
        dry_run: DryRun,
        read_job: ReadJob,
        list_pods: ListPods,
        report: Report,
        key: Key,
        bind: Bind | None = None,
    ) -> None:
        self.view = view
        self.key = key
        self.bind = bind
        self.dry_run = dry_run
        self.read_job = read_job
        self.list_pods = list_pods
        self.report = report
        self._lock = threading.Lock()
        self._created = _Lru()
        """uid -> the generations of the Jobs this process created that it made: as created,
        and as its own patches left them (the release to the TTL controller)."""
        self._verdicts = _Lru()
        """uid -> (generation, :class:`Verdict`) of a dry-run comparison. A Job whose spec
        changed since (a new generation) is checked again."""
        self._holders = _Lru()
        """namespace/name -> uid of the Job this process created, or verified, under that
        name: a proof binds a name, not a uid, so a Job made again under the name (its proof
        copied from the one deleted) is told apart by its uid while this process runs."""
        self._reported = _Lru()
        self._observed = _Lru(OBSERVED_LIMIT)
        """Job uid -> (:func:`_observed_key`, the :class:`ObservedJob` or None made of the
        objects of that key), the last observation of each Job."""
        self._started = _Lru()
        """Job uid -> uid of the pod this process let start (its gate removed): no other pod
        of that Job starts, even before the view shows that one started."""
        self._let_go = _Lru()
        """Job uid -> the resourceVersion at which it was found :func:`_passed_over`: so it
        stays until it changes (a finished Job makes no pod, an ended pod never runs again),
        and a pass over a run's hundred Jobs let go need not look at them again."""
        self._fresh = _Lru()
        """namespace/name -> (until when, a Job as read by this process: created, or read on
        a conflict or because the view lacks it) not yet in the view, which lags the API
        server by a moment. Trusted for :data:`FRESH_SECONDS` after a create and
        :data:`READ_FRESH_SECONDS` after a read at most; then the view, or a new read, tells."""

    # -- what the shell tells it -------------------------------------------------------------

    def created(self, job: Obj) -> None:
        """The operator created ``job``, or changed it (the create's or the patch's answer):
        it is the attempt's at that generation. Each generation this process made is kept:
        the view may still hold the Job at an earlier one of them (a release's patch seen
        before the watch delivers it), which is no less the operator's."""
        uid = _uid(job)
        with self._lock:
            made: frozenset[int] = self._created.get(uid) or frozenset()
            self._created.remember(uid, made | {_generation(job)})
            self._holders.remember(_held_name(job), uid)
            self._remember_fresh(job, FRESH_SECONDS)

    def made(self, job: Obj) -> None:
        """The operator created ``job`` (the create's answer): :meth:`created`, and the
        watch's event of that create wakes no run (:meth:`ClusterView.made`)."""
        self.created(job)
        self.view.made(job)

    def _made_here(self, job: Obj) -> bool:
        """Whether this process created ``job`` and made its current generation (call with
        the lock held)."""
        return _generation(job) in (self._created.get(_uid(job)) or ())

    def started(self, pod: Obj) -> None:
        """The operator let ``pod`` start (the answer to removing its gate)."""
        job_uid = controller_uid(pod)
        if job_uid:
            with self._lock:
                self._started.remember(job_uid, _uid(pod))

    def read(self, namespace: str, name: str) -> Obj | None:
        """Read Job ``name`` now (a create met AlreadyExists, or the view misses it)."""
        job = self.read_job(namespace, name)
        if job is not None:
            with self._lock:
                self._remember_fresh(job, READ_FRESH_SECONDS)
        return job

    def _remember_fresh(self, job: Obj, seconds: float) -> None:
        meta = job.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self._fresh.remember(key, (time.monotonic() + seconds, job))

    def _current_object(self, namespace: str, name: str) -> Obj | None:
        """The Job of that name: the view's, else one this process read and the view has not
        delivered yet (or a newer one than the view's, of the same name)."""
        seen = self.view.job_named(namespace, name)
        key = f"{namespace}/{name}"
        with self._lock:
            entry: tuple[float, Obj | None] = self._fresh.get(key, (0.0, None))
            until, fresh = entry
            stale = time.monotonic() > until
            same = fresh is not None and seen is not None and _uid(seen) == _uid(fresh)
            ahead = same and _later_version(fresh or {}, seen or {})
            if fresh is not None and (stale or (same and not ahead)):
                del self._fresh[key]  # the view has it now, or should have
                fresh = None
        if fresh is None:
            return seen
        if seen is None or ahead or _newer(fresh, seen):
            # A release's answer is newer than the view's Job until its watch event arrives:
            # taken from the view, the Job would still hold its finalizer and be released again.
            return fresh
        return seen

    # -- verdicts ----------------------------------------------------------------------------

    def verdict(self, run: m.AgentRun, job: Obj, step: str | None) -> Verdict | None:
        """Whether ``job`` is the Job of ``step``'s last committed attempt; None when that
        cannot be told (no such step, or the step changed since: no intent to compare)."""
        with self._lock:
            if self._made_here(job):
                # This process created it: its uid is the proof, whatever labels or owner
                # references someone gave it since.
                return VERIFIED
        cached = self._cached(job)
        if cached is not None:
            return cached
        intent = committed_launch(run, step) if step is not None else None
        if intent is None or intent.job_name != _name(job):
            problem = ownership_problem(job, run.metadata.uid)
            return Verdict(problem) if problem is not None else None
        return self._checked(run, job, intent)

    def _cached(self, job: Obj) -> Verdict | None:
        """The verdict of ``job`` at its current generation, if one was reached."""
        with self._lock:
            cached: tuple[int, Verdict] | None = self._verdicts.get(_uid(job))
        return cached[1] if cached is not None and cached[0] == _generation(job) else None

    def _checked(self, run: m.AgentRun, job: Obj, intent: CreateJob) -> Verdict:
        """Whether ``job`` is the Job the operator creates for ``intent`` (its proof, then a
        dry-run create of that manifest compared with it), kept by the Job's uid and
        generation."""
        with self._lock:
            holder = self._holders.get(_held_name(job))
        if holder is not None and holder != _uid(job):
            return Verdict(
                f"it was made again under the name after the Job the operator created or "
                f"verified for this attempt (uid {holder}) was deleted; its proof, copied, binds "
                "the name, and its uid is not that Job's"
            )
        cached = self._cached(job)
        if cached is not None:
            return cached
        bound = intent if self.bind is None else self.bind(run, intent)
        if isinstance(bound, str):  # its inputs are not the committed ones: nothing to match
            found = Verdict(f"its inputs cannot be verified: {bound}")
        else:
            # Signed over the manifest the operator creates: the one with its inputs bound.
            key = self.key()
            manifest = jobs.step_job(run, bound, key)
            problem = proof.proof_problem(
                key, run.metadata.uid, bound.step.name, bound.attempt, manifest, job
            )
            if problem is not None:
                # Say first what is plainly wrong (another controller), else that it is
                # unsigned, or signed by the operator over a manifest the step no longer gives.
                ownership = ownership_problem(job, run.metadata.uid)
                signed = ownership is None and proof.signed_earlier(
                    key, run.metadata.uid, bound.step.name, bound.attempt, job
                )
                if signed:
                    problem = "its spec is not the one the committed step gives now"
                found = Verdict(ownership or problem, signed=signed)
            else:
                expected = self.dry_run(run.metadata.namespace, dry_run_manifest(run, bound, key))
                found = Verdict(spec_problem(expected, job))
        with self._lock:
            self._verdicts.remember(_uid(job), (_generation(job), found))
            if found.ok and _held_name(job) not in self._holders:
                self._holders.remember(_held_name(job), _uid(job))
        if not found.ok:
            log.warning("Job %s is not the operator's: %s", _name(job), found.problem)
        return found

    def is_rejected(self, job: Mapping[str, Any], run_uid: str) -> bool:
        """Whether ``job`` is not known to be run ``run_uid``'s (never to be deleted). A Job
        with no proof at all was never created by the operator, whatever it claims: it is
        left alone (a Job that only copies the labels and owner of a run's attempts is not
        the operator's to delete)."""
        uid = _uid(job)
        with self._lock:
            if uid in self._created:
                return False
            cached: tuple[int, Verdict] | None = self._verdicts.get(uid)
        if cached is not None:
            return not cached[1].ok
        annotations = (job.get("metadata") or {}).get("annotations") or {}
        if s.ANNOTATION_PROOF not in annotations:
            return True
        return ownership_problem(job, run_uid) is not None

    def _name_taken(self, run: m.AgentRun, st: m.StepStatus, job: Obj, problem: str) -> ObservedJob:
        verdict = self._cached(job)
        signed = verdict is not None and verdict.signed
        message = name_taken_message(st.job_name or "", st.attempt, problem, signed)
        self._report_once(run, f"{run.metadata.uid}/{_uid(job)}", "JobNameTaken", message)
        return ObservedJob(
            name=st.job_name or "",
            step=st.name,
            attempt=st.attempt,
            state=JobState.ACTIVE,
            name_taken=message,
        )

    # -- observing ---------------------------------------------------------------------------

    def _passed_over(self, job: Obj) -> bool:
        """:func:`_passed_over`, told once per version of ``job``."""
        uid, version = _uid(job), _version(job)
        with self._lock:
            if version and self._let_go.get(uid) == version:
                return True
        if not _passed_over(job, self.view.pods_of_job):
            return False
        if version:
            with self._lock:
                self._let_go.remember(uid, version)
        return True

    def observe(self, run: m.AgentRun) -> tuple[ObservedJob, ...]:
        """The run's Jobs as the core must see them: verified Jobs in full (with their own
        pods), and, for an attempt in flight whose name another Job holds, a marker saying
        why that Job is not the attempt's. Jobs that cannot be told are left out."""
        ns, uid = run.metadata.namespace, run.metadata.uid
        steps = (run.status.steps if run.status else None) or []
        # An attempt sent to the run's executor has no Job (agentrun.core.executor).
        step_of = {st.job_name: st for st in steps if st.job_name and st.executor_pod is None}
        in_flight = {n: st for n, st in step_of.items() if st.phase in m.ACTIVE_STEP_PHASES}
        found: dict[str, ObservedJob] = {}
        executor = turns.executor_wanted(run)
        for listed in self.view.jobs_of_run(uid):
            name = _name(listed)
            if name not in in_flight and (
                name == executor
                or self._passed_over(listed)
                or turns.made_ahead(run, name, _step(listed))
            ):
                # The run's executor (observe_executor), or its outcome is committed and the
                # operator let it go (nothing to see), or a later turn's, made before it
                # (observe_ahead).
                continue
            job = self._current_object(ns, name) or listed
            observed = self._classify(run, job, step_of.get(name), name in in_flight)
            if observed is not None:
                found[name] = observed
        for name, st in in_flight.items():
            if name in found:
                continue
            # Not in the view as the run's: someone else's under that name, a Job the view
            # has not delivered yet, or none (not created yet, or lost): read it.
            maybe = self._current_object(ns, name) or self.read(ns, name)
            if maybe is not None:
                observed = self._classify(run, maybe, st, True)
                if observed is not None:
                    found[name] = observed
        return tuple(found.values())

    def observe_ahead(self, run: m.AgentRun, name: str) -> AheadJob | None:
        """The next model turn's Job ``name`` (made before its turn) as the view holds it,
        None when there is none controlled by the run. Its pods are read only when this
        process created it: only then may its pod start before the turn's intent."""
        return self._observe_made(run, name, pods_otherwise=False)

    def observe_executor(
        self, run: m.AgentRun, name: str, expected: Expected | None = None
    ) -> AheadJob | None:
        """The run's executor, the Job ``name`` (status names it), as the view holds it;
        None when there is none controlled by the run. One this process created, or that is
        what the operator creates for ``expected`` (signed by its key, and as its dry-run
        create: :meth:`verdict` for an attempt's Job; ``expected`` is called only for one this
        process did not create), is observed as a step Job is (trusted:
        sent turns, its pod let start only as a step's); another only with its pods as they
        are, for an attempt bound to its pod's uid to be asked of it."""
        return self._observe_made(run, name, pods_otherwise=True, expected=expected)

    def _observe_made(
        self,
        run: m.AgentRun,
        name: str,
        pods_otherwise: bool,
        expected: Expected | None = None,
    ) -> AheadJob | None:
        """Job ``name`` of the run, made with no committed intent (see the two callers): in
        full when this process created it or it is verified against ``expected``, else with
        its own pods (``pods_otherwise``) or from the Job alone."""
        job = self._current_object(run.metadata.namespace, name)
        if job is None or not _controlled_by(job, run.metadata.uid):
            return None
        with self._lock:
            here = self._made_here(job)
        intent = expected() if not here and expected is not None else None
        if intent is not None and intent.job_name == name:
            here = self._checked(run, job, intent).ok
        if here:
            observed = self._observe_verified(run, job)
        elif pods_otherwise:
            pods = [p for p in self.view.pods_of_job(_uid(job)) if _controlled_by(p, _uid(job))]
            observed = jobs.observe_job(job, pods)
        else:
            observed = jobs.observe_job(job, None)
        return None if observed is None else AheadJob(observed, here)

    def _classify(
        self, run: m.AgentRun, job: Obj, st: m.StepStatus | None, in_flight: bool
    ) -> ObservedJob | None:
        verdict = self.verdict(run, job, st.name if st else None)
        if verdict is not None and verdict.ok:
            return self._observe_verified(run, job)
        if not in_flight or st is None:
            return None  # not the attempt's, or cannot be told: not observed at all
        problem = (
            verdict.problem
            if verdict is not None and verdict.problem
            else "its spec cannot be checked: the step changed since its launch"
        )
        return self._name_taken(run, st, job, problem)

    def _observe_verified(self, run: m.AgentRun, job: Obj) -> ObservedJob | None:
        job_uid = _uid(job)
        pods = self.view.pods_of_job(job_uid)
        refused = None if pods else self.view.pod_refusal(job_uid)
        with self._lock:
            started: str | None = self._started.get(job_uid)
        # What follows depends on these objects' versions only: a pass over a run whose
        # Jobs did not change since the last one costs a lookup per Job, not their checks.
        memo = _observed_key(job, pods, refused, started)
        if memo is not None:
            with self._lock:
                last = self._observed.get(job_uid)
            if last is not None and last[0] == memo:
                return cast(ObservedJob | None, last[1])
        if jobs.is_finished(job) and not any(
            jobs.step_terminated(p) and jobs.pod_problem(job, p) is None for p in pods
        ):
            # Its own pod's last change may not have reached the view yet: read them now.
            listed = self.list_pods(run.metadata.namespace, run.metadata.uid)
            pods = [p for p in listed if _controlled_by(p, job_uid)]
            refused = None if pods else self.view.pod_refusal(job_uid)
            memo = None  # read now, not the view's: the next pass looks again
        self._report_foreign_pods(run, job, pods)
        observed = jobs.observe_job(job, pods, pod_refused=refused, started=started)
        if observed is not None:
            self._report_held_pods(run, job, observed.held_pods)
        if memo is not None:
            with self._lock:
                self._observed.remember(job_uid, (memo, observed))
        return observed

    def _report_held_pods(self, run: m.AgentRun, job: Obj, held: Iterable[str]) -> None:
        """Warn once per second pod of an attempt (the Job controller made two, e.g. when it
        lost the answer to a pod create): it is held and never runs the step's command."""
        for name in held:
            self._report_once(
                run,
                f"{run.metadata.uid}/held/{_uid(job)}/{name}",
                jobs.DUPLICATE_POD,
                f"pod {name} is a second pod of Job {_name(job)} for the same attempt; it "
                "is held by the operator's scheduling gate and never runs the step",
            )

    def _report_foreign_pods(self, run: m.AgentRun, job: Obj, pods: Iterable[Obj]) -> None:
        """Warn once per pod that the Job counts but that does not run its template (made by
        someone else and adopted by the Job controller): it never tells the step's outcome."""
        for pod in pods:
            problem = jobs.pod_problem(job, pod)
            if problem is None:
                continue
            self._report_once(
                run,
                f"{run.metadata.uid}/pod/{_uid(pod)}",
                jobs.UNTRUSTED_POD,
                f"pod {_name(pod)} of Job {_name(job)} does not run the step's template "
                f"({problem}): someone else made it, and its outcome is ignored",
            )

    def _report_once(self, run: m.AgentRun, key: str, reason: str, message: str) -> None:
        """``report`` the first time ``key`` is met (of the last :data:`CACHE_LIMIT`)."""
        with self._lock:
            new = key not in self._reported
            self._reported.remember(key, True)
        if new:
            self.report(run, reason, message)

    def deletable(self, run: m.AgentRun, name: str) -> str | None:
        """The uid to delete Job ``name`` by (a precondition), or None when it must not be
        deleted: it is someone else's, or there is none."""
        job = self._current_object(run.metadata.namespace, name) or self.read(
            run.metadata.namespace, name
        )
        if job is None or self.is_rejected(job, run.metadata.uid):
            return None
        return _uid(job)


def _step(job: Mapping[str, Any]) -> str | None:
    step = ((job.get("metadata") or {}).get("labels") or {}).get(s.LABEL_STEP)
    return str(step) if step is not None else None


def _controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == uid


def _later_version(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``a`` is a later version of the object ``b`` is (resourceVersions compared as
    the integers etcd makes them; one that is not an integer is not taken as later)."""
    mine = str((a.get("metadata") or {}).get("resourceVersion") or "")
    theirs = str((b.get("metadata") or {}).get("resourceVersion") or "")
    return mine.isdigit() and theirs.isdigit() and int(mine) > int(theirs)


def _newer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``a`` was created after ``b`` (two Jobs that held the same name)."""
    stamp_a = str((a.get("metadata") or {}).get("creationTimestamp") or "")
    stamp_b = str((b.get("metadata") or {}).get("creationTimestamp") or "")
    return stamp_a > stamp_b
