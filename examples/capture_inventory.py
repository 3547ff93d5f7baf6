"""Regenerate examples/inventory.yaml: three simulated GPU nodes plus the cluster's DeviceClasses.

Each node is what `draguard driver inventory --sim <topology> --node-name <node>` prints (the
ResourceSlices the bundled driver would publish there); the DeviceClasses are examples/cluster/.
The result has the shape of `kubectl get resourceslices,deviceclasses -o yaml`.

    python examples/capture_inventory.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NODES = (
    ("gpu-h100-0", "driver/sim/topologies/h100-8x-nvlink.yaml"),
    ("gpu-a100-0", "driver/sim/topologies/a100-4x-nvlink.yaml"),
    ("gpu-a100-mig-0", "driver/sim/topologies/a100-4x-mig.yaml"),
)
HEADER = """\
# A simulated cluster: three GPU nodes as the bundled driver publishes them, plus the DeviceClasses
# of examples/cluster/. Regenerate with `python examples/capture_inventory.py`; each node comes from
#   draguard driver inventory --sim <topology> --node-name <node>
# (gpu-h100-0: h100-8x-nvlink, gpu-a100-0: a100-4x-nvlink, gpu-a100-mig-0: a100-4x-mig).
"""


def main() -> int:
    items: list[dict[str, object]] = []
    for node, topology in NODES:
        # `python -m driver.cli` is `draguard` with only the driver commands (the same code).
        cmd = ["driver", "inventory", "--sim", topology, "--node-name", node]
        out = subprocess.run(
            [sys.executable, "-m", "driver.cli", *cmd],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for doc in yaml.safe_load_all(out):
            if isinstance(doc, dict):
                items.extend(doc.get("items", []) if doc.get("kind") == "List" else [doc])
    for i, item in enumerate(items):
        meta = item.setdefault("metadata", {})
        assert isinstance(meta, dict)
        if "name" not in meta and "generateName" in meta:
            # What the API server would have named them.
            meta["name"] = f"{meta.pop('generateName')}{i:05d}"
        meta.get("annotations", {}).pop("draguard.io/simulated-nvml", None)
        if not meta.get("annotations"):
            meta.pop("annotations", None)
    classes = [d for d in yaml.safe_load_all((HERE / "cluster" / "deviceclasses.yaml").read_text()) if d]
    doc = {"apiVersion": "v1", "kind": "List", "items": items + classes}
    text = HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)
    (HERE / "inventory.yaml").write_text(text)
    print(f"wrote examples/inventory.yaml: {len(items)} ResourceSlices, {len(classes)} DeviceClasses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
