"""The GPUs of the clouds' GPU instances, as simulated NVML topologies for the bundled driver.

Product names are the strings NVML returns on those instances; MIG profiles (name, GPU-instance profile
id, memory slices, SMs) are those of NVIDIA's MIG user guide or of `nvidia-smi mig -lgip` listings for
each board (each source is cited where the board is defined; a figure no source gives says so). A node
per instance type with whole GPUs, and for every profile a node whose GPUs are carved into as many
instances of it as fit.
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
    # The class suffix when it is not the profile's own name: one board reports a profile under two
    # names depending on its firmware (GB200's 1g.23gb / 1g.24gb), and one class serves both.
    cls: str | None = None

    @property
    def class_suffix(self) -> str:
        return self.cls or self.profile.replace(".", "")

    @property
    def compute_slices(self) -> int:
        return int(self.profile.split("g.")[0])


@dataclass(frozen=True)
class Product:
    name: str  # as NVML reports it
    architecture: str
    cc: str
    memory_gib: int
    mig: tuple[Mig, ...]
    family: str = ""  # the DeviceClass family: gpu.nvidia.com-<family>[-mig-<profile>]
    # Which workloads the shipped tier policy gives the board: "llm" (Hopper and Blackwell
    # datacenter boards), "training" (A100), "inference" (L4, L40S, A10G, T4, RTX PRO 6000).
    grade: str = "training"
    mig_slices: int = 7  # compute slices of the whole board; most MIG devices on one GPU


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
    _profiles((4864, 9856, 9856, 19968, 19968, 40192), (14, 28, 42, 56), "5,10,20,40"), "a100",
)  # fmt: skip
A100_80 = Product(
    "NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 80,
    _profiles((9728, 19968, 19968, 40192, 40192, 80896), (14, 28, 42, 56), "10,20,40,80"), "a100",
)  # fmt: skip
A100_80_PCIE = Product("NVIDIA A100 80GB PCIe", "Ampere", "8.0", 80, A100_80.mig, "a100")
H100_SXM = Product(
    "NVIDIA H100 80GB HBM3", "Hopper", "9.0", 80,
    _profiles((9856, 19968, 19968, 40192, 40192, 80896), (16, 32, 60, 64), "10,20,40,80"), "h100", "llm",
)  # fmt: skip
H100_NVL = Product(
    "NVIDIA H100 NVL", "Hopper", "9.0", 94,
    _profiles((11776, 23808, 23808, 47872, 47872, 95744), (16, 32, 60, 64), "12,24,47,94"), "h100", "llm",
)  # fmt: skip
H200 = Product(
    "NVIDIA H200", "Hopper", "9.0", 141,
    _profiles((17920, 35584, 35584, 71424, 71424, 143872), (16, 32, 60, 64), "18,35,71,141"), "h200", "llm",
)  # fmt: skip

# Blackwell. Product names: NVIDIA's own NVML mock (NVIDIA/k8s-test-infra,
# deployments/nvml-mock/helm/nvml-mock/profiles/{b200,gb200}.yaml, device_defaults.name) and
# nvidia-smi output in public reports. MIG profiles: `nvidia-smi mig -lgip` on a B200 in
# NVIDIA/gpu-operator#1242 and #1351 (1g.23gb id 19 x7 18 SMs, 1g.45gb id 15 x4 30 SMs, 2g.45gb
# id 14 x3 36 SMs, 3g.90gb, 4g.90gb, 7g.180gb); the listing is cut after 2g, so the SM counts and
# memory of 3g/4g/7g are 18 SMs per compute slice and twice/four times the 2-slice memory (they
# only feed the simulated device, never a class or a quota).
B200 = Product(
    "NVIDIA B200", "Blackwell", "10.0", 180,
    (
        Mig("1g.23gb", 19, 1, 7, 22528, 18),
        Mig("1g.45gb", 15, 2, 4, 45312, 30),
        Mig("2g.45gb", 14, 2, 3, 45312, 36),
        Mig("3g.90gb", 9, 4, 2, 90624, 54),
        Mig("4g.90gb", 5, 4, 1, 90624, 72),
        Mig("7g.180gb", 0, 8, 1, 181248, 126),
    ),
    "b200", "llm",
)  # fmt: skip
# GB200: `nvidia-smi mig -lgip` in NVIDIA/gpu-operator#1303 (HGX GB200: 1g.24gb id 19 18 SMs,
# 1g.47gb id 15 32 SMs, 2g.47gb id 14 38 SMs) and NVIDIA/mig-parted#227 (other GB200 firmware
# names the smallest profile 1g.23gb); the larger names (3g.93gb, 4g.93gb, 7g.186gb) are those of
# NVIDIA's default mig-parted config as quoted by the NVML mock's profiles/mig/gb200.yaml. The
# bundle's GB200 MIG classes match on the compute-slice part of the profile for that reason.
GB200 = Product(
    "NVIDIA GB200", "Blackwell", "10.0", 186,
    (
        Mig("1g.23gb", 19, 1, 7, 23808, 18),
        Mig("1g.24gb", 19, 1, 7, 20480, 18, cls="1g23gb"),
        Mig("1g.47gb", 15, 2, 4, 46592, 32),
        Mig("2g.47gb", 14, 2, 3, 46592, 38),
        Mig("3g.93gb", 9, 4, 2, 95232, 54),
        Mig("4g.93gb", 5, 4, 1, 95232, 72),
        Mig("7g.186gb", 0, 8, 1, 190464, 126),
    ),
    "gb200", "llm",
)  # fmt: skip
# RTX PRO 6000 Blackwell Server Edition: the name as nvidia-smi --query-gpu=name prints it in public
# run logs; MIG on 4 compute slices, at most 4 instances (`nvidia-smi mig -lgip` in
# bigstack-oss/cubecos#312 and GoogleCloudPlatform/container-engine-accelerators#564: 1g.24gb id 14
# x4 46 SMs, then 2g.48gb x2 and 4g.96gb x1, whose ids and SMs those listings cut off: modelled as
# 2 and 4 times the 1-slice figures). "+gfx" and "+me" variants get no class.
RTX_PRO_6000 = Product(
    "NVIDIA RTX PRO 6000 Blackwell Server Edition", "Blackwell", "12.0", 96,
    (
        Mig("1g.24gb", 14, 1, 4, 23674, 46),
        Mig("2g.48gb", 5, 2, 2, 47348, 92),
        Mig("4g.96gb", 0, 4, 1, 94696, 184),
    ),
    "rtxpro6000", "inference", 4,
)  # fmt: skip
# Boards without MIG. nvidia-smi "Product Name" lines in public reports: "NVIDIA L4" and "NVIDIA L40S"
# (nvidia-smi -q logs; NVIDIA's NVML mock profiles/l40s.yaml), "NVIDIA A10G" (`nvidia-smi -L` on AWS
# g5 instances in public run logs), "Tesla T4" (nvidia-smi -q in NVIDIA/nvidia-docker#1628; NVIDIA's
# NVML mock profiles/t4.yaml). The T4 class also accepts "NVIDIA T4" in case a driver renames it.
L4 = Product("NVIDIA L4", "Ada Lovelace", "8.9", 24, (), "l4", "inference")
L40S = Product("NVIDIA L40S", "Ada Lovelace", "8.9", 48, (), "l40s", "inference")
A10G = Product("NVIDIA A10G", "Ampere", "8.6", 24, (), "a10g", "inference")
T4 = Product("Tesla T4", "Turing", "7.5", 16, (), "t4", "inference")

# Instance type -> (product, GPUs per node).
CLOUDS: dict[str, dict[str, tuple[Product, int]]] = {
    "eks": {
        "p4d.24xlarge": (A100_40, 8),
        "p4de.24xlarge": (A100_80, 8),
        "p5.48xlarge": (H100_SXM, 8),
        "p5e.48xlarge": (H200, 8),
        "p5en.48xlarge": (H200, 8),
        "p6-b200.48xlarge": (B200, 8),
        "p6e-gb200.36xlarge": (GB200, 4),  # the UltraServer's node (aws/sagemaker-hyperpod-cli#403)
        "g6.48xlarge": (L4, 8),
        "g6e.48xlarge": (L40S, 8),
        "g5.48xlarge": (A10G, 8),
        "g4dn.12xlarge": (T4, 4),
    },
    "gke": {
        "a2-highgpu-8g": (A100_40, 8),
        "a2-megagpu-16g": (A100_40, 16),
        "a2-ultragpu-8g": (A100_80, 8),
        "a3-highgpu-8g": (H100_SXM, 8),
        "a3-megagpu-8g": (H100_SXM, 8),
        "a3-ultragpu-8g": (H200, 8),
        "a4-highgpu-8g": (B200, 8),
        "a4x-highgpu-4g": (GB200, 4),
        "g2-standard-96": (L4, 8),
        "g4-standard-384": (RTX_PRO_6000, 8),
    },
    "aks": {
        "Standard_ND96asr_v4": (A100_40, 8),
        "Standard_ND96amsr_A100_v4": (A100_80, 8),
        "Standard_NC96ads_A100_v4": (A100_80_PCIE, 4),
        "Standard_NC80adis_H100_v5": (H100_NVL, 2),
        "Standard_ND96isr_H100_v5": (H100_SXM, 8),
        "Standard_ND96isr_H200_v5": (H200, 8),
        "Standard_ND128isr_NDR_GB200_v6": (GB200, 4),
        "Standard_NC64as_T4_v3": (T4, 4),
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
                "maxDevices": product.mig_slices,
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
