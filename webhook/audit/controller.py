"""`draguard audit run`: a full scan at start, every `interval` and whenever the policy files change;
in between, watches re-judge each namespace whose objects changed (debounced), and a class, a
ResourceSlice or a workload CRD installed or removed (found by discovery) asks for a full scan.

With replicas, each runs a `LeaderElector` (webhook/audit/leader.py): only the leader watches, scans
and writes; the others wait, ready, and the first to see the lease free or expired takes over. A
leader that loses the lease stops writing at once (the writer asks before every request), drops its
watches and state, and waits as a follower again; on shutdown it stops, then releases the lease."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..policy.load import PolicyError
from ..server.app import PolicyWatcher
from ..server.caches import KubeHttp
from .leader import LeaderElector
from .metrics import AuditMetrics
from .report import RESULTS
from .scan import Limits, ScanOutcome, scan_cluster, scan_namespace
from .source import BUILTIN, ClusterState, Collection, ScanError, crd_collections
from .watch import (
    WATCH_SECONDS,
    Changes,
    Fingerprints,
    ResourceWatch,
    Scope,
    Watched,
    wait_ready,
    watched_resources,
)
from .writer import NotLeading, ReportWriter, WriteResult

log = logging.getLogger("draguard.audit")


@dataclass(frozen=True)
class AuditOptions:
    policies: str
    interval: float = 300.0
    poll_interval: float = 2.0
    retry_after: float = 30.0  # after a failed scan
    limits: Limits = field(default_factory=Limits)
    watch: bool = True
    debounce: float = 1.0  # a namespace is re-judged after this much quiet...
    max_delay: float = 10.0  # ...or this long after its first change, whichever is first
    full_scan_gap: float = 60.0  # least time between full scans that watches ask for...
    # ...and at least this many times the last full scan's duration, so that watch-asked scans (a
    # busy autoscaler's ResourceSlices, say) never keep the audit scanning more than 1/5 of the time.
    full_scan_gap_factor: float = 5.0
    # How often API discovery is asked whether a workload CRD of the table was installed or removed
    # (a few small GETs; a change asks for a full scan, which lists and watches it).
    discovery_interval: float = 30.0
    watch_timeout: int = WATCH_SECONDS


class AuditController:
    def __init__(
        self,
        http: KubeHttp,
        opts: AuditOptions,
        metrics: AuditMetrics | None = None,
        elector: LeaderElector | None = None,
    ) -> None:
        self.http = http
        self.opts = opts
        self.metrics = metrics or AuditMetrics()
        self.elector = elector
        # The scans read and write through a client that asks before every request whether this
        # replica may still scan: one that lost the lease, or is stopping, ends its scan at the next
        # list page instead of reading the whole cluster for nothing (and delaying the release).
        self.scan_http: KubeHttp = _Guarded(http, self.leading)
        self.writer = ReportWriter(self.scan_http, allowed=self.leading)
        # Woken when leadership changes, so a follower starts scanning as soon as it is elected.
        self.lead_wake = threading.Event()
        self.metrics.leader.set_function(lambda: 1.0 if self.leading() else 0.0)
        if elector is not None:
            elector.on_change = self._leadership
        self.watcher = PolicyWatcher(opts.policies)
        self.policies: Any = None
        self.stop_event = threading.Event()
        self.scans_ok = 0
        self.namespace_scans_ok = 0
        self.state: ClusterState | None = None
        self.changes = Changes(opts.debounce, opts.max_delay)
        self.fingerprints = Fingerprints()
        self.watches: list[ResourceWatch] = []
        self.scope = Scope()
        self.last_full_start = float("-inf")
        self.last_full_seconds = 0.0
        # What the metrics add up, per scope (a namespace, None for the cluster), so that a
        # namespace's rescan replaces only its own share.
        self._violations: dict[str | None, dict[tuple[str, str], int]] = {}
        self._counts: dict[str | None, dict[str, int]] = {}
        self._omitted: dict[str | None, int] = {}

    def leading(self) -> bool:
        """Whether this replica may scan and write now: not stopping, and (with leader election) the
        leader within its renew deadline."""
        return not self.stop_event.is_set() and (self.elector is None or self.elector.is_leader())

    def ready(self) -> bool:
        """/readyz: a leader (or the only replica) once a full scan is written; a follower while it
        can reach the API server, so that it can take over."""
        if self.elector is None:
            return self.scans_ok > 0
        if self.elector.is_leader():
            return self.state is not None
        return self.elector.healthy()

    def _leadership(self, leading: bool) -> None:
        self.metrics.leader_changes.labels("leader" if leading else "follower").inc()
        self.lead_wake.set()
        self.changes.wake.set()

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
        self.last_full_start = start
        try:
            last = self.state.owners if self.state is not None else None
            out = scan_cluster(self.scan_http, self.policies, self.opts.limits, last)
            written = self.writer.sync(out.reports)
        except NotLeading as e:
            self._abandoned(e)
            return None
        except Exception as e:  # ScanError, ApiError, and the client's connection errors (not OSErrors)
            self._failed(e)
            return None
        self.last_full_seconds = time.monotonic() - start
        done = self._done(out, written, start)
        if done is not None and out.state is not None:
            self.state = out.state
            self.changes.full_started(start)
            self._follow(out.state.collections)
        return done

    def scan_namespace(self, namespace: str) -> ScanOutcome | None:
        """Judge one namespace again and write its reports; None when it could not be done (the
        namespace stays as it was, and the next full scan covers it)."""
        if self.policies is None or self.state is None:
            return None
        start = time.monotonic()
        try:
            out = scan_namespace(self.scan_http, self.policies, self.state, namespace, self.opts.limits)
            written = self.writer.sync(out.reports, namespace=namespace)
        except NotLeading as e:
            self._abandoned(e)
            return None
        except Exception as e:
            self.metrics.namespace_scans.labels("error").inc()
            log.warning(
                "namespace scan failed",
                extra={"namespace": namespace, "reason": f"{type(e).__name__}: {e}"[:300]},
            )
            return None
        self.metrics.reports_written.inc(written.written)
        self.metrics.reports_deleted.inc(written.deleted)
        if written.failed:
            self.metrics.namespace_scans.labels("write-failed").inc()
            log.warning("namespace reports not all written", extra={"failed": written.failed[:5]})
            return None
        scope = out.collector.scopes.get(namespace)
        self._violations.pop(namespace, None)
        self._counts.pop(namespace, None)
        self._omitted.pop(namespace, None)
        if scope is not None:
            self._violations[namespace] = dict(scope.by_rule)
            self._counts[namespace] = dict(scope.counts)
        self._omitted[namespace] = _omitted(out.reports)
        self._publish()
        self.metrics.namespace_scans.labels("ok").inc()
        self.metrics.namespace_duration.observe(time.monotonic() - start)
        self.namespace_scans_ok += 1
        log.info(
            "namespace re-judged",
            extra={
                "namespace": namespace,
                "objects": out.objects,
                "seconds": round(time.monotonic() - start, 3),
            },
        )
        return out

    def _publish(self) -> None:
        violations: dict[tuple[str, str], int] = {}
        for per in self._violations.values():
            for k, v in per.items():
                violations[k] = violations.get(k, 0) + v
        self.metrics.set_violations(violations)
        totals: dict[str, int] = {}
        for per_counts in self._counts.values():
            for res, n in per_counts.items():
                totals[res] = totals.get(res, 0) + n
        for res in RESULTS:
            self.metrics.results.labels(res).set(totals.get(res, 0))
        self.metrics.omitted.set(sum(self._omitted.values()))

    def _abandoned(self, e: NotLeading) -> None:
        self.metrics.scans.labels("abandoned").inc()
        log.warning("scan abandoned: no longer the leader", extra={"reason": str(e)[:300]})

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
        self._violations = {ns: dict(sc.by_rule) for ns, sc in c.scopes.items()}
        self._counts = {ns: dict(sc.counts) for ns, sc in c.scopes.items()}
        self._omitted = {}
        for r in out.reports:
            ns = r["metadata"].get("namespace")
            self._omitted[ns] = self._omitted.get(ns, 0) + _omitted([r])
        self._publish()
        totals: dict[str, int] = {}
        for per_counts in self._counts.values():
            for k, v in per_counts.items():
                totals[k] = totals.get(k, 0) + v
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

    def start_watches(self) -> None:
        """Watch every audited collection the API server serves; the first full scan starts from
        after their resourceVersions, so no change falls between the two."""
        if not self.opts.watch or self.watches:
            return
        table = self.policies.crd_table if self.policies is not None else None
        crds: list[Collection] = []
        try:
            crds = crd_collections(self.http, table.keys()) if table is not None else []
        except ScanError as e:  # the built-in kinds are still watched; the full scan says more
            log.warning("workload CRDs not discovered", extra={"reason": str(e)[:300]})
        self.scope = Scope(table, frozenset((c.group, c.kind) for c in crds))
        resources = watched_resources(self.http, [*crds, *BUILTIN])
        _pool_for(self.http, len(resources) + 16)
        late = self.scans_ok > 0  # started after a full scan: their first resourceVersion needs another
        for res in resources:
            self._watch(res, late=late)
        wait_ready(self.watches, 30.0)

    def _watch(self, res: Watched, late: bool) -> None:
        w = ResourceWatch(
            self.http,
            res,
            self.changes,
            self.fingerprints,
            on_event=lambda r, what: self.metrics.watch_events.labels(r, what).inc(),
            timeout=self.opts.watch_timeout,
            scope=self.scope,
            late=late,
        )
        self.watches.append(w)
        w.start()

    def _follow(self, collections: tuple[Collection, ...]) -> None:
        """After a full scan: watch workload CRDs installed (or added by a policy) since, and judge
        relevance with the policies and kinds now in force."""
        if not self.opts.watch or self.policies is None:
            return
        if not self.watches:  # they could not start (the API server was down): try again now
            try:
                self.start_watches()
            except Exception as e:
                log.error("watches not started", extra={"reason": f"{type(e).__name__}: {e}"[:300]})
            return
        crds = frozenset((c.group, c.kind) for c in collections if c.crd)
        scope = Scope(self.policies.crd_table, crds, self.state.owners if self.state is not None else None)
        self.scope = scope
        refused = [w for w in self.watches if w.refused]
        self.watches = [w for w in self.watches if not w.refused]
        for w in self.watches:
            w.scope = scope
        for w in refused:  # once per full scan, not every 30 s: RBAC may have been granted since
            self._watch(w.res, late=True)
        known = {w.res.path for w in self.watches}
        for c in collections:
            if c.path() not in known:
                self._watch(Watched(c.path(), c.group_version, c.kind), late=True)

    def run(self) -> None:
        """Until stop(): scan as the only replica, or, with an elector, whenever this one leads."""
        if self.elector is None:
            self._lead()
            return
        self.elector.start()
        try:
            while not self.stop_event.is_set():
                self.lead_wake.clear()
                if not self.leading():
                    self.lead_wake.wait(self.elector.cfg.retry_period)
                    continue
                self._lead()
                self._step_down()
        finally:
            self._stop_watches()
            self.elector.stop()
            # Only now, with nothing written any more, may another replica take over at once.
            self.elector.release()

    def _step_down(self) -> None:
        """After losing the lease: forget what the last scans saw (the next leadership starts with a
        full scan), and stop exporting their results, which the new leader's now stand for."""
        self._stop_watches()
        self.state = None
        self.changes = Changes(self.opts.debounce, self.opts.max_delay)
        self.fingerprints = Fingerprints()
        self.scope = Scope()
        self.last_full_start = float("-inf")
        self.last_full_seconds = 0.0
        self._violations.clear()
        self._counts.clear()
        self._omitted.clear()
        self._publish()
        self.metrics.objects.set(0)

    def _stop_watches(self) -> None:
        for w in self.watches:
            w.stop()
        self.watches = []

    def _lead(self) -> None:
        self.load_policies()
        try:
            self.start_watches()
        except Exception as e:  # the scans still run; changes then show at the next one
            log.error("watches not started", extra={"reason": f"{type(e).__name__}: {e}"[:300]})
        next_scan = 0.0
        next_discovery = time.monotonic() + self.opts.discovery_interval
        while self.leading():
            changed = self.watcher.changed() and self.load_policies()
            now = time.monotonic()
            if now >= next_discovery:
                next_discovery = now + self.opts.discovery_interval
                self._check_crds()
                now = time.monotonic()
            asked = self.changes.full_since is not None
            gap_left = self.last_full_start + self.full_scan_gap() - now
            if changed or now >= next_scan or (asked and gap_left <= 0):
                ok = self.scan_once() is not None
                next_scan = time.monotonic() + (
                    self.opts.interval if ok else min(self.opts.retry_after, self.opts.interval)
                )
            due, wait = self.changes.due()
            for ns in due:
                if not self.leading():
                    return
                self.scan_namespace(ns)
            timeout = self.opts.poll_interval
            if wait is not None:
                timeout = min(timeout, wait)
            if asked and gap_left > 0:
                timeout = min(timeout, gap_left)
            if not due:
                self.changes.wake.wait(max(timeout, 0.01))

    def full_scan_gap(self) -> float:
        """Least time from one full scan's start to the next that a watch asks for."""
        return max(self.opts.full_scan_gap, self.opts.full_scan_gap_factor * self.last_full_seconds)

    def _check_crds(self) -> None:
        """Ask for a full scan when the workload CRDs of the table that the API server serves are
        not the ones the last full scan listed (an operator installed or removed since)."""
        if not self.opts.watch or self.state is None or self.policies is None:
            return
        table = self.policies.crd_table
        if not table:
            return
        try:
            served = {(c.group_version, c.resource) for c in crd_collections(self.http, table.keys())}
        except Exception as e:  # the next full scan reports what discovery cannot answer
            log.debug("workload CRD discovery failed", extra={"reason": f"{type(e).__name__}: {e}"[:300]})
            return
        listed = {(c.group_version, c.resource) for c in self.state.collections if c.crd}
        if served != listed:
            log.info(
                "workload CRDs changed; full scan",
                extra={
                    "added": sorted("/".join(k) for k in served - listed),
                    "removed": sorted("/".join(k) for k in listed - served),
                },
            )
            self.changes.request_full()

    def stop(self) -> None:
        self.stop_event.set()
        self.changes.wake.set()
        self.lead_wake.set()
        for w in self.watches:
            w.stop()


class _Guarded(KubeHttp):
    """`http` (the same connection pool), refusing to send a request once `allowed()` is false."""

    def __init__(self, http: KubeHttp, allowed: Callable[[], bool]) -> None:
        super().__init__(http.api)
        self.allowed = allowed

    def _open(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        timeout: float = 10.0,
        read_timeout: float | None = None,
        content_type: str = "application/json",
    ) -> Any:
        if not self.allowed():
            raise NotLeading(f"{method} {path} not sent: no longer the audit leader")
        return super()._open(method, path, query, body, timeout, read_timeout, content_type)


def _pool_for(http: KubeHttp, connections: int) -> None:
    """Room in the client's connection pool for one long-lived stream per watch besides the scans'
    requests (else each request past the pool's size opens and drops a TLS connection)."""
    pm = getattr(getattr(http.api, "rest_client", None), "pool_manager", None)
    kw = getattr(pm, "connection_pool_kw", None)
    if pm is None or not isinstance(kw, dict) or int(kw.get("maxsize") or 1) >= connections:
        return
    kw["maxsize"] = connections
    pm.clear()


def _omitted(reports: list[dict[str, Any]]) -> int:
    return sum(int(r["metadata"]["annotations"].get("draguard.io/results-omitted", 0)) for r in reports)
