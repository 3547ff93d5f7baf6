"""Webhook certificates: a private CA, the serving certificate it signs, renewal and CA rollover.

Pure crypto lives in the functions at the top; `CertStore` implementations are the edges (files in a
directory, or Kubernetes Secrets). `ensure_certificates` is the whole lifecycle, run by
`draguard certs` at install time and periodically (a CronJob), and idempotent: it only issues what is
missing, expiring (two thirds of the lifetime passed) or no longer matching the requested names.

Rollover: a renewed CA is put in the CA bundle *next to* the previous one; the bundle is written to the
webhook configurations before the serving certificate signed by the new CA is stored, so the API server
trusts both the old and the new serving certificate while the pods pick up the new files. The previous
CA leaves the bundle when it expires.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MANAGED_BY = {"app.kubernetes.io/managed-by": "draguard"}
DEFAULT_CA_DAYS = 3650.0
DEFAULT_CERT_DAYS = 365.0
# Renew when this share of the lifetime has passed.
RENEW_FRACTION = 2.0 / 3.0


class CertError(Exception):
    """A certificate problem the user can act on (unreadable file, API refusal)."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: accepted by the API server, cheap handshakes (the webhook sits on the request path).
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def load_certs(pem: bytes) -> list[x509.Certificate]:
    return list(x509.load_pem_x509_certificates(pem)) if pem.strip() else []


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError("the CA key is not an EC key; delete the CA so that draguard issues a new one")
    return key


def generate_ca(
    common_name: str = "draguard-webhook-ca", days: float = DEFAULT_CA_DAYS, now: dt.datetime | None = None
) -> tuple[bytes, bytes]:
    """A self-signed CA: (cert PEM, key PEM)."""
    now = now or _now()
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert_pem(cert), key_pem(key)


def service_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]


def _san_entries(names: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def generate_serving(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    names: Sequence[str],
    days: float = DEFAULT_CERT_DAYS,
    now: dt.datetime | None = None,
    client: bool = False,
) -> tuple[bytes, bytes]:
    """A serving certificate for `names` (DNS names or IP addresses), signed by the CA.

    `client=True` makes a client certificate instead (for servers started with `--client-ca`).

    Never outlives the CA: a certificate valid past its issuer would fail verification anyway.
    """
    if not names:
        raise CertError("a serving certificate needs at least one name")
    now = now or _now()
    ca = load_cert(ca_cert_pem)
    ca_key = load_key(ca_key_pem)
    key = _new_key()
    not_after = min(now + dt.timedelta(days=days), ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(_san_entries(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert_pem(cert), key_pem(key)


def renewal_due(cert: x509.Certificate, now: dt.datetime | None = None) -> bool:
    """True once two thirds of the certificate's lifetime have passed."""
    now = now or _now()
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * RENEW_FRACTION


def cert_names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):  # InvalidSignature has no common base besides Exception
        return False
    return True


# --- storage -------------------------------------------------------------------------------------


@dataclass
class Material:
    """What draguard keeps: the current CA (+ key), the CA bundle, and the serving pair."""

    ca_cert: bytes = b""
    ca_key: bytes = b""
    ca_bundle: bytes = b""
    tls_cert: bytes = b""
    tls_key: bytes = b""


class CertStore(Protocol):
    def load(self) -> Material: ...
    def save_ca(self, m: Material) -> None: ...
    def save_serving(self, m: Material) -> None: ...
    def describe(self) -> str: ...


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    # Write then rename: a server polling the file never reads half a certificate.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DirStore:
    """Files in a directory: ca.crt, ca.key, ca-bundle.crt, tls.crt, tls.key."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def describe(self) -> str:
        return str(self.dir)

    def _read(self, name: str) -> bytes:
        p = self.dir / name
        try:
            return p.read_bytes()
        except FileNotFoundError:
            return b""
        except OSError as e:
            raise CertError(f"{p}: cannot read ({e.strerror})") from e

    def load(self) -> Material:
        return Material(
            ca_cert=self._read("ca.crt"),
            ca_key=self._read("ca.key"),
            ca_bundle=self._read("ca-bundle.crt"),
            tls_cert=self._read("tls.crt"),
            tls_key=self._read("tls.key"),
        )

    def save_ca(self, m: Material) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.dir / "ca.key", m.ca_key, 0o600)
        _atomic_write(self.dir / "ca.crt", m.ca_cert, 0o644)
        _atomic_write(self.dir / "ca-bundle.crt", m.ca_bundle, 0o644)

    def save_serving(self, m: Material) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # Key first: the server reloads only when the pair matches, so the order is safe either way.
        _atomic_write(self.dir / "tls.key", m.tls_key, 0o600)
        _atomic_write(self.dir / "tls.crt", m.tls_cert, 0o644)


class SecretStore:
    """Two Secrets: `<secret>` (type kubernetes.io/tls, mounted by the webhook pods: tls.crt, tls.key,
    ca.crt = bundle) and `<secret>-ca` (the CA key, never mounted)."""

    def __init__(self, core_api: Any, namespace: str, secret: str) -> None:
        self.api = core_api
        self.ns = namespace
        self.secret = secret
        self.ca_secret = f"{secret}-ca"

    def describe(self) -> str:
        return f"Secrets {self.ns}/{self.secret} and {self.ns}/{self.ca_secret}"

    def _get(self, name: str) -> dict[str, bytes]:
        from kubernetes.client.exceptions import ApiException

        try:
            s = self.api.read_namespaced_secret(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                return {}
            raise CertError(f"cannot read Secret {self.ns}/{name}: {e.status} {e.reason}") from e
        return {k: base64.b64decode(v) for k, v in (s.data or {}).items()}

    def load(self) -> Material:
        tls = self._get(self.secret)
        ca = self._get(self.ca_secret)
        return Material(
            ca_cert=ca.get("ca.crt", b""),
            ca_key=ca.get("ca.key", b""),
            ca_bundle=ca.get("ca-bundle.crt", b""),
            tls_cert=tls.get("tls.crt", b""),
            tls_key=tls.get("tls.key", b""),
        )

    def _put(self, name: str, data: dict[str, bytes], type_: str) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": self.ns, "labels": dict(MANAGED_BY)},
            "type": type_,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        try:
            self.api.replace_namespaced_secret(name, self.ns, body)
        except ApiException as e:
            if e.status != 404:
                raise CertError(f"cannot update Secret {self.ns}/{name}: {e.status} {e.reason}") from e
            try:
                self.api.create_namespaced_secret(self.ns, body)
            except ApiException as e2:
                raise CertError(f"cannot create Secret {self.ns}/{name}: {e2.status} {e2.reason}") from e2

    def save_ca(self, m: Material) -> None:
        self._put(
            self.ca_secret, {"ca.crt": m.ca_cert, "ca.key": m.ca_key, "ca-bundle.crt": m.ca_bundle}, "Opaque"
        )

    def save_serving(self, m: Material) -> None:
        self._put(
            self.secret,
            {"tls.crt": m.tls_cert, "tls.key": m.tls_key, "ca.crt": m.ca_bundle},
            "kubernetes.io/tls",
        )


# --- lifecycle -----------------------------------------------------------------------------------


@dataclass
class CertResult:
    """What `ensure_certificates` did, for the command's output."""

    ca_issued: bool = False
    serving_issued: bool = False
    bundle_cas: int = 0
    serving_not_after: dt.datetime | None = None
    reasons: list[str] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    missing_configs: list[str] = field(default_factory=list)


def build_bundle(current: x509.Certificate, previous: Sequence[x509.Certificate], now: dt.datetime) -> bytes:
    """Current CA first, then every earlier CA that has not expired (rollover window)."""
    seen = {current.fingerprint(hashes.SHA256())}
    out = [cert_pem(current)]
    for c in previous:
        fp = c.fingerprint(hashes.SHA256())
        if fp in seen or c.not_valid_after_utc <= now:
            continue
        seen.add(fp)
        out.append(cert_pem(c))
    return b"".join(out)


def ensure_certificates(
    store: CertStore,
    names: Sequence[str],
    *,
    ca_days: float = DEFAULT_CA_DAYS,
    cert_days: float = DEFAULT_CERT_DAYS,
    inject: Callable[[bytes], tuple[list[str], list[str]]] | None = None,
    now: dt.datetime | None = None,
    force: bool = False,
    rotate_ca: bool = False,
) -> CertResult:
    """Issue or renew what is needed; inject the bundle (before storing a serving cert from a new CA)."""
    now = now or _now()
    res = CertResult()
    m = store.load()
    ca: x509.Certificate | None = None
    if m.ca_cert and m.ca_key:
        try:
            ca = load_cert(m.ca_cert)
            load_key(m.ca_key)
        except (ValueError, CertError) as e:
            res.reasons.append(f"stored CA unreadable ({e}); issuing a new one")
            ca = None
    old_bundle = []
    try:
        old_bundle = load_certs(m.ca_bundle) + ([ca] if ca else [])
    except ValueError:
        res.reasons.append("stored CA bundle unreadable; rebuilding it")
    if ca is None or renewal_due(ca, now) or ca.not_valid_after_utc <= now or rotate_ca:
        if ca is not None:
            res.reasons.append(
                "CA renewal forced"
                if force
                else f"CA passed 2/3 of its lifetime (expires {ca.not_valid_after_utc:%Y-%m-%d})"
            )
        elif not res.reasons:
            res.reasons.append("no CA yet")
        m.ca_cert, m.ca_key = generate_ca(days=ca_days, now=now)
        ca = load_cert(m.ca_cert)
        res.ca_issued = True
    bundle = build_bundle(ca, old_bundle, now)
    bundle_changed = bundle != m.ca_bundle
    m.ca_bundle = bundle
    res.bundle_cas = len(load_certs(bundle))
    if res.ca_issued or bundle_changed:
        store.save_ca(m)

    # Trust first: the API server must accept the new chain before any pod serves it.
    if inject is not None:
        res.injected, res.missing_configs = inject(bundle)

    serving: x509.Certificate | None = None
    if m.tls_cert and m.tls_key:
        try:
            serving = load_cert(m.tls_cert)
        except ValueError:
            res.reasons.append("stored serving certificate unreadable")
    want = set(names)
    reason = ""
    if serving is None:
        reason = "no serving certificate yet"
    elif res.ca_issued or not signed_by(serving, ca):
        reason = "serving certificate not signed by the current CA"
    elif renewal_due(serving, now) or serving.not_valid_after_utc <= now:
        reason = (
            f"serving certificate passed 2/3 of its lifetime (expires {serving.not_valid_after_utc:%Y-%m-%d})"
        )
    elif cert_names(serving) != want:
        reason = "serving certificate names changed"
    elif force:
        reason = "renewal forced"
    if reason:
        res.reasons.append(reason)
        m.tls_cert, m.tls_key = generate_serving(m.ca_cert, m.ca_key, list(names), days=cert_days, now=now)
        serving = load_cert(m.tls_cert)
        res.serving_issued = True
        store.save_serving(m)
    elif bundle_changed:
        # The mounted Secret also carries ca.crt (the bundle); keep it current.
        store.save_serving(m)
    assert serving is not None
    res.serving_not_after = serving.not_valid_after_utc
    return res


def inject_ca_bundle(admission_api: Any, config_name: str, bundle: bytes) -> tuple[list[str], list[str]]:
    """Set clientConfig.caBundle on every webhook of the Mutating/ValidatingWebhookConfiguration
    `config_name` (only those two objects). Returns (updated, missing)."""
    from kubernetes.client.exceptions import ApiException

    b64 = base64.b64encode(bundle).decode()
    updated: list[str] = []
    missing: list[str] = []
    for kind, read, patch in (
        (
            "MutatingWebhookConfiguration",
            admission_api.read_mutating_webhook_configuration,
            admission_api.patch_mutating_webhook_configuration,
        ),
        (
            "ValidatingWebhookConfiguration",
            admission_api.read_validating_webhook_configuration,
            admission_api.patch_validating_webhook_configuration,
        ),
    ):
        try:
            cfg = read(config_name)
        except ApiException as e:
            if e.status == 404:
                missing.append(f"{kind}/{config_name}")
                continue
            raise CertError(f"cannot read {kind}/{config_name}: {e.status} {e.reason}") from e
        hooks = cfg.webhooks or []
        ops = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": b64}
            for i, h in enumerate(hooks)
            if h.client_config.ca_bundle != b64
        ]
        if ops:
            try:
                patch(config_name, ops)
            except ApiException as e:
                raise CertError(f"cannot patch {kind}/{config_name}: {e.status} {e.reason}") from e
        updated.append(f"{kind}/{config_name}")
    return updated, missing
