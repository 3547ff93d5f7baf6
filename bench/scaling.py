"""Admission latency, RSS and CEL lint time as the device inventory and the policy set grow.

    python bench/scaling.py [--devices 1000,10000,50000,100000] [--policies 10,100,1000]
                            [--reviews 150] [--json OUT.json]

Each point runs in a fresh child process (so RSS belongs to that inventory alone) pinned to one
core. The child builds N simulated GPUs (8 per node, four models, unique uuid/pciBusID), the
seed DeviceClasses and P policy documents (the four shipped policies plus P-4 generated
GpuTierPolicies that each classify workloads by label and image), then times the webhook's
request path in-process: `parse_review` -> `review()` -> the JSON response body, exactly what
`POST /validate` runs between reading and writing the socket. Three review shapes rotate: an LLM
Deployment using a claim template (tier rule), a legacy `nvidia.com/gpu` Pod (migration rule), and
a ResourceClaim with a CEL selector (linted against the whole inventory).

Devices are swept at 10 policies; policies are swept at 10,000 devices. The verdict line checks
that admission p50 grows at most logarithmically with the inventory (flat is better).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stats import pct  # noqa: E402

TIER_DOC = """---
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata:
  name: generated-{i}
spec:
  mode: enforce
  excludeNamespaces: [kube-system]
  classes:
  - name: tier-{i}
    match:
      labels:
        draguard.io/workload-class: tier-{i}
      images: ["*example.com/tier-{i}/*", "*model-{i}-server*"]
    deviceClasses: [gpu.nvidia.com-a100, "gpu.nvidia.com-a100-mig-*"]
"""
SHAPES = ("deployment", "pod", "claim")  # the order review_bodies() cycles through
SHIPPED = ("tier.yaml", "cel-lint.yaml", "migration.yaml", "quota.yaml")
SELECTOR = (
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3' && "
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
)


def write_policies(directory: Path, count: int) -> Path:
    """The shipped policies plus `count - 4` generated GpuTierPolicies (one file)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        (directory / name).write_text((ROOT / "policies" / name).read_text())
    extra = max(0, count - len(SHIPPED))
    if extra:
        (directory / "generated.yaml").write_text("".join(TIER_DOC.format(i=i) for i in range(extra)))
    return directory


def build_inventory(devices: int) -> Any:
    """`devices` simulated GPUs (8 per node) with the seed DeviceClasses and one claim template."""
    import yaml

    from bench.cel_lint import inventory as make_devices
    from webhook.dra.inventory import Inventory

    nodes = max(1, math.ceil(devices / 8))
    devs = make_devices(nodes)[:devices]
    objs: list[Any] = [
        d for d in yaml.safe_load_all((ROOT / "tests/fixtures/seed/deviceclasses.yaml").read_text()) if d
    ]
    objs.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-h100", "namespace": "team-a"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100"}}]
                    }
                }
            },
        }
    )
    meta = Inventory.from_objects(objs)
    return Inventory(devices=tuple(devs), classes=meta.classes, claims=meta.claims, templates=meta.templates)


def _review(i: int, group: str, version: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    plural = kind.lower() + "s" if kind != "ResourceClaim" else "resourceclaims"
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": plural},
            "namespace": "team-a",
            "operation": "CREATE",
            "name": obj["metadata"]["name"],
            "userInfo": {"username": "bench"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


def review_bodies(n: int) -> list[bytes]:
    """n AdmissionReview bodies cycling through three shapes (tier, migration, CEL claim)."""
    out = []
    for i in range(n):
        shape = i % 3
        name = f"w-{i}"
        if shape == 0:
            pod = {
                "containers": [
                    {
                        "name": "server",
                        "image": "vllm/vllm-openai:v0.6.3",
                        "command": ["vllm", "serve", "m"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}],
            }
            obj = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": "team-a", "labels": {"app": name}},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
                },
            }
            out.append(_review(i, "apps", "v1", "Deployment", obj))
        elif shape == 1:
            obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {
                    "containers": [
                        {
                            "name": "train",
                            "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                            "command": ["torchrun", "train.py"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            }
            out.append(_review(i, "", "v1", "Pod", obj))
        else:
            obj = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "gpu.nvidia.com-h100",
                                    "selectors": [{"cel": {"expression": SELECTOR}}],
                                },
                            }
                        ]
                    }
                },
            }
            out.append(_review(i, "resource.k8s.io", "v1", "ResourceClaim", obj))
    return [json.dumps(r).encode() for r in out]


def rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def measure_point(devices: int, policies: int, reviews: int) -> dict[str, Any]:
    """One (devices, policies) point in this process."""
    from webhook.cel import env as cel_env
    from webhook.cel.lint import lint_selector
    from webhook.policy.load import load_policies
    from webhook.server import admission
    from webhook.server.admission import Snapshot

    gc.collect()
    rss0 = rss_mib()
    t0 = time.perf_counter()
    inv = build_inventory(devices)
    build_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="draguard-scaling-") as tmp:
        t0 = time.perf_counter()
        pset = load_policies(write_policies(Path(tmp), policies))
        load_s = time.perf_counter() - t0
    snap = Snapshot(policies=pset, inventory=inv)
    gc.collect()
    rss_loaded = rss_mib()
    bodies = review_bodies(max(reviews, 3))
    verdicts: dict[str, int] = {}
    # Cold: the first review of each shape after the inventory/policies were swapped in (what the
    # request right after a ResourceSlice change pays); then warm, steady-state reviews.
    cold: list[float] = []
    for body in bodies[:3]:
        t0 = time.perf_counter()
        admission.review("validate", admission.parse_review(body), snap)
        cold.append(time.perf_counter() - t0)
    for body in bodies[3:30]:
        admission.review("validate", admission.parse_review(body), snap)
    lat: list[float] = []
    by_shape: dict[str, list[float]] = {s: [] for s in SHAPES}
    for i, body in enumerate(bodies):
        t0 = time.perf_counter()
        out = admission.review("validate", admission.parse_review(body), snap)
        json.dumps(out.document(), separators=(",", ":"))
        took = time.perf_counter() - t0
        lat.append(took)
        by_shape[SHAPES[i % 3]].append(took)
        verdicts[out.verdict] = verdicts.get(out.verdict, 0) + 1
    lint: list[float] = []
    for _ in range(3):
        cel_env.clear_cache()
        t0 = time.perf_counter()
        lint_selector(SELECTOR, devices=inv.devices)
        lint.append(time.perf_counter() - t0)
    return {
        "devices": devices,
        "policies": len(pset),
        "reviews": len(lat),
        "p50_ms": round(statistics.median(lat) * 1000, 3),
        "p99_ms": round(pct(lat, 99) * 1000, 3),
        "max_ms": round(max(lat) * 1000, 3),
        "reviews_per_s": round(len(lat) / sum(lat)),
        "rss_mib": round(rss_mib(), 1),
        "rss_inventory_mib": round(rss_loaded - rss0, 1),
        "inventory_build_s": round(build_s, 2),
        "policy_load_s": round(load_s, 3),
        "cel_lint_ms": round(min(lint) * 1000, 1),
        "verdicts": verdicts,
        "cold_ms": {SHAPES[i]: round(c * 1000, 2) for i, c in enumerate(cold)},
        "shapes": {
            k: {"p50_ms": round(statistics.median(v) * 1000, 3), "p99_ms": round(pct(v, 99) * 1000, 3)}
            for k, v in by_shape.items()
        },
    }


def run_child(devices: int, policies: int, reviews: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--point", str(devices), str(policies), "--reviews", str(reviews)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"point devices={devices} policies={policies} failed:\n{proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def growth_verdict(points: list[dict[str, Any]]) -> tuple[bool, str]:
    """Admission p50 must grow no faster than log(devices): ratio <= 1.5 x log-ratio, or flat."""
    pts = sorted(points, key=lambda p: p["devices"])
    lo, hi = pts[0], pts[-1]
    ratio = hi["p50_ms"] / max(lo["p50_ms"], 1e-9)
    log_ratio = math.log(hi["devices"]) / math.log(lo["devices"])
    ok = ratio <= max(1.25, 1.5 * log_ratio)
    word = "flat" if ratio <= 1.25 else ("logarithmic or better" if ok else "FASTER THAN LOGARITHMIC")
    return ok, (
        f"admission p50 {lo['p50_ms']:.2f} ms at {lo['devices']:,} devices -> {hi['p50_ms']:.2f} ms at "
        f"{hi['devices']:,} ({ratio:.2f}x for {hi['devices'] // lo['devices']}x devices; "
        f"log ratio {log_ratio:.2f}): {word}"
    )


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'devices':>8} {'policies':>8} {'p50 ms':>8} {'p99 ms':>8} {'rev/s':>7} "
        f"{'RSS MiB':>8} {'inv MiB':>8} {'lint ms':>8}  p50 ms deploy/pod/claim   cold ms deploy/pod/claim"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['devices']:>8,} {r['policies']:>8,} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['reviews_per_s']:>7,} {r['rss_mib']:>8.1f} {r['rss_inventory_mib']:>8.1f} "
            f"{r['cel_lint_ms']:>8.1f}  "
            + "/".join(f"{r['shapes'][k]['p50_ms']:.2f}" for k in SHAPES).ljust(26)
            + "/".join(f"{r['cold_ms'][k]:.1f}" for k in SHAPES)
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--devices", default="1000,10000,50000,100000")
    ap.add_argument("--policies", default="10,100,1000")
    ap.add_argument("--reviews", type=int, default=150)
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    ap.add_argument("--point", nargs=2, type=int, metavar=("DEVICES", "POLICIES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if args.point:
        print(json.dumps(measure_point(args.point[0], args.point[1], args.reviews)))
        return 0
    dev_sizes = [int(x) for x in args.devices.split(",") if x]
    pol_sizes = [int(x) for x in args.policies.split(",") if x]
    base_pol = pol_sizes[0]
    base_dev = 10000 if 10000 in dev_sizes else dev_sizes[0]
    results: dict[tuple[int, int], dict[str, Any]] = {}
    plan = [(d, base_pol) for d in dev_sizes] + [(base_dev, p) for p in pol_sizes]
    for d, p in plan:
        if (d, p) not in results:
            print(f"... {d:,} devices, {p:,} policies", file=sys.stderr, flush=True)
            results[(d, p)] = run_child(d, p, args.reviews)
    by_dev = [results[(d, base_pol)] for d in dev_sizes]
    by_pol = [results[(base_dev, p)] for p in pol_sizes]
    print(
        f"Admission request path in-process (parse -> review -> response), one core, {args.reviews} "
        "reviews per point"
    )
    print(f"\nInventory sweep ({base_pol} policies):")
    print_table(by_dev)
    print(f"\nPolicy sweep ({base_dev:,} devices):")
    print_table(by_pol)
    ok, line = growth_verdict(by_dev) if len(by_dev) > 1 else (True, "one inventory size: no growth check")
    print("\n" + line)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"by_devices": by_dev, "by_policies": by_pol, "growth_ok": ok, "growth": line}, indent=2
            )
        )
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
