"""The ``agentrun`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrun.loop.reconciler import Checkpoint


def _crd(args: argparse.Namespace) -> int:
    from agentrun.api import crd

    text = crd.render(crd.kind_named(args.kind))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _run(args: argparse.Namespace) -> int:
    import dataclasses
    import os

    from agentrun.loop import memory

    if getattr(args, "own_process", False):
        memory.use_c_allocator()  # returns only when the allocator is chosen already

    from agentrun import settings
    from agentrun.telemetry import logs

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    base = settings.Settings()
    overrides: dict[str, object] = {}
    if args.all_namespaces:
        overrides["namespaces"] = ()
    elif args.namespace:
        overrides["namespaces"] = tuple(args.namespace)
    if args.liveness_port is not None:
        overrides["liveness_port"] = args.liveness_port
    if args.metrics_port is not None:
        overrides["metrics_port"] = args.metrics_port
    if args.metrics_host is not None:
        overrides["metrics_host"] = args.metrics_host
    if args.standalone:
        overrides["peering"] = None
    elif args.peering:
        overrides["peering"] = args.peering
    if args.shards is not None:
        overrides["shards"] = args.shards
    chosen = dataclasses.replace(base, **overrides)  # type: ignore[arg-type]
    problem = settings.sharding_problem(chosen)
    if problem:
        sys.stderr.write(f"agentrun run: {problem}\n")
        return 2
    logs.configure()
    from agentrun.loop import handlers

    memory.limit_arenas(chosen.malloc_arenas)

    handlers.run_operator(chosen, liveness_host=args.liveness_host, checkpoint=args.checkpoint)
    return 0


def _release(args: argparse.Namespace) -> int:
    import os

    from kubernetes.client.exceptions import ApiException

    from agentrun.kubeapi import api_message
    from agentrun.loop import janitor
    from agentrun.loop.handlers import api_client

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    namespaces = () if args.all_namespaces else tuple(args.namespace)
    try:
        left = janitor.release(janitor.Janitor.connect(api_client(), namespaces), say=print)
    except ApiException as error:
        sys.stderr.write(f"agentrun release: {api_message(error)}\n")
        return 1
    if left:
        sys.stderr.write(
            "agentrun release: still held by the operator's finalizers: "
            + ", ".join([*(f"agentrun {r}" for r in left.runs), *(f"Job {j}" for j in left.jobs)])
            + "\n"
        )
        return 1
    return 0


def _step(args: argparse.Namespace) -> int:
    if args.command[:1] == ["llm"]:
        import os

        from agentrun import settings

        if os.environ.get(settings.ENV_EXECUTOR_TOKEN_SHA256):  # a run's executor
            from agentrun.pod import executor

            return executor.main(args.command[1:])
        from agentrun.pod import llm

        return llm.main(args.command[1:])
    if args.command[:1] == ["mcp"]:
        from agentrun.pod import mcp

        return mcp.main(args.command[1:])
    if args.command[:1] == ["http"]:
        from agentrun.pod import http_tool

        return http_tool.main(args.command[1:])
    from agentrun.pod import runner

    return runner.main(args.command)


def _add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig, for the commands that talk to a cluster (handlers.api_client's order)."""
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, "
        "~/.kube/config, then the in-cluster ServiceAccount)",
    )


def build_parser(extensions: bool = True) -> argparse.ArgumentParser:
    """The ``agentrun`` parser; with the command groups other distributions add
    (:data:`EXTENSION_GROUP`) unless ``extensions`` is false."""
    parser = argparse.ArgumentParser(
        prog="agentrun",
        description="agentrun-operator: durable AI agent workflows on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    crd_parser = sub.add_parser(
        "crd",
        help="print a CustomResourceDefinition (AgentRun by default) generated from the API models",
    )
    crd_parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    crd_parser.add_argument(
        "--kind", default="AgentRun", help="AgentRun (default), Agent or ModelConfig"
    )
    crd_parser.set_defaults(func=_crd)

    run_parser = sub.add_parser(
        "run",
        help="run the operator in the foreground (until SIGINT or SIGTERM)",
        description=(
            "Run the AgentRun operator. Settings also come from AGENTRUN_* environment "
            "variables (see agentrun/settings.py); flags win."
        ),
    )
    scope = run_parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        metavar="NS",
        help="watch this namespace (repeatable); default: $AGENTRUN_NAMESPACES or all namespaces",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces")
    _add_kubeconfig(run_parser)
    run_parser.add_argument(
        "--liveness-port",
        type=int,
        metavar="PORT",
        help="serve /healthz on this port (0: off; default 8080)",
    )
    run_parser.add_argument(
        "--liveness-host",
        default="0.0.0.0",
        help="address of the liveness endpoint (default 0.0.0.0)",
    )
    run_parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve /metrics and /readyz on this port (0: off; default "
        "$AGENTRUN_METRICS_PORT or 8081)",
    )
    run_parser.add_argument(
        "--metrics-host",
        metavar="ADDR",
        help="address of /metrics and /readyz (default $AGENTRUN_METRICS_HOST or 0.0.0.0)",
    )
    peering = run_parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        metavar="NAME",
        help="coordinate with other operator replicas through this kopf peering object",
    )
    peering.add_argument("--standalone", action="store_true", help="no peering (the default)")
    run_parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="share the runs with the other replicas given the same N: runs fall into N shards, "
        "each decided by one replica at a time through a Lease in the operator's namespace "
        "(default $AGENTRUN_SHARDS or 0: this process decides every run)",
    )
    run_parser.set_defaults(func=_run)

    release_parser = sub.add_parser(
        "release",
        help="delete every AgentRun in scope and release the operator's finalizers (uninstall)",
        description=(
            "Uninstall on purpose: delete every AgentRun in the namespaces given (or in all), "
            "remove what each run owns (step Jobs, pods, result objects) and release the "
            "operator's finalizers on runs and step Jobs, without an operator running, so "
            "that nothing is left that only an operator could release. Exit 1 if something "
            "still holds one of them."
        ),
    )
    release_scope = release_parser.add_mutually_exclusive_group(required=True)
    release_scope.add_argument(
        "-n", "--namespace", action="append", metavar="NS", help="this namespace (repeatable)"
    )
    release_scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace"
    )
    _add_kubeconfig(release_parser)
    release_parser.set_defaults(func=_release)

    step_parser = sub.add_parser(
        "step",
        help="run a step's command inside its pod and report its result to the operator",
        description=(
            "Run COMMAND as the step of an AgentRun: its result (what it writes to "
            "$AGENTRUN_RESULT_FILE, else its stdout) becomes the step's result envelope. "
            "`agentrun step llm` is a model turn of an agent run instead: it calls the "
            "model with the context the operator assembled and reports the model's message "
            "and proposed tool calls (it runs no tool). `agentrun step mcp discover|call` "
            "lists or calls the tools of an MCP server of an agent run; `agentrun step http` "
            "makes the request of a call of an agent run's HTTP tool."
        ),
    )
    step_parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND ... | llm | mcp ACTION | http"
    )
    step_parser.set_defaults(func=_step)
    if extensions:
        _register_extensions(sub)
    return parser


def _own_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> bool:
    """Whether ``argv`` names one of the parser's commands first."""
    return bool(argv) and any(
        argv[0] in action.choices
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )


EXTENSION_GROUP = "agentrun.cli"
"""Entry-point group of command groups other distributions add to ``agentrun`` (the local
cluster's ``agentrun devcluster`` comes from ``agentrun-devcluster`` this way)."""


def _register_extensions(sub: Any) -> None:
    found = set()
    for entry in entry_points(group=EXTENSION_GROUP):
        register: Callable[[Any], None] = entry.load()
        register(sub)
        found.add(entry.name)
    if "devcluster" not in found:
        missing = sub.add_parser(
            "devcluster", help="the local test cluster (needs the agentrun-devcluster package)"
        )
        missing.add_argument("rest", nargs=argparse.REMAINDER)
        missing.set_defaults(func=_no_devcluster)


def _no_devcluster(args: argparse.Namespace) -> int:
    sys.stderr.write(
        "agentrun devcluster: the local test cluster is not part of the operator; it is the "
        "agentrun-devcluster package of the source repository (hack/devcluster). In a checkout, "
        "run `make sync` and then `uv run agentrun devcluster ...`.\n"
    )
    return 2


def main(argv: Sequence[str] | None = None, *, checkpoint: Checkpoint | None = None) -> int:
    """Run the ``agentrun`` command. ``checkpoint`` reaches the reconciler of ``agentrun run``
    (fault injection in tests; see :data:`agentrun.loop.reconciler.Checkpoint`)."""
    given = list(sys.argv[1:] if argv is None else argv)
    # The operator's own commands (`run`, and `step` in every step pod) load no extension:
    # an extension's imports cost a process start time and memory it never uses.
    parser = build_parser(extensions=False)
    if not _own_command(parser, given):
        parser = build_parser()
    args = parser.parse_args(given)
    args.checkpoint = checkpoint
    # The process is the command's own (not a caller's, e.g. a test calling main): `run` may
    # start it again with other interpreter settings (agentrun.loop.memory.use_c_allocator).
    args.own_process = argv is None and checkpoint is None
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
