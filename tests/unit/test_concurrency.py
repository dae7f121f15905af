"""Bounded concurrency (agentrun/loop/concurrency.py): the pass executor, the API client's pool."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as kube_client

from agentrun.loop import concurrency
from agentrun.settings import Settings


def test_workers_default_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRUN_WORKERS", raising=False)
    assert Settings().workers == 16
    monkeypatch.setenv("AGENTRUN_WORKERS", "3")
    assert Settings().workers == 3
    monkeypatch.setenv("AGENTRUN_WORKERS", "many")
    with pytest.raises(ValueError, match="AGENTRUN_WORKERS"):
        Settings()


def test_pass_executor_has_that_many_threads() -> None:
    executor = concurrency.pass_executor(3)
    try:
        assert executor._max_workers == 3
        assert executor.submit(lambda: 41 + 1).result(timeout=10) == 42
    finally:
        executor.shutdown()
    with pytest.raises(ValueError, match="AGENTRUN_WORKERS=0"):
        concurrency.pass_executor(0)


def test_connections_cover_passes_handlers_and_watches() -> None:
    all_namespaces = concurrency.connections_for(8, 0)
    assert all_namespaces >= 2 * 8 + concurrency.WATCHES_PER_SCOPE
    three = concurrency.connections_for(8, 3)
    assert three - all_namespaces == 2 * concurrency.WATCHES_PER_SCOPE
    with pytest.raises(ValueError, match="AGENTRUN_WORKERS=0"):
        concurrency.connections_for(0, 1)


def test_size_connection_pool_rebuilds_the_clients_pool() -> None:
    configuration = kube_client.Configuration(host="https://127.0.0.1:1")
    api_client: Any = kube_client.ApiClient(configuration)
    try:
        before = api_client.rest_client
        concurrency.size_connection_pool(api_client, 27)
        assert api_client.rest_client is not before
        assert api_client.configuration.connection_pool_maxsize == 27
        assert api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 27
    finally:
        api_client.close()
