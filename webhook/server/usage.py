"""From cached objects to what admission reads: inventory, namespace labels, quota usage, DRA stats.

Parsing is incremental (each slice, class and claim is parsed once per resourceVersion); the
assembled views are rebuilt in a background thread, at most once per debounce interval, and
published as one immutable `CacheView`. Quota usage uses the engine's own pure functions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from webhook.dra.device import Device
from webhook.dra.inventory import ClaimRecord, Inventory, claim_record
from webhook.dra.objects import DeviceClassSpec, read_device_class, read_slice_devices
from webhook.engine.context import QuotaUsage
from webhook.server.caches import ClusterCache
from webhook.server.metrics import DraStats, Metrics

log = logging.getLogger("draguard.usage")


@dataclass(frozen=True)
class CacheView:
    inventory: Inventory = field(default_factory=Inventory.empty)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    usage: QuotaUsage | None = None
    templates: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    stats: DraStats = field(default_factory=DraStats)
    quotas: int = 0


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class _Parsed:
    """Parse results keyed by object, reused while the resourceVersion is unchanged."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], Any]) -> None:
        self.parse = parse
        self.entries: dict[tuple[str, str], tuple[str, Any]] = {}
        self.changed = True  # whether the last update parsed or dropped anything

    def update(self, objs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Any]:
        fresh: dict[tuple[str, str], tuple[str, Any]] = {}
        for o in objs:
            k, rv = _key(o), _rv(o)
            hit = self.entries.get(k)
            if hit is not None and hit[0] == rv and rv:
                fresh[k] = hit
                continue
            try:
                fresh[k] = (rv, self.parse(o))
            except Exception as e:  # one odd object must not take the whole view down
                log.warning(
                    "cannot read cached object", extra={"object": "/".join(k), "reason": str(e)[:200]}
                )
        self.changed = fresh.keys() != self.entries.keys() or any(
            fresh[k] is not self.entries.get(k) for k in fresh
        )
        self.entries = fresh
        return {k: v[1] for k, v in fresh.items()}


def dra_stats(inventory: Inventory, claims: Iterable[Mapping[str, Any]]) -> DraStats:
    """Claims by state, devices allocated per class, and matching devices still free per class."""
    total = pending = allocated = 0
    taken: set[tuple[str, str, str]] = set()
    per_class: dict[str, int] = {}
    for obj in claims:
        total += 1
        alloc = ((obj.get("status") or {}).get("allocation")) or None
        if not alloc:
            pending += 1
            continue
        allocated += 1
        rec = claim_record(obj)
        results = ((alloc.get("devices") or {}).get("results")) or []
        for r in results:
            if not isinstance(r, Mapping):
                continue
            taken.add((str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
            cls = _class_of_result(rec, str(r.get("request") or ""))
            if cls:
                per_class[cls] = per_class.get(cls, 0) + 1
    available: dict[str, int] = {}
    if inventory.classes and inventory.devices:
        from webhook.engine.quota import QuotaCalculator

        calc = QuotaCalculator(inventory)
        for name in inventory.classes:
            try:
                devs = calc.matching(name) or []
            except Exception:  # a class selector the CEL environment cannot run
                devs = []
            available[name] = sum(1 for d in devs if (d.driver, d.pool, d.name) not in taken)
    return DraStats(
        claims_total=total,
        claims_pending=pending,
        claims_allocated=allocated,
        devices_available=available,
        devices_allocated=per_class,
    )


def _class_of_result(rec: ClaimRecord | None, request: str) -> str | None:
    if rec is None:
        return None
    top, _, sub = request.partition("/")
    req = rec.spec.request(top)
    if req is None:
        return None
    if sub:
        for s in req.first_available:
            if s.name == sub:
                return s.device_class
        return None
    return req.device_class


def warm(inventory: Inventory, policies: Any) -> None:
    """Evaluate a few representative objects against a fresh inventory before it is published: one
    claim and the class itself per DeviceClass, and a legacy GPU pod. The CEL environment, the
    rule modules and the engine's per-inventory memos (class matches, per-node capacity) are then
    ready here, in the background, and not paid for by the first admission request."""
    if policies is None:
        return
    from webhook.engine.context import Context, SourceObject
    from webhook.engine.evaluate import evaluate

    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "draguard-warmup", "namespace": "draguard-warmup"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "warmup", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ]
            },
        }
    ]
    for name, spec in sorted(inventory.classes.items()):
        objs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "draguard-warmup", "namespace": "draguard-warmup"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": name}}]}},
            }
        )
        objs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": sel.expression}} for sel in spec.selectors]},
            }
        )
    for obj in objs:
        try:
            evaluate([SourceObject(obj)], policies, inventory, Context(admission=True))
        except Exception:  # warming is an optimisation; the request path copes without it
            log.debug("inventory warm-up failed", exc_info=True)


class Rebuilder:
    """Turns a ClusterCache into CacheViews, debounced, in a thread; `publish` receives each view."""

    def __init__(
        self,
        cache: ClusterCache,
        metrics: Metrics,
        publish: Callable[[CacheView], None],
        policies: Callable[[], Any],
        debounce: float = 0.3,
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.publish = publish
        self.policies = policies
        self.debounce = debounce
        self._stop = threading.Event()
        self._slices = _Parsed(read_slice_devices)
        self._classes = _Parsed(read_device_class)
        self._claims = _Parsed(claim_record)
        self._templates = _Parsed(claim_record)
        self.thread = threading.Thread(target=self._run, name="cache-rebuild", daemon=True)
        self.view = CacheView()
        self._inventory: Inventory | None = None

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.cache.changed.set()

    def poke(self) -> None:
        """Rebuild soon (policies changed: usage depends on them)."""
        self.cache.changed.set()

    def build(self) -> CacheView:
        c = self.cache
        devices: list[Device] = []
        for devs in self._slices.update(c.objects("resourceslices")).values():
            devices.extend(devs)
        classes: dict[str, DeviceClassSpec] = {
            spec.name: spec for spec in self._classes.update(c.objects("deviceclasses")).values() if spec.name
        }
        claim_objs = c.objects("resourceclaims")
        claims = {(r.namespace, r.name): r for r in self._claims.update(claim_objs).values() if r is not None}
        tmpl_objs = c.objects("resourceclaimtemplates")
        templates = {
            (r.namespace, r.name): r for r in self._templates.update(tmpl_objs).values() if r is not None
        }
        parsed = (self._slices, self._classes, self._claims, self._templates)
        if self._inventory is not None and not any(p.changed for p in parsed):
            inventory = self._inventory  # same facts: keep the object and what it has memoised
        else:
            inventory = Inventory(
                devices=tuple(devices),
                classes=MappingProxyType(classes),
                claims=MappingProxyType(claims),
                templates=MappingProxyType(templates),
            )
            warm(inventory, self.policies())
            self._inventory = inventory
        labels: dict[str, Mapping[str, str]] = {}
        for ns in c.objects("namespaces"):
            meta = ns.get("metadata") or {}
            labels[str(meta.get("name"))] = MappingProxyType(dict(meta.get("labels") or {}))
        from webhook.engine.quota import compute_usage

        usage = compute_usage(claim_objs, labels, self.policies(), inventory)
        tmpl_map = {_key(o): o for o in tmpl_objs}
        return CacheView(
            inventory=inventory,
            namespace_labels=MappingProxyType(labels),
            usage=usage,
            templates=MappingProxyType(tmpl_map),
            stats=dra_stats(inventory, claim_objs),
            quotas=len(c.objects("resourcequotas")),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.cache.changed.wait()
            if self._stop.is_set():
                return
            # Debounce: a relist or a burst of slice updates becomes one rebuild.
            time.sleep(self.debounce)
            self.cache.changed.clear()
            if not self.cache.synced:
                continue
            try:
                t0 = time.perf_counter()
                view = self.build()
                self.view = view
                self.metrics.inventory_rebuilds.inc()
                self.metrics.inventory_devices.set(len(view.inventory.devices))
                self.publish(view)
                log.debug("caches rebuilt", extra={"seconds": round(time.perf_counter() - t0, 4)})
            except Exception:
                log.exception("rebuilding the inventory from the caches failed; keeping the previous view")
