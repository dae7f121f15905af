"""The plugin's connection to the cluster (loaded by :func:`agentrun.kubeapi.load_cluster`, as
kubectl would), its namespace, and API calls whose failures come back as :class:`PluginError`
with a message a person understands."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client as kube_client
from kubernetes import watch as kube_watch
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

import agentrun
from agentrun.api import models as m
from agentrun.core import agent_refs
from agentrun.kubeapi import KubeconfigError, Unreachable, api_message, load_cluster, tolerate

_T = TypeVar("_T")

_Watch: Any = kube_watch.Watch  # the client's watch helper (untyped)

FIELD_MANAGER = "kubectl-agentrun"
"""The field manager of the plugin's writes (metadata.managedFields names who set what)."""


class PluginError(Exception):
    """A failure to report on stderr; ``code`` is the exit code (1 failure, 2 usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def strip_kind(name: str) -> str:
    """Accept ``agentrun/NAME`` (and the plural or short name) as kubectl does."""
    for prefix in (f"{m.SINGULAR}/", f"{m.PLURAL}/", *(f"{n}/" for n in m.SHORT_NAMES)):
        if name.startswith(prefix):
            return name[len(prefix) :]
    for prefix in (f"{m.SINGULAR}.{m.GROUP}/", f"{m.PLURAL}.{m.GROUP}/"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


@dataclass
class Session:
    """API clients for one cluster and the namespace the command works in."""

    api_client: Any
    namespace: str
    server: str

    @classmethod
    def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> Session:
        try:
            # Not persisted: the plugin does not write the person's kubeconfig.
            cluster = load_cluster(kubeconfig, context, persist=False)
        except KubeconfigError as error:
            raise PluginError(str(error)) from None
        # Writes that name no field manager (agentrun release's finalizer patches) are
        # recorded under the User-Agent's first word: the plugin's name too.
        api_client = cluster.api_client(f"{FIELD_MANAGER}/{agentrun.__version__}")
        return cls(
            api_client=api_client,
            namespace=namespace or cluster.namespace or "default",
            server=cluster.server,
        )

    def close(self) -> None:
        self.api_client.close()

    # -- typed API groups ----------------------------------------------------------------

    @property
    def custom(self) -> Any:
        return kube_client.CustomObjectsApi(self.api_client)

    @property
    def core(self) -> Any:
        return kube_client.CoreV1Api(self.api_client)

    def call(self, what: str, fn: Callable[[], _T]) -> _T:
        """Run an API call; connection failures become :class:`Unreachable` naming ``what``."""
        try:
            return fn()
        except (OSError, urllib3.exceptions.HTTPError) as error:
            # MaxRetryError and friends carry the underlying connection error as .reason
            raise Unreachable(
                f"cannot reach the Kubernetes API server at {self.server} to {what}: "
                f"{getattr(error, 'reason', None) or error}"
            ) from None

    @contextmanager
    def reporting(self, what: str) -> Iterator[None]:
        """API errors inside become a PluginError: '<what>: <the API server's message>'."""
        try:
            yield
        except ApiException as error:
            raise PluginError(f"{what}: {api_message(error)}") from None

    # -- AgentRuns -------------------------------------------------------------------------

    def get_run_body(self, name: str) -> dict[str, Any]:
        try:
            body: dict[str, Any] = self.call(
                f"read agentrun '{name}'",
                lambda: self.custom.get_namespaced_custom_object(
                    m.GROUP, m.VERSION, self.namespace, m.PLURAL, name
                ),
            )
        except ApiException as error:
            if error.status == 404:
                if "could not find the requested resource" in api_message(error):
                    raise PluginError(
                        f"the AgentRun API ({m.API_VERSION}) is not installed in this cluster "
                        f"({self.server}): apply crds/ first"
                    ) from None
                raise PluginError(
                    f"agentrun '{name}' not found in namespace '{self.namespace}'"
                ) from None
            raise PluginError(
                f"cannot read agentrun '{name}' in namespace '{self.namespace}': "
                f"{api_message(error)}"
            ) from None
        return body

    def get_run(self, name: str) -> tuple[dict[str, Any], m.AgentRun]:
        """The run as stored (for patches and copies) and parsed (for reading)."""
        body = self.get_run_body(name)
        try:
            # A run of an Agent reads with the agent it took (status.agent.definition).
            return body, agent_refs.effective(m.AgentRun.model_validate(body))
        except ValidationError as error:
            raise PluginError(
                f"agentrun '{name}' in namespace '{self.namespace}' does not match the API this "
                f"plugin knows ({m.API_VERSION}); is the plugin older than the operator?\n{error}"
            ) from None

    def patch_run(self, name: str, body: Any, content_type: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call(
            f"change agentrun '{name}'",
            lambda: self.custom.patch_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, name, body,
                field_manager=FIELD_MANAGER, _content_type=content_type,
            ),
        )  # fmt: skip
        return result

    def create_run(self, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Create an AgentRun; with ``dry_run``, only as a server-side dry run (admission
        checks it, nothing is stored)."""
        extra = {"dry_run": "All"} if dry_run else {}
        result: dict[str, Any] = self.call(
            "create an agentrun",
            lambda: self.custom.create_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, body,
                field_manager=FIELD_MANAGER, **extra,
            ),
        )  # fmt: skip
        return result

    def list_runs(self) -> list[dict[str, Any]]:
        """Every AgentRun of the namespace, as stored."""
        found: dict[str, Any] = self.call(
            "list agentruns",
            lambda: self.custom.list_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL
            ),
        )
        items = found.get("items") or []
        return [i for i in items if isinstance(i, dict)]

    def delete_run(self, name: str) -> None:
        self.call(
            f"delete agentrun '{name}'",
            lambda: self.custom.delete_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, name
            ),
        )

    def watch_run(
        self, name: str, resource_version: str, seconds: float
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """The events of the one run ``name`` after ``resource_version`` (type, object as
        stored), for at most ``seconds`` (the API server closes the watch then). A watch that
        is cut, or goes quiet past that time, just ends: the caller watches again."""
        whole = max(1, math.ceil(seconds))
        watcher = _Watch()
        stream = watcher.stream(
            self.custom.list_namespaced_custom_object,
            m.GROUP, m.VERSION, self.namespace, m.PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=whole,
            _request_timeout=(10, whole + 10),
        )  # fmt: skip
        try:
            for event in stream:
                raw = event.get("raw_object")
                if isinstance(raw, Mapping):
                    yield str(event.get("type")), raw
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError):
            return  # cut or quiet: watched again from the last resourceVersion
        except (OSError, urllib3.exceptions.HTTPError) as error:
            raise Unreachable(
                f"cannot reach the Kubernetes API server at {self.server} to watch agentrun "
                f"'{name}': {getattr(error, 'reason', None) or error}"
            ) from None
        finally:
            watcher.stop()

    # -- Jobs and pods ---------------------------------------------------------------------

    def get_job(self, name: str) -> dict[str, Any] | None:
        """A Job as plain JSON, None when it does not exist."""
        api = kube_client.BatchV1Api(self.api_client)
        with tolerate(404) as missing:
            found = self.call(
                f"read Job '{name}'", lambda: api.read_namespaced_job(name, self.namespace)
            )
        if missing:
            return None
        plain: dict[str, Any] = self.api_client.sanitize_for_serialization(found)
        return plain

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        found = self.call(
            "list pods",
            lambda: self.core.list_namespaced_pod(self.namespace, label_selector=selector),
        )
        items: list[dict[str, Any]] = [
            self.api_client.sanitize_for_serialization(i) for i in found.items
        ]
        return items

    def pod_log(self, pod: str, container: str | None, follow: bool) -> Iterator[bytes]:
        """A container's log as the API server streams it (``pods/log``); with ``follow``,
        until the container ends."""
        response = self.call(
            f"read the log of pod '{pod}'",
            lambda: self.core.read_namespaced_pod_log(
                pod, self.namespace, container=container, follow=follow,
                _preload_content=False,
            ),
        )  # fmt: skip
        try:
            yield from response.stream(4096, decode_content=True)
        finally:
            response.release_conn()

    # -- ConfigMaps --------------------------------------------------------------------------

    def get_config_map(self, name: str) -> dict[str, Any] | None:
        """A ConfigMap as plain JSON (camelCase keys), None when it does not exist."""
        with tolerate(404) as missing:
            found = self.call(
                f"read ConfigMap '{name}'",
                lambda: self.core.read_namespaced_config_map(name, self.namespace),
            )
        if missing:
            return None
        plain: dict[str, Any] = self.api_client.sanitize_for_serialization(found)
        return plain

    def list_config_maps(self, selector: str) -> list[dict[str, Any]]:
        found = self.call(
            "list ConfigMaps",
            lambda: self.core.list_namespaced_config_map(self.namespace, label_selector=selector),
        )
        items: list[dict[str, Any]] = [
            self.api_client.sanitize_for_serialization(i) for i in found.items
        ]
        return items

    def create_config_map(self, body: dict[str, Any]) -> None:
        self.call(
            f"create ConfigMap '{body['metadata']['name']}'",
            lambda: self.core.create_namespaced_config_map(
                self.namespace, body, field_manager=FIELD_MANAGER
            ),
        )

    # -- who am I --------------------------------------------------------------------------

    def username(self) -> str:
        """The user the API server sees, by a SelfSubjectReview."""
        api = kube_client.AuthenticationV1Api(self.api_client)
        body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            review = self.call(
                "find out who you are", lambda: api.create_self_subject_review(body=body)
            )
        except ApiException as error:
            raise PluginError(
                "cannot find out who you are (SelfSubjectReview, authentication.k8s.io/v1): "
                f"{api_message(error)}"
            ) from None
        user = review.status.user_info if review.status is not None else None
        name = getattr(user, "username", None)
        if not name:
            raise PluginError("the API server did not say who you are (empty SelfSubjectReview)")
        return str(name)
