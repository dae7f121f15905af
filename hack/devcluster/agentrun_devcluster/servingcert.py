"""The local node's serving certificate, signed by the cluster, as a kubelet gets one.

The API server reaches a node's streaming endpoints (pods/exec, pods/attach) over HTTPS at the
Node's address and ``daemonEndpoints.kubeletEndpoint.Port``, and with
``--kubelet-certificate-authority`` it checks the node's certificate against that CA. A kubelet
with ``serverTLSBootstrap: true`` gets such a certificate through the certificates API: a
CertificateSigningRequest for the signer ``kubernetes.io/kubelet-serving`` (subject
``system:node:<name>`` in ``system:nodes``, its addresses as subjectAltNames), approved by an
admin or an approver controller, signed by kube-controller-manager's
``certificatesigningrequest-signing-controller`` with the cluster CA
(``--cluster-signing-kubelet-serving-{cert,key}-file``).

:func:`request_serving_certificate` does the same, and approves the request itself: the local
node runs with an admin kubeconfig (see :class:`~agentrun_devcluster.node.LocalNode`), which a
real kubelet's identity is not. It returns None (the node then serves no streaming endpoint)
when the control plane does not sign the request in time, e.g. one whose controller manager
runs without that signer.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .kubeapi import ApiException, KubeApi
from .pki import CertPair

__all__ = ["KUBELET_SERVING_SIGNER", "request_serving_certificate"]

log = logging.getLogger(__name__)

KUBELET_SERVING_SIGNER = "kubernetes.io/kubelet-serving"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
#: How long the certificate is asked for (the signer may cut it to its --cluster-signing-duration).
VALIDITY_SECONDS = 7 * 24 * 3600


def _csr_pem(key: ec.EllipticCurvePrivateKey, node_name: str, addresses: Sequence[str]) -> bytes:
    """A PKCS#10 request as the kubelet-serving signer wants it: ``CN=system:node:<name>``,
    ``O=system:nodes``, DNS and IP subjectAltNames only."""
    sans: list[x509.GeneralName] = [x509.DNSName(node_name)]
    for address in addresses:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            sans.append(x509.DNSName(address))
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
                ]
            )
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def request_serving_certificate(
    api: KubeApi,
    node_name: str,
    directory: Path,
    *,
    addresses: Sequence[str],
    timeout: float = 30.0,
) -> CertPair | None:
    """A serving certificate for ``addresses`` (and ``node_name``) signed by the cluster's
    kubelet-serving signer, written to ``directory/kubelet.crt`` and ``kubelet.key``; None if
    the control plane did not sign it within ``timeout`` seconds (logged)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = f"agentrun-node-{node_name}-{secrets.token_hex(4)}"[:253]
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {"agentrun.dev/local-node": node_name}},
        "spec": {
            "request": base64.b64encode(_csr_pem(key, node_name, addresses)).decode(),
            "signerName": KUBELET_SERVING_SIGNER,
            # An EC key: no key encipherment (the signer's list for non-RSA keys).
            "usages": ["digital signature", "server auth"],
            "expirationSeconds": VALIDITY_SECONDS,
        },
    }
    path = f"{CSR_PATH}/{name}"
    try:
        api.post(CSR_PATH, body)
        csr = api.get(path)
        csr["status"] = {
            "conditions": [
                {
                    "type": "Approved",
                    "status": "True",
                    "reason": "AgentrunLocalNode",
                    "message": "the agentrun local node approves its own serving certificate",
                }
            ]
        }
        api.put(f"{path}/approval", csr)
        deadline = time.monotonic() + timeout
        while True:
            status = api.get(path).get("status") or {}
            failed = [
                c
                for c in status.get("conditions") or []
                if c.get("type") in ("Denied", "Failed") and c.get("status") == "True"
            ]
            if failed:
                log.warning("serving certificate refused: %s", failed[0].get("message"))
                return None
            if status.get("certificate"):
                cert = base64.b64decode(status["certificate"])
                break
            if time.monotonic() > deadline:
                log.warning(
                    "serving certificate: CertificateSigningRequest %s not signed within %.0fs"
                    " (does kube-controller-manager run its kubelet-serving signer?)",
                    name,
                    timeout,
                )
                return None
            time.sleep(0.2)
    except ApiException as e:
        log.warning("serving certificate: HTTP %s: %s", e.status, e.body)
        return None
    except Exception as e:  # the API unreachable: the node goes on without streaming
        log.warning("serving certificate: %r", e)
        return None
    finally:
        try:
            api.delete(path)
        except Exception as e:  # a leftover request harms nothing
            log.debug("could not delete CertificateSigningRequest %s: %r", name, e)
    pair = CertPair(directory / "kubelet.crt", directory / "kubelet.key")
    _write(
        pair.key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    _write(pair.cert, cert, 0o644)
    expires = x509.load_pem_x509_certificate(cert).not_valid_after_utc
    log.info(
        "serving certificate signed by the cluster, valid until %s (%s left)",
        expires.isoformat(),
        expires - datetime.datetime.now(datetime.UTC),
    )
    return pair
