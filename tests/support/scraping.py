"""What an operator process under test serves on its own port: ``/metrics`` read with
prometheus-client's own parser, and ``/readyz``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from agentrun_devcluster.operator import OperatorProcess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def http_get(url: str) -> tuple[int, str]:
    """The status and body of a GET (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(op: OperatorProcess) -> tuple[Samples, str]:
    """Every sample /metrics serves, by name and labels; and the text itself."""
    code, text = http_get(op.metrics_url)
    assert code == 200, text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, text


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    return sum(
        v for (n, have), v in samples.items() if n == name and labels.items() <= dict(have).items()
    )


def readiness(op: OperatorProcess) -> tuple[int, list[str]]:
    """/readyz's status and what it says it waits for."""
    code, body = http_get(op.readiness_url)
    return code, list(json.loads(body)["waitingFor"])
