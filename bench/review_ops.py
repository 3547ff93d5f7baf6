"""Python bytecodes the request path executes per review: a count that load on the machine cannot move.

    .venv/bin/python bench/review_ops.py [--baseline DIR] [--devices 1000] [--cpu]

For each review of `bench/webhook.py`'s mixed stream (legacy Pod, Deployment with claims,
DeviceClass), in-process: `parse_review` -> `review("validate")` -> `serialise`, with the shipped
policies and a simulated inventory, after a warm-up. The count comes from an opcode tracer
(`sys.settrace` with `f_trace_opcodes`), so it is the same on every run of the same code; C work
(orjson, regular expressions, TLS) is not counted, and a bytecode is not a fixed amount of time.
CPU time on this shared 2-core machine moves by 40 % between identical runs: this count is what
shows a change to the engine's own work, and `bench/webhook.py` what it does to the server.

`--baseline DIR` counts another source tree (e.g. `git archive <commit> | tar -x -C DIR`) in a
process of its own, and prints the ratio.

`--cpu` measures process CPU per review of the mixed stream instead: each round is a fresh process
per tree, the trees alternating, and each tree's figure is its least round (the least is the one
other load on the machine disturbed least).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPES = (("legacy Pod", 0), ("Deployment with claims", 1), ("DeviceClass", 4))
# The mixed stream of bench/webhook.py: two legacy Pods, two Deployments, one DeviceClass.
MIX = {"legacy Pod": 2, "Deployment with claims": 2, "DeviceClass": 1}


def count(root: Path, devices: int, reviews_per_shape: int = 20) -> dict[str, int]:
    """Bytecodes per review for each shape of the stream, with `root`'s code (this process)."""
    sys.path.insert(0, str(root))
    from bench.webhook import inventory_objects, reviews
    from webhook.dra.inventory import Inventory
    from webhook.policy.load import load_policies
    from webhook.server import admission

    snap = admission.Snapshot(
        policies=load_policies(root / "policies"),
        inventory=Inventory.from_objects(inventory_objects(devices)),
    )
    bodies = reviews()
    ops = [0]

    def tracer(frame: Any, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            ops[0] += 1
        return tracer

    def one(body: bytes) -> None:
        admission.serialise(admission.review("validate", admission.parse_review(body), snap))

    out: dict[str, int] = {}
    for name, i in SHAPES:
        for _ in range(reviews_per_shape):  # warm: per-inventory memos, compiled CEL
            one(bodies[i])
        ops[0] = 0
        sys.settrace(tracer)
        try:
            for _ in range(reviews_per_shape):
                one(bodies[i])
        finally:
            sys.settrace(None)
        out[name] = ops[0] // reviews_per_shape
    out["mixed stream"] = sum(out[k] * n for k, n in MIX.items()) // sum(MIX.values())
    return out


def cpu(root: Path, devices: int, reviews: int = 2000, repeats: int = 5) -> float:
    """Least process CPU seconds per review of the mixed stream, with `root`'s code (this process)."""
    import gc
    import time

    sys.path.insert(0, str(root))
    from bench.webhook import inventory_objects
    from bench.webhook import reviews as review_bodies
    from webhook.dra.inventory import Inventory
    from webhook.policy.load import load_policies
    from webhook.server import admission

    snap = admission.Snapshot(
        policies=load_policies(root / "policies"),
        inventory=Inventory.from_objects(inventory_objects(devices)),
    )
    bodies = review_bodies()
    stream = [bodies[i] for name, i in SHAPES for _ in range(MIX[name])]
    rounds = max(1, reviews // len(stream))

    def one(body: bytes) -> None:
        admission.serialise(admission.review("validate", admission.parse_review(body), snap))

    for _ in range(rounds):  # warm
        for body in stream:
            one(body)
    # As `draguard serve` does once it has loaded: the snapshot's objects leave the collector's
    # generations, so a full collection does not walk the whole inventory at a moment that differs
    # between the trees.
    gc.collect()
    gc.freeze()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(rounds):
            for body in stream:
                one(body)
        best = min(best, (time.process_time() - t0) / (rounds * len(stream)))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="DIR", help="also count this source tree (its own process)")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--cpu", action="store_true", help="process CPU per review instead of bytecodes")
    p.add_argument("--rounds", type=int, default=5, help="--cpu: processes per tree (default 5)")
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--cpu-once", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.root and args.cpu_once:
        print(json.dumps(cpu(Path(args.root), args.devices)))
        return 0
    if args.root:
        print(json.dumps(count(Path(args.root), args.devices)))
        return 0
    if args.cpu:
        return _cpu_main(args)

    def run(root: Path) -> dict[str, int]:
        cmd = [sys.executable, __file__, "--root", str(root), "--devices", str(args.devices)]
        res: dict[str, int] = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
        return res

    now = run(ROOT)
    base = run(Path(args.baseline).resolve()) if args.baseline else None
    if args.json:
        print(json.dumps({"this": now, "baseline": base}, indent=2))
        return 0
    print(f"Python bytecodes per review (validate, {args.devices} devices, shipped policies)")
    for name in now:
        line = f"  {name:<24} {now[name]:>7,}"
        if base:
            line += f"   baseline {base[name]:>7,}   this / baseline {now[name] / base[name]:.2f}"
        print(line)
    return 0


def _cpu_main(args: argparse.Namespace) -> int:
    trees = [ROOT] + ([Path(args.baseline).resolve()] if args.baseline else [])
    best = [float("inf")] * len(trees)
    for _ in range(args.rounds):
        for i, root in enumerate(trees):  # alternating, so a burst of other load hits both
            cmd = [sys.executable, __file__, "--root", str(root), "--devices", str(args.devices)]
            cmd.append("--cpu-once")
            out = subprocess.run(cmd, check=True, capture_output=True).stdout
            best[i] = min(best[i], float(json.loads(out)))
    if args.json:
        print(json.dumps({"this": best[0], "baseline": best[1] if args.baseline else None}))
        return 0
    print(f"Process CPU per review, mixed stream (validate, {args.devices} devices, shipped policies), "
          f"least of {args.rounds} processes")
    line = f"  this      {best[0] * 1e3:.4f} ms"
    print(line)
    if args.baseline:
        print(f"  baseline  {best[1] * 1e3:.4f} ms   this / baseline {best[0] / best[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
