"""What the engine knows of a DRA driver: the attributes and capacities it publishes, the opaque
config kinds it accepts and how it validates them. One module per driver, all behind `DriverSchema`:

- `draguard`: the bundled driver (`driver/schema.py`, `driver/config.py`);
- `nvidia`: NVIDIA's DRA driver (`gpu.nvidia.com` and `compute-domain.nvidia.com`).

Both serve the driver name `gpu.nvidia.com`, so which one a cluster runs is read from evidence
(`detect`): what the inventory's devices publish, the drivers and device types DeviceClasses
select, or an explicit setting. Rules ask `for_cluster()` and never hard-code a driver's names.
Pure module (no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..._driver import K8S_DOMAIN, AttrSpec, ConfigError, Kind

SchemaName = Literal["draguard", "nvidia"]
SCHEMA_NAMES: tuple[SchemaName, ...] = ("draguard", "nvidia")

Validator = Callable[[str, Mapping[str, Any], "set[str] | None"], list[ConfigError]]


@dataclass(frozen=True, slots=True)
class DriverSchema:
    """One driver implementation's published schema.

    `driver_name` is the domain attribute names without a domain belong to; `domains` every
    attribute domain the schema describes (the Kubernetes standard domain included when the driver
    publishes standard attributes). `config_kinds[driver][kind]` are the device types a kind fits.
    """

    name: SchemaName
    title: str
    driver_name: str
    drivers: frozenset[str]
    attributes: tuple[AttrSpec, ...] = field(repr=False)
    device_types: Mapping[str, frozenset[str]] = field(repr=False)
    config_kinds: Mapping[str, Mapping[str, frozenset[str]]] = field(repr=False)
    validator: Validator = field(repr=False)
    # DeviceClasses the driver's installation creates: name -> selector expression.
    classes: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def domains(self) -> tuple[str, ...]:
        seen: dict[str, None] = {self.driver_name: None}
        for spec in self.attributes:
            seen.setdefault(spec.domain, None)
        seen.setdefault(K8S_DOMAIN, None)
        return tuple(seen)

    def lookup(self, domain: str, name: str, kind: Kind | None = None) -> AttrSpec | None:
        """The spec of `device.attributes[domain].name` (or capacity); None when not published."""
        for spec in self.attributes:
            if (kind is None or spec.kind == kind) and spec.matches(domain, name):
                return spec
        return None

    def validate(
        self, driver: str, params: Mapping[str, Any], device_types: set[str] | None = None
    ) -> list[ConfigError]:
        """Every problem the driver finds in one opaque `parameters` object (empty: accepted)."""
        return self.validator(driver, params, device_types)

    def kind_for(self, driver: str, device_type: str) -> str | None:
        """The config kind that fits devices of this type, if one does."""
        return next((k for k, t in self.config_kinds.get(driver, {}).items() if device_type in t), None)


# Attributes only one implementation publishes for `gpu.nvidia.com` devices: evidence of which runs.
_NVIDIA_ONLY_ATTRS = re.compile(
    r"^(gpuModuleID|partition[0-9]+|deviceID|vendorID|iommuFDEnabled|index|minor|parentIndex|pcieBusID)$"
)
_DRAGUARD_ONLY_ATTRS = frozenset({"nvlinkDomain", "numaNode"})
_NVIDIA_DRIVERS = frozenset({"compute-domain.nvidia.com"})
# DeviceClass names NVIDIA's Helm chart installs (deployments/helm/.../templates/deviceclass-*.yaml).
NVIDIA_CLASS_NAMES = frozenset({
    "gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com",
    "compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com",
})
_NVIDIA_SELECTOR = re.compile(r"compute-domain\.nvidia\.com|['\"]vfio['\"]")
# Class names only NVIDIA's chart installs, whoever defines them (`gpu.nvidia.com` is left out: it is
# also the driver name, and people name classes after it). `imex.nvidia.com` is the v25.x IMEX class.
_NVIDIA_REQUESTED = (NVIDIA_CLASS_NAMES - {"gpu.nvidia.com"}) | {"imex.nvidia.com"}


@dataclass(frozen=True, slots=True)
class Detection:
    """Which schema was chosen and the evidence for it (shown in findings' fixes and `explain`)."""

    schema: DriverSchema
    reason: str


def from_devices(devices: Iterable[Any]) -> Detection | None:
    """What the inventory's devices say: NVIDIA's driver when more devices carry its marks (its
    compute-domain driver, `vfio` devices, attributes only it publishes) than draguard's; None
    when they carry neither."""
    from . import draguard, nvidia

    nvidia_votes = draguard_votes = 0
    example = ""
    for dev in devices:
        if dev.driver in _NVIDIA_DRIVERS:
            nvidia_votes += 1
            example = example or f"device {dev.name} of driver {dev.driver}"
            continue
        if dev.driver != draguard.SCHEMA.driver_name:
            continue
        own = dev.attributes.get(dev.driver, {})
        if own.get("type") == "vfio" or any(_NVIDIA_ONLY_ATTRS.match(k) for k in own):
            nvidia_votes += 1
            example = example or f"device {dev.name} publishes NVIDIA's attributes"
        elif _DRAGUARD_ONLY_ATTRS & set(own):
            draguard_votes += 1
    if nvidia_votes > draguard_votes:
        return Detection(nvidia.SCHEMA, f"inventory: {example}")
    if draguard_votes:
        return Detection(draguard.SCHEMA, "inventory: devices publish draguard's attributes")
    return None


def detect(
    setting: str | None,
    devices: Iterable[Any] = (),
    classes: Mapping[str, Any] | None = None,
    requested: Iterable[str] = (),
    *,
    evidence: Detection | None = None,
) -> Detection:
    """Choose the driver schema: an explicit setting wins, then the inventory's devices (or their
    `from_devices` verdict, `evidence`, when the caller keeps it), then the DeviceClasses (inventory
    and reviewed files), then the class names claims request (`requested`). Without evidence the
    bundled driver's schema."""
    from . import draguard, nvidia

    if setting:
        if setting not in SCHEMA_NAMES:
            raise ValueError(
                f"unknown driver schema {setting!r}; use one of: {', '.join(SCHEMA_NAMES)}"
            )
        return Detection(get(setting), f"set to {setting}")
    found = evidence if evidence is not None else from_devices(devices)
    if found is not None:
        return found
    for cname, cls in sorted((classes or {}).items()):
        selectors = getattr(cls, "selectors", ())
        if cname in NVIDIA_CLASS_NAMES and selectors:
            return Detection(nvidia.SCHEMA, f"DeviceClass {cname} is NVIDIA's chart's")
        if any(_NVIDIA_SELECTOR.search(s.expression) for s in selectors):
            return Detection(nvidia.SCHEMA, f"DeviceClass {cname} selects NVIDIA's devices")
    for cname in sorted(set(requested) & _NVIDIA_REQUESTED):
        return Detection(nvidia.SCHEMA, f"claims request DeviceClass {cname} of NVIDIA's chart")
    return Detection(draguard.SCHEMA, "no evidence of another driver: the bundled driver")


def installed_class(name: str) -> str | None:
    """The selector of a DeviceClass some driver's installation creates under this name (NVIDIA's
    chart's `gpu.nvidia.com`, `mig.nvidia.com`, ...), for claims naming a class no file defines."""
    for schema_name in SCHEMA_NAMES:
        selector = get(schema_name).classes.get(name)
        if selector is not None:
            return selector
    return None


def get(name: SchemaName) -> DriverSchema:
    from . import draguard, nvidia

    return draguard.SCHEMA if name == "draguard" else nvidia.SCHEMA
