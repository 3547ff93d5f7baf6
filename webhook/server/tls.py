"""Serving TLS: TLS 1.2 minimum, optional client certificates, certificate reload without restart.

The listening socket holds one `ssl.SSLContext` for its lifetime, and OpenSSL can add trusted CAs
to a context but never remove one. So every changed set of files (certificate, key, client CA) is
loaded into a fresh context from a private copy of the bytes, and the listening context's
servername callback (which OpenSSL runs for every handshake, with or without SNI) moves each new
connection onto the newest context before certificates are exchanged. A replaced client CA is
therefore no longer trusted by any new connection; connections already open keep their session.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography import x509

log = logging.getLogger("draguard.tls")


class TlsError(Exception):
    """Unusable TLS files, with the file named."""


def _fingerprint(*paths: str | None) -> tuple[tuple[int, int, int, int], ...]:
    out = []
    for p in paths:
        if not p:
            continue
        try:
            st = os.stat(p)  # follows symlinks: Secret mounts swap `..data`
        except OSError:
            out.append((0, 0, 0, 0))
            continue
        out.append((st.st_ino, st.st_mtime_ns, st.st_size, st.st_dev))
    return tuple(out)


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TlsError(f"{path}: cannot read the TLS {what} ({e.strerror})") from e
    if not data.strip():
        raise TlsError(f"{path}: the TLS {what} file is empty")
    return data


def not_after(pem_file: str, shown: str) -> float | None:
    """When the first certificate of `pem_file` (the serving one, before its chain) expires, as Unix
    time; None when only OpenSSL reads it (a `TRUSTED CERTIFICATE` block): it still serves, but its
    expiry is not reported."""
    try:
        cert = x509.load_pem_x509_certificate(Path(pem_file).read_bytes())
    except ValueError as e:
        log.warning(
            "serving certificate loaded, but its expiry cannot be read; it is not exported",
            extra={"cert_file": shown, "reason": str(e)[:300]},
        )
        return None
    return cert.not_valid_after_utc.timestamp()


def peer_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """Subject common names and DNS/URI subject alternative names of a verified client certificate."""
    out: set[str] = set()
    if not peercert:
        return out
    for rdn in peercert.get("subject") or ():
        for attr in rdn:
            if len(attr) == 2 and attr[0] == "commonName":
                out.add(str(attr[1]))
    for typ, value in peercert.get("subjectAltName") or ():
        if typ in ("DNS", "URI"):
            out.add(str(value))
    return out


class ReloadingTls:
    """Owns the server SSL context and keeps it in step with the certificate files."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        client_ca: str | None = None,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca = client_ca
        self.on_reload = on_reload
        self._tmp = tempfile.TemporaryDirectory(prefix="draguard-tls-")
        self._fp = _fingerprint(cert_file, key_file, client_ca)
        files = self._snapshot()
        self.context = self._new_context()  # the listening socket's, never replaced
        self._load_into(self.context, *files)
        self.not_after = not_after(files[0], cert_file)  # of the certificate new handshakes get
        self.current = self.context  # the newest valid set; new handshakes move onto it
        self.context.sni_callback = self._pick
        self.reloads = 0

    def _pick(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        current = self.current
        if sslobj.context is not current:
            sslobj.context = current

    def _new_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_COMPRESSION
        # HTTP/1.1 only; the API server speaks it to webhooks.
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def _snapshot(self) -> tuple[str, str, str | None]:
        """Copy the current bytes to private files so validation and loading see the same pair."""
        cert = _read(self.cert_file, "certificate")
        key = _read(self.key_file, "key")
        ca = _read(self.client_ca, "client CA") if self.client_ca else None
        d = Path(self._tmp.name)
        (d / "tls.crt").write_bytes(cert)
        kp = d / "tls.key"
        kp.touch(mode=0o600)
        kp.write_bytes(key)
        if ca is not None:
            (d / "ca.crt").write_bytes(ca)
        return str(d / "tls.crt"), str(kp), (str(d / "ca.crt") if ca is not None else None)

    def _load_into(self, ctx: ssl.SSLContext, cert: str, key: str, ca: str | None) -> None:
        try:
            ctx.load_cert_chain(cert, key)
        except ssl.SSLError as e:
            raise TlsError(
                f"{self.cert_file} / {self.key_file}: certificate and key do not load together "
                f"({e.reason or e})"
            ) from e
        if ca is not None:
            try:
                ctx.load_verify_locations(cafile=ca)
            except ssl.SSLError as e:
                raise TlsError(f"{self.client_ca}: not a PEM CA bundle ({e.reason or e})") from e
            ctx.verify_mode = ssl.CERT_REQUIRED

    def check(self) -> bool:
        """Reload when the files changed and the new pair is valid; True when reloaded."""
        fp = _fingerprint(self.cert_file, self.key_file, self.client_ca)
        if fp == self._fp:
            return False
        try:
            files = self._snapshot()
            fresh = self._new_context()
            self._load_into(fresh, *files)  # a half-written set never reaches a handshake
            expires = not_after(files[0], self.cert_file)
        except TlsError as e:
            # Often a half-finished rotation (new cert, old key): try again on the next tick.
            log.warning("TLS files changed but are not usable yet", extra={"reason": str(e)})
            if self.on_reload:
                self.on_reload(False)
            return False
        self.current = fresh
        self.not_after = expires
        self._fp = fp
        self.reloads += 1
        log.info("TLS certificate reloaded", extra={"cert_file": self.cert_file})
        if self.on_reload:
            self.on_reload(True)
        return True

    async def watch(self, interval: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.check()
            except Exception:  # never let the watcher die
                log.exception("TLS reload check failed")

    def close(self) -> None:
        self._tmp.cleanup()
