"""Python bytecodes the webhook server's handler runs per review around the engine: a count that
load on the machine cannot move.

    .venv/bin/python bench/handler_ops.py [--baseline DIR] [--devices 1000]

`draguard serve`'s aiohttp application (as `bench/webhook.py --no-cache` runs it: shipped policies,
a simulated inventory, the per-review log line at info level to /dev/null) answers
`bench/webhook.py`'s mixed stream over one loopback HTTP connection, in-process. An opcode tracer
(`sys.settrace` with `f_trace_opcodes`) counts everything from aiohttp's application entry
(routing, middleware, draguard's handler) to the response object, and separately what runs inside
`admission.review()` (the engine and the mapping onto the response, see `bench/review_ops.py`).
Printed: both, and their difference, the handler's own work. The body arrives with its headers and
nothing is looked up from a cluster, so the handler never waits and the count is the server's
alone. C work (orjson, TLS, hashing) is not counted, and a bytecode is not a fixed amount of time.

`--baseline DIR` counts another source tree (e.g. `git archive <commit> | tar -x -C DIR`) in a
process of its own, and prints the ratio. `--cpu` measures the same two spans in thread CPU time
instead (µs per review, least of 3 rounds of 200 per shape, processes of the two trees taking
turns `--processes` times; the least is shown): a time, so load moves it, unlike the count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPES = (("legacy Pod", 0), ("Deployment with claims", 1), ("DeviceClass", 4))
MIX = {"legacy Pod": 2, "Deployment with claims": 2, "DeviceClass": 1}


def count(root: Path, devices: int, per_shape: int = 20, cpu: bool = False) -> dict[str, dict[str, float]]:
    """Bytecodes (or with `cpu`, thread CPU µs) per review for each shape: in aiohttp's entry and
    below, and in review()."""
    import time

    sys.path.insert(0, str(root))
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from bench.webhook import inventory_objects, reviews
    from webhook.server import admission, logs
    from webhook.server.app import ServeOptions, Webhook

    logs.setup("info", open(os.devnull, "w"))  # noqa: SIM115
    tmp = Path(tempfile.mkdtemp(prefix="draguard-handler-ops-"))
    inv = tmp / "inventory.json"
    inv.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": inventory_objects(devices)}))
    wh = Webhook(
        ServeOptions(policies=str(root / "policies"), inventory=str(inv), no_watch=True, review_cache=False)
    )
    ops = {"all": 0.0, "review": 0.0}
    where = ["all"]

    def tracer(frame: Any, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            ops[where[0]] += 1
        return tracer

    tracing = [False]
    entry = web.Application._handle

    async def counted(self: Any, request: Any) -> Any:
        if not tracing[0]:
            return await entry(self, request)
        if cpu:
            t0 = time.thread_time()
            try:
                return await entry(self, request)
            finally:
                ops["all"] += (time.thread_time() - t0) * 1e6
        sys.settrace(tracer)
        try:
            return await entry(self, request)
        finally:
            sys.settrace(None)

    engine = admission.review

    def review(*args: Any, **kwargs: Any) -> Any:
        if cpu and tracing[0]:
            t0 = time.thread_time()
            try:
                return engine(*args, **kwargs)
            finally:
                ops["review"] += (time.thread_time() - t0) * 1e6
        where[0] = "review"
        try:
            return engine(*args, **kwargs)
        finally:
            where[0] = "all"

    web.Application._handle = counted  # type: ignore[method-assign]
    admission.review = review  # type: ignore[assignment]
    bodies = reviews()

    async def run() -> dict[str, dict[str, float]]:
        await wh.start_background()
        out: dict[str, dict[str, float]] = {}
        try:
            async with TestServer(wh.build_app()) as server:
                # One keep-alive connection; each request in one write, as the API server sends it.
                reader, writer = await asyncio.open_connection(server.host, server.port)

                async def post(body: bytes) -> None:
                    writer.write(
                        b"POST /validate HTTP/1.1\r\nHost: draguard\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    head = await reader.readuntil(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200"), head
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    await reader.readexactly(length)

                for name, i in SHAPES:
                    for _ in range(per_shape):  # warm: per-inventory memos, compiled CEL, label children
                        await post(bodies[i])
                    best: dict[str, float] | None = None
                    for _ in range(3 if cpu else 1):
                        ops["all"] = ops["review"] = 0
                        for _ in range(per_shape):
                            tracing[0] = True
                            await post(bodies[i])
                            tracing[0] = False
                        # Counted: review()'s bytecodes are not in "all"; timed: its time is.
                        total = ops["all"] if cpu else ops["all"] + ops["review"]
                        inside = ops["review"]
                        row = {
                            "total": total / per_shape,
                            "review": inside / per_shape,
                            "handler": (total - inside) / per_shape,
                        }
                        if best is None or row["total"] < best["total"]:
                            best = row
                    assert best is not None
                    out[name] = best
                writer.close()
        finally:
            await wh.stop_background()
        weight = sum(MIX.values())
        out["mixed stream"] = {
            k: sum(out[s][k] * n for s, n in MIX.items()) / weight for k in ("total", "review", "handler")
        }
        return out

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="DIR", help="also count this source tree (its own process)")
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--cpu", action="store_true", help="thread CPU µs per review instead of bytecodes")
    p.add_argument("--processes", type=int, default=3, help="with --cpu: processes per tree (default 3)")
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.root:
        per_shape = 200 if args.cpu else 20
        print(json.dumps(count(Path(args.root), args.devices, per_shape, args.cpu)))
        return 0

    def run(root: Path) -> dict[str, dict[str, float]]:
        cmd = [sys.executable, __file__, "--root", str(root), "--devices", str(args.devices)]
        cmd += ["--cpu"] if args.cpu else []
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"counting {root} failed:\n{done.stderr[-2000:]}")
        res: dict[str, dict[str, float]] = json.loads(done.stdout.splitlines()[-1])
        return res

    Rows = dict[str, dict[str, float]]

    def least(a: Rows | None, b: Rows) -> Rows:
        if a is None:
            return b
        return {shape: min(a[shape], b[shape], key=lambda r: r["total"]) for shape in b}

    now: Rows | None = None
    base: Rows | None = None
    for _ in range(args.processes if args.cpu else 1):
        now = least(now, run(ROOT))
        if args.baseline:
            base = least(base, run(Path(args.baseline).resolve()))
    assert now is not None
    if args.json:
        print(json.dumps({"this": now, "baseline": base}, indent=2))
        return 0
    what = "Thread CPU µs" if args.cpu else "Python bytecodes"
    print(f"{what} per review through the server (validate, {args.devices} devices, shipped policies)")
    fmt = ",.1f" if args.cpu else ",.0f"
    print(f"  {'':<24} {'handler':>8} {'review()':>9} {'total':>8}")
    for name, row in now.items():
        line = f"  {name:<24} {row['handler']:>8{fmt}} {row['review']:>9{fmt}} {row['total']:>8{fmt}}"
        if base:
            b = base[name]
            line += (
                f"   baseline handler {b['handler']:>6{fmt}} "
                f"(this / baseline {row['handler'] / b['handler']:.2f}), "
                f"total {b['total']:>7{fmt}} ({row['total'] / b['total']:.2f})"
            )
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
