"""Helpers shared by the driver tests (the kubelet side and the API side are played here)."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import grpc

from driver.cdi import CdiWriter, HostLayout
from driver.checkpoint import Checkpoint
from driver.devices import build_devices
from driver.nvml import Nvml, open_sim
from driver.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from driver.sharing import CapacitySharing
from driver.sim.driverroot import simulated_layout
from driver.state import ClaimReadError, DeviceState

NODE = "node-a"
DRIVER = "gpu.nvidia.com"


def make_claim(
    name: str,
    uid: str,
    devices: list[tuple[str, str]] | None = None,
    *,
    namespace: str = "default",
    driver: str = DRIVER,
    pool: str = NODE,
    config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim (resource.k8s.io/v1 JSON) allocated to (request, device) pairs."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": req, "driver": driver, "pool": pool, "device": dev}
                    for req, dev in (devices or [("gpu", "gpu-0")])
                ],
                "config": config or [],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}
                ]
            },
        }
    return obj


def opaque(
    params: dict[str, Any], requests: list[str] | None = None, source: str = "FromClaim"
) -> dict[str, Any]:
    return {"source": source, "requests": requests or [], "opaque": {"driver": DRIVER, "parameters": params}}


class InMemoryClaims:
    """Plays the API server's ResourceClaim endpoint (thread-safe, as the plugin reads from threads)."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.unavailable = False
        self.reads = 0

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return obj

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            self._claims.pop((namespace, name), None)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self.reads += 1
            if self.unavailable:
                raise ClaimReadError("reading ResourceClaim: connection refused")
            obj = self._claims.get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None


def sim_layout(base: Path, nvml: Nvml, *, hook: str = "none") -> HostLayout:
    """A simulated driver root under `base/root` (device nodes when run as root) and its layout."""
    return simulated_layout(base / "root", nvml.lib, hook=hook)


def make_state(
    base: Path,
    claims: Any,
    *,
    topology: str = "h100-8x-nvlink",
    version: str = "0.1.0",
    nvml: Nvml | None = None,
    fault: Any = None,
    sharing: CapacitySharing | None = None,
    dynamic_mig: bool = False,
) -> DeviceState:
    nvml = nvml or open_sim(topology)
    devices = build_devices(nvml.enumerate(), sharing=sharing, dynamic_mig=dynamic_mig)
    return DeviceState(
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices,
        checkpoint=Checkpoint(base / "plugins"),
        cdi=CdiWriter(base / "cdi", sim_layout(base, nvml)),
        claims=claims,
        nvml=nvml,
        version=version,
        fault=fault,
    )


def claim_msg(pb: Any, obj: dict[str, Any]) -> Any:
    m = obj["metadata"]
    return pb.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


class Kubelet:
    """The kubelet side: registration handshake, then DRA calls on the advertised endpoint."""

    def __init__(self, registration_socket: Path) -> None:
        self.reg_channel = grpc.aio.insecure_channel(f"unix://{registration_socket}")
        self.dra_channel: grpc.aio.Channel | None = None
        self.info: Any = None

    async def register(self) -> Any:
        reg = pluginregistration_pb2_grpc.RegistrationStub(self.reg_channel)
        self.info = await reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
        self.dra_channel = grpc.aio.insecure_channel(f"unix://{self.info.endpoint}")
        await reg.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
        return self.info

    def _stub(self, version: str) -> tuple[Any, Any]:
        assert self.dra_channel is not None, "register() first"
        if version == "v1":
            return dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub(self.dra_channel)
        return dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub(self.dra_channel)

    async def prepare(self, *claims: dict[str, Any], version: str = "v1") -> Any:
        pb, stub = self._stub(version)
        req = pb.NodePrepareResourcesRequest(claims=[claim_msg(pb, c) for c in claims])
        return await stub.NodePrepareResources(req, timeout=45)

    async def unprepare(self, *claims: dict[str, Any], version: str = "v1") -> Any:
        pb, stub = self._stub(version)
        req = pb.NodeUnprepareResourcesRequest(claims=[claim_msg(pb, c) for c in claims])
        return await stub.NodeUnprepareResources(req, timeout=45)

    async def close(self) -> None:
        await self.reg_channel.close()
        if self.dra_channel is not None:
            await self.dra_channel.close()
