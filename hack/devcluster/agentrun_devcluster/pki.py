"""Certificates and keys for the local test control plane.

Everything here is for throw-away test clusters on 127.0.0.1: keys are ECDSA P-256,
certificates are valid for a year, and all files are written unencrypted (mode 0600
for private keys) into a state directory.

Layout of a :class:`PKI` directory::

    ca.crt, ca.key                      cluster CA (signs serving and client certs)
    apiserver.crt, apiserver.key        kube-apiserver serving certificate
    sa.pub, sa.key                      service-account token signing key pair
    clients/<name>.crt, <name>.key      client certificates (CN=user, O=groups)
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["PKI", "CertPair", "default_apiserver_sans"]

_VALIDITY = datetime.timedelta(days=365)
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def default_apiserver_sans(service_ip: str = "10.0.0.1") -> tuple[list[str], list[str]]:
    """DNS names and IP addresses an in-cluster or local client may use for the apiserver."""
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    ips = ["127.0.0.1", "::1", service_ip]
    return dns, ips


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


class PKI:
    """A cluster CA plus the certificates a local control plane needs, in ``directory``.

    Creating a ``PKI`` on a directory that already holds a CA reuses it (so a kubeconfig
    minted later by ``agentrun devcluster kubeconfig`` is trusted by a running cluster).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca = CertPair(self.directory / "ca.crt", self.directory / "ca.key")
        if not (self.ca.cert.exists() and self.ca.key.exists()):
            self._create_ca()
        self._ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{self.ca.key}: expected an EC private key")
        self._ca_key = ca_key

    # -- CA -------------------------------------------------------------------------------

    def _create_ca(self) -> None:
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentrun-devcluster-ca")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + 10 * _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        _write(self.ca.key, _key_pem(key), private=True)
        _write(self.ca.cert, cert.public_bytes(serialization.Encoding.PEM))

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate, PEM-encoded."""
        return self.ca.cert.read_bytes()

    # -- leaf certificates -----------------------------------------------------------------

    def _issue(
        self,
        subject: x509.Name,
        *,
        server: bool,
        client: bool,
        dns_names: list[str] | None = None,
        ip_addresses: list[str] | None = None,
    ) -> tuple[bytes, bytes]:
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names or []]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses or []]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    def serving_cert(self, name: str, dns_names: list[str], ip_addresses: list[str]) -> CertPair:
        """Issue (or overwrite) ``<name>.crt``/``<name>.key``: a TLS serving certificate."""
        cert, key = self._issue(
            x509.Name(
                [x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0] if dns_names else name)]
            ),
            server=True,
            client=False,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
        )
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        _write(pair.key, key, private=True)
        _write(pair.cert, cert)
        return pair

    def apiserver_cert(self, service_ip: str = "10.0.0.1") -> CertPair:
        """The kube-apiserver serving certificate (127.0.0.1, localhost, kubernetes.default...)."""
        dns, ips = default_apiserver_sans(service_ip)
        return self.serving_cert("apiserver", dns, ips)

    def client_cert(self, user: str, groups: list[str] | tuple[str, ...] = ()) -> CertPair:
        """Issue a client certificate authenticating as ``user`` in ``groups``.

        The apiserver maps the subject's CN to the user name and each O to a group.
        Files go to ``clients/<user>.crt`` and ``clients/<user>.key`` (name sanitised).
        """
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        cert, key = self._issue(x509.Name(attrs), server=False, client=True)
        base = self.directory / "clients" / _safe_name(user)
        pair = CertPair(base.with_suffix(".crt"), base.with_suffix(".key"))
        _write(pair.key, key, private=True)
        _write(pair.cert, cert)
        return pair

    def service_account_keys(self) -> CertPair:
        """The service-account token signing key pair (``sa.key`` private, ``sa.pub`` public).

        Created once and reused, so tokens stay valid across restarts on the same state dir.
        """
        pair = CertPair(self.directory / "sa.pub", self.directory / "sa.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = _new_key()
        pub = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        _write(pair.key, _key_pem(key), private=True)
        _write(pair.cert, pub)
        return pair
