"""`draguard driver self-check`: the whole node path once, without a cluster (scripts/gpu-check.sh).

NVML inventory, the driver root's files, the CDI spec for one device, then the kubelet's side of the
plugin: registration over its socket, NodePrepareResources for a claim built here, the spec on
disk, NodeUnprepareResources, the spec gone. Prints what it finds; exit status 0 when all held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from driver.cdi import CdiWriter, spec_path
from driver.checkpoint import Checkpoint
from driver.devices import build_devices
from driver.plugin import DRA_SERVICES, PluginServer
from driver.proto import dra_v1_pb2, pluginregistration_pb2
from driver.registration import REGISTRATION_SERVICE
from driver.state import DeviceState

NODE = "self-check"
UID = "6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f00"


class OneClaim:
    """Plays the API server for the one claim the check prepares."""

    def __init__(self, driver: str, device: str) -> None:
        self.obj = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "gpu-check", "namespace": "default", "uid": UID},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": driver, "pool": NODE, "device": device}]}}},
        }  # fmt: skip

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.obj if (namespace, name) == ("default", "gpu-check") else None


def _say(step: str, ok: bool, detail: str = "") -> bool:
    print(f"[{'ok' if ok else 'FAIL'}] {step}{': ' + detail if detail else ''}", flush=True)
    return ok


async def _call(ch: Any, service: str, method: str, req: Any, resp_type: Any) -> Any:
    """One unary call, as the kubelet makes it (no generated stubs)."""
    fn = ch.unary_unary(f"/{service}/{method}", request_serializer=type(req).SerializeToString,
                        response_deserializer=resp_type.FromString)  # fmt: skip
    return await fn(req, timeout=60)


async def _kubelet_side(server: PluginServer, spec_file: Path) -> bool:
    ok = True
    reg_pb = pluginregistration_pb2
    async with grpc.aio.insecure_channel(f"unix://{server.paths.registration}") as ch:
        info = await _call(ch, REGISTRATION_SERVICE, "GetInfo", reg_pb.InfoRequest(), reg_pb.PluginInfo)
        status = reg_pb.RegistrationStatus(plugin_registered=True)
        done = reg_pb.RegistrationStatusResponse
        await _call(ch, REGISTRATION_SERVICE, "NotifyRegistrationStatus", status, done)
    ok &= _say("registration", info.name == server.driver_name,
               f"{info.name} at {info.endpoint}, versions {list(info.supported_versions)}")  # fmt: skip
    claim = dra_v1_pb2.Claim(namespace="default", name="gpu-check", uid=UID)
    async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as ch:
        pb, svc = dra_v1_pb2, DRA_SERVICES["v1"]
        t = time.perf_counter()
        req = pb.NodePrepareResourcesRequest(claims=[claim])
        resp = await _call(ch, svc, "NodePrepareResources", req, pb.NodePrepareResourcesResponse)
        res = resp.claims[UID]
        ids = [i for d in res.devices for i in d.cdi_device_ids]
        ok &= _say("NodePrepareResources", not res.error and bool(ids),
                   res.error or f"{ids} in {1000 * (time.perf_counter() - t):.0f} ms")  # fmt: skip
        ok &= _say("CDI spec written", spec_file.exists(), str(spec_file))
        ureq = pb.NodeUnprepareResourcesRequest(claims=[claim])
        un = await _call(ch, svc, "NodeUnprepareResources", ureq, pb.NodeUnprepareResourcesResponse)
        ok &= _say("NodeUnprepareResources", not un.claims[UID].error, un.claims[UID].error)
        ok &= _say("CDI spec removed", not spec_file.exists())
    return ok


def run(args: argparse.Namespace) -> int:
    from driver.cli import _open, host_layout

    ok = True
    nvml = _open(args)
    t = time.perf_counter()
    node = nvml.enumerate()
    devices = build_devices(node, args.driver_name)
    ok &= _say("NVML inventory", bool(devices),
               f"driver {node.driver_version}, CUDA {node.cuda_driver_version}, {len(node.gpus)} GPU(s), "
               f"{len(node.failed)} unreadable, {len(devices)} device(s) "
               f"in {1000 * (time.perf_counter() - t):.0f} ms"
               + ("" if not node.simulated else f" (SIMULATED from {node.source})"))  # fmt: skip
    for d in devices:
        print(f"    {d.name:<34} {d.type:<4} {d.uuid}  {d.attributes['productName'][1]}")
    for f in node.failed:
        print(f"    GPU index {f.index} left out: {f.error}")
    if not devices:
        return 1
    layout = host_layout(args, node.driver_version)
    files = layout.files
    assert files is not None
    ok &= _say("driver root", bool(files.libraries),
               f"{layout.driver.describe() if layout.driver else '/'}: {len(files.libraries)} libraries, "
               f"{len(files.binaries)} binaries, "
               f"{len(files.firmware)} firmware files, {len(files.sockets)} sockets, "
               f"hook {files.hook or 'none (mounts under /usr/local/nvidia)'}")  # fmt: skip
    smi = next((b for b in files.binaries if b.name == "nvidia-smi"), None)
    if smi is not None:
        p = subprocess.run([str(smi), "-L"], capture_output=True, text=True, timeout=60, check=False)
        ok &= _say("nvidia-smi -L from the driver root", p.returncode == 0, (p.stdout or p.stderr).strip())
    device = args.device or devices[0].name
    base = Path(tempfile.mkdtemp(prefix="dg-gpucheck-", dir="/tmp"))
    try:
        cdi = CdiWriter(base / "cdi", layout)
        state = DeviceState(driver_name=args.driver_name, node_name=NODE, devices=devices,
                            checkpoint=Checkpoint(base / "plugins"), cdi=cdi,
                            claims=OneClaim(args.driver_name, device), nvml=nvml)  # fmt: skip
        server = PluginServer(state, driver_name=args.driver_name, plugin_dir=base / "plugins",
                              registry_dir=base / "registry")  # fmt: skip
        spec_file = spec_path(base / "cdi", UID)

        async def plugin() -> bool:
            await server.start()
            try:
                return await _kubelet_side(server, spec_file)
            finally:
                await server.stop(0)

        # The spec as prepare writes it, printed for the record before the plugin round trip.
        from driver.cdi import CdiDevice

        spec = json.loads(cdi.render(UID, [CdiDevice(state.devices[device], ("gpu",))]))
        print(json.dumps(spec, indent=2))
        if args.cdicheck:
            (base / "check").mkdir()
            (base / "check" / "spec.json").write_text(json.dumps(spec))
            ids = [f"{spec['kind']}={d['name']}" for d in spec["devices"]]
            p = subprocess.run([args.cdicheck, "--spec-dir", str(base / "check"), *ids],
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
            what = "spec loads, devices resolve and apply" if p.returncode == 0 else p.stdout + p.stderr
            ok &= _say("CDI library (tags.cncf.io/container-device-interface)", p.returncode == 0, what)
        ok &= asyncio.run(plugin())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("GPU CHECK:", "OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1
