"""`draguard assess` at scale: time and peak RSS against a plain paginated list of the same pods.

    python bench/assess.py [--pods 10000[,100000]] [--gpu-share 0.1] [--state-dir DIR] [--keep]

Starts the local control plane (`webhook/dev`, no drivers, no webhook) and creates the pods
directly, bound to the simulated nodes (no scheduler work, no kubelet), a share of them holding
`nvidia.com/gpu` under 20 Deployments (owned pods, so owner resolution runs as in a real cluster).
Then, each in a fresh process:

- baseline: list every pod with `limit=500` + `continue`, parse each page, keep nothing;
- all-at-once: one unpaginated list kept in memory (what `kubectl get pods -A -o json | ...` does);
- assess: `draguard assess --format json` over the whole cluster.

Prints seconds and peak RSS (MiB) per arm and pod count, and assess's ratio to the baseline.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.apiserver import Api  # noqa: E402  (the repository root goes on the path first)

NS = "bench-assess"
DEPLOYMENTS = 20


def pod(i: int, node: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "main",
        "image": "registry.example/app:1",
        "command": ["sleep", "inf"],
        "resources": {"requests": {"cpu": "10m"}},
    }
    meta: dict[str, Any] = {"name": f"p-{i}", "namespace": NS, "labels": {"app": f"a{i % 50}"}}
    if owner is not None:
        c["resources"] = {"limits": {"nvidia.com/gpu": 1 + i % 2}}
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [c], "terminationGracePeriodSeconds": 0},
    }


def populate(cluster: Any, start: int, stop: int, gpu_share: float, owners: list[dict[str, Any]]) -> float:
    nodes = [n["name"] for n in cluster.state.get("nodes") or []]
    every = max(1, round(1 / gpu_share)) if gpu_share > 0 else 0
    t0 = time.monotonic()
    errors: list[str] = []
    lock = threading.Lock()

    def work(offset: int) -> None:
        api = Api(cluster.server, cluster.paths.certs, timeout=60)
        for i in range(start + offset, stop, 4):
            owner = owners[i % len(owners)] if every and i % every == 0 else None
            status, body, _ = api.call(
                "POST", f"/api/v1/namespaces/{NS}/pods", pod(i, nodes[i % len(nodes)], owner)
            )
            if status not in (201, 409):
                with lock:
                    errors.append(f"{status}: {str(body)[:200]}")
                    if len(errors) > 5:
                        return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("cannot create pods: " + "; ".join(errors[:3]))
    return time.monotonic() - t0


def child(arm: str, kubeconfig: str) -> None:
    """One arm, in its own process; prints its seconds (RSS is read by the parent)."""
    from webhook.server.caches import KubeHttp

    t0 = time.monotonic()
    if arm == "assess":
        from webhook.cli import main

        devnull = open("/dev/null", "w")  # noqa: SIM115 - the process ends right after
        sys.stdout = devnull
        rc = main(
            [
                "assess",
                "--kubeconfig",
                kubeconfig,
                "--format",
                "json",
                "--quiet",
                "--policies",
                str(ROOT / "policies"),
            ]
        )
        sys.stdout = sys.__stdout__
        if rc != 0:
            raise SystemExit(f"assess exited {rc}")
        n = -1
    else:
        http = KubeHttp.from_kubeconfig(kubeconfig)
        n = 0
        if arm == "baseline":
            token = ""
            while True:
                q: list[tuple[str, Any]] = [("limit", 500)] + ([("continue", token)] if token else [])
                doc = http.get_json("/api/v1/pods", q, timeout=120)
                n += len(doc.get("items") or [])
                token = (doc.get("metadata") or {}).get("continue") or ""
                if not token:
                    break
        else:
            doc = http.get_json("/api/v1/pods", timeout=600)
            n = len(doc.get("items") or [])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"seconds": time.monotonic() - t0, "pods": n, "rss_mib": peak}), file=sys.__stdout__)


def run_arm(arm: str, kubeconfig: Path) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", arm, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{arm} failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seconds": out["seconds"], "rss_mib": out["rss_mib"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", default="10000", help="comma-separated pod counts, ascending")
    ap.add_argument("--gpu-share", type=float, default=0.1, help="share of pods that hold nvidia.com/gpu")
    ap.add_argument("--state-dir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", choices=("baseline", "all-at-once", "assess"), help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.kubeconfig)
        return 0
    counts = sorted(int(x) for x in args.pods.split(","))
    from webhook.dev.cluster import LocalCluster

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="draguard-bench-assess-"))
    cluster = LocalCluster(state, None, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    rows = []
    try:
        cluster.up(with_driver=False, with_webhook=False)
        api = Api(cluster.server, cluster.paths.certs, timeout=60)
        api.call(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        owners = []
        for k in range(DEPLOYMENTS):
            dep = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": f"gpu-{k}", "namespace": NS},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"dep": f"gpu-{k}"}},
                    "template": {
                        "metadata": {"labels": {"dep": f"gpu-{k}"}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.example/train:1",
                                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                                }
                            ]
                        },
                    },
                },
            }
            status, body, _ = api.call("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", dep)
            if status != 201:
                raise SystemExit(f"cannot create a Deployment: {status} {body}")
            owners.append(body)
        made = 0
        for n in counts:
            dt = populate(cluster, made, n, args.gpu_share, owners)
            print(f"created {n - made} pods in {dt:.0f} s ({(n - made) / dt:.0f}/s)", file=sys.stderr)
            made = n
            res = {arm: run_arm(arm, cluster.kubeconfig) for arm in ("baseline", "assess", "all-at-once")}
            rows.append((n, res))
            base = res["baseline"]
            for arm, r in res.items():
                print(
                    f"pods={n:>7} {arm:<12} {r['seconds']:7.1f} s  peak RSS {r['rss_mib']:6.0f} MiB  "
                    f"time x{r['seconds'] / base['seconds']:.2f}  RSS x{r['rss_mib'] / base['rss_mib']:.2f}",
                    flush=True,
                )
    finally:
        if not args.keep:
            cluster.down(keep_logs=False)
    print(json.dumps({str(n): res for n, res in rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
