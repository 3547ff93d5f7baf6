"""Device taints (on devices and from DeviceTaintRules) and the tolerations of requests.

Semantics are the scheduler's: only `NoSchedule` and `NoExecute` keep a device from being
allocated; `None` and effects this release does not know are ignored. A toleration with an
empty effect matches every effect, an empty key (operator `Exists`) every key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
NONE = "None"
BLOCKING_EFFECTS: frozenset[str] = frozenset({NO_SCHEDULE, NO_EXECUTE})
TAINT_RULE_GROUP = "resource.k8s.io"
# DeviceTaintRule was v1alpha3 (1.33-1.35), v1beta2 (1.36) and is v1 since 1.37.
TAINT_RULE_VERSIONS: frozenset[str] = frozenset({"v1", "v1beta2", "v1alpha3"})


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = ""
    time_added: str | None = None
    # Where it came from: "" for the device's own taint, else the DeviceTaintRule's name.
    rule: str = ""

    @property
    def blocks(self) -> bool:
        return self.effect in BLOCKING_EFFECTS

    def describe(self) -> str:
        text = f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        return f"{text} (DeviceTaintRule {self.rule})" if self.rule else text


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


def read_taints(raw: object) -> tuple[DeviceTaint, ...]:
    out: list[DeviceTaint] = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, Mapping):
            continue
        key = _str(item.get("key"))
        if not key:
            continue
        t = item.get("timeAdded")
        out.append(
            DeviceTaint(
                key, _str(item.get("value")), _str(item.get("effect")), t if isinstance(t, str) else None
            )
        )
    return tuple(out)


def read_tolerations(raw: object) -> tuple[DeviceToleration, ...]:
    out: list[DeviceToleration] = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, Mapping):
            continue
        secs = item.get("tolerationSeconds")
        out.append(
            DeviceToleration(
                _str(item.get("key")),
                _str(item.get("operator")),
                _str(item.get("value")),
                _str(item.get("effect")),
                secs if isinstance(secs, int) and not isinstance(secs, bool) else None,
            )
        )
    return tuple(out)


def tolerates(toleration: DeviceToleration, taint: DeviceTaint) -> bool:
    """Whether one toleration matches one taint (the effect is the caller's to judge)."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def untolerated(taints: Iterable[DeviceTaint], tolerations: Sequence[DeviceToleration]) -> list[DeviceTaint]:
    """The taints that keep a device from a request with these tolerations."""
    return [t for t in taints if t.blocks and not any(tolerates(tol, t) for tol in tolerations)]


def eviction(
    taints: Iterable[DeviceTaint], tolerations: Sequence[DeviceToleration]
) -> tuple[DeviceTaint, int] | None:
    """The NoExecute taint that gets a pod holding the device evicted soonest, and how many seconds after
    the taint was added; None when no taint evicts it.

    These are the device taint eviction controller's rules (kube-controller-manager 1.37), which are
    narrower than the scheduler's: only a toleration that names `effect: NoExecute` keeps the pod. One
    with no effect lets the scheduler allocate the tainted device, and the controller then deletes the
    pod as soon as it is scheduled.
    """
    soonest: tuple[DeviceTaint, int] | None = None
    for taint in taints:
        if taint.effect != NO_EXECUTE:
            continue
        seconds: int | None = None
        kept = False
        for tol in tolerations:
            if tol.effect != NO_EXECUTE or not tolerates(tol, taint):
                continue
            if tol.toleration_seconds is None:
                kept = True
                break
            wait = max(tol.toleration_seconds, 0)
            seconds = wait if seconds is None else min(seconds, wait)
        if kept:
            continue
        after = seconds or 0
        if soonest is None or after < soonest[1]:
            soonest = (taint, after)
    return soonest


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """A DeviceTaintRule: its taint applies to every device its selector names (empty: all)."""

    name: str
    taint: DeviceTaint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def applies(self, driver: str, pool: str, device: str) -> bool:
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


def is_taint_rule(obj: Mapping[str, Any]) -> bool:
    api = obj.get("apiVersion")
    if obj.get("kind") != "DeviceTaintRule" or not isinstance(api, str):
        return False
    group, _, version = api.rpartition("/")
    return group == TAINT_RULE_GROUP and version in TAINT_RULE_VERSIONS


def read_taint_rule(obj: Mapping[str, Any]) -> DeviceTaintRule | None:
    """The rule of a DeviceTaintRule object; None when it is not one or carries no taint key."""
    if not is_taint_rule(obj):
        return None
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    taints = read_taints([spec.get("taint")])
    if not taints:
        return None
    sel = spec.get("deviceSelector")
    sel = sel if isinstance(sel, Mapping) else {}
    name = _str(meta.get("name")) if isinstance(meta, Mapping) else ""

    def opt(key: str) -> str | None:
        v = sel.get(key)
        return v if isinstance(v, str) and v else None

    t = taints[0]
    return DeviceTaintRule(
        name or "<unnamed>",
        DeviceTaint(t.key, t.value, t.effect, t.time_added, name or "<unnamed>"),
        opt("driver"),
        opt("pool"),
        opt("device"),
    )
