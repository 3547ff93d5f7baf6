"""The webhook's cache sync on a large cluster, taken apart: the API server's lists, decoding, the rebuild.

    python bench/cache_sync.py [--steps 200,1000,2000] [--starts 3] [--with-pods] [--json OUT] [--quick]

A replica of `draguard serve` turns ready once every watched resource is listed (pages of 500, each
decoded into its cache by a reflector thread) and its rebuild thread has built the first view from
them. bench/cluster_scale.py measured that whole, start to /readyz, growing 2.14 times as fast as the
cluster from 1,000 to 2,000 nodes. This bench grows the same cluster (bench/cluster_scale.py's objects:
per node a Ready Node, the ResourceSlice draguard's driver publishes for 8 H100s and 25 ResourceClaims,
one team namespace per 10 nodes; pods only with `--with-pods`, since the webhook watches none) on one
kube-apiserver + etcd where nothing else writes, and at each step (an empty cluster first) measures:
- **API server**: each watched resource listed in pages of 500 with continue tokens (how the
  reflector listed before it streamed) by a plain client that only reads the bytes: wall time of the
  pages, and the CPU this process then spends decoding them (json.loads), the two apart; and the
  ResourceClaims as a watch's initial events (sendInitialEvents, how the reflector asks now): wall
  time to the bookmark that ends them, and the decoding of each event;
- **replica**: `draguard serve` started `--starts` times, one after the other: start to the first 200
  from /readyz, each reflector's own list time (draguard_cache_list_duration_seconds) and the rebuild
  CPU by then (draguard_cache_rebuild_duration_seconds), from its /metrics; medians.
Growth between steps is (ratio of what the step adds over the empty cluster) / (ratio of the nodes):
at most 1 is linear or better. A benchmark: nothing is asserted on times. Exit status 0; 3 when the
local control plane cannot start (no Kubernetes binaries).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import ssl
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cluster_scale import (  # noqa: E402
    Size,
    api_only_cluster,
    grow,
    list_durations,
    parse_steps,
    say,
    seeded,
    start_webhook,
    sync_split,
    webhook_metrics,
)

# What the replica watches (webhook/server/caches.py, ClusterCache.resources), as it lists them.
WATCHED = {
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "deviceclasses": "/apis/resource.k8s.io/v1/deviceclasses",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
    "resourceclaimtemplates": "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    "namespaces": "/api/v1/namespaces",
    "resourcequotas": "/api/v1/resourcequotas",
    "nodes": "/api/v1/nodes",
}
# Figures per step: key, label, unit.
FIGURES = (
    ("sync_s", "replica: start to ready", "s"),
    ("list_s", "  its slowest list", "s"),
    ("claims_list_s", "  its ResourceClaim list", "s"),
    ("build_cpu_s", "  rebuild CPU by ready", "s"),
    ("raw_claims_s", "API server: claim pages, wall", "s"),
    ("raw_claims_decode_s", "  decoding them, CPU", "s"),
    ("stream_claims_s", "API server: claims streamed, wall", "s"),
    ("stream_claims_decode_s", "  decoding them, CPU", "s"),
    ("raw_all_s", "API server: every list, wall", "s"),
    ("raw_mib", "  bytes listed", "MiB"),
)


def raw_lists(cluster: Any) -> dict[str, dict[str, float]]:
    """Each watched resource paged as the reflector pages it: (wall of the pages, decode CPU, bytes)."""
    c = cluster.paths.certs
    ctx = ssl.create_default_context(cafile=str(c / "ca.crt"))
    ctx.load_cert_chain(str(c / "admin.crt"), str(c / "admin.key"))
    out: dict[str, dict[str, float]] = {}
    for name, path in WATCHED.items():
        wall = decode = 0.0
        size = pages = 0
        cont = ""
        while True:
            q = {"limit": "500", **({"continue": cont} if cont else {})}
            t0 = time.monotonic()
            url = f"{cluster.server}{path}?{urllib.parse.urlencode(q)}"
            with urllib.request.urlopen(url, context=ctx, timeout=120) as r:
                body = r.read()
            wall += time.monotonic() - t0
            c0 = time.thread_time()
            doc = json.loads(body)
            decode += time.thread_time() - c0
            size += len(body)
            pages += 1
            cont = str((doc.get("metadata") or {}).get("continue") or "")
            if not cont:
                break
        out[name] = {"wall_s": wall, "decode_s": decode, "bytes": size, "pages": pages}
    return out


def raw_stream(cluster: Any, path: str) -> dict[str, float]:
    """One collection as a watch's initial events (what the reflector asks for first): wall time to
    the bookmark that ends them, the CPU of decoding each event, and the events' count."""
    from webhook.server.caches import INITIAL_EVENTS_END, event_lines

    c = cluster.paths.certs
    ctx = ssl.create_default_context(cafile=str(c / "ca.crt"))
    ctx.load_cert_chain(str(c / "admin.crt"), str(c / "admin.key"))
    q = {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
         "allowWatchBookmarks": "true", "timeoutSeconds": "120"}  # fmt: skip
    decode, events = 0.0, 0
    t0 = time.monotonic()
    with urllib.request.urlopen(f"{cluster.server}{path}?{urllib.parse.urlencode(q)}", context=ctx) as r:
        for line in event_lines(iter(lambda: r.read1(64 * 1024), b"")):
            c0 = time.thread_time()
            ev = json.loads(line or b"{}")
            decode += time.thread_time() - c0
            if ev.get("type") == "BOOKMARK":
                notes = (ev.get("object") or {}).get("metadata", {}).get("annotations") or {}
                if notes.get(INITIAL_EVENTS_END) == "true":
                    break
            else:
                events += 1
    return {"wall_s": time.monotonic() - t0, "decode_s": decode, "events": events}


def replica_starts(cluster: Any, nodes: int, starts: int) -> list[dict[str, Any]]:
    from webhook.dev.cluster import free_port

    runs = []
    for i in range(starts):
        name, port = f"webhook-sync-{nodes}-{i}", free_port()
        _pid, sync = start_webhook(cluster, name, port)
        text = webhook_metrics(cluster, port)
        cluster.stop(name)
        lists = list_durations(text)
        slowest, list_s, build = sync_split(text)
        runs.append(
            {"sync_s": sync, "slowest": slowest, "list_s": list_s, "build_cpu_s": build, "lists": lists}
        )
        say(
            f"  start {i + 1}: ready in {sync:.1f} s "
            f"(slowest list {slowest} {list_s:.1f} s, rebuild CPU {build:.1f} s)"
        )
    return runs


def measure(cluster: Any, nodes: int, starts: int) -> dict[str, Any]:
    raw = raw_lists(cluster)
    say(
        "  plain client: "
        + ", ".join(f"{n} {r['wall_s']:.2f} s / {r['bytes'] / 2**20:.1f} MiB" for n, r in raw.items())
    )
    streamed = raw_stream(cluster, WATCHED["resourceclaims"])
    say(f"  plain client, claims streamed: {streamed['wall_s']:.2f} s, {streamed['events']} events")
    runs = replica_starts(cluster, nodes, starts)
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    return {
        "nodes": nodes,
        "sync_s": med("sync_s"),
        "list_s": med("list_s"),
        "claims_list_s": statistics.median(r["lists"].get("resourceclaims", math.nan) for r in runs),
        "build_cpu_s": med("build_cpu_s"),
        "raw_claims_s": raw["resourceclaims"]["wall_s"],
        "raw_claims_decode_s": raw["resourceclaims"]["decode_s"],
        "stream_claims_s": streamed["wall_s"],
        "stream_claims_decode_s": streamed["decode_s"],
        "stream": streamed,
        "raw_all_s": sum(r["wall_s"] for r in raw.values()),
        "raw_mib": sum(r["bytes"] for r in raw.values()) / 2**20,
        "raw": raw,
        "starts": runs,
    }


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = next((r for r in rows if r["nodes"] == 0), None)
    out = []
    for a, b in itertools.pairwise([r for r in rows if r["nodes"] > 0]):
        g: dict[str, Any] = {"from": a["nodes"], "to": b["nodes"]}
        for k, _label, _unit in FIGURES:
            b0 = float(base[k]) if base else 0.0
            da, db = float(a[k]) - b0, float(b[k]) - b0
            g[k] = (db / da) / (b["nodes"] / a["nodes"]) if da > 0 and db > 0 else math.nan
        out.append(g)
    return out


def report(rows: list[dict[str, Any]], gr: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| | " + " | ".join(f"{r['nodes']:,} nodes" for r in rows) + " | "
        + " | ".join(f"growth {g['from']:,}→{g['to']:,}" for g in gr) + " |",
        "|---|" + "---:|" * (len(rows) + len(gr)),
    ]  # fmt: skip
    for k, label, unit in FIGURES:
        vals = [f"{float(r[k]):.2f}" for r in rows] + [f"{g[k]:.2f}" for g in gr]
        lines.append(f"| {label.strip()} ({unit}) | " + " | ".join(vals) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--steps", default="200,1000,2000", help="node counts, increasing (default 200,1000,2000)"
    )
    ap.add_argument("--starts", type=int, default=3, help="replica starts per step (default 3)")
    ap.add_argument("--with-pods", action="store_true", help="also create 50 bound pods per node")
    ap.add_argument(
        "--parallel", type=int, default=32, help="connections used to create objects (default 32)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes (steps 2,4; one start): a smoke run")
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--json", metavar="OUT", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.starts = "2,4", 1
    steps = parse_steps(args.steps)
    if args.starts <= 0 or args.parallel <= 0:
        raise SystemExit("--starts and --parallel must be positive")
    rows: list[dict[str, Any]] = []
    with api_only_cluster("cache_sync", args.state_dir) as cluster:
        creator, maker = seeded(cluster, args.parallel)
        have = Size(0)
        for n in [0, *steps]:
            want = Size(n)
            say(
                f"step {n} nodes: {want.devices} devices, {want.claims} claims"
                + (f", {want.pods} pods" if args.with_pods else "")
            )
            if n > have.nodes:
                grow(creator, maker, have, want, say, pods=args.with_pods)
            have = want
            if creator.errors:
                raise SystemExit(f"creating the cluster failed: {creator.errors[:3]}")
            rows.append(measure(cluster, n, args.starts))
    gr = growth(rows)
    print("\n".join(report(rows, gr)))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "growth": gr, "with_pods": args.with_pods}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
