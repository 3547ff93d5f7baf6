"""Prometheus metrics of the webhook, in a registry of its own (several servers can share a process)."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..engine.rules import INTERNAL_RULES

# Webhook answers live in milliseconds; the tail buckets catch a stalled event loop.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Claim creation to allocation: the seed's alert is p99 > 30 s.
ALLOCATION_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class DraStats:
    """Cluster DRA health derived from the caches (rebuilt with the inventory, read at scrape time)."""

    claims_total: int = 0
    claims_pending: int = 0
    claims_allocated: int = 0
    devices_available: Mapping[str, int] = field(default_factory=dict)
    devices_allocated: Mapping[str, int] = field(default_factory=dict)


# Label children kept resolved: label values come from closed sets, this is a backstop.
MAX_MEMOISED = 4096


class Tally:
    """Increments of one counter child, added to it whenever the registry is read (a scrape).

    A prometheus_client increment takes a lock and a few calls; an admission counts three or four
    things. Counting here is one attribute update on the event loop, which is also where scrapes
    read the registry, so nothing counted is ever missing from one.
    """

    __slots__ = ("child", "n")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.n = 0

    def add(self) -> None:
        self.n += 1

    def flush(self) -> None:
        n = self.n
        if n:
            self.n = 0
            self.child.inc(n)


class _Direct(Tally):
    """A tally past the memo's bound: increments go straight to the child."""

    __slots__ = ()

    def add(self) -> None:
        self.child.inc()


class Answered(NamedTuple):
    """The metric children of one (endpoint, kind, operation, verdict)."""

    latency: Any
    requests: Tally
    ignored: Tally | None  # None unless the verdict is "ignored"


class TalliedHistogram(Collector):
    """A labelled histogram counted on the event loop (one bisect and two additions per observation
    instead of prometheus_client's locked increments), exposed as prometheus_client's Histogram is:
    the same buckets, `_count`, `_sum` and `_created` samples, children in the order first seen."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]):
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = (*(float(b) for b in buckets), math.inf)
        go_string = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus_client
        self._le = [go_string(b) for b in self.bounds]
        self._children: dict[tuple[str, ...], TalliedChild] = {}

    def labels(self, *values: str) -> TalliedChild:
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected {len(self.labelnames)} label values, got {len(key)}")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = TalliedChild(self.bounds)
        return child

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterable[Any]:
        return [self._family()]

    def collect(self) -> Iterable[Any]:
        fam = self._family()
        children = list(self._children.items())
        for values, child in children:
            acc, buckets = 0.0, []
            for le, n in zip(self._le, child.counts, strict=True):
                acc += n
                buckets.append((le, acc))
            fam.add_metric(list(values), buckets, child.sum)
        if getattr(prometheus_metrics, "_use_created", True):
            for values, child in children:
                labels = dict(zip(self.labelnames, values, strict=True))
                fam.add_sample(self.name + "_created", labels, child.created)
        return [fam]


class TalliedChild:
    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # The first bucket whose bound is >= amount, as prometheus_client counts it.
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _Flush(Collector):
    """Registered first, so collected first: pending tallies reach their counters before the
    counters are read."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush

    def collect(self) -> Iterable[Any]:
        self._flush()
        return ()


class _DraCollector(Collector):
    def __init__(self, stats: Callable[[], DraStats], caches: Callable[[], Mapping[str, tuple[bool, int]]]):
        self._stats = stats
        self._caches = caches

    def collect(self) -> Iterable[GaugeMetricFamily]:
        s = self._stats()
        yield GaugeMetricFamily(
            "dra_resource_claims_total", "ResourceClaims in the cluster", value=s.claims_total
        )
        yield GaugeMetricFamily(
            "dra_resource_claims_pending", "ResourceClaims not allocated yet", value=s.claims_pending
        )
        yield GaugeMetricFamily(
            "dra_resource_claims_allocated", "ResourceClaims with an allocation", value=s.claims_allocated
        )
        avail = GaugeMetricFamily(
            "dra_devices_available",
            "Published devices matching the DeviceClass and not allocated",
            labels=["device_class"],
        )
        for cls, n in sorted(s.devices_available.items()):
            avail.add_metric([cls], n)
        yield avail
        alloc = GaugeMetricFamily(
            "dra_devices_allocated",
            "Devices allocated through claims of the DeviceClass",
            labels=["device_class"],
        )
        for cls, n in sorted(s.devices_allocated.items()):
            alloc.add_metric([cls], n)
        yield alloc
        synced = GaugeMetricFamily(
            "draguard_cache_synced",
            "1 when the cache finished its initial list and is watching",
            labels=["resource"],
        )
        objects = GaugeMetricFamily(
            "draguard_cache_objects", "Objects held in the cache", labels=["resource"]
        )
        for name, (ok, count) in sorted(self._caches().items()):
            synced.add_metric([name], 1.0 if ok else 0.0)
            objects.add_metric([name], count)
        yield synced
        yield objects


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._tallies: list[Tally] = []
        r.register(_Flush(self.flush))
        self.requests = Counter(
            "draguard_admission_requests_total",
            "Admission requests answered",
            ["endpoint", "kind", "operation", "verdict"],
            registry=r,
        )
        self.latency = TalliedHistogram(
            "draguard_admission_duration_seconds",
            "Time to answer an admission request",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
        )
        r.register(self.latency)
        self.findings = Counter(
            "draguard_findings_total",
            "Findings returned by admission",
            ["rule", "mode", "endpoint"],
            registry=r,
        )
        self.ignored = Counter(
            "draguard_admission_ignored_total",
            "Requests for kinds or operations draguard does not check",
            ["endpoint", "kind", "operation"],
            registry=r,
        )
        self.bad_requests = Counter(
            "draguard_admission_bad_requests_total",
            "Requests refused before evaluation",
            ["reason"],
            registry=r,
        )
        self.rule_errors = Counter(
            "draguard_rule_errors_total",
            "Exceptions inside rules (never a 500)",
            ["rule", "endpoint"],
            registry=r,
        )
        self.patches = Counter(
            "draguard_patches_total", "Mutations returned, by outcome", ["outcome"], registry=r
        )
        self.generated = Counter(
            "draguard_generated_objects_total",
            "Objects created for migrations, by outcome",
            ["outcome"],
            registry=r,
        )
        self.connections_dropped = Counter(
            "draguard_connections_dropped_total",
            "Connections closed by the listener: evicted (at the connection limit, the longest-waiting "
            "handshake or idle one made room), limit (every connection was busy; the new one was closed) "
            "or handshake-timeout (TLS not done within the handshake timeout of the accept)",
            ["reason"],
            registry=r,
        )
        self.review_cache = Counter(
            "draguard_review_cache_total",
            "Reviews answered from the review cache or evaluated",
            ["result"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "draguard_policy_reloads_total", "Policy set reloads that took effect", registry=r
        )
        self.policy_reload_failures = Counter(
            "draguard_policy_reload_failures_total",
            "Policy changes rejected (last good set kept)",
            registry=r,
        )
        self.policy_rules = Gauge(
            "draguard_policies_loaded", "Policy documents in the active set", registry=r
        )
        self.tls_reloads = Counter(
            "draguard_tls_reloads_total", "Serving certificate reloads", ["outcome"], registry=r
        )
        self._tls_expiry: Gauge | None = None  # no series until a certificate is loaded
        # Series that exist from the start at 0: an alert on increase() cannot see a series' first
        # sample as an increase, so a first rejected certificate or rule error would go unnoticed.
        for outcome in ("ok", "invalid"):
            self.tls_reloads.labels(outcome)
        for rule in INTERNAL_RULES:
            for endpoint in ("validate", "mutate"):
                self.rule_errors.labels(rule, endpoint)
        self.inventory_rebuilds = Counter(
            "draguard_inventory_rebuilds_total", "Inventory and usage rebuilds from the caches", registry=r
        )
        self.rebuild_duration = Histogram(
            "draguard_cache_rebuild_duration_seconds",
            "Background CPU of one rebuild from the caches, by what changed: devices (slices or "
            "classes: the engine's memo starts afresh and is warmed), claims (claims or templates "
            "only), none (namespaces, quotas, policies)",
            ["changed"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.inventory_devices = Gauge("draguard_inventory_devices", "Devices in the inventory", registry=r)
        self.cache_list_duration = Gauge(
            "draguard_cache_list_duration_seconds",
            "Wall time of the resource's last full list (every page, decoded into the cache)",
            ["resource"],
            registry=r,
        )
        self.cache_sync_duration = Gauge(
            "draguard_cache_sync_duration_seconds",
            "From the caches' start to the first inventory view published (readiness waits for it)",
            registry=r,
        )
        self.cache_relists = Counter(
            "draguard_cache_relists_total",
            "Full relists (start, 410 Gone, reconnect)",
            ["resource"],
            registry=r,
        )
        self.allocation = Histogram(
            "dra_allocation_duration_seconds",
            "ResourceClaim creation to allocation",
            buckets=ALLOCATION_BUCKETS,
            registry=r,
        )
        self._dra_stats: Callable[[], DraStats] = DraStats
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._answered: dict[tuple[str, str, str, str], Answered] = {}
        self._found: dict[tuple[str, str, str], Tally] = {}
        self.review_cache_hit = self._tally(self.review_cache.labels("hit"))
        self.review_cache_miss = self._tally(self.review_cache.labels("miss"))
        self._cache_states: Callable[[], Mapping[str, tuple[bool, int]]] = dict
        r.register(_DraCollector(lambda: self._dra_stats(), lambda: self._cache_states()))

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, memoised: the label lookup is most of an increment's cost.
        Callers pass label values from closed sets; the memo is bounded all the same."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = metric.labels(*labels)
            if len(self._children) < MAX_MEMOISED:
                self._children[key] = c
        return c

    def _tally(self, child: Any) -> Tally:
        if len(self._tallies) >= 4 * MAX_MEMOISED:
            return _Direct(child)
        t = Tally(child)
        self._tallies.append(t)
        return t

    def flush(self) -> None:
        """Add the pending tallies to their counters (run before every read of the registry)."""
        for t in self._tallies:
            t.flush()

    def serving_certificate(self, not_after: float | None) -> None:
        """The serving certificate now in use expires at `not_after` (Unix time; None: unknown). The
        series exists only while the expiry is known: an expiry alert must not read a 0 as "expired
        long ago", nor an earlier certificate's date."""
        if not_after is None:
            if self._tls_expiry is not None:
                self.registry.unregister(self._tls_expiry)
                self._tls_expiry = None
            return
        if self._tls_expiry is None:
            self._tls_expiry = Gauge(
                "draguard_tls_certificate_expiry_timestamp_seconds",
                "When the serving certificate new connections get expires (notAfter, Unix time)",
                registry=self.registry,
            )
        self._tls_expiry.set(not_after)

    def answered(self, endpoint: str, kind: str, operation: str, verdict: str) -> Answered:
        """The children one answered review updates, resolved once per label combination (kind and
        operation must already be label values from a closed set)."""
        key = (endpoint, kind, operation, verdict)
        hit = self._answered.get(key)
        if hit is None:
            full = len(self._answered) >= MAX_MEMOISED
            tally = _Direct if full else self._tally
            hit = Answered(
                self.latency.labels(endpoint),
                tally(self.requests.labels(endpoint, kind, operation, verdict)),
                tally(self.ignored.labels(endpoint, kind, operation)) if verdict == "ignored" else None,
            )
            if not full:
                self._answered[key] = hit
        return hit

    def found(self, rule: str, mode: str, endpoint: str) -> Tally:
        """The findings counter of (rule, mode, endpoint), resolved once."""
        key = (rule, mode, endpoint)
        hit = self._found.get(key)
        if hit is None:
            child = self.findings.labels(rule, mode, endpoint)
            if len(self._found) >= MAX_MEMOISED:
                return _Direct(child)
            hit = self._found[key] = self._tally(child)
        return hit

    def bind(
        self, stats: Callable[[], DraStats], caches: Callable[[], Mapping[str, tuple[bool, int]]]
    ) -> None:
        self._dra_stats = stats
        self._cache_states = caches

    def render(self) -> bytes:
        return generate_latest(self.registry)
