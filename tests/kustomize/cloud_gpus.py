"""The GPUs of the clouds' GPU instances, as simulated NVML topologies for the bundled driver.

Product names are the strings NVML returns on those instances; MIG profiles (name, GPU-instance profile
id, memory slices, SMs) are those of NVIDIA's MIG user guide for each board. A node per instance type
with whole GPUs, and for every profile a node whose GPUs are carved into as many instances of it as fit.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from driver.devices import build_devices
from driver.nvml import Nvml
from driver.schema import DRIVER_NAME
from driver.sim import SimulatedNvml
from driver.slices import build_slices


@dataclass(frozen=True)
class Mig:
    profile: str
    gi_profile_id: int
    slices: int  # memory slices (placement size)
    count: int  # most instances per GPU
    memory_mb: int
    sms: int


@dataclass(frozen=True)
class Product:
    name: str  # as NVML reports it
    architecture: str
    cc: str
    memory_gib: int
    mig: tuple[Mig, ...]


def _profiles(
    mem: tuple[int, int, int, int, int, int], sms: tuple[int, int, int, int], gib: str
) -> tuple[Mig, ...]:
    """The six non-media profiles every A100/H100/H200 board offers, from its per-slice memory."""
    one, one2, two, three, four, seven = mem
    s1, s2, s3, s4 = sms
    a, b, c, d = gib.split(",")
    return (
        Mig(f"1g.{a}gb", 19, 1, 7, one, s1),
        Mig(f"1g.{b}gb", 15, 2, 4, one2, s1),
        Mig(f"2g.{b}gb", 14, 2, 3, two, s2),
        Mig(f"3g.{c}gb", 9, 4, 2, three, s3),
        Mig(f"4g.{c}gb", 5, 4, 1, four, s4),
        Mig(f"7g.{d}gb", 0, 8, 1, seven, 98 if s1 == 14 else 132),
    )


A100_40 = Product(
    "NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40,
    _profiles((4864, 9856, 9856, 19968, 19968, 40192), (14, 28, 42, 56), "5,10,20,40"),
)  # fmt: skip
A100_80 = Product(
    "NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 80,
    _profiles((9728, 19968, 19968, 40192, 40192, 80896), (14, 28, 42, 56), "10,20,40,80"),
)  # fmt: skip
A100_80_PCIE = Product("NVIDIA A100 80GB PCIe", "Ampere", "8.0", 80, A100_80.mig)
H100_SXM = Product(
    "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 80,
    _profiles((9856, 19968, 19968, 40192, 40192, 80896), (16, 32, 60, 64), "10,20,40,80"),
)  # fmt: skip
H100_NVL = Product(
    "NVIDIA H100 NVL", "Hopper", "9.0", 94,
    _profiles((11776, 23808, 23808, 47872, 47872, 95744), (16, 32, 60, 64), "12,24,47,94"),
)  # fmt: skip
H200 = Product(
    "NVIDIA H200", "Hopper", "9.0", 141,
    _profiles((17920, 35584, 35584, 71424, 71424, 143872), (16, 32, 60, 64), "18,35,71,141"),
)  # fmt: skip

# Instance type -> (product, GPUs per node).
CLOUDS: dict[str, dict[str, tuple[Product, int]]] = {
    "eks": {
        "p4d.24xlarge": (A100_40, 8),
        "p4de.24xlarge": (A100_80, 8),
        "p5.48xlarge": (H100_SXM, 8),
        "p5e.48xlarge": (H200, 8),
        "p5en.48xlarge": (H200, 8),
    },
    "gke": {
        "a2-highgpu-8g": (A100_40, 8),
        "a2-megagpu-16g": (A100_40, 16),
        "a2-ultragpu-8g": (A100_80, 8),
        "a3-highgpu-8g": (H100_SXM, 8),
        "a3-megagpu-8g": (H100_SXM, 8),
        "a3-ultragpu-8g": (H200, 8),
    },
    "aks": {
        "Standard_ND96asr_v4": (A100_40, 8),
        "Standard_ND96amsr_A100_v4": (A100_80, 8),
        "Standard_NC96ads_A100_v4": (A100_80_PCIE, 4),
        "Standard_NC80adis_H100_v5": (H100_NVL, 2),
        "Standard_ND96isr_H100_v5": (H100_SXM, 8),
        "Standard_ND96isr_H200_v5": (H200, 8),
    },
}


def _uuid(*parts: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, "/".join(map(str, parts))))


def topology(product: Product, gpus: int, mig: Mig | None = None, node: str = "n") -> dict[str, Any]:
    """A node of `gpus` boards; with `mig`, each carved into `mig.count` instances of that profile."""
    out = []
    for i in range(gpus):
        gpu: dict[str, Any] = {
            "name": product.name,
            "uuid": f"GPU-{_uuid(node, i)}",
            "minor": i,
            "brand": "Nvidia",
            "architecture": product.architecture,
            "computeCapability": product.cc,
            "memoryBytes": product.memory_gib * 1024**3,
            "pciBusId": f"00000000:{0x10 + i:02x}:00.0",
        }
        if mig is not None:
            gpu["mig"] = {
                "enabled": True,
                "maxDevices": 7,
                "devices": [
                    {
                        "profile": mig.profile,
                        "giProfileId": mig.gi_profile_id,
                        "placement": {"start": k * mig.slices, "size": mig.slices},
                        "gpuInstanceId": k + 1,
                        "computeInstanceId": 0,
                        "uuid": f"MIG-{_uuid(node, i, k)}",
                        "memoryMB": mig.memory_mb,
                        "multiprocessors": mig.sms,
                    }
                    for k in range(mig.count)
                ],
            }
        out.append(gpu)
    return {"driverVersion": "570.124.06", "cudaDriverVersion": 12080, "gpus": out}


def node_slices(product: Product, gpus: int, mig: Mig | None, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices the bundled driver publishes for such a node."""
    sim = SimulatedNvml(topology(product, gpus, mig, node), f"<{node}>")
    devices = build_devices(Nvml(sim, simulated=True, source=sim.source).enumerate())
    return build_slices(devices, node_name=node, driver_name=DRIVER_NAME, generation=1)


def cloud_slices(cloud: str) -> list[dict[str, Any]]:
    """Every instance type of `cloud`, whole and carved into each profile its board offers."""
    out: list[dict[str, Any]] = []
    for itype, (product, gpus) in CLOUDS[cloud].items():
        base = itype.lower().replace(".", "-").replace("_", "-")
        out += node_slices(product, gpus, None, base)
        for m in product.mig:
            out += node_slices(product, min(gpus, 2), m, f"{base}-mig-{m.profile.replace('.', '')}")
    return out
