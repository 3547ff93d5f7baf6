"""The attribute and capacity schema the bundled driver publishes, as plain data.

This module is the single source of truth for what `gpu.nvidia.com` devices carry. The CEL
linter reads it to know which `device.attributes[...]` / `device.capacity[...]` keys exist and
what type they have. It is pure: no NVML, no Kubernetes client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

DRIVER_NAME = "gpu.nvidia.com"
"""Default driver name (and attribute domain for keys without an explicit domain)."""

K8S_DOMAIN = "resource.kubernetes.io"
"""Domain of the standard attributes defined by Kubernetes itself."""

DEVICE_TYPES: frozenset[str] = frozenset({"gpu", "mig"})

Kind = Literal["attribute", "capacity"]
AttrType = Literal["string", "int", "bool", "version", "quantity"]

_GPU = frozenset({"gpu"})
_MIG = frozenset({"mig"})
_BOTH = frozenset({"gpu", "mig"})


@dataclass(frozen=True, slots=True)
class AttrSpec:
    """One published attribute or capacity.

    `name` may be a pattern containing `<N>` (a decimal index), e.g. `memorySlice<N>`.
    """

    domain: str
    name: str
    kind: Kind
    type: AttrType
    device_types: frozenset[str]
    description: str
    optional: bool = False

    @property
    def is_pattern(self) -> bool:
        return "<N>" in self.name

    def matches(self, domain: str, name: str) -> bool:
        if domain != self.domain:
            return False
        if not self.is_pattern:
            return name == self.name
        prefix, _, suffix = self.name.partition("<N>")
        return re.fullmatch(re.escape(prefix) + r"(0|[1-9][0-9]*)" + re.escape(suffix), name) is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "name": self.name,
            "kind": self.kind,
            "type": self.type,
            "deviceTypes": sorted(self.device_types),
            "description": self.description,
            "optional": self.optional,
            "pattern": self.is_pattern,
        }


def _a(
    name: str,
    typ: AttrType,
    types: frozenset[str],
    desc: str,
    *,
    domain: str = DRIVER_NAME,
    optional: bool = False,
) -> AttrSpec:
    return AttrSpec(domain, name, "attribute", typ, types, desc, optional)


def _c(name: str, types: frozenset[str], desc: str, *, optional: bool = False) -> AttrSpec:
    return AttrSpec(DRIVER_NAME, name, "capacity", "quantity", types, desc, optional)


ATTRIBUTES: tuple[AttrSpec, ...] = (
    # Attributes (driver domain).
    _a("type", "string", _BOTH, 'Device type: "gpu" for a full GPU, "mig" for a MIG device.'),
    _a(
        "uuid",
        "string",
        _BOTH,
        "NVML UUID of the GPU or MIG device; absent on a dynamic MIG partition, whose instance (and UUID) "
        "is made at prepare.",
        optional=True,
    ),
    _a("productName", "string", _BOTH, 'Marketing name from NVML, e.g. "NVIDIA H100 80GB HBM3".'),
    _a("brand", "string", _BOTH, "NVML brand: Tesla, Nvidia, GeForce, Quadro, NvidiaRTX, ..."),
    _a("architecture", "string", _BOTH, 'GPU architecture: Ampere, Hopper, "Ada Lovelace", Blackwell, ...'),
    _a("cudaComputeCapability", "version", _BOTH, "CUDA compute capability as semver, e.g. 9.0.0."),
    _a("driverVersion", "version", _BOTH, "Kernel driver version as strict semver (leading zeros dropped)."),
    _a("cudaDriverVersion", "version", _BOTH, "Highest CUDA version the driver supports, e.g. 12.4.0."),
    _a(
        "addressingMode", "string", _BOTH, "HMM, ATS or None; only on coherent-memory systems.", optional=True
    ),
    _a(
        "numaNode",
        "int",
        _BOTH,
        "Deprecated: use resource.kubernetes.io/numaNode (same value); kept for one release.",
        optional=True,
    ),
    _a("profile", "string", _MIG, "MIG profile, e.g. 3g.20gb."),
    _a("parentUUID", "string", _MIG, "UUID of the GPU this MIG device lives on."),
    _a(
        "nvlinkDomain",
        "string",
        _GPU,
        "Identifier shared by exactly the GPUs of this node joined by NVLink (connected component); "
        "absent on GPUs without active NVLink links.",
        optional=True,
    ),
    # Attributes (Kubernetes domain).
    _a("pciBusID", "string", _BOTH, "PCI bus id in lowercase, e.g. 0000:3b:00.0.", domain=K8S_DOMAIN),
    _a(
        "pcieRoot",
        "string",
        _BOTH,
        "PCIe root complex, pci<domain>:<bus>; only when resolvable.",
        domain=K8S_DOMAIN,
        optional=True,
    ),
    _a(
        "numaNode",
        "int",
        _BOTH,
        "NUMA node of the GPU's PCI device (the standard key); absent without one.",
        domain=K8S_DOMAIN,
        optional=True,
    ),
    # Capacities (driver domain).
    _c("memory", _BOTH, "Device memory in bytes; omitted when NVML reports NOT_SUPPORTED.", optional=True),
    _c("multiprocessors", _MIG, "Streaming multiprocessors of the MIG device."),
    _c("copyEngines", _MIG, "Copy engines of the MIG device."),
    _c("decoders", _MIG, "Video decoders of the MIG device."),
    _c("encoders", _MIG, "Video encoders of the MIG device."),
    _c("jpegEngines", _MIG, "JPEG engines of the MIG device."),
    _c("ofaEngines", _MIG, "Optical flow accelerators of the MIG device."),
    _c("memorySlice<N>", _MIG, "1 for each memory slice N in the MIG device's placement.", optional=True),
)


def normalize_key(key: str, driver: str = DRIVER_NAME) -> tuple[str, str]:
    """Split a published key into (domain, name); keys without a domain belong to the driver."""
    domain, sep, name = key.rpartition("/")
    return (domain, name) if sep else (driver, key)


def lookup(domain: str, name: str, kind: Kind | None = None) -> AttrSpec | None:
    """Find the spec for `device.attributes[domain].name` (or capacity); None when not published.

    Handles indexed patterns such as `memorySlice<N>` (`memorySlice0`, `memorySlice7`, ...).
    """
    for spec in ATTRIBUTES:
        if kind is not None and spec.kind != kind:
            continue
        if spec.matches(domain, name):
            return spec
    return None


def specs_for(device_type: str, kind: Kind | None = None) -> tuple[AttrSpec, ...]:
    """All specs that apply to one device type (`gpu` or `mig`)."""
    return tuple(s for s in ATTRIBUTES if device_type in s.device_types and (kind is None or s.kind == kind))


def export_schema() -> dict[str, Any]:
    """The schema as JSON-able data (used by `draguard schema` and the CEL linter)."""
    from .config import OPAQUE_CONFIG_SCHEMA  # config is pure too; imported late to keep this light

    return {
        "driver": DRIVER_NAME,
        "deviceTypes": sorted(DEVICE_TYPES),
        "attributes": [s.to_dict() for s in ATTRIBUTES if s.kind == "attribute"],
        "capacities": [s.to_dict() for s in ATTRIBUTES if s.kind == "capacity"],
        "opaqueConfig": OPAQUE_CONFIG_SCHEMA,
    }
