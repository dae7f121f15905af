"""The ``agentrun`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _crd(args: argparse.Namespace) -> int:
    from agentrun.api import crd

    text = crd.render()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun",
        description="agentrun-operator: durable AI agent workflows on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    crd_parser = sub.add_parser(
        "crd", help="print the AgentRun CustomResourceDefinition generated from the API models"
    )
    crd_parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    crd_parser.set_defaults(func=_crd)
    from agentrun.devcluster import cli as devcluster_cli

    devcluster_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
