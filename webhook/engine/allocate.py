"""Whether a claim can be allocated, judged as the scheduler judges it: the whole claim on one node.

Pure: a claim spec, the inventory and the known DeviceClasses in; a `Verdict` out. Every request
(and, for `firstAvailable`, the subrequests in their order) is satisfied together with the others:
`matchAttribute`/`distinctAttribute` constraints, shared counters (partitionable devices),
consumable capacity rounded by each device's request policy, taints (NoSchedule/NoExecute block
unless tolerated; None never does; DeviceTaintRules included), admin access, and the devices
other claims already hold (their `status.allocation`). The search backtracks and is bounded in
steps: past the bound the answer is "too large to decide offline", never a guess.

`explain` and `structure/unsatisfiable` call `allocate`; nothing else decides allocatability.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import TypeVar

from ..dra.capacity import consumed as consumed_by
from ..dra.capacity import parse_quantity, violates
from ..dra.device import AttrValue, Device
from ..dra.inventory import Inventory
from ..dra.nodes import named_nodes, selector_matches
from ..dra.objects import ALL, EXACT_COUNT, ClaimSpec, DeviceClassSpec, qualify, read_allocation
from ..dra.quantity import Quantity
from ..dra.taints import NO_EXECUTE, DeviceTaint, DeviceToleration, eviction, untolerated

T = TypeVar("T")
_K = TypeVar("_K")
_V = TypeVar("_V")

# Devices tried, over all nodes, before a claim is "too large to decide offline".
MAX_STEPS = 200_000
# Reasons listed per failed request before the rest are counted.
_MAX_LISTED = 4

DeviceKey = tuple[str, str, str]
CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter
CapKey = tuple[DeviceKey, str, str]  # device, domain, capacity


@dataclass(frozen=True, slots=True)
class Choice:
    """One way to satisfy a request: the request itself or one of its subrequests."""

    request: str  # the top-level request's name
    sub: str | None
    device_class: str | None
    selectors: tuple[str, ...]
    mode: str
    count: int
    admin_access: bool
    tolerations: tuple[DeviceToleration, ...]
    capacity_requests: Mapping[str, str]

    @property
    def name(self) -> str:
        """The name allocation results and constraints use: "req" or "req/sub"."""
        return f"{self.request}/{self.sub}" if self.sub else self.request


@dataclass(frozen=True, slots=True)
class Pick:
    request: str  # "req" or "req/sub"
    device: Device
    consumed: Mapping[str, str] = field(default_factory=dict)  # qualified capacity -> amount


@dataclass(frozen=True, slots=True)
class Verdict:
    """`allocatable`: True (some node can), False (none can), None (cannot be decided offline)."""

    allocatable: bool | None
    nodes: tuple[str | None, ...] = ()  # nodes that can host the claim (None: not bound to a node)
    picks: tuple[Pick, ...] = ()  # the devices it would get on the first of them
    reasons: tuple[str, ...] = ()  # why not, or why it cannot be decided
    notes: tuple[str, ...] = ()  # what the verdict does not model for this claim
    unsure: tuple[str | None, ...] = ()  # nodes where the answer cannot be decided offline


def _evictions(
    inventory: Inventory,
    choices: list[list[Choice]],
    candidates: Mapping[tuple[int, int], Sequence[Device]],
    picks: tuple[Pick, ...],
    node: str | None,
) -> list[str]:
    """What Kubernetes' device taint eviction controller would do to a pod given these devices.

    The picks are one allocation; the scheduler may choose another among the matching devices on the
    node (within a pool it goes by slice name, which the inventory does not keep), so a matching device
    it could allocate there and the controller would evict for is named too.
    """
    out: list[str] = []
    picked = {(p.request, p.device.key) for p in picks}
    for i, alts in enumerate(choices):
        for j, ch in enumerate(alts):
            for p in picks:
                if p.request != ch.name:
                    continue
                hit = eviction(inventory.taints_of(p.device), ch.tolerations)
                if hit is not None:
                    out.append(f"request {ch.name!r} gets {p.device.name}, {_eviction_text(*hit)}")
            for d in candidates.get((i, j), ()):
                if (ch.name, d.key) in picked or _reachable(d, node, inventory) is not True:
                    continue
                taints = inventory.taints_of(d)
                hit = None if untolerated(taints, ch.tolerations) else eviction(taints, ch.tolerations)
                if hit is not None:
                    out.append(f"request {ch.name!r} may get {d.name} instead (the scheduler's choice among "
                               f"the matching devices), {_eviction_text(*hit)}")  # fmt: skip
                    break  # one device names the risk for the request
    return list(dict.fromkeys(out))


def _eviction_text(taint: DeviceTaint, seconds: int) -> str:
    if seconds:
        return (f"tainted {taint.describe()}: the device taint eviction controller deletes the pod "
                f"{seconds} s after the taint was added (the toleration's tolerationSeconds)")  # fmt: skip
    return (f"tainted {taint.describe()}: the device taint eviction controller deletes the pod as soon as it "
            "is scheduled; no toleration of the request names effect NoExecute (one without an effect lets "
            "the scheduler allocate the device, not the pod stay)")  # fmt: skip


class _TooLarge(Exception):
    pass


def choices_of(spec: ClaimSpec) -> list[list[Choice]]:
    """Per request, its ways to be satisfied in the order the scheduler tries them."""
    out: list[list[Choice]] = []
    for req in spec.requests:
        if req.first_available:
            out.append(
                [
                    Choice(
                        req.name,
                        s.name,
                        s.device_class,
                        tuple(x.expression for x in s.selectors),
                        s.allocation_mode,
                        s.count,
                        False,
                        s.tolerations,
                        s.capacity_requests,
                    )
                    for s in req.first_available
                ]
            )
        else:
            out.append(
                [
                    Choice(
                        req.name,
                        None,
                        req.device_class,
                        tuple(x.expression for x in req.selectors),
                        req.allocation_mode,
                        req.count,
                        req.admin_access,
                        req.tolerations,
                        req.capacity_requests,
                    )
                ]
            )
    return out


def _match(expressions: Sequence[str], devices: Sequence[Device]) -> list[Device] | None:
    from ..cel.match import match_devices  # the CEL runtime loads on first use

    result = match_devices(expressions, devices)
    return None if result.undecided else list(result.matched)


def _attribute(device: Device, qualified: str) -> AttrValue | tuple[AttrValue, ...] | None:
    dom, _, name = qualified.rpartition("/")
    value = device.attributes.get(dom, {}).get(name)
    if value is not None:
        return value
    return device.list_attributes.get(dom, {}).get(name)


def _q(text: str) -> Fraction | None:
    q = parse_quantity(text)
    return None if q is None else q.value


def _fmt(value: Fraction) -> str:
    binary = value.denominator == 1 and value >= 1024 and value % 1024 == 0
    return str(Quantity(value, binary))


class _Baseline:
    """What other claims already hold: devices in use, counters and capacity consumed."""

    taken: Mapping[DeviceKey, str]  # device -> "ns/claim" holding it exclusively
    shared: Collection[DeviceKey]  # multi-allocatable devices with some share allocated
    capacity: Mapping[CapKey, Fraction]
    capacity_of: Mapping[DeviceKey, Sequence[tuple[str, str, Fraction]]]
    counters: Mapping[CounterKey, Fraction]

    def __init__(
        self, inventory: Inventory, by_key: Mapping[DeviceKey, Device], skip: tuple[str, str] | None
    ) -> None:
        taken: dict[DeviceKey, str] = {}
        shared: set[DeviceKey] = set()
        capacity: dict[CapKey, Fraction] = {}
        capacity_of: dict[DeviceKey, list[tuple[str, str, Fraction]]] = {}
        counters: dict[CounterKey, Fraction] = {}
        # Who contributed what, so one claim's share can be taken out again (`_without`):
        self.holders: dict[DeviceKey, list[str]] = {}  # exclusive holders, in the order above
        self.results: dict[DeviceKey, int] = {}  # results per device (shares included)
        self.shares: dict[DeviceKey, int] = {}
        self.cap_adds: dict[CapKey, int] = {}  # additions to each capacity sum
        self.counter_adds: dict[CounterKey, int] = {}  # and to each counter sum
        charged: set[DeviceKey] = set()
        for (ns, name), rec in inventory.claims.items():
            if (ns, name) == skip:
                continue
            for a in read_allocation(rec.obj):
                dev = by_key.get(a.key)
                if a.admin_access or dev is None:
                    continue  # admin access leaves a device free for others
                self.results[a.key] = self.results.get(a.key, 0) + 1
                # The scheduler counts a result as a share only when it carries a shareID; any
                # other result holds the device whole, multi-allocatable or not.
                if dev.allow_multiple_allocations and a.share_id is not None:
                    shared.add(a.key)
                    self.shares[a.key] = self.shares.get(a.key, 0) + 1
                    for k, text in a.consumed_capacity.items():
                        dom, cap = qualify(k, dev.driver)
                        amount = _q(text)
                        if amount is not None:
                            ck = (a.key, dom, cap)
                            capacity[ck] = capacity.get(ck, Fraction(0)) + amount
                            self.cap_adds[ck] = self.cap_adds.get(ck, 0) + 1
                            capacity_of.setdefault(a.key, []).append((dom, cap, amount))
                else:
                    taken[a.key] = f"{ns}/{name}"
                    self.holders.setdefault(a.key, []).append(f"{ns}/{name}")
                if a.key not in charged:  # a shared device's counters are charged once
                    charged.add(a.key)
                    for use in dev.consumes_counters:
                        for counter, text in use.counters.items():
                            amount = _q(text)
                            if amount is not None:
                                key = (dev.driver, dev.pool, use.counter_set, counter)
                                counters[key] = counters.get(key, Fraction(0)) + amount
                                self.counter_adds[key] = self.counter_adds.get(key, 0) + 1
        self.taken, self.shared, self.capacity = taken, shared, capacity
        self.capacity_of, self.counters = capacity_of, counters


_GONE = object()


class _Changed(Mapping[_K, _V]):
    """`base` with a few entries replaced or removed, without copying it (one claim's share out)."""

    def __init__(self, base: Mapping[_K, _V], changed: Mapping[_K, object]) -> None:
        self.base, self.changed = base, changed
        self._len = len(base) + sum((v is not _GONE) - (k in base) for k, v in changed.items())

    def __getitem__(self, key: _K) -> _V:
        if key in self.changed:
            v = self.changed[key]
            if v is _GONE:
                raise KeyError(key)
            return v  # type: ignore[return-value]
        return self.base[key]

    def __iter__(self) -> Iterator[_K]:
        yield from (k for k in self.base if self.changed.get(k, None) is not _GONE)
        yield from (k for k, v in self.changed.items() if v is not _GONE and k not in self.base)

    def __len__(self) -> int:
        return self._len


def _without(
    full: _Baseline, inventory: Inventory, by_key: Mapping[DeviceKey, Device], skip_key: tuple[str, str]
) -> _Baseline:
    """`full` as it would be had claim `skip_key` no allocation: only its own devices are
    worked out again, so a verdict on one allocated claim costs what that claim holds, not what every
    claim holds. Equal to building the baseline without it (tests/engine/test_allocate.py)."""
    skip = f"{skip_key[0]}/{skip_key[1]}"
    rec = inventory.claims[skip_key]
    own: list[tuple[DeviceKey, Device, bool, dict[str, str]]] = []
    for a in read_allocation(rec.obj):
        dev = by_key.get(a.key)
        if not a.admin_access and dev is not None:
            share = dev.allow_multiple_allocations and a.share_id is not None
            own.append((a.key, dev, share, dict(a.consumed_capacity)))
    taken: dict[DeviceKey, object] = {}
    shared_out: set[DeviceKey] = set()
    lefts: dict[DeviceKey, list[tuple[str, str, Fraction]]] = {}
    cap_minus: dict[CapKey, tuple[Fraction, int]] = {}
    counter_minus: dict[CounterKey, tuple[Fraction, int]] = {}
    results: dict[DeviceKey, int] = {}
    shares: dict[DeviceKey, int] = {}
    for key, dev, share, consumed in own:
        results[key] = results.get(key, 0) + 1
        if share:
            shares[key] = shares.get(key, 0) + 1
            left = lefts.setdefault(key, list(full.capacity_of.get(key, ())))
            for k, text in consumed.items():
                dom, cap = qualify(k, dev.driver)
                amount = _q(text)
                if amount is not None:
                    ck = (key, dom, cap)
                    m = cap_minus.get(ck, (Fraction(0), 0))
                    cap_minus[ck] = (m[0] + amount, m[1] + 1)
                    left.remove((dom, cap, amount))
        else:
            rest = [h for h in full.holders.get(key, ()) if h != skip]
            taken[key] = rest[-1] if rest else _GONE
    for key, n in shares.items():
        if full.shares.get(key, 0) - n <= 0:
            shared_out.add(key)
    for key, n in results.items():
        if full.results.get(key, 0) - n > 0:
            continue  # another claim's result still charges the device's counters
        dev = by_key[key]
        for use in dev.consumes_counters:
            for counter, text in use.counters.items():
                amount = _q(text)
                if amount is not None:
                    ck2 = (dev.driver, dev.pool, use.counter_set, counter)
                    m = counter_minus.get(ck2, (Fraction(0), 0))
                    counter_minus[ck2] = (m[0] + amount, m[1] + 1)
    out = object.__new__(_Baseline)
    out.taken = _Changed(full.taken, taken)
    out.shared = _SetLess(full.shared, shared_out)
    out.capacity = _Changed(full.capacity, _less(full.capacity, cap_minus, full.cap_adds))
    out.capacity_of = _Changed(full.capacity_of, {k: v if v else _GONE for k, v in lefts.items()})
    out.counters = _Changed(full.counters, _less(full.counters, counter_minus, full.counter_adds))
    return out


def _less(
    base: Mapping[_K, Fraction], minus: Mapping[_K, tuple[Fraction, int]], adds: Mapping[_K, int]
) -> dict[_K, object]:
    """Sums with some additions taken back; a sum nothing else added to is gone, as if never made."""
    return {k: _GONE if adds.get(k, 0) - n <= 0 else base[k] - amount for k, (amount, n) in minus.items()}


class _SetLess(Collection[_K]):
    """`base` without `removed`, without copying it."""

    def __init__(self, base: Collection[_K], removed: set[_K]) -> None:
        self.base, self.removed = base, removed
        self._len = len(base) - sum(1 for k in removed if k in base)

    def __contains__(self, key: object) -> bool:
        return key in self.base and key not in self.removed

    def __iter__(self) -> Iterator[_K]:
        return (k for k in self.base if k not in self.removed)

    def __len__(self) -> int:
        return self._len


def _baseline(
    inventory: Inventory, by_key: Mapping[DeviceKey, Device], skip: tuple[str, str] | None
) -> _Baseline:
    """What other claims hold, built once per inventory (its claims and devices) and shared by every
    verdict; for an allocated claim, its own devices are taken out of it (`_without`). The audit and
    the webhook judge claim after claim against one inventory; building this for each made a scan's
    cost grow with the square of the claims."""
    claims = inventory.claims
    # The memo may be carried over to an inventory with other claims: the entry keeps the objects it
    # was built from (so their ids cannot be reused meanwhile) and is used only for those.
    hit = inventory.cached(
        ("allocate", "baseline", id(claims), id(by_key)),
        lambda: (claims, by_key, _Baseline(inventory, by_key, None)),
    )
    full = hit[2] if hit[0] is claims and hit[1] is by_key else _Baseline(inventory, by_key, None)
    if skip is not None:
        rec = claims.get(skip)
        if rec is not None and read_allocation(rec.obj):
            return _without(full, inventory, by_key, skip)
    return full


class _Search:
    """The backtracking search of one claim on one node."""

    def __init__(
        self,
        inventory: Inventory,
        spec: ClaimSpec,
        choices: list[list[Choice]],
        candidates: Mapping[tuple[int, int], list[Device]],
        baseline: _Baseline,
        budget: list[int],
    ) -> None:
        self.inv = inventory
        self.choices = choices
        self.candidates = candidates
        self.base = baseline
        self.budget = budget
        self.used: set[DeviceKey] = set()  # exclusive devices this claim took
        self.shares: set[DeviceKey] = set()  # multi-allocatable devices this claim took a share of
        self.counters: dict[CounterKey, Fraction] = {}
        self.capacity: dict[CapKey, Fraction] = {}
        # (requests covered, attribute, distinct?) -> values picked so far
        self.constraints = [
            (
                frozenset(c.requests),
                c.match_attribute or c.distinct_attribute or "",
                c.distinct_attribute is not None,
            )
            for c in spec.constraints
            if c.match_attribute or c.distinct_attribute
        ]
        self.values: list[list[AttrValue | tuple[AttrValue, ...]]] = [[] for _ in self.constraints]
        self.picks: list[Pick] = []
        self.constraint_failed = False  # set by why_not when a constraint refused the device
        self.refusal: str | None = None  # where the scheduler would stop with an error, if it got there
        # (request, why without the device's name) -> devices refused for it
        self.rejections: dict[tuple[str, str], list[str]] = {}

    # -- one device ----------------------------------------------------------------------------

    def why_not(self, dev: Device, choice: Choice) -> str | None:
        """Why `dev` cannot serve `choice` now, or None when it can."""
        key = dev.key
        multi = dev.allow_multiple_allocations
        if not multi and key in self.used:
            return f"{dev.name} is already taken by another request of this claim"
        holder = self.base.taken.get(key)
        if holder is not None and not choice.admin_access:
            return f"{dev.name} is allocated to claim {holder}"
        in_use = multi and (key in self.base.shared or key in self.shares)
        if dev.consumes_counters and not in_use:
            for use in dev.consumes_counters:
                for counter, text in use.counters.items():
                    ck = (dev.driver, dev.pool, use.counter_set, counter)
                    total_text = self.inv.counter_sets.get(ck[:3], {}).get(counter)
                    if total_text is None:
                        return (
                            f"{dev.name} consumes counter {use.counter_set}/{counter}, "
                            f"which pool {dev.pool} does not publish"
                        )
                    need, total = _q(text), _q(total_text)
                    if need is None or total is None:
                        return f"{dev.name}: counter {use.counter_set}/{counter} is not a quantity"
                    spent = self.base.counters.get(ck, Fraction(0)) + self.counters.get(ck, Fraction(0))
                    if spent + need > total:
                        return (f"{dev.name} needs {_fmt(need)} of counter {use.counter_set}/{counter}; "
                                f"{_fmt(total - spent)} of {_fmt(total)} left")  # fmt: skip
        blocked = untolerated(self.inv.taints_of(dev), choice.tolerations)
        if blocked:
            return f"{dev.name} has taint {blocked[0].describe()}, which the request does not tolerate"
        for i, (covered, attr, distinct) in enumerate(self.constraints):
            if covered and choice.request not in covered and choice.name not in covered:
                continue
            value = _attribute(dev, attr)
            if value is None:
                self.constraint_failed = True
                return f"{dev.name} does not publish {attr}, which a constraint needs"
            seen = self.values[i]
            if distinct and value in seen:
                self.constraint_failed = True
                return f"{dev.name} repeats {attr}={value} (distinctAttribute)"
            if not distinct and seen and not _same(seen[0], value):
                self.constraint_failed = True
                return f"{dev.name} has {attr}={value}, not {seen[0]} (matchAttribute)"
        return self._capacity(dev, choice)[0]

    def fits_alone(self, dev: Device, choice: Choice) -> bool:
        """Whether the device's capacity could ever serve the request (nothing consumed yet): the
        scheduler's test for which devices "all" means."""
        return self._capacity(dev, choice, static=True)[0] is None

    def _capacity(
        self, dev: Device, choice: Choice, static: bool = False
    ) -> tuple[str | None, dict[CapKey, Fraction]]:
        wanted: dict[tuple[str, str], str] = {}
        for k, text in choice.capacity_requests.items():
            wanted[qualify(k, dev.driver)] = text
        for dom, name in wanted:
            if name not in dev.capacity.get(dom, {}):
                return f"{dev.name} has no capacity {dom}/{name}", {}
        out: dict[CapKey, Fraction] = {}
        for dom, caps in dev.capacity.items():
            for name, text in caps.items():
                value = parse_quantity(text)
                if value is None:
                    continue
                req_text = wanted.get((dom, name))
                requested = parse_quantity(req_text) if req_text is not None else None
                if req_text is not None and requested is None:
                    return f"capacity request {name}: {req_text!r} is not a quantity", {}
                policy = dev.capacity_policy.get(dom, {}).get(name)
                amount = consumed_by(requested, value, policy)
                bad = violates(amount, policy)
                if bad is not None:
                    return f"{dev.name} capacity {name}: {bad}", {}
                ck = (dev.key, dom, name)
                used = Fraction(0)
                if not static:  # the test of whether the device could ever serve the request
                    used = self.base.capacity.get(ck, Fraction(0)) + self.capacity.get(ck, Fraction(0))
                if used + amount.value > value.value:
                    left = value.value - used
                    return (f"{dev.name} capacity {name}: needs {amount}, {_fmt(left)} of {value} left"), {}
                out[ck] = amount.value
        return None, out

    def take(self, dev: Device, choice: Choice) -> Pick:
        _, caps = self._capacity(dev, choice)
        key = dev.key
        if dev.allow_multiple_allocations:
            first_share = key not in self.base.shared and key not in self.shares
            if first_share:
                self.shares.add(key)
        else:
            first_share = True
            self.used.add(key)
        if first_share:
            for use in dev.consumes_counters:
                for counter, text in use.counters.items():
                    ck = (dev.driver, dev.pool, use.counter_set, counter)
                    self.counters[ck] = self.counters.get(ck, Fraction(0)) + (_q(text) or Fraction(0))
        for cap_key, amount in caps.items():
            self.capacity[cap_key] = self.capacity.get(cap_key, Fraction(0)) + amount
        for i, (covered, attr, _distinct) in enumerate(self.constraints):
            if not covered or choice.request in covered or choice.name in covered:
                value = _attribute(dev, attr)
                if value is not None:
                    self.values[i].append(value)
        shown = (
            {f"{dom}/{name}" if dom != dev.driver else name: _fmt(a) for (_, dom, name), a in caps.items()}
            if dev.allow_multiple_allocations
            else {}
        )
        pick = Pick(choice.name, dev, shown)
        self.picks.append(pick)
        # What `undo` needs: whether this pick charged the counters.
        self._undo_stack.append((dev, choice, caps, first_share))
        return pick

    _undo_stack: list[tuple[Device, Choice, dict[CapKey, Fraction], bool]]

    def undo(self) -> None:
        dev, choice, caps, first_share = self._undo_stack.pop()
        self.picks.pop()
        key = dev.key
        if dev.allow_multiple_allocations:
            if first_share:
                self.shares.discard(key)
        else:
            self.used.discard(key)
        if first_share:
            for use in dev.consumes_counters:
                for counter, text in use.counters.items():
                    ck = (dev.driver, dev.pool, use.counter_set, counter)
                    self.counters[ck] -= _q(text) or Fraction(0)
        for cap_key, amount in caps.items():
            self.capacity[cap_key] -= amount
        for i, (covered, _attr, _distinct) in enumerate(self.constraints):
            covers = not covered or choice.request in covered or choice.name in covered
            if covers and _attribute(dev, _attr) is not None:
                self.values[i].pop()

    # -- the search ----------------------------------------------------------------------------

    def run(self) -> bool:
        self._undo_stack = []
        return self._request(0)

    def _request(self, i: int) -> bool:
        if i == len(self.choices):
            return True
        for j, choice in enumerate(self.choices[i]):
            devices = self.candidates.get((i, j), [])
            if choice.mode == ALL:
                if devices and self._all(i, choice, devices):
                    return True
                continue
            if self._devices(i, choice, devices, 0, choice.count):
                return True
        return False

    def _all(self, i: int, choice: Choice, devices: Sequence[Device]) -> bool:
        taken = 0
        ok = True
        for dev in devices:
            self.constraint_failed = False
            if not self._step(dev, choice):
                if self.constraint_failed and self.refusal is None:
                    # The scheduler does not backtrack here: a claim whose constraint rules out
                    # one of the devices "All" names is an error for it, the claim is refused. It
                    # meets this only if it tried the same devices first (its order of a pool's
                    # slices is by name, which the inventory does not keep), so the search goes on
                    # to learn whether another choice would fit.
                    self.refusal = (
                        f"request {choice.name!r} (allocationMode All): {dev.name} breaks the claim's "
                        "constraint, and the scheduler refuses a claim when that happens"
                    )
                ok = False
                break
            self.take(dev, choice)
            taken += 1
        if ok and self._request(i + 1):
            return True
        for _ in range(taken):
            self.undo()
        return False

    def _step(self, dev: Device, choice: Choice) -> bool:
        self.budget[0] -= 1
        if self.budget[0] < 0:
            raise _TooLarge
        why = self.why_not(dev, choice)
        if why is not None:
            _, rest = _split(dev, why)
            names = self.rejections.setdefault((choice.name, rest), [])
            if dev.name not in names:
                names.append(dev.name)
            return False
        return True

    def _devices(self, i: int, choice: Choice, devices: Sequence[Device], start: int, left: int) -> bool:
        if left == 0:
            return self._request(i + 1)
        for k in range(start, len(devices) - left + 1):
            dev = devices[k]
            if not self._step(dev, choice):
                continue
            self.take(dev, choice)
            if self._devices(i, choice, devices, k + 1, left - 1):
                return True
            self.undo()
        return False


def _same(a: AttrValue | tuple[AttrValue, ...], b: AttrValue | tuple[AttrValue, ...]) -> bool:
    """matchAttribute: equal scalars, or (list-typed attributes) lists that share a value."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        sa = set(a) if isinstance(a, tuple) else {a}
        sb = set(b) if isinstance(b, tuple) else {b}
        return bool(sa & sb)
    return type(a) is type(b) and a == b


def _placements(inventory: Inventory) -> list[str | None]:
    names: set[str] = set(inventory.node_labels)
    for d in inventory.devices:
        if d.node is not None:
            names.add(d.node)
        elif d.node_selector is not None:
            names |= named_nodes(d.node_selector)
    out: list[str | None] = [*sorted(names)] if names else [None]
    return out


def _reachable(dev: Device, node: str | None, inventory: Inventory) -> bool | None:
    if node is None or dev.node is not None:
        return node is None or dev.node == node
    if dev.all_nodes or dev.node_selector is None:
        return True
    return selector_matches(dev.node_selector, node, inventory.node_labels.get(node))


def _split(dev: Device, why: str) -> tuple[str, str]:
    """(device name, the reason without it), so that many devices refused alike read as one line."""
    prefix = dev.name + " "
    return (dev.name, why[len(prefix) :]) if why.startswith(prefix) else (dev.name, why)


def _devices(names: Sequence[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _refusal(why: str, names: Sequence[str]) -> str:
    """'gpu-1 has taint x' for one device; 'gpu-0, gpu-1, gpu-2 and 5 more: has taint x' for many."""
    return f"{names[0]} {why}" if len(names) == 1 else f"{_devices(names)}: {why}"


def _grouped(refused: Mapping[str, list[str]]) -> list[str]:
    ordered = sorted(refused.items(), key=lambda kv: -len(kv[1]))
    return [_refusal(why, names) for why, names in ordered]


def _derived(inventory: Inventory, name: Hashable, compute: Callable[[], T]) -> T:
    """A fact of the inventory's devices, node labels and counters, computed once. The memo can be
    shared between inventories, so the value is kept with the inputs it was computed from."""
    inputs = (inventory.devices, inventory.node_labels, inventory.counter_sets)
    hit = inventory.cached(("allocate", name), lambda: (inputs, compute()))
    if all(a is b for a, b in zip(hit[0], inputs, strict=True)):
        value: T = hit[1]
        return value
    return compute()


def _index(found: Sequence[Device]) -> tuple[dict[str, list[Device]], list[Device], bool]:
    """A match's devices per node, those reachable from several nodes, and whether any has
    binding conditions."""
    on_node: dict[str, list[Device]] = {}
    roaming: list[Device] = []
    for d in found:
        if d.node is not None:
            on_node.setdefault(d.node, []).append(d)
        else:
            roaming.append(d)
    return on_node, roaming, any(d.binding_conditions for d in found)


def _orphans(inventory: Inventory) -> frozenset[int]:
    """Devices (by id) consuming a counter set the inventory does not have."""
    return frozenset(
        id(d)
        for d in inventory.devices
        if any((d.driver, d.pool, u.counter_set) not in inventory.counter_sets for u in d.consumes_counters)
    )


def _content(d: Device) -> Hashable:
    """What allocation depends on in a device, without its name, pool or node."""

    def nested(m: Mapping[str, Mapping[str, object]]) -> tuple[object, ...]:
        return tuple(
            sorted(
                (dom, tuple(sorted((n, type(v).__name__, repr(v)) for n, v in vs.items())))
                for dom, vs in m.items()
            )
        )

    return (
        d.driver,
        nested(d.attributes),
        nested(d.list_attributes),
        nested(d.capacity),
        nested(d.capacity_policy),
        d.taints,
        d.allow_multiple_allocations,
        tuple((u.counter_set, tuple(sorted(u.counters.items()))) for u in d.consumes_counters),
    )


def _signature(
    candidates: Mapping[tuple[int, int], Sequence[Device]],
    inventory: Inventory,
    contents: Mapping[int, Hashable],
    base: _Baseline,
    unknown_reach: int,
) -> Hashable:
    """Two nodes with equal signatures pose the same problem: same devices up to their names, shared
    the same way between requests and counter sets, with the same use by other claims."""
    local: dict[int, int] = {}
    sets: dict[tuple[str, str, str], int] = {}
    devices: list[Hashable] = []
    per_choice: list[Hashable] = []
    used = bool(base.taken or base.shared or base.counters)
    rules = bool(inventory.taint_rules)
    for ij in sorted(candidates):
        idxs: list[int] = []
        for d in candidates[ij]:
            n = local.get(id(d))
            if n is None:
                n = local[id(d)] = len(local)
                part: Hashable = contents.get(id(d)) or _content(d)
                if d.consumes_counters or used or rules:
                    part = (part, _dynamic(d, inventory, base, sets))
                devices.append(part)
            idxs.append(n)
        per_choice.append((ij, tuple(idxs)))
    return (unknown_reach, tuple(per_choice), tuple(devices))


def _dynamic(
    d: Device, inventory: Inventory, base: _Baseline, sets: dict[tuple[str, str, str], int]
) -> Hashable:
    """The part of a device's signature that depends on the other claims, rules and counter sets."""
    counters: list[Hashable] = []
    for u in d.consumes_counters:
        sk = (d.driver, d.pool, u.counter_set)
        totals = inventory.counter_sets.get(sk, {})
        spent = tuple(sorted((c, base.counters.get((*sk, c))) for c in totals))
        counters.append((sets.setdefault(sk, len(sets)), tuple(sorted(totals.items())), spent))
    key = d.key
    return (
        inventory.taints_of(d) if inventory.taint_rules else (),
        tuple(counters),
        key in base.taken,
        key in base.shared,
        tuple(sorted(base.capacity_of.get(key, ()))),
    )


def _failing(expressions: Sequence[str], devices: Sequence[Device]) -> list[tuple[Device, str]]:
    """The devices on which the selectors fail at run time, with the error. To the scheduler such an
    error is no "no match": it stops and refuses the claim."""
    from ..cel.env import compile_selector
    from ..cel.match import match_compiled, profile_key

    selectors = [compile_selector(e) for e in expressions]
    result = match_compiled(selectors, devices)
    if not result.errors:
        return []
    key_of = profile_key(selectors)
    bad = {key_of(e.device): f"{e.expression!r}: {e.message}" for e in result.errors if not e.limit}
    return [(d, bad[k]) for d in devices if (k := key_of(d)) in bad]


def _summary(what: str, reasons: Sequence[str]) -> str:
    shown = list(dict.fromkeys(reasons))
    more = len(shown) - _MAX_LISTED
    text = "; ".join(shown[:_MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")
    return f"{what}: {text}" if text else what


def _alone(
    search: _Search,
    choices: Sequence[Sequence[Choice]],
    matched: Mapping[tuple[int, int], Sequence[Device]],
    candidates: Mapping[tuple[int, int], Sequence[Device]],
    where: str,
) -> list[tuple[list[str], list[tuple[str, str | None]]]]:
    """Per request: why it cannot be met even alone on this node (naming the devices and why), and
    the alternatives with no device there; both empty when some alternative can be met.

    Each (device, alternative) check counts against the search's budget; alternatives that differ
    only in name (32 requests of 8 alike subrequests) share one check per device."""
    seen: dict[Hashable, str | None] = {}
    out: list[tuple[list[str], list[tuple[str, str | None]]]] = []
    for i, alts in enumerate(choices):
        per_choice: list[str] = []
        empty: list[tuple[str, str | None]] = []
        for j, ch in enumerate(alts):
            if (i, j) not in matched:
                continue
            here = candidates[(i, j)]
            if not here:
                empty.append((ch.name, ch.device_class))
                continue
            covers = tuple(not c or ch.request in c or ch.name in c for c, _a, _d in search.constraints)
            shape = (ch.tolerations, tuple(sorted(ch.capacity_requests.items())), ch.admin_access, covers)
            usable = []
            refused: dict[str, list[str]] = {}
            for d in here:
                key = (id(d), shape)
                if key in seen:
                    w = seen[key]
                else:
                    search.budget[0] -= 1
                    if search.budget[0] < 0:
                        raise _TooLarge
                    w = seen[key] = search.why_not(d, ch)
                if w is None:
                    usable.append(d)
                else:
                    refused.setdefault(_split(d, w)[1], []).append(d.name)
            need = 1 if ch.mode == ALL else ch.count
            if len(usable) < need or (ch.mode == ALL and refused):
                amount = "every matching device" if ch.mode == ALL else f"{need} device(s)"
                head = (f"request {ch.name!r} needs {amount} of class {ch.device_class} on {where}; "
                        f"{len(here)} match there, {len(usable)} usable")  # fmt: skip
                per_choice.append(_summary(head, _grouped(refused)))
            else:
                per_choice, empty = [], []
                break
        out.append((per_choice, empty))
    return out


def allocate(
    spec: ClaimSpec,
    inventory: Inventory,
    classes: Mapping[str, DeviceClassSpec] | None = None,
    *,
    claim_key: tuple[str, str] | None = None,
    max_steps: int = MAX_STEPS,
    every_node: bool = True,
    classes_complete: bool | None = None,
) -> Verdict:
    """Judge `spec` as a whole against `inventory` (see the module text).

    `classes` are the DeviceClasses known (the inventory's when None); `claim_key` is the claim's
    (namespace, name) when it is an existing ResourceClaim: its own allocation does not count
    against it. With `every_node` False the search stops at the first node that fits (a yes/no
    question, as a rule asks it). A class missing from `classes` is judged not to exist when
    `classes_complete` (default: the inventory lists DeviceClasses), else the verdict is None.
    """
    classes = inventory.classes if classes is None else classes
    if inventory.is_empty:
        return Verdict(None, reasons=("no inventory: nothing to allocate from",))
    choices = choices_of(spec)
    if not choices:
        return Verdict(True, notes=("the claim requests no devices",))
    notes: list[str] = []
    matched: dict[tuple[int, int], list[Device]] = {}
    exprs_of: dict[tuple[int, int], tuple[str, ...]] = {}
    static: list[str] = []
    for i, alts in enumerate(choices):
        for j, ch in enumerate(alts):
            if ch.device_class is None:
                static.append(f"request {ch.name!r} names no DeviceClass")
                continue
            cls = classes.get(ch.device_class)
            if cls is None:
                complete = bool(inventory.classes) if classes_complete is None else classes_complete
                if not complete:
                    return Verdict(None, reasons=(f"DeviceClass {ch.device_class} is not in the inventory",))
                static.append(f"request {ch.name!r}: DeviceClass {ch.device_class} does not exist")
                continue
            if ch.mode not in (EXACT_COUNT, ALL):
                static.append(f"request {ch.name!r}: allocationMode {ch.mode!r} is not supported")
                continue
            exprs = (*(s.expression for s in cls.selectors), *ch.selectors)
            try:
                found = inventory.cached(
                    ("match", tuple(exprs)), partial(_match, list(exprs), inventory.devices)
                )
            except ValueError as e:
                # cel/syntax reports the selector; the scheduler would refuse the claim outright.
                return Verdict(None, reasons=(f"request {ch.name!r}: a selector does not compile ({e})",))
            orphans = _derived(inventory, "orphans", lambda: _orphans(inventory))
            unknown_sets = sorted(
                {
                    f"{d.name} consumes counter set {u.counter_set} of pool {d.pool}"
                    for d in (found or () if orphans else ())
                    if id(d) in orphans
                    for u in d.consumes_counters
                    if (d.driver, d.pool, u.counter_set) not in inventory.counter_sets
                }
            )
            if unknown_sets:
                # The counters live in slices the inventory lacks (1.35+ publishes them apart):
                # what is left of them cannot be known, so neither can the answer.
                return Verdict(
                    None,
                    reasons=(
                        _summary("counters not in the inventory", unknown_sets)
                        + "; add the pool's counter slices",
                    ),
                )
            if found is None:
                return Verdict(
                    None,
                    reasons=(f"request {ch.name!r}: a selector is beyond what can be evaluated offline",),
                )
            matched[(i, j)] = found
            exprs_of[(i, j)] = tuple(exprs)
            if _derived(inventory, ("index", tuple(exprs)), lambda f=found: _index(f))[2]:  # type: ignore[misc]
                notes.append(f"request {ch.name!r}: some devices have binding conditions; "
                             "the pod waits for them after allocation")  # fmt: skip
    hopeless = [i for i, alts in enumerate(choices) if not any((i, j) in matched for j in range(len(alts)))]
    if hopeless:
        names = {choices[i][0].request for i in hopeless}
        mine = [r for r in static if r.split("'")[1].split("/")[0] in names]
        return Verdict(False, reasons=tuple(dict.fromkeys(mine)), notes=tuple(dict.fromkeys(notes)))
    by_key = _derived(inventory, "by-key", lambda: {d.key: d for d in inventory.devices})
    contents = _derived(inventory, "contents", lambda: {id(d): _content(d) for d in inventory.devices})
    baseline = _baseline(inventory, by_key, claim_key)
    budget = [max_steps]
    ok_nodes: list[str | None] = []
    first_picks: tuple[Pick, ...] = ()
    failures: list[str] = []  # a request alone on a node, with devices there
    together: list[str] = []  # every request fits alone, not all at once
    nowhere: dict[tuple[str, str | None], list[str]] = {}  # (request, class) -> nodes with no match
    undecided_nodes: list[str] = []
    risky_nodes: list[str] = []  # nodes where the claim fits unless a selector's run-time error stops it
    risky: list[str] = []  # those errors
    # Per choice: the devices of its class on which a selector fails at run time.
    failing = {
        ij: _derived(inventory, ("failing", exprs_of[ij]), partial(_failing, exprs_of[ij], inventory.devices))
        for ij in matched
    }
    unknown_nodes: list[str] = []  # nodes that failed while some device's reach there was unknown
    # Per choice: its devices on each named node, and those reachable from several nodes; so that a
    # node's candidates cost what it has, not the whole inventory (thousands of nodes).
    indexed: dict[tuple[int, int], tuple[dict[str, list[Device]], list[Device], bool]] = {
        ij: _derived(inventory, ("index", exprs_of[ij]), lambda f=found: _index(f))  # type: ignore[misc]
        for ij, found in matched.items()
    }
    bound_pools = _derived(
        inventory,
        "bound-pools",
        lambda: frozenset((d.driver, d.pool) for d in inventory.devices if d.binding_conditions),
    )
    # signature -> (outcome, nodes after the first, requests with no device there, said why)
    outcomes: dict[Hashable, tuple[str, list[str], list[tuple[str, str | None]], bool]] = {}
    for node in _derived(inventory, "placements", lambda: _placements(inventory)):
        where = node or "the cluster"
        candidates: dict[tuple[int, int], list[Device]] = {}
        node_reasons: list[str] = []
        unknown_reach = 0
        for ij, (on_node, roaming, _binding) in indexed.items():
            here = (
                list(on_node.get(node, ()))
                if node is not None
                else [d for ds in on_node.values() for d in ds]
            )
            for d in roaming:
                reach = _reachable(d, node, inventory)
                if reach is None:
                    unknown_reach += 1
                elif reach:
                    here.append(d)
            # The scheduler's first-fit order: pools by (driver, name), pools with binding conditions
            # last. Which devices it tries first decides its picks and, where it stops at an error
            # (an "All" request against a constraint), its answer.
            here.sort(key=lambda d: ((d.driver, d.pool) in bound_pools, d.driver, d.pool))
            candidates[ij] = here
        if unknown_reach:
            notes.append(f"{unknown_reach} device(s) have a nodeSelector on labels the inventory has no "
                         f"Node objects for (e.g. {where}); add `kubectl get nodes -o yaml`")  # fmt: skip
        sig = _signature(candidates, inventory, contents, baseline, unknown_reach)
        failing_here = [
            f"{d.name}: {why}"
            for ij in matched
            for d, why in failing[ij]
            if _reachable(d, node, inventory) is not False  # unknown reach: it may be met there
        ]
        if failing_here:
            sig = (sig, tuple(failing_here))
        prior = outcomes.get(sig)
        if prior is not None:
            # A node like one judged already (a homogeneous cluster): the same answer, no search.
            outcome, alike, empties, _said = prior
            alike.append(where)
            for missing in empties:
                nowhere.setdefault(missing, []).append(where)
            if outcome == "ok":
                ok_nodes.append(node)
                if not every_node:
                    break
            elif outcome == "unknown":
                unknown_nodes.append(where)
            elif outcome == "risky":
                risky_nodes.append(where)
            continue
        node_empties: list[tuple[str, str | None]] = []
        # Requests that cannot be met even alone on this node: name the devices and why.
        search = _Search(inventory, spec, choices, candidates, baseline, budget)
        search._undo_stack = []
        for ij, here in candidates.items():
            ch = choices[ij[0]][ij[1]]
            if ch.mode == ALL:
                # "All" means the matching devices whose capacity could serve the request at all;
                # one too small for it is left out, not a reason to fail.
                candidates[ij] = [d for d in here if search.fits_alone(d, ch)]
        alone_ok = True
        try:
            per_node = _alone(search, choices, matched, candidates, where)
        except _TooLarge:
            undecided_nodes.append(where)
            break
        for per_choice, empty in per_node:
            if per_choice or empty:
                alone_ok = False
                node_reasons.extend(per_choice)
                node_empties.extend(empty)
                for missing in empty:
                    nowhere.setdefault(missing, []).append(where)
        if not alone_ok:
            if unknown_reach:
                unknown_nodes.append(where)  # a device of unknown reach might have made it fit
            failures.extend(node_reasons)
            outcomes[sig] = ("unknown" if unknown_reach else "fail", [], node_empties, bool(node_reasons))
            continue
        try:
            fits = search.run()
        except _TooLarge:
            undecided_nodes.append(where)
            break
        if search.refusal is not None and not fits:
            failures.append(f"on {where}: {search.refusal}")
            outcomes[sig] = ("fail", [], [], True)
            continue
        if fits and (failing_here or search.refusal is not None):
            # The claim fits, but the scheduler stops at the first error it meets (a selector failing
            # at run time, an "All" request against a constraint): whether it meets one before it
            # has found its devices depends on the order it tries them.
            risky_nodes.append(where)
            if failing_here:
                risky.append(_summary("a selector fails at run time on some devices", failing_here))
            if search.refusal is not None:
                risky.append(search.refusal)
            outcomes[sig] = ("risky", [], [], False)
            continue
        if fits:
            ok_nodes.append(node)
            outcomes[sig] = ("ok", [], [], False)
            if not first_picks:
                first_picks = tuple(search.picks)
            if not every_node:
                break
            continue
        by_request = sorted(search.rejections.items(), key=lambda kv: -len(kv[1]))
        common = [f"request {req!r}: {_refusal(why, names)}" for (req, why), names in by_request]
        together.append(_summary(f"on {where} the requests cannot be satisfied together", common))
        outcomes[sig] = ("unknown" if unknown_reach else "fail", [], [], True)
        if unknown_reach:
            unknown_nodes.append(where)
    notes = list(dict.fromkeys(notes))
    if risky and ok_nodes:  # when no node fits cleanly, the reason says it
        notes.append(_summary("the scheduler may refuse the claim, depending on the order it tries devices",
                              list(dict.fromkeys(risky))))  # fmt: skip
    if ok_nodes:
        if _derived(inventory, "no-execute", lambda: any(t.effect == NO_EXECUTE for d in inventory.devices
                                                         for t in inventory.taints_of(d))):  # fmt: skip
            node = ok_nodes[0]
            near: dict[tuple[int, int], list[Device]] = {
                ij: [*(by_node.get(node, ()) if node is not None else ()), *multi]
                for ij, (by_node, multi, _) in indexed.items()
            }
            notes.extend(_evictions(inventory, choices, near, first_picks, node))
        return Verdict(True, tuple(ok_nodes), first_picks, (), tuple(notes), (*risky_nodes, *unknown_nodes))
    if risky_nodes:
        return Verdict(
            None,
            reasons=(
                _summary(
                    f"may be refused: the claim fits on {_devices(risky_nodes)}, but the scheduler stops "
                    "at the first error it meets there, which depends on the order it tries devices",
                    list(dict.fromkeys(risky)),
                ),
            ),
            notes=tuple(notes),
            unsure=tuple(risky_nodes),
        )
    if undecided_nodes:
        return Verdict(
            None,
            reasons=(
                f"too large to decide offline: more than {max_steps} device choices tried "
                f"(stopped on {undecided_nodes[0]})",
            ),
            notes=tuple(notes),
        )
    if unknown_nodes:
        return Verdict(
            None,
            reasons=(
                f"cannot be decided without the labels of {_devices(unknown_nodes)}: devices with a "
                "nodeSelector on other labels than the hostname might be reachable there",
            ),
            notes=tuple(notes),
        )
    for outcome, alike, _empties, said in outcomes.values():
        if outcome != "ok" and said and alike:
            failures.append(f"{len(alike)} more node(s) with the same devices fail alike: {_devices(alike)}")
    for (name, class_name), nodes in nowhere.items():
        more = f" and {len(nodes) - 3} more" if len(nodes) > 3 else ""
        failures.append(f"request {name!r}: no device of class {class_name} on {', '.join(nodes[:3])}{more}")
    reasons = list(dict.fromkeys([*together, *failures]))
    return Verdict(False, (), (), tuple(reasons) or ("no node offers the devices",), tuple(notes))


def describe_picks(picks: Sequence[Pick]) -> Iterator[str]:
    for p in picks:
        share = ", ".join(f"{k} {v}" for k, v in sorted(p.consumed.items()))
        yield f"{p.request}: {p.device.name}" + (f" ({share})" if share else "")
