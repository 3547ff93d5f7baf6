"""Certificates for the local control plane: one CA, serving and client certs, SA keys."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..certs import generate_ca

# Short-lived dev clusters: a year is plenty and never expires mid-run.
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """PEM files of one certificate and its key."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are fast to generate and accepted by every Kubernetes component.
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def make_ca(directory: Path, cn: str) -> KeyPair:
    """A self-signed CA in `directory` as <cn>.crt/.key: the CA profile `draguard certs` issues."""
    cert, key = generate_ca(cn, days=VALIDITY.days)
    pair = KeyPair(directory / f"{cn}.crt", directory / f"{cn}.key")
    pair.cert.write_bytes(cert)
    pair.key.write_bytes(key)
    pair.key.chmod(0o600)
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    name: str,
    *,
    cn: str,
    org: str | None = None,
    server_names: tuple[str, ...] = (),
    client: bool = False,
) -> KeyPair:
    """Issue a certificate signed by `ca`; server_names become DNS/IP SANs."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key}: expected an EC private key")
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    if server_names:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server_names:
        sans: list[x509.GeneralName] = []
        for n in server_names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def make_sa_keys(directory: Path) -> KeyPair:
    """Service-account token signing key (sa.key) and its public half (sa.pub)."""
    key = _key()
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair


def cluster_certs(directory: Path, *, apiserver_address: str, service_ip: str) -> None:
    """The control plane's CA, serving and client certificates, SA keys and the webhook's own CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory, "ca")
    names = {
        "127.0.0.1",
        apiserver_address,
        service_ip,
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    issue(ca, directory, "apiserver", cn="kube-apiserver", server_names=tuple(sorted(names)))
    issue(ca, directory, "admin", cn="draguard-admin", org="system:masters", client=True)
    issue(ca, directory, "controller-manager", cn="system:kube-controller-manager", client=True)
    issue(ca, directory, "scheduler", cn="system:kube-scheduler", client=True)
    make_sa_keys(directory)
    wca = make_ca(directory, "webhook-ca")
    issue(wca, directory, "webhook", cn="draguard-webhook", server_names=("127.0.0.1", "localhost"))


def node_certs(directory: Path, *, node_name: str, node_ip: str) -> None:
    """A real node's identities: kubelet client (Node authorizer), kubelet serving, kube-proxy, and
    the API server's client for kubelets (logs, exec)."""
    ca = KeyPair(directory / "ca.crt", directory / "ca.key")
    kubelet_certs(directory, node_name=node_name, node_ip=node_ip)
    issue(ca, directory, "kube-proxy", cn="system:kube-proxy", client=True)
    # system:masters may use every kubelet API; the kubelet authorizes it through the API server.
    issue(
        ca, directory, "apiserver-kubelet-client", cn="kube-apiserver-kubelet-client",
        org="system:masters", client=True,
    )  # fmt: skip


def kubelet_certs(directory: Path, *, node_name: str, node_ip: str, name: str = "kubelet") -> None:
    """One kubelet's identities from the cluster CA: <name>.crt (client, as `system:node:<node>`,
    which the Node authorizer confines to that node's objects) and <name>-serving.crt."""
    ca = KeyPair(directory / "ca.crt", directory / "ca.key")
    issue(ca, directory, name, cn=f"system:node:{node_name}", org="system:nodes", client=True)
    issue(ca, directory, f"{name}-serving", cn=node_name, server_names=(node_ip, node_name))
