"""A small JSON-in, JSON-out Kubernetes REST client for the dev cluster tools.

It rides on the official client's ``ApiClient`` (kubeconfig loading, TLS, client
certificates, bearer tokens) but speaks plain dicts: the local node handles arbitrary pods
and must not depend on how the generated models (de)serialise them. Also here: the
Kubernetes time formats and the message of an API error, which every caller needs.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

__all__ = [
    "JSON",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ApiException",
    "KubeApi",
    "now_micro",
    "now_rfc3339",
    "parse_time",
    "status_message",
]

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def now_rfc3339() -> str:
    """Current UTC time, Kubernetes ``Time`` format (seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """Current UTC time, Kubernetes ``MicroTime`` format."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def status_message(error: ApiException) -> str:
    """The ``message`` of an API error's Status body, else its reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(error.reason or "")


class KubeApi:
    """Raw REST calls against the cluster named by a kubeconfig file."""

    def __init__(self, kubeconfig: Path | str, *, user_agent: str = "agentrun-devcluster") -> None:
        self.kubeconfig = Path(kubeconfig)
        factory: Callable[..., Any] = kube_config.new_client_from_config
        self._client: Any = factory(config_file=str(kubeconfig))
        self._client.user_agent = user_agent

    @property
    def host(self) -> str:
        """The API server URL."""
        return cast(str, self._client.configuration.host)

    def close(self) -> None:
        """Release connection pools."""
        self._client.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] | None = 30.0,
    ) -> Any:
        headers: dict[str, str] = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [
            (k, ("true" if v else "false") if isinstance(v, bool) else str(v))
            for k, v in (query or {}).items()
        ]
        serialized = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self._client.call_api(*serialized, _request_timeout=timeout)
        return resp

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30.0,
    ) -> JSON:
        """Send one request; return the decoded JSON body, raise ``ApiException`` on non-2xx."""
        resp = self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        resp.read()
        text = resp.data.decode("utf-8") if resp.data else ""
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason, body=text)
        return cast(JSON, json.loads(text)) if text else {}

    def get(self, path: str, **query: str | int | bool) -> JSON:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: JSON, **query: str | int | bool) -> JSON:
        return self.request("POST", path, body=body, query=query)

    def put(self, path: str, body: JSON) -> JSON:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: JSON, content_type: str = MERGE_PATCH) -> JSON:
        return self.request("PATCH", path, body=body, content_type=content_type)

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body=body)

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        **query: str | int | bool,
    ) -> Iterator[JSON]:
        """Yield watch events (``{"type": ..., "object": {...}}``) until the server ends it.

        Raises ``ApiException`` for an error response; an ``ERROR`` event (e.g. 410 Gone) is
        yielded as is, for the caller to relist.
        """
        q: dict[str, str | int | bool] = dict(query)
        q.update(
            watch=True,
            resourceVersion=resource_version,
            allowWatchBookmarks=True,
            timeoutSeconds=timeout_seconds,
        )
        resp = self._send("GET", path, query=q, timeout=(10.0, timeout_seconds + 30.0))
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException(status=resp.status, reason=resp.reason, body=resp.data.decode())
        raw = resp.response
        try:
            buf = b""
            for chunk in raw.stream(64 * 1024, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield cast(JSON, json.loads(line))
            if buf.strip():
                yield cast(JSON, json.loads(buf))
        finally:
            raw.release_conn()
