"""``agentrun step llm``: one model turn of an agent run, inside its step's pod.

The operator runs it as the step ``t{turn}-model`` in its own image. It

1. takes the context the operator assembled for the turn. The operator's Jobs give it by
   request (:func:`serve`): the pod starts before its turn does (the operator creates the
   next turn's Job while the tools of the current one run), listens on its own address
   (``AGENTRUN_POD_IP``, port :data:`agentrun.settings.TURN_PORT`) and takes the first
   request that carries the one-time token whose sha256 its Job names
   (``AGENTRUN_TURN_TOKEN_SHA256``): the parts of the context document, their digest and the
   turn's idempotency key. Run by hand, without that variable, it reads them from
   ``AGENTRUN_CONTEXT_PART_0`` ..., ``AGENTRUN_CONTEXT_SHA256`` and
   ``AGENTRUN_IDEMPOTENCY_KEY``. Either way the parts are checked against the digest (see
   :mod:`agentrun.core.context`);
2. calls the model once with the official ``openai`` client: ``OpenAI(base_url=
   $AGENTRUN_MODEL_BASE_URL, api_key=$AGENTRUN_MODEL_API_KEY)``, posting the chat completion
   request (``model``, ``messages``, ``tools``, ``max_tokens``, ...) to ``/chat/completions``
   with the client's own ``post``, as its ``chat.completions.create`` does, with no retries
   of its own (retries are the operator's: ``spec.agent.model.retry``), except that a 429's
   Retry-After is waited for within the turn's patience, and that a model that is
   unavailable (5xx, no connection, no answer in time, a 429 past that patience) makes the
   next of ``spec.agent.model.fallbacks`` asked, each with its own key
   (``AGENTRUN_MODEL_FALLBACK_1_API_KEY``, ...; :mod:`agentrun.pod.model_call`). Not through
   ``client.chat``: its first use imports every API resource module of the SDK (0.4 to 0.6 s
   of CPU, a third of what the pod spent starting), and the answer is read here anyway;
3. writes the turn's output as the step's result envelope, as ``agentrun step --`` does: the
   assistant message's content, the proposed tool calls (id, name, arguments), the finish
   reason and the token usage (``usage.tokens``: prompt plus completion, which the token budget
   counts). An envelope too large for the termination message goes to a ConfigMap of the run
   (the pod's ServiceAccount must be allowed to create one, as for ``agentrun step --``).

It never runs a tool: the operator validates the proposed calls and runs them as steps.

A usage count the endpoint did not report is estimated
(:func:`~agentrun.pod.model_call.estimated`) and named in the output, so that the operator
counts it against the budget and says so; a negative one fails the turn. With ``tool_choice``
``required`` or a tool's name, an answer without a call of it fails the turn
(:func:`~agentrun.pod.model_call.check_tool_choice`).

A turn fails (exit code 1) with one line as the termination message, which begins with its
reason, one of :data:`agentrun.api.names.TURN_FAILURES` (``ModelUnreachable: the model endpoint
... cannot be reached: ...``; the operator takes the reason from there), when the context cannot
be read, the API key cannot be sent, the endpoint cannot be reached, answers with an error
status or with something that is not a chat completion, or ignores the tool choice. The API key
is never printed (:func:`~agentrun.pod.model_call.api_key`, and a message that quotes it has it
replaced).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

from agentrun import settings as s
from agentrun.api import names
from agentrun.core import context as cx
from agentrun.core import naming, pod_env
from agentrun.core.envelope import MAX_INFLATED_RESULT as MAX_OUTPUT_BYTES
from agentrun.core.envelope import RESULT_Z, compress_result
from agentrun.pod import runner
from agentrun.pod.model_call import (
    NO_KEY,
    TurnFailed,
    _one_line,
    api_keys,
    call_model,
    default_client,
    models_of,
    redacted,
)


def read_context(env: Mapping[str, str]) -> cx.Context:
    """The context document from the environment, checked against its digest."""
    try:
        count = int(env.get(pod_env.ENV_CONTEXT_PARTS, ""))
    except ValueError:
        raise TurnFailed(
            names.TURN_CONTEXT_INVALID,
            f"{pod_env.ENV_CONTEXT_PARTS} is not set: this command runs as a model turn of an "
            "agent run, which the operator starts",
        ) from None
    parts = []
    for i in range(count):
        name = f"{pod_env.ENV_CONTEXT_PART}{i}"
        if name not in env:
            raise TurnFailed(
                names.TURN_CONTEXT_INVALID,
                f"{name} (part {i + 1} of {count} of the context) is not set",
            )
        parts.append(env[name])
    text = "".join(parts)
    expected = env.get(pod_env.ENV_CONTEXT_SHA256, "")
    if naming.sha256_text(text) != expected:
        raise TurnFailed(
            names.TURN_CONTEXT_INVALID,
            "the context does not match the digest the operator committed "
            f"({expected[:12] or 'none'}): its ConfigMap was changed",
        )
    doc = cx.Context.from_parts(parts)
    if isinstance(doc, str):
        raise TurnFailed(names.TURN_CONTEXT_INVALID, doc)
    return doc


def envelope(output: cx.Output) -> dict[str, Any]:
    return {
        "ok": True,
        "summary": cx.output_summary(output),
        "result": cx.output_result(output),
        "usage": {"tokens": output.prompt_tokens + output.completion_tokens},
    }


def _fail(termination: Path, reason: str, message: str) -> int:
    code, text = _failed(reason, message)
    termination.write_text(text)
    return code


def _failed(reason: str, message: str, keys: Sequence[str] = ()) -> tuple[int, str]:
    """A failed turn's exit code and termination message, one line that begins with its
    reason (``ModelUnreachable: the model endpoint ...``: the operator takes the reason from
    it), said on stderr too. ``keys``, the API keys of its models, are never in it, whatever an
    error quoted."""
    message = redacted(message, [key for key in keys if key and key != NO_KEY])
    text = f"{reason}: {message}"
    print(f"agentrun step llm: {text}", file=sys.stderr)
    return 1, _one_line(text, runner.TERMINATION_LIMIT // 4)


def inline_text(body: Mapping[str, Any]) -> str:
    """The envelope as the termination message carries it: as it is when it fits
    :data:`agentrun.pod.runner.INLINE_LIMIT`, else with its result compressed
    (``resultZ``, see :mod:`agentrun.core.envelope`); too long for the termination message
    when longer than :data:`agentrun.pod.runner.TERMINATION_LIMIT`."""
    text = json.dumps(body, separators=(",", ":"))
    if len(text.encode()) <= runner.INLINE_LIMIT:
        return text
    full = naming.canonical_json(body["result"])
    packed = {k: v for k, v in body.items() if k != "result"}
    packed[RESULT_Z] = compress_result(full)
    return json.dumps(packed, separators=(",", ":"))


def run_turn(
    env: dict[str, str] | None = None,
    client_factory: Callable[[str, str], Any] = default_client,
    store_factory: Callable[
        [runner.StepIdentity, dict[str, str]], runner.ResultStore | None
    ] = runner.default_store,
) -> int:
    """One model turn; its exit code. Its outcome is the termination message
    (:func:`turn_outcome`)."""
    env = dict(os.environ if env is None else env)
    attempt = runner.begin(env, store_factory)
    code, text = turn_outcome(env, attempt.store, client_factory)
    attempt.termination.write_text(text)
    return code


def turn_outcome(
    env: Mapping[str, str],
    store: runner.ResultStore | None,
    client_factory: Callable[[str, str], Any] = default_client,
) -> tuple[int, str]:
    """Call the model for the turn ``env`` describes (its context and settings); the exit
    code and the termination message a turn's pod ends with: its output's envelope (the
    output by reference in a ConfigMap of ``store`` when the message would not hold it), or
    a one-line reason."""
    keys = api_keys(env)
    try:
        return _outcome(env, store, call_model(env, read_context(env), client_factory))
    except TurnFailed as failure:
        return _failed(failure.reason, str(failure), keys)
    except Exception as error:  # a one-line reason, never a traceback, whatever went wrong
        text = f"the turn failed: {type(error).__name__}: {_one_line(error)}"
        return _failed(names.TURN_FAILED, text, keys)


def _outcome(
    env: Mapping[str, str], store: runner.ResultStore | None, output: cx.Output
) -> tuple[int, str]:
    """The exit code and termination message of a turn whose model gave ``output``."""
    body = envelope(output)
    full = naming.canonical_json(body["result"])
    size = len(full.encode())
    if size > MAX_OUTPUT_BYTES:
        raise TurnFailed(
            names.TURN_OUTPUT_TOO_LARGE,
            f"the turn's output is {size} bytes, more than the {MAX_OUTPUT_BYTES} a turn may "
            "return: lower spec.agent.model.maxOutputTokens",
        )
    text = inline_text(body)
    if len(text.encode()) > runner.TERMINATION_LIMIT:
        packed = len(text.encode())
        if store is None:
            raise TurnFailed(
                names.TURN_OUTPUT_TOO_LARGE,
                f"the turn's output is {size} bytes ({packed} as the compressed envelope), more "
                f"than the {runner.TERMINATION_LIMIT} bytes of the termination message, and the "
                "pod has no API access to store it: lower spec.agent.model.maxOutputTokens, or "
                "give steps a ServiceAccount (stepTemplate.serviceAccountName) allowed to create "
                "ConfigMaps",
            )
        try:
            ref = store.store(full, body["summary"], fields=False)
        except runner.ResultTampered as error:  # never reference what the turn did not write
            tampered = str(error).removeprefix(f"{runner.TAMPERED}:").strip()
            raise TurnFailed(runner.TAMPERED, tampered) from None
        except Exception as error:  # e.g. HTTP 403: the ServiceAccount may not create it
            raise TurnFailed(
                names.TURN_OUTPUT_TOO_LARGE,
                f"the turn's output is {size} bytes ({packed} as the compressed envelope), more "
                f"than the {runner.TERMINATION_LIMIT} bytes of the termination message, and "
                f"storing it in a ConfigMap failed ({type(error).__name__}: "
                f"{_one_line(getattr(error, 'reason', '') or error, 120)}): lower "
                "spec.agent.model.maxOutputTokens, or give steps a ServiceAccount "
                "(stepTemplate.serviceAccountName) allowed to create ConfigMaps",
            ) from None
        body = {
            "ok": True,
            "summary": body["summary"],
            "resultRef": ref,
            "resultDigest": naming.sha256_text(full),
            "usage": body["usage"],
        }
        text = json.dumps(body, separators=(",", ":"))
    by = output.answered_by
    fallback = f", answered by fallback {by.index} {by.name}" if by is not None and by.index else ""
    print(
        f"agentrun step llm: turn {env.get(pod_env.ENV_TURN, '?')}: {body['summary']} "
        f"({body['usage']['tokens']} tokens{fallback})"
    )
    return 0, text


WAIT_SECONDS = 3600.0
"""How long a turn's pod waits for its request before it fails (a run that stopped needing
it deletes it before that)."""
MAX_REQUEST_BYTES = 64 * 1024 * 1024
POLL_SECONDS = 0.05
"""How often the listener looks whether it is to stop (the pod ends that much after its turn)."""


class TurnRequests:
    """What a turn's pod accepts: the first request with the right token and a context that
    matches its digest, and nothing else. A repeat of the token (the operator sending again
    after a restart) is answered with the digest taken, and changes nothing."""

    def __init__(self, token_sha256: str) -> None:
        self.token_sha256 = token_sha256
        self.taken: dict[str, Any] | None = None
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def offer(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """HTTP status and answer for a request body."""
        try:
            request = json.loads(body)
            token = str(request["token"])
            parts = [str(p) for p in request["parts"]]
            digest = str(request["sha256"])
            key = str(request["idempotencyKey"])
        except (ValueError, KeyError, TypeError):
            return 400, {"error": "not a turn's request (token, parts, sha256, idempotencyKey)"}
        if not token_matches(token, self.token_sha256):
            return 403, {"error": "the token is not this turn's"}
        with self._lock:
            if self.taken is not None:
                return 200, {"taken": self.taken["sha256"]}
            if naming.sha256_text("".join(parts)) != digest:
                return 400, {"error": "the parts do not match their sha256"}
            self.taken = {"parts": parts, "sha256": digest, "idempotencyKey": key}
        self.ready.set()
        return 202, {"taken": digest}

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the taken request's context and key, as a turn run by hand reads them."""
        assert self.taken is not None
        taken = self.taken
        return request_env(env, taken["parts"], taken["sha256"], taken["idempotencyKey"])


def token_matches(token: str, token_sha256: str) -> bool:
    """Whether ``token`` is the one whose sha256 the pod's Job names."""
    return hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), token_sha256)


def request_env(
    env: Mapping[str, str], parts: list[str], digest: str, key: str, **more: str
) -> dict[str, str]:
    """``env`` with a request's context (its parts and their digest), idempotency key and
    ``more`` variables, as a turn run by hand reads them."""
    return {
        **env,
        **more,
        pod_env.ENV_CONTEXT_PARTS: str(len(parts)),
        pod_env.ENV_CONTEXT_SHA256: digest,
        s.ENV_IDEMPOTENCY_KEY: key,
        **{f"{pod_env.ENV_CONTEXT_PART}{i}": part for i, part in enumerate(parts)},
    }


Route = Callable[[bytes], tuple[int, dict[str, Any]]]
"""A POST path's handler: the request's body -> the HTTP status and the JSON answer."""


def json_handler(routes: Mapping[str, Route], who: str) -> type[BaseHTTPRequestHandler]:
    """An HTTP handler that answers POSTs to ``routes`` with JSON (404 to anything else, or a
    body over :data:`MAX_REQUEST_BYTES`), logging each request on stderr as ``who``."""
    paths = " or ".join(sorted(routes))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            route = routes.get(self.path)
            if route is None or length > MAX_REQUEST_BYTES:
                code, answer = 404, {"error": f"POST {paths} only"}
            else:
                code, answer = route(self.rfile.read(length))
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{who}: {self.address_string()} {format % args}", file=sys.stderr)

    return Handler


def serve(
    env: dict[str, str] | None = None,
    client_factory: Callable[[str, str], Any] = default_client,
    wait_seconds: float = WAIT_SECONDS,
    port: int = s.TURN_PORT,
    store_factory: Callable[
        [runner.StepIdentity, dict[str, str]], runner.ResultStore | None
    ] = runner.default_store,
) -> int:
    """Wait for the turn's request on the pod's address, then run the turn; its exit code.
    The pod listens first; the model client (and the Kubernetes client, when the pod has a
    token) is imported while it waits, so that a request sent while the pod is still
    starting is taken at once and the turn begins as soon as the client is loaded."""
    env = dict(os.environ if env is None else env)
    requests = TurnRequests(env[s.ENV_TURN_TOKEN_SHA256])
    server = ThreadingHTTPServer(
        (env.get(s.ENV_POD_IP) or "0.0.0.0", port),
        json_handler({"/turn": requests.offer}, "agentrun step llm"),
    )
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(POLL_SECONDS,), daemon=True).start()
    print(f"agentrun step llm: waiting for the turn's request on {server.server_address}")
    import httpx  # noqa: F401 - loaded before the request is run, not after it
    import openai  # noqa: F401

    sa_dir = Path(env.get(s.ENV_SERVICEACCOUNT_DIR, runner.DEFAULT_SERVICEACCOUNT_DIR))
    if (sa_dir / "token").is_file():  # the result store's client (runner.default_store)
        import kubernetes.client
        import kubernetes.config.incluster_config  # noqa: F401

    factory = reusing(client_factory)
    try:
        first = models_of(env)[0]
        factory(first.base_url, env.get(first.key_env) or NO_KEY)  # made while it waits
    except Exception:
        pass  # the turn says so once its request came
    if not requests.ready.wait(wait_seconds):
        server.shutdown()
        termination = Path(env.get(s.ENV_TERMINATION_MESSAGE_PATH, "/dev/termination-log"))
        return _fail(
            termination,
            names.TURN_REQUEST_MISSING,
            f"no request for the turn came within {wait_seconds:.0f} s: the operator did not "
            "send it (it stopped needing this turn, or could not reach the pod's address on "
            f"port {port})",
        )
    try:
        return run_turn(requests.env(env), factory, store_factory)
    finally:
        server.shutdown()


def reusing(client_factory: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """``client_factory`` making one client per model (base URL and API key), kept for the
    turns after: the first model's is made while the pod waits for its request, a fallback's
    when it is first asked."""
    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def factory(base_url: str, key: str) -> Any:
        with lock:
            if (base_url, key) not in clients:
                clients[(base_url, key)] = client_factory(base_url, key)
            return clients[(base_url, key)]

    return factory


def main(argv: list[str]) -> int:
    if argv:
        print("usage: agentrun step llm (no arguments; see its --help)", file=sys.stderr)
        return 2
    if not os.environ.get(s.ENV_TURN_TOKEN_SHA256):
        return run_turn()
    code = serve()
    end(code)


def end(code: int) -> NoReturn:
    """End the process with ``code`` at once."""
    # The outcome is written: end now, not after the interpreter has taken apart every module
    # it loaded (a tenth of a second or more, that the turn would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
