"""``agentrun step -- COMMAND [ARGS...]``: the program that runs inside a step's pod.

It runs the step's command, collects its result and leaves the result envelope where the
operator reads it (the termination message, at most 4 KiB by kubelet's rule):

* the result is what the command wrote to ``$AGENTRUN_RESULT_FILE`` or, if it wrote nothing
  there, its standard output (also passed through to the pod's log);
* a result that fits is sent inline: ``{"ok": ..., "summary": ..., "result": ...}``;
* a tool call of an agent run gets its arguments (``$AGENTRUN_TOOL_ARGS``, set by the
  operator) also as a file, named by ``$AGENTRUN_TOOL_ARGS_FILE``;
* a larger one is written to a ConfigMap owned by the run (``result`` and ``field.<name>``
  entries, like the operator's own result objects) and the envelope carries ``resultRef`` and
  ``resultDigest``. That needs API access: the pod's ServiceAccount (``stepTemplate.
  serviceAccountName``) must be allowed to create ConfigMaps in the run's namespace.

No replay: a step attempt always runs its command. A ConfigMap found under the attempt's
result object name proves nothing of who wrote it (anyone who may create ConfigMaps can write
the exact object the runner would, labels, annotations, owner and all, before it runs), so it
is never taken as the work of an earlier attempt; the retry of a lost attempt runs the command
again with the same idempotency key (``$AGENTRUN_IDEMPOTENCY_KEY``), which is what a
side-effecting command dedupes by. And the runner only ever references the object its own
create made: a name already taken fails the attempt (``ResultTampered``), whatever the object
holds.

The exit code is the command's; ``ok`` is true when it is 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrun import settings as s
from agentrun.api import names
from agentrun.core import naming
from agentrun.core.envelope import clean, result_object_data, summary_line
from agentrun.core.pod_env import ENV_TOOL_ARGS
from agentrun.execution import objects
from agentrun.kubeapi import Cluster, tolerate

TERMINATION_LIMIT = 4096
INLINE_LIMIT = 3072
"""Envelopes up to this many bytes go inline; kubelet keeps 4096 of the termination message."""
DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
LABEL_KEY_HASH = f"{names.GROUP}/idempotency-key-hash"
ANNOTATION_COMPLETE = f"{names.GROUP}/complete"
ANNOTATION_SUMMARY = f"{names.GROUP}/summary"
ENV_TOOL_ARGS_FILE = "AGENTRUN_TOOL_ARGS_FILE"
"""Set by the runner for a tool call's command: a file holding the same arguments."""


class StepIdentity:
    """Who this step attempt is, from the environment the operator gave the pod."""

    def __init__(self, env: dict[str, str]) -> None:
        self.run = env.get(s.ENV_RUN, "")
        self.namespace = env.get(s.ENV_NAMESPACE, "")
        self.run_uid = env.get(s.ENV_RUN_UID, "")
        self.step = env.get(s.ENV_STEP, "")
        self.attempt = int(env.get(s.ENV_ATTEMPT, "0") or 0)
        self.idempotency_key = env.get(s.ENV_IDEMPOTENCY_KEY, "")

    @property
    def key_hash(self) -> str:
        return hashlib.sha256(self.idempotency_key.encode()).hexdigest()[:40]

    def complete(self) -> bool:
        return bool(self.run and self.namespace and self.run_uid and self.step)


def one_line(value: object, limit: int = 300) -> str:
    """``value`` as one clean line of at most ``limit`` characters (a failure's message)."""
    text = " ".join(clean(str(value)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_arguments(env: Mapping[str, str]) -> dict[str, Any]:
    """The arguments of a tool call (``AGENTRUN_TOOL_ARGS``, a JSON object; none: empty).
    Raises ValueError saying, in one line, what is wrong with them."""
    try:
        arguments = json.loads(env.get(ENV_TOOL_ARGS) or "{}")
    except ValueError as error:
        raise ValueError(f"{ENV_TOOL_ARGS} is not JSON: {one_line(error, 200)}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{ENV_TOOL_ARGS} is not a JSON object")
    return arguments


def build_envelope(ok: bool, result: str) -> dict[str, Any]:
    """The inline envelope; a result that already is an envelope is passed through."""
    try:
        parsed = json.loads(result) if result.strip().startswith("{") else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("ok"), bool):
        if not ok:
            parsed["ok"] = False
        return parsed
    envelope: dict[str, Any] = {"ok": ok, "summary": summary_line(result)}
    if result:
        envelope["result"] = result
    return envelope


TAMPERED = "ResultTampered"
"""The first word of the report of an attempt whose result object's name was taken: the
operator fails the attempt with this reason (:mod:`agentrun.core.attempts`)."""


class ResultTampered(Exception):
    """The step's result object is held by one the step did not write."""


class ResultStore:
    """Result ConfigMaps through the Kubernetes API, with the pod's ServiceAccount."""

    def __init__(self, core_api: Any, identity: StepIdentity) -> None:
        self.core = core_api
        self.identity = identity

    def store(self, result: str, summary: str, *, fields: bool = True) -> dict[str, Any]:
        """Store ``result`` as this attempt's result object (with a ``field.<name>`` entry per
        top-level field of a JSON object when ``fields``); its reference."""
        ident = self.identity
        name = naming.result_object_name(ident.run, ident.run_uid, ident.step, ident.attempt)
        body = objects.result_config_map(
            objects.RunRef(ident.run, ident.namespace, ident.run_uid),
            name,
            ident.step,
            ident.attempt,
            result_object_data(result, fields=fields),
            labels={LABEL_KEY_HASH: ident.key_hash},
            annotations={ANNOTATION_COMPLETE: "true", ANNOTATION_SUMMARY: summary},
            block=False,  # the pod may not block the run's deletion (see owner_reference)
        )
        with tolerate(409) as exists:
            self.core.create_namespaced_config_map(ident.namespace, body)
        if exists:
            # Only this create could have made the object this attempt references: one
            # already under the name was written by someone else (the attempt has one pod,
            # which stores once), however exactly it looks like the runner's own.
            raise ResultTampered(
                f"{TAMPERED}: the result object {name} already existed before this attempt "
                "stored its result, so it was not written by this attempt; the result was not "
                "stored and nothing was referenced"
            )
        return {"name": name, "key": "result"}


def default_store(identity: StepIdentity, env: dict[str, str]) -> ResultStore | None:
    """A store using the pod's ServiceAccount token, or None without API access. Its requests
    wait within the operator's own bounds (:meth:`agentrun.kubeapi.Cluster.api_client`)."""
    sa_dir = Path(env.get(s.ENV_SERVICEACCOUNT_DIR, DEFAULT_SERVICEACCOUNT_DIR))
    if not (sa_dir / "token").is_file() or not env.get("KUBERNETES_SERVICE_HOST"):
        return None
    from kubernetes import client as kube_client
    from kubernetes.config import incluster_config

    loader_class: Any = incluster_config.InClusterConfigLoader
    loader = loader_class(
        token_filename=str(sa_dir / "token"), cert_filename=str(sa_dir / "ca.crt"),
        environ=env,
    )  # fmt: skip
    configuration = kube_client.Configuration()
    loader.load_and_set(configuration)
    return ResultStore(kube_client.CoreV1Api(Cluster(configuration).api_client()), identity)


def run_step(
    command: Sequence[str],
    env: dict[str, str] | None = None,
    store_factory: Callable[[StepIdentity, dict[str, str]], ResultStore | None] = default_store,
) -> int:
    """Run one step attempt; return its exit code."""
    env = dict(os.environ if env is None else env)
    identity = StepIdentity(env)
    termination = Path(env.get(s.ENV_TERMINATION_MESSAGE_PATH, "/dev/termination-log"))
    store = store_factory(identity, env) if identity.complete() else None

    with tempfile.TemporaryDirectory(prefix="agentrun-step-") as tmp:
        result_file = Path(tmp) / "result"
        command_env = {**env, s.ENV_RESULT_FILE: str(result_file)}
        if ENV_TOOL_ARGS in env:  # a tool call of an agent run: its arguments as a file too
            args_file = Path(tmp) / "tool-args.json"
            args_file.write_text(env[ENV_TOOL_ARGS])
            command_env[ENV_TOOL_ARGS_FILE] = str(args_file)
        proc = subprocess.run(
            list(command), env=command_env, stdout=subprocess.PIPE, text=True, check=False,
        )  # fmt: skip
        sys.stdout.write(proc.stdout)
        sys.stdout.flush()
        written = result_file.read_text() if result_file.is_file() else ""
    result = (written or proc.stdout).strip()
    ok = proc.returncode == 0
    return report(build_envelope(ok, result), result, proc.returncode, store, termination)


StoreFactory = Callable[[StepIdentity, dict[str, str]], "ResultStore | None"]
"""``store_factory(identity, env)``: where a step program keeps results too large to report,
None when its pod has no API access."""


@dataclass(frozen=True)
class Attempt:
    """What a step program (a model turn, an MCP call) starts from: where it reports, and
    where a large result goes."""

    termination: Path
    store: ResultStore | None


def begin(env: dict[str, str], store_factory: StoreFactory) -> Attempt:
    """Start a step program's attempt. Nothing found in the namespace is taken as its
    outcome (see the module's docstring): the program always does its work."""
    termination = Path(env.get(s.ENV_TERMINATION_MESSAGE_PATH, "/dev/termination-log"))
    return Attempt(termination, store_for(env, store_factory))


def store_for(env: Mapping[str, str], store_factory: StoreFactory) -> ResultStore | None:
    """Where the attempt ``env`` describes keeps a large result; None without API access."""
    identity = StepIdentity(dict(env))
    return store_factory(identity, dict(env)) if identity.complete() else None


def report(
    original: dict[str, Any],
    result: str,
    returncode: int,
    store: ResultStore | None,
    termination: Path,
) -> int:
    """Write the attempt's envelope as its termination message, its result by reference in a
    ConfigMap of the run when the message would not hold it; the attempt's exit code."""
    code, text = reported(original, result, returncode, store)
    termination.write_text(text)
    return code


def reported(
    original: dict[str, Any], result: str, returncode: int, store: ResultStore | None
) -> tuple[int, str]:
    """The attempt's exit code and termination message (:func:`report`), its result stored
    by reference when the message would not hold it."""
    ok = returncode == 0
    envelope = original
    text = json.dumps(envelope, separators=(",", ":"))
    if len(text.encode()) > INLINE_LIMIT:
        body = original.get("result", result)
        full = body if isinstance(body, str) else naming.canonical_json(body)
        summary = str(original.get("summary") or summary_line(full))
        if store is None:
            envelope = {"ok": False, "summary": (
                f"the result is {len(full.encode())} bytes, more than the termination message "
                "holds, and the pod has no API access to store it: give the step a "
                "ServiceAccount (stepTemplate.serviceAccountName) allowed to create ConfigMaps"
            )}  # fmt: skip
        else:
            try:
                ref = store.store(full, summary)
            except ResultTampered as error:
                envelope = {"ok": False, "summary": str(error)}
            else:
                envelope = {"ok": ok, "summary": summary, "resultRef": ref,
                            "resultDigest": naming.sha256_text(full)}  # fmt: skip
                if "usage" in original:
                    envelope["usage"] = original["usage"]
        text = json.dumps(envelope, separators=(",", ":"))
    if ok and envelope.get("ok") is False:
        return 1, text[:TERMINATION_LIMIT]
    return returncode, text[:TERMINATION_LIMIT]


def main(argv: Sequence[str]) -> int:
    command = list(argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("usage: agentrun step -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return run_step(command)
