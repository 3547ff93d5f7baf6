"""Only the API server can call a real `draguard serve` started with --client-ca: probes and
metrics move to their own port, a replaced client CA stops being trusted, and --client-name
narrows which certificates of that CA are accepted."""

from __future__ import annotations

import http.client
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.adversarial.hostile import client_cert, make_ca, write_ca
from tests.reliability.conftest import WebhookProcess, free_port, sample_reviews


def _post(wh: WebhookProcess, ctx: ssl.SSLContext) -> int:
    return wh.post("/validate", sample_reviews(1)[0], timeout=10, ctx=ctx)[0]


def _refused(wh: WebhookProcess, ctx: ssl.SSLContext) -> bool:
    try:
        _post(wh, ctx)
    except (ssl.SSLError, ConnectionError, OSError):
        return True
    return False


def _probe(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


class ProbeReady(WebhookProcess):
    """Readiness is polled on the probe port: the serving port needs a client certificate."""

    probe_port = 0

    def get(self, path: str) -> tuple[int, bytes]:
        return _probe(self.probe_port, path), b""


@pytest.fixture
def mtls(tmp_path: Path, certs: Path, inventory_file: Path) -> Iterator[tuple[ProbeReady, dict[str, object]]]:
    ca_a, ca_b = make_ca("apiserver-client-ca-a"), make_ca("apiserver-client-ca-b")
    ca_file = write_ca(ca_a, tmp_path / "client-ca.crt")
    parts: dict[str, object] = {
        "ca_a": ca_a,
        "ca_b": ca_b,
        "ca_file": ca_file,
        "apiserver_a": client_cert(ca_a, "kube-apiserver", tmp_path / "apiserver-a"),
        "other_a": client_cert(ca_a, "some-controller", tmp_path / "other-a"),
        "apiserver_b": client_cert(ca_b, "kube-apiserver", tmp_path / "apiserver-b"),
    }
    wh = ProbeReady(tmp_path, certs, inventory_file)
    wh.probe_port = free_port()
    wh.start(
        "--client-ca", str(ca_file), "--client-name", "kube-apiserver",
        "--probe-port", str(wh.probe_port), "--poll-interval", "0.2",
    )  # fmt: skip
    try:
        yield wh, parts
    finally:
        wh.stop()


def test_only_the_api_servers_certificate_is_accepted(mtls: tuple[ProbeReady, dict[str, object]]) -> None:
    wh, p = mtls
    # No client certificate: the handshake fails; nothing reaches admission.
    assert _refused(wh, wh.ssl_context())
    assert _post(wh, wh.ssl_context(p["apiserver_a"])) == 200  # type: ignore[arg-type]
    # Signed by the right CA but not the API server's name: 403 before any review.
    assert _post(wh, wh.ssl_context(p["other_a"])) == 403  # type: ignore[arg-type]
    # A certificate of another CA is refused.
    assert _refused(wh, wh.ssl_context(p["apiserver_b"]))  # type: ignore[arg-type]
    # Kubelet and Prometheus need no certificate, on their own port.
    assert _probe(wh.probe_port, "/readyz") == 200
    assert _probe(wh.probe_port, "/healthz") == 200
    assert _probe(wh.probe_port, "/metrics") == 200
    assert "client certificate name not allowed" in wh.log()


def test_a_replaced_client_ca_is_no_longer_trusted(mtls: tuple[ProbeReady, dict[str, object]]) -> None:
    wh, p = mtls
    assert _post(wh, wh.ssl_context(p["apiserver_a"])) == 200  # type: ignore[arg-type]
    ca_file = p["ca_file"]
    assert isinstance(ca_file, Path)
    tmp = ca_file.with_suffix(".new")
    write_ca(p["ca_b"], tmp)  # type: ignore[arg-type]
    os.replace(tmp, ca_file)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "TLS certificate reloaded" not in wh.log():
        time.sleep(0.1)
    assert "TLS certificate reloaded" in wh.log()
    assert _post(wh, wh.ssl_context(p["apiserver_b"])) == 200  # type: ignore[arg-type]
    assert _refused(wh, wh.ssl_context(p["apiserver_a"]))  # type: ignore[arg-type]


def test_client_ca_needs_a_probe_port(tmp_path: Path, certs: Path, inventory_file: Path) -> None:
    import subprocess

    from tests.reliability.conftest import ROOT, draguard

    ca_file = write_ca(make_ca("x"), tmp_path / "ca.crt")
    proc = subprocess.run(
        draguard(
            "serve", "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
            "--policies", str(ROOT / "policies"), "--no-watch", "--inventory", str(inventory_file),
            "--client-ca", str(ca_file),
        ),
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--client-ca needs --probe-port" in proc.stderr and "Traceback" not in proc.stderr
