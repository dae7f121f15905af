"""A small client of the Docker Engine API, over its unix socket, with the standard library.

The local node's container runtime (:mod:`agentrun_devcluster.dockercontainer`) needs a
dozen calls: ping, images (inspect, pull), containers (create, start, wait, inspect, kill,
remove, logs, list by label) and exec (for exec probes). They go straight to the engine's
socket rather than through the ``docker`` CLI: no process per call, no environment values on
a command line, and no dependence on a CLI whose version matches the engine's.

Where the engine is: ``$DOCKER_HOST`` (``unix:///path`` or ``tcp://host:port`` without TLS),
else ``/var/run/docker.sock``. Requests use the engine's own API version (unversioned
paths), which every engine since API 1.24 serves.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import struct
import urllib.parse
from collections.abc import Mapping
from typing import Any, cast

__all__ = [
    "DEFAULT_SOCKET",
    "DockerEngine",
    "DockerError",
    "demux",
    "engine_from_env",
]

JSON = dict[str, Any]
DEFAULT_SOCKET = "/var/run/docker.sock"


class DockerError(Exception):
    """The engine answered with an error (``status`` is its HTTP status, 0: unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message if self.status == 0 else f"{self.message} (HTTP {self.status})"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def demux(data: bytes) -> bytes:
    """The payload of a multiplexed log or exec stream (8-byte frame headers: stream, 0, 0,
    0, big-endian size), stdout and stderr interleaved as written. Data without frame
    headers (a container with a TTY) is returned as it is."""
    out = bytearray()
    pos = 0
    while pos + 8 <= len(data):
        kind, size = data[pos], struct.unpack(">I", data[pos + 4 : pos + 8])[0]
        if kind not in (0, 1, 2) or data[pos + 1 : pos + 4] != b"\0\0\0":
            return data  # not multiplexed
        out += data[pos + 8 : pos + 8 + size]
        pos += 8 + size
    return bytes(out)


class DockerEngine:
    """The Docker Engine at ``socket_path`` (or ``tcp_address``, ``host:port``).

    Each call opens its own connection, so one engine object serves many threads.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, tcp_address: str = "") -> None:
        self.socket_path = socket_path
        self.tcp_address = tcp_address

    @property
    def address(self) -> str:
        return f"tcp://{self.tcp_address}" if self.tcp_address else f"unix://{self.socket_path}"

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.tcp_address:
            host, _, port = self.tcp_address.rpartition(":")
            return http.client.HTTPConnection(host, int(port), timeout=timeout)
        return _UnixConnection(self.socket_path, timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        timeout: float | None = 60.0,
        ok: tuple[int, ...] = (),
    ) -> tuple[int, bytes]:
        """Send one request and read the whole answer; raise :class:`DockerError` for a
        status of 400 or more that is not in ``ok`` (and with status 0 when the engine
        cannot be reached)."""
        if query:
            params = {
                k: ("1" if v else "0") if isinstance(v, bool) else str(v) for k, v in query.items()
            }
            path = f"{path}?{urllib.parse.urlencode(params)}"
        headers = {"Host": "docker"}
        payload: bytes | None = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise DockerError(0, f"the Docker engine at {self.address} did not answer: {e}") from e
        finally:
            conn.close()
        if resp.status >= 400 and resp.status not in ok:
            raise DockerError(resp.status, _error_message(data) or resp.reason)
        return resp.status, data

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """:meth:`request`, decoding a JSON answer (None for an empty one)."""
        _, data = self.request(method, path, **kwargs)
        return json.loads(data) if data.strip() else None

    # -- the engine ---------------------------------------------------------------------------

    def info(self, timeout: float = 10.0) -> JSON:
        """``GET /info`` (what ``docker info`` shows)."""
        return cast(JSON, self.json("GET", "/info", timeout=timeout))

    def version(self, timeout: float = 10.0) -> JSON:
        return cast(JSON, self.json("GET", "/version", timeout=timeout))

    # -- images ---------------------------------------------------------------------------------

    def image(self, name: str) -> JSON | None:
        """The image ``name`` as ``docker image inspect`` shows it; None if it is not here."""
        status, data = self.request("GET", f"/images/{_quote(name)}/json", ok=(404,))
        return None if status == 404 else cast(JSON, json.loads(data))

    def pull(self, name: str, timeout: float = 300.0) -> None:
        """Pull ``name`` (a reference with its tag or digest); raise :class:`DockerError`
        with the engine's message when that fails (the engine reports most failures inside
        a 200 answer's progress stream)."""
        ref = name if _has_tag_or_digest(name) else f"{name}:latest"
        _, data = self.request("POST", "/images/create", query={"fromImage": ref}, timeout=timeout)
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("error"):
                    raise DockerError(500, str(event["error"]))

    # -- containers -----------------------------------------------------------------------------

    def create(self, name: str, config: JSON) -> str:
        """Create a container; return its id."""
        answer = self.json("POST", "/containers/create", query={"name": name}, body=config)
        return str(answer["Id"])

    def start(self, container: str) -> None:
        self.request("POST", f"/containers/{container}/start", ok=(304,), timeout=120.0)

    def inspect(self, container: str) -> JSON | None:
        """``docker inspect`` of a container; None if it does not exist."""
        status, data = self.request("GET", f"/containers/{container}/json", ok=(404,))
        return None if status == 404 else cast(JSON, json.loads(data))

    def wait(self, container: str) -> int:
        """Block until the container has stopped; its exit code."""
        path = f"/containers/{container}/wait"
        answer = self.json("POST", path, query={"condition": "not-running"}, timeout=None)
        return int((answer or {}).get("StatusCode", -1))

    def kill(self, container: str, signal: str = "SIGKILL") -> None:
        """Send ``signal``; a container that is not running (409) or gone (404) is fine."""
        self.request(
            "POST", f"/containers/{container}/kill", query={"signal": signal}, ok=(404, 409)
        )

    def remove(self, container: str) -> None:
        """Remove the container (killing it first if it runs) and its anonymous volumes."""
        self.request(
            "DELETE", f"/containers/{container}", query={"force": True, "v": True}, ok=(404, 409)
        )

    def logs(self, container: str, tail: int | str = "all") -> bytes:
        """Its output so far, stdout and stderr interleaved (the last ``tail`` lines)."""
        _, data = self.request(
            "GET",
            f"/containers/{container}/logs",
            query={"stdout": True, "stderr": True, "tail": tail},
            ok=(404,),
        )
        return demux(data)

    def containers(self, labels: Mapping[str, str]) -> list[JSON]:
        """All containers (running or not) that carry every one of ``labels``."""
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = self.json(
            "GET", "/containers/json", query={"all": True, "filters": json.dumps(filters)}
        )
        return list(found or [])

    # -- exec -----------------------------------------------------------------------------------

    def exec(self, container: str, argv: list[str], timeout: float) -> tuple[int, bytes]:
        """Run ``argv`` in the running container; its exit code and output. A command that
        runs longer than ``timeout`` raises :class:`DockerError` (status 0); like a kubelet's
        exec probe, it is not killed."""
        created = self.json(
            "POST",
            f"/containers/{container}/exec",
            body={"Cmd": argv, "AttachStdout": True, "AttachStderr": True},
        )
        exec_id = str(created["Id"])
        _, output = self.request(
            "POST",
            f"/exec/{exec_id}/start",
            body={"Detach": False, "Tty": False},
            timeout=timeout,
        )
        state = self.json("GET", f"/exec/{exec_id}/json")
        return int(state.get("ExitCode") or 0), demux(output)


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="/:@")


def _has_tag_or_digest(name: str) -> bool:
    last = name.rsplit("/", 1)[-1]
    return "@" in name or ":" in last


def _error_message(data: bytes) -> str:
    with contextlib.suppress(ValueError):
        body = json.loads(data)
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    return data.decode("utf-8", "replace").strip()


def engine_from_env(environ: Mapping[str, str] | None = None) -> DockerEngine:
    """The engine ``$DOCKER_HOST`` names (``unix://`` or plain ``tcp://``), else the default
    socket. Raises :class:`DockerError` (status 0) for an address this client cannot use."""
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST", "")
    if not host:
        return DockerEngine(DEFAULT_SOCKET)
    url = urllib.parse.urlsplit(host)
    if url.scheme == "unix":
        return DockerEngine(url.path or DEFAULT_SOCKET)
    if url.scheme == "tcp" and url.hostname and not env.get("DOCKER_TLS_VERIFY"):
        return DockerEngine(tcp_address=f"{url.hostname}:{url.port or 2375}")
    raise DockerError(0, f"DOCKER_HOST={host}: only unix:// and tcp:// without TLS are supported")
