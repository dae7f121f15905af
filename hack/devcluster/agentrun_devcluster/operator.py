"""The operator (``agentrun run``) as a child process, for end-to-end and crash tests.

:class:`OperatorProcess` starts ``python -m agentrun.cli run --namespace NS ... --kubeconfig
PATH --liveness-port PORT --metrics-port PORT`` with :data:`sys.executable`, on a liveness port
and a metrics port leased for that start (:mod:`agentrun_devcluster.ports`; ``/metrics`` and
``/readyz``: :attr:`OperatorProcess.metrics_url`, :attr:`OperatorProcess.readiness_url`), with
output (stdout and stderr) appended to a log file, and waits until ``/healthz`` answers 200
(starting again on new ports if one was taken before the operator bound it)::

    with OperatorProcess(kubeconfig, namespaces=[ns], env={"AGENTRUN_RESYNC_SECONDS": "5"}) as op:
        ...
        op.kill()                                   # SIGKILL, as a crash would
        op.restart(env={"AGENTRUN_CRASH_AT": ""})   # start again, other env
        op.wait_exit(60)                            # a crash point fired: it died by itself
        print(op.logs())                            # tail of the log

Inherited ``AGENTRUN_*`` variables are dropped (so a stray ``AGENTRUN_CRASH_AT`` or
``AGENTRUN_NAMESPACES`` in the test runner's environment cannot change the operator under
test) unless ``inherit_agentrun_env`` is true; ``env`` is added on top.

With a started :class:`~agentrun_devcluster.partition.Partition` (``partition=``) the operator
runs in the partition's network namespace (``ip netns exec``, which keeps the pid, so signals
reach the operator itself) with the partition's copy of the kubeconfig, and binds its endpoints
on :attr:`~agentrun_devcluster.partition.Partition.operator_host`, where the URLs point: the
test cuts and heals the operator's path to the API server and still reaches ``/metrics``,
``/readyz`` and ``/healthz``::

    with Partition(cp.server, cp.kubeconfig, tmp_path) as partition:
        with OperatorProcess(cp.kubeconfig, namespaces=[ns], partition=partition) as op:
            partition.cut()
            ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

from .controlplane import tail
from .faults import CRASH_ENV
from .lifecycle import StartStop, http_answer, wait_answer
from .partition import Partition
from .ports import PortLease, lease_ports, port_clash, retry_port_clash

__all__ = ["OperatorError", "OperatorProcess"]


class OperatorError(RuntimeError):
    """The operator did not become ready, or exited while starting; carries the log tail."""


class _PortTaken(OperatorError):
    """This start failed because a port was taken before the operator bound it."""


class OperatorProcess(StartStop):
    """One operator process (``agentrun run``), restartable; a context manager.

    ``kubeconfig``: passed as ``--kubeconfig`` and ``KUBECONFIG``. ``namespaces``: one
    ``--namespace`` each; ``all_namespaces`` passes ``--all-namespaces`` instead.
    ``peering``: ``--peering NAME`` (default: standalone). ``env``: extra environment.
    ``extra_args``: appended to the command line. ``log_path``: where output goes (appended
    across restarts, each start marked by a ``--- start`` line). ``partition``: run in that
    (started) partition's network namespace, with its kubeconfig (instead of ``kubeconfig``)
    and endpoints on its :attr:`~agentrun_devcluster.partition.Partition.operator_host`.
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        *,
        namespaces: Sequence[str] = (),
        all_namespaces: bool = False,
        peering: str | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | str | None = None,
        python: str | None = None,
        ready_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        inherit_agentrun_env: bool = False,
        partition: Partition | None = None,
    ) -> None:
        if not namespaces and not all_namespaces:
            raise ValueError("give namespaces or all_namespaces=True")
        self.kubeconfig = Path(kubeconfig)
        self.namespaces = tuple(namespaces)
        self.all_namespaces = all_namespaces
        self.peering = peering
        self.env: dict[str, str] = dict(env or {})
        self.extra_args = tuple(extra_args)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="agentrun-operator-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.python = python or sys.executable
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.inherit_agentrun_env = inherit_agentrun_env
        self.partition = partition
        self.liveness_port = 0
        self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        """How many times the process was started."""
        self._log: IO[bytes] | None = None
        self._lease: PortLease | None = None
        self._log_offset = 0
        """Where the log of the last start begins."""

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Where the operator binds its endpoints and the test reaches them: 127.0.0.1, or in
        a partition its :attr:`~agentrun_devcluster.partition.Partition.operator_host`."""
        return "127.0.0.1" if self.partition is None else self.partition.operator_host

    @property
    def operator_kubeconfig(self) -> Path:
        """The kubeconfig the operator gets: ``kubeconfig``, or the partition's copy."""
        return self.kubeconfig if self.partition is None else self.partition.kubeconfig

    @property
    def liveness_url(self) -> str:
        return f"http://{self.host}:{self.liveness_port}/healthz"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def readiness_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/readyz"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit code of the last process (negative: killed by that signal); None if running."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        """The command line of the next start."""
        # With a crash point set, the same CLI runs with the fault-injection hook passed in.
        module = "agentrun_devcluster.faults" if self.env.get(CRASH_ENV) else "agentrun.cli"
        argv = [self.python, "-m", module, "run", "--kubeconfig", str(self.operator_kubeconfig)]
        if self.all_namespaces:
            argv.append("--all-namespaces")
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        argv += ["--liveness-port", str(self.liveness_port)]
        if self.partition is not None:
            argv += ["--liveness-host", self.host]
        argv += ["--metrics-port", str(self.metrics_port), "--metrics-host", self.host]
        if self.peering:
            argv += ["--peering", self.peering]
        argv += self.extra_args
        return argv if self.partition is None else self.partition.wrap(argv)

    def process_env(self) -> dict[str, str]:
        """The environment of the next start."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k != "KUBECONFIG" and (self.inherit_agentrun_env or not k.startswith("AGENTRUN_"))
        }
        env["KUBECONFIG"] = str(self.operator_kubeconfig)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        return env

    def start(self, *, wait_ready: bool = True) -> Self:
        """Start the process (on newly leased liveness and metrics ports) and, with
        ``wait_ready``, wait until /healthz is 200, starting again on new ports while the
        process exits because a port was taken before it bound it."""
        if self.alive():
            raise OperatorError(f"the operator is already running (pid {self.pid})")
        if self.partition is not None and self.partition.index is None:
            raise OperatorError(f"{self.partition!r} is not started")
        if not wait_ready:
            self._start_once(wait_ready=False)
        else:
            retry_port_clash(
                lambda: self._start_once(wait_ready=True),
                what="the operator",
                clash=lambda e: isinstance(e, _PortTaken),
            )
        return self

    def _start_once(self, *, wait_ready: bool) -> None:
        self._close_log()
        self._lease = lease_ports(2)
        self.liveness_port, self.metrics_port = self._lease.ports
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log_offset = self._log.tell()
        argv = self.argv()
        crash = self.env.get(CRASH_ENV)
        header = f"--- start {self.starts + 1} at {time.strftime('%FT%T')}: {' '.join(argv)}"
        if crash:
            header += f" (AGENTRUN_CRASH_AT={crash})"
        self._log.write(f"{header}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.process_env(),
            start_new_session=True,  # a Ctrl-C of the test runner is not the operator's
        )
        self.starts += 1
        if not wait_ready:
            return
        try:
            self.wait_ready()
        except OperatorError as e:
            self.kill()
            if port_clash(self._last_start_log()):
                raise _PortTaken(str(e)) from None
            raise

    def _last_start_log(self) -> str:
        """The log of the last start only."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll /healthz until it answers 200; raise :class:`OperatorError` with the log tail
        if the process exits first or ``timeout`` passes."""
        wait_answer(
            lambda: http_answer(self.liveness_url, timeout=2),
            exit_code=lambda: self.returncode,
            timeout=self.ready_timeout if timeout is None else timeout,
            what="the operator",
            where=f"at {self.liveness_url}",
            error=lambda message: OperatorError(f"{message}\n{self.logs()}"),
        )

    def wait_exit(self, timeout: float) -> int:
        """Wait until the process exits by itself (e.g. a crash point fired); its exit code
        (negative: the signal). Raises :class:`OperatorError` after ``timeout``."""
        if self.proc is None:
            raise OperatorError("the operator was never started")
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise OperatorError(
                f"the operator (pid {self.proc.pid}) still runs after {timeout:.0f}s\n{self.logs()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL, like a crash or an OOM kill: no cleanup, no graceful shutdown."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        self._mark("killed (SIGKILL)")
        self._close_log()

    def stop(self) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``stop_timeout``."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._mark(f"did not stop {self.stop_timeout:.0f}s after SIGTERM; SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                proc.wait()
            self._mark(f"stopped (exit code {proc.returncode})")
        self._close_log()

    def restart(
        self, *, env: Mapping[str, str] | None = None, kill: bool = False, wait_ready: bool = True
    ) -> Self:
        """Stop (``kill``: SIGKILL instead of SIGTERM) and start again. ``env`` updates the
        extra environment; an empty value removes that variable (e.g. ``AGENTRUN_CRASH_AT``)."""
        if kill:
            self.kill()
        else:
            self.stop()
        for key, value in (env or {}).items():
            if value == "":
                self.env.pop(key, None)
            else:
                self.env[key] = value
        return self.start(wait_ready=wait_ready)

    # -- logs ---------------------------------------------------------------------------------

    def logs(self, lines: int = 120) -> str:
        """The last ``lines`` lines of the log, with a header saying where and in what state."""
        code = self.returncode
        if self.proc is None:
            state = "never started"
        elif code is None:
            state = f"running, pid {self.proc.pid}"
        else:
            state = f"exited with code {code}"
        return (
            f"--- operator ({state}, {self.starts} start(s)); last lines of {self.log_path}:\n"
            + tail(self.log_path, lines=lines, max_bytes=256 * 1024)
        )

    def log_text(self) -> str:
        """The whole log (all starts)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _mark(self, what: str) -> None:
        if self._log is not None and not self._log.closed:
            self._log.write(f"--- {time.strftime('%FT%T')} {what}\n".encode())
            self._log.flush()

    def _close_log(self) -> None:
        """Close the log and release the ports of a process that no longer runs."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._lease is not None and not self.alive():
            self._lease.release()
            self._lease = None
