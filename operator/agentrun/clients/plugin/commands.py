"""``kubectl agentrun``: the commands, their arguments, what they print and their exit codes.

What a command reads or writes is shared with :class:`agentrun.clients.typed.AgentRunClient`:
results, history and waiting are :mod:`agentrun.clients.reading`, decisions
:mod:`agentrun.access.approvals`, forks and follow-up questions :mod:`agentrun.clients.forks`;
the plugin passes them its own API calls (:class:`~agentrun.clients.plugin.kube.Session`).

Exit codes: 0 done, 1 failed (the message on stderr says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.access import approvals
from agentrun.api import models as m
from agentrun.clients import forks, reading
from agentrun.clients.plugin import completion, graphs, render, watching
from agentrun.clients.plugin import logs as steplogs
from agentrun.clients.plugin import transcript as transcripts
from agentrun.clients.plugin.kube import PluginError, Session, strip_kind
from agentrun.core import agent_refs, follow_up, subagents
from agentrun.execution import objects
from agentrun.kubeapi import JSON_PATCH, MERGE_PATCH, Unreachable, api_message

WAIT_INTERVAL_SECONDS = 1.0
"""How often ``wait`` reads the run when the API server refuses you the watch."""
DISTRIBUTION = "agentrun-operator"

Command = Callable[[Session, argparse.Namespace], int]


def _out(*lines: str) -> None:
    for line in lines:
        print(line)


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def _now() -> datetime:
    return datetime.now(UTC)


def _ref(run: m.AgentRun) -> str:
    return f"agentrun/{run.metadata.name}"


def _phase(run: m.AgentRun) -> m.RunPhase | None:
    return run.status.phase if run.status else None


def _dump(value: Any, output: str) -> None:
    """``value`` as JSON or YAML on stdout (``-o json|yaml``)."""
    sys.stdout.write(graphs.dump(value, output))


def version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        import agentrun

        return agentrun.__version__


# -- approve / reject -----------------------------------------------------------------------


def _decide(session: Session, args: argparse.Namespace, decision: m.ApprovalDecision) -> int:
    name, step = strip_kind(args.run), args.step
    reason: str | None = args.reason
    user = session.username()
    try:
        recorded = approvals.record(
            name,
            lambda: session.get_run(name),
            lambda ops: session.patch_run(name, ops, JSON_PATCH),
            step=step,
            decision=decision,
            by=user,
            reason=reason,
            force=args.force,
            now=_now,
        )
    except approvals.DecisionRefused as error:
        raise PluginError(str(error)) from None
    except ApiException as error:
        if error.status == 404:
            raise PluginError(
                f"agentrun '{name}' not found in namespace '{session.namespace}'"
            ) from None
        raise PluginError(
            f"the API server refused to record the decision: {api_message(error)}"
        ) from None
    run, h = recorded.run, recorded.entry.args_hash
    done = "approved" if decision == m.ApprovalDecision.APPROVE else "rejected"
    if recorded.already:
        _out(
            f"step {step} of {_ref(run)} (args {render.short_hash(h)}) was already {done} "
            f"by {user}; nothing to do"
        )
        return 0
    why = f": {reason}" if reason and decision == m.ApprovalDecision.REJECT else ""
    _out(f"{done} step {step} of {_ref(run)} (args {render.short_hash(h)}) as {user}{why}")
    return 0


def cmd_approve(session: Session, args: argparse.Namespace) -> int:
    return _decide(session, args, m.ApprovalDecision.APPROVE)


def cmd_reject(session: Session, args: argparse.Namespace) -> int:
    return _decide(session, args, m.ApprovalDecision.REJECT)


# -- suspend / resume / cancel ----------------------------------------------------------------


def _active_steps(run: m.AgentRun) -> list[str]:
    steps = run.status.steps if run.status else None
    return [st.name for st in steps or [] if st.phase in m.ACTIVE_STEP_PHASES]


def _switch(
    session: Session, args: argparse.Namespace, verb: str, field: str, value: bool, already: str
) -> m.AgentRun | None:
    """Merge-patch spec.<field> to ``value``; None (and a note) when there is nothing to do."""
    name = strip_kind(args.run)
    _, run = session.get_run(name)
    phase = _phase(run)
    if phase in m.TERMINAL_RUN_PHASES:
        _out(f"{_ref(run)} has already finished ({phase}); nothing to {verb}")
        return None
    if bool(getattr(run.spec, field)) == value:
        _out(f"{_ref(run)} {already}; nothing to do")
        return None
    with session.reporting(f"cannot {verb} {_ref(run)}"):
        session.patch_run(name, {"spec": {field: value}}, MERGE_PATCH)
    return run


def cmd_suspend(session: Session, args: argparse.Namespace) -> int:
    run = _switch(session, args, "suspend", "suspend", True, "is already suspended")
    if run is not None:
        active = _active_steps(run)
        finishing = f"; {', '.join(active)} will finish" if active else ""
        _out(f"suspended {_ref(run)} (spec.suspend: true): no new step starts{finishing}")
    return 0


def cmd_resume(session: Session, args: argparse.Namespace) -> int:
    run = _switch(session, args, "resume", "suspend", False, "is not suspended")
    if run is not None:
        _out(f"resumed {_ref(run)} (spec.suspend: false)")
    return 0


def cmd_cancel(session: Session, args: argparse.Namespace) -> int:
    run = _switch(session, args, "cancel", "cancel", True, "is already being cancelled")
    if run is not None:
        active = _active_steps(run)
        stopping = f"stops {', '.join(active)} and " if active else ""
        _out(
            f"cancelled {_ref(run)} (spec.cancel: true): the operator {stopping}ends the run "
            "as Cancelled; committed results are kept"
        )
    return 0


# -- status / history / result -----------------------------------------------------------------


def cmd_status(session: Session, args: argparse.Namespace) -> int:
    output: str | None = args.output
    if output in graphs.DATA_FORMATS:
        _dump(graphs.as_kubectl_shows(session.get_run_body(strip_kind(args.run))), output)
        return 0
    _, run = session.get_run(strip_kind(args.run))
    if output == "mermaid":
        sys.stdout.write(graphs.plan_mermaid(run))
        return 0
    if output == "dot":
        sys.stdout.write(graphs.plan_dot(run))
        return 0
    _out(*render.status_lines(run, _now()))
    _out(*transcripts.agent_status_lines(run))
    return 0


def cmd_tree(session: Session, args: argparse.Namespace) -> int:
    root = subagents.observed_run(session.get_run_body(strip_kind(args.run)))
    runs = [subagents.observed_run(body) for body in session.list_runs()]
    top = subagents.family(root, runs)
    if args.output in graphs.DATA_FORMATS:
        _dump(graphs.family_object(top), args.output)
        return 0
    if args.output == "mermaid":
        sys.stdout.write(graphs.family_mermaid(top))
        return 0
    _out(*render.table(subagents.TREE_HEADERS, subagents.tree_rows(top)))
    return 0


def cmd_history(session: Session, args: argparse.Namespace) -> int:
    name = strip_kind(args.run)

    def list_config_maps(selector: str) -> list[dict[str, Any]]:
        with session.reporting(f"cannot read the audit record of agentrun/{name}"):
            return session.list_config_maps(selector)

    told = reading.history(lambda: session.get_run(name)[1], list_config_maps)
    run, record, history = told.run, told.record, told.status_history
    if record:
        timeline = told.timeline
    else:
        timeline = list(history)
        if history:
            _note(
                f"note: {_ref(run)} has no audit record (yet); showing status.history, "
                f"the last {len(history)} transitions"
            )
    if args.output in graphs.DATA_FORMATS:
        _dump([dict(e) for e in timeline], args.output)
    elif timeline:
        _out(*render.history_lines(timeline))
    else:
        _out(f"{_ref(run)} has no transitions yet")
    if not args.verify:
        return 0
    for cm, why in told.ignored:
        _note(f"ignored ConfigMap {cm}, not part of the record: {why}")
    if not record:
        raise PluginError(
            f"{_ref(run)} has no audit record to verify (no ConfigMaps labelled "
            f"agentrun.dev/run-uid={run.metadata.uid},agentrun.dev/object=audit and owned by it)"
        )
    problems = told.problems()
    if problems:
        _note(f"audit record of {_ref(run)} is NOT intact ({len(problems)} problems):")
        for problem in problems:
            _note(f"  - {problem}")
        return 1
    if told.anchor.head_seq is None or not told.anchor.head_hash:
        _note(
            f"note: status.audit of {_ref(run)} anchors no head (a run from before anchoring): "
            "only the chain's own hashes were checked"
        )
    intact = f"audit record intact: {len(record)} entries"
    if args.output in graphs.DATA_FORMATS:
        _note(intact)  # stdout holds the timeline
    else:
        _out(intact)
    return 0


def cmd_result(session: Session, args: argparse.Namespace) -> int:
    name, step = strip_kind(args.run), args.step
    _, run = session.get_run(name)
    if step is None:
        return _print_answer(session, run)
    stored = reading.step_result(run, step, session.get_config_map)
    if not stored.intact:
        sys.stdout.write(stored.content)
        sys.stdout.flush()
        raise PluginError(
            f"the result of step '{step}' does not match its recorded digest "
            f"{stored.digest}: it was changed after the step committed it"
        )
    _write_raw(stored.content)
    return 0


def _agent_run(run: m.AgentRun) -> bool:
    """Whether ``run`` is an agent run: it writes its agent out or names an Agent."""
    return run.spec.agent is not None or run.spec.agent_ref is not None


def _print_answer(session: Session, run: m.AgentRun) -> int:
    """The answer of an agent run: its result."""
    if not _agent_run(run):
        raise PluginError(f"{_ref(run)} has no spec.agent: name the step whose result to print")
    stored = reading.answer(run, session.get_config_map)
    if not stored.intact:
        raise PluginError(
            f"the answer of {_ref(run)} does not match its recorded digest {stored.digest}: "
            "it was changed after the model gave it"
        )
    _write_raw(stored.content)
    return 0


def _write_raw(content: str) -> None:
    """``content`` as it is; a terminal also gets the newline it may lack."""
    sys.stdout.write(content)
    if sys.stdout.isatty() and not content.endswith("\n"):
        sys.stdout.write("\n")


def cmd_transcript(session: Session, args: argparse.Namespace) -> int:
    _, run = session.get_run(strip_kind(args.run))
    if not _agent_run(run):
        raise PluginError(f"{_ref(run)} has no spec.agent: it has no transcript")
    with session.reporting(f"cannot read the transcript of {_ref(run)}"):
        found = session.list_config_maps(objects.owned_by(run.metadata.uid, "transcript"))
    records = transcripts.records_of(run, found)
    if args.output in graphs.DATA_FORMATS:
        _dump(records, args.output)
        return 0
    lines = transcripts.transcript_lines(run, records)
    _out(*(lines or [f"{_ref(run)} has no turns yet"]))
    return 0


# -- fork -----------------------------------------------------------------------------------


def cmd_fork(session: Session, args: argparse.Namespace) -> int:
    old_name = strip_kind(args.run)
    body, run = session.get_run(old_name)
    new_name = forks.fork_name(old_name, args.name)
    api = forks.ForkApi(
        get_config_map=session.get_config_map,
        create_run=session.create_run,
        create_config_map=session.create_config_map,
        resume_run=lambda name: session.patch_run(name, {"spec": {"suspend": False}}, MERGE_PATCH),
        delete_run=session.delete_run,
    )
    try:
        forked = forks.make(api, body, run, forks.plan(run, args.start, new_name),
                            dry_run=args.dry_run)  # fmt: skip
    except forks.ForkRefused as error:
        raise PluginError(str(error)) from None
    _note(forked.note())
    if forked.dry_run:
        copies = ", ".join(forked.copies)
        _note("dry run: nothing was created" + (f"; it would copy {copies}" if copies else ""))
        sys.stdout.write(yaml.safe_dump(forked.run, sort_keys=False))
        return 0
    _out(new_name)
    return 0


# -- ask ------------------------------------------------------------------------------------


def cmd_ask(session: Session, args: argparse.Namespace) -> int:
    old_name, question = strip_kind(args.run), args.question
    problem = follow_up.question_problem(question)
    if problem is not None:
        raise PluginError(f"cannot ask agentrun/{old_name}: {problem}", code=2)
    body, run = session.get_run(old_name)
    try:
        asked = forks.ask(session.create_run, body, run, question, args.name)
    except forks.ForkRefused as error:
        raise PluginError(str(error)) from None
    _note(asked.note())
    return _made(session, args, asked.run)


def cmd_start(session: Session, args: argparse.Namespace) -> int:
    agent, goal = strip_kind(args.agent), args.goal
    problem = agent_refs.goal_problem(goal)
    if problem is not None:
        raise PluginError(f"cannot start a run of Agent {agent}: {problem}", code=2)
    overrides = {
        wire: value
        for wire, value in (
            ("maxTurns", args.max_turns),
            ("maxToolCallsPerTurn", args.max_tool_calls_per_turn),
            ("contextBytes", args.context_bytes),
        )
        if value is not None
    }
    body = agent_refs.run_of(
        agent, goal, name=args.name, overrides=overrides, max_tokens=args.max_tokens
    )
    made = session.create_run(body)
    _note(f"started agentrun/{made['metadata']['name']}, a run of Agent {agent}")
    return _made(session, args, made)


def _made(session: Session, args: argparse.Namespace, made: dict[str, Any]) -> int:
    """After a run was made: print it, or with ``--wait`` its answer once it ends."""
    name = str(made["metadata"]["name"])
    if not args.wait:
        _print_run(made, args.output)
        return 0
    _note(f"waiting for agentrun/{name} to answer")
    ended = _wait_for(session, name, args.timeout)
    status = ended.status or m.AgentRunStatus()
    if status.phase != m.RunPhase.SUCCEEDED:
        raise PluginError(
            f"{_ended_line(ended)}; it gave no answer (kubectl agentrun transcript {name} "
            "shows its turns)"
        )
    if args.output is None:
        return _print_answer(session, ended)
    _print_run(session.get_run_body(name), args.output)
    return 0


def _print_run(body: dict[str, Any], output: str | None) -> None:
    """A run's name (``-o name``: as kubectl prints one), or the object (``-o json|yaml``)."""
    name = body["metadata"]["name"]
    if output in graphs.DATA_FORMATS:
        _dump(graphs.as_kubectl_shows(body), output)
    elif output == "name":
        _out(f"{m.SINGULAR}.{m.GROUP}/{name}")
    else:
        _out(name)


# -- wait -----------------------------------------------------------------------------------


def _watched(session: Session, name: str, timeout: float) -> reading.Waited:
    """The run watched until it ends; polled instead when you may not watch AgentRuns."""

    def parse(body: Any) -> m.AgentRun:
        try:
            return agent_refs.effective(m.AgentRun.model_validate(body))
        except ValueError as error:
            raise PluginError(
                f"agentrun '{name}' in namespace '{session.namespace}' does not match the API "
                f"this plugin knows ({m.API_VERSION}); is the plugin older than the operator?"
                f"\n{error}"
            ) from None

    try:
        return watching.wait(
            lambda: session.get_run(name),
            lambda version, seconds: session.watch_run(name, version, seconds),
            parse,
            timeout,
        )
    except watching.Deleted as error:
        raise PluginError(str(error)) from None
    except watching.WatchRefused as refused:
        _note(
            f"note: cannot watch agentruns ({api_message(refused.error)}); "
            f"reading {_ref(refused.run)} every {WAIT_INTERVAL_SECONDS:g}s instead"
        )
        return reading.wait(
            lambda: session.get_run(name)[1],
            m.TERMINAL_RUN_PHASES,
            max(refused.left, 0.0),
            WAIT_INTERVAL_SECONDS,
        )


def _wait_for(session: Session, name: str, timeout: float) -> m.AgentRun:
    """The run once it ended; :class:`PluginError` when ``timeout`` ran out first."""
    waited = _watched(session, name, timeout)
    run = waited.run
    status = run.status or m.AgentRunStatus()
    if waited.timed_out:
        raise PluginError(
            f"timed out after {render.duration(timeout)} waiting for {_ref(run)} to "
            f"finish (phase {status.phase or 'Pending'}"
            + (f": {status.message})" if status.message else ")")
        )
    return run


def _ended_line(run: m.AgentRun) -> str:
    status = run.status or m.AgentRunStatus()
    return f"{_ref(run)} {status.phase}" + (f": {status.message}" if status.message else "")


def cmd_wait(session: Session, args: argparse.Namespace) -> int:
    name = strip_kind(args.run)
    run = _wait_for(session, name, args.timeout)
    if args.output in graphs.DATA_FORMATS:
        _dump(graphs.as_kubectl_shows(session.get_run_body(name)), args.output)
    else:
        _out(_ended_line(run))
    return 0 if _phase(run) == m.RunPhase.SUCCEEDED else 1


# -- logs -----------------------------------------------------------------------------------


def cmd_logs(session: Session, args: argparse.Namespace) -> int:
    name, step = strip_kind(args.run), args.step
    _, run = session.get_run(name)
    try:
        where = steplogs.source(run, step, args.attempt)
    except steplogs.NoLog as error:
        raise PluginError(str(error)) from None
    what = f"step {step} attempt {where.attempt} of {_ref(run)}"
    with session.reporting(f"cannot find the pod of {what}"):
        if where.executor_uid is not None:
            pod = _executor_pod(session, run, where, what)
        else:
            pod = _job_pod(session, where, what)
    pod_name = str(pod["metadata"]["name"])
    try:
        container = steplogs.container(pod, args.container)
    except steplogs.NoLog as error:
        raise PluginError(str(error)) from None
    _note(f"{what}: pod {pod_name} ({steplogs.phase_of(pod)})")
    with session.reporting(f"cannot read the log of pod {pod_name} ({what})"):
        for chunk in session.pod_log(pod_name, container, args.follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    return 0


def _executor_pod(
    session: Session, run: m.AgentRun, where: steplogs.Source, what: str
) -> dict[str, Any]:
    """The executor pod a model turn ran on (said plainly: it is not the turn's own pod)."""
    pods = session.list_pods(objects.owned_by(run.metadata.uid))
    pod = steplogs.pod_with_uid(pods, where.executor_uid or "")
    if pod is None:
        raise PluginError(
            f"{what} is a model turn that ran on the run's executor pod (uid "
            f"{where.executor_uid}), not in a Job of its own, and that pod is gone: its log "
            "went with it"
        )
    _note(
        f"note: {what} is a model turn that ran on the run's executor pod "
        f"{pod['metadata']['name']}, not in a Job of its own: this is the executor's log, "
        "which holds every turn it served"
    )
    return dict(pod)


def _job_pod(session: Session, where: steplogs.Source, what: str) -> dict[str, Any]:
    job = session.get_job(where.job_name)
    if job is None:
        raise PluginError(
            f"the Job {where.job_name} of {what} is gone (or the attempt ran on the run's "
            "executor): its pod and log went with it (spec.retention.keepJobs keeps Jobs)"
        )
    uid = (job.get("metadata") or {}).get("uid") or ""
    pods = session.list_pods(f"{steplogs.JOB_UID_LABELS[0]}={uid}")
    if not pods:
        pods = steplogs.pods_of_job(job, session.list_pods(f"job-name={where.job_name}"))
    pod = steplogs.newest(pods)
    if pod is None:
        raise PluginError(f"the Job {where.job_name} of {what} has no pod (yet)")
    if len(pods) > 1:
        _note(f"note: the Job {where.job_name} has {len(pods)} pods; showing the newest")
    return dict(pod)


# -- completion -----------------------------------------------------------------------------


def cmd_completion(args: argparse.Namespace) -> int:
    """Needs no cluster: ``main`` runs it without connecting."""
    sys.stdout.write(completion.script(build_parser(), args.shell))
    return 0


# -- release ------------------------------------------------------------------------------


def cmd_release(session: Session, args: argparse.Namespace) -> int:
    from agentrun.loop import janitor

    namespaces = () if args.all_namespaces else (session.namespace,)
    sweeper = janitor.Janitor.connect(session.api_client, namespaces)
    left = session.call("release AgentRuns", lambda: janitor.release(sweeper, say=_out))
    if left:
        held = [*(f"agentrun {r}" for r in left.runs), *(f"Job {j}" for j in left.jobs)]
        raise PluginError(f"still held by the operator's finalizers: {', '.join(held)}")
    return 0


# -- arguments ------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")


def timeout_seconds(text: str) -> float:
    """``300``, ``300s``, ``5m``, ``1h``: seconds, for --timeout."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration such as 300, 90s, 5m or 1h")
    value = float(match.group(1))
    factor = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return value * factor


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not an attempt number (1, 2, ...)")
    return value


def _reason(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the reason must not be empty")
    if len(text) > 1024:
        raise argparse.ArgumentTypeError(f"the reason is {len(text)} characters; at most 1024")
    return text


def _add_connection_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """-n/--context/--kubeconfig, accepted before and after the command name."""
    default = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "-n",
        "--namespace",
        default=default,
        help="namespace of the run (default: the kubeconfig context's namespace, else default)",
    )
    group.add_argument("--context", default=default, help="kubeconfig context to use")
    group.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
    )


def _add_output(p: argparse.ArgumentParser, *more: str, what: str) -> None:
    formats = (*graphs.DATA_FORMATS, *more)
    p.add_argument(
        "-o",
        "--output",
        choices=formats,
        default=None,
        help=f"print {what} instead of text",
    )


def _add_made_output(p: argparse.ArgumentParser) -> None:
    """--wait, --timeout and -o of a verb that makes a run (ask, start)."""
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until the new run ends and print its answer (exit 1 if it did not succeed)",
    )
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=300.0,
        help="with --wait: give up after this long (300, 90s, 5m, 1h; default 300s)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("name", *graphs.DATA_FORMATS),
        default=None,
        help="print the new run as kubectl -o name does, or the object (json, yaml; with "
        "--wait: as it ended) instead of its name (with --wait: its answer)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl agentrun",
        description="Approve, inspect and steer AgentRuns (agentrun.dev/v1alpha1).",
        epilog="Exit codes: 0 done, 1 failed (the reason is on stderr), 2 usage error.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"kubectl-agentrun {version()}",
        help=f"print the version of {DISTRIBUTION} and exit",
    )
    _add_connection_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(
        name: str, func: Command, help_text: str, more: str = ""
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=f"{help_text} {more}".strip())
        _add_connection_flags(p, top=False)
        p.set_defaults(func=func)
        p.add_argument("run", metavar="RUN", help="name of the AgentRun")
        return p

    for name, func, verb in (
        ("approve", cmd_approve, "Approve"),
        ("reject", cmd_reject, "Reject"),
    ):
        p = command(
            name,
            func,
            f"{verb} a step waiting for approval.",
            "The decision is appended to spec.approvals, bound to the step's current argsHash, "
            "in the name of the user the API server knows you as (a SelfSubjectReview).",
        )
        p.add_argument("step", metavar="STEP", help="the gated step")
        p.add_argument(
            "--reason",
            type=_reason,
            required=name == "reject",
            help="why" + (" (required)" if name == "reject" else ""),
        )
        p.add_argument(
            "--force",
            action="store_true",
            help="record the decision even if the step is not waiting for approval",
        )
    command("suspend", cmd_suspend, "Start no new step (running steps finish).")
    command("resume", cmd_resume, "Let a suspended run go on.")
    command("cancel", cmd_cancel, "Stop running steps and end the run as Cancelled (no undo).")
    p = command("status", cmd_status, "Show the run and its steps as a tree.")
    _add_output(
        p,
        *graphs.GRAPH_FORMATS,
        what="the AgentRun object (json, yaml) or the plan's DAG with each step's phase "
        "(mermaid, dot)",
    )
    p = command(
        "tree",
        cmd_tree,
        "Show the run and the runs it controls, and theirs, with phases and tokens.",
        "A run's children are the AgentRuns whose controller ownerReference is the run (by "
        "uid), as sub-agents are, indented under it. TOKENS is a run's status.usage.tokens, "
        "which hold the tokens of its sub-agents (as counted against its budget): the first "
        "row's are the family's.",
    )
    _add_output(p, "mermaid", what="the family (nested runs) or a graph of it (mermaid)")
    p = command("history", cmd_history, "Show the run's timeline from its audit record.")
    p.add_argument(
        "--verify",
        action="store_true",
        help="check the audit record's hash chain (exit 1 if broken)",
    )
    _add_output(p, what="the timeline's entries")
    p = command(
        "result",
        cmd_result,
        "Print a step's full result, raw.",
        "Without STEP, the answer of an agent run (its result).",
    )
    p.add_argument("step", metavar="STEP", nargs="?")
    p = command(
        "transcript",
        cmd_transcript,
        "Show an agent run's conversation turn by turn.",
        "Each turn: the model's message, each tool call with its arguments, whether it was "
        "valid, who approved it, its result (in short) and the tokens used.",
    )
    _add_output(p, what="the turn records, as the operator stored them")
    p = command(
        "fork",
        cmd_fork,
        "Run STEP and what follows it again, or continue an agent run after TURN, in a new run.",
        "The new run has the same spec (without approvals, suspend and cancel). From a STEP it "
        "carries the results of every other step that succeeded; results kept in ConfigMaps "
        "are copied, so they outlive the old run. From a TURN (a number, for an agent run) it "
        "carries the plan's results and continues the conversation after that turn "
        "(spec.agent.resumeFrom): its first model turn sees what the old run's turn TURN+1 "
        "saw, read by the operator from the old run's records. Prints the new run's name.",
    )
    p.add_argument(
        "--from",
        dest="start",
        metavar="STEP|TURN",
        required=True,
        help="run again from this step, or continue after this turn of an agent run",
    )
    p.add_argument("--name", help="name of the new run (default: RUN-fork-<4 letters>)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the new run with the API server (a server-side dry run) and print it; "
        "create nothing",
    )
    p = command(
        "ask",
        cmd_ask,
        "Ask an agent run that answered the next question of its conversation, in a new run.",
        "The new run has RUN's spec (model, tools, instructions, limits, budget; not its plan, "
        "whose results the conversation holds, nor approvals) with QUESTION as its goal, and "
        "continues RUN's conversation after its answer (spec.agent.resumeFrom, or "
        "spec.agentRef.resumeFrom for a run of an Agent: RUN, its uid and the turn it "
        "answered in): its first model turn sees the whole conversation, the "
        "answer, then QUESTION. Only a run that answered (Succeeded) can be asked; for one "
        "that failed or was cancelled, fork it from a turn it closed. The new run is named "
        "RUN-2 (RUN-3, ... when taken); asking a run that ask named BASE-N names the next "
        "one BASE-N+1 (or the next free). Prints the new run's name.",
    )
    p.add_argument("question", metavar="QUESTION", help="the next question (its spec.goal)")
    p.add_argument("--name", help="name of the new run (default: RUN-2, or the next free)")
    _add_made_output(p)
    p = sub.add_parser(
        "start",
        help="Start a run of an Agent of the namespace with a goal.",
        description=(
            "Start a run of an Agent (spec.agentRef: AGENT) with GOAL as its goal. The "
            "operator takes the Agent and its ModelConfig as they are now, with your rights to "
            "read them and every Secret they name checked (docs/agents.md). Prints the new "
            "run's name (AGENT-<5 letters>, by the API server, unless --name)."
        ),
    )
    _add_connection_flags(p, top=False)
    p.set_defaults(func=cmd_start)
    p.add_argument("agent", metavar="AGENT", help="name of the Agent")
    p.add_argument("goal", metavar="GOAL", help="what the run is for (its spec.goal)")
    p.add_argument("--name", help="name of the new run (default: AGENT-<5 letters>)")
    for flag, what in (
        ("--max-turns", "maxTurns"),
        ("--max-tool-calls-per-turn", "maxToolCallsPerTurn"),
        ("--context-bytes", "contextBytes"),
    ):
        p.add_argument(
            flag,
            type=_positive,
            default=None,
            help=f"spec.agentRef.overrides.{what} (only if the Agent's allowOverrides lists it)",
        )
    p.add_argument(
        "--max-tokens", type=_positive, default=None, help="spec.budget.maxTokens of the run"
    )
    _add_made_output(p)
    p = sub.add_parser(
        "release",
        help="Delete every AgentRun in the namespace and release the operator's finalizers.",
        description=(
            "Uninstall on purpose: delete every AgentRun in the namespace (-A: in all), "
            "remove what each run owns and release the operator's finalizers on runs and step "
            "Jobs without an operator running, so nothing is left that only an operator "
            "could release. The same as `agentrun release`."
        ),
    )
    _add_connection_flags(p, top=False)
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.set_defaults(func=cmd_release)
    p = command(
        "wait",
        cmd_wait,
        "Wait until the run ends; exit 0 only if it Succeeded.",
        "Watches the run (falls back to reading it every second if you may not watch).",
    )
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=300.0,
        help="give up after this long (300, 90s, 5m, 1h; default 300s)",
    )
    _add_output(p, what="the AgentRun as it ended")
    p = command(
        "logs",
        cmd_logs,
        "Print the log of a step attempt's pod.",
        "The pod of the attempt's Job (status.steps[].jobName, or the Job an earlier attempt "
        "had); a model turn sent to the run's executor ran on the executor's pod, whose log is "
        "shown, saying so.",
    )
    p.add_argument("step", metavar="STEP", help="a plan step or a turn's step (t1-model)")
    p.add_argument(
        "--attempt", type=_positive, default=None, help="which attempt (default: the last)"
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the container ends"
    )
    p.add_argument("-c", "--container", help="the container (default: the step's)")
    p = sub.add_parser(
        "completion",
        help="Print a shell completion script (bash, zsh or fish).",
        description=(
            "Print a completion script for kubectl-agentrun: "
            "`source <(kubectl agentrun completion bash)`, the same for zsh, "
            "`kubectl agentrun completion fish | source`."
        ),
    )
    p.add_argument("shell", metavar="SHELL", choices=completion.SHELLS)
    p.set_defaults(offline=cmd_completion)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2
    offline: Callable[[argparse.Namespace], int] | None = getattr(args, "offline", None)
    if offline is not None:
        return offline(args)
    try:
        session = Session.connect(
            kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace
        )
        try:
            func: Command = args.func
            return func(session, args)
        finally:
            session.close()
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.code
    except (Unreachable, reading.Unreadable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except ApiException as error:
        print(f"error: {api_message(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
