"""Tier classification against the number of GpuTierPolicies: the index against asking every policy.

    .venv/bin/python bench/tier_index.py [--policies 10,100,1000] [--reviews 300] [--rounds 5]

In-process, what `POST /validate` runs for a Deployment (parse, review, response JSON), with the
shipped policies plus generated GpuTierPolicies (bench/scaling.py's, each with its own label and
image globs) up to each count, and a 1,000-device inventory. Two Deployments: the vLLM one of
bench/scaling.py (no generated policy classifies it) and one whose image a single generated policy
matches (`registry.example.com/tier-<n/2>/...`, denied: it asks for an H100).

Each point is measured two ways in the same process, rounds interleaved: "indexed" (the policy
set's tier index picks the policies that could classify the workload) and "linear" (the index
answers every policy, which is what classification cost before the index). Printed: p50 per review
(least over rounds) and the 1,000-to-10 ratio of each; the target is indexed ratio <= 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _classified_body(n: int) -> bytes:
    from bench.scaling import review_bodies

    doc = json.loads(review_bodies(1)[0])
    pod = doc["request"]["object"]["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = f"registry.example.com/tier-{n}/server:v1"
    doc["request"]["object"]["metadata"]["name"] = "classified"
    return json.dumps(doc).encode()


def _time(snap: Any, body: bytes, reviews: int) -> tuple[float, str]:
    from webhook.server import admission

    lat = []
    verdict = ""
    for _ in range(reviews):
        t0 = time.perf_counter()
        out = admission.review("validate", admission.parse_review(body), snap)
        admission.serialise(out)
        lat.append(time.perf_counter() - t0)
        verdict = out.verdict
    return statistics.median(lat), verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="10,100,1000")
    ap.add_argument("--reviews", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from bench.scaling import build_inventory, review_bodies, write_policies
    from webhook.policy.load import load_policies
    from webhook.policy.tier_index import TierIndex
    from webhook.server.admission import Snapshot

    counts = [int(x) for x in args.policies.split(",") if x]
    inv = build_inventory(1000)
    snaps: dict[int, Any] = {}
    build_ms: dict[int, float] = {}
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="draguard-tier-index-") as tmp:
            pset = load_policies(write_policies(Path(tmp), n))
        t0 = time.perf_counter()
        TierIndex.of(pset.tier)
        build_ms[n] = (time.perf_counter() - t0) * 1000
        snaps[n] = Snapshot(policies=pset, inventory=inv)
    plain = review_bodies(1)[0]
    shapes = {
        "vLLM Deployment": lambda n: plain,
        "classified Deployment": lambda n: _classified_body(max(0, n // 2 - 4)),
    }

    indexed_candidates = TierIndex.candidates

    def linear(self: TierIndex, facts: Any) -> list[Any]:
        return list(self.policies)

    best: dict[tuple[str, str, int], float] = {}
    verdicts: dict[tuple[str, str, int], str] = {}
    for _ in range(args.rounds):
        for mode, fn in (("indexed", indexed_candidates), ("linear", linear)):
            TierIndex.candidates = fn  # type: ignore[method-assign]
            try:
                for shape, body_of in shapes.items():
                    for n in counts:
                        body = body_of(n)
                        _time(snaps[n], body, 20)  # warm the per-inventory memo
                        t, v = _time(snaps[n], body, args.reviews)
                        key = (shape, mode, n)
                        best[key] = min(best.get(key, float("inf")), t)
                        verdicts[key] = v
            finally:
                TierIndex.candidates = indexed_candidates  # type: ignore[method-assign]
    lo, hi = min(counts), max(counts)
    print(
        f"p50 per review, least of {args.rounds} interleaved rounds of {args.reviews} reviews; 1,000 devices"
    )
    print(
        f"{'review':<22} {'mode':<8} "
        + " ".join(f"{f'{n} pol.':>10}" for n in counts)
        + f" {f'{hi}/{lo}':>8}"
    )
    rows = []
    ok = True
    for shape in shapes:
        for mode in ("indexed", "linear"):
            cells = " ".join(f"{best[(shape, mode, n)] * 1000:>8.3f}ms" for n in counts)
            ratio = best[(shape, mode, hi)] / best[(shape, mode, lo)]
            if mode == "indexed":
                ok = ok and ratio <= 2.0
            v = {verdicts[(shape, mode, n)] for n in counts}
            print(f"{shape:<22} {mode:<8} {cells} {ratio:>7.2f}x  verdicts {sorted(v)}")
            rows.append(
                {
                    "review": shape,
                    "mode": mode,
                    "p50_ms": {n: round(best[(shape, mode, n)] * 1000, 4) for n in counts},
                    "ratio": round(ratio, 3),
                }
            )
        same = all(verdicts[(shape, "indexed", n)] == verdicts[(shape, "linear", n)] for n in counts)
        print(f"{'':<22} same verdicts indexed and linear: {same}")
        ok = ok and same
    print("index build: " + ", ".join(f"{n} policies {build_ms[n]:.1f} ms" for n in counts))
    print(f"target (indexed {hi} policies <= 2x {lo}): {'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "build_ms": build_ms, "ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
