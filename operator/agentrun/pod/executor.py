"""``agentrun step llm`` as an agent run's executor: every model turn of one run, and the
calls of its MCP servers' tools, in one pod that stays up between them.

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

A ``POST /turn`` with ``program`` :data:`MCP_CALL` is an attempt of a call of an MCP server's
tool instead (taken, remembered and answered the same way): its step's variables
(``env``, only those :data:`CALL_ENV` names) and, for each header, the name of this pod's
variable holding that header's Secret value (``secretEnv``; its Job takes every header
Secret of the run's MCP servers, :func:`agentrun.core.turns.executor_secret_env`), with their
sha256; it runs as ``agentrun step mcp call`` would in a pod of its own
(:func:`agentrun.pod.mcp.outcome`), stopped after the request's ``timeoutSeconds``. With
``program`` :data:`MCP_DISCOVER` it is the discovery of a server's tools, before the run's
first turn (its ``env`` only the server's entry, :data:`DISCOVER_ENV`), run as ``agentrun step
mcp discover`` would. With ``program`` :data:`HTTP_CALL` it is a call of an HTTP tool (its
``env`` the tool's entry and the call's variables, :data:`HTTP_CALL_ENV`, its ``secretEnv``
the tool's headers from Secrets), run as ``agentrun step http`` would
(:func:`agentrun.pod.http_tool.outcome`).

It never runs a container tool. The model settings and the API key are its Job's, fixed when
the operator made it from the run's frozen model (its fallbacks too, each with the variable of
its own key: a turn asks them in order as a turn's pod does, with one client per model kept
between turns); the header Secrets its Job's, from the run's MCP servers and HTTP tools (fixed
at creation, as the model is). A call's environment holds none of the models' keys.
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
from agentrun.core import executor as core_executor
from agentrun.core import naming, pod_env
from agentrun.core.executor import call_digest
from agentrun.pod import http_tool, llm, mcp, model_call, runner

REMEMBERED = 64
"""Attempts whose outcome is kept (a run's turns come one at a time, each with at most a few
calls: the last ones are all an operator may ask for again)."""
MCP_CALL = core_executor.MCP_CALL
"""The program of a request for a call of an MCP server's tool (none: a model turn)."""
MCP_DISCOVER = core_executor.MCP_DISCOVER
"""The program of a request for the discovery of an MCP server's tools."""
HTTP_CALL = core_executor.HTTP_CALL
"""The program of a request for a call of an HTTP tool."""
DISCOVER_ENV = frozenset({mcp.ENV_SERVER})
"""The variables of a discovery's step a request may set
(:func:`agentrun.core.turn_steps.discovery_step_of`)."""
CALL_ENV = frozenset(
    {
        mcp.ENV_SERVER,
        mcp.ENV_PINNED,
        pod_env.ENV_TOOL_ARGS,
        pod_env.ENV_TOOL_NAME,
        pod_env.ENV_TOOL_CALL_ID,
        pod_env.ENV_TURN,
    }
)
"""The variables of a call's step a request may set
(:func:`agentrun.core.turn_steps.mcp_call_step`)."""
HTTP_CALL_ENV = frozenset(
    {
        pod_env.ENV_HTTP_TOOL,
        pod_env.ENV_TOOL_ARGS,
        pod_env.ENV_TOOL_NAME,
        pod_env.ENV_TOOL_CALL_ID,
        pod_env.ENV_TURN,
    }
)
"""The variables of an HTTP call's step a request may set
(:func:`agentrun.core.turn_steps.http_call_step`)."""
ENV_CALL_TIMEOUT = pod_env.ENV_CALL_TIMEOUT
"""A call's limit as the executor passes it on (the request's ``timeoutSeconds``)."""
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

    def __init__(
        self,
        env: Mapping[str, str],
        token_sha256: str,
        call: Call,
        mcp_call: Call | None = None,
        mcp_discover: Call | None = None,
        http_call: Call | None = None,
    ) -> None:
        self.env = dict(env)
        self.token_sha256 = token_sha256
        self.call = call
        self.mcp_call = mcp_call
        self.mcp_discover = mcp_discover
        self.http_call = http_call
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
            digest = str(request["sha256"])
            key = str(request["idempotencyKey"])
            program = str(request.get("program") or "")
        except (ValueError, KeyError, TypeError, AttributeError):
            return 400, {
                "error": "not a turn's request (token, job, step, attempt, sha256, "
                "idempotencyKey, and a turn's parts or a call's env)"
            }
        if not self._authorized(request):
            return 403, {"error": "the token is not this executor's"}
        ids = {s.ENV_STEP: step, s.ENV_ATTEMPT: str(attempt)}
        if program == MCP_CALL and self.mcp_call is not None:
            env_or_error = self._call_env(request, digest, key, ids, CALL_ENV)
            call = self.mcp_call
        elif program == MCP_DISCOVER and self.mcp_discover is not None:
            env_or_error = self._call_env(request, digest, key, ids, DISCOVER_ENV)
            call = self.mcp_discover
        elif program == HTTP_CALL and self.http_call is not None:
            env_or_error = self._call_env(
                request, digest, key, ids, HTTP_CALL_ENV, pod_env.ENV_HTTP_HEADER
            )
            call = self.http_call
        elif not program:
            env_or_error = self._turn_env(request, digest, key, ids)
            call = self.call
        else:
            return 400, {"error": f"this executor runs no program {program!r}"}
        if isinstance(env_or_error, str):
            return 400, {"error": env_or_error}
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
        threading.Thread(
            target=self._run, args=(taken, call, env_or_error), name=f"turn-{name}", daemon=True
        ).start()
        return 202, {"taken": digest}

    def _turn_env(
        self, request: Mapping[str, Any], digest: str, key: str, ids: dict[str, str]
    ) -> dict[str, str] | str:
        """A model turn's environment, or why the request is not one."""
        try:
            turn = int(request["turn"])
            parts = [str(p) for p in request["parts"]]
        except (ValueError, KeyError, TypeError):
            return "a model turn's request needs its turn and the context's parts"
        if naming.sha256_text("".join(parts)) != digest:
            return "the parts do not match their sha256"
        return llm.request_env(self.env, parts, digest, key, **ids, **{pod_env.ENV_TURN: str(turn)})

    def _call_env(
        self,
        request: Mapping[str, Any],
        digest: str,
        key: str,
        ids: dict[str, str],
        allowed: frozenset[str],
        headers: str = mcp.ENV_HEADER,
    ) -> dict[str, str] | str:
        """The environment of a call of an MCP server's tool, a discovery of its tools or a
        call of an HTTP tool (as its own pod would have had it), or why the request is not
        one: only the variables such a step has (``allowed``), and for those from a Secret
        (named ``headers`` and an index), a variable of this pod holding that Secret's
        value."""
        plain, secret = request.get("env"), request.get("secretEnv")
        if not (isinstance(plain, dict) and isinstance(secret, dict)):
            return "a call's request needs its env and secretEnv"
        if call_digest(plain, secret) != digest:
            return "the call's env does not match its sha256"
        env = {**self.env, **ids, s.ENV_IDEMPOTENCY_KEY: key}
        for name in [n for n in env if model_call.is_key_env(n)]:
            env.pop(name)  # the call has no use for the models' keys
        timeout = request.get("timeoutSeconds")
        if isinstance(timeout, int) and timeout > 0:
            env[ENV_CALL_TIMEOUT] = str(timeout)
        for name, value in plain.items():
            if name not in allowed or not isinstance(value, str):
                return f"a call's env may not set {name}"
            env[name] = value
        for name, source in secret.items():
            held = (
                self.env.get(str(source))
                if str(source).startswith(pod_env.ENV_EXECUTOR_SECRET)
                else None
            )
            if not str(name).startswith(headers) or held is None:
                return f"this executor holds no Secret value for {name} ({source})"
            env[str(name)] = held
        return env

    def _run(self, taken: Attempt, call: Call, env: dict[str, str]) -> None:
        try:
            code, message = call(env)
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


def _attempt(
    outcome: Callable[[dict[str, str], runner.ResultStore | None], tuple[int, str]],
    store_factory: runner.StoreFactory,
) -> Call:
    """``outcome`` of an attempt, with the store its large result goes to. Nothing found in
    the namespace is taken as an attempt's outcome: a ConfigMap under its result name was not
    necessarily written by the executor (:mod:`agentrun.pod.runner`)."""

    def call(env: dict[str, str]) -> tuple[int, str]:
        return outcome(env, runner.store_for(env, store_factory))

    return call


def turn_call(
    client_factory: Callable[[str, str], Any] = model_call.default_client,
    store_factory: runner.StoreFactory = runner.default_store,
) -> Call:
    """What the executor runs for a model turn's attempt: the turn as a turn's pod runs it
    (:func:`agentrun.pod.llm.turn_outcome`)."""

    def outcome(env: dict[str, str], store: runner.ResultStore | None) -> tuple[int, str]:
        return llm.turn_outcome(env, store, client_factory)

    return _attempt(outcome, store_factory)


def mcp_call(
    connect: mcp.Connect = mcp.connect_http,
    store_factory: runner.StoreFactory = runner.default_store,
) -> Call:
    """What the executor runs for a call of an MCP server's tool: the call as its own pod
    runs it (:func:`agentrun.pod.mcp.outcome`), stopped after the request's
    ``timeoutSeconds``."""

    def outcome(env: dict[str, str], store: runner.ResultStore | None) -> tuple[int, str]:
        limit = env.get(ENV_CALL_TIMEOUT)
        timeout = float(limit) if limit else None
        return mcp.outcome("call", env, store, connect, timeout)

    return _attempt(outcome, store_factory)


def mcp_discover(
    connect: mcp.Connect = mcp.connect_http,
    store_factory: runner.StoreFactory = runner.default_store,
) -> Call:
    """What the executor runs for the discovery of an MCP server's tools: as its own pod
    runs it (:func:`agentrun.pod.mcp.outcome`), stopped after the request's
    ``timeoutSeconds`` (the server's, which is the deadline of a discovery's Job)."""

    def outcome(env: dict[str, str], store: runner.ResultStore | None) -> tuple[int, str]:
        limit = env.get(ENV_CALL_TIMEOUT)
        return mcp.outcome("discover", env, store, connect, float(limit) if limit else None)

    return _attempt(outcome, store_factory)


def http_call(store_factory: runner.StoreFactory = runner.default_store) -> Call:
    """What the executor runs for a call of an HTTP tool: the request as its own pod makes it
    (:func:`agentrun.pod.http_tool.outcome`), within the request's ``timeoutSeconds``."""

    def outcome(env: dict[str, str], store: runner.ResultStore | None) -> tuple[int, str]:
        return http_tool.outcome(env, store)

    return _attempt(outcome, store_factory)


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
    factory = client_factory or llm.reusing(model_call.default_client)  # one client a model

    turns = Turns(
        env,
        env[s.ENV_EXECUTOR_TOKEN_SHA256],
        turn_call(factory, store_factory),
        mcp_call(store_factory=store_factory),
        mcp_discover(store_factory=store_factory),
        http_call(store_factory),
    )
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
            factory(base_url, env.get(pod_env.ENV_MODEL_API_KEY) or model_call.NO_KEY)
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
