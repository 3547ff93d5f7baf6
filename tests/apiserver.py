"""A throwaway etcd + kube-apiserver on loopback (real binaries, real TLS, RBAC), no controllers or nodes.

The one harness for the tests that need a bare API server: the driver's (tests/driver) and the bundle's
(tests/kustomize/kapi.py). Binaries come from $DRAGUARD_K8S_BIN or the build cache
($DRAGUARD_K8S_CACHE, default ~/.cache/draguard/k8s/<version>/bin; scripts/build-k8s.sh).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def find_bin() -> Path | None:
    """The directory with executable etcd and kube-apiserver, newest version first; None without one."""
    env = os.environ.get("DRAGUARD_K8S_BIN")
    root = Path(os.environ.get("DRAGUARD_K8S_CACHE", Path.home() / ".cache" / "draguard" / "k8s"))
    candidates = [Path(env)] if env else sorted(root.glob("*/bin"), reverse=True)
    for c in candidates:
        if all(os.access(c / b, os.X_OK) for b in ("etcd", "kube-apiserver")):
            return c
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> bytes:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if server:
        from ipaddress import ip_address

        b = b.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ip_address("127.0.0.1"))]),
            critical=False,
        )
    return b.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@dataclass
class ApiServer:
    url: str
    kubeconfig: Path
    ca: Path
    cert: Path
    key: Path
    procs: list[subprocess.Popen[bytes]]

    def request(self, method: str, path: str, body: Any = None) -> Any:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            raw = resp.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode()

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


def start(
    bin_dir: Path,
    base: Path,
    runtime_config: str | None = "resource.k8s.io/v1beta2=true",
    *,
    service_account_admission: bool = False,
) -> ApiServer:
    """etcd + kube-apiserver under `base`, ready; RuntimeError (with the log's tail) when it is not.

    The admin kubeconfig authenticates with a client certificate in system:masters. Privileged pods
    are allowed, as on real clusters (the DRA driver's DaemonSet needs it). Without a controller-manager
    nothing creates ServiceAccounts: `service_account_admission` keeps the plugin that requires them
    (the caller creates the ones its pods use)."""
    base.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "draguard-test-ca")])
    files: dict[str, bytes] = {
        "ca.crt": _cert(ca_name, ca_key, ca_name, ca_key, ca=True),
        "ca.key": _pem_key(ca_key),
    }
    for name, subject, server in (
        ("server", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]), True),
        (
            "admin",
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                ]
            ),
            False,
        ),
    ):
        k = ec.generate_private_key(ec.SECP256R1())
        files[f"{name}.crt"] = _cert(subject, k, ca_name, ca_key, server=server)
        files[f"{name}.key"] = _pem_key(k)
    sa = ec.generate_private_key(ec.SECP256R1())
    files["sa.key"] = _pem_key(sa)
    files["sa.pub"] = sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for n, data in files.items():
        (base / n).write_bytes(data)
    etcd_client, etcd_peer, port = _free_port(), _free_port(), _free_port()
    log_e = open(base / "etcd.log", "wb")  # noqa: SIM115 - kept open for the process lifetime
    etcd = subprocess.Popen(
        [
            str(bin_dir / "etcd"),
            "--data-dir",
            str(base / "etcd"),
            "--name",
            "test",
            "--listen-client-urls",
            f"http://127.0.0.1:{etcd_client}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{etcd_client}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster",
            f"test=http://127.0.0.1:{etcd_peer}",
            "--log-level",
            "error",
            "--quota-backend-bytes",
            str(256 * 1024 * 1024),
        ],
        stdout=log_e,
        stderr=subprocess.STDOUT,
    )
    log_a = open(base / "apiserver.log", "wb")  # noqa: SIM115
    api = subprocess.Popen(
        [
            str(bin_dir / "kube-apiserver"),
            "--etcd-servers",
            f"http://127.0.0.1:{etcd_client}",
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(port),
            "--advertise-address",
            "127.0.0.1",
            "--tls-cert-file",
            str(base / "server.crt"),
            "--tls-private-key-file",
            str(base / "server.key"),
            "--client-ca-file",
            str(base / "ca.crt"),
            "--service-account-key-file",
            str(base / "sa.pub"),
            "--service-account-signing-key-file",
            str(base / "sa.key"),
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-cluster-ip-range",
            "10.0.0.0/24",
            "--authorization-mode",
            "RBAC",
            "--allow-privileged=true",
            *(["--runtime-config", runtime_config] if runtime_config else []),
            "--v",
            "1",
            *([] if service_account_admission else ["--disable-admission-plugins", "ServiceAccount"]),
            "--endpoint-reconciler-type",
            "none",
        ],
        stdout=log_a,
        stderr=subprocess.STDOUT,
    )
    server = ApiServer(
        f"https://127.0.0.1:{port}",
        base / "kubeconfig",
        base / "ca.crt",
        base / "admin.crt",
        base / "admin.key",
        [etcd, api],
    )
    server.kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {"server": server.url, "certificate-authority": str(server.ca)},
                    }
                ],
                "users": [
                    {
                        "name": "admin",
                        "user": {"client-certificate": str(server.cert), "client-key": str(server.key)},
                    }
                ],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            }
        )
    )
    deadline = time.monotonic() + 180
    while True:
        if api.poll() is not None:
            server.stop()
            raise RuntimeError(f"kube-apiserver exited: {(base / 'apiserver.log').read_text()[-2000:]}")
        try:
            server.request("GET", "/readyz")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError("kube-apiserver not ready after 180 s") from None
            time.sleep(1)
    return server
