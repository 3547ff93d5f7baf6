"""NVML inventory → devices with NVIDIA's names, attributes and capacities (see driver/schema.py).

Decisions worth knowing:
- A GPU in MIG mode is published only through its MIG devices (its full-GPU form is not allocatable).
- `nvlinkDomain` is the connected component of the NVLink graph (GPUs and NVSwitches are the
  vertices, active links the edges). Its value, `nvl-<12 hex>`, is a hash of the member GPUs'
  UUIDs, so it is stable across restarts and unique across nodes. A full GPU that is not joined to
  any other GPU gets no `nvlinkDomain` attribute at all: a `matchAttribute` constraint on it can
  then never pair it with another GPU, which is the truth.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from .nvml import GpuInfo, MigInfo, MigProfile, NodeGpus
from .schema import DRIVER_NAME, K8S_DOMAIN
from .sharing import CapacitySharing

AttrKind = Literal["string", "int", "bool", "version"]
AttrValue = str | int | bool

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_LOOSE = re.compile(
    r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?((?:\.\d+)*)(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?$"
)


def is_strict_semver(text: str) -> bool:
    return bool(_SEMVER.match(text))


def coerce_semver(text: str) -> str:
    """Coerce a version string to strict semver 2.0.0, as NVIDIA's driver does before publishing.

    `535.104.05` → `535.104.5`, `9.0` → `9.0.0`, `12` → `12.0.0`. Extra numeric parts beyond the
    third become build metadata (`470.57.02.1` → `470.57.2+1`). Raises ValueError otherwise.
    """
    m = _LOOSE.match(text.strip())
    if not m:
        raise ValueError(f"cannot read {text!r} as a version")
    major, minor, patch = (int(g) if g else 0 for g in m.group(1, 2, 3))
    out = f"{major}.{minor}.{patch}"
    pre, build = m.group(5), m.group(6)
    extra = m.group(4).lstrip(".")
    if pre:
        pre = ".".join(str(int(p)) if p.isdigit() else p for p in pre.split("."))
        out += f"-{pre}"
    builds = [b for b in (extra, build) if b]
    if builds:
        out += "+" + ".".join(builds)
    if not is_strict_semver(out):
        raise ValueError(f"cannot coerce {text!r} to strict semver (got {out!r})")
    return out


def cuda_driver_version(v: int) -> str:
    """NVML's integer CUDA driver version (12040) → `12.4.0`."""
    return coerce_semver(f"{v // 1000}.{(v % 1000) // 10}")


def mig_device_name(
    parent_minor: int, profile: str, gi_profile_id: int, start: int, ci_id: int | None = None
) -> str:
    """`gpu-<minor>-mig-<profile>-<giProfileId>-<start>`, as NVIDIA's driver names them.

    The profile loses its dots and is made RFC 1123 as NVIDIA does (lowercase, other characters
    become `-`): `1g.10gb+me` → `1g10gb-me`. A compute instance smaller than its GPU instance
    (`1c.3g.20gb`; several can share one GPU instance) gets `-<ciId>` appended, which NVIDIA's
    scheme has no room for, so that each one has its own name.
    """
    prof = re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", "")).strip("-")
    name = f"gpu-{parent_minor}-mig-{prof}-{gi_profile_id}-{start}"
    return name if ci_id is None else f"{name}-{ci_id}"


@dataclass(frozen=True, slots=True)
class DriverDevice:
    """One allocatable device, with what the ResourceSlice and the CDI spec need."""

    name: str
    type: Literal["gpu", "mig"]
    uuid: str
    minor: int  # the GPU's minor (the parent's for MIG): /dev/nvidia<minor>
    attributes: dict[str, tuple[AttrKind, AttrValue]]
    capacity: dict[str, int]
    parent_uuid: str | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()  # spec.devices[].taints (driver/health.py)
    shared: CapacitySharing | None = None  # shared by consumable capacity (driver/sharing.py)
    # Dynamic MIG (partitionable devices): the counter set of the GPU this device draws on and what it
    # consumes of it; a partition also names the profile and memory slice its instance is created at.
    counter_set: str | None = None
    consumes: tuple[tuple[str, int], ...] = ()
    mig_profile_id: int | None = None
    mig_start: int | None = None

    @property
    def memory_slices(self) -> frozenset[int]:
        """The memory slices a dynamic device takes on its GPU (all of them for the full GPU)."""
        prefix = "memory-slice-"
        return frozenset(int(k[len(prefix) :]) for k, _v in self.consumes if k.startswith(prefix))

    def memory_policy(self) -> dict[str, int | dict[str, int]] | None:
        """The `memory` capacity's request policy when the device is shared by capacity."""
        if self.shared is None or "memory" not in self.capacity:
            return None
        return self.shared.request_policy(self.capacity["memory"])


def nvlink_domains(gpus: Iterable[GpuInfo]) -> dict[str, str]:
    """Map GPU UUID → nvlinkDomain for GPUs joined by NVLink to at least one other GPU."""
    gpus = list(gpus)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in gpus:
        find(g.pci_bus_id)
        for remote in g.nvlink_remotes:
            ra, rb = find(g.pci_bus_id), find(remote)
            if ra != rb:
                parent[ra] = rb
    members: dict[str, list[GpuInfo]] = {}
    for g in gpus:
        if g.nvlink_remotes:
            members.setdefault(find(g.pci_bus_id), []).append(g)
    out: dict[str, str] = {}
    for group in members.values():
        if len(group) < 2:
            continue
        digest = hashlib.sha256(",".join(sorted(g.uuid for g in group)).encode()).hexdigest()[:12]
        for g in group:
            out[g.uuid] = f"nvl-{digest}"
    return out


def _common(node: NodeGpus, gpu: GpuInfo) -> dict[str, tuple[AttrKind, AttrValue]]:
    attrs: dict[str, tuple[AttrKind, AttrValue]] = {
        "productName": ("string", gpu.name),
        "brand": ("string", gpu.brand),
        "architecture": ("string", gpu.architecture),
        "cudaComputeCapability": ("version", coerce_semver(gpu.compute_capability)),
        "driverVersion": ("version", coerce_semver(node.driver_version)),
        "cudaDriverVersion": ("version", cuda_driver_version(node.cuda_driver_version)),
        f"{K8S_DOMAIN}/pciBusID": ("string", gpu.pci_bus_id),
    }
    if gpu.pcie_root:
        attrs[f"{K8S_DOMAIN}/pcieRoot"] = ("string", gpu.pcie_root)
    if gpu.addressing_mode:
        attrs["addressingMode"] = ("string", gpu.addressing_mode)
    if gpu.numa_node is not None:
        # The standard key (Kubernetes 1.37) is what topology-aware selectors written for any driver use;
        # the driver-domain key stays for one release so existing selectors keep matching.
        attrs[f"{K8S_DOMAIN}/numaNode"] = ("int", gpu.numa_node)
        attrs["numaNode"] = ("int", gpu.numa_node)
    return attrs


def _gpu_device(
    node: NodeGpus, gpu: GpuInfo, domain: str | None, sharing: CapacitySharing | None
) -> DriverDevice:
    attrs: dict[str, tuple[AttrKind, AttrValue]] = {"type": ("string", "gpu"), "uuid": ("string", gpu.uuid)}
    attrs.update(_common(node, gpu))
    if domain:
        attrs["nvlinkDomain"] = ("string", domain)
    cap = {"memory": gpu.memory_bytes} if gpu.memory_bytes is not None else {}
    shared = None
    if sharing is not None and sharing.applies(gpu.name) and sharing.eligible(gpu.memory_bytes):
        shared = sharing
    return DriverDevice(f"gpu-{gpu.minor}", "gpu", gpu.uuid, gpu.minor, attrs, cap, shared=shared)


def _mig_device(node: NodeGpus, gpu: GpuInfo, mig: MigInfo) -> DriverDevice:
    attrs: dict[str, tuple[AttrKind, AttrValue]] = {
        "type": ("string", "mig"),
        "uuid": ("string", mig.uuid),
        "parentUUID": ("string", gpu.uuid),
        "profile": ("string", mig.profile),
    }
    attrs.update(_common(node, gpu))
    cap = {
        "memory": mig.memory_bytes,
        "multiprocessors": mig.multiprocessors,
        "copyEngines": mig.copy_engines,
        "decoders": mig.decoders,
        "encoders": mig.encoders,
        "jpegEngines": mig.jpeg_engines,
        "ofaEngines": mig.ofa_engines,
    }
    for i in range(mig.placement_start, mig.placement_start + mig.placement_size):
        cap[f"memorySlice{i}"] = 1
    partial_ci = re.match(r"^\d+c\.", mig.profile) is not None  # "1c.3g.20gb": CI smaller than its GI
    name = mig_device_name(gpu.minor, mig.profile, mig.gi_profile_id, mig.placement_start,
                           mig.ci_id if partial_ci else None)  # fmt: skip
    return DriverDevice(name, "mig", mig.uuid, gpu.minor, attrs, cap, gpu.uuid, mig.gi_id, mig.ci_id)


def counter_set_name(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def _counters(p: MigProfile) -> dict[str, int]:
    out = {
        "multiprocessors": p.multiprocessors, "copy-engines": p.copy_engines, "decoders": p.decoders,
        "encoders": p.encoders, "jpeg-engines": p.jpeg_engines, "ofa-engines": p.ofa_engines,
        "memory": p.memory_bytes,
    }  # fmt: skip
    return {k: v for k, v in out.items() if v}


def _dynamic_devices(node: NodeGpus, gpu: GpuInfo, domain: str | None) -> list[DriverDevice]:
    """A GPU in MIG mode as partitionable devices: the full GPU and every profile at every placement.

    The GPU's counter set holds one counter per memory slice and, for each engine and for memory, the
    most any profile has (the whole-GPU profile's): the full GPU consumes all of it, a partition its
    profile's share and its memory slices, so the scheduler never places two partitions on one memory
    slice, more engines than the GPU has, nor a partition beside the full GPU.
    """
    totals: dict[str, int] = {}
    for p in gpu.mig_profiles:
        for k, v in _counters(p).items():
            totals[k] = max(totals.get(k, 0), v)
    slices = sorted({s for p in gpu.mig_profiles for st in p.starts for s in range(st, st + p.size)})
    totals.update({f"memory-slice-{s}": 1 for s in slices})
    cset = counter_set_name(gpu)
    out = []
    # The full GPU of a GPU in MIG mode is its whole-GPU instance (7g on an A100): MIG mode stays on
    # (turning it off needs a GPU reset), and a container sees one MIG device spanning every slice.
    whole = [p for p in gpu.mig_profiles if p.size == len(slices) and 0 in p.starts]
    if whole:
        top = max(whole, key=lambda p: (p.compute_slices, p.memory_bytes))
        full = _gpu_device(node, gpu, domain, None)
        out.append(replace(full, counter_set=cset, consumes=tuple(sorted(totals.items())),
                           mig_profile_id=top.profile_id, mig_start=0))  # fmt: skip
    for p in gpu.mig_profiles:
        for start in p.starts:
            attrs: dict[str, tuple[AttrKind, AttrValue]] = {
                "type": ("string", "mig"), "parentUUID": ("string", gpu.uuid), "profile": ("string", p.name),
            }  # fmt: skip
            attrs.update(_common(node, gpu))
            cap = {
                "memory": p.memory_bytes, "multiprocessors": p.multiprocessors, "copyEngines": p.copy_engines,
                "decoders": p.decoders, "encoders": p.encoders, "jpegEngines": p.jpeg_engines,
                "ofaEngines": p.ofa_engines,
            }  # fmt: skip
            use = {**_counters(p), **{f"memory-slice-{s}": 1 for s in range(start, start + p.size)}}
            name = mig_device_name(gpu.minor, p.name, p.profile_id, start)
            dev = DriverDevice(name, "mig", "", gpu.minor, attrs, cap, gpu.uuid, counter_set=cset,
                               consumes=tuple(sorted(use.items())), mig_profile_id=p.profile_id,
                               mig_start=start)  # fmt: skip
            out.append(dev)
    return out


def build_devices(
    node: NodeGpus,
    driver_name: str = DRIVER_NAME,
    sharing: CapacitySharing | None = None,
    dynamic_mig: bool = False,
) -> list[DriverDevice]:
    """All allocatable devices of the node, sorted by name.

    Keys without a domain belong to `driver_name`'s domain when published. With `sharing`, the full
    GPUs it names (not those in MIG mode, nor those whose memory NVML does not report) are published
    for sharing by consumable capacity. With `dynamic_mig`, every GPU in MIG mode whose profiles NVML
    lists is published as partitionable devices (`_dynamic_devices`), whatever instances it has: the
    driver owns MIG on those GPUs, and creates and destroys instances as claims come and go.
    """
    domains = nvlink_domains(node.gpus)
    out: list[DriverDevice] = []
    for gpu in node.gpus:
        if gpu.mig_enabled and dynamic_mig and gpu.mig_profiles:
            out.extend(_dynamic_devices(node, gpu, domains.get(gpu.uuid)))
        elif gpu.mig_enabled:
            out.extend(_mig_device(node, gpu, m) for m in gpu.migs)
        else:
            out.append(_gpu_device(node, gpu, domains.get(gpu.uuid), sharing))
    names = [d.name for d in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate device names from NVML: {', '.join(sorted(dupes))}")
    return sorted(out, key=_sort_key)


def _sort_key(d: DriverDevice) -> tuple[int, str]:
    return (d.minor, d.name)
