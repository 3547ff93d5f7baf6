"""The one simulation on the real node: the GPUs.

Device nodes are made with mknod (`/dev/nvidia<N>` 195:N, `/dev/nvidiactl` 195:255 and the UVM nodes)
because a CDI spec names them by host path and containerd refuses a container whose CDI device node is
missing or is not a device node. Opening one gives ENXIO (no driver behind it), which is all a
container of the simulation needs. The driver's user-space files are real files on disk under the
state directory: versioned `libcuda.so.*` and `libnvidia-ml.so.*` with their symlinks and an
`nvidia-smi` that prints the simulated GPUs.

Device nodes live in the host's /dev (the driver's CDI specs name host paths there); runs share
them and the last run to stop removes the ones draguard made.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.dev.procs import ClusterError

NVIDIA_MAJOR = 195
CTL_MINOR = 255
# nvidia-uvm's major is dynamic on a real host; this one is free on the machines we run on and is
# checked before use.
UVM_MAJOR = 510
DEV = Path("/dev")
# Runs that use the device nodes, one marker file each, and the nodes draguard made.
SHARED = Path("/run/draguard/gpu")
LIB_DIR = "usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class DeviceNode:
    path: Path
    major: int
    minor: int


@dataclass(frozen=True)
class SimGpu:
    minor: int
    name: str
    uuid: str
    memory_mib: int
    bus_id: str


def load_topology(path: Path) -> tuple[str, list[SimGpu]]:
    """The driver version and GPUs of a simulated-NVML topology file."""
    try:
        doc = yaml.safe_load(path.read_text())
        gpus = [
            SimGpu(
                minor=int(g["minor"]),
                name=str(g["name"]),
                uuid=str(g["uuid"]),
                memory_mib=int(g.get("memoryBytes", 0)) // (1 << 20),
                bus_id=str(g.get("pciBusId", "")),
            )
            for g in doc["gpus"]
        ]
        return str(doc.get("driverVersion", "535.104.05")), gpus
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ClusterError(f"{path}: not a simulated-NVML topology ({exc})") from None


def device_nodes(gpus: Sequence[SimGpu]) -> list[DeviceNode]:
    nodes = [DeviceNode(DEV / f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor) for g in gpus]
    nodes.append(DeviceNode(DEV / "nvidiactl", NVIDIA_MAJOR, CTL_MINOR))
    nodes.append(DeviceNode(DEV / "nvidia-uvm", UVM_MAJOR, 0))
    nodes.append(DeviceNode(DEV / "nvidia-uvm-tools", UVM_MAJOR, 1))
    return nodes


def _is_node(n: DeviceNode) -> bool:
    try:
        st = n.path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == n.major and os.minor(st.st_rdev) == n.minor


def _created_list() -> Path:
    return SHARED / "created.json"


def _load_created() -> set[str]:
    try:
        return set(json.loads(_created_list().read_text()))
    except (OSError, ValueError):
        return set()


def make_device_nodes(run_id: str, state_dir: Path, gpus: Sequence[SimGpu]) -> list[str]:
    """mknod the GPUs' nodes (shared by runs); returns their paths."""
    SHARED.mkdir(parents=True, exist_ok=True)
    (SHARED / f"{run_id}.user").write_text(str(state_dir))
    created = _load_created()
    paths = []
    for n in device_nodes(gpus):
        if not _is_node(n):
            if n.path.exists() or n.path.is_symlink():
                raise ClusterError(
                    f"{n.path} exists but is not the character device {n.major}:{n.minor} the "
                    "simulated GPU needs; is a real NVIDIA driver installed? Remove it or run elsewhere"
                )
            try:
                os.mknod(n.path, 0o666 | stat.S_IFCHR, os.makedev(n.major, n.minor))
            except OSError as exc:
                raise ClusterError(f"mknod {n.path} c {n.major} {n.minor}: {exc} (needs root)") from None
            created.add(str(n.path))
        paths.append(str(n.path))
    _created_list().write_text(json.dumps(sorted(created)))
    return paths


def remove_device_nodes(run_id: str) -> list[str]:
    """Drop this run's claim on the nodes; the last live run removes those draguard made."""
    (SHARED / f"{run_id}.user").unlink(missing_ok=True)
    if not SHARED.is_dir():
        return []
    for marker in SHARED.glob("*.user"):
        try:
            live = (Path(marker.read_text()) / "state.json").exists()
        except OSError:
            live = False
        if live:
            return []
        marker.unlink(missing_ok=True)  # a run whose state directory is gone
    removed = []
    for p in sorted(_load_created()):
        path = Path(p)
        st = path.lstat() if path.exists() else None
        if st is not None and stat.S_ISCHR(st.st_mode):
            path.unlink()
            removed.append(p)
    _created_list().unlink(missing_ok=True)
    return removed


def _nvidia_smi(driver_version: str, gpus: Sequence[SimGpu]) -> str:
    rows = "\n".join(f"GPU {g.minor}: {g.name} (UUID: {g.uuid})" for g in gpus)
    table = "\n".join(
        f"| {g.minor:>3}  {g.name[:30]:<30} | {g.bus_id:<16} | {g.memory_mib:>6}MiB |" for g in gpus
    )
    return f"""#!/bin/sh
# Simulated nvidia-smi of a draguard dev node: prints the simulated GPUs, touches no device.
if [ "$1" = "-L" ]; then
cat <<'SMI_END'
{rows}
SMI_END
exit 0
fi
cat <<'SMI_END'
NVIDIA-SMI {driver_version} (simulated)    Driver Version: {driver_version}
{table}
SMI_END
"""


def write_driver_root(root: Path, topology: Path) -> dict[str, Any]:
    """The simulated driver's files under `root`; returns what was written (for status)."""
    version, gpus = load_topology(topology)
    lib = root / LIB_DIR
    lib.mkdir(parents=True, exist_ok=True)
    libs = []
    for name in ("libcuda.so", "libnvidia-ml.so"):
        real = lib / f"{name}.{version}"
        # Not loadable code: a container that dlopens it fails clearly, as it would without a GPU.
        real.write_text(f"draguard simulated {name} {version}\n")
        for link, target in ((f"{name}.1", real.name), (name, f"{name}.1")):
            (lib / link).unlink(missing_ok=True)
            (lib / link).symlink_to(target)
        libs.append(str(real.relative_to(root)))
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(_nvidia_smi(version, gpus))
    smi.chmod(0o755)
    return {"root": str(root), "driver_version": version, "libraries": libs, "gpus": len(gpus)}
