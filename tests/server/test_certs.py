"""Certificate lifecycle: issue, renew at two thirds of the lifetime, CA rollover with both CAs trusted."""

from __future__ import annotations

import datetime as dt
import ssl
import stat
from pathlib import Path

from cryptography import x509

from tests.server.conftest import run_cli
from webhook import certs

NAMES = ["draguard-webhook", "draguard-webhook.draguard-system", "draguard-webhook.draguard-system.svc"]
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class RecordingStore(certs.DirStore):
    def __init__(self, directory: Path, events: list[str]) -> None:
        super().__init__(directory)
        self.events = events

    def save_ca(self, m: certs.Material) -> None:
        self.events.append("save_ca")
        super().save_ca(m)

    def save_serving(self, m: certs.Material) -> None:
        self.events.append("save_serving")
        super().save_serving(m)


def _verifies(cert_pem: bytes, bundle: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return any(certs.signed_by(cert, ca) for ca in certs.load_certs(bundle))


def test_renewal_due_at_two_thirds() -> None:
    ca, _key = certs.generate_ca(days=30, now=T0)
    c = x509.load_pem_x509_certificate(ca)
    start = c.not_valid_before_utc
    life = c.not_valid_after_utc - start
    assert not certs.renewal_due(c, start + life * 0.66)
    assert certs.renewal_due(c, start + life * 0.67)


def test_issue_then_idempotent_then_renew_serving(tmp_path: Path) -> None:
    events: list[str] = []
    store = RecordingStore(tmp_path, events)
    r1 = certs.ensure_certificates(store, NAMES, ca_days=3650, cert_days=30, now=T0)
    assert r1.ca_issued and r1.serving_issued
    first = store.load()
    assert certs.cert_names(x509.load_pem_x509_certificate(first.tls_cert)) == set(NAMES)
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    events.clear()
    r2 = certs.ensure_certificates(store, NAMES, ca_days=3650, cert_days=30, now=T0 + dt.timedelta(days=10))
    assert not r2.ca_issued and not r2.serving_issued and events == []
    r3 = certs.ensure_certificates(store, NAMES, ca_days=3650, cert_days=30, now=T0 + dt.timedelta(days=21))
    assert r3.serving_issued and not r3.ca_issued
    assert store.load().tls_cert != first.tls_cert
    assert store.load().ca_cert == first.ca_cert


def test_new_names_reissue(tmp_path: Path) -> None:
    store = certs.DirStore(tmp_path)
    certs.ensure_certificates(store, NAMES, now=T0)
    r = certs.ensure_certificates(store, [*NAMES, "127.0.0.1"], now=T0)
    assert r.serving_issued and "127.0.0.1" in certs.cert_names(
        x509.load_pem_x509_certificate(store.load().tls_cert)
    )


def test_ca_rollover_keeps_old_ca_until_it_expires_and_injects_first(tmp_path: Path) -> None:
    events: list[str] = []
    store = RecordingStore(tmp_path, events)
    injected: list[bytes] = []

    def inject(bundle: bytes) -> tuple[list[str], list[str]]:
        events.append("inject")
        injected.append(bundle)
        return ["ValidatingWebhookConfiguration/draguard"], []

    certs.ensure_certificates(store, NAMES, ca_days=90, cert_days=30, now=T0, inject=inject)
    old = store.load()
    events.clear()
    r = certs.ensure_certificates(
        store, NAMES, ca_days=90, cert_days=30, now=T0 + dt.timedelta(days=61), inject=inject
    )
    new = store.load()
    assert r.ca_issued and r.serving_issued and r.bundle_cas == 2
    # The API server trusts the new chain before the new serving certificate is stored.
    assert events == ["save_ca", "inject", "save_serving"]
    assert injected[-1] == new.ca_bundle
    # During the rollover both the old and the new serving certificate verify against the bundle.
    assert _verifies(old.tls_cert, new.ca_bundle) and _verifies(new.tls_cert, new.ca_bundle)
    # After the old CA expired, it leaves the bundle.
    later = certs.ensure_certificates(store, NAMES, ca_days=90, cert_days=30, now=T0 + dt.timedelta(days=95))
    assert later.bundle_cas == 1
    assert certs.load_certs(store.load().ca_bundle)[0].fingerprint(
        certs.hashes.SHA256()
    ) == x509.load_pem_x509_certificate(new.ca_cert).fingerprint(certs.hashes.SHA256())


def test_serving_never_outlives_ca(tmp_path: Path) -> None:
    store = certs.DirStore(tmp_path)
    certs.ensure_certificates(store, NAMES, ca_days=10, cert_days=365, now=T0)
    m = store.load()
    assert (
        x509.load_pem_x509_certificate(m.tls_cert).not_valid_after_utc
        <= x509.load_pem_x509_certificate(m.ca_cert).not_valid_after_utc
    )


def test_certs_command_files_load_in_tls_server_context(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "tls"
    assert run_cli(["certs", "--out-dir", str(out), "--extra-san", "127.0.0.1"]) == 0
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(out / "tls.crt"), str(out / "tls.key"))
    assert _verifies((out / "tls.crt").read_bytes(), (out / "ca-bundle.crt").read_bytes())


def test_certs_command_unreadable_ca_is_replaced_with_a_reason(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "tls"
    assert run_cli(["certs", "--out-dir", str(out)]) == 0
    (out / "ca.crt").write_text("garbage")
    assert run_cli(["certs", "--out-dir", str(out)]) == 0
    text = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "stored CA unreadable" in text and "new CA issued" in text
