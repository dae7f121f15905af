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


class TurnSender:
    """Sends turns' requests, each once per pod address and attempt in this process."""

    def __init__(self, observer: Observer, checkpoint: Checkpoint = no_checkpoint) -> None:
        self.observer = observer
        self.checkpoint = checkpoint
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
        fields = run_fields(run, action.step, action.attempt)
        try:
            parts = self._parts(run, action)
        except Exception as error:  # a read that failed: a later pass asks again
            log.warning("could not read the context of %s: %s", action.job_name, error,
                        extra=fields)  # fmt: skip
            self._forget(run, action)
            return
        if isinstance(parts, str):
            log.warning("turn %s not sent: %s", action.job_name, parts, extra=fields)
            self.observer.note_tampered(run.metadata.uid, action.job_name, parts)
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
    deadline = time.monotonic() + SEND_SECONDS
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    wait = RETRY_SECONDS
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), _taken(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), _taken(error.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_SECONDS)


def _taken(data: bytes) -> str | None:
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    taken = answer.get("taken") if isinstance(answer, dict) else None
    return str(taken) if taken is not None else None
