"""Runs the plugin in its own process for crash tests: `python plugin_proc.py CONFIG.json`.

The claim reader plays the API from a JSON file; `crashAt` names a fault point where the process
kills itself (os._exit, no cleanup), exactly like a node-level crash of the plugin container.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from driver.cdi import CdiWriter
from driver.checkpoint import Checkpoint
from driver.devices import build_devices
from driver.nvml import open_sim
from driver.plugin import PluginServer
from driver.sharing import parse_capacity_sharing
from driver.sim.driverroot import simulated_layout
from driver.state import DeviceState


class FileClaims:
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        for obj in json.loads(self.path.read_text()):
            if obj["metadata"]["namespace"] == namespace and obj["metadata"]["name"] == name:
                return obj
        return None


async def main(cfg: dict[str, Any]) -> None:
    base = Path(cfg["base"])
    nvml = open_sim(cfg["topology"])
    crash_at = cfg.get("crashAt")

    def fault(point: str) -> None:
        if point == crash_at:
            os._exit(137)

    state = DeviceState(
        driver_name="gpu.nvidia.com",
        node_name=cfg["node"],
        devices=build_devices(
            nvml.enumerate(),
            sharing=parse_capacity_sharing(cfg.get("shareByCapacity")),
            dynamic_mig=bool(cfg.get("dynamicMig")),
        ),
        checkpoint=Checkpoint(base / "plugins"),
        # `simRoot`: a simulated driver root made beforehand (the plugin may not be able to write base/).
        cdi=CdiWriter(
            base / "cdi",
            simulated_layout(cfg.get("simRoot") or base / "root", nvml.lib, create="simRoot" not in cfg),
        ),
        claims=FileClaims(cfg["claims"]),
        nvml=nvml,
        version=cfg.get("version", "0.1.0"),
        fault=fault,
    )
    report = state.recover()
    server = PluginServer(
        state, driver_name="gpu.nvidia.com", plugin_dir=base / "plugins", registry_dir=base / "registry"
    )
    await server.start()
    print(
        json.dumps(
            {
                "ready": True,
                "rolledBack": report.rolled_back,
                "dropped": report.dropped,
                "orphans": report.orphan_specs_removed,
                "kept": report.kept,
            }
        ),
        flush=True,
    )
    await server.wait()


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
