"""The real server on loopback over TLS, with certificates from `draguard certs`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.server.conftest import free_port, make_webhook, review, run_cli, write_policies
from tests.server.objects import legacy_pod_spec, tier_pod_spec, workload
from webhook import certs
from webhook.server.app import ServeOptions, Webhook, serve


@contextlib.asynccontextmanager
async def running(
    policies: Path, tls: Path, client_ca: str | None = None, shutdown_delay: float = 0.0
) -> AsyncIterator[tuple[str, Webhook]]:
    port = free_port()
    opts = ServeOptions(
        policies=str(policies),
        host="127.0.0.1",
        port=port,
        tls_cert=str(tls / "tls.crt"),
        tls_key=str(tls / "tls.key"),
        client_ca=client_ca,
        no_watch=True,
        poll_interval=0.1,
        shutdown_delay=shutdown_delay,
    )
    wh = make_webhook(policies)
    wh.opts = opts
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(opts, stop=stop, started=started, webhook=wh))
    await asyncio.wait_for(started.wait(), 10)
    try:
        yield f"https://127.0.0.1:{port}", wh
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def client_ctx(ca: Path, **kw: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


async def test_review_over_tls_with_generated_certificates(tmp_path: Path, cert_dir: Path) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    async with running(pol, cert_dir) as (url, _wh), aiohttp.ClientSession() as s:
        obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
        async with s.post(
            f"{url}/validate", json=review(obj), ssl=client_ctx(cert_dir / "ca-bundle.crt")
        ) as r:
            doc = await r.json()
        assert r.status == 200 and doc["response"]["allowed"] is False
        # The certificate names the Service and the local address.
        cert = x509.load_pem_x509_certificate((cert_dir / "tls.crt").read_bytes())
        assert {
            "draguard-webhook",
            "draguard-webhook.draguard-system",
            "draguard-webhook.draguard-system.svc",
            "127.0.0.1",
        } <= certs.cert_names(cert)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls_below_1_2_refused(tmp_path: Path, cert_dir: Path) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    async with running(pol, cert_dir) as (url, _wh):
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        old = client_ctx(cert_dir / "ca.crt")
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _r, w = await asyncio.open_connection(host, port, ssl=old, server_hostname=host)
            w.close()
        ok = client_ctx(cert_dir / "ca.crt")
        ok.maximum_version = ssl.TLSVersion.TLSv1_2
        _r, w = await asyncio.open_connection(host, port, ssl=ok, server_hostname=host)
        assert w.get_extra_info("ssl_object").version() == "TLSv1.2"
        w.close()


async def test_client_certificate_required_with_client_ca(tmp_path: Path, cert_dir: Path) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    ca_pem, ca_key = certs.generate_ca("api-server-clients")
    (tmp_path / "clients-ca.crt").write_bytes(ca_pem)
    crt, key = certs.generate_serving(ca_pem, ca_key, ["kube-apiserver"], client=True)
    (tmp_path / "client.crt").write_bytes(crt)
    (tmp_path / "client.key").write_bytes(key)
    async with (
        running(pol, cert_dir, client_ca=str(tmp_path / "clients-ca.crt")) as (url, _wh),
        aiohttp.ClientSession() as s,
    ):
        with pytest.raises(aiohttp.ClientError):
            async with s.get(f"{url}/healthz", ssl=client_ctx(cert_dir / "ca.crt")) as r:
                await r.read()
        ctx = client_ctx(cert_dir / "ca.crt")
        ctx.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        async with s.get(f"{url}/healthz", ssl=ctx) as r:
            assert r.status == 200


def _served_serial(port: int, ca: Path) -> int:
    import socket

    ctx = client_ctx(ca)
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.reliability
async def test_certificate_swap_under_load_drops_nothing(tmp_path: Path, cert_dir: Path) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    body = review(workload("Pod", legacy_pod_spec()))
    first_pem = (cert_dir / "tls.crt").read_bytes()
    async with running(pol, cert_dir) as (url, wh):
        port = int(url.rsplit(":", 1)[1])
        before = await asyncio.to_thread(_served_serial, port, cert_dir / "ca-bundle.crt")
        expiry_before = _expiry(wh)
        ctx = client_ctx(cert_dir / "ca-bundle.crt")
        failures: list[str] = []
        done = 0
        stop_at = time.monotonic() + 3.0

        async def worker(fresh_connections: bool) -> None:
            nonlocal done
            conn = aiohttp.TCPConnector(ssl=ctx, force_close=fresh_connections)
            async with aiohttp.ClientSession(connector=conn) as s:
                while time.monotonic() < stop_at:
                    try:
                        async with s.post(f"{url}/validate", json=body) as r:
                            if r.status != 200:
                                failures.append(f"HTTP {r.status}")
                            await r.read()
                            done += 1
                    except Exception as e:
                        failures.append(repr(e))

        async def rotate() -> None:
            await asyncio.sleep(1.0)
            # Renew the serving certificate in place, as the Secret mount would.
            assert (
                await asyncio.to_thread(
                    run_cli,
                    [
                        "certs",
                        "--out-dir",
                        str(cert_dir),
                        "--extra-san",
                        "127.0.0.1",
                        "--extra-san",
                        "localhost",
                        "--force",
                    ],
                )
                == 0
            )

        await asyncio.gather(*(worker(i % 2 == 0) for i in range(8)), rotate())
        after = await asyncio.to_thread(_served_serial, port, cert_dir / "ca-bundle.crt")
        assert failures == []
        assert done > 50
        assert after != before  # new connections get the new certificate
        assert wh.tls.reloads >= 1
        ok = wh.metrics.registry.get_sample_value("draguard_tls_reloads_total", {"outcome": "ok"})
        assert (ok or 0) >= 1
        # The expiry the alerts read is the renewed certificate's, not the first one's.
        assert expiry_before == _file_not_after(first_pem)
        assert _expiry(wh) == _file_not_after((cert_dir / "tls.crt").read_bytes()) != expiry_before


def _expiry(wh: Webhook) -> float | None:
    return wh.metrics.registry.get_sample_value("draguard_tls_certificate_expiry_timestamp_seconds")


def _file_not_after(pem: bytes) -> float:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()


async def test_half_written_key_pair_keeps_serving_old_certificate(tmp_path: Path, cert_dir: Path) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    async with running(pol, cert_dir) as (url, wh):
        port = int(url.rsplit(":", 1)[1])
        before = await asyncio.to_thread(_served_serial, port, cert_dir / "ca.crt")
        # A new certificate without its key (a rotation caught half-way).
        m = certs.DirStore(cert_dir).load()
        crt, _key = certs.generate_serving(m.ca_cert, m.ca_key, ["127.0.0.1"], days=30)
        (cert_dir / "tls.crt").write_bytes(crt)

        def rejected() -> float:
            value = wh.metrics.registry.get_sample_value("draguard_tls_reloads_total", {"outcome": "invalid"})
            return value or 0.0

        # The reloader has seen the change and refused it (not merely not looked yet).
        deadline = time.monotonic() + 30
        while rejected() < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert rejected() >= 1
        assert await asyncio.to_thread(_served_serial, port, cert_dir / "ca.crt") == before
        # The refused certificate's expiry is not the one reported: the old one is still served.
        assert _expiry(wh) == wh.tls.not_after != _file_not_after(crt)


def _trusted_form(pem: bytes) -> bytes:
    """The first certificate of `pem` as OpenSSL's `TRUSTED CERTIFICATE` block (no trust settings),
    which OpenSSL serves from and `cryptography` does not read; the chain after it unchanged."""
    import base64
    import textwrap

    first, sep, rest = pem.partition(b"-----END CERTIFICATE-----\n")
    der = x509.load_pem_x509_certificate(first + sep).public_bytes(serialization.Encoding.DER)
    body = "\n".join(textwrap.wrap(base64.b64encode(der).decode(), 64))
    return f"-----BEGIN TRUSTED CERTIFICATE-----\n{body}\n-----END TRUSTED CERTIFICATE-----\n".encode() + rest


async def test_a_certificate_whose_expiry_cannot_be_read_still_serves_without_an_expiry(
    tmp_path: Path, cert_dir: Path
) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    normal = (cert_dir / "tls.crt").read_bytes()
    (cert_dir / "tls.crt").write_bytes(_trusted_form(normal))
    async with running(pol, cert_dir) as (url, wh):
        port = int(url.rsplit(":", 1)[1])
        # Served as before, with no expiry series rather than a wrong one.
        assert await asyncio.to_thread(_served_serial, port, cert_dir / "ca-bundle.crt")
        assert wh.tls.not_after is None and _expiry(wh) is None

        async def reloaded(n: int) -> None:
            deadline = time.monotonic() + 30
            while wh.tls.reloads < n and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert wh.tls.reloads >= n

        (cert_dir / "tls.crt").write_bytes(normal)
        await reloaded(1)
        assert _expiry(wh) == _file_not_after(normal)
        # Back to the form whose expiry is unknown: the earlier date is not left behind.
        (cert_dir / "tls.crt").write_bytes(_trusted_form(normal) + b"\n")
        await reloaded(2)
        assert _expiry(wh) is None


def _configmap_dir(root: Path, version: str, mode: str, broken: bool = False) -> None:
    """Policies laid out as the kubelet mounts a ConfigMap: ..<ts>/f, ..data -> ..<ts>, f -> ..data/f."""
    data = root / f"..{version}"
    write_policies(data, mode)
    if broken:
        (data / "tier.yaml").write_text(
            "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\nspec: [oops\n"
        )
    tmp = root / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    for f in ("tier.yaml", "cel.yaml", "migration.yaml"):
        link = root / f
        if not link.is_symlink():
            link.symlink_to(f"..data/{f}")


async def test_policy_configmap_swap_reloads_and_invalid_change_keeps_last_good(
    tmp_path: Path, cert_dir: Path
) -> None:
    root = tmp_path / "mounted"
    root.mkdir()
    _configmap_dir(root, "2026_01", "enforce")
    obj = workload("Pod", tier_pod_spec(), {"draguard.io/workload-class": "llm"})
    async with running(root, cert_dir) as (url, wh), aiohttp.ClientSession() as s:
        ctx = client_ctx(cert_dir / "ca.crt")

        async def allowed() -> bool:
            async with s.post(f"{url}/validate", json=review(obj), ssl=ctx) as r:
                return bool((await r.json())["response"]["allowed"])

        assert await allowed() is False
        _configmap_dir(root, "2026_02", "warn")
        for _ in range(50):
            if await allowed():
                break
            await asyncio.sleep(0.1)
        assert await allowed() is True  # picked up without restart
        _configmap_dir(root, "2026_03", "enforce", broken=True)
        await asyncio.sleep(0.6)
        assert await allowed() is True  # last good set (warn) still in force
        text = wh.metrics.render().decode()
        assert "draguard_policy_reload_failures_total 1.0" in text
        async with s.get(f"{url}/readyz", ssl=ctx) as r:
            assert r.status == 200


async def test_graceful_shutdown_readiness_first_inflight_finishes(tmp_path: Path, cert_dir: Path) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    port = free_port()
    opts = ServeOptions(
        policies=str(pol),
        host="127.0.0.1",
        port=port,
        tls_cert=str(cert_dir / "tls.crt"),
        tls_key=str(cert_dir / "tls.key"),
        no_watch=True,
        shutdown_delay=1.0,
    )
    wh = make_webhook(pol)
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(opts, stop=stop, started=started, webhook=wh))
    await started.wait()
    url = f"https://127.0.0.1:{port}"
    ctx = client_ctx(cert_dir / "ca.crt")
    import json as _json

    payload = _json.dumps(review(workload("Pod", legacy_pod_spec()))).encode()
    half = len(payload) // 2

    async def slow_body() -> AsyncIterator[bytes]:
        yield payload[:half]
        await asyncio.sleep(1.5)  # the server is told to stop while this request is in flight
        yield payload[half:]

    async with aiohttp.ClientSession() as s:
        inflight = asyncio.create_task(s.post(f"{url}/validate", data=slow_body(), ssl=ctx))
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.sleep(0.2)
        async with s.get(f"{url}/readyz", ssl=ctx) as r:
            assert r.status == 503  # readiness false first, while still serving
        resp = await inflight
        assert resp.status == 200 and (await resp.json())["response"]["uid"]
        resp.release()
    await asyncio.wait_for(task, 30)
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as s, s.get(f"{url}/healthz", ssl=ctx) as r:
            await r.read()


def test_serve_command_reports_bad_tls_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pol = write_policies(tmp_path / "pol", "enforce")
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    rc = run_cli(
        [
            "serve",
            "--port",
            str(free_port()),
            "--tls-cert",
            str(tmp_path / "tls.crt"),
            "--tls-key",
            str(tmp_path / "tls.key"),
            "--policies",
            str(pol),
            "--no-watch",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "tls.crt" in err and "Traceback" not in err


def test_serve_command_without_cluster_access_says_what_to_do(
    tmp_path: Path, cert_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    pol = write_policies(tmp_path / "pol", "enforce")
    rc = run_cli(
        [
            "serve",
            "--port",
            str(free_port()),
            "--tls-cert",
            str(cert_dir / "tls.crt"),
            "--tls-key",
            str(cert_dir / "tls.key"),
            "--policies",
            str(pol),
            "--log-level",
            "error",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "--no-watch --inventory FILE" in err and "Traceback" not in err


def test_sigterm_turns_readiness_off_then_exits_cleanly(tmp_path: Path, cert_dir: Path) -> None:
    import signal
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from tests.server.conftest import ROOT

    pol = write_policies(tmp_path / "pol", "enforce")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tls-cert",
            str(cert_dir / "tls.crt"),
            "--tls-key",
            str(cert_dir / "tls.key"),
            "--policies",
            str(pol),
            "--no-watch",
            "--shutdown-delay",
            "2",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    ctx = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))

    def readyz() -> int:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if readyz() == 200:
                    break
            except OSError:
                time.sleep(0.2)
        assert readyz() == 200
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert readyz() == 503  # still serving, but no longer ready
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_default_host_serves_ipv4_and_ipv6(tmp_path: Path) -> None:
    """Without --host the webhook listens on every interface of both families (IPv6-only pods)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    out = tmp_path / "tls"
    assert run_cli(["certs", "--out-dir", str(out), "--extra-san", "127.0.0.1", "--extra-san", "::1"]) == 0
    pol = write_policies(tmp_path / "pol", "enforce")
    port = free_port()
    opts = ServeOptions(
        policies=str(pol), port=port, tls_cert=str(out / "tls.crt"), tls_key=str(out / "tls.key"),
        no_watch=True, shutdown_delay=0.0,
    )  # fmt: skip
    assert opts.host is None
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(opts, stop=stop, started=started, webhook=make_webhook(pol)))
    await started.wait()
    try:
        ctx = client_ctx(out / "ca.crt")
        body = review(workload("Pod", legacy_pod_spec()))
        async with aiohttp.ClientSession() as s:
            for host in ("127.0.0.1", "[::1]"):
                async with s.post(f"https://{host}:{port}/validate", json=body, ssl=ctx) as r:
                    assert r.status == 200, host
                    assert (await r.json())["response"]["uid"] == body["request"]["uid"], host
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
