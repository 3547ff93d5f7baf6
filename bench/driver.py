"""Driver benchmarks: prepare latency and ResourceSlice build/validation time.

Run: `.venv/bin/python bench/driver.py [--iterations N]`. Uses the simulated NVML and real files
(checkpoint with fsync, CDI specs) in a temporary directory; prepare is measured both in-process
and over gRPC on a unix socket as kubelet calls it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import pct
from driver.cdi import CdiWriter
from driver.checkpoint import Checkpoint
from driver.devices import build_devices
from driver.nvml import open_sim
from driver.plugin import PluginServer
from driver.proto import dra_v1_pb2, pluginregistration_pb2
from driver.sim.driverroot import simulated_layout
from driver.slices import build_slices, validate_slices
from driver.state import ClaimRef, DeviceState

NODE = "bench-node"
DRIVER = "gpu.nvidia.com"


class Claims:
    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}

    def add(self, name: str, uid: str, devices: list[str]) -> None:
        self.objs[name] = {
            "metadata": {"name": name, "namespace": "bench", "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
                        ]
                    }
                }
            },
        }

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get(name)


def fmt(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{label:<58} p50 {pct(ms, 50):7.2f} ms   p99 {pct(ms, 99):7.2f} ms   (n={len(ms)})"


def make_state(base: Path, claims: Claims) -> DeviceState:
    nvml = open_sim("h100-8x-nvlink")
    return DeviceState(
        driver_name=DRIVER,
        node_name=NODE,
        devices=build_devices(nvml.enumerate()),
        checkpoint=Checkpoint(base / "plugins"),
        cdi=CdiWriter(base / "cdi", simulated_layout(base / "root", nvml.lib)),
        claims=claims,
        nvml=nvml,
    )


def bench_in_process(base: Path, n: int, ndev: int) -> tuple[list[float], list[float]]:
    claims = Claims()
    state = make_state(base, claims)
    prep, unprep = [], []
    devices = [f"gpu-{i}" for i in range(ndev)]
    for i in range(n):
        claims.add(f"c{i}", f"uid-{ndev}-{i}", devices)
        ref = ClaimRef("bench", f"c{i}", f"uid-{ndev}-{i}")
        t = time.perf_counter()
        out = state.prepare(ref)
        prep.append(time.perf_counter() - t)
        assert not out.error, out.error
        t = time.perf_counter()
        assert state.unprepare(ref) == ""
        unprep.append(time.perf_counter() - t)
    return prep, unprep


async def bench_grpc(base: Path, n: int, ndev: int) -> list[float]:
    import grpc

    claims = Claims()
    state = make_state(base, claims)
    server = PluginServer(state, driver_name=DRIVER, plugin_dir=base / "p", registry_dir=base / "r")
    await server.start()
    out = []
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.paths.registration}") as reg:
            info = await reg.unary_unary(
                "/pluginregistration.Registration/GetInfo",
                request_serializer=pluginregistration_pb2.InfoRequest.SerializeToString,
                response_deserializer=pluginregistration_pb2.PluginInfo.FromString,
            )(pluginregistration_pb2.InfoRequest())
        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as ch:
            prepare = ch.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                request_serializer=dra_v1_pb2.NodePrepareResourcesRequest.SerializeToString,
                response_deserializer=dra_v1_pb2.NodePrepareResourcesResponse.FromString,
            )
            unprepare = ch.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
                request_serializer=dra_v1_pb2.NodeUnprepareResourcesRequest.SerializeToString,
                response_deserializer=dra_v1_pb2.NodeUnprepareResourcesResponse.FromString,
            )
            devices = [f"gpu-{i}" for i in range(ndev)]
            for i in range(n):
                uid = f"g-{ndev}-{i}"
                claims.add(f"g{i}", uid, devices)
                claim = dra_v1_pb2.Claim(namespace="bench", name=f"g{i}", uid=uid)
                t = time.perf_counter()
                resp = await prepare(dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]))
                out.append(time.perf_counter() - t)
                assert not resp.claims[uid].error and len(resp.claims[uid].devices) == ndev
                await unprepare(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]))
    finally:
        await server.stop(0)
    return out


def topology_512(path: Path) -> Path:
    gpus = []
    for g in range(64):  # 64 A100 with 7 MIG 1g.10gb each = 448 devices
        migs = [
            {
                "profile": "1g.10gb",
                "giProfileId": 19,
                "placement": {"start": i, "size": 1},
                "gpuInstanceId": i + 7,
                "uuid": f"MIG-{g:04x}-{i}",
                "memoryMB": 9856,
                "multiprocessors": 14,
                "copyEngines": 1,
                "decoders": 0,
            }
            for i in range(7)
        ]
        gpus.append(
            {
                "name": "NVIDIA A100 80GB PCIe",
                "uuid": f"GPU-a{g:04x}",
                "minor": g,
                "architecture": "Ampere",
                "computeCapability": "8.0",
                "memoryBytes": 85899345920,
                "pciBusId": f"00000000:{g:02x}:00.0",
                "mig": {"enabled": True, "devices": migs},
            }
        )
    for g in range(64):  # plus 64 full H100 in NVLink groups of 8 = 512 devices
        gpus.append(
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": f"GPU-h{g:04x}",
                "minor": 64 + g,
                "architecture": "Hopper",
                "computeCapability": "9.0",
                "memoryBytes": 81559 * 2**20,
                "pciBusId": f"00000001:{g:02x}:00.0",
                "nvlinks": [f"00000002:{g // 8:02x}:00.0"] * 18,
            }
        )
    path.write_text(yaml.safe_dump({"driverVersion": "550.54.15", "cudaDriverVersion": 12040, "gpus": gpus}))
    return path


def bench_slices(base: Path, repeats: int) -> tuple[int, int, list[float], list[float]]:
    node = open_sim(topology_512(base / "t512.yaml")).enumerate()
    enum_t, build_t = [], []
    devices = build_devices(node)
    for _ in range(repeats):
        t = time.perf_counter()
        devices = build_devices(node)
        enum_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        slices = build_slices(devices, node_name=NODE, driver_name=DRIVER, generation=1)
        validate_slices(slices)
        build_t.append(time.perf_counter() - t)
    return len(devices), len(slices), enum_t, build_t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=200)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    base = Path(tempfile.mkdtemp(prefix="dgb-", dir="/tmp"))
    try:
        print(f"draguard driver benchmark (simulated NVML, real files under {base})")
        for ndev in (1, 8):
            prep, unprep = bench_in_process(base / f"ip{ndev}", args.iterations, ndev)
            print(fmt(f"prepare, {ndev}-device claim (in-process)", prep))
            print(fmt(f"unprepare, {ndev}-device claim (in-process)", unprep))
            grpc_t = asyncio.run(bench_grpc(base / f"g{ndev}", args.iterations, ndev))
            print(fmt(f"prepare, {ndev}-device claim (gRPC, unix socket)", grpc_t))
        ndevs, nslices, enum_t, build_t = bench_slices(base, 20)
        print(fmt(f"devices from NVML data ({ndevs} devices)", enum_t))
        print(fmt(f"slice build + validation ({ndevs} devices, {nslices} slices)", build_t))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
