"""A real etcd + kube-apiserver for the bundle tests (no controller-manager, no scheduler, no nodes).

Binaries come from scripts/build-k8s.sh ($DRAGUARD_K8S_BIN or the build cache).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from kbundle import build, one


def _bin_dir() -> Path | None:
    env = os.environ.get("DRAGUARD_K8S_BIN")
    root = Path(os.environ.get("DRAGUARD_K8S_CACHE", Path.home() / ".cache" / "draguard" / "k8s"))
    cands = [Path(env)] if env else sorted(root.glob("*/bin"), reverse=True)
    for c in cands:
        if all(os.access(c / b, os.X_OK) for b in ("etcd", "kube-apiserver")):
            return c
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def apply_kustomization(self, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl("apply", *extra, "-k", str(path))


@contextlib.contextmanager
def api_server(extra_args: Sequence[str] = ()) -> Iterator[Api]:
    """etcd + kube-apiserver (RBAC, service-account tokens) on loopback; skips without the binaries.

    `extra_args` go to kube-apiserver as they are (an admission configuration, for example)."""
    bin_dir = _bin_dir()
    if bin_dir is None or shutil.which("kubectl") is None:
        pytest.skip("etcd/kube-apiserver not built (make k8s, or set DRAGUARD_K8S_BIN) or kubectl missing")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    tmp = Path(tempfile.mkdtemp(prefix="draguard-bundle-api-"))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp / "sa.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (tmp / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    (tmp / "tokens.csv").write_text("bundle-admin-token,admin,admin,system:masters\n")
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        etcd_log = open(tmp / "etcd.log", "wb")  # noqa: SIM115 - closed in finally
        logs.append(etcd_log)
        procs.append(
            subprocess.Popen(
                [
                    str(bin_dir / "etcd"),
                    "--data-dir",
                    str(tmp / "etcd"),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                ],
                stdout=etcd_log,
                stderr=subprocess.STDOUT,
            )
        )
        api_log = open(tmp / "apiserver.log", "wb")  # noqa: SIM115
        logs.append(api_log)
        procs.append(
            subprocess.Popen(
                [
                    str(bin_dir / "kube-apiserver"),
                    "--etcd-servers",
                    f"http://127.0.0.1:{etcd_port}",
                    "--secure-port",
                    str(api_port),
                    "--bind-address",
                    "127.0.0.1",
                    "--cert-dir",
                    str(tmp / "certs"),
                    "--token-auth-file",
                    str(tmp / "tokens.csv"),
                    "--authorization-mode",
                    "RBAC",
                    # Real clusters run with privileged pods allowed; the DRA driver needs it.
                    "--allow-privileged=true",
                    "--service-account-key-file",
                    str(tmp / "sa.pub"),
                    "--service-account-signing-key-file",
                    str(tmp / "sa.key"),
                    "--service-account-issuer",
                    "https://kubernetes.default.svc",
                    "--service-cluster-ip-range",
                    "10.96.0.0/16",
                    *extra_args,
                ],
                stdout=api_log,
                stderr=subprocess.STDOUT,
            )
        )
        (tmp / "kubeconfig").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "t",
                    "clusters": [
                        {
                            "name": "t",
                            "cluster": {
                                "server": f"https://127.0.0.1:{api_port}",
                                "insecure-skip-tls-verify": True,
                            },
                        }
                    ],
                    "users": [{"name": "a", "user": {"token": "bundle-admin-token"}}],
                    "contexts": [{"name": "t", "context": {"cluster": "t", "user": "a"}}],
                }
            )
        )
        a = Api(tmp / "kubeconfig")
        deadline = time.monotonic() + 120
        while a.kubectl("get", "--raw", "/readyz").returncode != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail(
                    "kube-apiserver did not become ready:\n"
                    + (tmp / "apiserver.log").read_text(errors="replace")[-3000:]
                )
            time.sleep(1)
        # Namespaced objects need their namespace to exist even in a dry run; create it from the bundle.
        for ns_name in ("draguard-system", "draguard-driver", "draguard-quota"):
            ns_obj = one(build("eks"), "Namespace", ns_name)
            assert a.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(ns_obj)).returncode == 0
        assert a.kubectl("create", "namespace", "ml").returncode == 0
        # No controller-manager here: create the ServiceAccounts pods default to.
        for ns in ("ml", "kube-system"):
            a.kubectl("-n", ns, "create", "serviceaccount", "default")
        yield a
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()
        shutil.rmtree(tmp, ignore_errors=True)


def sa_kubeconfig(api: Api, sa: str, path: Path, namespace: str = "draguard-system") -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/sa` (a real token from TokenRequest)."""
    token = api.kubectl("-n", namespace, "create", "token", sa)
    assert token.returncode == 0, token.stderr
    cfg = yaml.safe_load(api.kubeconfig.read_text())
    cfg["users"] = [{"name": "a", "user": {"token": token.stdout.strip()}}]
    path.write_text(yaml.safe_dump(cfg))
    return path


def wait_for(check: object, what: str, timeout: float = 30.0, interval: float = 0.1) -> float:
    """Poll `check()` until truthy; returns the seconds it took, fails the test naming `what`."""
    assert callable(check)
    t0 = time.monotonic()
    last: object = None
    while time.monotonic() - t0 < timeout:
        last = check()
        if last:
            return time.monotonic() - t0
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})", pytrace=False)
