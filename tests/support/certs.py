"""Throwaway PKI for TLS and mTLS tests (OTLP exporters, the scrape endpoint).

Tests need a CA the exporters can be told to trust, a server certificate that
verifies for ``localhost`` and ``127.0.0.1`` (the receiver listens there) and a
client certificate for mutual TLS.  EC P-256 keys keep generation in the
millisecond range; the extensions (SKI/AKI, critical basic constraints, EKU)
are set so that strict verifiers (OpenSSL 3 with ``VERIFY_X509_STRICT``,
BoringSSL inside gRPC) accept the chain.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertBundle", "make_certs"]


@dataclass(frozen=True)
class CertBundle:
    """Paths of the PEM files written by :func:`make_certs`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_common_name: str


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "otel-gpu tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _leaf(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    sans: Sequence[x509.GeneralName],
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def make_certs(
    directory: Path | str,
    *,
    hostnames: Sequence[str] = ("localhost",),
    ips: Sequence[str] = ("127.0.0.1",),
    client_common_name: str = "otel-gpu-test-client",
    valid_for: dt.timedelta = dt.timedelta(days=1),
) -> CertBundle:
    """Create a fresh CA, a server and a client certificate signed by it in ``directory``.

    Each call makes a new, unrelated CA, so two bundles can be mixed to build
    "certificate from the wrong CA" negative tests.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    # Backdate a little so that a clock a few seconds off does not matter.
    not_before = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    not_after = not_before + valid_for

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("otel-gpu test CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _leaf(
        hostnames[0] if hostnames else str(ips[0]),
        server_key,
        ca_name,
        ca_key,
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans,
        not_before,
        not_after,
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _leaf(
        client_common_name,
        client_key,
        ca_name,
        ca_key,
        ExtendedKeyUsageOID.CLIENT_AUTH,
        [],
        not_before,
        not_after,
    )
    return CertBundle(
        ca_cert=_write_cert(out / "ca.pem", ca_cert),
        server_cert=_write_cert(out / "server.pem", server_cert),
        server_key=_write_key(out / "server-key.pem", server_key),
        client_cert=_write_cert(out / "client.pem", client_cert),
        client_key=_write_key(out / "client-key.pem", client_key),
        client_common_name=client_common_name,
    )
