"""What the cluster has: published devices and DeviceClasses (plus known claims and templates).

Built from objects as `kubectl get resourceslices,deviceclasses -o yaml` prints them (a `List`
with `items`), any served `resource.k8s.io` version. `load_inventory` is the one reading edge.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml

from . import yamlload
from .device import Device
from .objects import (
    ClaimSpec,
    DeviceClassSpec,
    as_list,
    as_map,
    as_str,
    claim_spec_of,
    dra_version,
    read_device_class,
    read_slice_counters,
    read_slice_devices,
)
from .taints import DeviceTaint, DeviceTaintRule, read_taint_rule

T = TypeVar("T")
_MEMO_LIMIT = 4096
# Keys hold selector texts from requests and values can list every device (10,000 devices: ~80 KiB per
# match): a count alone lets a stream of distinct selectors hold hundreds of MiB.
_MEMO_BYTES = 32 * 1024 * 1024
_SIZED = (str, bytes, tuple, list, set, frozenset, dict)


_SAMPLE = 64


def approx_bytes(obj: object, depth: int = 0) -> int:
    """Rough size of a memo key or value: containers and the strings in them, down to 3 levels.
    Other objects count only themselves (devices are the inventory's own, not the memo's). Past 64
    items a container is sized from its first 64, scaled: a match can list 10,000 devices."""
    n = sys.getsizeof(obj)
    if depth >= 3 or not isinstance(obj, (dict, tuple, list, set, frozenset)):
        return n
    items = obj.items() if isinstance(obj, dict) else obj
    inner = 0
    for i, x in enumerate(items):
        if i == _SAMPLE:
            return n + inner * len(obj) // _SAMPLE
        if isinstance(x, tuple) and isinstance(obj, dict):
            inner += approx_bytes(x[0], depth + 1) + approx_bytes(x[1], depth + 1)
        elif isinstance(x, _SIZED):
            inner += approx_bytes(x, depth + 1)
    return n + inner


_MISSING = object()


class Memo(dict[Hashable, Any]):
    """Derived facts of an inventory, bounded by entry count and by approximate bytes; the oldest
    entries go first. Shared on purpose between inventories with the same devices and classes.

    The webhook reviews big objects on worker threads while small ones go on on the event loop, so
    two threads may fill one memo: eviction and the byte count change under a lock. Reads take
    none (one dict lookup is atomic); a value computed twice by two threads is only wasted work."""

    __slots__ = ("lock", "max_bytes", "max_entries", "nbytes", "sizes")

    def __init__(self, max_entries: int = _MEMO_LIMIT, max_bytes: int = _MEMO_BYTES) -> None:
        super().__init__()
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.sizes: dict[Hashable, int] = {}
        self.lock = threading.Lock()

    def put(self, key: Hashable, value: Any) -> None:
        """Store `value` unless it alone is over the byte bound, evicting the oldest to make room."""
        size = approx_bytes(key) + approx_bytes(value)
        if size > self.max_bytes:
            return
        with self.lock:
            if key in self:
                self.drop(key)
            while self and (len(self) >= self.max_entries or self.nbytes + size > self.max_bytes):
                self.drop(next(iter(self)))
            self[key] = value
            self.sizes[key] = size
            self.nbytes += size

    def drop(self, key: Hashable) -> None:
        """Remove `key` (the caller holds the lock)."""
        del self[key]
        self.nbytes -= self.sizes.pop(key, 0)


class InventoryError(ValueError):
    """An inventory file that cannot be read; the message names the file and what to do."""


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A ResourceClaim or ResourceClaimTemplate known to the engine (input set or cluster)."""

    kind: str
    namespace: str
    name: str
    api_version: str
    spec: ClaimSpec
    obj: Mapping[str, Any] = field(default_factory=dict, compare=False)


def claim_record(obj: Mapping[str, Any], default_namespace: str = "default") -> ClaimRecord | None:
    """A ClaimRecord for a ResourceClaim/ResourceClaimTemplate object; None for other objects."""
    read = claim_spec_of(obj)
    if read is None:
        return None
    meta = as_map(obj.get("metadata"))
    return ClaimRecord(
        kind=str(obj.get("kind")),
        namespace=as_str(meta.get("namespace")) or default_namespace,
        name=as_str(meta.get("name")) or "",
        api_version=str(obj.get("apiVersion")),
        spec=read[0],
        obj=obj,
    )


@dataclass(frozen=True, slots=True)
class Inventory:
    devices: tuple[Device, ...] = ()
    classes: Mapping[str, DeviceClassSpec] = field(default_factory=dict)
    # (namespace, name) -> record; filled when the cluster's claims/templates are known.
    claims: Mapping[tuple[str, str], ClaimRecord] = field(default_factory=dict)
    templates: Mapping[tuple[str, str], ClaimRecord] = field(default_factory=dict)
    # (driver, pool, counter set) -> {counter: quantity text}: shared counters (KEP-4815).
    counter_sets: Mapping[tuple[str, str, str], Mapping[str, str]] = field(default_factory=dict)
    taint_rules: tuple[DeviceTaintRule, ...] = ()
    # node name -> labels, from Node objects in the inventory (per-device node selectors need them).
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Derived facts computed once per inventory (rules ask for them once per object). Not an
    # __init__ argument, so dataclasses.replace() starts a fresh memo for the changed inventory.
    _memo: Memo = field(default_factory=Memo, init=False, compare=False, repr=False)

    @staticmethod
    def empty() -> Inventory:
        return Inventory()

    @property
    def is_empty(self) -> bool:
        """No devices published (rules that need capacity facts skip then)."""
        return not self.devices

    @staticmethod
    def from_objects(objs: Iterable[Mapping[str, Any]]) -> Inventory:
        """Slices, classes, claims and templates of any served version; `List` objects are unpacked."""
        devices: list[Device] = []
        classes: dict[str, DeviceClassSpec] = {}
        claims: dict[tuple[str, str], ClaimRecord] = {}
        templates: dict[tuple[str, str], ClaimRecord] = {}
        counter_sets: dict[tuple[str, str, str], Mapping[str, str]] = {}
        taint_rules: list[DeviceTaintRule] = []
        node_labels: dict[str, Mapping[str, str]] = {}

        def add(obj: Mapping[str, Any]) -> None:
            kind = obj.get("kind")
            if isinstance(kind, str) and kind.endswith("List") and "items" in obj:
                for item in as_list(obj.get("items")):
                    if isinstance(item, Mapping):
                        add(item)
                return
            if kind == "Node" and obj.get("apiVersion") == "v1":
                meta = as_map(obj.get("metadata"))
                name = as_str(meta.get("name"))
                if name:
                    labels = as_map(meta.get("labels"))
                    node_labels[name] = {k: v for k, v in labels.items() if isinstance(v, str)}
                return
            rule = read_taint_rule(obj)
            if rule is not None:
                taint_rules.append(rule)
                return
            if dra_version(obj.get("apiVersion")) is None:
                return
            if kind == "ResourceSlice":
                devices.extend(read_slice_devices(obj))
                driver, pool, sets = read_slice_counters(obj)
                for set_name, counters in sets.items():
                    counter_sets[(driver, pool, set_name)] = MappingProxyType(counters)
            elif kind == "DeviceClass":
                dc = read_device_class(obj)
                if dc.name:
                    classes[dc.name] = dc
            else:
                rec = claim_record(obj)
                if rec is not None:
                    target = claims if rec.kind == "ResourceClaim" else templates
                    target[(rec.namespace, rec.name)] = rec

        for o in objs:
            if isinstance(o, Mapping):
                add(o)
        return Inventory(
            devices=tuple(devices),
            classes=MappingProxyType(classes),
            claims=MappingProxyType(claims),
            templates=MappingProxyType(templates),
            counter_sets=MappingProxyType(counter_sets),
            taint_rules=tuple(taint_rules),
            node_labels=MappingProxyType(node_labels),
        )

    def taints_of(self, device: Device) -> tuple[DeviceTaint, ...]:
        """The device's own taints and those DeviceTaintRules give it."""
        if not self.taint_rules:
            return device.taints
        extra = tuple(r.taint for r in self.taint_rules if r.applies(device.driver, device.pool, device.name))
        return device.taints + extra

    def devices_by_node(self) -> dict[str | None, list[Device]]:
        """Devices grouped by node name; None holds network-attached (allNodes/selector) devices."""
        out: dict[str | None, list[Device]] = {}
        for d in self.devices:
            out.setdefault(d.node, []).append(d)
        return out

    def nodes(self) -> list[str]:
        return sorted({d.node for d in self.devices if d.node is not None})

    def cached(self, key: Hashable, compute: Callable[[], T]) -> T:
        """A derived fact of this (immutable) inventory, computed once: e.g. the devices a class's
        selectors match, which every claim naming that class needs again."""
        hit = self._memo.get(key, _MISSING)
        if hit is not _MISSING:
            found: T = hit
            return found
        # A long-lived server sees unbounded distinct selector texts: the memo bounds itself.
        value = compute()
        self._memo.put(key, value)
        return value

    def published_attributes(self) -> frozenset[tuple[str, str]]:
        """Every (domain, name) attribute some device publishes."""
        cached: frozenset[tuple[str, str]] | None = self._memo.get("published")
        if cached is None:
            cached = frozenset(
                (dom, name) for d in self.devices for dom, attrs in d.attributes.items() for name in attrs
            )
            self._memo.put("published", cached)
        return cached

    def merged(self, other: Inventory) -> Inventory:
        """This inventory with `other`'s devices added and its classes/claims taking precedence."""
        return Inventory(
            devices=self.devices + other.devices,
            classes=MappingProxyType({**self.classes, **other.classes}),
            claims=MappingProxyType({**self.claims, **other.claims}),
            templates=MappingProxyType({**self.templates, **other.templates}),
            counter_sets=MappingProxyType({**self.counter_sets, **other.counter_sets}),
            taint_rules=self.taint_rules + other.taint_rules,
            node_labels=MappingProxyType({**self.node_labels, **other.node_labels}),
        )


def parse_inventory_text(text: str, source: str = "<inventory>") -> Inventory:
    """Inventory from YAML (multi-document) or JSON text; InventoryError names `source` on failure."""
    try:
        # libyaml's loader when present: inventories of 10k+ devices are large and parse ~10x faster.
        # It refuses alias bombs and integers too long to convert (with their line).
        docs = [d for d in yamlload.load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InventoryError(
            f"{source}{where}: not valid YAML/JSON ({getattr(e, 'problem', None) or e}); "
            "fix: pass the output of `kubectl get resourceslices,deviceclasses -o yaml`"
        ) from None
    objs = [d for d in docs if isinstance(d, Mapping)]
    if docs and not objs:
        raise InventoryError(
            f"{source}: expected Kubernetes objects (mappings with apiVersion/kind), "
            f"got {type(docs[0]).__name__}; "
            "fix: pass the output of `kubectl get resourceslices,deviceclasses -o yaml`"
        )
    return Inventory.from_objects(objs)


def load_inventory(path: str | Path) -> Inventory:
    """Read an inventory file (YAML or JSON). A directory reads every *.yaml/*.yml/*.json in it."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in (".yaml", ".yml", ".json"))
        inv = Inventory.empty()
        for f in files:
            inv = inv.merged(load_inventory(f))
        return inv
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{p}: inventory file not found; fix: check the --inventory path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(f"{p}: cannot read inventory ({e})") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InventoryError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        return Inventory.from_objects(data if isinstance(data, list) else [data])
    return parse_inventory_text(text, str(p))
