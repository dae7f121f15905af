"""One container of a pod, run as a local process by the local node.

* **No images.** ``image`` is recorded in the status and otherwise ignored; a container runs
  its ``command`` + ``args`` as a local process found on the node process's ``PATH``. A
  container without ``command`` fails with reason ``NoCommand``.
* **No isolation.** Processes run as the node's user, on the host's filesystem, network and
  PID namespace, without resource limits (``resources`` only feeds ``resourceFieldRef``).
  Each container is its own process group, so signals reach the processes it starts, and
  whatever it leaves behind in its group is killed when it exits.
* **Command line.** ``$(VAR)`` references in ``command`` and ``args`` are expanded (see
  :func:`agentrun_devcluster.podenv.expand_vars`), then literal occurrences of paths the
  container would find mounted (its termination message path, the service-account token
  mount) are replaced with the local files standing in for them.

Termination messages: a process cannot write ``/dev/termination-log``, so each container
gets a private file. Literal occurrences of the container's ``terminationMessagePath`` in
``command`` and ``args`` are replaced with that file's path, and the path is exported as
``AGENTRUN_TERMINATION_MESSAGE_PATH``. After exit up to the last 4096 bytes are reported
as ``state.terminated.message``; with ``terminationMessagePolicy: FallbackToLogsOnError``
an empty file on failure falls back to the tail of the container's output (80 lines,
2048 bytes), like a kubelet.

Environment of a container process: only ``PATH`` (and ``HOME``, ``LANG``, ``TZ``,
``TMPDIR`` when set) from the node process, plus ``HOSTNAME`` (the pod name),
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` (only with the token volume; the
container's own env wins over them), the container's own env,
``AGENTRUN_TERMINATION_MESSAGE_PATH`` and ``AGENTRUN_SERVICEACCOUNT_DIR`` (only with the
token volume); :func:`process_env` layers them in that order. The working directory is
``workingDir`` if that exists here, else the pod's state directory. Output (stdout and
stderr merged) goes to ``<state_dir>/pods/<namespace>_<name>_<uid>/<container>.log``; it is
not served through the ``pods/log`` API.

Exec: a command exec'd into a running container (``pods/exec``, served by
:mod:`agentrun_devcluster.streaming`) runs as a process of its own with the container's
environment (:class:`ExecContext`: the one :func:`process_env` gave it) and working directory,
its command line with the same paths mapped (so it writes the container's termination message
where the container would); ``pods/attach`` follows the container's output file.

Killing: :func:`terminate` (:func:`agentrun_devcluster.runtime.terminate`, the same for
both runtimes) sends SIGTERM to the running containers' process groups and SIGKILL once the
grace period is over; a container killed for the pod's deadline reports reason
``DeadlineExceeded``, and a process killed by signal N exits with code 128+N.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .kubeapi import JSON, now_rfc3339
from .podenv import expand_vars
from .runtime import Container, PodContext, terminate
from .serviceaccount import SERVICEACCOUNT_DIR_ENV

__all__ = [
    "DEFAULT_TERMINATION_MESSAGE_PATH",
    "PASSTHROUGH_ENV",
    "TERMINATION_MESSAGE_ENV",
    "ContainerProcess",
    "ExecContext",
    "ProcessRuntime",
    "container_argv",
    "exit_code_of",
    "failed_state",
    "process_env",
    "read_termination_message",
    "tail_bytes",
    "terminate",
    "working_dir",
]

TERMINATION_MESSAGE_ENV = "AGENTRUN_TERMINATION_MESSAGE_PATH"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
START_ERROR_EXIT_CODE = 128
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")

log = logging.getLogger(__name__)


def tail_bytes(path: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of a file (empty if it cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read()
    except OSError:
        return b""


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a container exit code (killed by signal N -> 128+N)."""
    return returncode if returncode >= 0 else 128 - returncode


def read_termination_message(
    message_file: Path, log_file: Path, *, policy: str, failed: bool
) -> str:
    """What a kubelet would report as ``state.terminated.message``."""
    data = tail_bytes(message_file, MAX_TERMINATION_MESSAGE)
    if not data.strip() and failed and policy == "FallbackToLogsOnError":
        lines = tail_bytes(log_file, 64 * 1024).splitlines(keepends=True)
        data = b"".join(lines[-FALLBACK_LOG_LINES:])[-FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", "replace")


def container_argv(spec: JSON, env: Mapping[str, str], paths: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` of container ``spec`` with ``$(VAR)`` expanded from ``env``, then
    literal occurrences of each key of ``paths`` (in order) replaced with its value."""
    argv = [str(x) for x in (spec.get("command") or []) + (spec.get("args") or [])]
    argv = [expand_vars(x, env) for x in argv]
    for container_path, local_path in paths.items():
        argv = [x.replace(container_path, local_path) for x in argv]
    return argv


def process_env(*layers: Mapping[str, str]) -> dict[str, str]:
    """The environment of a container process: :data:`PASSTHROUGH_ENV` from this process,
    then each of ``layers`` in order (a later layer wins)."""
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    for layer in layers:
        env.update(layer)
    return env


def failed_state(reason: str, message: str, exit_code: int, *, started_at: str) -> JSON:
    """The ``terminated`` state of a container that failed without running to an exit of its
    own (``StartError``, ``NoCommand``, ...): it finished now, and started at ``started_at``
    or, if it never started, now too."""
    t = now_rfc3339()
    return {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "message": message,
            "startedAt": started_at or t,
            "finishedAt": t,
        }
    }


def working_dir(spec: JSON, default: Path) -> Path:
    """``workingDir`` of container ``spec`` if that directory exists here, else ``default``."""
    wanted = spec.get("workingDir")
    return Path(wanted) if wanted and Path(wanted).is_dir() else default


@dataclass(frozen=True)
class ExecContext:
    """How a command exec'd into a running container of the process runtime runs: with the
    container's environment, working directory and path mappings (container path -> local
    file, applied to the command line as at launch, after no ``$(VAR)`` expansion: a kubelet
    does none for exec); ``log_path`` is the container's output, for attach, and ``running``
    whether the container still runs."""

    env: Mapping[str, str]
    cwd: Path
    paths: Mapping[str, str]
    log_path: Path
    running: Callable[[], bool]

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` with the container's paths mapped to the local files."""
        argv = [str(x) for x in command]
        for container_path, local_path in self.paths.items():
            argv = [x.replace(container_path, local_path) for x in argv]
        return argv


@dataclass
class ContainerProcess:
    """One container of a pod, and what has happened to it so far."""

    spec: JSON
    kind: str  # "init" or "regular"
    pod_dir: Path
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    kill_reason: str = ""
    ctx: PodContext | None = None  # the pod, for :meth:`launch`
    exec_context: ExecContext | None = None  # set by :meth:`launch`, for pods/exec
    _log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.kind == "init" and self.spec.get("restartPolicy") == "Always"

    @property
    def log_path(self) -> Path:
        return self.pod_dir / f"{self.name}.log"

    @property
    def message_path(self) -> Path:
        return self.pod_dir / f"{self.name}.termination-log"

    @property
    def termination_message_path(self) -> str:
        """Where the container expects to write its termination message."""
        return str(self.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH)

    @property
    def terminated(self) -> bool:
        return "terminated" in self.state

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.terminated

    @property
    def ready(self) -> bool:
        """No probes here: a running process is ready."""
        return self.running

    def container_id(self, pod_uid: str) -> str:
        return f"agentrun-local://{pod_uid}/{self.name}"

    def status(self, pod_uid: str) -> JSON:
        status: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.running,
            "started": self.running,
            "restartCount": 0,
            "state": self.state,
        }
        if self.started_at:
            status["containerID"] = self.container_id(pod_uid)
        return status

    def fail(self, reason: str, message: str, exit_code: int = START_ERROR_EXIT_CODE) -> None:
        self.state = failed_state(reason, message, exit_code, started_at=self.started_at)

    def fail_without_command(self) -> bool:
        """Fail with ``NoCommand`` if the container has no command; True if it had none."""
        if self.spec.get("command"):
            return False
        self.fail(
            "NoCommand",
            "the agentrun local node runs commands, not images: container "
            f"{self.name!r} (image {self.spec.get('image', '')!r}) has no command",
        )
        return True

    def pull(self) -> tuple[str, str] | None:
        """No images: a container without a command fails (``NoCommand``) instead."""
        self.fail_without_command()
        return None

    def service_env(self, sa_env: Mapping[str, str]) -> dict[str, str]:
        """``KUBERNETES_SERVICE_*``, only with the token volume."""
        return {k: v for k, v in sa_env.items() if k != SERVICEACCOUNT_DIR_ENV}

    def launch(self, sa_env: Mapping[str, str], env: Mapping[str, str]) -> None:
        """Start the process for the pod of :attr:`ctx`: its command line with container
        paths mapped to local files, its environment layered by :func:`process_env`."""
        ctx = self.ctx
        if ctx is None:
            raise ValueError(f"container {self.name}: launch() needs the pod context")
        service_env = self.service_env(sa_env)
        paths = {self.termination_message_path: str(self.message_path)}
        paths.update(ctx.token_volume.path_map(self.spec))
        argv = container_argv(self.spec, {**service_env, **env}, paths)
        proc_env = process_env(
            ctx.container_env(service_env, env),
            {TERMINATION_MESSAGE_ENV: str(self.message_path)},
            {k: v for k, v in sa_env.items() if k == SERVICEACCOUNT_DIR_ENV},
        )
        log.info("pod %s/%s: starting %s: %s", ctx.namespace, ctx.name, self.name, argv)
        cwd = working_dir(self.spec, self.pod_dir)
        self.exec_context = ExecContext(
            env=proc_env,
            cwd=cwd,
            paths=paths,
            log_path=self.log_path,
            running=lambda: self.running,
        )
        self.start(argv, proc_env, cwd)

    def start(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        """Start the process (an empty termination message file first); a failure to start
        terminates the container with reason ``StartError``."""
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self.message_path.write_bytes(b"")
        self._log = self.log_path.open("ab")
        self.started_at = now_rfc3339()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                process_group=0,  # the container is a process group: signals reach children
            )
        except OSError as e:
            self.close_log()
            msg = (
                f'exec: "{argv[0]}": executable file not found in $PATH'
                if isinstance(e, FileNotFoundError)
                else f"failed to start {argv[0]!r}: {e}"
            )
            self.fail("StartError", msg)
            return
        self.state = {"running": {"startedAt": self.started_at}}

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def poll(self) -> bool:
        """Record the exit if the process has exited; True once terminated."""
        if self.terminated:
            return True
        if self.proc is None:
            return False
        rc = self.proc.poll()
        if rc is None:
            return False
        # Reap anything the container left behind in its group.
        self.signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.close_log()
        code = exit_code_of(rc)
        message = read_termination_message(
            self.message_path,
            self.log_path,
            policy=str(self.spec.get("terminationMessagePolicy", "File")),
            failed=code != 0,
        )
        reason = self.kill_reason or ("Completed" if code == 0 else "Error")
        terminated: JSON = {
            "exitCode": code,
            "reason": reason,
            "startedAt": self.started_at,
            "finishedAt": now_rfc3339(),
        }
        if rc < 0:
            terminated["signal"] = -rc
        if message:
            terminated["message"] = message
        self.state = {"terminated": terminated}
        return True

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def wait_exit(self, timeout: float) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)

    def release(self) -> None:
        self.signal(signal.SIGKILL)
        self.close_log()

    # Never restarted (the process runtime treats every restartPolicy as Never).
    def schedule_restart(self, delay: float) -> None:
        raise NotImplementedError("the process runtime does not restart containers")

    def restart_due(self) -> bool:
        return False

    def cancel_restart(self) -> None:
        pass


class ProcessRuntime:
    """The process runtime: containers as local processes (see the module doc)."""

    name = "process"
    version = "agentrun-local://0"
    restarts = False

    def container(self, spec: JSON, kind: str, ctx: PodContext) -> Container:
        return ContainerProcess(spec, kind, ctx.pod_dir, ctx=ctx)

    def token_file_mode(self, volume: JSON) -> int | None:
        return None

    def pod_finished(self, ctx: PodContext) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
