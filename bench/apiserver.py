"""Create latency through a real kube-apiserver, with draguard's webhooks registered vs without.

    python bench/apiserver.py [--pods 2000] [--deployments 500] [--blocks 4] [--replicas 1]
                              [--interleave] [--baseline DIR] [--probe FILE]
                              [--state-dir DIR] [--keep] [--json OUT]

--interleave registers every arm at once, each for its own namespace, and alternates single creates
between them, so load that moves within a minute lands on every arm alike (blocks otherwise).
--baseline DIR adds an arm served from another tree. --probe FILE runs the servers under
bench/serve_probe.py and prints, per step of a request, the median wall time and thread CPU.

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
import itertools
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

from bench.stats import pct  # noqa: E402  (re-exported: the cluster and peer benches import it from here)

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


def draguard_arm(answer: str | None, arm: str) -> str | None:
    """The probe's answer as an arm: both draguard trees answer as "on"."""
    return "base" if arm == "base" and answer == "on" else answer


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


def draguard_requests(port: int, cafile: Path) -> float:
    """The admission requests a draguard server has answered (its /metrics)."""
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cafile))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("draguard_admission_requests_total{")
    )


def set_webhooks(cluster: Any, api: Api, ports: dict[str, int], arm: str, probe_ns: str) -> None:
    if arm == "base":
        # Both draguard trees answer the probe alike: the switch shows in the baseline's own count.
        cluster.register_webhook(ports[arm])
        cafile = cluster.paths.certs / "webhook-ca.crt"
        deadline = time.monotonic() + 30
        while True:
            before = draguard_requests(ports[arm], cafile)
            webhook_answering(api, probe_ns)
            if draguard_requests(ports[arm], cafile) > before:
                return
            if time.monotonic() > deadline:
                raise SystemExit("the API server did not switch to the baseline webhook within 30 s")
            time.sleep(0.2)
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
    while draguard_arm(webhook_answering(api, probe_ns), arm) != arm:
        if time.monotonic() > deadline:
            raise SystemExit(f"the API server did not switch to webhooks '{arm}' within 30 s")
        time.sleep(0.2)


ARM_LABEL = "bench.draguard.io/arm"


def register_per_namespace(cluster: Any, api: Api, ports: dict[str, int], namespaces: dict[str, str]) -> None:
    """Every webhook arm registered at once, each configuration narrowed to its arm's namespace
    (label ARM_LABEL), so creates can alternate between the arms one by one; waits until a dry-run
    probe in each namespace is answered by that arm's server alone."""
    from webhook.dev.addons import FIELD_MANAGER, webhook_objects

    kinds = "mutatingwebhookconfiguration,validatingwebhookconfiguration"
    cluster.kubectl("delete", kinds, "draguard", "--ignore-not-found")
    for arm, port in ports.items():
        objs, _source = webhook_objects(cluster, port)
        hooks = [o for o in objs if str(o.get("kind", "")).endswith("WebhookConfiguration")]
        for obj in hooks:
            obj["metadata"]["name"] = f"bench-{arm}"
            for h in obj.get("webhooks") or []:
                sel = h.setdefault("namespaceSelector", {})
                exprs = [e for e in sel.get("matchExpressions") or [] if e.get("key") != ARM_LABEL]
                sel["matchExpressions"] = [*exprs, {"key": ARM_LABEL, "operator": "In", "values": [arm]}]
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks})
        manager = f"--field-manager={FIELD_MANAGER}"
        cluster.kubectl("apply", "--server-side", "--force-conflicts", manager, "-f", "-", input=doc)
    cafile = cluster.paths.certs / "webhook-ca.crt"
    for arm, ns in namespaces.items():
        deadline = time.monotonic() + 30
        while True:
            before = draguard_requests(ports[arm], cafile) if arm in ("on", "base") else 0.0
            answer = draguard_arm(webhook_answering(api, ns), arm)
            if answer == arm and (
                arm not in ("on", "base") or draguard_requests(ports[arm], cafile) > before
            ):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"namespace {ns} is not answered by webhook arm '{arm}' within 30 s")
            time.sleep(0.2)


def arm_objects(
    ns: str, first_pod: int, n_p: int, first_dep: int, n_d: int, replicas: int
) -> list[tuple[str, dict[str, Any]]]:
    """Pods and Deployments for one arm, the kinds interleaved (one Deployment every pods/deployments
    pods) so both see the same background."""
    objs: list[tuple[str, dict[str, Any]]] = []
    every = max(1, n_p // max(n_d, 1))
    d = 0
    for i in range(n_p):
        objs.append((f"/api/v1/namespaces/{ns}/pods", pod(ns, first_pod + i)))
        if i % every == every - 1 and d < n_d:
            objs.append(
                (f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns, first_dep + d, replicas))
            )
            d += 1
    for j in range(d, n_d):
        objs.append((f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns, first_dep + j, replicas)))
    return objs


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


STAMPS = ("rd", "h0", "p0", "p1", "s0", "s1", "v0", "v1", "l0", "l1", "r0", "r1", "a0", "a1", "h1", "w0")
STAMPS += ("w1",)


def probe_report(path: Path) -> dict[str, Any]:
    """Where each request's time goes, from the server's own time stamps (bench/serve_probe.py).

    One request at a time: a request runs from the last TLS read before its handler started (the
    record with its headers) to the next request's. Between each two consecutive stamps, the median
    wall time and thread CPU over the requests where that step occurs, in the order they occur."""
    events: list[list[Any]] = []
    for line in path.read_text().splitlines():
        events.extend(json.loads(line))
    events.sort(key=lambda e: e[1])
    reqs: list[list[list[Any]]] = []
    last_rd: list[Any] | None = None
    cur: list[list[Any]] | None = None
    late_body = 0
    for e in events:
        if e[0] == "h0":
            if cur is not None:
                reqs.append(cur)
            cur = [last_rd, e] if last_rd is not None else [e]
            late_body += not e[3]
            continue
        if e[0] == "rd":
            last_rd = e
        if cur is not None and e[0] in STAMPS and not (e[0] == "rd" and "p0" in [x[0] for x in cur]):
            cur.append(e)
    steps: dict[tuple[str, str], list[tuple[float, float]]] = {}
    order: dict[tuple[str, str], float] = {}
    own: list[tuple[float, float]] = []
    for r in reqs:
        for i, (a, b) in enumerate(itertools.pairwise(r)):
            key = (a[0], b[0])
            steps.setdefault(key, []).append(((b[1] - a[1]) / 1e6, (b[2] - a[2]) / 1e6))
            order[key] = order.get(key, 0.0) + i
        got = {e[0]: e for e in r}
        if "p0" in got and "w0" in got:
            own.append(((got["w0"][1] - got["p0"][1]) / 1e6, (got["w0"][2] - got["p0"][2]) / 1e6))
    out: dict[str, Any] = {
        "requests": len(reqs),
        "body_after_handler_start": round(late_body / max(len(reqs), 1), 3),
    }
    common = [k for k, v in steps.items() if len(v) >= len(reqs) // 10]
    common.sort(key=lambda k: order[k] / len(steps[k]))
    out["steps"] = [
        {
            "step": f"{a}->{b}",
            "n": len(steps[(a, b)]),
            "wall_ms_p50": round(statistics.median(x[0] for x in steps[(a, b)]), 4),
            "cpu_ms_p50": round(statistics.median(x[1] for x in steps[(a, b)]), 4),
        }
        for a, b in common
    ]
    if own:
        out["body_to_write_ms_p50"] = {
            "wall": round(statistics.median(x[0] for x in own), 4),
            "cpu": round(statistics.median(x[1] for x in own), 4),
        }
    return out


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
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="register every arm at once, each for its own namespace, and alternate single creates "
        "between the arms (the order turning each round) instead of blocks",
    )
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="a fourth arm: `draguard serve` from another tree (e.g. `git archive <commit> | tar -x -C "
        "DIR`), registered in its turn like the others",
    )
    ap.add_argument(
        "--probe",
        metavar="FILE",
        help="run draguard serve under bench/serve_probe.py (time stamps per phase, written to FILE) "
        "and print where each request's time goes",
    )
    args = ap.parse_args()

    from webhook.dev import addons
    from webhook.dev.cluster import ClusterError, LocalCluster

    if args.probe:
        probe_file = Path(args.probe).resolve()
        probe_file.unlink(missing_ok=True)
        os.environ["DRAGUARD_PROBE_OUT"] = str(probe_file)
        plain_argv = addons.draguard_argv

        def probed_argv(*a: str) -> list[str]:
            if a[:1] != ("serve",):
                return plain_argv(*a)
            return [sys.executable, str(ROOT / "bench" / "serve_probe.py"), *a]

        addons.draguard_argv = probed_argv

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
        if args.baseline:
            from webhook.dev.cluster import free_port

            base_root = Path(args.baseline).resolve()
            c = cluster.paths.certs
            arms = (*arms, "base")
            ports["base"] = free_port()
            env = {"PYTHONPATH": str(base_root)}
            argv = [sys.executable, "-m", "webhook.cli"]
            if args.probe:
                env["DRAGUARD_PROBE_OUT"] = str(probe_file) + ".base"
                argv = [sys.executable, str(ROOT / "bench" / "serve_probe.py")]
            pids["base"] = cluster.spawn(
                "webhook-base",
                [*argv, "serve", "--host", "127.0.0.1", "--port", str(ports["base"]),
                 "--tls-cert", str(c / "webhook.crt"), "--tls-key", str(c / "webhook.key"),
                 "--policies", str(cluster.state["policies"]), "--kubeconfig", str(cluster.kubeconfig)],
                env=env,
            )  # fmt: skip
            ready_ctx = ssl.create_default_context(cafile=str(c / "webhook-ca.crt"))
            deadline = time.monotonic() + 120
            while True:
                try:
                    import urllib.request

                    url = f"https://127.0.0.1:{ports['base']}/readyz"
                    with urllib.request.urlopen(url, context=ready_ctx, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("the baseline webhook did not start within 120 s") from None
                    time.sleep(0.5)
        namespaces = {a: f"bench-{a}" for a in arms}
        for arm, ns in namespaces.items():
            api.call(
                "POST",
                "/api/v1/namespaces",
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": {ARM_LABEL: arm}},
                },
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
        if args.interleave:
            register_per_namespace(cluster, api, ports, namespaces)
            streams = {
                a: arm_objects(namespaces[a], 0, args.pods, 0, args.deployments, args.replicas) for a in arms
            }
            cpu_start = {a: proc_cpu_s(pids[a]) for a in pids}
            for i in range(max(len(v) for v in streams.values())):
                # One create per arm in turn, the order turning each round.
                k = i % len(arms)
                for arm in arms[k:] + arms[:k]:
                    if i >= len(streams[arm]):
                        continue
                    lp, errs = create_all(api, [streams[arm][i]])
                    errors[arm] += errs
                    lat[(arm, streams[arm][i][1]["kind"])].append(lp[0])
            for a in pids:
                server_cpu[a] = proc_cpu_s(pids[a]) - cpu_start[a]
        for b in range(0 if args.interleave else args.blocks):
            # The order of the arms turns each block, so none always follows another.
            for arm in arms[b % len(arms) :] + arms[: b % len(arms)]:
                set_webhooks(cluster, api, ports, arm, namespaces[arm])
                ns = namespaces[arm]
                n_p = min(pods_per, args.pods - next_pod[arm])
                n_d = min(deps_per, args.deployments - next_dep[arm])
                objs = arm_objects(ns, next_pod[arm], n_p, next_dep[arm], n_d, args.replicas)
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
        base_calls = 0.0
        if "base" in ports:
            base_calls = draguard_requests(ports["base"], cluster.paths.certs / "webhook-ca.crt")
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
    base_rows = [added_row(lat, "base", kind) for kind in ("Pod", "Deployment")] if "base" in arms else []
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
    how = "one create per arm in turn" if args.interleave else f"{args.blocks} alternating blocks"
    print(f"Creates through kube-apiserver, one client, sequential; {how}; "
          f"every object requests a GPU through a claim template")  # fmt: skip
    print(
        f"{'kind':<11} {'n/arm':>6} {'off p50':>8} {'off p99':>8} {'on p50':>8} {'on p99':>8} "
        f"{'+p50':>7} {'+p99':>7}  90% interval +p50 / +p99 (bootstrap)"
    )
    for label, table in (("draguard", rows), ("null webhook", bare_rows), ("baseline tree", base_rows)):
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
        for a, n in (("on", total_calls), ("bare", creates.get("bare", 0)), ("base", base_calls))
        if a in server_cpu and n
    }
    names = {"on": "draguard", "bare": "null webhook", "base": "baseline tree"}
    for a, ms in per_call.items():
        name = names[a]
        print(f"{name} process CPU during its blocks: {server_cpu[a]:.2f} s, {ms:.3f} ms per call "
              "(TLS, HTTP, handler; /proc/<pid>/stat)")  # fmt: skip
    if bare_rows:
        # draguard's own share: what it adds beyond a webhook that only parses and allows.
        for label, table in (("draguard", rows), ("baseline tree", base_rows)):
            for r, b in zip(table, bare_rows, strict=False):  # no baseline rows without --baseline
                print(f"{label} minus the null webhook, {r['kind']}: "
                      f"p50 {r['on_p50_ms'] - b['on_p50_ms']:+.2f} ms, "
                      f"p99 {r['on_p99_ms'] - b['on_p99_ms']:+.2f} ms")  # fmt: skip
    for a, w in conns.items():
        name = names[a]
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
                    "baseline_rows": base_rows,
                    "cpu_ms_per_call": {a: round(v, 3) for a, v in per_call.items()},
                    "connections_seen": {a: len(w.seen) for a, w in conns.items()},
                    "connections_max_open": {a: w.most for a, w in conns.items()},
                    "rebuilds": {w: {"count": int(n), "cpu_s": round(t, 3)} for w, (t, n) in rebuild.items()},
                },
                indent=2,
            )
        )
    for suffix, who in (("", "draguard"), (".base", "baseline tree")):
        if args.probe and Path(args.probe + suffix).exists():
            print_probe(args, Path(args.probe + suffix), who, suffix)
    return 0 if met and not any(errors.values()) else 2


def print_probe(args: Any, path: Path, who: str, suffix: str) -> None:
    probe = probe_report(path)
    print(f"{who}'s own time stamps over {probe['requests']} requests (bench/serve_probe.py; "
          f"body after the handler started: {probe['body_after_handler_start']:.0%}):")  # fmt: skip
    for st in probe["steps"]:
        print(f"  {st['step']:<8} n {st['n']:>6}  wall p50 {st['wall_ms_p50']:.3f} ms  "
              f"CPU p50 {st['cpu_ms_p50']:.3f} ms")  # fmt: skip
    if "body_to_write_ms_p50" in probe:
        own = probe["body_to_write_ms_p50"]
        print(f"  body read to answer written (p0->w0): wall p50 {own['wall']:.3f} ms, "
              f"CPU p50 {own['cpu']:.3f} ms")  # fmt: skip
    if args.json:
        doc = json.loads(Path(args.json).read_text())
        doc["probe" + suffix] = probe
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    sys.exit(main())
