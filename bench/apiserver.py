"""Create latency through a real kube-apiserver, with draguard's webhooks registered vs without.

    python bench/apiserver.py [--pods 2000] [--deployments 500] [--blocks 4] [--replicas 1]
                              [--state-dir DIR] [--keep] [--json OUT]

Starts the local control plane (`webhook/dev`, binaries from scripts/build-k8s.sh: etcd,
kube-apiserver, controller-manager, scheduler, simulated GPU nodes with the simulated-NVML driver)
and `draguard serve` on loopback. Every object requests a GPU through a ResourceClaimTemplate, so
each create passes the validating webhook's matchConditions and calls /validate (pods without GPUs
skip the webhooks entirely; /mutate is only called for device-plugin `nvidia.com/*` requests, which
it migrates). The controller-manager is stopped once the namespaces have their ServiceAccounts, so
what is timed is the admission of each object alone: no claims are made from the templates (each
would be a create of its own, reviewed and charged to the namespace's quota), no ReplicaSets.
One client creates objects one after another over a kept-alive connection and times each POST;
arms alternate in blocks (webhooks registered, then not), so drift in etcd hits both. Prints
p50/p99 per arm and kind, the added latency with 90 % bootstrap intervals (targets: p50 <= 2 ms,
p99 <= 3 ms), and where the added time goes: the webhook's own handler time and process CPU per
call, and how many connections the API server opened to it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEMPLATE_CLASS = "gpu.nvidia.com-h100"


class Api:
    """A kept-alive HTTPS connection to the API server with the admin client certificate."""

    def __init__(self, server: str, certs: Path, timeout: float = 30.0) -> None:
        host, port = server.removeprefix("https://").split(":")
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ctx.load_cert_chain(str(certs / "admin.crt"), str(certs / "admin.key"))
        self.host, self.port, self.ctx, self.timeout = host, int(port), ctx, timeout
        self.conn = self._connect()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=self.timeout)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        data = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = self.conn.getresponse()
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None), {k.lower(): v for k, v in r.getheaders()}
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = self._connect()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def pod_spec(i: int) -> dict[str, Any]:
    return {
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/batch/worker:1",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}],
    }


def pod(ns: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i}", "namespace": ns},
        "spec": pod_spec(i),
    }


def deployment(ns: str, i: int, replicas: int) -> dict[str, Any]:
    name = f"d-{i}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(i)},
        },
    }


def template(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-h100", "namespace": ns},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": TEMPLATE_CLASS}}]}
            }
        },
    }


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def added_interval(off: list[float], on: list[float], q: float, rounds: int = 1000) -> tuple[float, float]:
    """90 % bootstrap interval of pct(on, q) - pct(off, q), in seconds: how far the added latency
    at a percentile could move by chance alone (a p99 of 500 samples is their 5th largest)."""
    rng = random.Random(1234)
    diffs = sorted(
        pct(rng.choices(on, k=len(on)), q) - pct(rng.choices(off, k=len(off)), q) for _ in range(rounds)
    )
    return diffs[int(0.05 * rounds)], diffs[int(0.95 * rounds) - 1]


def webhook_answering(api: Api, ns: str) -> str | None:
    """Who answers a dry-run create of a legacy-GPU pod: "on" (draguard's migration warning or its
    denial), "bare" (the null webhook's warning) or "off" (no webhook)."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": ns},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    status, _body, headers = api.call("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", probe)
    warning = headers.get("warning", "")
    if "draguard" in warning or status == 403:
        return "on"
    return "bare" if BARE_WARNING in warning else "off"


# A null webhook: parses the review and allows it, on the same TLS certificate, registered with the
# same configurations as draguard. Its added latency is the API server's own cost of calling a webhook.
BARE_WARNING = "bench-null-webhook"
BARE_SERVER = """
import json, ssl, sys
from aiohttp import web

async def handle(req):
    doc = json.loads(await req.read())
    resp = {"uid": doc["request"]["uid"], "allowed": True}
    if (doc["request"].get("name") or "").startswith("probe"):
        resp["warnings"] = ["BARE_WARNING"]
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
    return web.Response(body=json.dumps(out), content_type="application/json")

app = web.Application(client_max_size=3 * 1024 * 1024)
app.router.add_post("/validate", handle)
app.router.add_post("/mutate", handle)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.minimum_version = ssl.TLSVersion.TLSv1_2
ctx.load_cert_chain(sys.argv[2], sys.argv[3])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), ssl_context=ctx, access_log=None, print=None)
""".replace("BARE_WARNING", BARE_WARNING)


def set_webhooks(cluster: Any, api: Api, ports: dict[str, int], arm: str, probe_ns: str) -> None:
    if arm != "off":
        cluster.register_webhook(ports[arm])
    else:
        cluster.kubectl(
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            "draguard",
            "--ignore-not-found",
        )
    deadline = time.monotonic() + 30
    while webhook_answering(api, probe_ns) != arm:
        if time.monotonic() > deadline:
            raise SystemExit(f"the API server did not switch to webhooks '{arm}' within 30 s")
        time.sleep(0.2)


def webhook_peers(port: int) -> set[int]:
    """Client ports of the established TCP connections to `port` on this host (/proc/net/tcp)."""
    peers: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                peers.add(int(f[2].rsplit(":", 1)[1], 16))
    return peers


class ConnWatch(threading.Thread):
    """Samples the connections to the webhook every 50 ms: how many the API server opened."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.seen, self.most = port, set[int](), 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            now = webhook_peers(self.port)
            self.seen |= now
            self.most = max(self.most, len(now))


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_all(api: Api, objs: list[tuple[str, dict[str, Any]]]) -> tuple[list[float], list[str]]:
    lat: list[float] = []
    errors: list[str] = []
    for path, obj in objs:
        t0 = time.perf_counter()
        status, body, _h = api.call("POST", path, obj)
        lat.append(time.perf_counter() - t0)
        if status != 201:
            errors.append(
                f"{obj['kind']} {obj['metadata']['name']}: HTTP {status}: {(body or {}).get('message')}"
            )
    return lat, errors


def added_row(lat: dict[tuple[str, str], list[float]], arm: str, kind: str) -> dict[str, Any]:
    off, on = lat[("off", kind)], lat[(arm, kind)]
    row: dict[str, Any] = {
        "kind": kind,
        "n_per_arm": len(on),
        "off_p50_ms": round(statistics.median(off) * 1000, 2),
        "off_p99_ms": round(pct(off, 99) * 1000, 2),
        "on_p50_ms": round(statistics.median(on) * 1000, 2),
        "on_p99_ms": round(pct(on, 99) * 1000, 2),
    }
    row["added_p50_ms"] = round(row["on_p50_ms"] - row["off_p50_ms"], 2)
    row["added_p99_ms"] = round(row["on_p99_ms"] - row["off_p99_ms"], 2)
    for q in (50, 99):
        lo, hi = added_interval(off, on, q)
        row[f"added_p{q}_ci90_ms"] = [round(lo * 1000, 2), round(hi * 1000, 2)]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pods", type=int, default=2000, help="pods per arm")
    ap.add_argument("--deployments", type=int, default=500, help="Deployments per arm")
    ap.add_argument("--blocks", type=int, default=4, help="alternations between the arms")
    ap.add_argument("--replicas", type=int, default=1, help="replicas of each Deployment (not started)")
    ap.add_argument("--no-bare", action="store_true", help="leave out the null-webhook arm")
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    from webhook.dev.cluster import ClusterError, LocalCluster

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="draguard-bench-apiserver-"))
    cluster = LocalCluster(state, None, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    try:
        t0 = time.monotonic()
        cluster.up(with_driver=True, with_webhook=True)
        print(f"cluster up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        port = int(cluster.state["ports"]["webhook"])
        api = Api(cluster.server, cluster.paths.certs)
        arms = ("off", "on") if args.no_bare else ("off", "bare", "on")
        ports = {"on": port}
        pids = {"on": int(cluster.state["pids"]["webhook"])}
        if "bare" in arms:
            from webhook.dev.cluster import free_port

            c = cluster.paths.certs
            ports["bare"] = free_port()
            pids["bare"] = cluster.spawn(
                "bare-webhook",
                [
                    sys.executable,
                    "-c",
                    BARE_SERVER,
                    str(ports["bare"]),
                    str(c / "webhook.crt"),
                    str(c / "webhook.key"),
                ],
            )
        namespaces = {a: f"bench-{a}" for a in arms}
        for ns in namespaces.values():
            api.call(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )
            cluster.wait_default_sa(ns)
            status, body, _ = api.call(
                "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", template(ns)
            )
            if status not in (201, 409):
                raise SystemExit(f"cannot create the claim template in {ns}: {status} {body}")
        # What is timed is each object's own admission (see the module docstring).
        cluster.stop("kube-controller-manager")
        conns = {a: ConnWatch(ports[a]) for a in ports}
        for w in conns.values():
            w.start()
        server_cpu = {a: 0.0 for a in ports}
        lat: dict[tuple[str, str], list[float]] = {(a, k): [] for a in arms for k in ("Pod", "Deployment")}
        errors: dict[str, list[str]] = {a: [] for a in arms}
        pods_per = math.ceil(args.pods / args.blocks)
        deps_per = math.ceil(args.deployments / args.blocks)
        next_pod = {a: 0 for a in arms}
        next_dep = {a: 0 for a in arms}
        for b in range(args.blocks):
            # The order of the arms turns each block, so none always follows another.
            for arm in arms[b % len(arms) :] + arms[: b % len(arms)]:
                set_webhooks(cluster, api, ports, arm, namespaces[arm])
                ns = namespaces[arm]
                n_p = min(pods_per, args.pods - next_pod[arm])
                n_d = min(deps_per, args.deployments - next_dep[arm])
                objs: list[tuple[str, dict[str, Any]]] = []
                # Interleave kinds (one Deployment per pods/deployments pods) so both see the same background.
                every = max(1, n_p // max(n_d, 1))
                d = 0
                for i in range(n_p):
                    objs.append((f"/api/v1/namespaces/{ns}/pods", pod(ns, next_pod[arm] + i)))
                    if i % every == every - 1 and d < n_d:
                        dep = deployment(ns, next_dep[arm] + d, args.replicas)
                        objs.append((f"/apis/apps/v1/namespaces/{ns}/deployments", dep))
                        d += 1
                for j in range(d, n_d):
                    dep = deployment(ns, next_dep[arm] + j, args.replicas)
                    objs.append((f"/apis/apps/v1/namespaces/{ns}/deployments", dep))
                next_pod[arm] += n_p
                next_dep[arm] += n_d
                cpu0 = proc_cpu_s(pids[arm]) if arm in pids else 0.0
                lp, errs = create_all(api, objs)
                if arm in pids:
                    server_cpu[arm] += proc_cpu_s(pids[arm]) - cpu0
                errors[arm] += errs
                for (_path, obj), sec in zip(objs, lp, strict=True):
                    lat[(arm, obj["kind"])].append(sec)
                print(f"  block {b + 1}/{args.blocks} webhooks {arm}: {len(objs)} creates, "
                      f"p50 {statistics.median(lp) * 1000:.1f} ms", file=sys.stderr, flush=True)  # fmt: skip
        for w in conns.values():
            w.done.set()
        metrics_text = ""
        try:
            import urllib.request

            ctx = ssl.create_default_context(cafile=str(cluster.paths.certs / "webhook-ca.crt"))
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=5) as r:
                metrics_text = r.read().decode()
        except OSError:
            pass
    except ClusterError as exc:
        print(f"bench/apiserver.py: the local control plane is not available: {exc}", file=sys.stderr)
        return 3
    finally:
        if not args.keep:
            try:
                cluster.down(keep_logs=False)
            except ClusterError as exc:
                print(f"warning: {exc}", file=sys.stderr)
    rows = [added_row(lat, "on", kind) for kind in ("Pod", "Deployment")]
    bare_rows = [added_row(lat, "bare", kind) for kind in ("Pod", "Deployment")] if "bare" in arms else []
    served = 0.0
    handler: dict[str, list[float]] = {}
    for line in metrics_text.splitlines():
        if line.startswith("draguard_admission_requests_total{"):
            served += float(line.rsplit(" ", 1)[1])
        for part in ("sum", "count"):
            if line.startswith(f"draguard_admission_duration_seconds_{part}{{"):
                ep = line.split('endpoint="', 1)[1].split('"', 1)[0]
                handler.setdefault(ep, [0.0, 0.0])[part == "count"] += float(line.rsplit(" ", 1)[1])
    handler_ms = {ep: round(sc[0] / sc[1] * 1000, 2) for ep, sc in handler.items() if sc[1]}
    calls = {ep: int(sc[1]) for ep, sc in handler.items()}
    # Background rebuilds from the watch caches share the process (and the GIL) with the handlers.
    rebuild: dict[str, list[float]] = {}
    for line in metrics_text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"draguard_cache_rebuild_duration_seconds_{part}{{"):
                what = line.split('changed="', 1)[1].split('"', 1)[0]
                rebuild.setdefault(what, [0.0, 0.0])[part == "count"] += float(line.rsplit(" ", 1)[1])
    print(f"Creates through kube-apiserver, one client, sequential; {args.blocks} alternating blocks; "
          f"every object requests a GPU through a claim template")  # fmt: skip
    print(
        f"{'kind':<11} {'n/arm':>6} {'off p50':>8} {'off p99':>8} {'on p50':>8} {'on p99':>8} "
        f"{'+p50':>7} {'+p99':>7}  90% interval +p50 / +p99 (bootstrap)"
    )
    for label, table in (("draguard", rows), ("null webhook", bare_rows)):
        for r in table:
            print(f"{r['kind']:<11} {r['n_per_arm']:>6} {r['off_p50_ms']:>8.2f} {r['off_p99_ms']:>8.2f} "
                  f"{r['on_p50_ms']:>8.2f} {r['on_p99_ms']:>8.2f} "
                  f"{r['added_p50_ms']:>7.2f} {r['added_p99_ms']:>7.2f}  "
                  f"[{r['added_p50_ci90_ms'][0]:.2f}, {r['added_p50_ci90_ms'][1]:.2f}] / "
                  f"[{r['added_p99_ci90_ms'][0]:.2f}, {r['added_p99_ci90_ms'][1]:.2f}]  {label}")  # fmt: skip
    print(
        f"webhook answered {served:.0f} admission requests (its /metrics); "
        "create errors: " + ", ".join(f"{a} {len(e)}" for a, e in errors.items())
    )
    if handler_ms:
        print("webhook handler time, mean per request (its own histogram): "
              + ", ".join(f"/{ep} {ms:.2f} ms ({calls[ep]} calls)"
                          for ep, ms in sorted(handler_ms.items())))  # fmt: skip
    if rebuild:
        print("cache rebuilds in the webhook (CPU, by what changed): "
              + ", ".join(f"{what} {int(n)} x {t / n * 1000:.1f} ms = {t:.2f} s"
                          for what, (t, n) in sorted(rebuild.items()) if n))  # fmt: skip
    for arm, errs in errors.items():
        for e in errs[:5]:
            print(f"  {arm}: {e}")
    total_calls = sum(calls.values())
    creates = {a: sum(len(lat[(a, k)]) for k in ("Pod", "Deployment")) for a in arms}
    # draguard's calls from its own metrics; the null webhook answers one call per create.
    per_call = {
        a: server_cpu[a] / n * 1000
        for a, n in (("on", total_calls), ("bare", creates.get("bare", 0)))
        if a in server_cpu and n
    }
    for a, ms in per_call.items():
        name = "draguard" if a == "on" else "null webhook"
        print(f"{name} process CPU during its blocks: {server_cpu[a]:.2f} s, {ms:.3f} ms per call "
              "(TLS, HTTP, handler; /proc/<pid>/stat)")  # fmt: skip
    for a, w in conns.items():
        name = "draguard" if a == "on" else "null webhook"
        print(f"connections from the API server to {name}: {len(w.seen)} seen over the run, "
              f"at most {w.most} open at once (sampled every 50 ms)")  # fmt: skip
    met = True
    for q, target in ((50, 2.0), (99, 3.0)):
        worst_row = max(rows, key=lambda r: r[f"added_p{q}_ms"])
        worst = worst_row[f"added_p{q}_ms"]
        lo, hi = worst_row[f"added_p{q}_ci90_ms"]
        met = met and worst <= target
        verdict = "within" if worst <= target else "OVER"
        print(f"added latency at p{q}: {worst:.2f} ms ({verdict} the {target:g} ms target; "
              f"90% bootstrap interval {lo:.2f} to {hi:.2f} ms, {worst_row['kind']})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "errors": errors,
                    "webhook_requests": served,
                    "handler_mean_ms": handler_ms,
                    "handler_calls": calls,
                    "null_webhook_rows": bare_rows,
                    "cpu_ms_per_call": {a: round(v, 3) for a, v in per_call.items()},
                    "connections_seen": {a: len(w.seen) for a, w in conns.items()},
                    "connections_max_open": {a: w.most for a, w in conns.items()},
                    "rebuilds": {w: {"count": int(n), "cpu_s": round(t, 3)} for w, (t, n) in rebuild.items()},
                },
                indent=2,
            )
        )
    return 0 if met and not any(errors.values()) else 2


if __name__ == "__main__":
    sys.exit(main())
