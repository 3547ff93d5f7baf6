"""CDI specs: one transient spec per prepared claim, written before its ids go back to kubelet.

Vendor/class `k8s.gpu.nvidia.com/claim`; file `<cdiRoot>/k8s.gpu.nvidia.com-claim_<claimUID>.json`;
device names `<claimUID>-<device>`; ids `k8s.gpu.nvidia.com/claim=<claimUID>-<device>`.
Each device carries its own device nodes (`/dev/nvidia<minor>`, plus the MIG capability nodes of
a MIG device) and `NVIDIA_VISIBLE_DEVICES` listing the UUIDs of the claim's devices that serve the
same requests (devices injected together, so the value does not depend on edit order). The
control nodes every GPU container needs (`/dev/nvidiactl`, `/dev/nvidia-uvm*`) are spec-wide.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.checkpoint import atomic_write
from driver.devices import DriverDevice

CDI_VERSION = "0.6.0"
VENDOR = "k8s.gpu.nvidia.com"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class CdiDevice:
    """A device of one claim, with the request names it serves."""

    device: DriverDevice
    requests: tuple[str, ...]


def spec_path(cdi_root: Path, claim_uid: str) -> Path:
    if not _UID.match(claim_uid):
        raise ValueError(f"claim UID {claim_uid!r} cannot be used in a CDI file name")
    return cdi_root / f"{VENDOR}-{CLASS}_{claim_uid}.json"


def device_id(claim_uid: str, device_name: str) -> str:
    return f"{KIND}={claim_uid}-{device_name}"


def device_nodes(dev: DriverDevice) -> list[str]:
    nodes = [f"/dev/nvidia{dev.minor}"]
    if dev.type == "mig" and dev.gi_id is not None:
        base = f"/proc/driver/nvidia/capabilities/gpu{dev.minor}/mig/gi{dev.gi_id}"
        nodes.append(f"{base}/access")
        if dev.ci_id is not None:
            nodes.append(f"{base}/ci{dev.ci_id}/access")
    return nodes


def build_spec(claim_uid: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    groups: dict[tuple[str, ...], list[str]] = {}
    for d in devices:
        groups.setdefault(tuple(sorted(d.requests)), []).append(d.device.uuid)
    out_devices = []
    for d in devices:
        visible = ",".join(groups[tuple(sorted(d.requests))])
        out_devices.append(
            {
                "name": f"{claim_uid}-{d.device.name}",
                "containerEdits": {
                    "env": [f"NVIDIA_VISIBLE_DEVICES={visible}"],
                    "deviceNodes": [{"path": p} for p in device_nodes(d.device)],
                },
            }
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": {"draguard.io/claim-uid": claim_uid},
        "devices": out_devices,
        "containerEdits": {
            "env": ["NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            "deviceNodes": [{"path": p} for p in CONTROL_NODES],
        },
    }


class CdiWriter:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def write(self, claim_uid: str, devices: Sequence[CdiDevice]) -> list[str]:
        """Write the claim's spec atomically; return the CDI ids, in `devices` order."""
        spec = build_spec(claim_uid, devices)
        atomic_write(spec_path(self.root, claim_uid), json.dumps(spec, indent=2).encode())
        return [device_id(claim_uid, d.device.name) for d in devices]

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
