"""Prometheus metrics of the audit, in a registry of its own, and its probe/metrics HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SCAN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class AuditMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.violations = Gauge(
            "draguard_audit_violations",
            "Existing objects with a finding at the last complete scan, by rule and PolicyReport result "
            "(fail: enforce mode, warn: warn or audit mode, error: the rule could not judge the object)",
            ["rule", "result"],
            registry=r,
        )
        self.results = Gauge(
            "draguard_audit_results",
            "Results at the last complete scan, by PolicyReport result",
            ["result"],
            registry=r,
        )
        self.objects = Gauge("draguard_audit_objects", "Objects judged by the last complete scan", registry=r)
        self.omitted = Gauge(
            "draguard_audit_results_omitted",
            "Results left out of the reports at the last scan to keep them under the size limit",
            registry=r,
        )
        self.scans = Counter(
            "draguard_audit_scans_total",
            "Scans, by outcome (ok, error, write-failed; abandoned: leadership lost before the reports "
            "were all written)",
            ["outcome"],
            registry=r,
        )
        self.leader = Gauge(
            "draguard_audit_leader",
            "1 while this replica is the one that scans and writes reports (the leader, or the only "
            "replica without leader election), else 0",
            registry=r,
        )
        self.leader_changes = Counter(
            "draguard_audit_leader_changes_total",
            "Times this replica became the leader (to=leader) or stopped being it (to=follower)",
            ["to"],
            registry=r,
        )
        self.duration = Histogram(
            "draguard_audit_scan_duration_seconds",
            "Time of one scan (read, judge, write)",
            buckets=SCAN_BUCKETS,
            registry=r,
        )
        self.last_success = Gauge(
            "draguard_audit_last_success_timestamp_seconds", "Unix time of the last complete scan", registry=r
        )
        self.reports_written = Counter(
            "draguard_audit_reports_written_total", "Report objects applied", registry=r
        )
        self.reports_deleted = Counter(
            "draguard_audit_reports_deleted_total", "Stale report objects deleted", registry=r
        )
        self.namespace_scans = Counter(
            "draguard_audit_namespace_scans_total",
            "Namespaces re-judged after a watched change, by outcome",
            ["outcome"],
            registry=r,
        )
        self.namespace_duration = Histogram(
            "draguard_audit_namespace_scan_duration_seconds",
            "Time to re-judge one namespace (read, judge, write)",
            buckets=SCAN_BUCKETS,
            registry=r,
        )
        self.watch_events = Counter(
            "draguard_audit_watch_events_total",
            "Watch events, by resource and what came of them (event: read; change: a namespace or full "
            "scan asked for; expired: 410, relisted; unreadable: too large or not JSON, full scan; "
            "refused: 403, stopped until the next full scan; error)",
            ["resource", "what"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "draguard_audit_policy_reloads_total", "Policy set loads, by outcome", ["outcome"], registry=r
        )

    def set_violations(self, counts: Mapping[tuple[str, str], int]) -> None:
        # Series of rules that no longer fire are removed, so their alerts resolve.
        self.violations.clear()
        for (rule, result), n in sorted(counts.items()):
            self.violations.labels(rule, result).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve_http(host: str, port: int, metrics: AuditMetrics, ready: Callable[[], bool]) -> ThreadingHTTPServer:
    """/metrics, /healthz and /readyz (ready once a scan has completed) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, status, ctype = metrics.render(), 200, "text/plain; version=0.0.4"
            elif path == "/healthz":
                body, status, ctype = b"ok\n", 200, "text/plain"
            elif path == "/readyz":
                ok = ready()
                body, status, ctype = (
                    (b"ok\n" if ok else b"no complete scan yet\n"),
                    (200 if ok else 503),
                    "text/plain",
                )
            else:
                body, status, ctype = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="audit-http", daemon=True).start()
    return server
