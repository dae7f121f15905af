"""Model turns' requests: the operator sends each turn's pod its context once the turn's
intent is committed (:class:`agentrun.core.actions.SendTurn`).

A turn's pod (``agentrun step llm``, :mod:`agentrun.pod.llm`) listens on its own address and
takes the first request that carries the turn's one-time token
(:func:`agentrun.execution.proof.turn_token`; its Job names only the token's sha256). The
request holds the context document's parts, read from the run's own ConfigMap and checked
against the digest committed in status (a context that is not the committed one is never
sent: the attempt fails as tampered), and the turn's idempotency key.

Sending is safe to repeat: a pod takes one request in its life and answers a repeat with the
digest it took. So a pass may ask again (and an operator restarted mid-turn does); this
process sends once per pod address and attempt, each from a thread of its own (a pod that
is starting refuses connections for a moment: they are tried again for :data:`SEND_SECONDS`).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict

from agentrun import settings as s
from agentrun.api import models as m
from agentrun.core import SendTurn, naming
from agentrun.execution import proof
from agentrun.loop.common import Checkpoint, log, no_checkpoint, run_fields
from agentrun.loop.observe import Observer
from agentrun.observation.watches import Wake

SEND_SECONDS = 300.0
"""How long connections a pod refuses are tried again (it is still starting)."""
RETRY_SECONDS = 0.05
"""The first wait before a refused connection is tried again; it doubles up to
:data:`RETRY_MAX_SECONDS`."""
RETRY_MAX_SECONDS = 0.2
"""The longest wait between tries: a pod still importing its clients starts listening at any
moment, and each second waited past it is a second of the turn (a refused connection to a
pod's own address costs next to nothing)."""
REMEMBERED = 20_000
"""Requests sent (and Jobs made ahead) remembered, newest kept."""


ANSWER_WAIT_SECONDS = 30.0
"""How long one ask for an executor's answer waits (it is asked again until it answers)."""


class TurnSender:
    """Sends turns' requests, each once per pod address and attempt in this process; and
    asks a run's executor for each attempt's outcome until it has it."""

    def __init__(
        self, observer: Observer, checkpoint: Checkpoint = no_checkpoint, wake: Wake | None = None
    ) -> None:
        self.observer = observer
        self.checkpoint = checkpoint
        self.wake = wake
        self._lock = threading.Lock()
        self._sent: OrderedDict[tuple[str, ...], bool] = OrderedDict()
        self._prepared: OrderedDict[tuple[str, ...], bool] = OrderedDict()

    def first_preparation(self, run_uid: str, job_name: str) -> bool:
        """Whether this process has not made the Job ``job_name`` ahead of its turn yet
        (it counts as made from now on)."""
        return _first(self._lock, self._prepared, (run_uid, job_name))

    def send(self, run: m.AgentRun, action: SendTurn, key: bytes) -> None:
        """Send ``action``'s request in the background, unless this process did already."""
        if _first(self._lock, self._sent, (run.metadata.uid, action.job_name, action.address)):
            # A thread of its own: a pod still starting keeps it waiting (mostly asleep), and
            # must not hold up the requests of pods that are ready.
            name = f"turn-request-{action.job_name}"
            threading.Thread(
                target=self._send, args=(run, action, key), name=name, daemon=True
            ).start()

    def _forget(self, run: m.AgentRun, action: SendTurn) -> None:
        with self._lock:
            self._sent.pop((run.metadata.uid, action.job_name, action.address), None)

    def _send(self, run: m.AgentRun, action: SendTurn, key: bytes) -> None:
        if action.executor:
            self._send_to_executor(run, action, key)
            return
        fields = run_fields(run, action.step, action.attempt)
        parts = self._sendable_parts(run, action)
        if parts is None:
            return
        body = json.dumps(
            {
                "token": proof.turn_token(key, run.metadata.uid, action.job_name),
                "parts": parts,
                "sha256": action.digest,
                "idempotencyKey": action.idempotency_key,
            }
        ).encode()
        url = f"http://{_host(action.address)}:{s.TURN_PORT}/turn"
        self.checkpoint("before-turn-request")
        answer = _post(url, body)
        if answer is None:
            log.warning("the pod of %s took no request at %s within %.0f s", action.job_name,
                        url, SEND_SECONDS, extra=fields)  # fmt: skip
            self._forget(run, action)
            return
        code, taken = answer
        if code in (200, 202) and taken == action.digest:
            log.info("sent turn %s its request (%s)", action.job_name, code, extra=fields)
            self.checkpoint("after-turn-request")
            return
        why = (
            f"the pod of Job {action.job_name} at {action.address} answered {code} "
            f"(took {taken or 'nothing'}), not the committed context {action.digest[:12]}"
        )
        log.warning("%s", why, extra=fields)
        self.observer.note_tampered(run.metadata.uid, action.job_name, why)

    def _send_to_executor(self, run: m.AgentRun, action: SendTurn, key: bytes) -> None:
        """Send the run's executor the attempt's request, then ask for its outcome until it
        has one; hand that to the observer and wake the run. An executor that refuses
        connections for :data:`SEND_SECONDS` is left (the pass that sees its pod gone fails
        the attempt; one that sees it running sends again)."""
        fields = run_fields(run, action.step, action.attempt)
        uid = run.metadata.uid
        token = proof.executor_token(key, uid, action.executor)
        request: dict[str, object] = {"token": token, "job": action.job_name,
                                      "step": action.step, "attempt": action.attempt,
                                      "turn": action.turn, "sha256": action.digest,
                                      "idempotencyKey": action.idempotency_key}  # fmt: skip
        if action.program:  # a call: its variables, not a context
            request.update(program=action.program, env=dict(action.env),
                           secretEnv=dict(action.secret_env),
                           timeoutSeconds=action.timeout_seconds)  # fmt: skip
        else:
            parts = self._sendable_parts(run, action)
            if parts is None:
                return
            request["parts"] = parts
        base = f"http://{_host(action.address)}:{s.TURN_PORT}"
        self.checkpoint("before-turn-request")
        answer = _post_json(f"{base}/turn", request)
        while answer is not None and answer[0] in (200, 202) and "exitCode" not in answer[1]:
            if answer[1].get("taken") != action.digest:
                break
            asked = {"token": token, "job": action.job_name, "wait": ANSWER_WAIT_SECONDS}
            answer = _post_json(f"{base}/answer", asked)
        if answer is None:
            log.warning("the executor of %s took no request at %s within %.0f s",
                        action.job_name, base, SEND_SECONDS, extra=fields)  # fmt: skip
            self._forget(run, action)
            return
        code, body = answer
        if code == 200 and body.get("taken") == action.digest and "exitCode" in body:
            exit_code, message = body.get("exitCode"), body.get("message")
            if isinstance(exit_code, int) and isinstance(message, str):
                log.info("the executor answered %s %s (exit code %d)",
                         "call" if action.program else "turn", action.job_name, exit_code,
                         extra=fields)  # fmt: skip
                self.checkpoint("after-executor-answer")
                self.observer.note_answer(uid, action.job_name, exit_code, message)
                if self.wake is not None:
                    self.wake(run.metadata.namespace, run.metadata.name, uid)
                return
        what = "call" if action.program else "context"
        said = f": {str(body['error'])[:200]}" if body.get("error") else ""
        why = (
            f"the executor {action.executor} at {action.address} answered {code} for attempt "
            f"{action.job_name} (took {body.get('taken') or 'nothing'}{said}), not the "
            f"outcome of the committed {what} {action.digest[:12]}"
        )
        log.warning("%s", why, extra=fields)
        self.observer.note_tampered(uid, action.job_name, why)

    def _sendable_parts(self, run: m.AgentRun, action: SendTurn) -> list[str] | None:
        """The context's parts to send; None when they cannot be: not read (a later pass
        asks again), or not the committed context (the attempt fails as tampered)."""
        fields = run_fields(run, action.step, action.attempt)
        try:
            parts = self._parts(run, action)
        except Exception as error:  # a read that failed: a later pass asks again
            log.warning("could not read the context of %s: %s", action.job_name, error,
                        extra=fields)  # fmt: skip
            self._forget(run, action)
            return None
        if isinstance(parts, str):
            log.warning("turn %s not sent: %s", action.job_name, parts, extra=fields)
            self.observer.note_tampered(run.metadata.uid, action.job_name, parts)
            return None
        return parts

    def _parts(self, run: m.AgentRun, action: SendTurn) -> list[str] | str:
        """The context's parts from the run's ConfigMap, or why they cannot be sent."""
        found = self.observer.written_data(run.metadata.namespace, action.context_name)
        data = found or {}
        parts = [data.get(f"part-{i}") for i in range(action.parts)]
        if found is None or any(p is None for p in parts):
            return f"the context {action.context_name} of the turn is missing or incomplete"
        texts = [str(p) for p in parts]
        if naming.sha256_text("".join(texts)) != action.digest:
            return (
                f"the context {action.context_name} does not match the digest committed for "
                f"the turn ({action.digest[:12]}): it was changed"
            )
        return texts


def _first(
    lock: threading.Lock, seen: OrderedDict[tuple[str, ...], bool], key: tuple[str, ...]
) -> bool:
    with lock:
        if key in seen:
            return False
        seen[key] = True
        while len(seen) > REMEMBERED:
            seen.popitem(last=False)
        return True


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _post(url: str, body: bytes) -> tuple[int, str | None] | None:
    """The status and the digest the pod says it took; None when it refused connections
    for :data:`SEND_SECONDS`."""
    answer = _post_raw(url, body)
    return None if answer is None else (answer[0], _taken(answer[1]))


def _post_raw(url: str, body: bytes) -> tuple[int, bytes] | None:
    """The status and the body answered; None when connections were refused for
    :data:`SEND_SECONDS`."""
    deadline = time.monotonic() + SEND_SECONDS
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    wait = RETRY_SECONDS
    while True:
        try:
            with urllib.request.urlopen(request, timeout=ANSWER_WAIT_SECONDS + 10) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_SECONDS)


def _post_json(url: str, payload: dict[str, object]) -> tuple[int, dict[str, object]] | None:
    """POST ``payload`` as JSON to ``url``: the status and the JSON object answered (empty
    when the answer is not one); None when connections were refused for
    :data:`SEND_SECONDS`."""
    answer = _post_raw(url, json.dumps(payload).encode())
    if answer is None:
        return None
    code, data = answer
    try:
        parsed = json.loads(data or b"")
    except ValueError:
        parsed = None
    return code, parsed if isinstance(parsed, dict) else {}


def _taken(data: bytes) -> str | None:
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    taken = answer.get("taken") if isinstance(answer, dict) else None
    return str(taken) if taken is not None else None
