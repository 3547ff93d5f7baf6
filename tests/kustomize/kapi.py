"""The bundle tests' API server: the shared bare etcd + kube-apiserver (tests/apiserver.py) with the
bundle's namespaces and default ServiceAccounts, driven by kubectl."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from kbundle import build, one

from tests.apiserver import find_bin, start


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
    """The shared bare API server (tests/apiserver.py) with the bundle's namespaces; skips without the
    binaries or kubectl.

    `extra_args` go to kube-apiserver as they are (an admission configuration, for example)."""
    bin_dir = find_bin()
    if bin_dir is None or shutil.which("kubectl") is None:
        pytest.skip("etcd/kube-apiserver not built (make k8s, or set DRAGUARD_K8S_BIN) or kubectl missing")
    tmp = Path(tempfile.mkdtemp(prefix="draguard-bundle-api-"))
    try:
        server = start(bin_dir, tmp, runtime_config=None, service_account_admission=True,
                       extra_args=extra_args)  # fmt: skip
    except RuntimeError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail(f"kube-apiserver did not become ready: {exc}", pytrace=False)
    try:
        a = Api(server.kubeconfig)
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
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def sa_kubeconfig(api: Api, sa: str, path: Path, namespace: str = "draguard-system") -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/sa` (a real token from TokenRequest)."""
    token = api.kubectl("-n", namespace, "create", "token", sa)
    assert token.returncode == 0, token.stderr
    return token_kubeconfig(api, token.stdout.strip(), path)


def token_kubeconfig(api: Api, token: str, path: Path) -> Path:
    """The admin kubeconfig with `token` in place of the admin's client certificate.

    `kubectl --token` alone is not enough: kubectl still presents the kubeconfig's certificate, and
    the API server authenticates the certificate first (the request would run as the admin)."""
    cfg = yaml.safe_load(api.kubeconfig.read_text())
    # Same user name, so the context still refers to it.
    cfg["users"] = [{"name": u["name"], "user": {"token": token}} for u in cfg["users"]]
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
