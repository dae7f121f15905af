"""The key of step Jobs' proofs (:mod:`agentrun.execution.proof`), kept in the Secret
``agentrun-job-signing`` of the operator's own namespace: read the first time it is needed, made
(random, once) when it is missing, and never written again, so every operator process and every
restart signs and verifies with the same key. Only the operator may read that Secret (its RBAC
grants ``get`` on that one name in its own namespace); namespace users never see it.
"""

from __future__ import annotations

import base64
import secrets
import threading

from kubernetes.client.exceptions import ApiException

from agentrun import settings as s
from agentrun.execution import proof
from agentrun.kubeapi import api_message, tolerate
from agentrun.loop.common import Apis, log

DATA_KEY = "key"


class JobKey:
    """The key, loaded once (thread-safe)."""

    def __init__(self, apis: Apis, namespace: str, name: str = s.SIGNING_SECRET) -> None:
        self.apis = apis
        self.namespace = namespace
        self.name = name
        self._lock = threading.Lock()
        self._key: bytes | None = None

    def get(self) -> bytes:
        """The key; raises (the pass fails and is tried again) when it cannot be had."""
        with self._lock:
            if self._key is None:
                self._key = self._load()
            return self._key

    def _load(self) -> bytes:
        where = f"Secret {self.namespace}/{self.name}"
        try:
            key = self._read()
            if key is None:
                fresh = base64.b64encode(secrets.token_bytes(proof.KEY_BYTES)).decode()
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "labels": {s.LABEL_MANAGED_BY: s.MANAGED_BY},
                    },
                    "type": "Opaque",
                    "data": {DATA_KEY: fresh},
                }
                with tolerate(409):  # another operator process made it first: read theirs
                    self.apis.core.create_namespaced_secret(self.namespace, body)
                    log.info("made the key of step Jobs' proofs in %s", where)
                key = self._read()
        except ApiException as error:
            raise RuntimeError(
                f"cannot read or create {where}, the key that proves step Jobs are the "
                f"operator's ({api_message(error)}); grant the operator get and create on it "
                "(the chart and manifests do), or set AGENTRUN_OPERATOR_NAMESPACE"
            ) from error
        if key is None or len(key) < proof.KEY_BYTES:
            raise RuntimeError(
                f"{where} holds no key of {proof.KEY_BYTES} bytes under data.{DATA_KEY}; "
                "delete it and the operator makes a new one (Jobs it signed before then no "
                "longer verify after a restart)"
            )
        return key

    def _read(self) -> bytes | None:
        with tolerate(404) as missing:
            secret = self.apis.core.read_namespaced_secret(self.name, self.namespace)
        if missing:
            return None
        raw = (secret.data or {}).get(DATA_KEY) or ""
        try:
            return base64.b64decode(raw)
        except ValueError:
            return b""
