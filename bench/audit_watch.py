"""Benchmark: what a watch event costs the audit, and what re-judging one namespace costs, against
baselines measured in the same run.

  * events: the audit's handling of watch event lines (decode, relevance, fingerprint, debounce)
    for creations and for status-only updates of the objects of bench/audit.py, against decoding
    the same lines alone (what any watch client pays);
  * rescan: re-judging one namespace of 100 objects (the inventory rebuilt from the cluster's
    claims and templates, then the engine), against the full scan's cost per object.

    .venv/bin/python bench/audit_watch.py [--events 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import audit as scan_bench  # noqa: E402  (bench/audit.py: the same objects)


def _lines(n: int) -> tuple[list[bytes], list[bytes]]:
    added: list[bytes] = []
    status: list[bytes] = []
    for i, o in enumerate(scan_bench.objects(n)):
        o["metadata"]["resourceVersion"] = str(1000 + i)
        added.append(json.dumps({"type": "ADDED", "object": o}).encode())
        s = dict(o, status={"observedGeneration": 2, "conditions": [{"type": "Available", "status": "True"}]})
        status.append(json.dumps({"type": "MODIFIED", "object": s}).encode())
    return added, status


def _rate(fn: Any, lines: list[bytes], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(lines)
        best = min(best, time.perf_counter() - t0)
    return len(lines) / best


def events(n: int) -> None:
    from webhook.audit.watch import Changes, Fingerprints, ResourceWatch, Watched
    from webhook.server import codec
    from webhook.server.caches import KubeHttp

    added, status = _lines(n)

    def decode(lines: list[bytes]) -> None:
        for line in lines:
            codec.loads(line)

    def handler() -> ResourceWatch:
        res = Watched("/apis/apps/v1/deployments", "apps/v1", "Deployment")
        return ResourceWatch(KubeHttp(None), res, Changes(), Fingerprints(size=2 * n))

    def handle_new(lines: list[bytes]) -> None:
        w = handler()
        for line in lines:
            w.handle(line)

    seeded = handler()
    for line in added:
        seeded.handle(line)

    def handle_status(lines: list[bytes]) -> None:
        for line in lines:
            seeded.handle(line)

    base = _rate(decode, added)
    new = _rate(handle_new, added)
    upd = _rate(handle_status, status)
    size = sum(map(len, added)) / len(added)
    print(f"events: {n} lines, {size:.0f} bytes each on average")
    print(f"{'path':<34} {'events/s':>10} {'vs decode only':>15}")
    print(f"{'decode only (baseline)':<34} {base:>10.0f} {1.0:>14.2f}x")
    print(f"{'audit: creations':<34} {new:>10.0f} {new / base:>14.2f}x")
    print(f"{'audit: status-only updates':<34} {upd:>10.0f} {upd / base:>14.2f}x")


def rescan() -> None:
    import yaml

    from webhook.audit.evaluate import auditable
    from webhook.audit.scan import judge_pages
    from webhook.audit.source import ClusterState, trim
    from webhook.dra.inventory import Inventory
    from webhook.policy.load import load_policies

    policies = load_policies(ROOT / "policies")
    inv = [o for o in yaml.safe_load_all((ROOT / "examples" / "inventory.yaml").read_text()) if o]
    templates = [
        scan_bench._template(f"team-{j:03d}", c)
        for j in range(scan_bench.NAMESPACES)
        for c in ("a100", "h100")
    ]
    dra = [*inv, *templates]
    state = ClusterState(
        Inventory.from_objects(dra),
        {f"team-{j:03d}": {} for j in range(scan_bench.NAMESPACES)},
        frozenset({"v1"}),
        templates,
    )
    # One namespace's share of 50,000 objects over 500 namespaces, with the scan's mix of kinds.
    page = []
    for o in scan_bench.objects(100):
        o["metadata"]["namespace"] = "team-007"
        page.append(trim(json.loads(json.dumps(o)), keep_status=o["kind"] == "ResourceClaim"))
    judged = [o for o in page if auditable(o)]
    best_inv = best_judge = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        state.inventory = Inventory.from_objects(dra)  # paid only when the namespace's claims changed
        t1 = time.perf_counter()
        judge_pages([judged], policies, state)
        t2 = time.perf_counter()
        best_inv, best_judge = min(best_inv, t1 - t0), min(best_judge, t2 - t1)
    print(
        f"rescan of one namespace ({len(page)} objects, {len(judged)} judged; inventory of {len(dra)} "
        f"DRA objects): judge {best_judge * 1e3:.1f} ms ({best_judge / len(judged) * 1e3:.2f} ms per judged "
        f"object), plus {best_inv * 1e3:.1f} ms to rebuild the inventory when its claims or templates changed"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args()
    events(args.events)
    rescan()
    return 0


if __name__ == "__main__":
    sys.exit(main())
