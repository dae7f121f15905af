"""How much the operator does at once: the threads that run reconcile passes, and the API
client's connections.

Reconcile passes are blocking code (the kubernetes client is synchronous), so the handlers run
them with ``asyncio.to_thread``: on the event loop's default executor. Left alone, that
executor has ``min(32, CPUs + 4)`` threads, whatever the load; here it has ``workers``
(``AGENTRUN_WORKERS``), shared by passes, deletions and janitor
sweeps; kopf's own executor has as many (it runs no handler of the operator's but, with
peering, the runs' daemons). With hundreds of runs due at once, passes queue for a worker:
each waits its turn instead of all of them sharing the CPU and the API server at once, which
keeps the latency of the passes that do run short.

The official Python client has no client-side rate limiter (client-go's ``--kube-api-qps``
and ``--kube-api-burst`` have no counterpart in it, nor in kopf): what bounds the operator's
request rate is how many passes run at once, and how many requests one pass makes. The
client's connection pool is sized for that concurrency (:func:`connections_for`), so that no
request opens, and then discards, a connection of its own (urllib3's "Connection pool is
full" warning, each one a new TLS handshake).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["WATCHES_PER_SCOPE", "connections_for", "pass_executor", "size_connection_pool"]

WATCHES_PER_SCOPE = 3
"""Watches the observer holds open per watched namespace (or for all namespaces): step Jobs,
their pods, their pods' refusals. Each holds a connection of the pool for its whole life."""
SPARE_CONNECTIONS = 4
"""For the janitor and the odd request outside a pass."""


def pass_executor(workers: int) -> ThreadPoolExecutor:
    """The executor of reconcile passes: ``workers`` threads."""
    if workers < 1:
        raise ValueError(f"AGENTRUN_WORKERS={workers}: at least one worker is needed")
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentrun-pass")


def connections_for(workers: int, scopes: int) -> int:
    """Connections the API client may keep: one per pass and per kopf handler thread (each
    ``workers``), one per open watch (``scopes`` namespaces, or 1 for all), and a few spare."""
    if workers < 1:
        raise ValueError(f"AGENTRUN_WORKERS={workers}: at least one worker is needed")
    return 2 * workers + WATCHES_PER_SCOPE * max(scopes, 1) + SPARE_CONNECTIONS


def size_connection_pool(api_client: Any, connections: int) -> None:
    """Give ``api_client`` (a ``kubernetes.client.ApiClient`` that has made no request yet) a
    connection pool of ``connections``. The pool is built with the client, from its
    configuration, so it is built again."""
    from kubernetes.client import rest

    api_client.configuration.connection_pool_maxsize = connections
    old = api_client.rest_client
    api_client.rest_client = rest.RESTClientObject(api_client.configuration)
    old.close()
