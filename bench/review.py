"""Benchmark `draguard review`: 2,000 generated manifests against a 10,000-device inventory.

Runs the real CLI in a child process (start-up, reading, inventory loading, evaluation and the
JSON report included) and reports documents per second and the child's peak RSS. In the same run,
`kubectl kustomize kustomize/overlays/local` (or `kustomize build`) is measured the same way as a
reference point for what a CI step of this kind costs.

    .venv/bin/python bench/review.py [--docs 2000] [--devices 10000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DRIVER = "gpu.nvidia.com"
PRODUCTS = (
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi"),
    ("NVIDIA A100 80GB PCIe", "Ampere", "8.0.0", "80Gi"),
)
CLASSES = ("gpu.nvidia.com-h100", "gpu.nvidia.com-a100", "gpu.nvidia.com-a100-mig-3g20gb")


# --------------------------------------------------------------------------- inventory


def _device(node: int, i: int) -> dict[str, Any]:
    """One device as the bundled driver publishes it: 1 node in 4 is an A100 node split into MIG."""
    kind = node % 4
    product, arch, cc, mem = PRODUCTS[0 if kind < 2 else 1]
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{node:05d}-{i}"},
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": arch},
        "cudaComputeCapability": {"version": cc},
        "driverVersion": {"version": "560.35.3"},
        "cudaDriverVersion": {"version": "12.6.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{16 + i:02x}:00.0"},
        "nvlinkDomain": {"string": f"node-{node:05d}-nvl-0"},
    }
    capacity = {"memory": {"value": mem}}
    if kind == 3:  # MIG 3g.20gb slices of A100s
        attrs["type"] = {"string": "mig"}
        attrs["profile"] = {"string": "3g.20gb"}
        attrs["parentUUID"] = {"string": f"GPU-{node:05d}-{i // 2}"}
        del attrs["nvlinkDomain"]
        capacity = {"memory": {"value": "19968Mi"}, "multiprocessors": {"value": "42"}}
    return {"name": f"gpu-{i}", "attributes": attrs, "capacity": capacity}


def device_classes() -> list[dict[str, Any]]:
    exprs = {
        "gpu.nvidia.com-h100": "type == 'gpu' && device.attributes['gpu.nvidia.com'].productName == "
        "'NVIDIA H100 80GB HBM3'",
        "gpu.nvidia.com-a100": "type == 'gpu' && device.attributes['gpu.nvidia.com'].productName == "
        "'NVIDIA A100 80GB PCIe'",
        "gpu.nvidia.com-a100-mig-3g20gb": "type == 'mig' && "
        "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'",
    }
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}']." + e
                        }
                    }
                ]
            },
        }
        for name, e in exprs.items()
    ]


def write_inventory(path: Path, devices: int) -> dict[str, Any]:
    per_node = 8
    items: list[dict[str, Any]] = []
    for node in range(devices // per_node):
        items.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"node-{node:05d}-{DRIVER}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": f"node-{node:05d}",
                    "pool": {"name": f"node-{node:05d}", "generation": 1, "resourceSliceCount": 1},
                    "devices": [_device(node, i) for i in range(per_node)],
                },
            }
        )
    doc = {"apiVersion": "v1", "kind": "List", "items": items + device_classes()}
    path.write_text(yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False))
    return doc


# --------------------------------------------------------------------------- manifests


def _workload(i: int) -> list[dict[str, Any]]:
    """Two documents: a claim template and a workload using it, in a mix of kinds and verdicts."""
    ns = f"team-{i % 20}"
    cls = CLASSES[(i // 3) % 3]  # every image meets every class: some verdicts deny
    count = 1 if cls.endswith("3g20gb") else (1, 2, 4, 8)[i % 4]
    request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}
    if i % 5 == 0:
        request["exactly"]["selectors"] = [
            {"cel": {"expression": f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0"}}
        ]
    devices: dict[str, Any] = {"requests": [request]}
    if count > 1:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"tmpl-{i}", "namespace": ns},
        "spec": {"spec": {"devices": devices}},
    }
    image = ("vllm/vllm-openai:v0.6.0", "nvcr.io/nvidia/pytorch:24.01-py3", "quay.io/jupyter/base-notebook")[
        i % 3
    ]
    podspec: dict[str, Any] = {
        "containers": [{"name": "main", "image": image, "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"tmpl-{i}"}],
    }
    if i % 7 == 0:  # a legacy device-plugin request next to the DRA one
        podspec["containers"].append(
            {"name": "legacy", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        )
    kind = ("Deployment", "Job", "StatefulSet")[i % 3]
    workload: dict[str, Any] = {
        "apiVersion": "batch/v1" if kind == "Job" else "apps/v1",
        "kind": kind,
        "metadata": {"name": f"app-{i}", "namespace": ns},
        "spec": {"template": {"metadata": {"labels": {"app": f"app-{i}"}}, "spec": podspec}},
    }
    if kind != "Job":
        workload["spec"]["selector"] = {"matchLabels": {"app": f"app-{i}"}}
        workload["spec"]["replicas"] = 1 + i % 3
    return [template, workload]


def write_manifests(root: Path, docs: int) -> int:
    per_file = 20
    written = 0
    i = 0
    while written < docs:
        batch: list[dict[str, Any]] = []
        while len(batch) < per_file and written + len(batch) < docs:
            batch.extend(_workload(i))
            i += 1
        batch = batch[: docs - written]
        team = root / f"team-{i % 20}"
        team.mkdir(parents=True, exist_ok=True)
        (team / f"apps-{i:05d}.yaml").write_text(
            yaml.dump_all(batch, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
        )
        written += len(batch)
    return written


# --------------------------------------------------------------------------- measuring


@dataclass
class Measure:
    seconds: float
    peak_rss_mib: float
    returncode: int
    stdout: str
    stderr: str


def _hwm_kib(pid: int) -> int | None:
    """VmHWM (peak resident set) of a running process, from /proc."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def measure(cmd: list[str], cwd: Path) -> Measure:
    """Wall time and peak RSS of one child process.

    The peak is the child's VmHWM, polled until it exits: `ru_maxrss` would also count the
    parent's memory at fork time (the kernel keeps the pre-exec high-water mark), and this
    parent holds the generated inventory.
    """
    t0 = time.perf_counter()
    peak_kib = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, text=True)
        while True:
            pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak_kib = max(peak_kib, _hwm_kib(proc.pid) or 0)
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measure(seconds, peak_kib / 1024, proc.returncode, out.read(), err.read())


def kustomize_cmd() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each command; the best is reported")
    ap.add_argument("--draguard", default=f"{sys.executable} -m webhook.cli", help="how to run draguard")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="draguard-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        inventory = write_inventory(work / "inventory.yaml", args.devices)
        # The same inventory as `kubectl get ... -o json` would print it.
        (work / "inventory.json").write_text(json.dumps(inventory))
        docs = write_manifests(work / "manifests", args.docs)
        print(
            f"generated {docs} manifests in {len(list((work / 'manifests').rglob('*.yaml')))} files and "
            f"{args.devices} devices ({args.devices // 8} nodes) in {time.perf_counter() - t0:.1f}s"
        )
        for inv_name in ("inventory.yaml", "inventory.json"):
            review = [
                *args.draguard.split(),
                "review",
                str(work / "manifests"),
                "--policies",
                str(ROOT / "policies"),
                "--inventory",
                str(work / inv_name),
                "--format",
                "json",
                "--output",
                str(work / "report.json"),
                "--progress",
            ]
            runs = [measure(review, ROOT) for _ in range(args.repeat)]
            best = min(runs, key=lambda m: m.seconds)
            if best.returncode not in (0, 1):
                print(f"review failed (exit {best.returncode}): {best.stderr.strip()}", file=sys.stderr)
                return 1
            s = json.loads((work / "report.json").read_text())["summary"]
            evaluated = re.search(r"evaluated (\d+) documents in ([0-9.]+)s", best.stderr)
            print(
                f"draguard review ({inv_name}): {docs} documents in {best.seconds:.2f}s = "
                f"{docs / best.seconds:,.0f} documents/s end to end, peak RSS {best.peak_rss_mib:,.0f} MiB "
                f"({s['errors']} enforce, {s['warnings']} warn, {s['audits']} audit findings)"
            )
            if evaluated:
                n, secs = int(evaluated.group(1)), float(evaluated.group(2))
                print(
                    f"  of which the engine: {n} documents in {secs:.2f}s = "
                    f"{n / secs if secs else n:,.0f} documents/s"
                )
            print(f"  runs: {', '.join(f'{m.seconds:.2f}s' for m in runs)}")

        cmd = kustomize_cmd()
        overlay = ROOT / "kustomize" / "overlays" / "local"
        if cmd is None or not overlay.is_dir():
            print("reference: kustomize/kubectl or kustomize/overlays/local not available; skipped")
            return 0
        kruns = [measure([*cmd, str(overlay)], ROOT) for _ in range(args.repeat)]
        kbest = min(kruns, key=lambda m: m.seconds)
        if kbest.returncode != 0:
            print(f"reference: {' '.join(cmd)} failed: {kbest.stderr.strip()[:200]}")
            return 0
        kdocs = sum(1 for d in yaml.safe_load_all(kbest.stdout) if d)
        print(
            f"reference: {' '.join(cmd)} kustomize/overlays/local: {kdocs} documents in "
            f"{kbest.seconds:.2f}s = "
            f"{kdocs / kbest.seconds:,.0f} documents/s, peak RSS {kbest.peak_rss_mib:,.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
