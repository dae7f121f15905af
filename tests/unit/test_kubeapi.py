"""Expected refusals of the Kubernetes API pass; any other still fails the call. A refusal is
told to a person in the API server's own words. The cluster's configuration comes from the
kubeconfig kubectl would read, else the in-cluster ServiceAccount. Every request waits within
bounds (a watch a little longer than it asks the server to last), and the API server being
away, unavailable or throttling is told apart from a refusal of the request."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException

from agentrun.kubeapi import (
    CONNECT_SECONDS,
    READ_SECONDS,
    TERMINATING,
    THROTTLED,
    UNACKNOWLEDGED_SECONDS,
    UNAVAILABLE,
    UNREACHABLE,
    WATCH_GRACE_SECONDS,
    WATCH_SECONDS,
    Cluster,
    KubeconfigError,
    Unreachable,
    api_message,
    dead_peer_options,
    dead_peer_socket,
    finalizer_addition,
    finalizer_removal,
    kubeconfig_paths,
    list_items,
    load_cluster,
    request_timeout,
    throttled,
    tolerate,
    transient,
    watch_silence,
)


def test_a_tolerated_status_is_let_pass_and_recorded() -> None:
    with tolerate(404, 409) as exists:
        raise ApiException(status=409, reason="AlreadyExists")
    assert exists and exists.status == 409
    assert exists.error is not None and exists.error.reason == "AlreadyExists"


def test_a_call_that_succeeds_records_nothing() -> None:
    with tolerate(404) as gone:
        pass
    assert not gone and gone.status is None and gone.error is None


def test_any_other_status_propagates_unchanged() -> None:
    refusal = ApiException(status=403, reason="Forbidden")
    with pytest.raises(ApiException) as raised, tolerate(404, 409):
        raise refusal
    assert raised.value is refusal


def test_other_errors_propagate() -> None:
    with pytest.raises(ValueError), tolerate(404):
        raise ValueError("not an API refusal")


def test_list_items_are_the_api_servers_json() -> None:
    class Response:
        data = b'{"kind": "JobList", "items": [{"metadata": {"name": "j"}}]}'

    class Empty:
        data = b'{"kind": "JobList", "items": null}'

    assert list_items(Response()) == [{"metadata": {"name": "j"}}]
    assert list_items(Empty()) == []


def test_a_finalizer_is_removed_by_a_patch_that_checks_it_is_still_there() -> None:
    assert finalizer_removal(["a/x", "b/y"], "b/y") == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": "b/y"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert finalizer_removal(["a/x"], "b/y") is None
    assert finalizer_removal([], "b/y") is None


def test_a_finalizer_is_added_by_a_patch_that_checks_the_object_did_not_change() -> None:
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert finalizer_addition(["a/x"], "b/y", "41") == [
        test,
        {"op": "add", "path": "/metadata/finalizers/-", "value": "b/y"},
    ]
    assert finalizer_addition([], "b/y", "41")[1]["path"] == "/metadata/finalizers/-"
    assert finalizer_addition(None, "b/y", "41") == [
        test,
        {"op": "add", "path": "/metadata/finalizers", "value": ["b/y"]},
    ]


def test_a_refusal_is_told_in_the_api_servers_words_else_its_body_else_its_status() -> None:
    status = '{"kind": "Status", "message": "agentruns.agentrun.dev \\"x\\" not found"}'
    assert api_message(ApiException(status=404, reason="Not Found")) == "HTTP 404 Not Found"
    refused = ApiException(status=404, reason="Not Found")
    refused.body = status
    assert api_message(refused) == 'agentruns.agentrun.dev "x" not found'
    plain = ApiException(status=502, reason="Bad Gateway")
    raw: Any = b"  upstream went away \n"  # a body urllib3 did not decode
    plain.body = raw
    assert api_message(plain) == "upstream went away"
    plain.body = "x" * 600
    assert api_message(plain) == "x" * 500


# -- the cluster's configuration ------------------------------------------------------------


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No $KUBECONFIG, an empty home (no ~/.kube/config) and not in a pod."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def kubeconfig(path: Path, server: str, *contexts: tuple[str, str | None]) -> Path:
    """A kubeconfig with one cluster at ``server`` and ``contexts`` (name, namespace); the
    first is the current one."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": server, "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {
                        "name": name,
                        "context": {"cluster": server, "user": "u"}
                        | ({"namespace": namespace} if namespace else {}),
                    }
                    for name, namespace in contexts
                ],
                "current-context": contexts[0][0],
            }
        )
    )
    return path


def test_a_kubeconfig_named_gives_its_current_or_chosen_contexts_cluster_and_namespace(
    nowhere: Path,
) -> None:
    config = kubeconfig(nowhere / "config", "https://a:6443", ("a", "team"), ("b", None))
    cluster = load_cluster(str(config))
    assert (cluster.server, cluster.namespace) == ("https://a:6443", "team")
    assert load_cluster(str(config), "b").namespace is None
    with pytest.raises(KubeconfigError) as unknown:
        load_cluster(str(config), "zz")
    assert str(unknown.value) == "context 'zz' not found in the kubeconfig (contexts: a, b)"
    client = cluster.api_client("someone/1.0")
    assert client.user_agent == "someone/1.0"
    client.close()


def test_kubeconfig_may_name_several_files_as_kubectl_merges_them(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(nowhere / "first", "https://one:6443", ("one", "x"))
    second = kubeconfig(nowhere / "second", "https://two:6443", ("two", "y"))
    paths = os.pathsep.join([str(nowhere / "missing"), str(first), str(second)])
    monkeypatch.setenv("KUBECONFIG", paths)
    assert kubeconfig_paths() == paths
    assert load_cluster(context="one").server == "https://one:6443"
    chosen = load_cluster(context="two")
    assert (chosen.server, chosen.namespace) == ("https://two:6443", "y")
    monkeypatch.setenv("HOME", str(nowhere))
    (nowhere / ".kube").mkdir()
    kubeconfig(nowhere / ".kube" / "config", "https://home:6443", ("home", None))
    with pytest.raises(KubeconfigError, match="context 'home' not found"):
        load_cluster(context="home")  # $KUBECONFIG comes before ~/.kube/config
    monkeypatch.delenv("KUBECONFIG")
    assert load_cluster().server == "https://home:6443"


def test_a_kubeconfig_named_but_missing_is_an_error_unless_falling_back(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = nowhere / "nope"
    with pytest.raises(KubeconfigError, match=f"^kubeconfig '{missing}' does not exist$"):
        load_cluster(str(missing))
    monkeypatch.setenv("KUBECONFIG", str(missing))
    with pytest.raises(KubeconfigError) as none:
        load_cluster()
    assert str(none.value) == f"none of the kubeconfig files in $KUBECONFIG exist: {missing}"
    # Falling back, the in-cluster ServiceAccount is tried instead; outside a pod its own
    # error is the one raised.
    with pytest.raises(ConfigException) as in_cluster:
        load_cluster(fall_back=True)
    assert not isinstance(in_cluster.value, KubeconfigError)


def test_a_kubeconfig_that_cannot_be_loaded_is_an_error_unless_falling_back(
    nowhere: Path,
) -> None:
    broken = nowhere / "broken"
    broken.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": []}))
    with pytest.raises(
        KubeconfigError, match=f"^cannot load the cluster configuration from {broken}: "
    ):
        load_cluster(str(broken))
    with pytest.raises(ConfigException):
        load_cluster(str(broken), fall_back=True)


def test_without_a_kubeconfig_only_the_service_account_is_left(nowhere: Path) -> None:
    assert kubeconfig_paths() is None
    with pytest.raises(KubeconfigError) as outside:
        load_cluster()
    assert str(outside.value).startswith(
        "cannot load the cluster configuration from the in-cluster ServiceAccount: "
    )
    with pytest.raises(KubeconfigError, match=r"^--context c: no kubeconfig found$"):
        load_cluster(context="c")


def test_connections_to_the_api_server_give_up_on_a_silent_peer() -> None:
    from kubernetes import client as kube_client

    options = dead_peer_options()
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options
    assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in options  # urllib3's own default
    user_timeout = (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKNOWLEDGED_SECONDS * 1000)
    assert user_timeout in options
    with socket.socket() as sock:  # the kernel takes every one of them
        for level, name, value in options:
            sock.setsockopt(level, name, value)
        assert sock.getsockopt(*user_timeout[:2]) == UNACKNOWLEDGED_SECONDS * 1000
    cluster = Cluster(kube_client.Configuration())
    client = cluster.api_client("agentrun/test")
    try:
        assert cluster.configuration.socket_options == options
    finally:
        client.close()


def test_sockets_made_for_aiohttp_carry_the_same_options() -> None:
    tcp = socket.getaddrinfo("127.0.0.1", 0, type=socket.SOCK_STREAM)[0]
    with dead_peer_socket(tcp) as sock:
        for level, name, value in dead_peer_options():
            assert sock.getsockopt(level, name) == value
    udp = socket.getaddrinfo("127.0.0.1", 0, type=socket.SOCK_DGRAM)[0]
    with dead_peer_socket(udp) as sock:  # not TCP: left as it is
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0


def test_a_429_is_waited_out_as_its_retry_after_asks_within_bounds() -> None:
    def refusal(status: int, retry_after: str | None = None) -> ApiException:
        error = ApiException(status=status, reason="Too Many Requests")
        error.headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return error

    assert throttled(refusal(429, "3")) == 3.0
    assert throttled(refusal(429)) == 1.0
    assert throttled(refusal(429, "0")) == 1.0
    assert throttled(refusal(429, "Wed, 21 Oct 2026 07:28:00 GMT")) == 1.0
    assert throttled(refusal(429, "3600")) == 60.0
    assert throttled(refusal(409)) is None
    assert throttled(RuntimeError("connection reset")) is None


def test_a_request_waits_within_bounds_and_a_watch_a_little_past_its_own_end() -> None:
    ordinary = (CONNECT_SECONDS, READ_SECONDS)
    assert request_timeout("GET", "/api/v1/namespaces/ns/pods?limit=500") == ordinary
    assert request_timeout("PATCH", "/apis/agentrun.dev/v1alpha1/x?watch=true") == ordinary
    watch = "/apis/batch/v1/jobs?watch=True&timeoutSeconds=15&allowWatchBookmarks=true"
    assert request_timeout("GET", watch) == (CONNECT_SECONDS, 15 + WATCH_GRACE_SECONDS)
    long_watch = "/api/v1/pods?watch=1&timeoutSeconds=300&allowWatchBookmarks=true"
    assert request_timeout("GET", long_watch) == (CONNECT_SECONDS, 60 + WATCH_GRACE_SECONDS)
    no_bookmarks = "/api/v1/pods?watch=true&timeoutSeconds=300"
    assert request_timeout("GET", no_bookmarks) == (CONNECT_SECONDS, 300 + WATCH_GRACE_SECONDS)
    assert request_timeout("GET", "/api/v1/pods?watch=true") == (CONNECT_SECONDS, None)
    followed = "/api/v1/namespaces/ns/pods/p/log?container=step&follow=True"
    assert request_timeout("GET", followed) == (CONNECT_SECONDS, None), "a quiet log is no stall"
    assert request_timeout("GET", followed.replace("True", "False")) == ordinary
    assert watch_silence(WATCH_SECONDS) == min(WATCH_SECONDS, 60) + WATCH_GRACE_SECONDS
    assert READ_SECONDS < 60, "below the API server's own limit on a request"


def test_a_client_made_here_bounds_every_request_that_names_no_bounds_of_its_own() -> None:
    from kubernetes import client as kube_client

    client = Cluster(kube_client.Configuration()).api_client()
    sent: list[Any] = []
    client.rest_client.request = lambda *args, **kwargs: sent.append(kwargs.get("_request_timeout"))
    try:
        assert client.configuration.retries.total == 1
        client.call_api("GET", "https://k/api/v1/pods")
        client.call_api("GET", "https://k/api/v1/pods?watch=true&timeoutSeconds=15")
        client.call_api("GET", "https://k/api/v1/pods", None, None, None, None)
        client.call_api("GET", "https://k/api/v1/pods", _request_timeout=(1, 2))
        kube_client.CoreV1Api(client).list_namespaced_pod("ns")
    except AttributeError:  # the stub answers None, which the generated method cannot read
        pass
    finally:
        client.close()
    assert sent == [
        (CONNECT_SECONDS, READ_SECONDS),
        (CONNECT_SECONDS, 15 + WATCH_GRACE_SECONDS),
        (CONNECT_SECONDS, READ_SECONDS),
        (1, 2),
        (CONNECT_SECONDS, READ_SECONDS),
    ]


def test_the_api_server_away_unavailable_or_throttling_is_transient_a_refusal_is_not() -> None:
    import urllib3

    pool = urllib3.HTTPSConnectionPool("kubernetes.default.svc", 443)
    timed_out = urllib3.exceptions.ReadTimeoutError(pool, "/api", "Read timed out.")
    gave_up = urllib3.exceptions.MaxRetryError(pool, "/api", timed_out)
    broken = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError("reset"))
    for error in (gave_up, timed_out, broken, ConnectionRefusedError(), TimeoutError()):
        found = transient(error)
        assert found is not None and found.reason == UNREACHABLE, error
        assert "\n" not in found.detail and found.says.startswith("failed: the API server did")
    assert transient(gave_up).detail.startswith("ReadTimeoutError: ")  # type: ignore[union-attr]
    try:
        try:
            raise broken
        except urllib3.exceptions.ProtocolError as error:
            raise Unreachable("no answer") from error
    except Unreachable as wrapped:
        assert transient(wrapped) is not None

    def refusal(status: int, message: str = "") -> ApiException:
        error = ApiException(status=status, reason="x")
        error.body = json.dumps({"message": message}) if message else None
        error.headers = {"Retry-After": "3"}
        return error

    throttling = transient(refusal(429, "too many requests"))
    assert throttling is not None and throttling.reason == THROTTLED and throttling.wait == 3.0
    assert throttling.says == "throttled by the API server (429: too many requests)"
    unavailable = transient(refusal(503, "the server is shutting down"))
    assert unavailable is not None and unavailable.reason == UNAVAILABLE
    for status in (400, 403, 404, 409, 422, 500):
        assert transient(refusal(status, "refused")) is None, status
    assert transient(ValueError("a bug")) is None
    assert transient(ApiException(status=0, reason="Cannot prepare a request message")) is None
    ssl = transient(ApiException(status=0, reason="SSLError\nEOF occurred"))
    assert ssl is not None and ssl.reason == UNREACHABLE


def test_a_create_refused_in_a_namespace_being_deleted_is_one_line_not_a_traceback() -> None:
    """The API server refuses new content in a namespace being deleted (403 with the cause
    NamespaceTerminating): the run goes with its namespace, so a pass that meets it is tried
    again quietly; any other 403 stays a refusal."""
    message = (
        'configmaps "r-audit-1" is forbidden: unable to create new content in namespace t '
        "because it is being terminated"
    )
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps(
        {
            "message": message,
            "reason": "Forbidden",
            "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata"}]},
            "code": 403,
        }
    )
    found = transient(error)
    assert found is not None and found.reason == TERMINATING
    assert found.says == f"refused: the namespace is being deleted ({message})"
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = json.dumps({"message": "no", "details": {"causes": [{"reason": "x"}]}})
    assert transient(forbidden) is None
    forbidden.body = "not json"
    assert transient(forbidden) is None
