"""Writes report objects with server-side apply and removes the audit's reports that a scan no
longer produces (a namespace with nothing left to judge, parts no longer needed)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..server.caches import ApiError, KubeHttp
from .report import API_VERSION, MANAGED_BY

log = logging.getLogger("draguard.audit")

FIELD_MANAGER = "draguard-audit"
RETRY_STATUS = frozenset({409, 429, 500, 502, 503, 504})
BASE = f"/apis/{API_VERSION}"
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"


@dataclass
class WriteResult:
    written: int = 0
    deleted: int = 0
    skipped: int = 0  # reports for namespaces deleted or being deleted
    failed: list[str] = field(default_factory=list)


def report_path(kind: str, namespace: str | None, name: str) -> str:
    if kind == "ClusterPolicyReport":
        return f"{BASE}/clusterpolicyreports/{name}"
    return f"{BASE}/namespaces/{namespace}/policyreports/{name}"


def _key(obj: Mapping[str, Any]) -> tuple[str, str | None, str]:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind")), meta.get("namespace"), str(meta.get("name"))


def _namespace_gone(e: ApiError) -> bool:
    """The report's namespace no longer takes objects: deleted (404) or terminating (403)."""
    return e.status == 404 or (e.status == 403 and "being terminated" in str(e))


class NotLeading(Exception):
    """The replica stopped being the audit's leader (or is shutting down): it writes nothing more."""


class ReportWriter:
    def __init__(
        self,
        http: KubeHttp,
        attempts: int = 4,
        sleep: Callable[[float], None] = time.sleep,
        allowed: Callable[[], bool] | None = None,
    ) -> None:
        self.http = http
        self.attempts = attempts
        self.sleep = sleep
        # Asked before every request: with replicas, only the leader writes, and a leader whose lease
        # lapsed mid-sync stops before the next write rather than at the end of the scan.
        self.allowed = allowed

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        delay = 0.2
        for attempt in range(self.attempts):
            if self.allowed is not None and not self.allowed():
                raise NotLeading(f"{method} {path} not sent: no longer the audit leader")
            try:
                return self.http.request_json(method, path, **kw)
            except ApiError as e:
                if e.status not in RETRY_STATUS or attempt == self.attempts - 1:
                    raise
            self.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def apply(self, report: Mapping[str, Any]) -> None:
        """Server-side apply, forcing ownership: the audit is the only writer of its reports, and the
        whole object is sent each time, so results it no longer sends are removed."""
        kind, ns, name = _key(report)
        self._call(
            "PATCH",
            report_path(kind, ns, name),
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=dict(report),
            timeout=30.0,
            content_type="application/apply-patch+yaml",
        )

    def existing(self, namespace: str | None = None) -> set[tuple[str, str | None, str]]:
        """The audit's reports in the cluster (by label), or in one namespace."""
        out: set[tuple[str, str | None, str]] = set()
        collections = (
            [("PolicyReport", f"{BASE}/namespaces/{namespace}/policyreports")]
            if namespace
            else [
                ("PolicyReport", f"{BASE}/policyreports"),
                ("ClusterPolicyReport", f"{BASE}/clusterpolicyreports"),
            ]
        )
        for kind, path in collections:
            cont = ""
            while True:
                q: list[tuple[str, Any]] = [("labelSelector", SELECTOR), ("limit", 500)]
                if cont:
                    q.append(("continue", cont))
                doc = self._call("GET", path, query=q, timeout=30.0)
                for it in doc.get("items") or []:
                    it.setdefault("kind", kind)
                    out.add(_key(it))
                cont = str((doc.get("metadata") or {}).get("continue") or "")
                if not cont:
                    break
        return out

    def sync(self, reports: Iterable[Mapping[str, Any]], namespace: str | None = None) -> WriteResult:
        """Apply every report, then delete the audit's other reports (in `namespace` only, when
        given). A report that cannot be written is named in `failed`; stale reports are kept when
        anything failed (a partial picture must not wipe the previous one)."""
        res = WriteResult()
        wanted: set[tuple[str, str | None, str]] = set()
        for rep in reports:
            key = _key(rep)
            wanted.add(key)
            try:
                self.apply(rep)
                res.written += 1
            except ApiError as e:
                if key[1] and _namespace_gone(e):
                    res.skipped += 1  # deleted since the scan listed it: nothing to report there
                    continue
                res.failed.append(f"{key[0]} {key[1] or ''}/{key[2]}: {e}")
                log.warning(
                    "report not written", extra={"report": f"{key[1] or ''}/{key[2]}", "reason": str(e)[:300]}
                )
            except OSError as e:
                res.failed.append(f"{key[0]} {key[1] or ''}/{key[2]}: {e}")
                log.warning(
                    "report not written", extra={"report": f"{key[1] or ''}/{key[2]}", "reason": str(e)[:300]}
                )
        if res.failed:
            return res
        try:
            stale = self.existing(namespace) - wanted
        except (ApiError, OSError) as e:
            res.failed.append(f"listing reports: {e}")
            return res
        for kind, ns, name in sorted(stale, key=lambda k: (k[0], k[1] or "", k[2])):
            try:
                self._call("DELETE", report_path(kind, ns, name), timeout=30.0)
                res.deleted += 1
            except ApiError as e:
                if e.status != 404:
                    res.failed.append(f"{kind} {ns or ''}/{name}: {e}")
        return res
