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
from typing import Any

from ..cdi import HostLayout
from ..driverroot import SIM_MARKER, Root
from . import SimulatedNvml
from .mig import MAX_GPU_INSTANCES, profiles_for

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


def _smi(sim: SimulatedNvml, dev_root: Path | None) -> str:
    """The script: a GPU or MIG device is listed only when NVIDIA_VISIBLE_DEVICES names it (or is
    unset / `all`) and its device nodes are there: in the simulated root's dev/ (`dev_root`) where
    that exists (the host), else in /dev (a claim's container). `dev_root` None: the root has no
    nodes (laid out without root), nothing is checked."""
    rows = []
    for g in sim.gpus:
        nodes = f"nvidiactl nvidia{g.minor}"
        rows.append(f"{g.index}|{g.uuid}|{g.name}|{nodes}")
        for m in g.migs:
            minors = (cap_minor(g.minor, m.gi_id), cap_minor(g.minor, m.gi_id, m.ci_id))
            caps = " ".join(f"nvidia-caps/nvidia-cap{c}" for c in minors)
            rows.append(f"{g.index}|{m.uuid}|MIG {m.profile}|{nodes} {caps}")
    check = "1" if dev_root is not None else "0"
    return f"""#!/bin/sh
# Simulated nvidia-smi (draguard driver/sim): answers `-L` and the default view from the topology.
# Like the real one it shows only devices it can reach: those NVIDIA_VISIBLE_DEVICES names (when it
# lists UUIDs) whose device nodes exist as character devices.
DRIVER={shlex.quote(sim.driver_version)}
SIMDEV={shlex.quote(str(dev_root or ""))}
CHECK={check}
ROWS={shlex.quote(chr(10).join(rows))}
# On the host the simulated root's dev/ holds the nodes; in a container only /dev does.
DEV=/dev
[ -d "$SIMDEV" ] && DEV=$SIMDEV
reachable() {{
  [ "$CHECK" = 1 ] || return 0
  for n in $1; do
    [ -c "$DEV/$n" ] || return 1
  done
}}
LISTED=$(echo "$ROWS" | while IFS='|' read -r idx uuid name nodes; do
  case ",${{NVIDIA_VISIBLE_DEVICES:-all}}," in
    *,all,*|*",$uuid,"*) ;;
    *) continue ;;
  esac
  reachable "$nodes" || continue
  case "$name" in
    MIG*) echo "  $name Device (UUID: $uuid)" ;;
    *) echo "GPU $idx: $name (UUID: $uuid)" ;;
  esac
done)
if [ -z "$LISTED" ]; then
  echo "No devices were found"
  exit 6
fi
echo "$LISTED"
[ "$1" = "-L" ] || echo "NVIDIA-SMI (simulated)   Driver Version: $DRIVER"
exit 0
"""


def _instances(g: Any) -> list[tuple[int, int | None]]:
    """(GPU instance, compute instance or None) pairs whose capability files the GPU has.

    A GPU whose MIG profiles the simulator knows can have instances created at run time (dynamic MIG),
    so it gets the files of every GPU instance id and its full compute instance, as the NVIDIA driver
    lays out all possible ids; others only those of the topology's instances.
    """
    pairs: list[tuple[int, int | None]] = []
    if g.mig_enabled and profiles_for(g.name):
        pairs += [(gi, ci) for gi in range(1, MAX_GPU_INSTANCES + 1) for ci in (None, 0)]
    for m in g.migs:
        pairs += [(m.gi_id, None), (m.gi_id, m.ci_id)]
    return list(dict.fromkeys(pairs))


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
    for name in BINARIES:
        (bindir / name).write_text(f"#!/bin/sh\necho 'simulated {name} {version}'\n")
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
        for gi, ci in _instances(g):
            d = caps / f"gpu{g.minor}/mig/gi{gi}" / ("" if ci is None else f"ci{ci}")
            d.mkdir(parents=True, exist_ok=True)
            minor = cap_minor(g.minor, gi, ci)
            text = f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
            (d / "access").write_text(text)
    nodes: list[str] = []
    wanted: list[tuple[str, int, int]] = []
    if device_nodes:
        wanted = [("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0)]
        wanted += [(f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor) for g in sim.gpus]
        for g in sim.gpus:
            for gi, ci in _instances(g):
                minor = cap_minor(g.minor, gi, ci)
                wanted.append((f"nvidia-caps/nvidia-cap{minor}", CAPS_MAJOR, minor))
        for name, major, minor in wanted:
            if _mknod(root / "dev" / name, major, minor):
                nodes.append(f"/dev/{name}")
    # Written after the nodes: it checks them only where they could be made (mknod needs root).
    made_all = device_nodes and len(nodes) == len(wanted)
    (bindir / "nvidia-smi").write_text(_smi(sim, root / "dev" if made_all else None))
    for p in bindir.iterdir():
        p.chmod(0o755)
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
