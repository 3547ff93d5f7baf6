"""CDI specs: one transient spec per prepared claim, written before its ids go back to kubelet.

Vendor/class `k8s.gpu.nvidia.com/claim`; file `<cdiRoot>/k8s.gpu.nvidia.com-claim_<claimUID>.json`
(mode 0644: the container runtime reads it); device names `<claimUID>-<device>`; ids
`k8s.gpu.nvidia.com/claim=<claimUID>-<device>`.

Each device carries its own device nodes (`/dev/nvidia<minor>`; a MIG device also its GPU and
compute instance capability nodes `/dev/nvidia-caps/nvidia-cap<minor>`, minors read from
/proc/driver/nvidia/capabilities) and `NVIDIA_VISIBLE_DEVICES` listing the UUIDs of all the claim's
devices (the same value on each, so the order in which the runtime applies them does not matter).
Spec-wide edits hold what every GPU container needs: the control nodes, the driver's libraries,
binaries, firmware and IPC sockets from the driver root (see driver/driverroot.py). Only device
nodes that exist are listed. Where the host has nvidia-container-toolkit's `nvidia-cdi-hook`,
libraries are mounted at their driver-root paths and the hooks make their SONAME links and ldcache;
without it they are mounted under /usr/local/nvidia/{lib64,bin}, where CUDA images look
(LD_LIBRARY_PATH and PATH of the nvidia/cuda images), each also under its SONAME link names.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write
from .devices import DriverDevice
from .driverroot import DEFAULT_CAPABILITIES, DriverFiles, Root, discover, read_cap_minor

CDI_VERSION = "0.6.0"
VENDOR = "k8s.gpu.nvidia.com"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
NO_HOOK_LIB_DIR = "/usr/local/nvidia/lib64"
NO_HOOK_BIN_DIR = "/usr/local/nvidia/bin"
SPEC_MODE = 0o644
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class CdiError(RuntimeError):
    """A claim's spec cannot be built (a device node or capability is missing on the host)."""


@dataclass(frozen=True)
class CdiDevice:
    """A device of one claim, with the request names it serves.

    A share of a GPU (consumable capacity) names its `share_id` and the memory it holds: each share
    is a CDI device of its own, so two shares of one GPU in one claim never collide.
    """

    device: DriverDevice
    requests: tuple[str, ...]
    share_id: str | None = None
    memory_limit: int | None = None

    @property
    def name(self) -> str:
        return self.device.name if self.share_id is None else f"{self.device.name}-{self.share_id}"


@dataclass
class HostLayout:
    """Where the driver, /dev and /proc are on the host and in this process.

    `files` is the driver-root discovery (None: no driver root, device nodes only). It is read once
    and again on `refresh()`; device nodes and MIG minors are looked up for every spec.
    """

    dev: Root = field(default_factory=lambda: Root.of("/"))
    proc: Path = Path("/")
    driver: Root | None = None
    driver_version: str = ""
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    hook: str = "auto"
    files: DriverFiles | None = None

    def refresh(self) -> None:
        if self.driver is not None and self.driver_version:
            self.files = discover(self.driver, self.driver_version, self.capabilities, self.hook)


def spec_path(cdi_root: Path, claim_uid: str) -> Path:
    if not _UID.match(claim_uid):
        raise ValueError(f"claim UID {claim_uid!r} cannot be used in a CDI file name")
    return cdi_root / f"{VENDOR}-{CLASS}_{claim_uid}.json"


def device_id(claim_uid: str, device_name: str) -> str:
    return f"{KIND}={claim_uid}-{device_name}"


def _node(layout: HostLayout, path: str) -> dict[str, Any] | None:
    seen = layout.dev.mount / path.lstrip("/")
    try:
        mode = os.stat(seen).st_mode
    except OSError:
        return None
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        return None
    out: dict[str, Any] = {"path": path}
    host = layout.dev.to_host(seen)
    if host != path:
        out["hostPath"] = host
    return out


def device_nodes(dev: DriverDevice, layout: HostLayout) -> list[dict[str, Any]]:
    """The device's nodes that exist on the host; CdiError when one it cannot work without is missing."""
    wanted = [f"/dev/nvidia{dev.minor}"]
    if dev.type == "mig":
        if dev.gi_id is None:
            raise CdiError(f"MIG device {dev.name}: NVML gave no GPU instance id")
        for ci in (None,) if dev.ci_id is None else (None, dev.ci_id):
            minor = read_cap_minor(layout.proc, dev.minor, dev.gi_id, ci)
            if minor is None:
                what = f"gi{dev.gi_id}" + (f"/ci{ci}" if ci is not None else "")
                raise CdiError(
                    f"MIG device {dev.name}: no capability minor in "
                    f"{layout.proc}/proc/driver/nvidia/capabilities/gpu{dev.minor}/mig/{what}/access "
                    "(is the NVIDIA driver loaded and the MIG instance still there?)"
                )
            wanted.append(f"/dev/nvidia-caps/nvidia-cap{minor}")
    out = []
    for p in wanted:
        node = _node(layout, p)
        if node is None:
            missing = layout.dev.mount / p.lstrip("/")
            raise CdiError(f"device {dev.name}: device node {missing} does not exist")
        out.append(node)
    return out


def _mount(host: str, container: str) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": list(MOUNT_OPTIONS)}


def driver_edits(files: DriverFiles) -> dict[str, Any]:
    """Mounts (and hooks) for the driver's files."""
    root = files.root
    mounts: list[dict[str, Any]] = []
    hooks: list[dict[str, Any]] = []
    if files.hook:
        links: list[str] = []
        folders: list[str] = []
        for lib in files.libraries:
            container = "/" + str(lib.path.relative_to(root.mount))
            mounts.append(_mount(root.to_host(lib.path), container))
            folder = os.path.dirname(container)
            if folder not in folders:
                folders.append(folder)
            links.extend(f"{lib.path.name}::{folder}/{name}" for name in lib.links)
        for b in files.binaries:
            mounts.append(_mount(root.to_host(b), "/" + str(b.relative_to(root.mount))))
        if links:
            args = ["nvidia-cdi-hook", "create-symlinks"]
            for link in links:
                args += ["--link", link]
            hooks.append({"hookName": "createContainer", "path": files.hook, "args": args})
        hooks.append({"hookName": "createContainer", "path": files.hook,
                      "args": ["nvidia-cdi-hook", "enable-cuda-compat",
                               f"--host-driver-version={files.version}"]})  # fmt: skip
        if folders:
            args = ["nvidia-cdi-hook", "update-ldcache"]
            for f in folders:
                args += ["--folder", f]
            hooks.append({"hookName": "createContainer", "path": files.hook, "args": args})
    else:
        taken: set[str] = set()
        for lib in files.libraries:
            for name in (lib.path.name, *lib.links):
                if name not in taken:  # two lib dirs may both hold a name: the first one found wins
                    taken.add(name)
                    mounts.append(_mount(root.to_host(lib.path), f"{NO_HOOK_LIB_DIR}/{name}"))
        for b in files.binaries:
            mounts.append(_mount(root.to_host(b), f"{NO_HOOK_BIN_DIR}/{b.name}"))
    for fw in files.firmware:
        mounts.append(_mount(root.to_host(fw), f"/lib/firmware/nvidia/{files.version}/{fw.name}"))
    for sock in files.sockets:
        rel = str(sock.relative_to(root.mount)).removeprefix("var/")
        mounts.append(_mount(root.to_host(sock), "/" + rel))
    # The host's MPS pipe directory (tmp/nvidia-mps) is never mounted: this driver runs no MPS daemon
    # and refuses the MPS strategy, and a host-wide pipe directory shared read-write would let one
    # claim's container reach a daemon that serves another tenant's processes.
    out: dict[str, Any] = {"mounts": mounts}
    if hooks:
        out["hooks"] = hooks
    return out


def share_env(devices: Sequence[CdiDevice]) -> list[str]:
    """What a container sees of its shares' limits (empty when the claim holds no share).

    `DRAGUARD_GPU_MEMORY_LIMITS` lists `<GPU UUID>=<bytes>` for every shared GPU of the claim (two
    shares of one GPU add up); `DRAGUARD_GPU_MEMORY_LIMIT` is the bytes alone when there is one
    GPU. The driver runs no MPS control daemon, so nothing enforces the limit on the GPU: the
    application reads it (docs/driver-sharing.md says how) and the scheduler keeps the sum of the
    shares within the GPU's memory.
    """
    limits: dict[str, int] = {}
    for d in devices:
        if d.memory_limit is not None:
            limits[d.device.uuid] = limits.get(d.device.uuid, 0) + d.memory_limit
    if not limits:
        return []
    env = ["DRAGUARD_GPU_MEMORY_LIMITS=" + ",".join(f"{u}={n}" for u, n in limits.items())]
    if len(limits) == 1:
        env.append(f"DRAGUARD_GPU_MEMORY_LIMIT={next(iter(limits.values()))}")
    return env


def build_spec(
    claim_uid: str, devices: Sequence[CdiDevice], layout: HostLayout | None = None
) -> dict[str, Any]:
    layout = layout or HostLayout()
    visible = ",".join(dict.fromkeys(d.device.uuid for d in devices))
    # The same values on every device of the claim, so the order the runtime applies them in is moot.
    env = [f"NVIDIA_VISIBLE_DEVICES={visible}", *share_env(devices)]
    out_devices = [
        {
            "name": f"{claim_uid}-{d.name}",
            "containerEdits": {"env": list(env), "deviceNodes": device_nodes(d.device, layout)},
        }
        for d in devices
    ]
    common: dict[str, Any] = {
        "env": [f"NVIDIA_DRIVER_CAPABILITIES={','.join(layout.capabilities)}"],
        "deviceNodes": [n for p in CONTROL_NODES if (n := _node(layout, p)) is not None],
    }
    if layout.files is not None:
        common.update(driver_edits(layout.files))
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": {"draguard.io/claim-uid": claim_uid},
        "devices": out_devices,
        "containerEdits": common,
    }


class CdiWriter:
    def __init__(self, root: str | Path, layout: HostLayout | None = None) -> None:
        self.root = Path(root)
        self.layout = layout or HostLayout()

    def render(self, claim_uid: str, devices: Sequence[CdiDevice]) -> bytes:
        """The spec file's bytes, exactly as `write` stores them."""
        return json.dumps(build_spec(claim_uid, devices, self.layout), indent=2).encode()

    def write(self, claim_uid: str, devices: Sequence[CdiDevice]) -> list[str]:
        """Write the claim's spec atomically; return the CDI ids, in `devices` order."""
        data = self.render(claim_uid, devices)
        atomic_write(spec_path(self.root, claim_uid), data, mode=SPEC_MODE)
        return [device_id(claim_uid, d.name) for d in devices]

    def remove(self, claim_uid: str) -> bool:
        """Delete the claim's spec; False when it was already gone (idempotent)."""
        try:
            spec_path(self.root, claim_uid).unlink()
            return True
        except FileNotFoundError:
            return False

    def exists(self, claim_uid: str) -> bool:
        return spec_path(self.root, claim_uid).exists()

    def device_ids(self, claim_uid: str) -> set[str] | None:
        """The CDI ids the claim's spec on disk defines; None when it is missing or unreadable."""
        try:
            spec = json.loads(spec_path(self.root, claim_uid).read_text())
        except (OSError, ValueError):
            return None
        if (
            not isinstance(spec, dict)
            or spec.get("kind") != KIND
            or not isinstance(spec.get("devices"), list)
        ):
            return None
        return {
            f"{KIND}={d['name']}"
            for d in spec["devices"]
            if isinstance(d, dict) and isinstance(d.get("name"), str)
        }

    def claim_uids(self) -> list[str]:
        """Claim UIDs of every spec this driver has in the CDI root."""
        prefix = f"{VENDOR}-{CLASS}_"
        if not self.root.is_dir():
            return []
        return sorted(
            p.name[len(prefix) : -len(".json")]
            for p in self.root.iterdir()
            if p.name.startswith(prefix) and p.name.endswith(".json")
        )
