"""``agentrun devcluster ...``: run the local test control plane and node from a shell.

``register(subparsers)`` adds the command group to the main ``agentrun`` argparse CLI;
each leaf sets ``func=callable(args) -> int``. ``python -m agentrun_devcluster.cli`` runs
the group on its own.

Commands:

* ``up [--state-dir DIR] [--bin-dir DIR] [--no-node] [--node-name N] [--runtime R]``: start
  etcd, kube-apiserver, kube-controller-manager and (unless ``--no-node``) the local node;
  print the container runtime the node uses, the admin kubeconfig and an ``export`` line for
  a shell (KUBECONFIG, and PATH with kubectl and ``kubectl-agentrun``); stay in the
  foreground until SIGINT/SIGTERM, then shut down.
* ``node --kubeconfig PATH [--name N] [--state-dir DIR] [--runtime R]``: run only the local
  node.

``--runtime`` (:mod:`agentrun_devcluster.runtime`): ``process`` (the default: pods' commands
as local processes), ``docker`` (pods' containers as Docker containers, from local images) or
``auto`` (docker when a Docker engine answers, else process).
* ``kubeconfig --state-dir DIR --user U [--group G ...]``: mint a client-certificate
  kubeconfig for a cluster started with ``up --state-dir DIR``;
  ``--serviceaccount NS/NAME`` mints a token kubeconfig instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

from .binaries import BIN_DIR_ENV, BinariesError, resolve_bin_dir
from .controlplane import ControlPlane, ControlPlaneError
from .kubeconfig import read_server, request_serviceaccount_kubeconfig, write_kubeconfig
from .node import DEFAULT_NODE_NAME, NodeProcess, run_node
from .pki import PKI
from .runtime import RUNTIMES, RuntimeUnavailable

__all__ = ["main", "register"]

_DESCRIPTION = """\
A local Kubernetes for tests and development: etcd, kube-apiserver and
kube-controller-manager run as local processes on 127.0.0.1, and a stand-in node runs
pods: with --runtime process (the default) their commands as local processes (no images,
no isolation, no volumes), with --runtime docker as containers of a local Docker engine
(local images only), with --runtime auto as Docker containers when an engine answers.

  up          start it all in the foreground (Ctrl-C stops it)
  node        run only the stand-in node against a cluster
  kubeconfig  mint a kubeconfig for a user (client cert) or a ServiceAccount (token)
  info        show a running cluster's server, pids and start timings
"""


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)


def shell_environment(kubeconfig: Path, bin_dir: Path) -> str:
    """The ``export`` line that sets a shell up for the cluster: KUBECONFIG, and on PATH the
    control plane's kubectl, then the scripts of this Python environment (``agentrun`` and
    ``kubectl-agentrun``, so that ``kubectl agentrun`` is found)."""
    scripts = sysconfig.get_path("scripts")
    path = os.pathsep.join(shlex.quote(str(d)) for d in dict.fromkeys([bin_dir, Path(scripts)]))
    return f"export KUBECONFIG={shlex.quote(str(kubeconfig))} PATH={path}:$PATH"


def _cmd_up(args: argparse.Namespace) -> int:
    _setup_logging(args.verbose)
    try:
        bin_dir = resolve_bin_dir(args.bin_dir)
    except BinariesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    cp = ControlPlane(bin_dir, state_dir=args.state_dir)
    node: NodeProcess | None = None
    try:
        try:
            cp.start()
            if not args.no_node:
                node = NodeProcess(
                    cp.kubeconfig,
                    name=args.node_name,
                    state_dir=cp.state_dir / "node",
                    log_path=cp.logs_dir / "node.log",
                    runtime=args.runtime,
                )
                node.start()
        except (ControlPlaneError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        kept = "kept" if args.state_dir else "removed on exit; pass --state-dir to keep it"
        print(f"control plane ready at {cp.server} in {cp.time_to_ready:.1f}s")
        print(f"state dir: {cp.state_dir} ({kept}); logs in {cp.logs_dir}")
        if node is not None:
            print(
                f"local node: {node.name}, container runtime {node.runtime_in_use or '?'} "
                f"(--runtime {node.runtime}; log {node.log_path})"
            )
        print(f"kubeconfig: {cp.kubeconfig}")
        print(shell_environment(cp.kubeconfig, bin_dir))
        print("press Ctrl-C to stop", flush=True)
        while not stop.wait(1.0):
            try:
                cp.check_alive()
            except ControlPlaneError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            if node is not None and not node.alive():
                print(f"error: the local node exited\n{node.describe()}", file=sys.stderr)
                return 1
        print("shutting down", file=sys.stderr)
        return 0
    finally:
        if node is not None:
            node.stop()
        cp.stop()


def _cmd_node(args: argparse.Namespace) -> int:
    _setup_logging(args.verbose)
    try:
        run_node(args.kubeconfig, name=args.name, state_dir=args.state_dir, runtime=args.runtime)
    except RuntimeUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_kubeconfig(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    admin = state_dir / "admin.kubeconfig"
    if not admin.exists() or not (state_dir / "pki" / "ca.key").exists():
        print(f"error: {state_dir} holds no dev cluster (no admin.kubeconfig)", file=sys.stderr)
        return 1
    if args.serviceaccount:
        namespace, _, name = args.serviceaccount.partition("/")
        if not name:
            print("error: --serviceaccount wants NAMESPACE/NAME", file=sys.stderr)
            return 2
        out = Path(args.output or state_dir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig")
        request_serviceaccount_kubeconfig(admin, namespace, name, out)
    else:
        if not args.user:
            print("error: --user or --serviceaccount is required", file=sys.stderr)
            return 2
        pki = PKI(state_dir / "pki")
        pair = pki.client_cert(args.user, args.group or [])
        out = Path(args.output or state_dir / "kubeconfigs" / f"{pair.cert.stem}.kubeconfig")
        write_kubeconfig(
            out,
            server=read_server(admin),
            ca_pem=pki.ca_pem,
            user=args.user,
            client_cert_pem=pair.cert.read_bytes(),
            client_key_pem=pair.key.read_bytes(),
        )
    print(out)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    info = Path(args.state_dir) / "cluster.json"
    if not info.exists():
        print(f"error: {info} not found", file=sys.stderr)
        return 1
    print(json.dumps(json.loads(info.read_text()), indent=2))
    return 0


def _runtime_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="process",
        help="how the node runs pods' containers: process (commands as local processes, the "
        "default), docker (containers of the local Docker engine, local images only), auto "
        "(docker when an engine answers, else process)",
    )


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``devcluster`` command group to an ``argparse`` subparsers object."""
    group: argparse.ArgumentParser = subparsers.add_parser(
        "devcluster",
        help="local test control plane (etcd, kube-apiserver, controller-manager) and node",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = group.add_subparsers(dest="devcluster_command", metavar="COMMAND")
    sub.required = True

    up = sub.add_parser("up", help="start the control plane and the local node (foreground)")
    up.add_argument(
        "--state-dir",
        type=Path,
        help="certificates, etcd data, logs and kubeconfigs (kept; reused next time). "
        "Default: a temporary directory removed on exit",
    )
    up.add_argument(
        "--bin-dir",
        type=Path,
        help=f"dir with etcd, kube-apiserver, kube-controller-manager, kubectl "
        f"(default: ${BIN_DIR_ENV}, else built by hack/build-controlplane.sh)",
    )
    up.add_argument("--no-node", action="store_true", help="do not start the local node")
    up.add_argument("--node-name", default=DEFAULT_NODE_NAME)
    _runtime_option(up)
    up.add_argument("-v", "--verbose", action="store_true")
    up.set_defaults(func=_cmd_up)

    node = sub.add_parser("node", help="run the local node (kubelet stand-in) in the foreground")
    node.add_argument("--kubeconfig", type=Path, required=True, help="a cluster-admin kubeconfig")
    node.add_argument("--name", default=DEFAULT_NODE_NAME, help="Node name")
    node.add_argument(
        "--state-dir",
        type=Path,
        help="pod logs and termination-message files "
        "(default: ${AGENTRUN_CACHE_DIR:-~/.cache/agentrun}/node/NAME)",
    )
    _runtime_option(node)
    node.add_argument("-v", "--verbose", action="store_true")
    node.set_defaults(func=_cmd_node)

    kc = sub.add_parser("kubeconfig", help="mint a kubeconfig for a user or a ServiceAccount")
    kc.add_argument("--state-dir", type=Path, required=True, help="as given to `up`")
    kc.add_argument("--user", help="user name (client certificate CN)")
    kc.add_argument(
        "--group", action="append", default=[], help="group (certificate O); repeatable"
    )
    kc.add_argument("--serviceaccount", metavar="NS/NAME", help="a ServiceAccount token instead")
    kc.add_argument("-o", "--output", type=Path, help="where to write it")
    kc.set_defaults(func=_cmd_kubeconfig)

    info = sub.add_parser("info", help="print the cluster.json of a running `up`")
    info.add_argument("--state-dir", type=Path, required=True)
    info.set_defaults(func=_cmd_info)
    return group


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m agentrun_devcluster.cli COMMAND ...``."""
    parser = argparse.ArgumentParser(prog="agentrun")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["devcluster", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
