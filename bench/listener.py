"""Listener memory under a connection storm: idle TCP connections and half-open TLS handshakes.

    .venv/bin/python bench/listener.py [--connections 5000] [--devices 1000]

`draguard serve` runs in a child process on 127.0.0.1 (shipped policies, an inventory of
`--devices` GPUs, the probe port for /metrics). Two runs:

1. held: --max-connections above the storm and a handshake timeout longer than the run, so the
   server keeps every connection: the server's RSS after a few reviews (the baseline), after
   `--connections` idle TCP connections (connected, nothing sent), and after as many half-open
   ones (a TLS ClientHello sent, the server's answer read, the handshake never finished). Printed:
   RSS growth per connection of each kind against that baseline, and the total against the pod's
   memory limit (512 MiB): the target is the whole storm held within it.
2. default: the shipped settings (256 connections, 10 s handshake timeout), the same storm: RSS,
   connections closed to make room, and the time a normal review takes during the storm.

All traffic stays on loopback; every loop is bounded and the run ends by itself (the children are
stopped on exit). The open-file limit is raised to its hard limit for this process and the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

POD_LIMIT_MIB = 512
MiB = 1024 * 1024


def run_server(args: argparse.Namespace) -> None:
    from webhook.server import logs
    from webhook.server.app import ServeOptions, serve

    logs.setup("warning", sys.stderr)
    opts = ServeOptions(
        policies=str(ROOT / "policies"),
        host="127.0.0.1",
        port=args.port,
        probe_port=args.probe_port,
        tls_cert=args.cert,
        tls_key=args.key,
        inventory=args.inventory,
        no_watch=True,
        shutdown_delay=0.0,
        max_connections=args.max_connections,
        handshake_timeout=args.handshake_timeout,
        idle_timeout=max(30.0, args.handshake_timeout),
    )
    asyncio.run(serve(opts))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmRSS for process {pid}")


def _wait_ready(probe: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=1) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.1)
    raise SystemExit("server did not become ready")


def _dropped(probe: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{probe}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("draguard_connections_dropped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def _review_body(n: int) -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"bench-{n}", "namespace": "team-a"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "1"}}}]},
    }
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"00000000-0000-4000-8000-{n:012d}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "bench"},
                "object": pod,
                "oldObject": None,
                "dryRun": False,
            },
        }
    ).encode()


def _review(port: int, ca: str, n: int, timeout: float = 30.0) -> float:
    """One review on a fresh TLS connection; seconds from connect to the answer."""
    ctx = ssl.create_default_context(cafile=ca)
    body = _review_body(n)
    t0 = time.perf_counter()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(
            b"POST /validate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"review {n} not answered 200: {answer[:200]!r}")
    return time.perf_counter() - t0


def _client_hello() -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname="draguard-webhook")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def _open(port: int, n: int, hello: bytes | None) -> list[socket.socket]:
    """`n` connections; with `hello`, each sends it and waits for the server's first flight."""
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        if hello is not None:
            s.sendall(hello)
        socks.append(s)
    if hello is not None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.recv(65536)  # the server hello (or nothing, if the server closed it)
    return socks


def _still_open(socks: list[socket.socket]) -> int:
    """Connections the server has not closed: what it sent (a server hello) is read until nothing
    more is waiting (open) or the stream ends or is reset (closed)."""
    alive = 0
    for s in socks:
        s.setblocking(False)  # with a timeout set, recv would wait for data
        try:
            while s.recv(65536):
                pass
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def _close(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()


def storm(
    tls: Path, inventory: Path, n: int, max_connections: int, handshake_timeout: float
) -> dict[str, Any]:
    port, probe = _free_port(), _free_port()
    cmd = [
        sys.executable,
        __file__,
        "--role=server",
        f"--port={port}",
        f"--probe-port={probe}",
        f"--cert={tls / 'tls.crt'}",
        f"--key={tls / 'tls.key'}",
        f"--inventory={inventory}",
        f"--max-connections={max_connections}",
        f"--handshake-timeout={handshake_timeout}",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    ca = str(tls / "ca.crt")
    idle: list[socket.socket] = []
    half: list[socket.socket] = []
    try:
        _wait_ready(probe, proc)
        for i in range(20):  # warm: TLS, the handler path and the engine have run before the baseline
            _review(port, ca, i)
        base = _rss(proc.pid)
        t0 = time.monotonic()
        idle = _open(port, n, None)
        _review(port, ca, 100)  # accepted in order: once this is answered, every idle one was accepted
        after_idle = _rss(proc.pid)
        half = _open(port, n, _client_hello())
        during = _review(port, ca, 101)
        after_half = _rss(proc.pid)
        opened_s = time.monotonic() - t0
        return {
            "max_connections": max_connections,
            "connections": n,
            "baseline_mib": base / MiB,
            "after_idle_mib": after_idle / MiB,
            "after_half_open_mib": after_half / MiB,
            "per_idle_kib": (after_idle - base) / n / 1024,
            "per_half_open_kib": (after_half - after_idle) / n / 1024,
            "idle_open": _still_open(idle),
            "half_open_open": _still_open(half),
            "dropped": _dropped(probe),
            "review_during_storm_ms": during * 1000,
            "storm_s": opened_s,
        }
    finally:
        _close(idle)
        _close(half)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=5000, help="idle, and as many half-open (default 5000)")
    p.add_argument("--devices", type=int, default=1000, help="GPUs in the server's inventory (default 1000)")
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--probe-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cert", help=argparse.SUPPRESS)
    p.add_argument("--key", help=argparse.SUPPRESS)
    p.add_argument("--inventory", help=argparse.SUPPRESS)
    p.add_argument("--max-connections", type=int, default=256, help=argparse.SUPPRESS)
    p.add_argument("--handshake-timeout", type=float, default=10.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # Each side holds one descriptor per connection (the server inherits this limit).
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.role == "server":
        run_server(args)
        return 0
    n = args.connections
    if 2 * n + 128 > hard:
        raise SystemExit(f"--connections {n} needs {2 * n + 128} open files; the hard limit is {hard}")

    from bench.webhook import inventory_objects
    from webhook import certs

    with tempfile.TemporaryDirectory(prefix="draguard-bench-listener-") as tmp:
        tls = Path(tmp) / "tls"
        certs.ensure_certificates(certs.DirStore(tls), ["127.0.0.1", "localhost"])
        inventory = Path(tmp) / "inventory.json"
        inventory.write_text(
            json.dumps({"apiVersion": "v1", "kind": "List", "items": inventory_objects(args.devices)})
        )
        held = storm(tls, inventory, n, 2 * n + 64, handshake_timeout=600.0)
        default = storm(tls, inventory, n, 256, handshake_timeout=10.0)
    for name, r in (("held (every connection kept)", held), ("default (256, 10 s handshake)", default)):
        print(
            f"{name}: --max-connections {r['max_connections']}, "
            f"{n} idle + {n} half-open in {r['storm_s']:.1f} s"
        )
        print(
            f"  RSS MiB: baseline {r['baseline_mib']:.1f}, after idle {r['after_idle_mib']:.1f}, "
            f"after half-open {r['after_half_open_mib']:.1f}"
        )
        print(
            f"  per connection KiB: idle {r['per_idle_kib']:.1f}, half-open {r['per_half_open_kib']:.1f}; "
            f"still open: idle {r['idle_open']}, half-open {r['half_open_open']}"
        )
        print(f"  dropped: {r['dropped']}; a review during the storm: {r['review_during_storm_ms']:.0f} ms")
    within = held["after_half_open_mib"] <= POD_LIMIT_MIB
    kept = held["idle_open"] == n and held["half_open_open"] == n
    bounded = default["idle_open"] + default["half_open_open"] <= 256
    print(
        f"target: {n} idle + {n} half-open held within {POD_LIMIT_MIB} MiB: "
        f"{'met' if within and kept else 'NOT met'} ({held['after_half_open_mib']:.1f} MiB, all kept: {kept})"
    )
    print(f"target: at the default limit at most 256 held: {'met' if bounded else 'NOT met'}")
    return 0 if within and kept and bounded else 1


if __name__ == "__main__":
    sys.exit(main())
