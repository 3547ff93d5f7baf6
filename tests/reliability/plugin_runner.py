"""The DRA kubelet plugin in its own process, for kill -9 tests: `python plugin_runner.py BASE_DIR`.

The real DeviceState, checkpoint, CDI writer and gRPC servers over unix sockets; the GPU is the
simulated NVML and claims are read from BASE_DIR/claims.json (the API side). Fault injection is
the driver's own: DRAGUARD_DRIVER_CRASH_AT=<point> makes the process exit at that point.
Prints one JSON line with the recovery report once serving.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from driver.cdi import CdiWriter
from driver.checkpoint import Checkpoint
from driver.devices import build_devices
from driver.nvml import open_sim
from driver.plugin import PluginServer
from driver.sim.driverroot import simulated_layout
from driver.state import DeviceState

NODE = "node-a"


class FileClaims:
    def __init__(self, path: Path) -> None:
        self.path = path

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        for obj in json.loads(self.path.read_text()):
            if obj["metadata"]["namespace"] == namespace and obj["metadata"]["name"] == name:
                return dict(obj)
        return None


async def main(base: Path) -> None:
    nvml = open_sim("h100-8x-nvlink")
    layout = simulated_layout(base / "root", nvml.lib)  # driver files and device nodes, as on a GPU host
    state = DeviceState(
        driver_name="gpu.nvidia.com",
        node_name=NODE,
        devices=build_devices(nvml.enumerate()),
        checkpoint=Checkpoint(base / "plugins"),
        cdi=CdiWriter(base / "cdi", layout),
        claims=FileClaims(base / "claims.json"),
        nvml=nvml,
    )
    report = state.recover()
    server = PluginServer(
        state, driver_name="gpu.nvidia.com", plugin_dir=base / "plugins", registry_dir=base / "registry"
    )
    await server.start()
    print(
        json.dumps(
            {
                "rolledBack": report.rolled_back,
                "dropped": report.dropped,
                "orphans": report.orphan_specs_removed,
                "kept": report.kept,
                "quarantined": report.checkpoint_quarantined,
            }
        ),
        flush=True,
    )
    await server.wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
