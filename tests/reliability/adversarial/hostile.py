"""Helpers for the adversarial suite: a 10,000-device `draguard serve`, RSS, certificates, raw TLS."""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import psutil
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.reliability.conftest import ROOT, SEED, WebhookProcess, review_body

RSS_BOUND_MIB = 256
DEVICES = 10_000
PRODUCTS = (("NVIDIA A100 80GB PCIe", "80Gi"), ("NVIDIA H100 80GB HBM3", "80Gi"))


def write_big_inventory(path: Path, devices: int = DEVICES, per_node: int = 8) -> Path:
    """`devices` GPUs in ResourceSlices, 8 per node, A100 and H100 nodes alternating, plus the seed's
    DeviceClasses and an H100 claim template in team-a."""
    docs: list[Any] = []
    for n in range((devices + per_node - 1) // per_node):
        product, mem = PRODUCTS[n % 2]
        node = f"gpu-node-{n:05d}"
        devs = [
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "uuid": {"string": f"GPU-{n:05d}-{i}"},
                    "productName": {"string": product},
                    "index": {"int": i},
                    "driverVersion": {"version": "550.54.15"},
                },
                "capacity": {"memory": {"value": mem}},
            }
            for i in range(min(per_node, devices - n * per_node))
        ]
        docs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-gpu.nvidia.com"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devs,
                },
            }
        )
    docs += [d for d in yaml.safe_load_all((SEED / "deviceclasses.yaml").read_text()) if d]
    docs.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-h100", "namespace": "team-a"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100"}}]
                    }
                }
            },
        }
    )
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def rss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1024 * 1024)


def post(wh: WebhookProcess, path: str, body: bytes, timeout: float = 20.0) -> tuple[int, dict[str, Any]]:
    conn = wh.connection(timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data.startswith(b"{") else {})
    finally:
        conn.close()


def claim_review(name: str, selectors: list[str], uid: str, namespace: str = "team-a") -> bytes:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": f"r{i}",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com-h100",
                            "selectors": [{"cel": {"expression": s}}],
                        },
                    }
                    for i, s in enumerate(selectors)
                ]
            }
        },
    }
    return json.dumps(
        review_body(obj, group="resource.k8s.io", kind="ResourceClaim", namespace=namespace, uid=uid)
    ).encode()


def unique_selector(tag: str, size: int = 7000) -> str:
    """A valid selector of about `size` bytes whose text (and so its compiled form) is unique."""
    terms: list[str] = []
    length = 0
    j = 0
    while length < size:
        t = f"device.attributes['gpu.nvidia.com'].productName == 'NVIDIA {tag} {j}'"
        terms.append(t)
        length += len(t) + 4
        j += 1
    return "device.driver == 'gpu.nvidia.com' && (" + " || ".join(terms) + ")"


# --- certificates ----------------------------------------------------------------------------------


def _pem(obj: Any) -> bytes:
    if hasattr(obj, "private_bytes"):
        return bytes(
            obj.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return bytes(obj.public_bytes(serialization.Encoding.PEM))


def make_ca(name: str) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def client_cert(ca: tuple[Any, x509.Certificate], cn: str, out: Path) -> tuple[Path, Path]:
    """A client certificate for `cn` signed by `ca`, written as out.crt / out.key."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    crt, k = out.with_suffix(".crt"), out.with_suffix(".key")
    crt.write_bytes(_pem(cert))
    k.write_bytes(_pem(key))
    return crt, k


def write_ca(ca: tuple[Any, x509.Certificate], path: Path) -> Path:
    path.write_bytes(_pem(ca[1]))
    return path


def tls_client(wh: WebhookProcess, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = wh.ssl_context()
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def raw_tls(wh: WebhookProcess, timeout: float = 5.0) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", wh.port), timeout=timeout)
    return wh.ssl_context().wrap_socket(sock, server_hostname="127.0.0.1")


__all__ = ["ROOT", "RSS_BOUND_MIB"]
