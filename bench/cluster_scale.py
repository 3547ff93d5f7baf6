"""draguard on a large cluster: how its webhook, audit and `assess` grow with nodes, devices, claims and pods.

    python bench/cluster_scale.py [--steps 200,1000,2000] [--admit-seconds 30] [--rate 50]
                                  [--parallel 32] [--state-dir DIR] [--keep] [--json OUT] [--quick]

One kube-apiserver + etcd (`webhook/dev`, as bench/apiserver.py starts it; the controller-manager and
the scheduler are stopped once the control plane answers, so nothing but this bench writes). At each
step the cluster grows to the step's size: per node one simulated kubelet-less Node (webhook/dev/nodes.py's
object, Ready) and the ResourceSlice draguard's driver publishes for 8 H100s (driver/devices.py and
driver/slices.py over the shipped `h100-8x-nvlink` topology, each node's GPUs with their own UUIDs),
25 ResourceClaims and 50 Pods bound to the node by `spec.nodeName` (two pods share a claim), spread
over one namespace per 10 nodes. Objects are created over `--parallel` connections.

Then, per step:
- `draguard serve` starts against the API server: cache sync time (start to the first 200 from
  /readyz) and RSS (/proc/<pid>/status) when ready and after the admission load;
- admission: the bundle's webhook configurations (kustomize/overlays/local) are registered and GPU
  pods (each through a claim template) are created at a steady `--rate` per second for
  `--admit-seconds`; p50/p99 of the create as the client sees it, and the webhook's own mean handler
  time (its /metrics); the configurations are removed again before the next step grows the cluster;
- `draguard audit once --dry-run`: the full scan's wall time and peak RSS (wait4);
- `draguard assess`: wall time and peak RSS.
The API server's and etcd's RSS are recorded too. A baseline with no nodes runs first, so each
component's fixed memory is separate from what it needs per node.

Growth between steps is reported as (metric ratio) / (size ratio): at most 1 means linear or better.
Figures are extrapolated to 10,000 nodes along the line through the last two steps, and the memory to
request per component is given as base + per 1,000 nodes. A benchmark: nothing is asserted on times.
Exit status 0, 2 when objects could not be created or an admission failed, 3 when the local control
plane cannot start (no Kubernetes binaries: scripts/build-k8s.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.apiserver import Api, pct  # noqa: E402

GPUS_PER_NODE = 8
CLAIMS_PER_NODE = 25
PODS_PER_NODE = 50
NODES_PER_NAMESPACE = 10
TOPOLOGY = "h100-8x-nvlink.yaml"
CLASS = "gpu.nvidia.com-h100"
ADMIT_NS = "bench-admit"
EXTRAPOLATE_TO = 10_000
# What each step measures, with its unit and whether it is memory (for the sizing lines).
METRICS: dict[str, tuple[str, str]] = {
    "webhook_sync_s": ("webhook cache sync", "s"),
    "webhook_list_s": ("  of it, the slowest list", "s"),
    "webhook_build_cpu_s": ("  of it, rebuild CPU", "s"),
    "webhook_rss_ready_mib": ("webhook RSS when ready", "MiB"),
    "webhook_rss_loaded_mib": ("webhook RSS after load", "MiB"),
    "admit_p50_ms": ("admission p50", "ms"),
    "admit_p99_ms": ("admission p99", "ms"),
    "admit_off_p50_ms": ("p50, no webhook", "ms"),
    "admit_off_p99_ms": ("p99, no webhook", "ms"),
    "handler_mean_ms": ("webhook handler mean", "ms"),
    "audit_s": ("audit full scan", "s"),
    "audit_peak_mib": ("audit peak RSS", "MiB"),
    "assess_s": ("assess", "s"),
    "assess_peak_mib": ("assess peak RSS", "MiB"),
    "apiserver_rss_mib": ("kube-apiserver RSS", "MiB"),
    "etcd_rss_mib": ("etcd RSS", "MiB"),
}
# Memory to request per component: (component, metric).
SIZING = (
    ("webhook (per replica)", "webhook_rss_loaded_mib"),
    ("audit", "audit_peak_mib"),
    ("assess (a CLI run)", "assess_peak_mib"),
)


@dataclass(frozen=True)
class Size:
    nodes: int

    @property
    def devices(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def claims(self) -> int:
        return self.nodes * CLAIMS_PER_NODE

    @property
    def pods(self) -> int:
        return self.nodes * PODS_PER_NODE

    @property
    def namespaces(self) -> int:
        return math.ceil(self.nodes / NODES_PER_NAMESPACE)


def parse_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--steps: expected node counts separated by commas, got {text!r}") from None
    if not steps or any(s <= 0 for s in steps) or steps != sorted(set(steps)):
        raise SystemExit(f"--steps: expected increasing positive node counts, got {text!r}")
    return steps


# ---- the objects -----------------------------------------------------------------------------------


def node_name(i: int) -> str:
    return f"sim-gpu-{i:05d}"


def namespace_of(node: int) -> str:
    return f"team-{node // NODES_PER_NAMESPACE:04d}"


class SliceMaker:
    """The ResourceSlice draguard's driver publishes for one simulated 8×H100 node, made once and
    given each node its own name, pool, owner and GPU UUIDs (a real fleet has no two alike)."""

    def __init__(self) -> None:
        from driver.devices import build_devices
        from driver.nvml import open_nvml

        topo = ROOT / "driver" / "sim" / "topologies" / TOPOLOGY
        self.devices = build_devices(open_nvml(str(topo), False).enumerate())
        if len(self.devices) != GPUS_PER_NODE:
            raise SystemExit(f"{TOPOLOGY} publishes {len(self.devices)} devices, expected {GPUS_PER_NODE}")

    def slices(self, node: str, node_uid: str) -> list[dict[str, Any]]:
        from driver.slices import build_slices

        owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        out = build_slices(
            self.devices, node_name=node, driver_name="gpu.nvidia.com", generation=0, owner=owner
        )
        for s in out:
            for d in s["spec"].get("devices") or []:
                attrs = d.get("attributes") or {}
                digest = hashlib.sha256(f"{node}/{d['name']}".encode()).hexdigest()
                if "uuid" in attrs:
                    d8, rest = digest[:8], digest[8:]
                    attrs["uuid"] = {"string": f"GPU-{d8}-{rest[:4]}-{rest[4:8]}-{rest[8:12]}-{rest[12:24]}"}
                if "nvlinkDomain" in attrs:
                    attrs["nvlinkDomain"] = {
                        "string": f"nvl-{hashlib.sha256(node.encode()).hexdigest()[:12]}"
                    }
        return out


def claim(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    }


def bound_pod(ns: str, name: str, node: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "trainer"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/batch/trainer:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


def template() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-h100", "namespace": ADMIT_NS},
        "spec": {"spec": claim(ADMIT_NS, "one-h100")["spec"]},
    }


def admit_pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"admit-{i}", "namespace": ADMIT_NS},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/batch/worker:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}],
        },
    }


def namespace_objects(ns: str) -> list[tuple[str, dict[str, Any]]]:
    """The namespace and its default ServiceAccount (the controller-manager that would make it is off)."""
    return [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        (
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}},
        ),
    ]


# ---- creating many objects at once -----------------------------------------------------------------


@dataclass
class Creator:
    """Creates objects over `parallel` kept-alive TLS connections; 409 (already there) counts as done."""

    server: str
    certs: Path
    parallel: int
    errors: list[str] = field(default_factory=list)
    created: int = 0

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        ctx.load_cert_chain(str(self.certs / "admin.crt"), str(self.certs / "admin.key"))
        return ctx

    def run(self, objs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """POST each object; returns the created objects (None where it failed or existed)."""
        return asyncio.run(self._run(objs))

    async def _run(self, objs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        import aiohttp

        out: list[Any] = [None] * len(objs)
        conn = aiohttp.TCPConnector(ssl=self._ssl(), limit=self.parallel)
        timeout = aiohttp.ClientTimeout(total=60)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(objs)):
            queue.put_nowait(i)

        async def worker(session: aiohttp.ClientSession) -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                path, body = objs[i]
                for attempt in range(6):
                    try:
                        async with session.post(self.server + path, json=body) as r:
                            if r.status == 201:
                                out[i] = await r.json()
                                self.created += 1
                                break
                            text = await r.text()
                            if r.status == 409:
                                break
                            if r.status in (429, 500, 503, 504) and attempt < 5:
                                await asyncio.sleep(0.2 * 2**attempt)
                                continue
                            self.errors.append(
                                f"{body['kind']} {body['metadata']['name']}: HTTP {r.status}: {text[:200]}"
                            )
                            break
                    except (TimeoutError, aiohttp.ClientError) as exc:
                        if attempt == 5:
                            self.errors.append(f"{body['kind']} {body['metadata']['name']}: {exc!r}")
                        await asyncio.sleep(0.2 * 2**attempt)

        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            await asyncio.gather(*(worker(session) for _ in range(self.parallel)))
        return out

    def patch_status(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        asyncio.run(self._patch(items))

    async def _patch(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        import aiohttp

        conn = aiohttp.TCPConnector(ssl=self._ssl(), limit=self.parallel)
        sem = asyncio.Semaphore(self.parallel)
        headers = {"Content-Type": "application/merge-patch+json"}

        async def one(session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> None:
            async with sem, session.patch(self.server + path, data=json.dumps(body), headers=headers) as r:
                if r.status != 200:
                    self.errors.append(f"PATCH {path}: HTTP {r.status}: {(await r.text())[:200]}")

        async with aiohttp.ClientSession(connector=conn) as session:
            await asyncio.gather(*(one(session, p, b) for p, b in items))


def seeded(cluster: Any, parallel: int) -> tuple[Creator, SliceMaker]:
    """A creator for `cluster` that has made the namespace admissions go to and its claim template,
    and the maker of each node's slices: where every step of a scale bench starts from."""
    creator = Creator(cluster.server, cluster.paths.certs, parallel)
    creator.run(namespace_objects(ADMIT_NS)[:1])
    creator.run(namespace_objects(ADMIT_NS)[1:])
    creator.run([(f"/apis/resource.k8s.io/v1/namespaces/{ADMIT_NS}/resourceclaimtemplates", template())])
    return creator, SliceMaker()


def grow(
    creator: Creator, maker: SliceMaker, have: Size, want: Size, say: Any, pods: bool = True
) -> dict[str, float]:
    """Create what `want` has beyond `have`: namespaces, nodes (Ready), slices, claims, pods (unless
    not `pods`: the webhook watches none, only the API server holds them)."""
    from webhook.dev.nodes import SimNode, node_object

    took: dict[str, float] = {}
    t0 = time.monotonic()
    nss = [f"team-{i:04d}" for i in range(have.namespaces, want.namespaces)]
    creator.run([o for ns in nss for o in namespace_objects(ns)][0::2])
    creator.run([o for ns in nss for o in namespace_objects(ns)][1::2])
    nodes = [node_name(i) for i in range(have.nodes, want.nodes)]
    objs = [node_object(SimNode(n, TOPOLOGY, {"draguard.io/gpu-product": "h100"})) for n in nodes]
    made = creator.run([("/api/v1/nodes", {k: v for k, v in o.items() if k != "status"}) for o in objs])
    creator.patch_status(
        [(f"/api/v1/nodes/{o['metadata']['name']}/status", {"status": o["status"]}) for o in objs]
    )
    took["nodes_s"] = time.monotonic() - t0
    say(f"{len(nodes)} nodes in {took['nodes_s']:.1f} s")
    t0 = time.monotonic()
    slices = [
        ("/apis/resource.k8s.io/v1/resourceslices", s)
        for n, m in zip(nodes, made, strict=True)
        if m is not None
        for s in maker.slices(n, m["metadata"]["uid"])
    ]
    creator.run(slices)
    took["slices_s"] = time.monotonic() - t0
    say(f"{len(slices)} ResourceSlices in {took['slices_s']:.1f} s")
    t0 = time.monotonic()
    claims = []
    for node in range(have.nodes, want.nodes):
        ns = namespace_of(node)
        claims += [
            (f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim(ns, f"c-{node}-{j}"))
            for j in range(CLAIMS_PER_NODE)
        ]
    creator.run(claims)
    took["claims_s"] = time.monotonic() - t0
    say(f"{len(claims)} ResourceClaims in {took['claims_s']:.1f} s")
    if not pods:
        return took
    t0 = time.monotonic()
    for start in range(have.nodes, want.nodes, 100):  # in chunks: bounded memory for 100,000 pods
        pods = []
        for node in range(start, min(want.nodes, start + 100)):
            ns = namespace_of(node)
            pods += [
                (
                    f"/api/v1/namespaces/{ns}/pods",
                    bound_pod(ns, f"p-{node}-{j}", node_name(node), f"c-{node}-{j // 2}"),
                )
                for j in range(PODS_PER_NODE)
            ]
        creator.run(pods)
    took["pods_s"] = time.monotonic() - t0
    say(f"{want.pods - have.pods} Pods in {took['pods_s']:.1f} s")
    return took


# ---- measuring -------------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed_child(argv: list[str], log: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Run a command to its end: (wall seconds, peak RSS in MiB, exit status), from wait4's rusage."""
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=ROOT
        )
        _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - t0, usage.ru_maxrss / 1024, proc.returncode


def start_webhook(cluster: Any, name: str, port: int) -> tuple[int, float]:
    """`draguard serve` as the local cluster runs it; returns (pid, seconds until /readyz answers 200)."""
    c = cluster.paths.certs
    t0 = time.monotonic()
    pid = cluster.spawn(
        name,
        cluster.draguard_argv(
            "serve", "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert", str(c / "webhook.crt"), "--tls-key", str(c / "webhook.key"),
            "--policies", str(ROOT / "policies"), "--kubeconfig", str(cluster.kubeconfig),
            "--log-level", "warning",
        ),
        env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(c / "webhook-ca.crt"))
    deadline = t0 + 900
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=5) as r:
                if r.status == 200:
                    return pid, time.monotonic() - t0
        except OSError:
            pass
        if not Path(f"/proc/{pid}").exists():
            raise SystemExit(f"draguard serve exited before it was ready:\n{cluster.log_tail(name)}")
        if time.monotonic() > deadline:
            raise SystemExit(f"draguard serve was not ready within 900 s:\n{cluster.log_tail(name)}")
        time.sleep(0.05)


def webhook_metrics(cluster: Any, port: int) -> str:
    ctx = ssl.create_default_context(cafile=str(cluster.paths.certs / "webhook-ca.crt"))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def handler_sum_count(metrics: str) -> tuple[float, float]:
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith('draguard_admission_duration_seconds_sum{endpoint="validate"'):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith('draguard_admission_duration_seconds_count{endpoint="validate"'):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def list_durations(metrics: str) -> dict[str, float]:
    """Each watched resource's last full list, wall seconds, from a replica's /metrics."""
    return {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('draguard_cache_list_duration_seconds{resource="')
    }


def sync_split(metrics: str) -> tuple[str, float, float]:
    """(slowest resource, its list's wall seconds, rebuild CPU seconds so far) from a replica's
    /metrics when it turned ready: the lists run side by side, then the first rebuild."""
    lists = list_durations(metrics)
    build = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("draguard_cache_rebuild_duration_seconds_sum{")
    )
    slowest = max(lists, key=lambda k: lists[k], default="")
    return slowest, lists.get(slowest, 0.0), build


def steady_creates(cluster: Any, first: int, rate: float, seconds: float) -> tuple[list[float], list[str]]:
    """GPU pods at a steady `rate` per second over 4 connections; each create starts on its schedule
    (or as soon as a connection is free, when the API server falls behind)."""
    n = max(1, int(rate * seconds))
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    it: Iterator[int] = iter(range(n))

    def worker() -> None:
        api = Api(cluster.server, cluster.paths.certs)
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.perf_counter()
            try:
                status, body, _h = api.call(
                    "POST", f"/api/v1/namespaces/{ADMIT_NS}/pods", admit_pod(first + i)
                )
            except OSError as exc:
                status, body = 0, {"message": repr(exc)}
            sec = time.perf_counter() - t0
            with lock:
                lat.append(sec)
                if status != 201:
                    errors.append(f"admit-{first + i}: HTTP {status}: {(body or {}).get('message')}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, errors


def measure(cluster: Any, size: Size, args: argparse.Namespace, first_pod: int, say: Any) -> dict[str, Any]:
    from webhook.dev.cluster import free_port

    row: dict[str, Any] = {
        "nodes": size.nodes, "devices": size.devices, "claims": size.claims, "pods": size.pods,
        "namespaces": size.namespaces,
    }  # fmt: skip
    port = free_port()
    name = f"webhook-{size.nodes}"
    pid, row["webhook_sync_s"] = start_webhook(cluster, name, port)
    row["webhook_rss_ready_mib"] = rss_mib(pid)
    slowest, row["webhook_list_s"], row["webhook_build_cpu_s"] = sync_split(webhook_metrics(cluster, port))
    say(
        f"webhook ready in {row['webhook_sync_s']:.1f} s (slowest list {slowest} "
        f"{row['webhook_list_s']:.1f} s, rebuild CPU {row['webhook_build_cpu_s']:.1f} s), "
        f"RSS {row['webhook_rss_ready_mib']:.0f} MiB"
    )
    cluster.register_webhook(port)
    # The configurations are fresh; wait until the API server calls this webhook (a dry-run create).
    api = Api(cluster.server, cluster.paths.certs)
    before = handler_sum_count(webhook_metrics(cluster, port))[1]
    deadline = time.monotonic() + 60
    while handler_sum_count(webhook_metrics(cluster, port))[1] == before:
        api.call("POST", f"/api/v1/namespaces/{ADMIT_NS}/pods?dryRun=All", admit_pod(10**9))
        if time.monotonic() > deadline:
            raise SystemExit("the API server did not call the webhook within 60 s of its registration")
        time.sleep(0.2)
    h0 = handler_sum_count(webhook_metrics(cluster, port))
    lat, errors = steady_creates(cluster, first_pod, args.rate, args.admit_seconds)
    h1 = handler_sum_count(webhook_metrics(cluster, port))
    row["admit_n"] = len(lat)
    row["admit_errors"] = errors[:5]
    row["admit_error_count"] = len(errors)
    row["admit_p50_ms"] = pct(lat, 50) * 1000
    row["admit_p99_ms"] = pct(lat, 99) * 1000
    row["handler_mean_ms"] = (h1[0] - h0[0]) / (h1[1] - h0[1]) * 1000 if h1[1] > h0[1] else float("nan")
    row["webhook_rss_loaded_mib"] = rss_mib(pid)
    say(f"admission at {args.rate:g}/s: p50 {row['admit_p50_ms']:.1f} ms, p99 {row['admit_p99_ms']:.1f} ms, "
        f"{len(errors)} errors; RSS {row['webhook_rss_loaded_mib']:.0f} MiB")  # fmt: skip
    cluster.kubectl(
        "delete",
        "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        "draguard",
        "--ignore-not-found",
    )
    # The same load with no webhook called: the API server's own latency at this size, so what the
    # webhook adds is the difference (the machine's other load lands on both).
    deadline = time.monotonic() + 60
    while True:
        n0 = handler_sum_count(webhook_metrics(cluster, port))[1]
        api.call("POST", f"/api/v1/namespaces/{ADMIT_NS}/pods?dryRun=All", admit_pod(10**9))
        if handler_sum_count(webhook_metrics(cluster, port))[1] == n0:
            break
        if time.monotonic() > deadline:
            raise SystemExit("the API server still called the webhook 60 s after its configurations went")
        time.sleep(0.5)
    lat, errors = steady_creates(cluster, first_pod + row["admit_n"], args.rate, args.admit_seconds)
    row["admit_n"] += len(lat)
    row["admit_error_count"] += len(errors)
    row["admit_errors"] += errors[:5]
    row["admit_off_p50_ms"] = pct(lat, 50) * 1000
    row["admit_off_p99_ms"] = pct(lat, 99) * 1000
    say(f"same load, no webhook: p50 {row['admit_off_p50_ms']:.1f} ms, p99 {row['admit_off_p99_ms']:.1f} ms")
    cluster.stop(name)
    env = {"PYTHONPATH": str(ROOT)}
    logs = cluster.paths.logs
    row["audit_s"], row["audit_peak_mib"], rc = timed_child(
        cluster.draguard_argv("audit", "once", "--policies", str(ROOT / "policies"),
                              "--kubeconfig", str(cluster.kubeconfig), "--dry-run", "-o", "summary"),
        logs / f"audit-{size.nodes}.log", env,
    )  # fmt: skip
    row["audit_rc"] = rc
    say(f"audit once: {row['audit_s']:.1f} s, peak {row['audit_peak_mib']:.0f} MiB (exit {rc})")
    row["assess_s"], row["assess_peak_mib"], rc = timed_child(
        cluster.draguard_argv("assess", "--kubeconfig", str(cluster.kubeconfig),
                              "--policies", str(ROOT / "policies"), "-f", "json",
                              "-o", str(logs / f"assess-{size.nodes}.json"), "-q"),
        logs / f"assess-{size.nodes}.log", env,
    )  # fmt: skip
    row["assess_rc"] = rc
    # What assess saw is the cross-check that the cluster holds what this step built.
    try:
        seen = json.loads((logs / f"assess-{size.nodes}.json").read_text())
        drivers = {d["driver"]: d for d in seen.get("drivers") or []}
        gpu = drivers.get("gpu.nvidia.com") or {}
        row["assess_devices"] = int(gpu.get("devices") or 0)
        row["assess_driver_nodes"] = len(gpu.get("byNode") or {})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        row["assess_devices"] = row["assess_driver_nodes"] = -1
    say(f"assess: {row['assess_s']:.1f} s, peak {row['assess_peak_mib']:.0f} MiB (exit {rc})")
    pids = cluster.state.get("pids") or {}
    row["apiserver_rss_mib"] = rss_mib(int(pids["kube-apiserver"]))
    row["etcd_rss_mib"] = rss_mib(int(pids["etcd"]))
    return row


# ---- the report ------------------------------------------------------------------------------------


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pair of consecutive steps with nodes: (metric ratio) / (size ratio) for every metric.

    Memory and times carry a fixed part (an empty cluster's), so the ratio is taken over what each
    step adds to the baseline where there is one: that is what grows with the cluster."""
    base = next((r for r in rows if r["nodes"] == 0), None)
    sized = [r for r in rows if r["nodes"] > 0]
    out = []
    for a, b in itertools.pairwise(sized):
        size_ratio = b["nodes"] / a["nodes"]
        g: dict[str, Any] = {"from": a["nodes"], "to": b["nodes"], "size_ratio": size_ratio}
        for m in METRICS:
            va, vb = float(a.get(m, math.nan)), float(b.get(m, math.nan))
            b0 = float(base.get(m, 0.0)) if base and m in base else 0.0
            da, db = va - b0, vb - b0
            g[m] = (db / da) / size_ratio if da > 0 and db > 0 else math.nan
        out.append(g)
    return out


def extrapolate(rows: list[dict[str, Any]], m: str, nodes: int) -> tuple[float, float, float]:
    """(value at `nodes`, fixed part, per 1,000 nodes) along the line through the last two steps."""
    pts = [(r["nodes"], float(r[m])) for r in rows if m in r and not math.isnan(float(r[m]))]
    if len(pts) < 2:
        return math.nan, math.nan, math.nan
    (n1, v1), (n2, v2) = pts[-2], pts[-1]
    # A figure that fell between the steps (noise, a warmer cache) is carried flat, not to below zero.
    slope = max(0.0, (v2 - v1) / (n2 - n1))
    fixed = v1 - slope * n1
    return fixed + slope * nodes, fixed, slope * 1000


def report(rows: list[dict[str, Any]], gr: list[dict[str, Any]], rate: float) -> list[str]:
    lines = []
    head = (
        f"{'':<32}" + "".join(f"{r['nodes']:>10}" for r in rows) + f"{'@' + format(EXTRAPOLATE_TO, ','):>12}"
    )
    lines.append("nodes / devices / claims / pods per step (a baseline with no nodes first):")
    for what in ("nodes", "devices", "claims", "pods", "namespaces"):
        lines.append(f"  {what:<30}" + "".join(f"{r[what]:>10,}" for r in rows))
    lines.append("")
    lines.append(
        f"measured (admission: GPU pods at {rate:g}/s through the API server); last column extrapolated:"
    )
    lines.append(head)
    for m, (label, unit) in METRICS.items():
        est = extrapolate(rows, m, EXTRAPOLATE_TO)[0]
        vals = "".join(f"{float(r.get(m, math.nan)):>10.1f}" for r in rows)
        lines.append(f"  {label + ' (' + unit + ')':<30}{vals}{est:>12.1f}")
    if gr:
        lines.append("")
        lines.append(
            "growth: (metric ratio) / (size ratio) between steps, over the baseline; <= 1 is linear or better"
        )
        lines.append(f"{'':<32}" + "".join(f"{str(g['from']) + '->' + str(g['to']):>12}" for g in gr))
        for m, (label, _unit) in METRICS.items():
            lines.append(f"  {label:<30}" + "".join(f"{g[m]:>12.2f}" for g in gr))
    lines.append("")
    lines.append("memory to request (fixed + per 1,000 nodes, from the last two steps):")
    for comp, m in SIZING:
        _est, fixed, per_k = extrapolate(rows, m, EXTRAPOLATE_TO)
        lines.append(f"  {comp:<30} {fixed:>8.0f} MiB + {per_k:>7.0f} MiB per 1,000 nodes")
    return lines


def say(msg: str) -> None:
    """Progress, on stderr: the figures alone go to stdout."""
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def api_only_cluster(bench: str, state_dir: Path | None, keep: bool = False) -> Iterator[Any]:
    """A local control plane (`webhook/dev`) where nothing but the bench writes: the controller-manager
    and the scheduler are stopped once it answers (no claims from templates, no scheduling, no
    node-lifecycle taints on nodes without heartbeats). Torn down afterwards unless `keep`. Without the
    Kubernetes binaries, or when it cannot start, says so and exits with status 3 (a benchmark that
    cannot run here, see bench/run_all.py)."""
    from webhook.dev.cluster import ClusterError, LocalCluster, find_bin_dir

    def unavailable(exc: Exception) -> SystemExit:
        print(f"bench/{bench}.py: the local control plane is not available: {exc}", file=sys.stderr)
        return SystemExit(3)

    try:
        find_bin_dir()
    except ClusterError as exc:
        raise unavailable(exc) from None
    state = state_dir or Path(tempfile.mkdtemp(prefix=f"draguard-bench-{bench.replace('_', '-')}-"))
    cluster = LocalCluster(state, None, progress=say, tie_to_parent=True)
    try:
        cluster.up(nodes=(), with_driver=False, with_webhook=False)
        cluster.stop("kube-controller-manager")
        cluster.stop("kube-scheduler")
        yield cluster
    except ClusterError as exc:
        raise unavailable(exc) from None
    finally:
        if not keep:
            try:
                cluster.down(keep_logs=False)
            except ClusterError as exc:
                print(f"warning: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--steps", default="200,1000,2000", help="node counts, increasing (default 200,1000,2000)"
    )
    ap.add_argument("--rate", type=float, default=50.0, help="admission creates per second (default 50)")
    ap.add_argument(
        "--admit-seconds", type=float, default=30.0, help="length of the admission load (default 30)"
    )
    ap.add_argument(
        "--parallel", type=int, default=32, help="connections used to create objects (default 32)"
    )
    ap.add_argument("--no-baseline", action="store_true", help="skip the measurement of an empty cluster")
    ap.add_argument(
        "--quick", action="store_true", help="tiny sizes (steps 2,4; 2 s of admission): a smoke run"
    )
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--json", metavar="OUT", type=Path)
    ap.add_argument("--report", metavar="JSON", type=Path, help="print the tables of an earlier run's --json")
    args = ap.parse_args(argv)
    if args.report:
        try:
            saved = json.loads(args.report.read_text())
            rows = list(saved["rows"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"--report {args.report}: not the --json of this bench ({exc})") from None
        print("\n".join(report(rows, growth(rows), float(saved.get("rate", args.rate)))))
        return 0
    if args.quick:
        args.steps, args.admit_seconds, args.rate = "2,4", 2.0, 10.0
    steps = parse_steps(args.steps)
    if args.rate <= 0 or args.admit_seconds <= 0 or args.parallel <= 0:
        raise SystemExit("--rate, --admit-seconds and --parallel must be positive")

    rows: list[dict[str, Any]] = []
    setup: list[dict[str, Any]] = []
    failed = False
    with api_only_cluster("cluster_scale", args.state_dir, keep=args.keep) as cluster:
        creator, maker = seeded(cluster, args.parallel)
        have = Size(0)
        first_pod = 0
        plan = ([] if args.no_baseline else [0]) + steps
        for n in plan:
            want = Size(n)
            say(f"step {n} nodes: {want.devices} devices, {want.claims} claims, {want.pods} pods")
            t0 = time.monotonic()
            took = grow(creator, maker, have, want, say) if n > have.nodes else {}
            setup.append(
                {"nodes": n, "seconds": time.monotonic() - t0, **took, "errors": len(creator.errors)}
            )
            have = want
            row = measure(cluster, want, args, first_pod, say)
            first_pod += row["admit_n"]
            rows.append(row)
            failed = failed or bool(row["admit_error_count"]) or row["audit_rc"] != 0 or row["assess_rc"] != 0
            if args.json:  # written after each step: a long run that is stopped keeps what it measured
                args.json.write_text(
                    json.dumps(
                        {"rows": rows, "setup": setup, "growth": growth(rows), "rate": args.rate}, indent=2
                    )
                )
        if creator.errors:
            failed = True
            print(f"{len(creator.errors)} objects could not be created, e.g.:", file=sys.stderr)
            for e in creator.errors[:5]:
                print(f"  {e}", file=sys.stderr)
    gr = growth(rows)
    print("\n".join(report(rows, gr, args.rate)))
    for r in rows:
        for e in r["admit_errors"]:
            print(f"  admission error at {r['nodes']} nodes: {e}")
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "setup": setup, "growth": gr, "rate": args.rate}, indent=2)
        )
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
