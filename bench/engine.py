"""Engine throughput: evaluate() over 2,000 generated workloads of mixed kinds, on one core.

    python bench/engine.py [--workloads 2000] [--repeat 3] [--json]

Prints objects/s for the whole rule set and per rule module. Uses the shipped policies and the
article-shaped inventory in tests/fixtures/seed (3 nodes, 16 devices).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webhook.core.source import SourceObject  # noqa: E402
from webhook.dra.inventory import load_inventory  # noqa: E402
from webhook.engine.context import Context  # noqa: E402
from webhook.engine.evaluate import evaluate  # noqa: E402
from webhook.engine.rules import modules  # noqa: E402
from webhook.policy.load import load_policies, source_objects  # noqa: E402

KINDS = ("Pod", "Deployment", "StatefulSet", "Job", "CronJob", "DaemonSet", "ReplicaSet")
IMAGES = (
    "vllm/vllm-openai:v0.6.3",
    "nvcr.io/nvidia/pytorch:24.01-py3",
    "nvcr.io/nvidia/tritonserver:24.01-py3",
    "quay.io/jupyter/pytorch-notebook:latest",
    "busybox:1.36",
)
COMMANDS = (
    ["vllm", "serve", "m"],
    ["torchrun", "--nproc_per_node=4", "train.py"],
    ["python3", "app.py"],
    None,
)
CLASSES = ("gpu.nvidia.com-h100", "gpu.nvidia.com-a100", "gpu.nvidia.com-a100-mig-3g20gb")


def _wrap(kind: str, name: str, ns: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": ns}
    template = {"metadata": {"labels": {"app": name}}, "spec": pod_spec}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": meta,
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}},
        }
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": template}}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": meta,
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def generate(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """n workloads plus the claim templates they use (one per namespace and class)."""
    rng = random.Random(seed)
    namespaces = [f"team-{i}" for i in range(10)]
    objs: list[dict[str, Any]] = []
    for ns in namespaces:
        for cls in CLASSES:
            version = rng.choice(("v1", "v1", "v1beta1"))
            req: dict[str, Any] = {"name": "gpu", "deviceClassName": cls, "count": rng.choice((1, 1, 2, 4))}
            if version == "v1":
                req = {"name": "gpu", "exactly": {k: v for k, v in req.items() if k != "name"}}
            objs.append(
                {
                    "apiVersion": f"resource.k8s.io/{version}",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"t-{cls}", "namespace": ns},
                    "spec": {"spec": {"devices": {"requests": [req]}}},
                }
            )
    for i in range(n):
        ns = rng.choice(namespaces)
        container: dict[str, Any] = {"name": "main", "image": rng.choice(IMAGES)}
        cmd = rng.choice(COMMANDS)
        if cmd:
            container["command"] = cmd
        spec: dict[str, Any] = {"containers": [container]}
        style = rng.random()
        if style < 0.2:  # legacy extended resource
            container["resources"] = {"limits": {"nvidia.com/gpu": rng.choice((1, 2))}}
        elif style < 0.25:  # the old inline form
            container["resources"] = {"claims": [{"name": "g"}]}
            spec["resourceClaims"] = [{"name": "g", "source": {"resourceClaimTemplateName": "x"}}]
        elif style < 0.9:
            container["resources"] = {"claims": [{"name": "g"}]}
            spec["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": f"t-{rng.choice(CLASSES)}"}]
        objs.append(_wrap(rng.choice(KINDS), f"w-{i}", ns, spec))
    return objs


def measure(
    items: list[SourceObject], repeat: int, rule_modules: tuple[str, ...] | None
) -> tuple[float, int]:
    policies = load_policies(ROOT / "policies")
    inventory = load_inventory(ROOT / "tests/fixtures/seed/cluster-inventory.yaml")
    classes = source_objects((ROOT / "tests/fixtures/seed/deviceclasses.yaml").read_text(encoding="utf-8"))
    everything = classes + items
    best = float("inf")
    findings = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        report = evaluate(everything, policies, inventory, Context(), rule_modules=rule_modules)
        best = min(best, time.perf_counter() - t0)
        findings = len(report.findings)
    return len(everything) / best, findings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    items = [SourceObject(o, file="bench.yaml") for o in generate(args.workloads)]
    results: dict[str, Any] = {"objects": len(items) + 3, "workloads": args.workloads}
    rate, findings = measure(items, args.repeat, None)
    results["all"] = {"objects_per_s": round(rate), "findings": findings}
    for mod in modules():
        r, f = measure(items, args.repeat, (mod.name,))
        results[mod.name] = {"objects_per_s": round(r), "findings": f}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{results['objects']} objects ({args.workloads} workloads), best of {args.repeat}, one core")
        for k, v in results.items():
            if isinstance(v, dict):
                print(f"  {k:10s} {v['objects_per_s']:>9,d} objects/s  ({v['findings']} findings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
