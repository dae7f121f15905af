"""A scripted model in a process of its own: ``python -m tests.support.model_process --port P
--log FILE --responder MODULE:NAME``.

For tests whose own process is too busy to answer a model turn in time: many threads that
poll the API server and parse large runs hold the interpreter's lock, and a server thread in
the same process then answers after minutes on a loaded machine. The process serves
:class:`agentrun_devcluster.modelserver.ScriptedModel` with the named responder and appends
every request it received to ``FILE`` (JSON lines), which :class:`ModelProcess` reads back.
"""

from __future__ import annotations

import argparse
import importlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentrun_devcluster.modelserver import Recorded, ScriptedModel
from agentrun_devcluster.ports import PortLease, lease_ports
from agentrun_devcluster.testing import wait_for

REPO = Path(__file__).resolve().parents[2]


class ModelProcess:
    """The model server as a child process on a leased port (a context manager)."""

    def __init__(self, responder: str, log: Path) -> None:
        self.responder = responder
        self.log = log
        self.lease: PortLease | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ModelProcess:
        self.lease = lease_ports(1)
        self.port = self.lease.port
        command = [sys.executable, "-m", "tests.support.model_process", "--port", str(self.port)]
        command += ["--log", str(self.log), "--responder", self.responder]
        self.proc = subprocess.Popen(command, cwd=REPO)
        wait_for(f"the model server on port {self.port}", self._listening, timeout=60)
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the model server exited with {self.proc.returncode}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def __exit__(self, *_: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        if self.lease is not None:
            self.lease.release()

    def completions(self) -> list[Recorded]:
        """The chat completion requests received so far (as logged, within 0.2 s)."""
        if not self.log.exists():
            return []
        found = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [
            Recorded(r["path"], r["body"], r["authorization"], r["method"])
            for r in found
            if r["method"] == "POST" and str(r["path"]).endswith("/chat/completions")
        ]


def _serve(port: int, log: Path, responder: str) -> None:
    module, _, name = responder.partition(":")
    respond: Any = getattr(importlib.import_module(module), name)
    with ScriptedModel(responder=respond, port=port) as model, log.open("a") as out:
        written = 0
        while True:
            seen = model.received()
            for r in seen[written:]:
                line = {"path": r.path, "body": r.body, "authorization": r.authorization,
                        "method": r.method}  # fmt: skip
                out.write(json.dumps(line) + "\n")
            out.flush()
            written = len(seen)
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.model_process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--responder", required=True, help="MODULE:NAME of the responder")
    args = parser.parse_args(argv)
    _serve(args.port, args.log, args.responder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
