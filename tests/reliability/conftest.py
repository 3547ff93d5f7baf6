"""Shared parts of the reliability tests: a real `draguard serve` process over TLS, its certificates,
an inventory file, and review bodies.

Every test in this directory is marked `reliability`. Longer variants run with DRAGUARD_SOAK=1.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
SEED = ROOT / "tests" / "fixtures" / "seed"
SOAK = os.environ.get("DRAGUARD_SOAK", "") not in ("", "0", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


def unavailable(reason: str) -> None:
    """Skip an e2e test whose Kubernetes binaries are missing; under CI=true that is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"e2e: {reason}", pytrace=False)
    pytest.skip(f"e2e: {reason}")


def draguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "webhook.cli", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certs(out: Path) -> Path:
    proc = subprocess.run(
        draguard("certs", "--out-dir", str(out), "--extra-san", "127.0.0.1", "--no-inject"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def write_inventory(path: Path) -> Path:
    """The seed cluster (16 devices on 3 nodes), its DeviceClasses and one claim template."""
    docs: list[Any] = list(yaml.safe_load_all((SEED / "cluster-inventory.yaml").read_text()))
    docs += list(yaml.safe_load_all((SEED / "deviceclasses.yaml").read_text()))
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
    path.write_text(yaml.safe_dump_all([d for d in docs if d], sort_keys=False))
    return path


class WebhookProcess:
    """`draguard serve` in its own process, logs to a file, reachable over TLS on loopback."""

    def __init__(self, workdir: Path, certs: Path, inventory: Path, policies: Path | None = None) -> None:
        self.workdir = workdir
        self.certs = certs
        self.inventory = inventory
        self.policies = policies or ROOT / "policies"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "webhook.log"

    def start(
        self,
        *extra: str,
        log_level: str = "info",
        cpu: int | None = None,
        port: int | None = None,
        timeout: float = 60.0,
    ) -> WebhookProcess:
        self.port = port or free_port()
        argv = draguard(
            "serve", "--host", "127.0.0.1", "--port", str(self.port),
            "--tls-cert", str(self.certs / "tls.crt"), "--tls-key", str(self.certs / "tls.key"),
            "--policies", str(self.policies), "--inventory", str(self.inventory), "--no-watch",
            "--shutdown-delay", "0", "--log-level", log_level, *extra,
        )  # fmt: skip
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu), *argv]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"draguard serve exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                status, _ = self.get("/readyz")
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"draguard serve not ready in {timeout:.0f} s:\n{self.log()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ssl_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client context trusting the server's CA; `cert` (crt, key) is a client certificate."""
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca-bundle.crt"))
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return ctx

    def connection(
        self, timeout: float = 10.0, ctx: ssl.SSLContext | None = None
    ) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=ctx or self.ssl_context(), timeout=timeout
        )

    def post(
        self, path: str, body: bytes, timeout: float = 20.0, ctx: ssl.SSLContext | None = None
    ) -> tuple[int, dict[str, Any]]:
        """POST a JSON body: the status and the JSON answer ({} when the answer is not a JSON object)."""
        conn = self.connection(timeout=timeout, ctx=ctx)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            return r.status, (json.loads(data) if data.startswith(b"{") else {})
        finally:
            conn.close()

    def raw_tls(self, timeout: float = 5.0) -> ssl.SSLSocket:
        """A bare TLS socket to the server (for byte-level abuse: slow or lying clients)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.ssl_context().wrap_socket(sock, server_hostname="127.0.0.1")

    def get(self, path: str) -> tuple[int, bytes]:
        conn = self.connection(timeout=2.0)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def review_body(
    obj: Any,
    *,
    group: str = "",
    version: str = "v1",
    kind: str = "Pod",
    namespace: str = "team-a",
    uid: str = "7d1c3a52-0000-4000-8000-000000000001",
    operation: str = "CREATE",
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "reliability"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


def sample_reviews(n: int) -> list[bytes]:
    """n valid reviews of mixed shapes (LLM on the wrong tier, legacy GPU pod, CEL claim, plain pod)."""
    out = []
    for i in range(n):
        uid = f"7d1c3a52-0000-4000-8000-{i:012d}"
        shape = i % 4
        if shape == 0:
            obj = {
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": f"llm-{i}", "namespace": "team-a"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}}, "template": {
                    "metadata": {"labels": {"app": "llm"}},
                    "spec": {"containers": [{"name": "s", "image": "vllm/vllm-openai:v0.6.3",
                                             "resources": {"claims": [{"name": "gpu"}]}}],
                             "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}]}}},
            }  # fmt: skip
            out.append(review_body(obj, group="apps", kind="Deployment", uid=uid))
        elif shape == 1:
            obj = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"legacy-{i}", "namespace": "team-a"},
                   "spec": {"containers": [{"name": "t", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}  # fmt: skip
            out.append(review_body(obj, uid=uid))
        elif shape == 2:
            sel = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
            obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": f"claim-{i}", "namespace": "team-a"},
                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                       "deviceClassName": "gpu.nvidia.com-h100",
                       "selectors": [{"cel": {"expression": sel}}]}}]}}}  # fmt: skip
            out.append(review_body(obj, group="resource.k8s.io", kind="ResourceClaim", uid=uid))
        else:
            obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"web-{i}", "namespace": "team-a"},
                "spec": {"containers": [{"name": "w", "image": "nginx:1.27"}]},
            }
            out.append(review_body(obj, uid=uid))
    return [json.dumps(r).encode() for r in out]


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_inventory(tmp_path_factory.mktemp("inv") / "inventory.yaml")


@pytest.fixture(scope="module")
def webhook(
    tmp_path_factory: pytest.TempPathFactory, certs: Path, inventory_file: Path
) -> Iterator[WebhookProcess]:
    """One server for a whole module (bad-input tests reuse it and check it stays up)."""
    wh = WebhookProcess(tmp_path_factory.mktemp("wh"), certs, inventory_file).start()
    try:
        yield wh
    finally:
        wh.stop()
