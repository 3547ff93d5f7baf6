"""Evaluate selectors over an inventory, once per distinct profile of what they can see.

A profile is the part of a device the expressions read. When every read is a constant lookup
(`device.driver`, `device.attributes['d'].name`, `has(...)`, `'name' in ...`), the profile is just
those values, so 50,000 GPUs of four models collapse to four evaluations and per-device identity
attributes (uuid, pciBusID, parentUUID) never split a group unless an expression reads them. An
expression that iterates a map, calls `size()` on it or computes a key is "dynamic": its profile is
the whole device.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from ..dra.device import Device
from .env import CelEvalError, CompiledSelector, compile_selector


@dataclass(frozen=True, slots=True)
class MatchError:
    """The first evaluation error of one profile."""

    expression: str
    message: str
    device: Device  # the profile's first device
    devices: int  # devices sharing the profile (all of them fail the same way)
    missing_key: str | None = None
    type_error: bool = False
    limit: bool = False  # the runtime gave up: the verdict is unknown, not "no match"


@dataclass(slots=True)
class MatchResult:
    matched: list[Device] = field(default_factory=list)
    errors: list[MatchError] = field(default_factory=list)
    # Distinct profiles, i.e. how many times the expressions were evaluated per selector at most.
    profiles: int = 0
    # Devices whose evaluation failed (they are not in `matched`).
    failed: int = 0

    @property
    def undecided(self) -> bool:
        """True when the runtime gave up on some device: `matched` may be missing devices."""
        return any(e.limit for e in self.errors)


_MISSING = object()
ProfileKey = Callable[[Device], Hashable]


def _full_key(device: Device) -> Hashable:
    return (
        device.driver,
        tuple(sorted(
            (domain, tuple(sorted((n, v.__class__, v) for n, v in values.items())))
            for domain, values in device.attributes.items()
        )),
        tuple(sorted(
            (domain, tuple(sorted(values.items()))) for domain, values in device.capacity.items()
        )),
        device.allow_multiple_allocations,
    )


def profile_key(selectors: Sequence[CompiledSelector]) -> ProfileKey:
    """A function giving each device the key of what `selectors` can see."""
    if any(s.analysis.dynamic for s in selectors):
        return _full_key
    reads_driver = any(s.analysis.reads_driver for s in selectors)
    keys = sorted({k for s in selectors for k in s.analysis.visible_keys})
    return _compile_key(reads_driver, keys)


def _compile_key(reads_driver: bool, keys: Sequence[tuple[str, str, str]]) -> ProfileKey:
    """Build the key function as straight-line code: it runs once per device of the inventory.

    Each domain map is fetched once; attribute values carry their class, because True == 1 and
    Version("1.0.0") == "1.0.0" in Python but not in CEL. Domain and attribute names enter the
    generated source only through repr(), so they are inert string literals.
    """
    plan: dict[tuple[str, str], list[str]] = {}
    for kind, domain, name in keys:
        if kind not in ("attributes", "capacity"):
            raise ValueError(f"unexpected device field {kind!r}")
        plan.setdefault((kind, domain), []).append(name)
    lines = ["def key(device):"]
    items: list[str] = ["device.driver"] if reads_driver else []
    counter = 0
    for index, ((kind, domain), names) in enumerate(plan.items()):
        lines.append(f"    m{index} = device.{kind}.get({domain!r}, EMPTY)")
        for name in names:
            if kind == "attributes":
                items.append(f"(v{counter} := m{index}.get({name!r}, MISSING))")
                items.append(f"v{counter}.__class__")
                counter += 1
            else:
                items.append(f"m{index}.get({name!r}, MISSING)")
    lines.append(f"    return ({', '.join(items)}{',' if len(items) == 1 else ''})")
    namespace: dict[str, object] = {"EMPTY": {}, "MISSING": _MISSING}
    exec("\n".join(lines), namespace)
    key = namespace["key"]
    assert callable(key)
    return key


def match_compiled(selectors: Sequence[CompiledSelector], devices: Sequence[Device]) -> MatchResult:
    """Devices for which every selector is true (evaluated in order, stopping at the first false)."""
    result = MatchResult()
    if not devices:
        return result
    key_of = profile_key(selectors)
    groups: dict[Hashable, list[Device]] = {}
    keys: list[Hashable] = []
    for device in devices:
        k = key_of(device)
        keys.append(k)
        group = groups.get(k)
        if group is None:
            groups[k] = [device]
        else:
            group.append(device)
    result.profiles = len(groups)
    verdict: dict[Hashable, bool] = {}
    for k, members in groups.items():
        representative = members[0]
        ok = True
        for selector in selectors:
            try:
                if not selector.evaluate(representative):
                    ok = False
                    break
            except CelEvalError as exc:
                result.errors.append(MatchError(
                    selector.expression, exc.message, representative, len(members), exc.missing_key,
                    exc.type_error, exc.limit,
                ))
                result.failed += len(members)
                ok = False
                break
        verdict[k] = ok
    result.matched = [d for d, k in zip(devices, keys, strict=True) if verdict[k]]
    return result


def match_devices(expressions: Sequence[str], devices: Sequence[Device]) -> MatchResult:
    """Devices selected by all `expressions`.

    Raises CelCompileError for an expression that does not compile.
    """
    return match_compiled([compile_selector(e) for e in expressions], devices)


def match_naive(expressions: Sequence[str], devices: Sequence[Device]) -> list[Device]:
    """Evaluate every device separately (reference for tests and benchmarks)."""
    selectors = [compile_selector(e) for e in expressions]
    out: list[Device] = []
    for device in devices:
        try:
            if all(s.evaluate(device) for s in selectors):
                out.append(device)
        except CelEvalError:
            continue
    return out
