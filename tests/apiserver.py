"""A throwaway etcd + kube-apiserver on loopback (real binaries, real TLS, RBAC), no controllers or nodes.

The one harness for the tests that need a bare API server: the driver's (tests/driver) and the bundle's
(tests/kustomize/kapi.py). Binaries come from $DRAGUARD_K8S_BIN or the build cache
($DRAGUARD_K8S_CACHE, default ~/.cache/draguard/k8s/<version>/bin; scripts/build-k8s.sh).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import pki
from webhook.dev.procs import die_with_parent


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
    extra_args: Sequence[str] = (),
) -> ApiServer:
    """etcd + kube-apiserver under `base`, ready; RuntimeError (with the log's tail) when it is not.

    The admin kubeconfig authenticates with a client certificate in system:masters. Privileged pods
    are allowed, as on real clusters (the DRA driver's DaemonSet needs it). Without a controller-manager
    nothing creates ServiceAccounts: `service_account_admission` keeps the plugin that requires them
    (the caller creates the ones its pods use)."""
    base.mkdir(parents=True, exist_ok=True)
    ca = pki.issue("draguard-test-ca", ca=True)
    server_cert = pki.issue("kube-apiserver", ca, server=True)
    admin = pki.issue("admin", ca, organization="system:masters")
    sa = pki.issue("service-accounts")[0]
    files: dict[str, bytes] = {
        "ca.crt": pki.pem(ca[1]),
        "ca.key": pki.pem(ca[0]),
        "server.crt": pki.pem(server_cert[1]),
        "server.key": pki.pem(server_cert[0]),
        "admin.crt": pki.pem(admin[1]),
        "admin.key": pki.pem(admin[0]),
        "sa.key": pki.pem(sa),
        "sa.pub": pki.pem(sa.public_key()),
    }
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
        # A test run killed before its teardown must not leave the control plane running.
        preexec_fn=die_with_parent,
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
            *extra_args,
        ],
        stdout=log_a,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
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


@contextlib.contextmanager
def running(prefix: str, runtime_config: str | None = None, **kw: Any) -> Iterator[ApiServer]:
    """A bare API server for one test module: skipped without the binaries (a failure under CI, where
    they are built), stopped and its directory removed afterwards."""
    import pytest

    bin_dir = find_bin()
    if bin_dir is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("kube-apiserver/etcd binaries not built (scripts/build-k8s.sh)", pytrace=False)
        pytest.skip("kube-apiserver/etcd binaries not built (see DRAGUARD_K8S_BIN)")
    base = Path(tempfile.mkdtemp(prefix=f"dg-{prefix}-", dir="/tmp"))
    server = start(bin_dir, base, runtime_config=runtime_config, **kw)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
