"""Serving-certificate rotation under load: zero failed requests, new connections get the new cert.

`draguard certs --out-dir DIR --force` renews the serving certificate (same CA) while a stream of
reviews runs: half the workers open a fresh TLS connection per request, half keep theirs alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509

from tests.reliability.conftest import ROOT, SOAK, WebhookProcess, draguard, make_certs, sample_reviews
from tests.reliability.loadgen import LoadResult, run_load


def served_serial(wh: WebhookProcess) -> int:
    ctx = wh.ssl_context()
    with (
        socket.create_connection(("127.0.0.1", wh.port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


@pytest.mark.timeout(300)
def test_rotation_during_load(tmp_path: Path, inventory_file: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    wh = WebhookProcess(tmp_path, certs, inventory_file).start("--poll-interval", "0.2")
    rotations = 8 if SOAK else 4
    seconds = 40.0 if SOAK else 12.0
    serials = {served_serial(wh)}
    rotated: list[float] = []
    errors: list[str] = []

    def rotate() -> None:
        time.sleep(1.0)
        for _ in range(rotations):
            p = subprocess.run(
                draguard(
                    "certs", "--out-dir", str(certs), "--extra-san", "127.0.0.1", "--no-inject", "--force"
                ),
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            if p.returncode != 0:
                errors.append(p.stderr)
            rotated.append(time.monotonic())
            time.sleep(seconds / (rotations + 1))

    t = threading.Thread(target=rotate)
    t.start()
    bodies = sample_reviews(200)

    async def both() -> tuple[LoadResult, LoadResult]:
        url = f"https://127.0.0.1:{wh.port}"
        fresh = run_load(
            url, bodies, ssl_context=wh.ssl_context(), concurrency=3, max_requests=10**9,
            max_seconds=seconds, fresh_connections=True,
        )  # fmt: skip
        kept = run_load(
            url, bodies, ssl_context=wh.ssl_context(), concurrency=3, max_requests=10**9, max_seconds=seconds
        )
        a, b = await asyncio.gather(fresh, kept)
        return a, b

    try:
        fresh, kept = asyncio.run(both())
        t.join(timeout=120)
        time.sleep(0.6)  # one more poll interval, then the newest certificate must be served
        serials.add(served_serial(wh))
        on_disk = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).serial_number
        now_served = served_serial(wh)
        reloads = [ln for ln in wh.log().splitlines() if "TLS certificate reloaded" in ln]
    finally:
        wh.stop()
    summary = {
        "rotations": len(rotated),
        "fresh_connections": fresh.summary(),
        "keep_alive": kept.summary(),
        "reloads_logged": len(reloads),
        "distinct_serials_seen": len(serials),
    }
    print("rotation:", json.dumps(summary))
    out = os.environ.get("DRAGUARD_RELIABILITY_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "rotation.json").write_text(json.dumps(summary, indent=2))
    assert not errors, errors
    assert len(rotated) == rotations
    assert fresh.failed == 0 and kept.failed == 0, summary
    assert set(fresh.statuses) == {200} and set(kept.statuses) == {200}, summary
    assert fresh.sent > 100 and kept.sent > 100, summary
    assert len(reloads) >= rotations - 1, summary  # renewals closer than one poll may merge
    assert now_served == on_disk, "the server does not serve the newest certificate"
    assert len(serials) >= 2


def test_tls_below_1_2_refused(certs: Path, inventory_file: Path, tmp_path: Path) -> None:
    """TLS 1.0 and 1.1 handshakes fail; 1.2 and 1.3 succeed."""
    wh = WebhookProcess(tmp_path, certs, inventory_file).start()
    try:
        outcomes = {}
        for name, ver in (
            ("TLSv1", ssl.TLSVersion.TLSv1),
            ("TLSv1.1", ssl.TLSVersion.TLSv1_1),
            ("TLSv1.2", ssl.TLSVersion.TLSv1_2),
            ("TLSv1.3", ssl.TLSVersion.TLSv1_3),
        ):
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.load_verify_locations(str(certs / "ca-bundle.crt"))
            try:
                ctx.minimum_version = ver
                ctx.maximum_version = ver
                if ver < ssl.TLSVersion.TLSv1_2:
                    ctx.set_ciphers("ALL:@SECLEVEL=0")  # let the client offer what old TLS needs
            except (ValueError, ssl.SSLError):
                pass
            try:
                with (
                    socket.create_connection(("127.0.0.1", wh.port), timeout=5) as raw,
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
                ):
                    outcomes[name] = s.version()
            except (ssl.SSLError, OSError) as e:
                outcomes[name] = f"refused: {type(e).__name__}"
    finally:
        wh.stop()
    assert outcomes["TLSv1"].startswith("refused"), outcomes
    assert outcomes["TLSv1.1"].startswith("refused"), outcomes
    assert outcomes["TLSv1.2"] == "TLSv1.2", outcomes
    assert outcomes["TLSv1.3"] == "TLSv1.3", outcomes
