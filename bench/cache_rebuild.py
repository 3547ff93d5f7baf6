"""The webhook's inventory rebuild at a large cluster's size: does it make cache sync grow faster than linear?

    python bench/cache_rebuild.py [--steps 200,1000,2000] [--repeat 3] [--json OUT]

`draguard serve` lists its watched resources, and once every list is in, its rebuild thread turns the
caches into the view every request reads (webhook/server/usage.py, `Rebuilder.build`); /readyz answers
after that first view. bench/cluster_scale.py measured the whole (start to ready) growing 2.14 times
faster than the cluster between 1,000 and 2,000 nodes. This bench takes the rebuild apart from the
lists: the real `ClusterCache` and `Rebuilder`, their stores filled with what the watches of that
cluster hold (per node the Node's labels and the ResourceSlice draguard's driver publishes for 8 H100s;
25 ResourceClaims per node, one team namespace per 10 nodes; the shipped DeviceClasses and policies),
then timed in this process:
- **first build**: the rebuild after sync (every slice, class and claim parsed, the inventory warmed,
  each claim's quota charge, DRA statistics);
- **one claim more**: the rebuild after one new claim (what each claim event costs after sync);
- **unchanged**: a rebuild with nothing changed;
- **claim review**: `/validate`'s review of a ResourceClaim CREATE against the rebuilt view (what each
  claim a pod's template makes costs the webhook), CPU time.
Each is the median of `--repeat` runs (a new Rebuilder each time for the first build), wall and CPU.
Growth between steps is (ratio of the time) / (ratio of the nodes): at most 1 is linear or better.
Nothing is asserted on times; exit status 0.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cluster_scale import (  # noqa: E402
    CLAIMS_PER_NODE,
    TOPOLOGY,
    SliceMaker,
    claim,
    namespace_of,
    node_name,
    parse_steps,
)


def watched_objects(nodes: int, maker: SliceMaker) -> dict[str, list[dict[str, Any]]]:
    """What the webhook's watches hold for a cluster of `nodes` GPU nodes, as its reflectors store it."""
    from webhook.dev.nodes import SimNode, node_object
    from webhook.server.caches import labels_only

    serial = itertools.count(1)

    def stored(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if "name" not in meta:  # the driver's slices ask for a generated name, as the API server gives
            meta["name"] = meta.pop("generateName", "obj-") + uuid.uuid4().hex[:5]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(serial))
        return obj

    out: dict[str, list[dict[str, Any]]] = {k: [] for k in ("nodes", "resourceslices", "resourceclaims",
                                                           "namespaces", "deviceclasses")}  # fmt: skip
    shipped = ROOT / "kustomize" / "base" / "deviceclasses" / "deviceclasses.yaml"
    out["deviceclasses"] = [stored(o) for o in yaml.safe_load_all(shipped.read_text()) if o]
    seen_ns: set[str] = set()
    for n in range(nodes):
        name = node_name(n)
        node = stored(node_object(SimNode(name, TOPOLOGY, {"draguard.io/gpu-product": "h100"})))
        out["nodes"].append(labels_only({**node, "apiVersion": "v1", "kind": "Node"}))
        out["resourceslices"] += [stored(s) for s in maker.slices(name, node["metadata"]["uid"])]
        ns = namespace_of(n)
        if ns not in seen_ns:
            seen_ns.add(ns)
            out["namespaces"].append(
                stored({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            )
        out["resourceclaims"] += [stored(claim(ns, f"c-{n}-{j}")) for j in range(CLAIMS_PER_NODE)]
    return out


def filled_cache(objs: dict[str, list[dict[str, Any]]]) -> Any:
    """The webhook's own ClusterCache, its reflectors' stores filled and marked synced (not started:
    no API server is involved, the lists are what the watches would have delivered)."""
    from webhook.engine.context import ALL_RESOURCE_VERSIONS
    from webhook.server.caches import ClusterCache, _key
    from webhook.server.metrics import Metrics

    cache = ClusterCache(None, Metrics(), "v1", ALL_RESOURCE_VERSIONS)  # type: ignore[arg-type]
    for name, r in cache.reflectors.items():
        r.store = {_key(o): o for o in objs.get(name, [])}
        r.synced = True
    return cache


def timed(fn: Any) -> tuple[float, float]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return (time.perf_counter() - w0) * 1000, (time.thread_time() - c0) * 1000


def measure(nodes: int, maker: SliceMaker, repeat: int, policies: Any) -> dict[str, Any]:
    from webhook.server.metrics import Metrics
    from webhook.server.usage import Rebuilder

    objs = watched_objects(nodes, maker)
    cache = filled_cache(objs)
    first: list[tuple[float, float]] = []
    reb: Any = None
    for _ in range(repeat):
        reb = Rebuilder(cache, Metrics(), lambda _v: None, lambda: policies)
        first.append(timed(reb.build))
    one: list[tuple[float, float]] = []
    same: list[tuple[float, float]] = []
    claims = cache.reflectors["resourceclaims"]
    from webhook.server.caches import _key

    for i in range(repeat):
        o = claim(namespace_of(0), f"extra-{i}")
        o["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=f"x{i}")
        claims.store[_key(o)] = o
        one.append(timed(reb.build))
        same.append(timed(reb.build))
    # A ResourceClaim CREATE reviewed against the rebuilt view, as `/validate` reviews the claims
    # pods' templates make (in a namespace of its own, so its budget has room).
    from webhook.server import admission
    from webhook.server.admission import Snapshot

    view = reb.build()
    snap = Snapshot(policies=policies, inventory=view.inventory, namespace_labels=view.namespace_labels,
                    usage=view.usage)  # fmt: skip
    reviews: list[float] = []
    for i in range(5 + 10 * repeat):
        obj = claim("bench-review", f"review-{i}")
        dra = {"group": "resource.k8s.io", "version": "v1"}
        req = {"uid": str(uuid.uuid4()), "kind": {**dra, "kind": "ResourceClaim"},
               "resource": {**dra, "resource": "resourceclaims"}, "namespace": "bench-review",
               "name": obj["metadata"]["name"], "operation": "CREATE", "userInfo": {"username": "bench"},
               "object": obj, "oldObject": None, "dryRun": False}  # fmt: skip
        c0 = time.thread_time()
        out = admission.review("validate", req, snap)
        reviews.append((time.thread_time() - c0) * 1000)
        if not out.response.get("allowed"):
            raise SystemExit(f"{nodes} nodes: the review of a claim that fits was refused: {out.response}")
    med = statistics.median
    row = {
        "nodes": nodes,
        # What the rebuilt inventory holds, not what was generated: a store keyed by name keeps
        # one of two objects that share one.
        "devices": len(reb.build().inventory.devices),
        "claims": len(claims.store),
        "first_ms": med(w for w, _ in first),
        "first_cpu_ms": med(c for _, c in first),
        "one_claim_ms": med(w for w, _ in one),
        "unchanged_ms": med(w for w, _ in same),
        "claim_review_ms": med(reviews[5:]),
    }
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--steps", default="200,1000,2000", help="node counts, increasing (default 200,1000,2000)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure, the median is shown (default 3)")
    ap.add_argument("--json", metavar="OUT", type=Path)
    args = ap.parse_args(argv)
    steps = parse_steps(args.steps)
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    from webhook.policy.load import load_policies

    policies = load_policies(ROOT / "policies")
    maker = SliceMaker()
    measure(2, maker, 1, policies)  # imports and first-use compilations, not the cluster's size
    rows = []
    for n in steps:
        rows.append(measure(n, maker, args.repeat, policies))
        r = rows[-1]
        print(
            f"  [{time.strftime('%H:%M:%S')}] {n} nodes: first build {r['first_ms']:.0f} ms", file=sys.stderr
        )
    print(f"inventory rebuild: {CLAIMS_PER_NODE} claims and 8 GPUs per node, median of {args.repeat}")
    head = ["", *[f"{r['nodes']:,} nodes" for r in rows], *[f"growth {a['nodes']:,}→{b['nodes']:,}"
                                                           for a, b in itertools.pairwise(rows)]]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|---" + "|---:" * (len(head) - 1) + "|")
    print("| devices / claims | " + " | ".join(f"{r['devices']:,} / {r['claims']:,}" for r in rows)
          + " |" * (len(rows) - 1) + " |")  # fmt: skip
    labels = {
        "first_ms": "first build after sync, wall (ms)",
        "first_cpu_ms": "first build, CPU (ms)",
        "one_claim_ms": "rebuild after one claim more (ms)",
        "unchanged_ms": "rebuild with nothing changed (ms)",
        "claim_review_ms": "ResourceClaim review, CPU p50 (ms)",
    }
    for m, label in labels.items():
        cells = [f"{r[m]:,.1f}" for r in rows]
        cells += [f"{(b[m] / a[m]) / (b['nodes'] / a['nodes']):.2f}" if a[m] else "–"
                  for a, b in itertools.pairwise(rows)]  # fmt: skip
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
