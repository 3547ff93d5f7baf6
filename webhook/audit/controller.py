"""`draguard audit run`: a scan at start, every `interval`, and whenever the policy files change."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from webhook.audit.metrics import AuditMetrics
from webhook.audit.scan import Limits, ScanOutcome, scan_cluster
from webhook.audit.writer import ReportWriter, WriteResult
from webhook.policy.load import PolicyError
from webhook.server.app import PolicyWatcher
from webhook.server.caches import KubeHttp

log = logging.getLogger("draguard.audit")


@dataclass(frozen=True)
class AuditOptions:
    policies: str
    interval: float = 300.0
    poll_interval: float = 2.0
    retry_after: float = 30.0  # after a failed scan
    limits: Limits = field(default_factory=Limits)


class AuditController:
    def __init__(self, http: KubeHttp, opts: AuditOptions, metrics: AuditMetrics | None = None) -> None:
        self.http = http
        self.opts = opts
        self.metrics = metrics or AuditMetrics()
        self.writer = ReportWriter(http)
        self.watcher = PolicyWatcher(opts.policies)
        self.policies: Any = None
        self.stop_event = threading.Event()
        self.scans_ok = 0

    def load_policies(self) -> bool:
        """Load a changed policy set; a broken change keeps the last good one. True when a new set
        took effect."""
        try:
            self.policies = self.watcher.load()
        except (PolicyError, OSError) as e:
            self.watcher.reject()
            self.metrics.policy_reloads.labels("invalid").inc()
            log.error("policy set rejected; keeping the last good one", extra={"reason": str(e)[:500]})
            return False
        self.metrics.policy_reloads.labels("ok").inc()
        log.info("policies loaded", extra={"documents": len(self.policies)})
        return True

    def scan_once(self) -> ScanOutcome | None:
        if self.policies is None:
            return None
        start = time.monotonic()
        try:
            out = scan_cluster(self.http, self.policies, self.opts.limits)
            written = self.writer.sync(out.reports)
        except Exception as e:  # ScanError, ApiError, and the client's connection errors (not OSErrors)
            self._failed(e)
            return None
        return self._done(out, written, start)

    def _failed(self, e: Exception) -> None:
        self.metrics.scans.labels("error").inc()
        log.error(
            "scan failed; reports left as they were", extra={"reason": f"{type(e).__name__}: {e}"[:500]}
        )

    def _done(self, out: ScanOutcome, written: WriteResult, start: float) -> ScanOutcome | None:
        self.metrics.duration.observe(time.monotonic() - start)
        self.metrics.reports_written.inc(written.written)
        self.metrics.reports_deleted.inc(written.deleted)
        if written.failed:
            self.metrics.scans.labels("write-failed").inc()
            log.error("reports not all written", extra={"failed": written.failed[:5]})
            return None
        c = out.collector
        self.metrics.set_violations(c.violations())
        totals: dict[str, int] = {}
        for scope in c.scopes.values():
            for k, v in scope.counts.items():
                totals[k] = totals.get(k, 0) + v
        for k, v in totals.items():
            self.metrics.results.labels(k).set(v)
        omitted = sum(
            int(r["metadata"]["annotations"].get("draguard.io/results-omitted", 0)) for r in out.reports
        )
        self.metrics.omitted.set(omitted)
        self.metrics.objects.set(out.objects)
        self.metrics.last_success.set(time.time())
        self.metrics.scans.labels("ok").inc()
        self.scans_ok += 1
        log.info(
            "scan complete",
            extra={
                "objects": out.objects,
                "reports": written.written,
                "deleted": written.deleted,
                "seconds": round(time.monotonic() - start, 3),
                **totals,
            },
        )
        return out

    def run(self) -> None:
        self.load_policies()
        next_scan = 0.0
        while not self.stop_event.is_set():
            now = time.monotonic()
            changed = self.watcher.changed() and self.load_policies()
            if changed or now >= next_scan:
                ok = self.scan_once() is not None
                next_scan = time.monotonic() + (
                    self.opts.interval if ok else min(self.opts.retry_after, self.opts.interval)
                )
            self.stop_event.wait(self.opts.poll_interval)

    def stop(self) -> None:
        self.stop_event.set()
