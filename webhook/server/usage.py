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
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar

from ..dra.device import Device
from ..dra.inventory import ClaimRecord, Inventory, claim_record
from ..dra.objects import DeviceClassSpec, read_device_class
from ..dra.taints import DeviceTaintRule
from ..engine.context import QuotaUsage
from ..engine.quota import (
    ClaimCharge,
    QuotaCalculator,
    charge_of,
    claim_charge,
    inventory_calculator,
    team_labels_of,
    usage_from_charges,
)
from .caches import ClusterCache
from .metrics import DraStats, Metrics
from .overlay import OVERLAY_KINDS, AdmittedOverlay, Entry, Key, scope_of

log = logging.getLogger("draguard.usage")
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class CacheView:
    inventory: Inventory = field(default_factory=Inventory.empty)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    usage: QuotaUsage | None = None
    templates: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    stats: DraStats = field(default_factory=DraStats)
    quotas: int = 0
    # AdmittedOverlay.version this view was laid over with (-1: none).
    overlay_version: int = -1


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
        # The calculator the quota rule keeps on the inventory: its class matches survive rebuilds
        # that only saw claims change (the memo is carried over), so stats cost no CEL evaluation.
        calc = inventory_calculator(inventory)
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


SliceFacts = tuple[tuple[Device, ...], Mapping[tuple[str, str, str], Mapping[str, str]]]


def read_slice(obj: Mapping[str, Any]) -> SliceFacts:
    """A slice's devices and shared counter sets, read by the same function offline review reads
    its inventory file with, so admission and review judge the same facts (counter-only slices too)."""
    inv = Inventory.from_objects([obj])
    return inv.devices, inv.counter_sets


def read_taint_rule_object(obj: Mapping[str, Any]) -> tuple[DeviceTaintRule, ...]:
    return Inventory.from_objects([obj]).taint_rules


_REPLAYED_SELECTORS = 16  # bounds the rebuild's extra work: each is one pass over the devices


def seen_selectors(previous: Inventory | None, inventory: Inventory) -> list[tuple[str, tuple[str, ...]]]:
    """(class, request selectors) pairs whose device matches `previous` memoised, most recent last,
    named against `inventory`'s classes: what recent claims asked for, to match again in `warm`."""
    if previous is None:
        return []
    prefixes = sorted(
        ((tuple(s.expression for s in spec.selectors), name) for name, spec in inventory.classes.items()),
        key=lambda p: -len(p[0]),
    )
    out: list[tuple[str, tuple[str, ...]]] = []
    # The engine memoises a claim's match under ("match", class selectors + request selectors).
    for key in list(previous._memo):
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == "match" and isinstance(key[1], tuple)):
            continue
        exprs: tuple[str, ...] = key[1]
        for cls_exprs, name in prefixes:  # longest class prefix first
            if len(exprs) > len(cls_exprs) and exprs[: len(cls_exprs)] == cls_exprs:
                out.append((name, exprs[len(cls_exprs) :]))
                break
    return out[-_REPLAYED_SELECTORS:]


def warm(inventory: Inventory, policies: Any, selectors: Iterable[tuple[str, tuple[str, ...]]] = ()) -> None:
    """Evaluate a few representative objects against a fresh inventory before it is published: one
    claim and the class itself per DeviceClass, a legacy GPU pod, and one claim per (class, request
    selectors) in `selectors`. The CEL environment, the rule modules and the engine's per-inventory
    memos (class matches, per-node capacity) are then ready here, in the background, and not paid
    for by the first admission request."""
    if policies is None:
        return
    from ..core.source import SourceObject
    from ..engine.context import Context
    from ..engine.evaluate import evaluate

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
    for name, exprs in selectors:
        request = {"deviceClassName": name, "selectors": [{"cel": {"expression": e}} for e in exprs]}
        objs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "draguard-warmup", "namespace": "draguard-warmup"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": request}]}},
            }
        )
    for obj in objs:
        try:
            evaluate([SourceObject(obj)], policies, inventory, Context(admission=True))
        except Exception:  # warming is an optimisation; the request path copes without it
            log.debug("inventory warm-up failed", exc_info=True)


def add_usage(a: QuotaUsage | None, b: QuotaUsage) -> QuotaUsage:
    """Element-wise sum of two usages (claims counted in `b` are not in `a`)."""
    if a is None:
        return b
    devices = dict(a.devices)
    for k, n in b.devices.items():
        devices[k] = devices.get(k, 0) + n
    geq = dict(a.gpu_equivalents)
    for s, g in b.gpu_equivalents.items():
        geq[s] = geq.get(s, 0.0) + g
    claims = dict(a.claims)
    for s, c in b.claims.items():
        claims[s] = claims.get(s, 0) + c
    return QuotaUsage(devices=devices, gpu_equivalents=geq, claims=claims)


_UNREADABLE = object()


def _record_of(e: Entry) -> ClaimRecord | None:
    """The entry's ClaimRecord, parsed once per entry (None when it is not a readable claim)."""
    hit = e.memo.get("record", _UNREADABLE)
    if hit is _UNREADABLE:
        try:
            hit = claim_record(e.obj)
        except Exception as exc:  # an object the engine cannot read stays out, like in the caches
            log.debug(
                "overlay object unreadable", extra={"object": "/".join(e.key), "reason": str(exc)[:200]}
            )
            hit = None
        e.memo["record"] = hit
    return hit if isinstance(hit, ClaimRecord) else None


def _charge_of(
    e: Entry, labels: Mapping[str, Mapping[str, str]], policies: Any, inventory: Inventory
) -> QuotaUsage:
    """What one new claim adds to the quota usage (the engine's own charge arithmetic on it alone),
    remembered while devices, classes, policies and its namespace's labels stay the same."""
    ns = e.key[0] or "default"
    ns_labels = dict(labels.get(ns) or {})
    deps = (inventory.devices, inventory.classes, policies)
    hit = e.memo.get("charge")
    if hit is not None and all(a is b for a, b in zip(hit[0], deps, strict=True)) and hit[1] == ns_labels:
        charge: QuotaUsage = hit[2]
        return charge
    calc = inventory_calculator(inventory)
    try:
        one = claim_charge(e.obj, calc)
    except Exception as exc:  # unreadable: it charges nothing, like an unreadable cached claim
        log.debug("overlay claim not charged", extra={"object": "/".join(e.key), "reason": str(exc)[:200]})
        one = None
    charge = usage_from_charges([one] if one else [], {ns: ns_labels}, team_labels_of(policies))
    e.memo["charge"] = (deps, ns_labels, charge)
    return charge


def _over(base: Mapping[K, V], top: Mapping[K, V]) -> Mapping[K, V]:
    """`top` over `base` as one read-only dict. A copy, on purpose: the engine copies these maps
    when it reviews DRA objects, and copying a plain dict runs at C speed where a layered view
    would be walked key by key in Python (5,000 claims: ~0.1 ms against ~2 ms)."""
    return MappingProxyType({**base, **top}) if top else base


def apply_overlay(
    view: CacheView, live: Mapping[str, Mapping[Key, Entry]], policies: Any, version: int
) -> CacheView:
    """`view` with the admitted-but-not-yet-watched objects laid over it.

    When no DeviceClass changes, the new inventory shares the old one's memo (class matches, per-node
    capacity), whose entries depend only on devices and classes. New claims add their charge to
    the quota usage. `view.templates` (which migration templates
    already exist, so the mutating path skips creating them) stays the watch's alone: an admitted
    template may still have been rejected later, and a patch must not point at one that is absent.
    """
    if not live:
        return view if view.overlay_version == version else replace(view, overlay_version=version)
    inv = view.inventory
    classes: dict[str, DeviceClassSpec] = {}
    for key, e in (live.get("deviceclasses") or {}).items():
        try:
            spec = read_device_class(e.obj)
        except Exception as exc:
            log.debug("overlay object unreadable", extra={"object": key[1], "reason": str(exc)[:200]})
            continue
        if spec.name:
            classes[spec.name] = spec
    claims: dict[tuple[str, str], ClaimRecord] = {}
    new_claims: list[Entry] = []
    for key, e in (live.get("resourceclaims") or {}).items():
        rec = _record_of(e)
        if rec is not None:
            claims[key] = rec
            if key not in inv.claims:
                new_claims.append(e)
    templates: dict[tuple[str, str], ClaimRecord] = {}
    for key, e in (live.get("resourceclaimtemplates") or {}).items():
        rec = _record_of(e)
        if rec is not None:
            templates[key] = rec
    # Namespace labels (migration mode, team) come from the watch alone: never from a request.
    labels = view.namespace_labels
    inventory = inv
    if classes or claims or templates:
        # replace(): counters, DeviceTaintRules and node labels stay the watched inventory's.
        inventory = replace(
            inv,
            classes=_over(inv.classes, classes),
            claims=_over(inv.claims, claims),
            templates=_over(inv.templates, templates),
        )
        if not classes:
            # Same devices and classes: what the engine memoised on the watched inventory still holds.
            object.__setattr__(inventory, "_memo", inv._memo)
    usage = view.usage
    for e in new_claims:
        usage = add_usage(usage, _charge_of(e, labels, policies, inventory))
    return replace(
        view,
        inventory=inventory,
        usage=usage,
        overlay_version=version,
    )


class Rebuilder:
    """Turns a ClusterCache into CacheViews, debounced, in a thread; `publish` receives each view."""

    def __init__(
        self,
        cache: ClusterCache,
        metrics: Metrics,
        publish: Callable[[CacheView], None],
        policies: Callable[[], Any],
        debounce: float = 0.3,
        overlay: AdmittedOverlay | None = None,
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.publish = publish
        self.policies = policies
        self.debounce = debounce
        self.overlay = overlay if overlay is not None else AdmittedOverlay()
        cache.listeners.append(self.overlay.observe)
        # The last view built from the watch caches alone (what the overlay is laid over).
        self.base_view = CacheView()
        self.base_stamp = 0  # overlay confirmations the base view's stores already contain
        self.base_ready = False
        self._base_lock = threading.Lock()
        # scope -> (overlay version, base view, view with that scope's entries)
        self._scoped: dict[str, tuple[int, CacheView, CacheView]] = {}
        self._stop = threading.Event()
        self._slices = _Parsed(read_slice)
        self._taint_rules = _Parsed(read_taint_rule_object)
        self._classes = _Parsed(read_device_class)
        self._claims = _Parsed(claim_record)
        self._templates = _Parsed(claim_record)
        self.thread = threading.Thread(target=self._run, name="cache-rebuild", daemon=True)
        self.view = CacheView()
        self._inventory: Inventory | None = None
        self.last_change = "none"  # what the last build_base saw change: devices | claims | none
        self.last_cpu: float | None = None  # CPU seconds of the last rebuild from the caches
        # Quota charge per claim, valid while devices and classes are unchanged (see _charges_of).
        self._calc: QuotaCalculator | None = None
        self._charges: dict[tuple[str, str], tuple[ClaimRecord, ClaimCharge]] = {}

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.cache.changed.set()

    def poke(self) -> None:
        """Rebuild soon (policies changed: usage depends on them)."""
        self.cache.changed.set()

    def build(self) -> CacheView:
        """The watch caches' view (what every request reads; `view_for` lays one identity's
        admitted objects over it)."""
        # Stamp first, stores second: an entry the watch confirms in between is then already in
        # the store read below (the reflector stores an object before it reports the event), and
        # entries confirmed after `stamp` stay laid over this base (see overlay.py).
        stamp = self.overlay.stamp
        base = self.build_base()
        with self._base_lock:
            self.base_view, self.base_stamp = base, stamp
            self.base_ready = True
            self._scoped.clear()
            self.overlay.forget_confirmed(stamp)
        return base

    def view_for(self, scope: str) -> CacheView | None:
        """The published view with what `scope` (an identity, see overlay.scope_of) had admitted
        and the watch has not reported yet; None when there is nothing to add. Expired entries
        are left out here, whether or not a rebuild has run since."""
        if not self.base_ready or not self.overlay.has(scope):
            return None
        with self._base_lock:
            base, stamp = self.base_view, self.base_stamp
            version, live = self.overlay.snapshot(after=stamp, scope=scope)
            if not live:
                return None
            hit = self._scoped.get(scope)
            if hit is not None and hit[0] == version and hit[1] is base:
                return hit[2]
        view = apply_overlay(base, live, self.policies(), version)
        with self._base_lock:
            if self.base_view is base:
                self._scoped[scope] = (version, base, view)
                while len(self._scoped) > 16:  # each holds copies of the claim maps
                    self._scoped.pop(next(iter(self._scoped)))
        return view

    def build_base(self) -> CacheView:
        c = self.cache
        devices: list[Device] = []
        counter_sets: dict[tuple[str, str, str], Mapping[str, str]] = {}
        for devs, sets in self._slices.update(c.objects("resourceslices")).values():
            devices.extend(devs)
            counter_sets.update(sets)
        taint_rules: list[DeviceTaintRule] = []
        if "devicetaintrules" in c.reflectors:
            for rules in self._taint_rules.update(c.objects("devicetaintrules")).values():
                taint_rules.extend(rules)
        else:
            self._taint_rules.changed = False
        # Node objects are cached cut to name and labels (caches.labels_only): cheap to read whole.
        node_labels = (
            Inventory.from_objects(c.objects("nodes")).node_labels if "nodes" in c.reflectors else {}
        )
        classes: dict[str, DeviceClassSpec] = {
            spec.name: spec for spec in self._classes.update(c.objects("deviceclasses")).values() if spec.name
        }
        claim_objs = c.objects("resourceclaims")
        claims = {(r.namespace, r.name): r for r in self._claims.update(claim_objs).values() if r is not None}
        tmpl_objs = c.objects("resourceclaimtemplates")
        templates = {
            (r.namespace, r.name): r for r in self._templates.update(tmpl_objs).values() if r is not None
        }
        previous = self._inventory
        nodes_changed = previous is None or dict(previous.node_labels) != dict(node_labels)
        parsed = (self._slices, self._classes, self._claims, self._templates, self._taint_rules)
        # Taints and node labels decide which devices a claim can have, like the devices themselves.
        devices_changed = (
            self._slices.changed or self._classes.changed or self._taint_rules.changed or nodes_changed
        )
        if previous is not None and not nodes_changed and not any(p.changed for p in parsed):
            inventory = previous  # same facts: keep the object and what it has memoised
            self.last_change = "none"
        elif previous is not None and not devices_changed:
            self.last_change = "claims"
            # Only claims or templates changed (a stream of pod creates): everything the engine
            # memoises on an inventory (class matches, per-node capacity, lint results) depends on
            # devices and classes alone, so the new inventory keeps the old memo and needs no warm-up.
            inventory = replace(
                previous, claims=MappingProxyType(claims), templates=MappingProxyType(templates)
            )
            object.__setattr__(inventory, "_memo", previous._memo)
        else:
            inventory = Inventory(
                devices=tuple(devices),
                classes=MappingProxyType(classes),
                claims=MappingProxyType(claims),
                templates=MappingProxyType(templates),
                counter_sets=MappingProxyType(counter_sets),
                taint_rules=tuple(taint_rules),
                node_labels=node_labels,
            )
            # Also match again what recent claims selected, so their next review does not pay.
            warm(inventory, self.policies(), seen_selectors(previous, inventory))
            self.last_change = "devices"
        self._inventory = inventory
        labels: dict[str, Mapping[str, str]] = {}
        for ns in c.objects("namespaces"):
            meta = ns.get("metadata") or {}
            labels[str(meta.get("name"))] = MappingProxyType(dict(meta.get("labels") or {}))
        usage = usage_from_charges(
            self._charges_of(claims, inventory, devices_changed), labels, team_labels_of(self.policies())
        )
        tmpl_map = {_key(o): o for o in tmpl_objs}
        return CacheView(
            inventory=inventory,
            namespace_labels=MappingProxyType(labels),
            usage=usage,
            templates=MappingProxyType(tmpl_map),
            stats=dra_stats(inventory, claim_objs),
            quotas=len(c.objects("resourcequotas")),
        )

    def _charges_of(
        self, claims: Mapping[tuple[str, str], ClaimRecord], inventory: Inventory, devices_changed: bool
    ) -> list[ClaimCharge]:
        """Each claim's quota charge, computed again only for claims that changed (or all of them
        when devices or classes did): the rebuild after one new claim among thousands stays cheap."""
        if devices_changed or self._calc is None:
            self._calc = inventory_calculator(inventory)
            self._charges = {}
        calc, old = self._calc, self._charges
        fresh: dict[tuple[str, str], tuple[ClaimRecord, ClaimCharge]] = {}
        for key, rec in claims.items():
            hit = old.get(key)
            if hit is None or hit[0] is not rec:
                hit = (rec, charge_of(rec.namespace, rec.spec, calc))
            fresh[key] = hit
        self._charges = fresh
        return [c for _rec, c in fresh.values()]

    def admitted(self, request: Mapping[str, Any], outcome: Any) -> bool:
        """Called by the validating endpoint after each review (on the event loop): an allowed,
        persisted CREATE/UPDATE of an overlay kind is recorded for the identity that sent it
        (True). Cheap for every other request."""
        if (
            outcome.kind not in OVERLAY_KINDS
            or outcome.dry_run
            or outcome.operation not in ("CREATE", "UPDATE")
            or not outcome.response.get("allowed")
        ):
            return False
        group, api = OVERLAY_KINDS[outcome.kind][0], request.get("kind")
        if not isinstance(api, Mapping) or str(api.get("group") or "") != group:
            return False
        from .admission import prepare_object

        obj = prepare_object(request, group, str(api.get("version") or ""), outcome.kind)
        return obj is not None and self.overlay.record(obj, outcome.operation, scope_of(request))

    def current(self, view: CacheView | None) -> CacheView:
        """`view` (a rebuilt view about to be published; None: the latest watched one)."""
        if view is not None:
            return view
        with self._base_lock:
            return self.base_view

    def _run(self) -> None:
        while not self._stop.is_set():
            # Wake for the next overlay expiry too: readers already skip expired entries, this
            # frees their memory when no request of their identity comes again.
            expiry = self.overlay.next_expiry()
            woke = self.cache.changed.wait(None if expiry is None else expiry + 0.05)
            if self._stop.is_set():
                return
            if not woke:
                self.overlay.expire()
                continue
            # Debounce: a relist or a burst of slice updates becomes one rebuild.
            time.sleep(self.debounce)
            self.cache.changed.clear()
            if not self.cache.synced:
                continue
            try:
                t0, c0 = time.perf_counter(), time.thread_time()
                view = self.build()
                self.last_cpu = time.thread_time() - c0
                self.metrics.rebuild_duration.labels(self.last_change).observe(self.last_cpu)
                self.view = view
                self.metrics.inventory_rebuilds.inc()
                self.metrics.inventory_devices.set(len(view.inventory.devices))
                self.publish(view)
                log.debug("caches rebuilt", extra={"seconds": round(time.perf_counter() - t0, 4)})
            except Exception:
                log.exception("rebuilding the inventory from the caches failed; keeping the previous view")
