"""Reading the API server's audit log: who made which request, when, and what a status write
carried.

The benchmark's control plane runs with :data:`BENCH_AUDIT_POLICY`: every request at Metadata
level (user, verb, resource, response code, timestamps), and the status writes of Jobs and
AgentRuns at Request level (with the body written). The bodies say when a Job was marked
Complete and when a step's result was committed, to the microsecond of the API server's
clock: the Job's conditions and the run's ``finishedAt`` only have seconds.

A request is logged once per stage: a watch at ``ResponseStarted`` (when it starts) and again
at ``ResponseComplete`` (when it ends), any other request at ``ResponseComplete`` only.
:func:`parse_requests` folds the stages into one :class:`Request` per audit ID.
"""

from __future__ import annotations

import copy
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "BENCH_AUDIT_POLICY",
    "READ_VERBS",
    "WRITE_VERBS",
    "AuditLog",
    "Request",
    "apply_json_patch",
    "by_verb_and_resource",
    "job_completions",
    "parse_requests",
    "parse_time",
    "run_finishes",
    "step_commits",
]

BENCH_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # The bodies of status writes of Jobs and AgentRuns: when a Job was marked Complete, when a
  # step's result was committed.
  - level: Request
    verbs: [update, patch]
    resources:
      - group: batch
        resources: [jobs/status]
      - group: agentrun.dev
        resources: [agentruns/status]
  # Everything else: who, what, when, the response code.
  - level: Metadata
"""

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list", "watch"})

_STATUS_BODIES = frozenset({("batch", "jobs"), ("agentrun.dev", "agentruns")})
"""(group, resource) whose status writes are logged with their bodies."""
_TERMINAL_RUN_PHASES = frozenset({"Succeeded", "Failed", "Cancelled"})


def parse_time(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp (``2026-01-02T03:04:05.123456Z``)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Request:
    """One API request, as the audit log has it."""

    audit_id: str
    user: str
    verb: str
    group: str
    resource: str
    """The resource, with ``/subresource`` when there is one (``agentruns/status``)."""
    namespace: str | None
    name: str | None
    code: int | None
    """The response code; None while a watch is still open."""
    received: float
    """When the API server received it (epoch seconds)."""
    completed: float | None
    """When the response was complete (epoch seconds); for a watch, when it ended."""
    body: Any = None
    """The request's body, for the status writes logged at Request level: an object, or a
    JSON patch's list of operations."""

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def ok(self) -> bool:
        return self.code is not None and 200 <= self.code < 300


def _request(event: Mapping[str, Any]) -> Request | None:
    audit_id = event.get("auditID")
    received = event.get("requestReceivedTimestamp")
    if not isinstance(audit_id, str) or not isinstance(received, str):
        return None
    ref = event.get("objectRef") or {}
    resource = str(ref.get("resource") or event.get("requestURI") or "?")
    if ref.get("subresource"):
        resource += f"/{ref['subresource']}"
    status = event.get("responseStatus") or {}
    complete = event.get("stage") == "ResponseComplete"
    stage_time = event.get("stageTimestamp")
    body = event.get("requestObject")
    return Request(
        audit_id=audit_id,
        user=str((event.get("user") or {}).get("username", "")),
        verb=str(event.get("verb", "")),
        group=str(ref.get("apiGroup") or ""),
        resource=resource,
        namespace=ref.get("namespace"),
        name=ref.get("name"),
        code=status.get("code") if complete else None,
        received=parse_time(received),
        completed=parse_time(stage_time) if complete and isinstance(stage_time, str) else None,
        body=body if isinstance(body, dict | list) else None,
    )


def parse_requests(lines: Iterable[str | bytes]) -> list[Request]:
    """One :class:`Request` per audit ID, in the order they were first logged; the stage
    ``ResponseComplete`` wins over ``ResponseStarted``. Lines that are not complete JSON
    events (one being written) are skipped."""
    found: dict[str, Request] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        request = _request(event)
        if request is None:
            continue
        previous = found.get(request.audit_id)
        if previous is None or request.completed is not None:
            found[request.audit_id] = request
    return list(found.values())


class AuditLog:
    """The audit log file, read in slices between byte offsets.

    :meth:`mark` is where the log ends now; :meth:`read` parses what was logged between two
    marks (a case reads only its own requests, and parses them after it ran, not while)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0

    def read(self, start: int, end: int | None = None) -> list[Request]:
        """The requests logged between offsets ``start`` and ``end`` (now, if None); a line
        cut by ``end`` is left out."""
        try:
            with self.path.open("rb") as f:
                f.seek(start)
                data = f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            return []
        cut = data.rfind(b"\n")
        return parse_requests(data[: cut + 1].splitlines()) if cut >= 0 else []


def by_verb_and_resource(requests: Iterable[Request]) -> Counter[tuple[str, str]]:
    """How many requests there were of each (verb, resource)."""
    return Counter((r.verb, r.resource) for r in requests)


def _status_writes(requests: Iterable[Request], group: str, resource: str) -> list[Request]:
    writes = [
        r
        for r in requests
        if r.verb in ("update", "patch")
        and r.group == group
        and r.resource == f"{resource}/status"
        and r.ok
        and r.body is not None
        and r.completed is not None
    ]
    return sorted(writes, key=lambda r: r.completed or 0.0)


def apply_json_patch(document: Any, ops: Iterable[Mapping[str, Any]]) -> Any:
    """``document`` (not changed) with JSON patch ``ops`` (RFC 6902: add, remove, replace;
    the operator's status writes use no other) applied, strictly: a path that is not there
    raises ``KeyError``, ``IndexError`` or ``ValueError``."""
    document = copy.deepcopy(document)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in str(op["path"]).split("/")[1:]]
        if not tokens:
            document = copy.deepcopy(op["value"])
            continue
        parent = document
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last, kind = tokens[-1], op["op"]
        if isinstance(parent, list):
            if kind == "add" and last == "-":
                parent.append(copy.deepcopy(op["value"]))
                continue
            index = int(last)
            if not 0 <= index < len(parent) + (kind == "add"):
                raise IndexError(f"{op['path']}: no such element")
            if kind == "remove":
                del parent[index]
            elif kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            else:
                parent[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[last]
        elif kind == "add" or last in parent:
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise KeyError(f"{op['path']}: no such member")
    return document


def _written_statuses(
    requests: Iterable[Request], user: str | None
) -> list[tuple[Request, Mapping[str, Any]]]:
    """Each successful status write of AgentRuns (by ``user``, when given), in the order they
    were made, with the run's status as that write left it: a PUT's body carries it whole;
    a JSON patch (the operator's) is applied to what the writes before it left. A run's
    patches are put in order by the version each was made at (its ``replace`` of
    ``/metadata/resourceVersion``: the version the write before it made); a patch that does
    not apply (a run whose first write this slice of the log lacks) is left out."""
    writes = [
        r
        for r in _status_writes(requests, "agentrun.dev", "agentruns")
        if user is None or r.user == user
    ]
    current: dict[str, Any] = {}
    made: list[tuple[Request, Mapping[str, Any]]] = []
    for r in sorted(writes, key=lambda r: (f"{r.namespace}/{r.name}", _fenced_version(r))):
        key = f"{r.namespace}/{r.name}"
        if isinstance(r.body, list):
            try:
                ops = [o for o in r.body if str(o.get("path", "")).startswith("/status")]
                status = apply_json_patch({"status": current.get(key)}, ops)["status"]
            except (KeyError, IndexError, ValueError, TypeError, AttributeError):
                current.pop(key, None)
                continue
        else:
            status = (r.body or {}).get("status")
        current[key] = status
        if isinstance(status, dict):
            made.append((r, status))
    return sorted(made, key=lambda m: m[0].completed or 0.0)


def _fenced_version(r: Request) -> int:
    """The resourceVersion a JSON patch write was made at; 0 for any other write."""
    if isinstance(r.body, list):
        for op in r.body:
            if isinstance(op, dict) and op.get("path") == "/metadata/resourceVersion":
                return int(str(op.get("value") or 0))
    return 0


def job_completions(requests: Iterable[Request]) -> dict[str, float]:
    """When each Job (``namespace/name``) was marked finished: the end of the first status
    write whose body sets its ``Complete`` or ``Failed`` condition to True."""
    done: dict[str, float] = {}
    for r in _status_writes(requests, "batch", "jobs"):
        key = f"{r.namespace}/{r.name}"
        if key in done or r.completed is None:
            continue
        if not isinstance(r.body, dict):
            continue
        conditions = (r.body.get("status") or {}).get("conditions") or []
        if any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in conditions
            if isinstance(c, dict)
        ):
            done[key] = r.completed
    return done


def step_commits(requests: Iterable[Request], user: str | None = None) -> dict[str, float]:
    """When each step attempt's result was committed, by ``namespace/jobName``: the end of
    the first status write of its run (by ``user``, when given) whose body shows the step
    with that Job finished (``finishedAt`` set)."""
    committed: dict[str, float] = {}
    for r, status in _written_statuses(requests, user):
        if r.completed is None:
            continue
        for st in status.get("steps") or []:
            if not isinstance(st, dict) or not st.get("jobName") or not st.get("finishedAt"):
                continue
            key = f"{r.namespace}/{st['jobName']}"
            committed.setdefault(key, r.completed)
    return committed


def step_marks(
    requests: Iterable[Request], user: str | None = None
) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    """For each step of each run, by ``(namespace, run, step)``: the end of the first status
    write (by ``user``, when given) that shows it with a Job named (its intent committed), and
    of the first that shows it finished (its result committed); None when none did."""
    marks: dict[tuple[str, str, str], tuple[float | None, float | None]] = {}
    for r, status in _written_statuses(requests, user):
        if r.completed is None:
            continue
        for st in status.get("steps") or []:
            if not isinstance(st, dict) or not st.get("name"):
                continue
            key = (str(r.namespace), str(r.name), str(st["name"]))
            intent, done = marks.get(key, (None, None))
            if intent is None and st.get("jobName"):
                intent = r.completed
            if done is None and st.get("finishedAt"):
                done = r.completed
            marks[key] = (intent, done)
    return marks


def run_finishes(requests: Iterable[Request], user: str | None = None) -> dict[str, float]:
    """When each run (``namespace/name``) was committed in a terminal phase: the end of the
    first status write (by ``user``, when given) with phase Succeeded, Failed or Cancelled."""
    finished: dict[str, float] = {}
    for r, status in _written_statuses(requests, user):
        if r.completed is None:
            continue
        if status.get("phase") in _TERMINAL_RUN_PHASES:
            finished.setdefault(f"{r.namespace}/{r.name}", r.completed)
    return finished
