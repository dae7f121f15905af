"""What manifest scanners (kube-score, checkov) ask of the operator's pod, in the Helm chart and
in manifests/: CPU and ephemeral-storage limits, a readiness probe, the ServiceAccount token
mounted only where it is used, and a NetworkPolicy letting the operator reach only the API
server and DNS and be reached only on its probe and metrics ports. The chart's NetworkPolicy (off by
default, networkPolicy.enabled) is accepted by the real API server.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from agentrun import settings as s
from agentrun_devcluster.testing import TestCluster
from tests.support.helm import Helm, one, without_hooks
from tests.support.paths import CHART, MANIFESTS


def manifest(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((MANIFESTS / name).read_text())
    return doc


def operator_pods(helm: Helm) -> list[tuple[str, dict[str, Any]]]:
    chart = one(helm.template(), "Deployment")["spec"]["template"]["spec"]
    plain = manifest("deployment.yaml")["spec"]["template"]["spec"]
    return [("chart", chart), ("manifests", plain)]


def operators_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's NetworkPolicy among the chart's (the other, ``-hooks``, is the uninstall
    hook's and the helm test pod's)."""
    found = [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and not d["metadata"]["name"].endswith("-hooks")
    ]
    assert len(found) == 1, [d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"]
    return found[0]


def test_the_operator_container_has_limits_and_both_probes(helm: Helm) -> None:
    for where, pod in operator_pods(helm):
        container = pod["containers"][0]
        resources = container["resources"]
        assert {"cpu", "memory", "ephemeral-storage"} <= set(resources["limits"]), where
        assert {"cpu", "memory", "ephemeral-storage"} <= set(resources["requests"]), where
        liveness = {"path": "/healthz", "port": "healthz"}
        assert container["livenessProbe"]["httpGet"] == liveness, where
        readiness = {"path": "/readyz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == readiness, where
        assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    (_, chart), (_, plain) = operator_pods(helm)
    assert chart["containers"][0]["readinessProbe"] == plain["containers"][0]["readinessProbe"]


def test_the_token_is_mounted_only_where_it_is_used(helm: Helm) -> None:
    for where, pod in operator_pods(helm):
        assert pod["automountServiceAccountToken"] is True, where
    account = one(without_hooks(helm.template()), "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert manifest("serviceaccount.yaml")["automountServiceAccountToken"] is False
    # The uninstall hook runs `agentrun release` with a token, also as the operator's
    # ServiceAccount (rbac.create=false).
    for args in ([], ["--set", "rbac.create=false"]):
        job = one(helm.template(*args), "Job")
        assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_the_network_policy_allows_the_api_server_dns_turn_pods_and_probe_and_metrics_only(
    helm: Helm,
) -> None:
    assert "NetworkPolicy" not in [d["kind"] for d in helm.template()]  # off by default
    chart = operators_policy(helm.template("--set", "networkPolicy.enabled=true"))["spec"]
    plain = manifest("networkpolicy.yaml")["spec"]
    for where, spec in (("chart", chart), ("manifests", plain)):
        assert spec["policyTypes"] == ["Ingress", "Egress"], where
        assert spec["ingress"] == [
            {"ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 8081}]}
        ], where
        ports = [
            sorted((p["protocol"], p["port"]) for p in rule["ports"]) for rule in spec["egress"]
        ]
        assert ports == [
            [("TCP", 443), ("TCP", 6443)],
            [("TCP", 53), ("UDP", 53)],
            [("TCP", s.TURN_PORT)],  # model turns' requests
        ], where
        assert all("to" not in rule for rule in spec["egress"]), where
    assert plain["podSelector"]["matchLabels"].items() <= (
        manifest("deployment.yaml")["spec"]["template"]["metadata"]["labels"].items()
    )
    deployment = one(helm.template(), "Deployment")
    assert chart["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    narrowed = operators_policy(
        helm.template(
            "--set", "networkPolicy.enabled=true",
            "--set", "networkPolicy.apiServerCIDRs={10.0.0.1/32}",
            "--set", "networkPolicy.apiServerPorts={6443}",
            "--set", "operator.livenessPort=9090",
            "--set", "operator.metricsPort=9091",
        ),
    )["spec"]  # fmt: skip
    assert narrowed["egress"][0] == {
        "ports": [{"protocol": "TCP", "port": 6443}],
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
    }
    assert narrowed["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9090}, {"protocol": "TCP", "port": 9091}]}
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "networkPolicy.apiServerPorts={0}"], "at '/networkPolicy/apiServerPorts/0'"),
        (["--set", "networkPolicy.enable=true"], "additional properties 'enable' not allowed"),
        (["--set", "readinessProbe.periodSeconds=0"], "at '/readinessProbe/periodSeconds'"),
        (["--set-string", "userRoles.create=yes"], "at '/userRoles/create'"),
    ],
    ids=["port-zero", "misspelt", "period-zero", "roles-string"],
)
def test_schema_checks_the_new_values(helm: Helm, values: list[str], message: str) -> None:
    proc = helm.run("template", "x", str(CHART), *values, check=False)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert message in proc.stderr, proc.stderr


def test_the_network_policy_is_accepted_by_the_api_server(
    cluster: TestCluster, helm: Helm, namespace: str
) -> None:
    docs = helm.template(
        "--set", "networkPolicy.enabled=true",
        "--set", "networkPolicy.apiServerCIDRs={10.0.0.1/32,fd00::1/128}",
        namespace=namespace,
    )  # fmt: skip
    policy = yaml.safe_dump(operators_policy(docs))
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=policy, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "networkpolicy.networking.k8s.io/agentrun-operator created (server dry run)" in (
        proc.stdout
    )
