"""``agentrun step llm`` as an agent run's executor: every model turn of one run, in one pod
that stays up between them.

A turn's own pod (:mod:`agentrun.pod.llm`) pays a process start and the import of the model
client for one call: about a second and a half of CPU on a 2-core machine, more than a turn
of a quick model takes. The executor pays it once per run. The operator makes it as a Job
of the run (signed, owned, its pod let start as every step's is) whose container runs
``agentrun step llm`` with ``AGENTRUN_EXECUTOR_TOKEN_SHA256`` set. It

1. listens on its own address (``AGENTRUN_POD_IP``, port :data:`agentrun.settings.TURN_PORT`)
   and takes requests that carry the token whose sha256 its Job names (only the operator,
   which holds the signing key, can make it: :func:`agentrun.execution.proof.executor_token`);
2. ``POST /turn``: one attempt of a model turn, once its intent is committed: the attempt's
   name (the Job name it would have had), step, attempt number, turn, idempotency key, and the
   context's parts and digest (checked as a turn's pod checks them). The first request for an
   attempt starts its model call, once; a repeat (an operator restarted mid-turn) is answered
   with the digest taken and changes nothing; a request for an attempt already taken with
   another context is refused (409);
3. ``POST /answer``: the attempt's outcome once its call ended, waiting up to ``wait`` seconds
   for it: the exit code and termination message a turn's pod would have ended with
   (:func:`agentrun.pod.llm.turn_outcome`), which the operator settles the attempt from as
   it settles a step from its pod. The last :data:`REMEMBERED` attempts are remembered, so
   an operator that asks again after a restart gets the same outcome, not a second call;
4. ends (exit code 0) after :data:`IDLE_SECONDS` without a request: a run waiting long (an
   approval, a budget) holds no pod; the operator makes a new executor when a turn comes.

It never runs a tool, as a turn's pod does not. The model settings and the API key are its
Job's, fixed when the operator made it from the run's frozen model.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from agentrun import settings as s
from agentrun.core import naming, pod_env
from agentrun.pod import llm, runner

REMEMBERED = 16
"""Attempts whose outcome is kept (a run's turns come one at a time: the last few are all an
operator may ask for again)."""
IDLE_SECONDS = 3600.0
"""How long the executor waits without a request before it ends."""
MAX_WAIT_SECONDS = 60.0
"""The longest one ``POST /answer`` waits for an outcome (the operator asks again)."""
MAX_REQUEST_BYTES = llm.MAX_REQUEST_BYTES


@dataclass
class Attempt:
    """One attempt taken: its context's digest, and its outcome once the call ended."""

    sha256: str
    done: threading.Event = field(default_factory=threading.Event)
    code: int | None = None
    message: str | None = None

    def answer(self) -> dict[str, Any]:
        if self.code is None:
            return {"taken": self.sha256}
        return {"taken": self.sha256, "exitCode": self.code, "message": self.message}


Call = Callable[[dict[str, str]], tuple[int, str]]
"""``call(env)``: the exit code and termination message of the turn ``env`` describes."""


class Turns:
    """What the executor accepts (see the module's doc), safe across threads; each call runs
    in a thread of its own."""

    def __init__(self, env: Mapping[str, str], token_sha256: str, call: Call) -> None:
        self.env = dict(env)
        self.token_sha256 = token_sha256
        self.call = call
        self.last_request = time.monotonic()
        self._lock = threading.Lock()
        self._attempts: OrderedDict[str, Attempt] = OrderedDict()

    def _authorized(self, request: Mapping[str, Any]) -> bool:
        return llm.token_matches(str(request.get("token", "")), self.token_sha256)

    def take(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /turn``: HTTP status and answer."""
        try:
            request = json.loads(body)
            name = str(request["job"])
            step = str(request["step"])
            attempt = int(request["attempt"])
            turn = int(request["turn"])
            parts = [str(p) for p in request["parts"]]
            digest = str(request["sha256"])
            key = str(request["idempotencyKey"])
        except (ValueError, KeyError, TypeError):
            return 400, {
                "error": "not a turn's request (token, job, step, attempt, turn, parts, "
                "sha256, idempotencyKey)"
            }
        if not self._authorized(request):
            return 403, {"error": "the token is not this executor's"}
        if naming.sha256_text("".join(parts)) != digest:
            return 400, {"error": "the parts do not match their sha256"}
        with self._lock:
            self.last_request = time.monotonic()
            known = self._attempts.get(name)
            if known is not None and known.sha256 != digest:
                return 409, {"taken": known.sha256}
            if known is not None:
                return 200, known.answer()
            taken = Attempt(digest)
            self._attempts[name] = taken
            while len(self._attempts) > REMEMBERED:
                self._attempts.popitem(last=False)
        more = {pod_env.ENV_TURN: str(turn), s.ENV_STEP: step, s.ENV_ATTEMPT: str(attempt)}
        env = llm.request_env(self.env, parts, digest, key, **more)
        threading.Thread(
            target=self._run, args=(taken, env), name=f"turn-{name}", daemon=True
        ).start()
        return 202, {"taken": digest}

    def _run(self, taken: Attempt, env: dict[str, str]) -> None:
        try:
            code, message = self.call(env)
        except Exception as error:  # the call says why in one line, whatever went wrong
            code, message = 1, f"the turn failed: {type(error).__name__}: {error}"[:1024]
        taken.code, taken.message = code, message
        taken.done.set()

    def answer(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /answer``: HTTP status and answer, once the attempt's call ended or
        ``wait`` seconds passed."""
        try:
            request = json.loads(body)
            name = str(request["job"])
            wait = min(max(float(request.get("wait", 0)), 0.0), MAX_WAIT_SECONDS)
        except (ValueError, KeyError, TypeError):
            return 400, {"error": "not an answer's request (token, job, wait)"}
        if not self._authorized(request):
            return 403, {"error": "the token is not this executor's"}
        with self._lock:
            self.last_request = time.monotonic()
            known = self._attempts.get(name)
        if known is None:
            return 404, {"error": f"no attempt {name} was taken here"}
        known.done.wait(wait)
        return (200 if known.code is not None else 202), known.answer()

    def idle_for(self) -> float:
        with self._lock:
            busy = any(a.code is None for a in self._attempts.values())
            return 0.0 if busy else time.monotonic() - self.last_request


def turn_call(
    client_factory: Callable[[str, str], Any] = llm.default_client,
    store_factory: runner.StoreFactory = runner.default_store,
) -> Call:
    """What the executor runs for an attempt: the turn as a turn's pod runs it
    (:func:`agentrun.pod.llm.turn_outcome`), with a result an earlier pod of the same
    attempt stored reported again instead."""

    def call(env: dict[str, str]) -> tuple[int, str]:
        store, replay = runner.stored_before(env, store_factory)
        if replay is not None:
            return 0, json.dumps(replay)
        return llm.turn_outcome(env, store, client_factory)

    return call


def serve(
    env: dict[str, str] | None = None,
    client_factory: Callable[[str, str], Any] | None = None,
    port: int = s.TURN_PORT,
    idle_seconds: float = IDLE_SECONDS,
    store_factory: runner.StoreFactory = runner.default_store,
) -> int:
    """Serve the run's turns until idle for ``idle_seconds``; the exit code. The client is
    made once, while the first request may already be taken."""
    env = dict(os.environ if env is None else env)
    factory = client_factory
    if factory is None:
        client: list[Any] = []

        def factory(base_url: str, key: str) -> Any:
            if not client:
                client.append(llm.default_client(base_url, key))
            return client[0]

    turns = Turns(env, env[s.ENV_EXECUTOR_TOKEN_SHA256], turn_call(factory, store_factory))
    routes = {"/turn": turns.take, "/answer": turns.answer}
    server = ThreadingHTTPServer(
        (env.get(s.ENV_POD_IP) or "0.0.0.0", port), llm.json_handler(routes, "agentrun executor")
    )
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(llm.POLL_SECONDS,), daemon=True).start()
    print(f"agentrun executor: taking the run's turns on {server.server_address}")
    import httpx  # noqa: F401 - loaded while the first request may already wait
    import openai  # noqa: F401

    try:
        base_url = env.get(pod_env.ENV_MODEL_BASE_URL, "")
        if base_url:
            factory(base_url, env.get(pod_env.ENV_MODEL_API_KEY) or llm.NO_KEY)
    except Exception:  # the first turn says what is wrong with the settings
        pass
    try:
        while turns.idle_for() < idle_seconds:
            time.sleep(min(1.0, idle_seconds))
    finally:
        server.shutdown()
    print(f"agentrun executor: no request for {idle_seconds:.0f} s: ending")
    return 0


def main(argv: list[str]) -> int:
    """``agentrun step llm`` with ``AGENTRUN_EXECUTOR_TOKEN_SHA256`` set: :func:`serve`."""
    if argv:
        print("usage: agentrun step llm (no arguments; see its --help)", file=sys.stderr)
        return 2
    llm.end(serve())
