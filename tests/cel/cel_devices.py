"""Devices shaped like the bundled driver publishes them, for the CEL tests."""

from __future__ import annotations

from webhook.dra.device import Device, Version

DRIVER = "gpu.nvidia.com"
K8S = "resource.kubernetes.io"
A100 = "NVIDIA A100 80GB PCIe"
H100 = "NVIDIA H100 80GB HBM3"


def gpu(
    node: str, index: int, product: str = A100, memory: str = "80Gi", driver_version: str = "550.54.15"
) -> Device:
    return Device(
        driver=DRIVER,
        pool=node,
        name=f"gpu-{index}",
        node=node,
        attributes={
            DRIVER: {
                "type": "gpu",
                "uuid": f"GPU-{node}-{index:04d}",
                "productName": product,
                "architecture": "Hopper" if product == H100 else "Ampere",
                "cudaComputeCapability": Version("9.0.0" if product == H100 else "8.0.0"),
                "driverVersion": Version(driver_version),
            },
            K8S: {"pciBusID": f"0000:{0x18 + index:02x}:00.0"},
        },
        capacity={DRIVER: {"memory": memory}},
    )


def mig(node: str, parent: int, index: int, profile: str = "3g.20gb") -> Device:
    return Device(
        driver=DRIVER,
        pool=node,
        name=f"gpu-{parent}-mig-{profile}-{index}",
        node=node,
        attributes={
            DRIVER: {
                "type": "mig",
                "uuid": f"MIG-{node}-{parent}-{index}",
                "parentUUID": f"GPU-{node}-{parent:04d}",
                "productName": A100,
                "profile": profile,
                "driverVersion": Version("550.54.15"),
            },
            K8S: {"pciBusID": f"0000:{0x18 + parent:02x}:00.0"},
        },
        capacity={DRIVER: {"memory": "20Gi", "multiprocessors": "42"}},
    )


def other_driver(node: str, index: int) -> Device:
    return Device(
        driver="fpga.example.com",
        pool=node,
        name=f"fpga-{index}",
        node=node,
        attributes={"fpga.example.com": {"model": "u250", "productName": A100}},
        capacity={},
    )


def inventory() -> list[Device]:
    """Two nodes: four A100s (one split into two MIG 3g.20gb), four H100s, and one FPGA."""
    devices = [gpu("node-a", i) for i in range(1, 4)]
    devices += [mig("node-a", 0, i) for i in range(2)]
    devices += [gpu("node-b", i, H100, memory="81559Mi", driver_version="570.86.10") for i in range(4)]
    devices.append(other_driver("node-c", 0))
    return devices
