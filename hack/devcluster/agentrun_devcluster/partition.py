"""A network partition between the operator and the API server, for fault tests.

:class:`Partition` makes a network namespace (``agentrun-part-K``) joined to the host by a veth
pair (``arhK`` on the host, ``arnK`` in the namespace) that carries two pairs of /32 addresses:

* the API path, ``10.231.K.1`` (host) and ``10.231.K.2`` (namespace): the API server listens
  on 127.0.0.1 only, so a forwarder thread on ``10.231.K.1`` joins each connection to it, bytes
  passed through unchanged (TLS included). In the namespace ``kubernetes.default.svc`` (a name
  the API server's certificate holds) is ``10.231.K.1`` (``/etc/netns/agentrun-part-K/hosts``,
  which ``ip netns exec`` puts over ``/etc/hosts``), and :attr:`Partition.kubeconfig` is a copy
  of the cluster's kubeconfig naming ``https://kubernetes.default.svc:PORT``;
* the management path, ``10.232.K.1`` (host) and ``10.232.K.2`` (namespace,
  :attr:`Partition.operator_host`): where the process binds ``/metrics``, ``/readyz`` and
  ``/healthz`` and the test reaches them. It is never cut.

:meth:`Partition.cut` drops the API path's packets silently, in both directions or in one
(half-open), with no reset: the other side just hears nothing, as behind a failed switch; no
keepalive probe is answered either. :meth:`Partition.stall` leaves the packets alone and stalls
the forwarder instead (:meth:`agentrun_devcluster.forwarder.Forwarder.stall`), as a proxy that
lost its backend: connections are accepted, segments and keepalive probes acknowledged, and
nothing is forwarded either way; a connection that stalled stays so after the heal, until its
client gives it up. :meth:`Partition.heal` ends both::

    with Partition(cp.server, cp.kubeconfig, tmp_path) as partition:
        with OperatorProcess(cp.kubeconfig, namespaces=[ns], partition=partition) as op:
            partition.cut()                      # both directions
            ...
            partition.heal()
            partition.cut(to_server=False)       # the server's packets are lost, not the operator's
            ...
            partition.heal()
            partition.stall()                    # accepted, acknowledged, never answered
            ...

The cut poisons a neighbour (ARP) entry of the API path with a MAC address nobody has:
``ip -n NS neigh replace 10.231.K.1 lladdr 02:00:00:00:00:01 dev arnK nud permanent`` loses
what the namespace sends to the server, ``ip neigh replace 10.231.K.2 lladdr 02:00:00:00:00:02
dev arhK nud permanent`` what the host sends back; the receiving veth drops frames addressed to
another MAC. Neighbour entries are per next-hop address, so the management path keeps its own.
``ip neigh del`` of those entries heals (the address is resolved again).

A process in the namespace (:meth:`Partition.wrap` its command line) reaches nothing but the
API server and its own loopback. Needs root and ``ip`` (iproute2):
:func:`partition_unavailable` says whether a partition can be made here. The index ``K``
(1-250) is held by an exclusive ``flock`` on ``/tmp/agentrun-partitions/K.lock`` for as long as
the partition exists, so parallel test processes never share one; whoever takes an index first
removes what a killed process left of that index's partition.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self, cast

import yaml

from .forwarder import Forwarder
from .kubeconfig import write_private_yaml
from .lifecycle import StartStop
from .ports import exclusive_lock

__all__ = [
    "SERVICE_NAME",
    "Partition",
    "PartitionError",
    "partition_unavailable",
    "redirect_kubeconfig",
]

NETNS_PREFIX = "agentrun-part-"
"""The namespace of partition K is ``agentrun-part-K``."""
INDICES = range(1, 251)
"""The partition indices K tried, in order."""
SERVICE_NAME = "kubernetes.default.svc"
"""The API server's name in the namespace: one of its certificate's DNS names
(:func:`agentrun_devcluster.pki.default_apiserver_sans`)."""
LOCK_DIR = Path("/tmp/agentrun-partitions")
"""Where the indices' lock files live (empty files, never removed), one directory for the whole
machine."""
NETNS_ETC = Path("/etc/netns")
"""``ip netns exec NAME`` bind-mounts each file of ``/etc/netns/NAME`` over its ``/etc`` twin."""
LOST_TO_SERVER = "02:00:00:00:00:01"
"""The MAC address the namespace sends the server's packets to when cut: nobody's."""
LOST_TO_OPERATOR = "02:00:00:00:00:02"
"""The MAC address the host sends the namespace's packets to when cut: nobody's."""
IP_TIMEOUT = 30.0
"""Seconds an ``ip`` command may take."""


class PartitionError(RuntimeError):
    """An ``ip`` command failed (the message names it and quotes its stderr), or the partition
    is not in the state the call needs."""


def _run_ip(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise PartitionError(f"`{shlex.join(argv)}` took over {IP_TIMEOUT:.0f}s") from None
    except OSError as e:
        raise PartitionError(f"`{shlex.join(argv)}` could not run: {e}") from None


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; its stdout. Raises :class:`PartitionError` naming the command and
    quoting its stderr when it fails."""
    proc = _run_ip(args)
    if proc.returncode != 0:
        raise PartitionError(
            f"`{shlex.join(['ip', *args])}` failed (exit {proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def _link_exists(name: str) -> bool:
    return _run_ip(["link", "show", "dev", name]).returncode == 0


def _netns_exists(name: str) -> bool:
    return any(line.split()[:1] == [name] for line in _ip("netns", "list").splitlines())


@functools.cache
def partition_unavailable() -> str | None:
    """None when a :class:`Partition` can be made here; else a sentence saying why. Asked of
    the machine once (a throwaway namespace and veth pair are made and deleted)."""
    if os.geteuid() != 0:
        return "a network partition needs root (it makes network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "a network partition needs `ip` (iproute2), which is not on PATH"
    netns, veth = f"agentrun-probe-{os.getpid()}", f"arprobe{os.getpid() % 10**7}"
    try:
        _ip("netns", "add", netns)
    except PartitionError as e:
        return f"a network namespace cannot be made here: {e}"
    try:
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}n", "netns", netns)
    except PartitionError as e:
        return f"a veth pair cannot be made here: {e}"
    finally:
        with contextlib.suppress(PartitionError):
            if _link_exists(veth):
                _ip("link", "del", veth)
        with contextlib.suppress(PartitionError):
            _ip("netns", "del", netns)
    return None


def _upstream(server: str) -> tuple[str, int]:
    """Host and port of a server URL."""
    url = urllib.parse.urlsplit(server)
    if not url.hostname:
        raise ValueError(f"not a server URL: {server!r}")
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def redirect_kubeconfig(source: Path, dest: Path, server: str) -> Path:
    """Write at ``dest`` (mode 0600) a copy of the kubeconfig ``source`` whose current
    context's cluster (else its first) has ``server`` as its server; everything else stays,
    but relative file references (CA, client certificate and key) are made absolute."""
    doc = cast(dict[str, Any], yaml.safe_load(source.read_text()))
    clusters: list[dict[str, Any]] = doc.get("clusters") or []
    if not clusters:
        raise ValueError(f"{source}: the kubeconfig has no cluster")
    contexts = {c["name"]: c.get("context") or {} for c in doc.get("contexts") or []}
    current = contexts.get(doc.get("current-context"), {}).get("cluster")
    cluster = next((c for c in clusters if c.get("name") == current), clusters[0])
    cluster.setdefault("cluster", {})["server"] = server
    entries = [c.get("cluster") or {} for c in clusters]
    entries += [u.get("user") or {} for u in doc.get("users") or []]
    for entry in entries:
        for key in ("certificate-authority", "client-certificate", "client-key"):
            value = entry.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                entry[key] = str((source.parent / value).resolve())
    return write_private_yaml(dest, doc)


def _lock(index: int) -> int | None:
    """An open descriptor holding partition index ``index``'s lock, or None if another process
    holds it."""
    return exclusive_lock(LOCK_DIR / f"{index}.lock")


class Partition(StartStop):
    """A network namespace whose path to the API server can be cut and healed; a context
    manager.

    ``server``: the API server's URL (``https://127.0.0.1:PORT``, as
    :attr:`~agentrun_devcluster.controlplane.ControlPlane.server`), where the forwarder
    connects. ``kubeconfig``: the kubeconfig to copy (credentials and CA kept) into
    ``workdir``/``partitioned.kubeconfig`` (:attr:`kubeconfig`), the one to give a process in
    the namespace. :attr:`name`, :attr:`operator_host` and :meth:`wrap` need a started
    partition.
    """

    def __init__(self, server: str, kubeconfig: Path, workdir: Path) -> None:
        self.server = server
        self.source_kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.kubeconfig = self.workdir / "partitioned.kubeconfig"
        """The kubeconfig for the namespace: the API server as ``kubernetes.default.svc``,
        reached through the forwarder. Written by :meth:`start`."""
        self.upstream = _upstream(server)
        self.index: int | None = None
        """K, while started."""
        self.cut_to_server = False
        """Whether the namespace's packets to the server are lost."""
        self.cut_to_operator = False
        """Whether the host's packets to the namespace (the server's answers) are lost."""
        self.stalled = False
        """Whether the forwarder forwards nothing (:meth:`stall`)."""
        self._forwarder: Forwarder | None = None
        self._lock_fd: int | None = None

    # -- names and addresses --------------------------------------------------------------------

    def _index(self) -> int:
        if self.index is None:
            raise PartitionError("the partition is not started")
        return self.index

    @property
    def name(self) -> str:
        """The network namespace's name, ``agentrun-part-K``."""
        return f"{NETNS_PREFIX}{self._index()}"

    @property
    def host_veth(self) -> str:
        return f"arh{self._index()}"

    @property
    def netns_veth(self) -> str:
        return f"arn{self._index()}"

    @property
    def server_host(self) -> str:
        """The API path's host address, where the forwarder listens."""
        return f"10.231.{self._index()}.1"

    @property
    def operator_api_host(self) -> str:
        """The API path's namespace address, where the namespace's API connections come
        from."""
        return f"10.231.{self._index()}.2"

    @property
    def management_host(self) -> str:
        """The management path's host address."""
        return f"10.232.{self._index()}.1"

    @property
    def operator_host(self) -> str:
        """The management path's namespace address: where a process in the namespace binds
        its endpoints and the test reaches them, cut or not."""
        return f"10.232.{self._index()}.2"

    @property
    def forwarder_port(self) -> int:
        if self._forwarder is None:
            raise PartitionError("the partition is not started")
        return self._forwarder.port

    @property
    def connections(self) -> int:
        """How many connections the forwarder accepted (0 when not started)."""
        return 0 if self._forwarder is None else self._forwarder.accepted

    @property
    def stalled_connections(self) -> int:
        """How many connections the forwarder stalled (0 when not started)."""
        return 0 if self._forwarder is None else self._forwarder.stalled

    @property
    def is_cut(self) -> bool:
        """Whether the API path is cut in either direction."""
        return self.cut_to_server or self.cut_to_operator

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the namespace (``ip netns exec`` execs it: same pid, same
        signals)."""
        return ["ip", "netns", "exec", self.name, *argv]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Take the first free index K, make the namespace, veth pair, addresses, routes and
        hosts file, start the forwarder and write :attr:`kubeconfig`. A start that fails
        removes what it made."""
        if self.index is not None:
            raise PartitionError(f"the partition is already started ({self.name})")
        try:
            self._claim()
            self._forwarder = Forwarder(self.server_host, self.upstream)
            scheme = urllib.parse.urlsplit(self.server).scheme or "https"
            redirect_kubeconfig(
                self.source_kubeconfig,
                self.kubeconfig,
                f"{scheme}://{SERVICE_NAME}:{self._forwarder.port}",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _claim(self) -> None:
        """Take the first index that is free (its lock free, and none of its names, addresses
        and routes taken by something else on the machine), removing what a killed process
        left of it, and make its namespace, veth pair, addresses, routes and hosts file."""
        for index in INDICES:
            fd = _lock(index)
            if fd is None:
                continue
            self._lock_fd, self.index = fd, index
            self._remove()
            try:
                self._build()
            except PartitionError as e:
                if "exists" not in str(e).lower():
                    raise
                # Something outside any lock holds a name or an address of this index.
                self._remove()
                self._release()
                continue
            return
        raise PartitionError(
            f"no free partition index in {INDICES.start}-{INDICES.stop - 1} "
            f"(see `ip link show`, `ip route` and {LOCK_DIR})"
        )

    def _build(self) -> None:
        name, host, netns = self.name, self.host_veth, self.netns_veth
        _ip("link", "add", host, "type", "veth", "peer", "name", netns)
        _ip("netns", "add", name)
        _ip("link", "set", netns, "netns", name)
        for address in (self.server_host, self.management_host):
            _ip("addr", "add", f"{address}/32", "dev", host)
        _ip("link", "set", host, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        for address in (self.operator_api_host, self.operator_host):
            _ip("-n", name, "addr", "add", f"{address}/32", "dev", netns)
        _ip("-n", name, "link", "set", netns, "up")
        for there, here in (
            (self.operator_api_host, self.server_host),
            (self.operator_host, self.management_host),
        ):
            _ip("route", "add", f"{there}/32", "dev", host, "src", here)
            _ip("-n", name, "route", "add", f"{here}/32", "dev", netns, "src", there)
        etc = NETNS_ETC / name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.server_host} {SERVICE_NAME}\n")

    def cut(self, to_server: bool = True, to_operator: bool = True) -> None:
        """Lose the API path's packets from the namespace to the server (``to_server``) and/or
        back (``to_operator``): dropped silently, no reset. Directions already cut stay cut;
        the management path is untouched."""
        if not (to_server or to_operator):
            raise ValueError("cut at least one direction")
        if to_server:
            _ip(
                *("-n", self.name, "neigh", "replace", self.server_host),
                *("lladdr", LOST_TO_SERVER, "dev", self.netns_veth, "nud", "permanent"),
            )
            self.cut_to_server = True
        if to_operator:
            _ip(
                *("neigh", "replace", self.operator_api_host),
                *("lladdr", LOST_TO_OPERATOR, "dev", self.host_veth, "nud", "permanent"),
            )
            self.cut_to_operator = True

    def stall(self) -> None:
        """Make the forwarder a proxy that lost its backend: every connection open now, and
        every one accepted until :meth:`heal`, stays open and forwards nothing (see the
        module docstring). Packets pass as before; the management path is untouched."""
        if self._forwarder is None:
            raise PartitionError("the partition is not started")
        self._forwarder.stall()
        self.stalled = True

    def heal(self) -> None:
        """Let the API path's packets through again, both directions, and new connections
        be forwarded again (the stalled ones stay stalled)."""
        if self.stalled and self._forwarder is not None:
            self._forwarder.resume()
        self.stalled = False
        if self.cut_to_server:
            _ip("-n", self.name, "neigh", "del", self.server_host, "dev", self.netns_veth)
            self.cut_to_server = False
        if self.cut_to_operator:
            _ip("neigh", "del", self.operator_api_host, "dev", self.host_veth)
            self.cut_to_operator = False

    def stop(self) -> None:
        """Stop the forwarder, delete the veth pair, the namespace and its ``/etc/netns``
        directory, and let the index go (idempotent). Raises :class:`PartitionError` after
        all of that if a step failed."""
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None
        try:
            if self.index is not None:
                self._remove()
        finally:
            self.cut_to_server = self.cut_to_operator = self.stalled = False
            self._release()

    def _remove(self) -> None:
        """Delete the veth pair, namespace and ``/etc/netns`` directory of the index, those
        that exist; raise the failures after trying every step."""
        errors: list[str] = []
        name, host = self.name, self.host_veth
        try:
            if _link_exists(host):
                # Deleting one end deletes both, now (a namespace goes away asynchronously).
                _ip("link", "del", host)
        except PartitionError as e:
            if _link_exists(host):
                errors.append(str(e))
        try:
            if _netns_exists(name):
                _ip("netns", "del", name)
        except PartitionError as e:
            errors.append(str(e))
        try:
            shutil.rmtree(NETNS_ETC / name, ignore_errors=False)
        except FileNotFoundError:
            pass
        except OSError as e:
            errors.append(f"cannot remove {NETNS_ETC / name}: {e}")
        if errors:
            raise PartitionError(f"removing partition {name}: " + "; ".join(errors))

    def _release(self) -> None:
        self.index = None
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        where = "not started" if self.index is None else self.name
        return f"Partition({where}, server={self.server})"
