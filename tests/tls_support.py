"""Throw-away certificates for TLS tests: a CA, a server certificate for 127.0.0.1 and localhost,
a client certificate signed by the same CA, and one signed by a CA the server does not trust."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Issuer = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from another CA
    stranger_key: Path
    other_ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
    )


def make_ca(common_name: str) -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(ca: Issuer, common_name: str, *, server: bool) -> Issuer:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(common_name, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(directory: Path, stem: str, pair: Issuer) -> tuple[Path, Path]:
    key, cert = pair
    cert_path = directory / f"{stem}.pem"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def write_pki(directory: Path) -> Pki:
    ca = make_ca("gpufair test CA")
    other = make_ca("some other CA")
    ca_path, _ = _write(directory, "ca", ca)
    other_ca_path, _ = _write(directory, "other-ca", other)
    server_cert, server_key = _write(directory, "server", issue(ca, "gpufair", server=True))
    client_cert, client_key = _write(directory, "client", issue(ca, "batch", server=False))
    stranger_cert, stranger_key = _write(
        directory, "stranger", issue(other, "stranger", server=False)
    )
    return Pki(
        ca=ca_path,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
        stranger_cert=stranger_cert,
        stranger_key=stranger_key,
        other_ca=other_ca_path,
    )
