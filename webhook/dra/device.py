"""The internal form of one published device, independent of the API version it came in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .capacity import RequestPolicy
from .taints import DeviceTaint


class Version(str):
    """A `version` attribute value (strict semver text); a plain `str` is a `string` attribute."""

    __slots__ = ()


AttrValue = str | int | bool | Version

_NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """What a partition takes from one of its pool's shared counter sets (quantity texts)."""

    counter_set: str
    counters: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Device:
    """A device as CEL sees it: driver, attributes[domain][name], capacity[domain][name].

    Attribute keys without a domain are filed under the driver's domain, as the API server does.
    Capacity values are Kubernetes quantity strings (e.g. "80Gi").
    """

    driver: str
    pool: str
    name: str
    node: str | None
    attributes: Mapping[str, Mapping[str, AttrValue]]
    capacity: Mapping[str, Mapping[str, str]]
    # `allowMultipleAllocations` (DRAConsumableCapacity): CEL reads it as device.allowMultipleAllocations.
    allow_multiple_allocations: bool = False
    # Partitionable devices (KEP-4815): counters taken from the pool's shared counter sets.
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    # capacity[domain][name]'s request policy, for capacities that have one.
    capacity_policy: Mapping[str, Mapping[str, RequestPolicy]] = field(default_factory=lambda: _NONE)
    # Where the device is reachable when it is not one node's: per device or for the whole slice.
    node_selector: Mapping[str, Any] | None = None
    all_nodes: bool = False
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    # List-typed attributes (KEP-5491, alpha): kept apart so scalar-only CEL code never sees them.
    list_attributes: Mapping[str, Mapping[str, tuple[AttrValue, ...]]] = field(default_factory=lambda: _NONE)
    # The device entry as published, so fields the engine does not model are carried, not lost.
    raw: Mapping[str, Any] = field(default_factory=lambda: _NONE, compare=False, repr=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """(driver, pool, name): how allocation results and DeviceTaintRules name a device."""
        return (self.driver, self.pool, self.name)
