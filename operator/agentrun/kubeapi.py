"""Small pieces of talking to the Kubernetes API that every caller needs done the same way.

Refusals a caller expects and lets pass: many calls have an answer that is not a failure, 404
on a delete (already gone), 409 on a create (already there, e.g. a Job adopted after a crash).
:func:`tolerate` names those statuses at the call site and reports whether one was met; any
other refusal propagates unchanged::

    with tolerate(409) as exists:
        batch.create_namespaced_job(namespace, manifest)
    if exists:
        log.info("adopted")

Also: the one way to load a cluster's configuration (:func:`load_cluster`: a kubeconfig, else
the in-cluster ServiceAccount), how a refusal is told to a person (:func:`api_message`), the
content types of patches, the items of a list call as plain JSON, and the guarded patch that
removes a finalizer.

How long a call may wait for the API server, in one place (:meth:`Cluster.api_client`): every
request gets a connect limit and a read limit (:func:`request_timeout`), a watch a read limit a
little above the ``timeoutSeconds`` it asks of the server, so that a connection that is
accepted but never answered (a proxy that lost its backend) fails instead of holding its
caller; and which failures are the API server being away or asking for a wait, retried as a
matter of course (:func:`transient`), rather than something wrong with the request.

The kubernetes client is imported inside the functions that need it: the step runner uses this
module and starts without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
IN_CLUSTER = "the in-cluster ServiceAccount"


class Unreachable(Exception):
    """The API server did not answer (no refusal: no answer at all); the message says which
    server and what for."""


class KubeconfigError(Exception):
    """The cluster configuration cannot be loaded as asked; the message says why."""


@dataclass(frozen=True)
class Cluster:
    """A cluster's configuration as loaded, and the namespace its context names."""

    configuration: Any
    """A ``kubernetes.client.Configuration``."""
    namespace: str | None = None
    """The kubeconfig context's namespace; in a pod, its ServiceAccount's; else None."""

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    def api_client(self, user_agent: str | None = None) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the cluster, whose connections find out
        that the API server went silent (:func:`dead_peer_options`), whose requests wait
        within bounds (a call that names no ``_request_timeout`` gets
        :func:`request_timeout`'s), and which tries a request that got no answer once more
        (:data:`REQUEST_RETRIES`), not three times. The API server records a write that names
        no field manager under the User-Agent's first word."""
        import urllib3
        from kubernetes import client as kube_client

        if self.configuration.socket_options is None:
            self.configuration.socket_options = dead_peer_options()
        if self.configuration.retries is None:
            self.configuration.retries = urllib3.Retry(total=REQUEST_RETRIES)
        client = kube_client.ApiClient(self.configuration)
        if user_agent:
            client.user_agent = user_agent
        return bounded(client)


KEEPALIVE_IDLE_SECONDS = 10
"""How long a connection to the API server may carry nothing before TCP asks the server
whether it is still there (then every :data:`KEEPALIVE_INTERVAL_SECONDS`)."""
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_PROBES = 3
UNACKNOWLEDGED_SECONDS = 20
"""How long what was sent to the API server (a request, a keepalive probe, a connection's
first packet) may stay unacknowledged before the connection is given up (TCP_USER_TIMEOUT)."""


def dead_peer_options() -> list[tuple[int, int, int]]:
    """Socket options (urllib3's own defaults, then TCP keepalive and TCP_USER_TIMEOUT) under
    which a connection whose packets are dropped on the way (a network partition, a peer
    that vanished without a reset) fails within about half a minute, idle or not, instead of
    after the kernel's defaults: two hours for an idle connection, about fifteen minutes for
    one waiting on an acknowledgement. A watch that waits on such a connection would
    otherwise never deliver again, and a pass would hold its worker as long. Answers that are
    only slow are not cut short: the server's kernel acknowledges the probes."""
    import socket

    import urllib3

    options: list[tuple[int, int, int]] = list(
        urllib3.connection.HTTPConnection.default_socket_options
    )
    options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_SECONDS),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_SECONDS),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", UNACKNOWLEDGED_SECONDS * 1000),
    ):
        if hasattr(socket, name):  # Linux has them all; other systems some
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def dead_peer_socket(addr_info: tuple[Any, ...]) -> Any:
    """A new socket for ``addr_info`` (``(family, type, proto, ...)``, as ``getaddrinfo``
    gives) with :func:`dead_peer_options` when it is TCP: a ``socket_factory`` for aiohttp,
    the client kopf's own requests and watches use."""
    import socket

    family, type_, proto = addr_info[:3]
    sock = socket.socket(family, type_, proto)
    if family in (socket.AF_INET, socket.AF_INET6) and type_ == socket.SOCK_STREAM:
        try:
            for level, option, value in dead_peer_options():
                sock.setsockopt(level, option, value)
        except OSError:
            sock.close()
            raise
    return sock


CONNECT_SECONDS = 10.0
"""How long a new connection to the API server may take, TLS handshake included."""
READ_SECONDS = 30.0
"""How long a request that is not a watch may wait for each read of its answer. Below the API
server's own limit on such a request (``--request-timeout``, one minute: an admission webhook
may take up to 30 s of it): a write cut short so may still have been done, which the callers
expect of any request whose answer is lost (a Job already there is adopted, a status write
meets a 409 and is derived again), so cutting it costs a retry, never a decision."""
REQUEST_RETRIES = 1
"""How many times the client tries again, at once, a request that got no answer (a pooled
connection the server had closed, a connection refused or never answered): once, so that a
request waits at most about :data:`READ_SECONDS` + :data:`CONNECT_SECONDS` on a path that
accepts connections and answers nothing. Callers retry what fails after that."""
WATCH_SECONDS = int(os.environ.get("AGENTRUN_WATCH_SECONDS") or 300)
"""The ``timeoutSeconds`` every watch asks of the API server (``AGENTRUN_WATCH_SECONDS``): the
server ends the watch then, quiet or not, and it is made again from the last version seen. A
watch hears something at least every :data:`BOOKMARK_SECONDS` while the server answers (the
bookmarks every watch asks for), so its liveness rests on those, not on ending it often: each
end is one more request, per watch and per namespace watched."""
WATCH_GRACE_SECONDS = 15
"""How much longer than the longest silence of a server that answers (a bookmark's interval,
or the watch's ``timeoutSeconds`` if that is shorter) a watch waits before it is given up."""
BOOKMARK_SECONDS = 60
"""How often the API server sends a bookmark to a watch that asks for them and that its watch
cache serves, at the least (``defaultBookmarkFrequency`` in k8s.io/apiserver's cacher: "roughly
every minute"). A watch etcd serves (the watch cache off for its resource) gets none: its
silence is bounded by its ``timeoutSeconds`` alone."""
SERVER_REQUEST_SECONDS = 60.0
"""The API server's own limit on a request that is not a watch (``--request-timeout``)."""


def watch_silence(timeout_seconds: float | None, bookmarks: bool = True) -> float | None:
    """How long a watch that asked for ``timeoutSeconds`` (and, with ``bookmarks``, for
    bookmarks) may hear nothing, not an event, not a bookmark, not its end, before it is
    taken for dead: the longest silence of a server that answers, plus
    :data:`WATCH_GRACE_SECONDS`. None when nothing bounds it (no timeout, no bookmarks)."""
    quiet = [t for t in (timeout_seconds, BOOKMARK_SECONDS if bookmarks else None) if t]
    return min(quiet) + WATCH_GRACE_SECONDS if quiet else None


WATCH_SILENCE_SECONDS = watch_silence(WATCH_SECONDS) or float(WATCH_SECONDS)
"""How long every watch of the operator's (its own, and kopf's of runs) may hear nothing, not
an event, not a bookmark, not its end, before it is taken for dead and made again from the
last version seen; ``/readyz`` names such a watch as dead then."""


def request_timeout(method: str, url: str) -> tuple[float, float | None]:
    """The ``(connect, read)`` limits of a request to ``url`` (path and query) that names
    none: a watch (``watch=true``) waits :func:`watch_silence` of the ``timeoutSeconds`` and
    ``allowWatchBookmarks`` it asks for; a followed log (``follow=true``: ``kubectl agentrun
    logs -f``) as long as the container writes nothing, which the person following it ends;
    any other request :data:`READ_SECONDS`."""
    query = {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
    if method.upper() == "GET" and query.get("follow", "").lower() in ("true", "1"):
        return CONNECT_SECONDS, None
    if method.upper() == "GET" and query.get("watch", "").lower() in ("true", "1"):
        try:
            asked: float | None = float(query.get("timeoutSeconds") or 0) or None
        except ValueError:
            asked = None
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        return CONNECT_SECONDS, watch_silence(asked, bookmarks)
    return CONNECT_SECONDS, READ_SECONDS


def bounded(api_client: Any) -> Any:
    """Give every request of ``api_client`` (a ``kubernetes.client.ApiClient``) that names no
    ``_request_timeout`` the limits of :func:`request_timeout`, by wrapping the one method
    all of them pass through (``call_api``); returns the client."""
    send: Callable[..., Any] = api_client.call_api
    if getattr(send, "_agentrun_bounded", False):
        return api_client

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        # call_api(method, url, header_params, body, post_params, _request_timeout)
        if len(args) >= 4:
            if args[3] is None:
                args = (*args[:3], request_timeout(method, url), *args[4:])
        elif kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = request_timeout(method, url)
        return send(method, url, *args, **kwargs)

    call_api._agentrun_bounded = True  # type: ignore[attr-defined]
    api_client.call_api = call_api
    return api_client


def kubeconfig_paths(explicit: str | None = None) -> str | None:
    """The kubeconfig file(s) kubectl would read: ``explicit``, $KUBECONFIG (paths joined by
    ``os.pathsep``), ~/.kube/config; None when there is none. A file named that does not
    exist (for $KUBECONFIG: none of them) is a :class:`KubeconfigError`."""
    if explicit:
        if not Path(explicit).expanduser().is_file():
            raise KubeconfigError(f"kubeconfig '{explicit}' does not exist")
        return explicit
    env = os.environ.get("KUBECONFIG", "")
    if env:
        if not any(Path(p).expanduser().is_file() for p in env.split(os.pathsep) if p):
            raise KubeconfigError(f"none of the kubeconfig files in $KUBECONFIG exist: {env}")
        return env
    default = Path("~/.kube/config").expanduser()
    return str(default) if default.is_file() else None


def load_cluster(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    fall_back: bool = False,
    persist: bool = True,
) -> Cluster:
    """The cluster of ``context`` (default: the current one) in the kubeconfig
    (:func:`kubeconfig_paths`, $KUBECONFIG read now), else of the in-cluster ServiceAccount.

    Without ``fall_back`` (kubectl's way) a kubeconfig that is named but missing, or cannot be
    loaded, is a :class:`KubeconfigError` saying why, and so is an in-cluster configuration
    that cannot be loaded; the ServiceAccount is tried only when there is no kubeconfig at all.
    With ``fall_back`` (the operator and the typed client: one of the two works where they
    run) any trouble with the kubeconfig means trying the ServiceAccount, whose own
    ``ConfigException`` then propagates. ``persist``: a token an auth provider refreshes is
    written back to the kubeconfig.
    """
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config

    paths: str | None = None
    try:
        paths = kubeconfig_paths(kubeconfig)
        if paths is not None:
            return _from_kubeconfig(paths, context, persist)
    except KubeconfigError:
        if not fall_back:
            raise
    except kube_config.ConfigException as error:
        if not fall_back:
            raise KubeconfigError(
                f"cannot load the cluster configuration from {paths}: {error}"
            ) from None
    if context and paths is None:
        raise KubeconfigError(f"--context {context}: no kubeconfig found")
    configuration = kube_client.Configuration()
    load_incluster: Callable[..., Any] = kube_config.load_incluster_config
    try:
        load_incluster(client_configuration=configuration)
    except kube_config.ConfigException as error:
        if fall_back:
            raise
        raise KubeconfigError(
            f"cannot load the cluster configuration from {IN_CLUSTER}: {error}"
        ) from None
    namespace = None
    if SERVICEACCOUNT_NAMESPACE.is_file():
        namespace = SERVICEACCOUNT_NAMESPACE.read_text().strip() or None
    return Cluster(configuration, namespace)


def _from_kubeconfig(paths: str, context: str | None, persist: bool) -> Cluster:
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config

    # The kubernetes package's config loaders are untyped; named as Any.
    list_contexts: Callable[..., Any] = kube_config.list_kube_config_contexts
    load: Callable[..., Any] = kube_config.load_kube_config
    contexts, chosen = list_contexts(config_file=paths)
    if context:
        chosen = next((c for c in contexts or [] if c.get("name") == context), None)
        if chosen is None:
            known = ", ".join(str(c.get("name")) for c in contexts or [])
            raise KubeconfigError(
                f"context '{context}' not found in the kubeconfig (contexts: {known})"
            )
    configuration = kube_client.Configuration()
    load(
        config_file=paths,
        context=context,
        client_configuration=configuration,
        persist_config=persist,
    )
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return Cluster(configuration, namespace)


RETRY_AFTER_MAX_SECONDS = 60.0
"""The longest wait a Retry-After of the API server is taken at."""


def throttled(error: BaseException) -> float | None:
    """For a refusal with 429 Too Many Requests (API Priority and Fairness shedding load, or a
    request that must wait), the seconds its Retry-After asks to wait (1 when it names none,
    at most :data:`RETRY_AFTER_MAX_SECONDS`); None for anything else."""
    if getattr(error, "status", None) != 429:
        return None
    headers = getattr(error, "headers", None) or {}
    try:
        wait = float(headers.get("Retry-After") or 1)
    except (TypeError, ValueError):  # an HTTP date, or nonsense: wait the least
        wait = 1.0
    return min(max(wait, 1.0), RETRY_AFTER_MAX_SECONDS)


UNREACHABLE = "unreachable"
UNAVAILABLE = "unavailable"
THROTTLED = "throttled"
TERMINATING = "namespace_terminating"
"""The API server refused a create (403) because the namespace is being deleted: the run goes
with it, and the pass is tried again until it has gone."""
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
"""Answers that say the API server cannot serve the request now (a proxy without a backend,
the server not ready or out of time), not that the request is wrong."""
DETAIL_CHARS = 300


@dataclass(frozen=True)
class Transient:
    """A failure that says the API server is away or asks for a wait, not that the request is
    wrong: the caller tries again later, logs one line (:attr:`says`), no traceback."""

    reason: str
    """:data:`UNREACHABLE` (no answer at all: a connection refused, broken or timed out),
    :data:`UNAVAILABLE` (502, 503 or 504), :data:`THROTTLED` (429) or :data:`TERMINATING` (a
    create refused in a namespace being deleted)."""
    detail: str
    """One line: what the client or the server said."""
    wait: float | None = None
    """For 429: the seconds its Retry-After asks (:func:`throttled`)."""

    @property
    def says(self) -> str:
        """The end of a log line that begins with what failed: "reconcile" + says."""
        if self.reason == THROTTLED:
            return f"throttled by the API server (429: {self.detail})"
        if self.reason == UNAVAILABLE:
            return f"failed: the API server is unavailable ({self.detail})"
        if self.reason == TERMINATING:
            return f"refused: the namespace is being deleted ({self.detail})"
        return f"failed: the API server did not answer ({self.detail})"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:DETAIL_CHARS]


def _no_answer(error: BaseException) -> str | None:
    """What the client said, when ``error`` means that no answer came."""
    import http.client

    import urllib3

    no_answer = (
        urllib3.exceptions.MaxRetryError,
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.TimeoutError,
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.SSLError,
        http.client.HTTPException,
        ConnectionError,
        TimeoutError,
        Unreachable,
    )
    if not isinstance(error, no_answer):
        return None
    cause: BaseException = error
    if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
        cause = error.reason
    return _one_line(f"{type(cause).__name__}: {cause}")


def transient(error: BaseException) -> Transient | None:
    """``error`` (or the error it was raised from) as the API server being away or asking for
    a wait (:class:`Transient`); None for anything else: a refusal of the request, a bug."""
    seen: BaseException | None = error
    for _ in range(3):  # the error, and what it was raised from
        if seen is None:
            return None
        wait = throttled(seen)
        status = getattr(seen, "status", None)
        if wait is not None:
            return Transient(THROTTLED, _one_line(api_message(seen)), wait)  # type: ignore[arg-type]
        if status in UNAVAILABLE_STATUSES:
            return Transient(UNAVAILABLE, _one_line(api_message(seen)))  # type: ignore[arg-type]
        if status == 403 and _namespace_terminating(seen):
            return Transient(TERMINATING, _one_line(api_message(seen)))  # type: ignore[arg-type]
        said = str(getattr(seen, "reason", None) or "")
        if status == 0 and said.startswith("SSLError"):  # the kubernetes client's wrapping
            return Transient(UNREACHABLE, _one_line(said))
        no_answer = _no_answer(seen)
        if no_answer is not None:
            return Transient(UNREACHABLE, no_answer)
        seen = seen.__cause__
    return None


def _namespace_terminating(error: BaseException) -> bool:
    """Whether a 403 is the API server refusing new content in a namespace being deleted (its
    Status names the cause ``NamespaceTerminating``)."""
    body = getattr(error, "body", None)
    try:
        parsed = json.loads(body) if body else None
    except (TypeError, ValueError):
        return False
    causes = (
        ((parsed or {}).get("details") or {}).get("causes") or []
        if isinstance(parsed, dict)
        else []
    )
    return any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes)


def api_message(error: ApiException) -> str:
    """The API server's own words (the ``message`` of its Status), else the HTTP reason."""
    body = getattr(error, "body", None)
    if body:
        try:
            parsed = json.loads(body)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])
        if isinstance(body, str | bytes):
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            return text.strip()[:500]
    return f"HTTP {error.status} {error.reason or ''}".strip()


@dataclass
class Tolerated:
    """What a :func:`tolerate` block let pass: nothing, or one refusal of the API."""

    error: ApiException | None = None

    @property
    def status(self) -> int | None:
        """The HTTP status of the refusal let pass, None when the call succeeded."""
        return None if self.error is None else int(self.error.status)

    def __bool__(self) -> bool:
        """True when the block met one of the tolerated statuses."""
        return self.error is not None


@contextmanager
def tolerate(*statuses: int) -> Iterator[Tolerated]:
    """Let an ``ApiException`` with one of ``statuses`` pass (recorded in the yielded
    :class:`Tolerated`); re-raise any other."""
    # Imported here: the step runner uses this module and starts without the kubernetes client.
    from kubernetes.client.exceptions import ApiException

    tolerated = Tolerated()
    try:
        yield tolerated
    except ApiException as error:
        if error.status not in statuses:
            raise
        tolerated.error = error


METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}
"""A list call's headers (``_headers=``) asking for the objects' metadata only: their items
are then ``PartialObjectMetadata`` (apiVersion, kind, metadata), for :func:`list_items`."""
VERSION_ANSWER = "application/json;as=Table;g=meta.k8s.io;v=v1, application/json"
"""A write's ``Accept`` asking, with ``includeObject=None``, for a Table without the object:
its ``metadata.resourceVersion`` is the version the write made (an API server that cannot
answer so answers with the whole object, whose ``metadata.resourceVersion`` is the same). A
PartialObjectMetadata answer carries ``managedFields``, which grows with the object (every
field of every entry of a plan's steps)."""


def patch_status(
    custom: Any,
    group: str,
    version: str,
    plural: str,
    namespace: str,
    name: str,
    ops: list[dict[str, Any]],
    field_manager: str,
) -> str:
    """One JSON patch of an object's status subresource; the resourceVersion it wrote.

    The answer is a Table without the object (:data:`VERSION_ANSWER`), so that its size does
    not grow with the object's: the generated client cannot ask for ``includeObject``, so the
    request is made through its ``ApiClient`` as its own methods make it. A refusal raises
    ``ApiException``, as the client's methods do."""
    from kubernetes.client.exceptions import ApiException

    api = custom.api_client
    request = api.param_serialize(
        method="PATCH",
        resource_path="/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
        path_params={
            "group": group,
            "version": version,
            "namespace": namespace,
            "plural": plural,
            "name": name,
        },
        query_params=[("fieldManager", field_manager), ("includeObject", "None")],
        header_params={"Content-Type": JSON_PATCH, "Accept": VERSION_ANSWER},
        body=ops,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    written = json.loads(response.data)["metadata"]["resourceVersion"]
    if not isinstance(written, str) or not written:
        raise ValueError(f"a status write of {namespace}/{name} answered no resourceVersion")
    return written


def list_items(response: Any) -> list[dict[str, Any]]:
    """Items of a list call made with ``_preload_content=False``: the API server's own JSON,
    without building the client's typed models (much faster for long lists)."""
    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


def finalizer_addition(
    finalizers: Sequence[str] | None, finalizer: str, resource_version: str
) -> list[dict[str, Any]]:
    """A JSON patch adding ``finalizer`` to an object read as ``finalizers`` (None: the
    object has no list) at ``resource_version``, guarded by a ``test`` op on that version so
    that it fails (422) rather than acting on an object that changed since."""
    add = (
        {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}
        if finalizers is not None
        else {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}
    )
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}, add]


def label_addition(labels: Mapping[str, str] | None, key: str, value: str) -> dict[str, Any]:
    """The JSON patch op setting label ``key`` to ``value`` on an object read with
    ``labels`` (None: the object has none)."""
    if labels is None:
        return {"op": "add", "path": "/metadata/labels", "value": {key: value}}
    path = key.replace("~", "~0").replace("/", "~1")
    return {"op": "add", "path": f"/metadata/labels/{path}", "value": value}


def finalizer_removal(finalizers: Sequence[str], finalizer: str) -> list[dict[str, Any]] | None:
    """A JSON patch removing ``finalizer`` from an object whose finalizers were read as
    ``finalizers``, guarded by a ``test`` op so that it fails (422) rather than removing
    another finalizer when the list changed since; None when ``finalizer`` is not there."""
    if finalizer not in finalizers:
        return None
    index = list(finalizers).index(finalizer)
    return [
        {"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) that turns document ``old`` into ``new``, each at ``path``:
    objects are compared key by key, lists element by element (a list that lost elements at
    its front and gained some at its end, as a ring does, as removals and additions), and
    what differs below is replaced where it differs. Equal subtrees cost one comparison and
    no op, so the patch is as large as the change, not as the document. Leaves compare as
    Python does (``1 == True``): a value that changes only between such twins is not
    written (typed models never do that)."""
    ops: list[dict[str, Any]] = []
    _diff(old, new, path, ops)
    return ops


def _pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _diff(old: Any, new: Any, path: str, ops: list[dict[str, Any]]) -> None:
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{_pointer(key)}"})
        for key, value in new.items():
            if key in old:
                _diff(old[key], value, f"{path}/{_pointer(key)}", ops)
            else:
                ops.append({"op": "add", "path": f"{path}/{_pointer(key)}", "value": value})
        return
    if isinstance(old, list) and isinstance(new, list) and path:
        _diff_list(old, new, path, ops)
        return
    ops.append({"op": "replace" if path else "add", "path": path, "value": new})


def _diff_list(old: list[Any], new: list[Any], path: str, ops: list[dict[str, Any]]) -> None:
    shift = _shift(old, new)
    for _ in range(shift):
        ops.append({"op": "remove", "path": f"{path}/0"})
    kept = old[shift:]
    for index, value in enumerate(new[: len(kept)]):
        _diff(kept[index], value, f"{path}/{index}", ops)
    for index in range(len(kept) - 1, len(new) - 1, -1):
        ops.append({"op": "remove", "path": f"{path}/{index}"})
    for value in new[len(kept) :]:
        ops.append({"op": "add", "path": f"{path}/-", "value": value})


def _shift(old: list[Any], new: list[Any]) -> int:
    """How many elements ``old`` lost at its front to become a prefix of ``new`` (a ring
    that dropped its oldest entries); 0 when it did not."""
    if not old or not new or old[0] == new[0]:
        return 0
    for shift in range(1, len(old)):
        if old[shift] == new[0]:
            rest = old[shift:]
            return shift if rest == new[: len(rest)] else 0
    return 0
