"""The plugin's connection to the cluster: kubeconfig, namespace, and API calls whose
failures come back as :class:`PluginError` with a message a person understands."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

import agentrun
from agentrun.api import models as m
from agentrun.execution import objects
from agentrun.kubeapi import api_message, tolerate

_T = TypeVar("_T")

# The kubernetes package's config loaders are untyped; name them once, as Any.
_load_incluster: Callable[..., Any] = kube_config.load_incluster_config
_list_contexts: Callable[..., Any] = kube_config.list_kube_config_contexts
_load_kubeconfig: Callable[..., Any] = kube_config.load_kube_config

SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
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


def _kubeconfig_paths(explicit: str | None) -> str | None:
    """The kubeconfig file(s) kubectl would read: --kubeconfig, $KUBECONFIG, ~/.kube/config;
    None when there is none (then the in-cluster ServiceAccount is tried)."""
    if explicit:
        if not Path(explicit).expanduser().is_file():
            raise PluginError(f"kubeconfig '{explicit}' does not exist")
        return explicit
    env = os.environ.get("KUBECONFIG", "")
    if env:
        if not any(Path(p).expanduser().is_file() for p in env.split(os.pathsep) if p):
            raise PluginError(f"none of the kubeconfig files in $KUBECONFIG exist: {env}")
        return env
    default = Path("~/.kube/config").expanduser()
    return str(default) if default.is_file() else None


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
        paths = _kubeconfig_paths(kubeconfig)
        configuration = kube_client.Configuration()
        context_namespace: str | None = None
        try:
            if paths is None:
                if context:
                    raise PluginError(f"--context {context}: no kubeconfig found")
                _load_incluster(client_configuration=configuration)
                if SERVICEACCOUNT_NAMESPACE.is_file():
                    context_namespace = SERVICEACCOUNT_NAMESPACE.read_text().strip() or None
            else:
                contexts, current = _list_contexts(config_file=paths)
                chosen = current
                if context:
                    chosen = next((c for c in contexts or [] if c.get("name") == context), None)
                    if chosen is None:
                        known = ", ".join(str(c.get("name")) for c in contexts or [])
                        raise PluginError(
                            f"context '{context}' not found in the kubeconfig (contexts: {known})"
                        )
                context_namespace = ((chosen or {}).get("context") or {}).get("namespace")
                _load_kubeconfig(
                    config_file=paths,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except kube_config.ConfigException as error:
            where = paths or "the in-cluster ServiceAccount"
            raise PluginError(
                f"cannot load the cluster configuration from {where}: {error}"
            ) from None
        api_client = kube_client.ApiClient(configuration)
        # Writes that name no field manager (agentrun release's finalizer patches) are
        # recorded under the User-Agent's first word: the plugin's name too.
        api_client.user_agent = f"{FIELD_MANAGER}/{agentrun.__version__}"
        return cls(
            api_client=api_client,
            namespace=namespace or context_namespace or "default",
            server=str(configuration.host),
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
        """Run an API call; connection failures become a PluginError naming ``what``."""
        try:
            return fn()
        except (OSError, urllib3.exceptions.HTTPError) as error:
            # MaxRetryError and friends carry the underlying connection error as .reason
            raise PluginError(
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
            return body, m.AgentRun.model_validate(body)
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

    def delete_run(self, name: str) -> None:
        self.call(
            f"delete agentrun '{name}'",
            lambda: self.custom.delete_namespaced_custom_object(
                m.GROUP, m.VERSION, self.namespace, m.PLURAL, name
            ),
        )

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

    def audit_record(self, run: m.AgentRun) -> list[dict[str, Any]]:
        """The ConfigMaps labelled as the run's audit record (none while the operator keeps
        no record); :func:`agentrun.access.audit.select` tells the record from imitations."""
        return self.list_config_maps(objects.owned_by(run.metadata.uid, "audit"))

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
