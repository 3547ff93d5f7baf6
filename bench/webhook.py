"""Admission webhook load benchmark: draguard vs a bare aiohttp TLS server, same client, same core.

    .venv/bin/python bench/webhook.py [--rounds 3] [--seconds 5] [--connections 16] [--devices 10000]

Each server runs in its own process pinned to CPU 0 (when there are two or more CPUs); the load
generator runs in this process, pinned to another CPU. draguard serves the shipped policies with a
10,000-device inventory in its caches; the bare server parses each review and answers allowed. The
client keeps 16 TLS connections open and sends realistic reviews (legacy GPU pods, Deployments with
claims, DeviceClasses).

Every review sent has its own uid and object name (a number no earlier send of the run used), as a
cluster sends them: no review repeats and every one is evaluated (`--repeat`: the five bodies
over and over; draguard still evaluates each, as it never caches a validating CREATE). The bare
server's work does not depend on either. What draguard's review cache answered is printed.

The servers take turns for a few rounds and each one's least disturbed round is shown (all rounds
are printed too): on a shared machine other work lands in some rounds. Latency is measured twice:
closed loop (16 requests always in flight, so it includes queueing) and paced at a fixed rate well
below saturation (the service latency). Printed: throughput, p50/p99 latency and server RSS for both,
and each server's CPU time per answered review (from the server process's own CPU clock), which
other work on a shared machine disturbs far less than wall-clock throughput; its ratio is the
throughput ratio on a core of its own. Targets, each printed as met or not: server CPU per review
ratio bare/draguard >= 0.6, paced p99 <= 2 ms, RSS <= 200 MB, no errors. `--scenarios` adds the
same figures for each kind of review sent alone (legacy Pod, Deployment with claims, DeviceClass).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRODUCTS = (
    ("NVIDIA A100 80GB PCIe", "Ampere", "8.0.0", "80Gi"),
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi"),
)


def inventory_objects(devices: int, per_node: int = 8) -> list[dict[str, Any]]:
    """ResourceSlices (v1) for `devices` GPUs, 8 per node, A100 and H100 nodes alternating."""
    import yaml

    objs: list[dict[str, Any]] = []
    nodes = (devices + per_node - 1) // per_node
    for n in range(nodes):
        product, arch, cc, mem = PRODUCTS[n % 2]
        node = f"gpu-node-{n:05d}"
        devs = []
        for i in range(min(per_node, devices - n * per_node)):
            devs.append(
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": f"GPU-{n:05d}-{i}"},
                        "productName": {"string": product},
                        "brand": {"string": "Nvidia"},
                        "architecture": {"string": arch},
                        "cudaComputeCapability": {"version": cc},
                        "driverVersion": {"version": "550.54.15"},
                        "cudaDriverVersion": {"version": "12.4.0"},
                        "index": {"int": i},
                        "nvlinkDomain": {"string": f"{node}-nvl-0"},
                    },
                    "capacity": {"memory": {"value": mem}},
                }
            )
        objs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-gpu.nvidia.com"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devs,
                },
            }
        )
    seed = ROOT / "tests" / "fixtures" / "seed"
    objs += [d for d in yaml.safe_load_all((seed / "deviceclasses.yaml").read_text()) if d]
    objs += [
        d
        for d in yaml.safe_load_all((seed / "inference-deployment.yaml").read_text())
        if d and d.get("kind") == "ResourceClaimTemplate"
    ]
    return objs


def reviews() -> list[bytes]:
    """A realistic mix: legacy pods, Deployments with claims, DeviceClasses; as request bodies."""
    import yaml

    seed = ROOT / "tests" / "fixtures" / "seed"
    legacy = yaml.safe_load((seed / "legacy-pod.yaml").read_text())
    deployment = next(
        d
        for d in yaml.safe_load_all((seed / "inference-deployment.yaml").read_text())
        if d and d.get("kind") == "Deployment"
    )
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com-h100-new"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
                    }
                }
            ]
        },
    }
    out = []
    for i, (obj, group, kind, ns) in enumerate(
        [
            (legacy, "", "Pod", "team-a"),
            (deployment, "apps", "Deployment", "ml-workloads"),
            (legacy, "", "Pod", "team-b"),
            (deployment, "apps", "Deployment", "ml-workloads"),
            (device_class, "resource.k8s.io", "DeviceClass", ""),
        ]
    ):
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"bench-{i:04d}-0000-0000-000000000000",
                "kind": {"group": group, "version": "v1", "kind": kind},
                "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
                "name": obj["metadata"]["name"],
                "namespace": ns,
                "operation": "CREATE",
                "userInfo": {
                    "username": "system:serviceaccount:ci:deployer",
                    "groups": ["system:authenticated"],
                },
                "object": obj,
                "oldObject": None,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
        out.append(json.dumps(body).encode())
    return out


SEND_MARK = b"@@@@@@@@@@@@"  # 12 bytes; each send writes its own number here (uid and name)
_sends = itertools.count()


def distinct_reviews() -> list[bytes]:
    """`reviews()`'s mix as templates: the load generator writes a number no send of this process
    has used into each one's uid and object name, so no review repeats within a run (as a cluster's
    /validate CREATEs never do) and a cache cannot answer any of them."""
    out = []
    mark = SEND_MARK.decode()
    for doc in (json.loads(b) for b in reviews()):
        req = doc["request"]
        req["uid"] = f"c0ffee00-0000-4000-8000-{mark}"
        name = f"{req['object']['metadata']['name']}-{mark}"
        req["object"]["metadata"]["name"] = name
        req["name"] = name
        out.append(json.dumps(doc).encode())
    return out


def _sender(req: bytes) -> Callable[[], bytes]:
    """The bytes of one send of `req`: as it is, or with a fresh number in place of its marks."""
    if SEND_MARK not in req:
        return lambda: req
    parts = req.split(SEND_MARK)
    return lambda: (b"%012d" % next(_sends)).join(parts)


CPU_RATIO_TARGET = 0.6  # server CPU per review, bare / draguard
PACED_P99_TARGET_MS = 2.0
RSS_TARGET_MB = 200.0


# --- servers (child processes) ---------------------------------------------------------------------


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})


def run_bare(port: int, cert: str, key: str) -> None:
    from aiohttp import web

    async def handle(req: web.Request) -> web.Response:
        doc = json.loads(await req.read())
        out = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": doc["request"]["uid"], "allowed": True},
        }
        return web.Response(body=json.dumps(out), content_type="application/json")

    app = web.Application(client_max_size=3 * 1024 * 1024)
    app.router.add_post("/validate", handle)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, access_log=None, print=None)


def run_draguard(port: int, cert: str, key: str, policies: str, inventory: str, cache: bool) -> None:
    from webhook.server import logs
    from webhook.server.app import ServeOptions, serve

    # Info level: one JSON line per review, as in production: to stderr, a pipe the parent drains
    # (in a pod, the pipe to the container runtime).
    logs.setup("info", sys.stderr)
    opts = ServeOptions(
        policies=policies,
        host="127.0.0.1",
        port=port,
        tls_cert=cert,
        tls_key=key,
        inventory=inventory,
        no_watch=True,
        shutdown_delay=0.0,
        review_cache=cache,
    )
    if os.environ.get("DRAGUARD_BENCH_PROFILE"):
        import cProfile

        cProfile.runctx("asyncio.run(serve(opts))", globals(), locals(), os.environ["DRAGUARD_BENCH_PROFILE"])
    else:
        asyncio.run(serve(opts))


# --- load ------------------------------------------------------------------------------------------


async def _connection(
    host: str,
    port: int,
    ctx: ssl.SSLContext,
    reqs: list[Callable[[], bytes]],
    offset: int,
    stop_at: float,
    warm_until: float,
    lat: list[float],
    errors: list[str],
    interval: float = 0.0,
    answered: list[int] | None = None,
) -> int:
    """One keep-alive TLS connection sending reviews back to back, or one every `interval` s."""
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="127.0.0.1")
    n = offset * (len(reqs) // 16) + offset  # connections start at different places in the stream
    count = 0
    next_send = time.perf_counter() + (offset % 16) * interval / 16
    try:
        while True:
            if interval:
                delay = next_send - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_send += interval
            now = time.perf_counter()
            if now >= stop_at:
                break
            writer.write(reqs[n % len(reqs)]())
            n += 1
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            done = time.perf_counter()
            if answered is not None:
                answered[0] += 1  # every answer, warm-up included (server CPU is measured over all)
            if status != b"200" or b'"allowed"' not in body:
                errors.append(head[:40].decode(errors="replace"))
            if now >= warm_until:
                lat.append(done - now)
                count += 1
    finally:
        writer.close()
    return count


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def load(
    port: int,
    ca: str,
    connections: int,
    seconds: float,
    warmup: float,
    rate: float = 0.0,
    pid: int | None = None,
    bodies: list[bytes] | None = None,
) -> dict[str, Any]:
    """Closed loop (rate 0: as fast as answers come) or paced at `rate` requests/s in total.

    With `pid`, also the server process's CPU time per answered review: on a shared machine this
    moves far less than wall-clock throughput (other work delays the server, it does not bill it).
    """
    ctx = ssl.create_default_context(cafile=ca)
    bodies = bodies if bodies is not None else reviews()
    reqs = [
        _sender(
            b"POST /validate HTTP/1.1\r\nHost: draguard\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(b)}\r\n\r\n".encode()
            + b
        )
        for b in bodies
    ]
    lat: list[float] = []
    errors: list[str] = []
    answered = [0]
    interval = connections / rate if rate else 0.0
    cpu0 = _cpu_seconds(pid)
    start = time.perf_counter()
    warm_until = start + warmup
    stop_at = warm_until + seconds
    counts = await asyncio.gather(
        *(
            _connection(
                "127.0.0.1", port, ctx, reqs, i, stop_at, warm_until, lat, errors, interval, answered
            )
            for i in range(connections)
        )
    )
    cpu = _cpu_seconds(pid) - cpu0
    lat.sort()
    total = sum(counts)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

    return {
        "requests": total,
        "rps": total / seconds,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "cpu_ms_per_review": cpu * 1000 / answered[0] if pid is not None and answered[0] else float("nan"),
    }


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    role: str, extra: list[str], tls: Path, script: str = __file__
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    cmd = [
        sys.executable,
        script,
        "--role",
        role,
        "--port",
        str(port),
        "--cert",
        str(tls / "tls.crt"),
        "--key",
        str(tls / "tls.key"),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    tail = _drain(proc)
    try:
        _wait_port(port, proc)
    except SystemExit:
        proc.kill()
        proc.wait()
        sys.stderr.write(b"".join(tail).decode(errors="replace"))
        raise
    return proc, port


def _drain(proc: subprocess.Popen[bytes]) -> collections.deque[bytes]:
    """Read the server's stderr as the container runtime reads a pod's, in a thread of this
    process; the last lines are kept to show when the server fails to start."""
    import threading

    tail: collections.deque[bytes] = collections.deque(maxlen=40)

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line)

    threading.Thread(target=read, name=f"drain-{proc.pid}", daemon=True).start()
    return tail


def rounds(
    servers: dict[str, tuple[subprocess.Popen[bytes], int]], tls: Path, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Alternate the servers for `args.rounds` rounds (the machine may be shared: each server's
    least disturbed round counts), closed loop then paced; RSS at the end."""
    import psutil

    ca = str(tls / "ca.crt")
    bodies = reviews() if args.repeat else distinct_reviews()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for _ in range(args.rounds):
        for name, (proc, port) in servers.items():
            res = asyncio.run(
                load(port, ca, args.connections, args.seconds, args.warmup, pid=proc.pid, bodies=bodies)
            )
            # Latency without queueing: the same connections, paced well below saturation.
            paced = asyncio.run(
                load(port, ca, args.connections, args.paced_seconds, 0.5, args.rate, bodies=bodies)
            )
            res["paced_p50_ms"], res["paced_p99_ms"] = paced["p50_ms"], paced["p99_ms"]
            res["errors"] += paced["errors"]
            runs[name].append(res)
    out: dict[str, dict[str, Any]] = {}
    for name, (proc, port) in servers.items():
        best = max(runs[name], key=lambda r: r["rps"])
        best = {
            **best,
            "paced_p99_ms": min(r["paced_p99_ms"] for r in runs[name]),
            "paced_p50_ms": min(r["paced_p50_ms"] for r in runs[name]),
            "errors": sum(r["errors"] for r in runs[name]),
            "rps_all": [round(r["rps"]) for r in runs[name]],
            "paced_p99_all": [round(r["paced_p99_ms"], 2) for r in runs[name]],
            # Least CPU per review over the rounds: the least disturbed by other work on the core.
            "cpu_ms_per_review": min(r["cpu_ms_per_review"] for r in runs[name]),
            "cpu_ms_all": [round(r["cpu_ms_per_review"], 3) for r in runs[name]],
        }
        best["rss_mb"] = psutil.Process(proc.pid).memory_info().rss / 2**20
        if name != "bare":
            best["review_cache"] = review_cache_counts(port, ca)
        out[name] = best
    return out


def review_cache_counts(port: int, ca: str) -> dict[str, int]:
    """How many reviews draguard answered from its review cache ("hit") and evaluated ("miss"),
    from its /metrics: a run whose stream repeats shows it here."""
    import urllib.request

    ctx = ssl.create_default_context(cafile=ca)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10) as r:
        text = r.read().decode()
    counts = {"hit": 0, "miss": 0}
    for line in text.splitlines():
        for result in counts:
            if line.startswith(f'draguard_review_cache_total{{result="{result}"}}'):
                counts[result] = int(float(line.rsplit(" ", 1)[1]))
    return counts


SCENARIOS = ("legacy Pod (warn)", "Deployment with claims", "legacy Pod (team-b)", None, "DeviceClass")


def scenarios(
    servers: dict[str, tuple[subprocess.Popen[bytes], int]], tls: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each kind of review alone, closed loop: server CPU per review and throughput per server."""
    ca = str(tls / "ca.crt")
    out: list[dict[str, Any]] = []
    for label, body in zip(SCENARIOS, reviews() if args.repeat else distinct_reviews(), strict=True):
        if label is None:
            continue  # the second Deployment is the same review as the first
        row: dict[str, Any] = {"scenario": label}
        for name, (proc, port) in servers.items():
            best: dict[str, Any] | None = None
            for _ in range(args.rounds):
                r = asyncio.run(
                    load(port, ca, args.connections, args.scenario_seconds, 0.3, pid=proc.pid, bodies=[body])
                )
                if best is None or r["cpu_ms_per_review"] < best["cpu_ms_per_review"]:
                    best = r
            assert best is not None
            row[name] = {k: best[k] for k in ("rps", "p50_ms", "p99_ms", "cpu_ms_per_review", "errors")}
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="closed-loop seconds per round (default 4)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per server (default 3)")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--devices", type=int, default=10000)
    p.add_argument("--policies", default=str(ROOT / "policies"))
    p.add_argument("--json", action="store_true")
    p.add_argument("--rate", type=float, default=400.0, help="paced phase: requests/s in total (default 400)")
    p.add_argument("--paced-seconds", type=float, default=2.5)
    p.add_argument(
        "--no-cache", action="store_true", help="disable draguard's review cache (engine cost per request)"
    )
    p.add_argument(
        "--scenarios", action="store_true", help="also load each kind of review alone (per-scenario figures)"
    )
    p.add_argument("--scenario-seconds", type=float, default=1.5)
    p.add_argument(
        "--repeat",
        action="store_true",
        help="send the five review bodies over and over (default: every send its own uid and name)",
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="also serve draguard from this source tree (e.g. `git archive` of an earlier commit, "
        "unpacked) as a third server: before and after figures from one run",
    )
    p.add_argument("--role", choices=["bare", "draguard"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cert", help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--inventory", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.role:
        _pin(0)
        if args.role == "bare":
            run_bare(args.port, args.cert, args.key)
        else:
            run_draguard(args.port, args.cert, args.key, args.policies, args.inventory, not args.no_cache)
        return 0

    from webhook import certs

    _pin(1)
    with tempfile.TemporaryDirectory(prefix="draguard-bench-") as tmp:
        tls = Path(tmp) / "tls"
        certs.ensure_certificates(certs.DirStore(tls), ["127.0.0.1", "localhost"])
        inv = Path(tmp) / "inventory.json"
        inv.write_text(
            json.dumps({"apiVersion": "v1", "kind": "List", "items": inventory_objects(args.devices)})
        )
        extra = ["--policies", args.policies, "--inventory", str(inv)] + (
            ["--no-cache"] if args.no_cache else []
        )
        servers = {"bare": start("bare", [], tls), "draguard": start("draguard", extra, tls)}
        if args.baseline:
            script = str(Path(args.baseline).resolve() / "bench" / "webhook.py")
            servers["baseline"] = start("draguard", extra, tls, script)
        try:
            time.sleep(0.5)
            res = rounds(servers, tls, args)
            per_kind = scenarios(servers, tls, args) if args.scenarios else []
        finally:
            for proc, _port in servers.values():
                proc.terminate()
                proc.wait(30)
    bare, dg = res["bare"], res["draguard"]
    ratio = dg["rps"] / bare["rps"] if bare["rps"] else 0.0
    # Throughput ratio on a core of its own: what the wall-clock ratio reads on a quiet machine.
    cpu_ratio = bare["cpu_ms_per_review"] / dg["cpu_ms_per_review"] if dg["cpu_ms_per_review"] else 0.0
    targets = {
        f"server CPU per review ratio bare/draguard >= {CPU_RATIO_TARGET:g}": (
            cpu_ratio >= CPU_RATIO_TARGET,
            f"{cpu_ratio:.2f}",
        ),
        f"paced p99 <= {PACED_P99_TARGET_MS:g} ms": (
            dg["paced_p99_ms"] <= PACED_P99_TARGET_MS,
            f"{dg['paced_p99_ms']:.2f} ms",
        ),
        f"RSS <= {RSS_TARGET_MB:g} MB": (dg["rss_mb"] <= RSS_TARGET_MB, f"{dg['rss_mb']:.1f} MB"),
        "no errors": (dg["errors"] == 0, str(dg["errors"])),
    }
    ok = all(met for met, _value in targets.values())
    if args.json:
        print(
            json.dumps(
                {
                    "bare": bare,
                    "draguard": dg,
                    "baseline": res.get("baseline"),
                    "ratio": ratio,
                    "targets_met": ok,
                    "targets": {name: {"met": met, "value": v} for name, (met, v) in targets.items()},
                    "distinct": not args.repeat,
                    "connections": args.connections,
                    "devices": args.devices,
                    "rate": args.rate,
                    "cpu_ratio": cpu_ratio,
                    "scenarios": per_kind,
                },
                indent=2,
            )
        )
        return 0 if ok else 1
    print(
        f"{args.connections} TLS connections, {args.devices} devices; {args.rounds} alternating rounds of "
        f"{args.seconds:g} s closed loop + {args.paced_seconds:g} s paced at {args.rate:g} req/s; "
        f"best round shown; {'five bodies repeated' if args.repeat else 'every review its own uid and name'}"
    )
    print(
        f"{'server':<9} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} | {'paced p50':>9} {'paced p99':>9} "
        f"| {'RSS MB':>6} {'errors':>6}"
    )
    shown = [("bare", bare), ("draguard", dg)] + (
        [("baseline", res["baseline"])] if "baseline" in res else []
    )
    for name, r in shown:
        print(
            f"{name:<9} {r['rps']:>7.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} | {r['paced_p50_ms']:>9.2f} "
            f"{r['paced_p99_ms']:>9.2f} | {r['rss_mb']:>6.1f} {r['errors']:>6}"
        )
    print(f"throughput ratio draguard/bare: {ratio:.2f} (wall clock, context only)")
    print(
        f"all rounds req/s: bare {bare['rps_all']}, draguard {dg['rps_all']}; "
        f"paced p99 ms: bare {bare['paced_p99_all']}, draguard {dg['paced_p99_all']}"
    )
    print(
        f"server CPU per review (least of rounds): bare {bare['cpu_ms_per_review']:.3f} ms, draguard "
        f"{dg['cpu_ms_per_review']:.3f} ms; ratio bare/draguard {cpu_ratio:.2f} (all rounds ms: bare "
        f"{bare['cpu_ms_all']}, draguard {dg['cpu_ms_all']})"
    )
    if "baseline" in res:
        base = res["baseline"]
        print(
            f"baseline ({args.baseline}): {base['cpu_ms_per_review']:.3f} ms CPU per review, "
            "ratio bare/baseline "
            f"{bare['cpu_ms_per_review'] / base['cpu_ms_per_review']:.2f}; this tree / baseline CPU "
            f"{dg['cpu_ms_per_review'] / base['cpu_ms_per_review']:.2f} (all rounds ms: {base['cpu_ms_all']})"
        )
    for row in per_kind:
        b, d = row["bare"], row["draguard"]
        print(
            f"  {row['scenario']:<24} draguard {d['cpu_ms_per_review']:.3f} ms CPU, {d['rps']:.0f} req/s, "
            f"p99 {d['p99_ms']:.2f} ms | bare {b['cpu_ms_per_review']:.3f} ms CPU, {b['rps']:.0f} req/s | "
            f"CPU ratio {b['cpu_ms_per_review'] / d['cpu_ms_per_review']:.2f}"
        )
    for name, r in shown[1:]:
        rc = r["review_cache"]
        print(f"{name} review cache: {rc['hit']} answered from it, {rc['miss']} evaluated")
    for name, (met, value) in targets.items():
        print(f"target {name}: {value}, {'met' if met else 'NOT met'}")
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
