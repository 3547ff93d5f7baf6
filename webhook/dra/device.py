"""The internal form of one published device, independent of the API version it came in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class Version(str):
    """A `version` attribute value (strict semver text); a plain `str` is a `string` attribute."""

    __slots__ = ()


AttrValue = str | int | bool | Version


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
