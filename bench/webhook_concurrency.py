"""Webhook throughput and latency at 1, 16 and 64 concurrent connections, and with two workers.

    python bench/webhook_concurrency.py [--seconds 8] [--devices 10000] [--unique | --repeats] [--json OUT]

Reuses bench/webhook.py (its inventory, server runner and load generator). One `draguard serve`
process pinned to CPU 0 is driven by the load generator on the other CPU at each connection count.
Then two server processes share the port through SO_REUSEPORT (the kernel spreads connections
between them); `draguard serve` has no worker option, so this bench sets the socket option in the
child processes to show what a second worker would give on this machine.

Bodies: by default every review sent has its own uid and object name (`--unique`, bench/webhook.py's
stream), and the servers' review cache is off: nothing repeats, so the engine runs for every
request. `--repeats` sends bench/webhook.py's five fixed reviews with the cache on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import webhook as wb  # noqa: E402


def serve_child(
    port: int, cert: str, key: str, policies: str, inventory: str, cpu: int | None, cache: bool
) -> None:
    """A draguard server whose listening socket sets SO_REUSEPORT (for the two-worker runs)."""
    from aiohttp import web

    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    # The serving site subclasses TCPSite (webhook/server/listen.py): patch the base's __init__, so
    # the subclass still has a class to derive from and every site it opens sets the option.
    base_init = web.TCPSite.__init__

    def reuse_port_init(self: web.TCPSite, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("reuse_port", True)
        base_init(self, *args, **kwargs)

    web.TCPSite.__init__ = reuse_port_init  # type: ignore[method-assign]
    wb.run_draguard(port, cert, key, policies, inventory, cache)


def start_servers(
    workers: int, port: int, tls: Path, inv: Path, policies: str, cache: bool = False
) -> list[subprocess.Popen[bytes]]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    procs = []
    for w in range(workers):
        # One worker: CPU 0, the client elsewhere. Two workers: their own CPUs when there are 3+,
        # otherwise unpinned (on 2 CPUs they share both with the client).
        cpu: int | None = cpus[0] if workers == 1 else (cpus[w] if len(cpus) > 2 else None)
        cmd = [
            sys.executable, __file__, "--child", str(port), str(tls / "tls.crt"), str(tls / "tls.key"),
            policies, str(inv), str(cpu if cpu is not None else -1), "cache" if cache else "no-cache",
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd))
    for p in procs:
        wb._wait_port(port, p)
    time.sleep(0.5)
    return procs


def rss_mb(procs: list[subprocess.Popen[bytes]]) -> float:
    import psutil

    return sum(psutil.Process(p.pid).memory_info().rss for p in procs) / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--connections", default="1,16,64")
    ap.add_argument("--policies", default=str(ROOT / "policies"))
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--unique", action="store_true", default=True)
    g.add_argument("--repeats", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        port, cert, key, policies, inv, cpu, cache = args.child
        serve_child(int(port), cert, key, policies, inv, None if cpu == "-1" else int(cpu), cache == "cache")
        return 0

    from webhook import certs

    if not args.repeats:
        bodies = wb.distinct_reviews()
        wb.reviews = lambda: bodies  # the shared load generator reads its bodies from here
    conns = [int(c) for c in args.connections.split(",") if c]
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="draguard-bench-conc-") as tmp:
        tls = Path(tmp) / "tls"
        certs.ensure_certificates(certs.DirStore(tls), ["127.0.0.1", "localhost"])
        inv = Path(tmp) / "inventory.json"
        inv.write_text(
            json.dumps({"apiVersion": "v1", "kind": "List", "items": wb.inventory_objects(args.devices)})
        )
        ca = str(tls / "ca.crt")
        plan = [(1, c) for c in conns] + [(2, max(conns))]
        for workers, c in plan:
            port = wb._free_port()
            if workers == 1 and len(cpus) > 1 and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, set(cpus[1:]))  # the client off the server's core
            elif hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, set(cpus))
            # Unique objects: nothing repeats, so the review cache stays off (--repeats: on).
            procs = start_servers(workers, port, tls, inv, args.policies, cache=args.repeats)
            try:
                r = asyncio.run(wb.load(port, ca, c, args.seconds, args.warmup))
                r["rss_mb"] = round(rss_mb(procs), 1)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
            r.update({"workers": workers, "connections": c})
            results.append(r)
            print(
                f"  {workers} worker(s), {c} connection(s): {r['rps']:.0f} req/s", file=sys.stderr, flush=True
            )
    bodies_text = "unique objects, review cache off"
    if args.repeats:
        bodies_text = "five repeated reviews, review cache on"
    print(
        f"draguard serve, {args.devices:,} devices, shipped policies, {bodies_text}, "
        f"{args.seconds:g} s closed loop per row, {len(cpus)} CPU(s)"
    )
    print(f"{'workers':>7} {'conns':>6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'RSS MB':>7} {'errors':>6}")
    for r in results:
        print(
            f"{r['workers']:>7} {r['connections']:>6} {r['rps']:>8.0f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} "
            f"{r['rss_mb']:>7.1f} {r['errors']:>6}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": results, "cpus": len(cpus)}, indent=2))
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
