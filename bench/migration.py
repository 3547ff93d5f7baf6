"""Migration planning time as a pod's container count grows (the rewrite of device-plugin GPUs).

    python bench/migration.py [--sizes 500,1000,2000,4000] [--repeat 5]

Plans one Pod with N containers of `nvidia.com/gpu: 1` against the shipped MigrationPolicy, both with
distinct container names and with one name for all (every claim name then has to be made free, which a
quadratic search made slow). Reports the best of `--repeat` runs per size, the time per container, and
the growth ratio against the smallest size measured in the same run: t(N) / (t(N0) x N/N0), 1.0 being
linear. The verdict allows 3x (timer and allocator noise on a shared machine); a quadratic search
shows as a ratio of about N/N0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LINEAR_SLACK = 3.0


def pod(n: int, *, same_name: bool) -> dict[str, Any]:
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    containers = [{"name": "c" if same_name else f"c{i}", "image": "x", "resources": gpu} for i in range(n)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": containers}}  # fmt: skip


def best_time(policy: Any, n: int, same_name: bool, repeat: int) -> float:
    from webhook.engine.migration import plan_workload

    obj = pod(n, same_name=same_name)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_workload(obj, policy, namespace="team-a")
        best = min(best, time.perf_counter() - t0)
        assert plan is not None and len(plan.edits) == n
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="500,1000,2000,4000", help="container counts, smallest first")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if len(sizes) < 2 or sizes[0] <= 0:
        print("bench/migration.py: --sizes needs two or more positive counts", file=sys.stderr)
        return 2

    from webhook.policy.load import load_policies

    (policy,) = load_policies(ROOT / "policies").migration
    worst = 0.0
    print(f"{'names':<10} {'containers':>10} {'best ms':>9} {'us/container':>13} {'vs linear':>10}")
    for same_name in (False, True):
        label = "one name" if same_name else "distinct"
        base = best_time(policy, sizes[0], same_name, args.repeat)
        for n in sizes:
            t = base if n == sizes[0] else best_time(policy, n, same_name, args.repeat)
            ratio = t / (base * n / sizes[0])
            worst = max(worst, ratio)
            print(f"{label:<10} {n:>10} {t * 1e3:>9.1f} {t / n * 1e6:>13.1f} {ratio:>9.2f}x")
    ok = worst <= LINEAR_SLACK
    growth = "linearly" if ok else "FASTER than linearly"
    print(f"verdict: planning grows {growth} (worst ratio {worst:.2f}x against {sizes[0]} containers, "
          f"allowed {LINEAR_SLACK:.0f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
