"""Continuous caBundle injection: the webhook keeps its own webhook configurations trusting its CA.

The certs Job writes caBundle once; a configuration created or replaced later (a GitOps sync with
Replace=true, a re-install, `kubectl replace`) arrives without it, and the API server then refuses every
call to the webhook. Each webhook replica watches the two configurations named `config_name` (watch
and patch rights by name only; a ValidatingAdmissionPolicy lets it change nothing but caBundle) and
patches caBundle back within a second or two.

Replicas never fight over the value: a replica writes only when one of the unexpired CAs in its mounted
bundle is missing from a webhook's caBundle, and then writes its whole bundle. A replica whose Secret
mount is still the older bundle (kubelet refreshes mounts with a delay) finds its CAs already present
and leaves the newer bundle alone.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes

log = logging.getLogger("draguard.cainject")

KINDS = (
    ("MutatingWebhookConfiguration", "mutatingwebhookconfigurations"),
    ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations"),
)
BASE = "/apis/admissionregistration.k8s.io/v1"
WATCH_SECONDS = 300
MAX_BUNDLE = 1024 * 1024


def fingerprints(pem: bytes, now: dt.datetime | None = None) -> frozenset[bytes]:
    """SHA-256 fingerprints of the unexpired certificates in a PEM bundle (garbage counts as none)."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        return frozenset()
    return frozenset(c.fingerprint(hashes.SHA256()) for c in certs if c.not_valid_after_utc > now)


def _decode(b64: Any) -> bytes:
    if not isinstance(b64, str) or not b64:
        return b""
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return b""


def patch_ops(
    config: Mapping[str, Any], bundle: bytes, now: dt.datetime | None = None
) -> list[dict[str, Any]]:
    """JSON patch that gives every webhook of `config` our bundle where one of our CAs is missing.

    Each change is guarded by a `test` of the webhook's name at that index, so a concurrent edit that
    reorders the list makes the patch fail instead of writing into the wrong webhook.
    """
    ours = fingerprints(bundle, now)
    if not ours:
        return []
    b64 = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(config.get("webhooks") or []):
        if not isinstance(hook, Mapping):
            continue
        cc = hook.get("clientConfig") or {}
        if ours <= fingerprints(_decode(cc.get("caBundle")), now):
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": b64})
    return ops


MAX_EVENT = 4 * 1024 * 1024


def _lines(resp: Any) -> Any:
    """Watch events, one JSON document per line (a configuration is at most a few hundred KiB)."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buf += chunk
        if len(buf) > MAX_EVENT:
            raise ValueError(f"watch event over {MAX_EVENT} bytes")
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


@dataclass
class Stats:
    patches: int = 0
    errors: int = 0
    last_error: str = ""


class CaBundleInjector:
    """Watches both webhook configurations named `config_name` and keeps their caBundle whole."""

    def __init__(
        self,
        http: Any,
        patcher: Callable[[str, str, list[dict[str, Any]]], None],
        bundle_path: str | Path,
        config_name: str = "draguard",
        poll_interval: float = 2.0,
    ) -> None:
        self.http = http  # webhook.server.caches.KubeHttp
        self.patcher = patcher
        self.bundle_path = Path(bundle_path)
        self.name = config_name
        self.poll_interval = poll_interval
        self.stats = Stats()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._bundle = b""
        self._sig: tuple[int, int, int] | None = None

    # ---- the bundle on disk -------------------------------------------------------------------
    def _read_bundle(self) -> bool:
        """Reload the mounted bundle when it changed; True when it did."""
        try:
            st = self.bundle_path.stat()  # follows the Secret mount's `..data` symlink
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            if sig == self._sig:
                return False
            if st.st_size > MAX_BUNDLE:
                raise OSError(f"larger than {MAX_BUNDLE} bytes")
            data = self.bundle_path.read_bytes()
        except OSError as e:
            if self._sig != (0, 0, 0):
                log.warning("CA bundle %s unreadable (%s); nothing to inject", self.bundle_path, e)
            self._sig = (0, 0, 0)
            return False
        self._sig = sig
        if not fingerprints(data):
            log.warning(
                "CA bundle %s holds no valid, unexpired certificate; nothing to inject", self.bundle_path
            )
        with self._lock:
            self._bundle = data
        return True

    @property
    def bundle(self) -> bytes:
        with self._lock:
            return self._bundle

    # ---- reconciling --------------------------------------------------------------------------
    def reconcile(self, plural: str, config: Mapping[str, Any] | None) -> bool:
        """Patch one configuration if it lacks one of our CAs; True when a patch was sent."""
        if not config:
            return False
        ops = patch_ops(config, self.bundle)
        if not ops:
            return False
        try:
            self.patcher(plural, self.name, ops)
        except Exception as e:  # a 409/422 from a concurrent edit is retried on the next event
            self.stats.errors += 1
            self.stats.last_error = f"{type(e).__name__}: {e}"
            log.warning("caBundle patch of %s/%s failed: %s", plural, self.name, self.stats.last_error)
            return False
        self.stats.patches += 1
        log.info(
            "caBundle injected", extra={"resource": plural, "name": self.name, "webhooks": len(ops) // 2}
        )
        return True

    def _get(self, plural: str) -> dict[str, Any] | None:
        from .caches import ApiError

        try:
            return self.http.get_json(f"{BASE}/{plural}/{self.name}")  # type: ignore[no-any-return]
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def reconcile_all(self) -> int:
        sent = 0
        for _kind, plural in KINDS:
            try:
                sent += self.reconcile(plural, self._get(plural))
            except Exception as e:
                self.stats.errors += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                log.warning("reading %s/%s failed: %s", plural, self.name, self.stats.last_error)
        return sent

    # ---- loops --------------------------------------------------------------------------------
    def _watch_loop(self, plural: str) -> None:
        from .caches import Gone

        backoff = 0.5
        sel = [("fieldSelector", f"metadata.name={self.name}")]
        while not self._stop.is_set():
            try:
                listing = self.http.get_json(f"{BASE}/{plural}", sel)
                for item in listing.get("items") or []:
                    self.reconcile(plural, item)
                rv = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                query = [
                    *sel,
                    ("watch", "1"),
                    ("resourceVersion", rv),
                    ("timeoutSeconds", str(WATCH_SECONDS)),
                ]
                resp = self.http.stream(f"{BASE}/{plural}", query, read_timeout=WATCH_SECONDS + 30)
                try:
                    backoff = 0.5
                    for line in _lines(resp):
                        if self._stop.is_set():
                            return
                        event = json.loads(line)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self.reconcile(plural, event.get("object"))
                        elif event.get("type") == "ERROR":
                            break
                finally:
                    resp.release_conn()
            except Gone:
                continue
            except Exception as e:
                if self._stop.is_set():
                    return
                self.stats.errors += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                log.warning("watching %s/%s failed (%s); retrying", plural, self.name, self.stats.last_error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _bundle_loop(self) -> None:
        while not self._stop.wait(self.poll_interval):
            if self._read_bundle():
                self.reconcile_all()

    def start(self) -> None:
        self._read_bundle()
        targets: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
            (f"cainject-{plural}", self._watch_loop, (plural,)) for _k, plural in KINDS
        ]
        targets.append(("cainject-bundle", self._bundle_loop, ()))
        for name, fn, args in targets:
            t = threading.Thread(target=fn, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()


def make_injector(kubeconfig: str | None, bundle_path: str, config_name: str) -> CaBundleInjector:
    """An injector talking to the cluster of `kubeconfig` (in-cluster config when None), not started."""
    from kubernetes import client

    from .caches import KubeHttp

    http = KubeHttp.from_kubeconfig(kubeconfig)
    adm = client.AdmissionregistrationV1Api(http.api)

    def patch(plural: str, name: str, ops: list[dict[str, Any]]) -> None:
        if plural == "mutatingwebhookconfigurations":
            adm.patch_mutating_webhook_configuration(name, ops)
        else:
            adm.patch_validating_webhook_configuration(name, ops)

    return CaBundleInjector(http, patch, bundle_path, config_name)


def start_injector(kubeconfig: str | None, bundle_path: str, config_name: str) -> CaBundleInjector:
    """The injector `draguard serve --inject-ca-bundle FILE` runs, started."""
    inj = make_injector(kubeconfig, bundle_path, config_name)
    inj.start()
    return inj
