"""A simulated NVIDIA driver installation on disk, laid out like a host's, for a simulated topology.

Real files throughout: versioned libraries with their SONAME and development links (as the
installer makes them), `nvidia-smi` and the other driver binaries (shell scripts answering from
the topology), GSP firmware, the persistenced socket (a bound unix socket), the MIG capability
files under proc/driver/nvidia/capabilities with NVIDIA's minor numbering, and, when run as root,
character device nodes under dev/ (`/dev/nvidia-uvm-tools` is left out on purpose: many hosts
lack it). The libraries are placeholders, not loadable code: nothing here can drive a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
from pathlib import Path

from driver.cdi import HostLayout
from driver.driverroot import SIM_MARKER, Root
from driver.sim import SimulatedNvml

LIB_DIR = "usr/lib/x86_64-linux-gnu"
# (stem, SONAME suffix): most driver libraries have SONAME <stem>.so.1.
LIBRARIES = (
    "libnvidia-ml", "libnvidia-cfg", "libcuda", "libcudadebugger", "libnvidia-opencl",
    "libnvidia-gpucomp", "libnvidia-ptxjitcompiler", "libnvidia-allocator", "libnvidia-nvvm",
    "libnvidia-encode", "libnvcuvid", "libnvidia-glcore", "libGLX_nvidia",
)  # fmt: skip
SONAME_OVERRIDES = {"libGLX_nvidia": "0", "libnvidia-glcore": None}  # None: SONAME is the full version
BINARIES = ("nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
NVIDIA_MAJOR = 195
UVM_MAJOR = 510  # dynamic on a real host; any free major will do here
CAPS_MAJOR = 511


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """NVIDIA's numbering in /proc/driver/nvidia-caps/mig-minors (config=1, monitor=2, then per GPU)."""
    base = 3 + gpu_minor * 135 + gi * 9
    return base if ci is None else base + 1 + ci


def _smi(sim: SimulatedNvml) -> str:
    rows = "\n".join(
        f"{g.index}|{g.uuid}|{g.name}" + "".join(f"\n{g.index}|{m.uuid}|MIG {m.profile}" for m in g.migs)
        for g in sim.gpus
    )
    return f"""#!/bin/sh
# Simulated nvidia-smi (draguard driver/sim): answers `-L` and the default view from the topology;
# lists only what NVIDIA_VISIBLE_DEVICES names when it is set to UUIDs.
DRIVER={shlex.quote(sim.driver_version)}
ROWS={shlex.quote(rows)}
echo "$ROWS" | while IFS='|' read -r idx uuid name; do
  case ",${{NVIDIA_VISIBLE_DEVICES:-all}}," in
    *,all,*|*",$uuid,"*) ;;
    *) continue ;;
  esac
  case "$name" in
    MIG*) echo "  $name Device (UUID: $uuid)" ;;
    *) echo "GPU $idx: $name (UUID: $uuid)" ;;
  esac
done
[ "$1" = "-L" ] || echo "NVIDIA-SMI (simulated)   Driver Version: $DRIVER"
exit 0
"""


def _mknod(path: Path, major: int, minor: int) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
    except PermissionError:
        return False
    return True


def make_driver_root(dest: str | Path, sim: SimulatedNvml, *, device_nodes: bool = True) -> dict[str, object]:
    """Lay out the simulated driver root at `dest`; returns what was made (also in the marker file)."""
    root = Path(dest)
    version = sim.driver_version
    libdir = root / LIB_DIR
    libdir.mkdir(parents=True, exist_ok=True)
    for stem in LIBRARIES:
        real = libdir / f"{stem}.so.{version}"
        real.write_bytes(f"simulated {stem} {version} (draguard driver/sim; not loadable)\n".encode())
        so = SONAME_OVERRIDES.get(stem, "1")
        links = [f"{stem}.so.{so}"] if so is not None else []
        pairs = [(n, real.name) for n in links] + [(f"{stem}.so", links[0] if links else real.name)]
        for link, target in pairs:
            p = libdir / link
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            p.symlink_to(target)
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "nvidia-smi").write_text(_smi(sim))
    for name in BINARIES:
        (bindir / name).write_text(f"#!/bin/sh\necho 'simulated {name} {version}'\n")
    for p in bindir.iterdir():
        p.chmod(0o755)
    fw = root / "lib/firmware/nvidia" / version
    fw.mkdir(parents=True, exist_ok=True)
    for name in FIRMWARE:
        (fw / name).write_bytes(b"simulated GSP firmware\n")
    sock_path = root / "run/nvidia-persistenced/socket"
    sock_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        sock_path.unlink()
    if len(str(sock_path)) < 108:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(sock_path))
    caps = root / "proc/driver/nvidia/capabilities"
    for g in sim.gpus:
        for m in g.migs:
            for ci in (None, m.ci_id):
                d = caps / f"gpu{g.minor}/mig/gi{m.gi_id}" / ("" if ci is None else f"ci{ci}")
                d.mkdir(parents=True, exist_ok=True)
                minor = cap_minor(g.minor, m.gi_id, ci)
                text = f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                (d / "access").write_text(text)
    nodes: list[str] = []
    if device_nodes:
        wanted = [("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0)]
        wanted += [(f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor) for g in sim.gpus]
        for g in sim.gpus:
            for m in g.migs:
                for ci in (None, m.ci_id):
                    minor = cap_minor(g.minor, m.gi_id, ci)
                    wanted.append((f"nvidia-caps/nvidia-cap{minor}", CAPS_MAJOR, minor))
        for name, major, minor in wanted:
            if _mknod(root / "dev" / name, major, minor):
                nodes.append(f"/dev/{name}")
    info: dict[str, object] = {
        "driverVersion": version,
        "devRoot": str(root),
        "procRoot": str(root),
        "deviceNodes": sorted(set(nodes)),
    }
    (root / SIM_MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return info


def simulated_layout(
    dest: str | Path, sim: SimulatedNvml, *, hook: str = "none", create: bool = True
) -> HostLayout:
    """The host layout of a simulated driver root at `dest` (laid out first unless `create` is False)."""
    root = Path(dest)
    if create:
        make_driver_root(root, sim)
    layout = HostLayout(dev=Root.of(str(root)), proc=root, driver=Root.of(str(root)),
                        driver_version=sim.driver_version, hook=hook)  # fmt: skip
    layout.refresh()
    return layout
