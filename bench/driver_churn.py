"""The DRA driver under churn on a real node: NodePrepareResources / NodeUnprepareResources latency
while pods come and go in waves, per sharing mode.

    python bench/driver_churn.py [--modes full,static-mig,shares,dynamic-mig] [--pods 200]
                                 [--wave 25] [--json OUT] [--quick] [--state-dir DIR]

A local cluster (webhook/dev: control plane, one real node with kubelet 1.37, containerd, CNI, and
the draguard kubelet plugin on the host over simulated NVML; no simulated kubelet-less nodes, no
admission webhook: only the node path is measured). The node has 8 simulated H100 80GB in every mode:

- full: `h100-8x-nvlink.yaml`; each pod's claim is one whole GPU (`gpu.nvidia.com-h100`); 8 fit.
- static-mig: those GPUs in MIG mode with two `3g.40gb` instances each made beforehand (a topology
  this bench writes: the shipped ones have static MIG only on A100s); `gpu.nvidia.com-h100-mig-3g40gb`;
  16 fit.
- shares: `h100-8x-nvlink.yaml`, driver `--share-by-capacity all`; a 16Gi share of a GPU
  (`gpu.nvidia.com-h100-shared`, the gpu-sharing component's class); 4 per GPU (a GPU offers 79Gi), 32 fit.
- dynamic-mig: those GPUs in MIG mode with no instance (written by this bench), driver `--dynamic-mig`;
  a `3g.40gb` partition, its instance made at prepare and destroyed at unprepare; 16 fit.

Per mode, `--pods` pods are created and deleted in waves of at most `--wave` (capped by what fits at
once): a wave's pods are created, every one is waited for Running, then all are deleted and the bench
waits until the pods and their generated claims are gone, then the next wave starts.

Where the figures come from:
- per claim, exact: the driver's own log line for each prepare and unprepare (`prepared claim ... in
  X ms`, timed around the whole operation in driver/state.py: checkpoint, NVML, CDI spec, fsyncs).
  p50/p99 are computed from these. The kubelet's histograms cannot give them: their lowest bucket
  is 0.1 s and the driver's operations are well below it;
- as the kubelet sees it: the kubelet's own `dra_grpc_operations_duration_seconds` (per gRPC call to
  the plugin, gRPC transport included) and `dra_operations_duration_seconds` (PrepareResources /
  UnprepareResources for a whole pod), read from its /metrics through the API server's node proxy
  before and after each mode. Their count and mean (sum / count) are exact; the p99 is only the
  bucket bound it lies under. These are what the kubelet's timeout applies to.

Both are compared with the kubelet's own limits, read from the source of the kubelet built here
(k8s.io/kubernetes v1.37.2): `defaultClientCallTimeout` (pkg/kubelet/cm/dra/plugin/dra_plugin.go)
bounds each NodePrepareResources / NodeUnprepareResources call (the kubelet registers plugins with
no timeout of their own, so this one applies), and a failed pod sync is retried after the pod
worker's `backOffPeriod` (pkg/kubelet/kubelet.go).

The bench checks what it measured: every pod Running and deleted, one prepare and one unprepare
logged per claim, no failed operation, the driver's checkpoint empty at the end of each mode.
Exit status 0; 2 when a check failed (the figures are still printed); 3 when the real node cannot
start here (no Kubernetes or node binaries, no root, no images). The cluster is always torn down.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stats import pct  # noqa: E402
from webhook.dev.cluster import ClusterError, LocalCluster, find_bin_dir  # noqa: E402
from webhook.dev.kube import ApiError, Kube  # noqa: E402
from webhook.dev.procs import wait_until  # noqa: E402

SKIPPED = 3
NODE = "gpu-h100-0"
H100_TOPOLOGY = "h100-8x-nvlink.yaml"
DRIVER = "gpu.nvidia.com"

# The kubelet's limits (k8s.io/kubernetes v1.37.2, the kubelet this project builds):
# pkg/kubelet/cm/dra/plugin/dra_plugin.go `defaultClientCallTimeout = 45 * time.Second`: the gRPC
# deadline of every NodePrepareResources / NodeUnprepareResources call (the plugin manager passes
# RegisterPlugin a nil pluginClientTimeout, pkg/kubelet/pluginmanager/operationexecutor/
# operation_generator.go, so this default applies to every driver).
KUBELET_DRA_CALL_TIMEOUT_S = 45.0
# pkg/kubelet/kubelet.go `backOffPeriod = time.Second * 10`: after a failed pod sync (a prepare that
# failed or timed out), the pod worker tries again only after this back-off.
KUBELET_SYNC_BACKOFF_S = 10.0
# pkg/kubelet/metrics/metrics.go `DRADurationBuckets = metrics.ExponentialBucketsRange(.1, 40, 15)`:
# the kubelet's DRA histograms cannot resolve anything below 0.1 s.
KUBELET_DRA_BUCKET_FLOOR_S = 0.1

_PREPARED = re.compile(r"\bprepared claim (\S+)/(\S+) \((\S+)\): devices (\S+) in ([\d.]+) ms")
_UNPREPARED = re.compile(r"\bunprepared claim (\S+)/(\S+) \((\S+)\): devices (\S+) in ([\d.]+) ms")
_FAILED = re.compile(r"\b(prepare|unprepare) (\S+)/\S+ \(\S+\) failed after")

# Pods that end at once on SIGTERM, so a wave's deletion measures the node, not a grace period.
POD_COMMAND = "trap 'exit 0' TERM; sleep 3600 & wait"


@dataclass(frozen=True)
class Mode:
    name: str
    device_class: str
    capacity: int  # claims of this kind that fit on the node at once
    topology: str = H100_TOPOLOGY  # a shipped topology's name, or "static-mig"/"dynamic-mig" (written here)
    args: tuple[str, ...] = ()
    memory: str | None = None  # a share's size
    env: dict[str, str] = field(default_factory=dict)


MODES: dict[str, Mode] = {
    "full": Mode("full", "gpu.nvidia.com-h100", 8),
    "static-mig": Mode("static-mig", "gpu.nvidia.com-h100-mig-3g40gb", 16, topology="static-mig"),
    "shares": Mode(
        "shares", "gpu.nvidia.com-h100-shared", 32, args=("--share-by-capacity", "all"), memory="16Gi"
    ),
    "dynamic-mig": Mode(
        "dynamic-mig", "gpu.nvidia.com-h100-mig-3g40gb", 16, topology="dynamic-mig", args=("--dynamic-mig",)
    ),
}


def say(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- topologies ---------------------------------------------------------------------------------------
def mig_topology(dest: Path, static: bool) -> Path:
    """The 8 H100s of h100-8x-nvlink in MIG mode: with two 3g.40gb instances each (static) or none
    (dynamic: the driver makes them). The instances' figures are the simulator's own profile table."""
    from driver.sim.mig import H100_80GB

    doc = yaml.safe_load((ROOT / "driver/sim/topologies" / H100_TOPOLOGY).read_text())
    [p3g] = [p for p in H100_80GB if p.name == "3g.40gb"]
    for gpu in doc["gpus"]:
        devices = []
        if static:
            for n, start in enumerate(p3g.starts, 1):
                devices.append({
                    "profile": p3g.name, "giProfileId": p3g.id,
                    "placement": {"start": start, "size": p3g.size},
                    "gpuInstanceId": n, "computeInstanceId": 0,
                    "uuid": f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, '{}/{}'.format(gpu['uuid'], start))}",
                    "memoryMB": p3g.memory_mb, "multiprocessors": p3g.multiprocessors,
                    "copyEngines": p3g.copy_engines, "decoders": p3g.decoders, "encoders": p3g.encoders,
                    "jpegEngines": p3g.jpeg_engines, "ofaEngines": p3g.ofa_engines,
                })  # fmt: skip
        gpu["mig"] = {"enabled": True, "maxDevices": 7, "devices": devices}
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


# --- what the node publishes --------------------------------------------------------------------------
def node_devices(kube: Kube) -> list[dict[str, Any]]:
    path = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
    return [d for s in kube.get(path).get("items") or [] for d in s["spec"].get("devices") or []]


def _attr(device: dict[str, Any], name: str) -> str:
    return str((device.get("attributes") or {}).get(name, {}).get("string", ""))


def published_for(mode: Mode) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether the node's slices are those of the driver started in `mode` (a restarted driver's old
    slices stay published until it replaces them)."""

    def whole(devs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [d for d in devs if _attr(d, "type") == "gpu" and "H100" in _attr(d, "productName")]

    def migs(devs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [d for d in devs if _attr(d, "type") == "mig" and _attr(d, "profile") == "3g.40gb"]

    def unshared(devs: list[dict[str, Any]]) -> bool:
        return not any(d.get("allowMultipleAllocations") for d in devs)

    checks: dict[str, Callable[[list[dict[str, Any]]], bool]] = {
        "full": lambda devs: len(whole(devs)) == 8 and not migs(devs) and unshared(devs),
        "static-mig": lambda devs: (
            len(migs(devs)) == 16 and all("uuid" in d["attributes"] for d in migs(devs))
        ),
        "shares": lambda devs: len(whole(devs)) == 8 and all(d.get("allowMultipleAllocations") for d in devs),
        # A partition has no uuid attribute: its instance is made at prepare.
        "dynamic-mig": lambda devs: (
            len(migs(devs)) == 16 and all("uuid" not in d["attributes"] for d in migs(devs))
        ),
    }
    return checks[mode.name]


def device_classes(names: set[str]) -> list[dict[str, Any]]:
    """The bundle's DeviceClasses of these names (base classes, and the gpu-sharing component's)."""
    found = []
    for f in (
        "kustomize/base/deviceclasses/deviceclasses.yaml",
        "kustomize/components/gpu-sharing/deviceclasses.yaml",
    ):
        for doc in yaml.safe_load_all((ROOT / f).read_text()):
            if doc and doc.get("kind") == "DeviceClass" and doc["metadata"]["name"] in names:
                found.append(doc)
    missing = names - {d["metadata"]["name"] for d in found}
    if missing:
        raise SystemExit(f"bench/driver_churn.py: the bundle has no DeviceClass {', '.join(sorted(missing))}")
    return found


# --- the kubelet's metrics ----------------------------------------------------------------------------
Histograms = dict[tuple[str, str], dict[str, float]]  # (metric, operation) -> {le: cumulative, sum, count}


def kubelet_histograms(kube: Kube) -> Histograms:
    """The kubelet's DRA histograms (successful operations only), from its /metrics via the API server."""
    from prometheus_client.parser import text_string_to_metric_families

    text = kube.get(f"/api/v1/nodes/{NODE}/proxy/metrics")
    out: Histograms = {}
    for fam in text_string_to_metric_families(str(text)):
        if fam.name not in ("dra_grpc_operations_duration_seconds", "dra_operations_duration_seconds"):
            continue
        for s in fam.samples:
            labels = s.labels
            if fam.name.startswith("dra_grpc"):
                if labels.get("driver_name") != DRIVER or labels.get("grpc_status_code") != "OK":
                    continue
                op = labels.get("method_name", "").rsplit("/", 1)[-1]
            else:
                if labels.get("is_error") != "false":
                    continue
                op = labels.get("operation_name", "")
            h = out.setdefault((fam.name, op), {})
            if s.name.endswith("_bucket"):
                h[labels["le"]] = h.get(labels["le"], 0.0) + s.value
            elif s.name.endswith("_sum"):
                h["sum"] = s.value
            elif s.name.endswith("_count"):
                h["count"] = s.value
    return out


def histogram_delta(before: Histograms, after: Histograms, key: tuple[str, str]) -> dict[str, Any]:
    """Count, mean and the bucket bounds of p50/p99 and of the slowest, for what happened in between."""
    a, b = after.get(key, {}), before.get(key, {})
    count = int(a.get("count", 0) - b.get("count", 0))
    if count <= 0:
        return {"count": 0}
    total = a.get("sum", 0.0) - b.get("sum", 0.0)
    bounds = sorted((float(le), a[le] - b.get(le, 0.0)) for le in a if le not in ("sum", "count"))

    def bound(q: float) -> float:
        for le, cum in bounds:
            if cum >= q * count:
                return le
        return math.inf

    return {"count": count, "mean_s": total / count, "p50_le_s": bound(0.5), "p99_le_s": bound(0.99),
            "max_le_s": bound(1.0)}  # fmt: skip


# --- one mode -----------------------------------------------------------------------------------------
def pod(ns: str, name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "driver-churn"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "command": ["sh", "-c", POD_COMMAND],
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
        },
    }  # fmt: skip


def claim_template(ns: str, mode: Mode) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": mode.device_class}
    if mode.memory:
        exactly["capacity"] = {"requests": {"memory": mode.memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def checkpoint_claims(cluster: LocalCluster) -> dict[str, Any]:
    try:
        doc = json.loads((cluster.real_node_driver_dirs().plugins / "checkpoint.json").read_text())
    except FileNotFoundError:
        return {}
    return dict((doc.get("v2") or {}).get("preparedClaims") or {})


def driver_ops(cluster: LocalCluster, ns: str) -> tuple[list[float], list[float], list[str]]:
    """The driver's prepare and unprepare times (ms) for claims of `ns`, and its failed operations."""
    log = cluster.current_log(f"driver-{NODE}")
    prep = [float(m[4]) for m in _PREPARED.findall(log) if m[0] == ns]
    unprep = [float(m[4]) for m in _UNPREPARED.findall(log) if m[0] == ns]
    failed = [ln.strip() for ln in log.splitlines() if (m := _FAILED.search(ln)) and m[2] == ns]
    return prep, unprep, failed


def run_mode(cluster: LocalCluster, mode: Mode, topologies: Path, pods: int, wave_max: int,
             image: str) -> dict[str, Any]:  # fmt: skip
    kube = cluster.kube()
    topology = mode.topology
    env = dict(mode.env)
    if topology in ("static-mig", "dynamic-mig"):
        topology = str(mig_topology(topologies / f"h100-8x-{topology}.yaml", static=topology == "static-mig"))
    if mode.name == "dynamic-mig":
        from driver.sim import MIG_STATE_ENV  # the instances the simulated GPUs hold, across restarts

        state = topologies / "dynamic-mig-state.json"
        state.unlink(missing_ok=True)
        env[MIG_STATE_ENV] = str(state)
    cluster.stop(f"driver-{NODE}")
    t0 = time.monotonic()
    cluster.start_real_node_driver(topology=topology, args=mode.args, env=env)
    wait_until(lambda: published_for(mode)(node_devices(kube)), 90, f"the node's slices in mode {mode.name}")
    say(f"{mode.name}: driver up in its mode ({time.monotonic() - t0:.1f}s)")

    ns = f"churn-{mode.name}-{uuid.uuid4().hex[:5]}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.wait_default_sa(ns)
    kube.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", claim_template(ns, mode))
    wave = max(1, min(wave_max, mode.capacity, pods))
    before = kubelet_histograms(kube)
    ran = deleted = 0
    wave_s: list[float] = []
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    t_mode = time.monotonic()
    for first in range(0, pods, wave):
        names = [f"p{i:04d}" for i in range(first, min(pods, first + wave))]
        t_wave = time.monotonic()
        for name in names:
            kube.create(pods_path, pod(ns, name, image))

        def running(names: list[str] = names, t_wave: float = t_wave) -> bool:
            items = kube.get(pods_path).get("items") or []
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in items}
            bad = [n for n, ph in phases.items() if ph in ("Failed", "Succeeded")]
            if bad:
                raise RuntimeError(f"{mode.name}: pods {', '.join(bad)} ended instead of running")
            # The previous wave's claims are gone before this one starts, so a pod the scheduler still
            # cannot place after a minute never will be: say why instead of waiting out the timeout.
            if time.monotonic() - t_wave > 60:
                for p in items:
                    for c in p.get("status", {}).get("conditions") or []:
                        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                            raise RuntimeError(
                                f"{mode.name}: pod {p['metadata']['name']} unschedulable: {c.get('message')}"
                            )
            return all(phases.get(n) == "Running" for n in names)

        wait_until(running, 300, f"{mode.name}: wave of {len(names)} pods Running")
        ran += len(names)
        for name in names:
            kube.delete(f"{pods_path}/{name}")
        wait_until(lambda: not kube.get(pods_path).get("items") and not kube.get(claims_path).get("items"),
                   300, f"{mode.name}: the wave's pods and claims gone")  # fmt: skip
        deleted += len(names)
        wave_s.append(time.monotonic() - t_wave)
        say(f"{mode.name}: {deleted}/{pods} pods ran and were deleted (wave {wave_s[-1]:.1f}s)")
    took = time.monotonic() - t_mode
    # The kubelet unprepares once a pod's containers are gone; its last log lines may trail the API.
    wait_until(lambda: len(driver_ops(cluster, ns)[1]) >= ran, 60, f"{mode.name}: every claim unprepared")
    wait_until(lambda: not checkpoint_claims(cluster), 60, f"{mode.name}: the driver's checkpoint empty")
    after = kubelet_histograms(kube)
    prep, unprep, failed = driver_ops(cluster, ns)
    kube.delete(f"/api/v1/namespaces/{ns}")
    kubelet = {
        f"{src}_{op}": histogram_delta(before, after, (metric, key))
        for src, metric in (("grpc", "dra_grpc_operations_duration_seconds"),
                            ("pod", "dra_operations_duration_seconds"))
        for op, key in (("prepare", "NodePrepareResources" if src == "grpc" else "PrepareResources"),
                        ("unprepare", "NodeUnprepareResources" if src == "grpc" else "UnprepareResources"))
    }  # fmt: skip
    return {
        "mode": mode.name,
        "topology": Path(topology).name,
        "device_class": mode.device_class,
        "memory": mode.memory,
        "pods": pods,
        "wave": wave,
        "waves": len(wave_s),
        "ran": ran,
        "deleted": deleted,
        "seconds": took,
        # The machine's 1-minute load at the mode's end: on a shared machine it explains a slow run.
        "load_1m": os.getloadavg()[0],
        "wave_p50_s": pct(wave_s, 50),
        "prepare_ms": summary(prep),
        "unprepare_ms": summary(unprep),
        "failed": failed,
        "kubelet": kubelet,
    }


def summary(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50": pct(ms, 50), "p99": pct(ms, 99), "max": max(ms), "mean": sum(ms) / len(ms)}


def problems(row: dict[str, Any]) -> list[str]:
    """What the mode's run failed to do: every pod run and deleted, one prepare and one unprepare per
    claim, none failed, the kubelet's metrics showing the same calls."""
    out = []
    name, pods = row["mode"], row["pods"]
    if row["ran"] != pods or row["deleted"] != pods:
        out.append(f"{name}: {row['ran']} of {pods} pods ran, {row['deleted']} deleted")
    for op in ("prepare", "unprepare"):
        if row[f"{op}_ms"]["n"] != pods:
            out.append(f"{name}: the driver logged {row[f'{op}_ms']['n']} {op}s for {pods} claims")
        if row["kubelet"][f"grpc_{op}"].get("count", 0) < 1:
            out.append(f"{name}: the kubelet's metrics show no successful {op} call")
    out += [f"{name}: {ln}" for ln in row["failed"]]
    return out


# --- output -------------------------------------------------------------------------------------------
def _le(v: float | None) -> str:
    return "—" if v is None else f"≤{v:.2f}"


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "driver latency per claim (the driver's log), ms; as the kubelet saw the gRPC calls (its metrics), s",
        f"{'mode':<12} {'pods':>5} {'wave':>4} {'prepare p50':>11} {'p99':>7} {'unprep p50':>10} {'p99':>7}"
        f"  {'kubelet prep mean':>17} {'p99':>6} {'unprep mean':>11} {'p99':>6}  {'wall':>6} {'load':>5}",
    ]
    for r in rows:
        p, u = r["prepare_ms"], r["unprepare_ms"]
        gp, gu = r["kubelet"]["grpc_prepare"], r["kubelet"]["grpc_unprepare"]
        lines.append(
            f"{r['mode']:<12} {r['ran']:>5} {r['wave']:>4} {p.get('p50', 0):>11.1f} {p.get('p99', 0):>7.1f}"
            f" {u.get('p50', 0):>10.1f} {u.get('p99', 0):>7.1f}"
            f"  {gp.get('mean_s', 0):>17.3f} {_le(gp.get('p99_le_s')):>6} {gu.get('mean_s', 0):>11.3f}"
            f" {_le(gu.get('p99_le_s')):>6}  {r['seconds']:>5.0f}s {r.get('load_1m', 0):>5.1f}"
        )
    worst = max((r["prepare_ms"].get("max", 0) for r in rows), default=0) / 1000
    worst_u = max((r["unprepare_ms"].get("max", 0) for r in rows), default=0) / 1000
    lines += [
        f"kubelet limits (v1.37.2 source): defaultClientCallTimeout {KUBELET_DRA_CALL_TIMEOUT_S:.0f} s"
        " per NodePrepareResources/NodeUnprepareResources call; backOffPeriod"
        f" {KUBELET_SYNC_BACKOFF_S:.0f} s before a failed pod sync is retried",
        f"slowest prepare {worst * 1000:.1f} ms = {100 * worst / KUBELET_DRA_CALL_TIMEOUT_S:.3f} % of the"
        f" call timeout; slowest unprepare {worst_u * 1000:.1f} ms ="
        f" {100 * worst_u / KUBELET_DRA_CALL_TIMEOUT_S:.3f} %",
        f"(the kubelet's DRA histograms start at {KUBELET_DRA_BUCKET_FLOOR_S} s: '≤0.10' means under its "
        "first bucket)",
    ]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------------
def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def start(cluster: LocalCluster) -> str:
    """The cluster with its real node on 8 H100s; returns the workload image. ClusterError if it
    cannot start here."""
    from webhook.dev.node import RealNode, real_node_prerequisites

    images = real_node_prerequisites(say)
    cluster.up(
        nodes=(),
        real_node=RealNode(NODE, H100_TOPOLOGY, {"draguard.io/gpu-product": "h100"}),
        images=images.archives,
        sandbox_image=images.sandbox,
        workload_image=images.workload,
        with_webhook=False,
    )
    return images.workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--pods", type=int, default=200, help="pods created and deleted per mode (default 200)")
    ap.add_argument(
        "--wave", type=int, default=25, help="most pods per wave (default 25; capped by the mode)"
    )
    ap.add_argument("--quick", action="store_true", help="mode full only, 16 pods in waves of 8: a smoke run")
    ap.add_argument("--json", metavar="OUT", type=Path)
    ap.add_argument("--state-dir", type=Path, default=None, help="the cluster's state (default: a temp dir)")
    ap.add_argument("--report", metavar="JSON", type=Path, help="print the table of an earlier run's --json")
    args = ap.parse_args(argv)
    if args.report:
        try:
            print(report(list(json.loads(args.report.read_text())["modes"])))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"--report {args.report}: not the --json of this bench ({exc})") from None
        return 0
    if args.quick:
        args.modes, args.pods, args.wave = "full", 16, 8
    names = [m for m in args.modes.split(",") if m]
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        raise SystemExit(f"--modes: unknown {', '.join(unknown) or '(none given)'}; have {', '.join(MODES)}")
    if args.pods < 1 or args.wave < 1:
        raise SystemExit("--pods and --wave must be positive")
    try:
        find_bin_dir()
    except ClusterError as exc:
        print(f"bench/driver_churn.py: the Kubernetes binaries are missing: {exc}", file=sys.stderr)
        return SKIPPED
    if os.geteuid() != 0:
        print("bench/driver_churn.py: the real node needs root", file=sys.stderr)
        return SKIPPED
    # Short: the kubelet's and the plugin's unix sockets live under the state directory.
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="dg-churn-"))
    cluster = LocalCluster(state, None, progress=say, tie_to_parent=True)
    signal.signal(signal.SIGTERM, _terminate)
    rows: list[dict[str, Any]] = []
    node: dict[str, Any] = {"name": NODE, "gpus": 8, "host_cpus": os.cpu_count()}
    error = ""
    try:
        try:
            image = start(cluster)
        except ClusterError as exc:
            print(f"bench/driver_churn.py: the real node cannot start here: {exc}", file=sys.stderr)
            return SKIPPED
        kube = cluster.kube()
        info = kube.get(f"/api/v1/nodes/{NODE}")["status"]["nodeInfo"]
        node.update(kubelet=info["kubeletVersion"], runtime=info["containerRuntimeVersion"])
        if cluster.net is not None:  # what tear-down must remove: a check can look for it afterwards
            node["netns"] = cluster.net.netns
        for cls in device_classes({MODES[n].device_class for n in names}):
            kube.create("/apis/resource.k8s.io/v1/deviceclasses", cls)
        for n in names:
            rows.append(run_mode(cluster, MODES[n], state, args.pods, args.wave, image))
            if args.json:  # after each mode: a stopped run keeps what it measured
                args.json.write_text(json.dumps(result(node, rows, []), indent=2))
    except ClusterError as exc:
        error = f"cluster: {exc}"
    except (TimeoutError, RuntimeError, ApiError) as exc:
        error = str(exc)
    except KeyboardInterrupt as exc:
        error = f"interrupted ({exc})"
    finally:
        try:
            cluster.down(keep_logs=True)
        except ClusterError as exc:
            print(f"warning: tear-down: {exc}", file=sys.stderr)
    found = [p for r in rows for p in problems(r)] + ([error] if error else [])
    if rows:
        print(report(rows))
    for p in found:
        print(f"NOT MET: {p}")
    if args.json:
        args.json.write_text(json.dumps(result(node, rows, found), indent=2))
    if found:
        print(f"logs: {cluster.paths.logs}", file=sys.stderr)
    elif args.state_dir is None:  # a clean run's temporary state (certificates, logs) is not kept
        shutil.rmtree(state, ignore_errors=True)
    return 2 if found else 0


def result(node: dict[str, Any], rows: list[dict[str, Any]], found: list[str]) -> dict[str, Any]:
    return {
        "node": node,
        "kubelet_limits_s": {
            "defaultClientCallTimeout": KUBELET_DRA_CALL_TIMEOUT_S,
            "backOffPeriod": KUBELET_SYNC_BACKOFF_S,
        },
        "modes": rows,
        "problems": found,
    }


if __name__ == "__main__":
    sys.exit(main())
