"""Startup, readiness and liveness probes of one container, run like a kubelet runs them.

Used by the docker runtime (:mod:`agentrun_devcluster.dockercontainer`); the process runtime
has no probes (a running process is ready).

A :class:`Prober` thread per container with probes:

* ``startupProbe`` first, if there is one: until it succeeds, the other two do not run and
  the container is not ``started``; ``failureThreshold`` failures in a row kill it.
* ``readinessProbe``: the container is ready after ``successThreshold`` successes in a row
  and not ready after ``failureThreshold`` failures in a row (not ready until the first
  success). Without one, a started container is ready.
* ``livenessProbe``: ``failureThreshold`` failures in a row kill the container (the pod's
  restartPolicy then decides, as with a kubelet).

Handlers: ``httpGet`` (host: the probe's ``host``, else the pod's IP, which is the node's;
port by number or by the name of one of the container's ``ports``; HTTP or HTTPS without
certificate checks; ``httpHeaders``; success is a status from 200 to 399), ``tcpSocket`` (a
connection opens) and ``exec`` (exit code 0; run through the runtime). ``grpc`` probes always
fail, with a message saying they are not supported. Timing as in the API: ``initialDelaySeconds``
(0), ``periodSeconds`` (10), ``timeoutSeconds`` (1), ``successThreshold`` (1),
``failureThreshold`` (3).
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .kubeapi import JSON

__all__ = ["ExecFn", "Prober", "probe_once", "resolve_port"]

log = logging.getLogger(__name__)

#: ``(argv, timeout) -> (exit code, output)``: run a command in the container.
ExecFn = Callable[[list[str], float], tuple[int, bytes]]


def resolve_port(port: object, container: JSON) -> int:
    """A probe's ``port``: a number, or the name of one of the container's ``ports``."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for p in container.get("ports") or []:
        if p.get("name") == text:
            return int(p["containerPort"])
    raise ValueError(f"port {text!r} is not a number nor the name of a port of the container")


def probe_once(probe: JSON, container: JSON, host: str, run: ExecFn) -> tuple[bool, str]:
    """Run ``probe`` once; ``(success, what happened)``."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            return _http(probe["httpGet"], container, host, timeout)
        if "tcpSocket" in probe:
            action = probe["tcpSocket"]
            port = resolve_port(action.get("port"), container)
            with socket.create_connection((action.get("host") or host, port), timeout=timeout):
                return True, f"tcp {port} open"
        if "exec" in probe:
            argv = [str(x) for x in probe["exec"].get("command") or []]
            code, output = run(argv, timeout)
            text = output.decode("utf-8", "replace").strip()[-512:]
            return code == 0, f"exec {argv}: exit code {code}{': ' + text if text else ''}"
        if "grpc" in probe:
            return False, "grpc probes are not supported by the agentrun local node"
    except (OSError, ValueError, http.client.HTTPException) as e:
        return False, f"{type(e).__name__}: {e}"
    except Exception as e:  # an exec through the runtime that failed
        return False, str(e)
    return False, "the probe has no handler (httpGet, tcpSocket, exec or grpc)"


def _http(action: JSON, container: JSON, host: str, timeout: float) -> tuple[bool, str]:
    port = resolve_port(action.get("port"), container)
    target = action.get("host") or host
    path = str(action.get("path") or "/")
    if not path.startswith("/"):
        path = "/" + path
    conn: http.client.HTTPConnection
    if str(action.get("scheme", "HTTP")).upper() == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(target, port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection(target, port, timeout=timeout)
    headers = {"User-Agent": "kube-probe/agentrun-local"}
    for header in action.get("httpHeaders") or []:
        headers[str(header["name"])] = str(header.get("value", ""))
    try:
        conn.request("GET", path, headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    return 200 <= status < 400, f"HTTP GET {target}:{port}{path}: {status}"


@dataclass
class _Probe:
    kind: str  # startup, readiness or liveness
    spec: JSON
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds") or 10)

    @property
    def success_threshold(self) -> int:
        return int(self.spec.get("successThreshold") or 1)

    @property
    def failure_threshold(self) -> int:
        return int(self.spec.get("failureThreshold") or 3)


class Prober(threading.Thread):
    """The probes of one running container (see the module doc).

    ``kill(reason)`` is called (once) when a liveness or startup probe has failed
    ``failureThreshold`` times in a row. :attr:`ready` and :attr:`started` are read by the
    pod's lifecycle.
    """

    def __init__(
        self,
        container: JSON,
        *,
        host: str,
        run: ExecFn,
        kill: Callable[[str], None],
        what: str,
    ) -> None:
        super().__init__(name=f"probe-{what}", daemon=True)
        self.container = container
        self.host = host
        self.run_exec = run
        self.kill = kill
        self.what = what
        now = time.monotonic()
        self.probes: dict[str, _Probe] = {}
        for kind in ("startup", "readiness", "liveness"):
            spec = container.get(f"{kind}Probe")
            if spec:
                delay = float(spec.get("initialDelaySeconds") or 0)
                self.probes[kind] = _Probe(kind, spec, next_at=now + delay)
        self.started = "startup" not in self.probes
        self.ready = self.started and "readiness" not in self.probes
        self._stop_event = threading.Event()

    @property
    def needed(self) -> bool:
        """Whether the container has any probe."""
        return bool(self.probes)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.monotonic()
            due = [p for p in self.probes.values() if p.next_at <= now and self._active(p.kind)]
            for p in due:
                if self._stop_event.is_set():
                    return
                self._run(p)
                p.next_at = time.monotonic() + p.period
            upcoming = [p.next_at for p in self.probes.values() if self._active(p.kind)]
            wait = max(0.05, min(upcoming) - time.monotonic()) if upcoming else 1.0
            self._stop_event.wait(min(wait, 1.0))

    def _active(self, kind: str) -> bool:
        return (kind == "startup") != self.started

    def _run(self, p: _Probe) -> None:
        ok, detail = probe_once(p.spec, self.container, self.host, self.run_exec)
        if ok:
            p.successes, p.failures = p.successes + 1, 0
        else:
            p.successes, p.failures = 0, p.failures + 1
            log.info("%s: %s probe failed (%d in a row): %s", self.what, p.kind, p.failures, detail)
        if p.kind == "startup":
            if ok:
                self.started = True
                self.ready = "readiness" not in self.probes
                log.info("%s: started (startup probe: %s)", self.what, detail)
            elif p.failures >= p.failure_threshold:
                self._kill(f"Startup probe failed: {detail}")
        elif p.kind == "readiness":
            if ok and not self.ready and p.successes >= p.success_threshold:
                self.ready = True
                log.info("%s: ready (readiness probe: %s)", self.what, detail)
            elif not ok and self.ready and p.failures >= p.failure_threshold:
                self.ready = False
                log.info("%s: not ready (readiness probe: %s)", self.what, detail)
        elif not ok and p.failures >= p.failure_threshold:
            self._kill(f"Liveness probe failed: {detail}")

    def _kill(self, reason: str) -> None:
        log.warning("%s: %s; killing the container", self.what, reason)
        self._stop_event.set()
        self.ready = False
        self.kill(reason)
