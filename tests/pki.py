"""Certificates for the test harnesses (a bare API server, hostile webhook callers): one issuer."""

from __future__ import annotations

import datetime as dt
from ipaddress import ip_address
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey
Issued = tuple[Key, x509.Certificate]


def pem(obj: Any) -> bytes:
    """PEM of a private key (PKCS#8, unencrypted), a public key or a certificate."""
    if hasattr(obj, "private_bytes"):
        return bytes(
            obj.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return bytes(obj.public_bytes(serialization.Encoding.PEM, spki))


def issue(
    cn: str,
    issuer: Issued | None = None,
    *,
    ca: bool = False,
    server: bool = False,
    organization: str | None = None,
) -> Issued:
    """A new P-256 key and its certificate for `cn`, valid an hour ago to a day from now: self-signed
    when `issuer` is None; a CA, a server (localhost, 127.0.0.1) or else a client certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    subject = x509.Name(attrs)
    issuer_key, issuer_name = (key, subject) if issuer is None else (issuer[0], issuer[1].subject)
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        sans = [x509.DNSName("localhost"), x509.IPAddress(ip_address("127.0.0.1"))]
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, b.sign(issuer_key, hashes.SHA256())
