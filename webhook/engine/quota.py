"""Quota arithmetic: how many devices a claim charges per DeviceClass, and what that is in GPUs.

Device counts follow the Kubernetes ResourceQuota evaluator for
`<class>.deviceclass.resource.k8s.io/devices` exactly, so a rendered ResourceQuota and draguard
charge every claim the same:

- `ExactCount` is charged `count`.
- `All` is charged 32 (`AllocationResultsMaxSize`, the most devices one claim can get).
- `firstAvailable`: each class is charged the maximum over the subrequests that use it.
- Unknown allocation modes are charged 0.

GPU-equivalents (a draguard budget with no ResourceQuota key) count what the claim can actually get:
a request is charged its largest alternative (1 x H100 or 2 x A100: 2), an `All` request the most
devices its class matches on one node of the inventory. Without them (no inventory, or one that does
not know the class) an `All` request is charged the one device it gets at least, and the charge is
reported as a lower bound (`unknown_charges`) rather than an invented 32. An `adminAccess` request
allocates nothing exclusively and is charged no GPU-equivalents; nor is a class whose devices are
known to be no GPU (its selectors pin a driver other than the GPU driver: NICs, IMEX channels, the
example driver's devices). A full GPU is 1,
a MIG device its compute-slice fraction of the parent (3g.20gb = 3/7 on A100/H100; A30 profiles
are out of 4). A partition that consumes shared counters (KEP-4815) is charged the largest share of
its counter set it takes (a 40Gi partition of an 80Gi set: 1/2). A share of a multi-allocatable
device (KEP-5075) is charged what it consumes over the device's capacity after the request
policy's rounding, the largest over the device's capacities (10Gi of an 80Gi H100: 1/8); devices
of a class sharing nothing are charged whole.

Pure: the server feeds cached claims to `compute_usage`; nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from math import lcm
from typing import Any

from .._driver import DRIVER_NAME
from ..core.findings import Mode
from ..dra.capacity import consumed, parse_quantity
from ..dra.device import Device
from ..dra.inventory import Inventory
from ..dra.objects import (
    ALL,
    EXACT_COUNT,
    ClaimSpec,
    DeviceClassSpec,
    Selector,
    as_map,
    as_str,
    claim_spec_of,
    qualify,
)
from ..policy.model import GpuQuotaPolicy, PolicySet, QuotaBudget, glob_match
from .context import QuotaUsage

ALL_MODE_CHARGE = 32
"""What the API server's quota evaluator charges an `All` request (AllocationResultsMaxSize)."""
ALL_MODE_LEAST = 1
"""The fewest devices an `All` request gets (at least one device must match for it to be allocated):
its GPU-equivalent charge when how many devices its class matches is unknown."""

# `device.driver == "x"` (either side), as a DeviceClass pins its driver. A selector with `||` or a
# negation may let other drivers through, so it pins nothing.
_DRIVER_PIN = re.compile(
    r"""device\.driver\s*==\s*(['"])([^'"\\]{1,253})\1|(['"])([^'"\\]{1,253})\3\s*==\s*device\.driver"""
)

TEAM_LABEL = "draguard.io/team"
QUOTA_DEVICES_KEY = "{cls}.deviceclass.resource.k8s.io/devices"
QUOTA_CLAIMS_KEY = "count/resourceclaims.resource.k8s.io"

# "<compute slices>g.<memory>gb", optionally with a suffix like "+me" or "-me".
_MIG_PROFILE = re.compile(r"(\d+)g\.(\d+)gb")
_MIG_PROFILE_ALL = re.compile(r"\d+g\.\d+gb")
# Class names cannot contain '.' inside the profile in every spelling: "mig-3g20gb", "mig-3g.20gb".
_MIG_IN_NAME = re.compile(r"(?:^|[^0-9])([1-8])g\.?(\d+)gb")
# Boards whose MIG geometry has 4 compute slices, named in an NVML product name, a selector or a
# class name (where the spaces are gone): "NVIDIA A30", "NVIDIA RTX PRO 6000 Blackwell ...",
# "gpu.nvidia.com-rtxpro6000-mig-1g24gb".
_FOUR_SLICE_BOARD = re.compile(r"(?<![a-z0-9])a30(?![0-9])|rtx[ _-]?pro[ _-]?6000", re.IGNORECASE)


def team_scope(team: str) -> str:
    """The QuotaUsage scope key of a team label value."""
    return f"team:{team}"


def mig_fraction(profile: str, product: str | None = None) -> Fraction | None:
    """Share of the parent GPU a MIG profile gets: compute slices / slices of the parent.

    A30 and RTX PRO 6000 Blackwell GPUs have 4 slices; every other MIG-capable GPU (A100, H100, H200,
    B200, GB200, GH200) has 7. `product` is whatever names the board: its NVML name, or the selector
    or class name that picks it (so a class's share is right before any device is known).
    """
    m = _MIG_PROFILE.search(profile)
    if m is None:
        return None
    total = 4 if product and _FOUR_SLICE_BOARD.search(product) else 7
    return min(Fraction(int(m.group(1)), total), Fraction(1))


def pinned_drivers(expressions: Iterable[str]) -> frozenset[str]:
    """The drivers selectors pin (`device.driver == "x"`); empty when none does (selectors are ANDed:
    the first selector that pins decides)."""
    for expr in expressions:
        if "||" in expr or "!" in expr.replace("!=", ""):
            continue
        pins = frozenset(m.group(2) or m.group(4) for m in _DRIVER_PIN.finditer(expr))
        if pins:
            return pins
    return frozenset()


def add_ratio(num: int, den: int, n: int, d: int) -> tuple[int, int]:
    """num/den + n/d over the least common denominator (denominators stay small: 1, 4, 7, 28)."""
    if d == den:
        return num + n, den
    common = lcm(den, d)
    return num * (common // den) + n * (common // d), common


def device_fraction(device: Device) -> Fraction:
    """GPU-equivalents of one device: 1 for a full GPU, the slice fraction for a MIG device, 0 for a
    device of another driver (a NIC or an FPGA is no GPU; its class is still counted in devices)."""
    if device.driver != DRIVER_NAME:
        return Fraction(0)
    attrs = device.attributes.get(device.driver, {})
    profile = attrs.get("profile")
    if attrs.get("type") == "mig" or isinstance(profile, str):
        product = attrs.get("productName")
        frac = mig_fraction(str(profile or ""), product if isinstance(product, str) else None)
        if frac is not None:
            return frac
    return Fraction(1)


def partition_fraction(
    device: Device, counter_sets: Mapping[tuple[str, str, str], Mapping[str, str]]
) -> Fraction | None:
    """The largest share of its pool's counter sets a partition consumes; None when it consumes none."""
    best: Fraction | None = None
    for use in device.consumes_counters:
        totals = counter_sets.get((device.driver, device.pool, use.counter_set), {})
        for name, text in use.counters.items():
            need, total = parse_quantity(text), parse_quantity(totals.get(name, ""))
            if need is None or total is None or total.value <= 0:
                continue
            ratio = min(max(need.value / total.value, Fraction(0)), Fraction(1))
            best = ratio if best is None else max(best, ratio)
    return best


def share_fraction(device: Device, requests: Mapping[str, str]) -> Fraction:
    """What one allocation of a multi-allocatable device takes of it: each capacity's consumed amount
    (the request rounded by the policy; the policy's default or the whole capacity when not
    requested, as the scheduler fills it) over the capacity, the largest."""
    wanted = {qualify(k, device.driver): v for k, v in requests.items()}
    best: Fraction | None = None
    for dom, caps in device.capacity.items():
        for name, text in caps.items():
            value = parse_quantity(text)
            if value is None or value.value <= 0:
                continue
            asked = wanted.get((dom, name))
            requested = parse_quantity(asked) if asked is not None else None
            policy = device.capacity_policy.get(dom, {}).get(name)
            ratio = consumed(requested, value, policy).value / value.value
            ratio = min(max(ratio, Fraction(0)), Fraction(1))
            best = ratio if best is None else max(best, ratio)
    return Fraction(1) if best is None else best


def _match(expressions: Sequence[str], devices: Sequence[Device]) -> list[Device]:
    """Devices for which every expression is true; evaluation and compile errors count as no match
    (the CEL linter reports them)."""
    if not devices:
        return []
    from ..cel.env import CelCompileError  # the CEL environment is heavier; load on first use
    from ..cel.match import match_devices

    try:
        return list(match_devices(list(expressions), list(devices)).matched)
    except CelCompileError:
        return []


@dataclass
class QuotaCalculator:
    """Per-inventory cache of class matches, so that counting many claims stays cheap."""

    inventory: Inventory
    # Classes to resolve names with (input set over inventory); the inventory's own when None.
    classes: Mapping[str, DeviceClassSpec] | None = None
    _matches: dict[tuple[str, tuple[str, ...]], list[Device]] = field(default_factory=dict)
    _fractions: dict[str, Fraction] = field(default_factory=dict)
    _shared: dict[str, bool] = field(default_factory=dict)
    _shares: dict[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], Fraction] = field(
        default_factory=dict
    )

    def class_spec(self, class_name: str) -> DeviceClassSpec | None:
        classes = self.classes if self.classes is not None else self.inventory.classes
        return classes.get(class_name)

    def matching(self, class_name: str, selectors: Sequence[Selector] = ()) -> list[Device] | None:
        """Devices the class (plus request selectors) can get; None when the class is unknown."""
        cls = self.class_spec(class_name)
        if cls is None:
            return None
        exprs = tuple(s.expression for s in (*cls.selectors, *selectors))
        key = (class_name, exprs)
        hit = self._matches.get(key)
        if hit is None:
            # Kept on the inventory too: every calculator over the same devices (and every inventory
            # that shares this one's memo) reuses the CEL matching instead of evaluating it again.
            devices = self.inventory.devices
            hit = self.inventory.cached(("quota-match", exprs), lambda: _match(exprs, devices))
            self._matches[key] = hit
        return hit

    def per_node_max(self, class_name: str, selectors: Sequence[Selector] = ()) -> int | None:
        """Most devices of the class on one node (network-attached devices count as one node)."""
        devs = self.matching(class_name, selectors)
        if not devs:
            return None
        per_node: dict[str | None, int] = {}
        for d in devs:
            per_node[d.node] = per_node.get(d.node, 0) + 1
        return max(per_node.values())

    def charge(self, class_name: str, selectors: Sequence[Selector], mode: str, count: int) -> int:
        """Devices one request (or subrequest) charges to its class, as ResourceQuota counts them."""
        if mode == EXACT_COUNT:
            return max(count, 0)
        if mode == ALL:
            return ALL_MODE_CHARGE
        return 0

    def obtainable(self, class_name: str, selectors: Sequence[Selector], mode: str, count: int) -> int:
        """Devices one request (or subrequest) can actually get: `All` takes every matching device of
        the node it lands on; when the inventory does not know them, the one device it gets at least
        (`unknown_charges` says so)."""
        if mode == ALL:
            n = self.per_node_max(class_name, selectors)
            return n if n is not None else ALL_MODE_LEAST
        return self.charge(class_name, selectors, mode, count)

    def unknown_charges(self, spec: ClaimSpec) -> list[str]:
        """Requests whose GPU-equivalent charge is only a lower bound: `All` requests of a GPU class
        whose devices the inventory does not know, one line each."""
        out: list[str] = []
        for req in spec.requests:
            if req.admin_access:
                continue
            for cls, selectors, mode, _count, _ptr in req.alternatives():
                if (cls and mode == ALL and self.per_node_max(cls, selectors) is None
                        and self.class_fraction(cls) > 0):
                    out.append(f"request {req.name!r} takes every matching device of class {cls} on its "
                               f"node (allocationMode All), counted as {ALL_MODE_LEAST}: the inventory has "
                               "none of its devices to count")
                    break
        return out

    def is_gpu_class(self, class_name: str) -> bool:
        """False when the class's devices are known to be no GPU: its devices in the inventory are
        another driver's, or (none known) its selectors, or those a known driver's installation gives
        it, pin a driver other than the GPU driver."""
        devs = self.matching(class_name)
        if devs:
            return any(d.driver == DRIVER_NAME for d in devs)
        cls = self.class_spec(class_name)
        if cls is not None:
            exprs: list[str] = [s.expression for s in cls.selectors]
        else:
            from ..dra.drivers import installed_class

            installed = installed_class(class_name)
            exprs = [installed] if installed else []
        pins = pinned_drivers(exprs)
        return not pins or DRIVER_NAME in pins

    def claim_gpu_equivalents(self, spec: ClaimSpec) -> Fraction:
        """GPU-equivalents one claim can hold: per request its largest alternative."""
        return Fraction(*self.claim_gpu_ratio(spec))

    def claim_gpu_ratio(self, spec: ClaimSpec) -> tuple[int, int]:
        """`claim_gpu_equivalents` as (numerator, denominator > 0), not reduced: summed in ints,
        since Fraction's arithmetic is Python code and several times slower (MIG classes)."""
        num, den = 0, 1
        for req in spec.requests:
            if req.admin_access:
                continue  # admin access shares devices in use by others: it takes none of its own
            best_n, best_d = 0, 1
            asks = [s.capacity_requests for s in req.first_available] or [req.capacity_requests]
            for (cls, selectors, mode, count, _ptr), ask in zip(req.alternatives(), asks, strict=True):
                if cls:
                    held = self.obtainable(cls, selectors, mode, count)
                    frac = self.request_fraction(cls, selectors, ask)
                    n, d = frac.numerator * held, frac.denominator
                    if n * best_d > best_n * d:
                        best_n, best_d = n, d
            num, den = add_ratio(num, den, best_n, best_d)
        return num, den

    def claim_demand(self, spec: ClaimSpec) -> dict[str, int]:
        """Devices per DeviceClass one claim charges."""
        total: dict[str, int] = {}
        for req in spec.requests:
            per_req: dict[str, int] = {}
            for cls, selectors, mode, count, _ptr in req.alternatives():
                if not cls:
                    continue
                per_req[cls] = max(per_req.get(cls, 0), self.charge(cls, selectors, mode, count))
            for cls, n in per_req.items():
                total[cls] = total.get(cls, 0) + n
        return total

    def request_fraction(
        self, class_name: str, selectors: Sequence[Selector], capacity_requests: Mapping[str, str]
    ) -> Fraction:
        """GPU-equivalents per device one request gets: the class's fraction, unless the devices it
        can get are shared (multi-allocatable), where the share it consumes counts instead."""
        frac = self.class_fraction(class_name)
        if frac == 1 and selectors and not self.matching(class_name):
            # No device of the class is known: the MIG profile the request itself selects is what
            # it gets, not a whole GPU (NVIDIA's MIG examples name the profile in the claim, under
            # the profile-less class mig.nvidia.com). Several named: the largest; a `!=` names none.
            named = [
                mig_fraction(p, f"{class_name} {s.expression}")
                for s in selectors
                if "!=" not in s.expression
                for p in _MIG_PROFILE_ALL.findall(s.expression)
            ]
            if named and None not in named:
                return max(f for f in named if f is not None)
        if not self._is_shared(class_name):
            return frac  # the common case: no shared device anywhere in the class
        key = (class_name, tuple(s.expression for s in selectors), tuple(sorted(capacity_requests.items())))
        hit = self._shares.get(key)
        if hit is None:
            devs = self.matching(class_name, selectors) or []
            hit = max(
                (self.device_share(d, capacity_requests) for d in devs),
                default=frac,
            )
            self._shares[key] = hit
        return hit

    def _is_shared(self, class_name: str) -> bool:
        """Whether any device the class matches is multi-allocatable."""
        hit = self._shared.get(class_name)
        if hit is None:
            hit = any(d.allow_multiple_allocations for d in self.matching(class_name) or ())
            self._shared[class_name] = hit
        return hit

    def device_share(self, device: Device, capacity_requests: Mapping[str, str]) -> Fraction:
        """GPU-equivalents one allocation of `device` takes."""
        base = self.device_equivalents(device)
        if device.allow_multiple_allocations:
            return base * share_fraction(device, capacity_requests)
        return base

    def device_equivalents(self, device: Device) -> Fraction:
        """A whole device in GPU-equivalents: a counter-consuming partition by its counters, else
        `device_fraction`."""
        part = partition_fraction(device, self.inventory.counter_sets) if device.consumes_counters else None
        return part if part is not None else device_fraction(device)

    def class_fraction(self, class_name: str) -> Fraction:
        """GPU-equivalents per device of a class.

        From the inventory: the largest fraction among the devices the class matches (a request may
        land on the biggest). Without devices: a MIG profile named in the class's selectors, then
        in the class name (`...-mig-3g20gb`), else a full GPU.
        """
        if class_name in self._fractions:
            return self._fractions[class_name]
        cls = self.class_spec(class_name)
        key = ("quota-fraction", class_name, tuple(s.expression for s in cls.selectors) if cls else None)
        result: Fraction = self.inventory.cached(key, lambda: self._class_fraction(class_name))
        self._fractions[class_name] = result
        return result

    def _class_fraction(self, class_name: str) -> Fraction:
        frac: Fraction | None = None
        devs = self.matching(class_name)
        if devs:
            frac = max(self.device_equivalents(d) for d in devs)
        elif not self.is_gpu_class(class_name):
            return Fraction(0)  # a NIC, an IMEX channel, another driver's device: no GPU
        if frac is None:
            cls = self.class_spec(class_name)
            for sel in cls.selectors if cls else ():
                m = _MIG_PROFILE.search(sel.expression)
                if m:
                    frac = mig_fraction(m.group(0), f"{class_name} {sel.expression}")
                    break
        if frac is None:
            m2 = _MIG_IN_NAME.search(class_name.lower())
            if m2:
                frac = mig_fraction(f"{m2.group(1)}g.{m2.group(2)}gb", class_name)
        return frac if frac is not None else Fraction(1)

    def gpu_equivalents(self, demand: Mapping[str, int]) -> Fraction:
        return sum((self.class_fraction(c) * n for c, n in demand.items()), Fraction(0))


def inventory_calculator(inventory: Inventory) -> QuotaCalculator:
    """The calculator kept on the inventory's memo: one per set of devices and classes, shared by the
    quota rule, the server's usage and DRA statistics (and by inventories that share the memo)."""
    return inventory.cached(("quota-calculator",), lambda: QuotaCalculator(inventory, inventory.classes))


def claim_demand(spec: ClaimSpec, inventory: Inventory) -> dict[str, int]:
    """Devices per DeviceClass a claim charges (see the module docstring for the counting rules)."""
    return QuotaCalculator(inventory).claim_demand(spec)


def gpu_equivalents(class_name: str, devices: int, inventory: Inventory) -> float:
    """`devices` devices of `class_name` in GPU-equivalents (3 x 3g.20gb = 9/7)."""
    return float(QuotaCalculator(inventory).class_fraction(class_name) * devices)


def scopes_of(namespace: str, namespace_labels: Mapping[str, Mapping[str, str]],
              team_labels: Iterable[str] = (TEAM_LABEL,)) -> list[str]:
    """Usage scopes a namespace's consumption counts toward: itself, and its team(s) if labelled."""
    out = [namespace]
    labels = namespace_labels.get(namespace, {})
    for key in team_labels:
        team = labels.get(key)
        if team and team_scope(team) not in out:
            out.append(team_scope(team))
    return out


@dataclass(frozen=True, slots=True)
class ClaimCharge:
    """What one ResourceClaim charges: devices per DeviceClass and GPU-equivalents, in its namespace."""

    namespace: str
    devices: Mapping[str, int]
    gpu_equivalents: Fraction
    # (numerator, denominator) of gpu_equivalents: summing thousands of charges hashes these, and
    # hashing a tuple of ints is far cheaper than hashing a Fraction.
    gpu_key: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        ge = self.gpu_equivalents
        object.__setattr__(self, "gpu_key", (ge.numerator, ge.denominator))


def charge_of(namespace: str, spec: ClaimSpec, calc: QuotaCalculator) -> ClaimCharge:
    """The charge of one claim spec. Depends on the claim and on the calculator's devices and
    classes only, so a caller may keep it for as long as both are unchanged."""
    return ClaimCharge(namespace or "default", calc.claim_demand(spec), calc.claim_gpu_equivalents(spec))


def claim_charge(obj: Mapping[str, Any], calc: QuotaCalculator) -> ClaimCharge | None:
    """The charge of a ResourceClaim object (as cached by the server); None for anything else."""
    if not isinstance(obj, Mapping) or obj.get("kind") not in (None, "ResourceClaim"):
        return None
    # Items of a raw API list carry no apiVersion/kind: they are v1 ResourceClaims.
    read = claim_spec_of(
        {**obj, "kind": "ResourceClaim", "apiVersion": obj.get("apiVersion") or "resource.k8s.io/v1"}
    )
    if read is None:
        return None
    return charge_of(as_str(as_map(obj.get("metadata")).get("namespace")) or "default", read[0], calc)


def team_labels_of(policies: PolicySet | None) -> list[str]:
    """The namespace labels that name a team: each GpuQuotaPolicy's team label, else the default."""
    return sorted({p.team_label for p in policies.quota} if policies else set()) or [TEAM_LABEL]


def usage_from_charges(
    charges: Iterable[ClaimCharge],
    namespace_labels: Mapping[str, Mapping[str, str]],
    team_labels: Iterable[str] = (TEAM_LABEL,),
) -> QuotaUsage:
    """Sum claim charges per namespace, then per team (a namespace's team label)."""
    # Per namespace first: one addition per claim, whatever the number of scopes it counts toward;
    # GPU-equivalents are counted per distinct fraction, since Fraction arithmetic is slow.
    ns_devices: dict[str, dict[str, int]] = {}
    ns_fracs: dict[str, dict[tuple[int, int], int]] = {}
    ns_count: dict[str, int] = {}
    for c in charges:
        devs = ns_devices.setdefault(c.namespace, {})
        for cls, n in c.devices.items():
            devs[cls] = devs.get(cls, 0) + n
        fr = ns_fracs.setdefault(c.namespace, {})
        fr[c.gpu_key] = fr.get(c.gpu_key, 0) + 1
        ns_count[c.namespace] = ns_count.get(c.namespace, 0) + 1
    labels_keys = tuple(team_labels)
    devices: dict[tuple[str, str], int] = {}
    geq: dict[str, Fraction] = {}
    count: dict[str, int] = {}
    for ns, n_claims in ns_count.items():
        ns_geq = sum((Fraction(num * k, den) for (num, den), k in ns_fracs[ns].items()), Fraction(0))
        for scope in scopes_of(ns, namespace_labels, labels_keys):
            for cls, n in ns_devices[ns].items():
                devices[(scope, cls)] = devices.get((scope, cls), 0) + n
            geq[scope] = geq.get(scope, Fraction(0)) + ns_geq
            count[scope] = count.get(scope, 0) + n_claims
    return QuotaUsage(devices=devices, gpu_equivalents={k: float(v) for k, v in geq.items()}, claims=count)


def compute_usage(
    claims: Iterable[Mapping[str, Any]],
    namespace_labels: Mapping[str, Mapping[str, str]],
    policies: PolicySet | None = None,
    inventory: Inventory | None = None,
) -> QuotaUsage:
    """Live usage from ResourceClaim objects (as cached by the server), per namespace and per team.

    Every existing claim counts, allocated or not, like a ResourceQuota does. Teams are read from
    the team label of each GpuQuotaPolicy (default `draguard.io/team`).
    """
    calc = QuotaCalculator(inventory or Inventory.empty())
    charges = (claim_charge(obj, calc) for obj in claims)
    return usage_from_charges(
        (c for c in charges if c is not None), namespace_labels, team_labels_of(policies)
    )


def budget_applies(b: QuotaBudget, pol: GpuQuotaPolicy, namespace: str,
                   labels: Mapping[str, str] | None) -> str | None:
    """The usage scope a budget charges for this namespace, or None when it does not apply."""
    if b.scope == "namespace":
        return namespace if glob_match(b.name, namespace) else None
    team = (labels or {}).get(pol.team_label)
    if b.scope == "default":
        others = any(o.scope == "namespace" and glob_match(o.name, namespace) for o in pol.budgets)
        return namespace if not team and not others else None
    if team and (b.name == "*" or glob_match(b.name, team)):
        return team_scope(team)
    return None


def budget_group(policies: PolicySet, namespace: str, labels: Mapping[str, str] | None) -> str | None:
    """The group whose ledger holds this namespace's claims when an enforced budget covers it:
    `team:<team>` for a namespace with a team label (so every scope one claim charges, its namespace
    and its team, lives in one ledger), else the namespace. None when no enforced budget applies."""
    covered = any(
        budget_applies(b, pol, namespace, labels) is not None
        for pol in policies.quota if pol.mode is Mode.ENFORCE for b in pol.budgets
    )
    if not covered:
        return None
    for key in team_labels_of(policies):
        team = (labels or {}).get(key)
        if team:
            return team_scope(team)
    return namespace


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def render_resource_quotas(
    policies: PolicySet | Sequence[GpuQuotaPolicy], namespaces: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """Native ResourceQuota objects for the namespace budgets of GpuQuotaPolicies.

    Each namespace budget becomes `draguard-<policy>` in that namespace with
    `<class>.deviceclass.resource.k8s.io/devices` per class and `count/resourceclaims.resource.k8s.io`.
    A namespace glob is expanded over `namespaces` when given (else skipped). What a ResourceQuota
    cannot express (team budgets, GPU-equivalents, class globs) stays with the webhook; see
    `unrenderable()` for the list.
    """
    quota_policies = policies.quota if isinstance(policies, PolicySet) else tuple(policies)
    known = sorted(set(namespaces or ()))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for pol in quota_policies:
        for b in pol.budgets:
            if b.scope == "default":
                # Namespaces given that no namespace budget of the policy names (labels unknown here).
                targets = [n for n in known if budget_applies(b, pol, n, None) is not None]
            elif b.scope != "namespace":
                continue
            else:
                targets = [n for n in known if glob_match(b.name, n)] if _is_glob(b.name) else [b.name]
            hard: dict[str, str] = {}
            for cls, n in sorted(b.device_classes.items()):
                if not _is_glob(cls):
                    hard[QUOTA_DEVICES_KEY.format(cls=cls)] = str(n)
            if b.claims is not None:
                hard[QUOTA_CLAIMS_KEY] = str(b.claims)
            if not hard:
                continue
            for ns in targets:
                name = f"draguard-{pol.name}"
                rq = out.setdefault((ns, name), {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "labels": {"app.kubernetes.io/managed-by": "draguard"},
                        "annotations": {"draguard.io/policy": pol.name},
                    },
                    "spec": {"hard": {}},
                })
                current = rq["spec"]["hard"]
                for key, val in hard.items():
                    # Several budgets on one namespace: the tighter one wins, as two quotas would.
                    current[key] = str(min(int(current[key]), int(val))) if key in current else val
                if b.gpu_equivalents is not None:
                    rq["metadata"]["annotations"]["draguard.io/gpu-equivalents"] = f"{b.gpu_equivalents:g}"
    return [out[k] for k in sorted(out)]


def unrenderable(
    policies: PolicySet | Sequence[GpuQuotaPolicy], namespaces: Iterable[str] | None = None
) -> list[str]:
    """Budget parts `render_resource_quotas` leaves to the webhook, one line each."""
    quota_policies = policies.quota if isinstance(policies, PolicySet) else tuple(policies)
    known = set(namespaces or ())
    notes: list[str] = []
    for pol in quota_policies:
        for b in pol.budgets:
            where = f"GpuQuotaPolicy {pol.name} budget {b.scope}/{b.name}"
            if b.scope == "default":
                notes.append(
                    f"{where}: the default budget covers namespaces without a team label that no namespace "
                    "budget names; rendered only for the --namespace values given (their labels unknown here)"
                )
            elif b.scope != "namespace":
                notes.append(f"{where}: team budgets span namespaces; a ResourceQuota cannot express them")
                continue
            if b.scope == "namespace" and _is_glob(b.name) and not any(glob_match(b.name, n) for n in known):
                notes.append(f"{where}: namespace pattern matched no namespace given (pass --namespace)")
            for cls in b.device_classes:
                if _is_glob(cls):
                    notes.append(f"{where}: class pattern {cls!r} has no ResourceQuota key")
            if b.gpu_equivalents is not None:
                notes.append(f"{where}: gpuEquivalents {b.gpu_equivalents:g} is enforced by the webhook only")
        if any(b.device_classes for b in pol.budgets):
            notes.append(
                f"GpuQuotaPolicy {pol.name}: device-plugin GPUs (nvidia.com/gpu, nvidia.com/mig-*) count "
                "against class budgets in the webhook only; a ResourceQuota counts DRA claims alone"
            )
    return notes
