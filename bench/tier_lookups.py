"""What the tier rule's API-server lookups add to a validating review, against a real kube-apiserver.

    python bench/tier_lookups.py [--reviews 200] [--pending 100]

Starts the local control plane (no webhook, no driver), then times in-process what `POST /validate`
runs for one ResourceClaim: `review()` alone (the baseline: a claim whose devices no tier class
could refuse needs no lookup) and `lookups.fetch()` + `review()` for
- a claim the resourceclaim controller made for a pod (one GET of the pod), and
- a user's claim, with `--pending` unscheduled pods in its namespace (one filtered list of pods).
Prints p50/p99 of each and the ratio to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NS = "bench-lookups"


def claim(name: str, device_class: str, owner: str | None, uid: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": uid, "controller": True}
        ]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
    }


def pod(name: str, claim_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "vllm/vllm-openai:v0.6.3", "resources": {"claims": [{"name": "g"}]}}
        ],
        "nodeSelector": {"bench/none": "none"},  # never scheduled: stays pending
    }
    spec["resourceClaims"] = [
        {"name": "g", "resourceClaimName": claim_name}
        if claim_name
        else {"name": "g", "resourceClaimTemplateName": "t"}
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def request(obj: dict[str, Any], i: int) -> dict[str, Any]:
    return {
        "uid": f"u{i}",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
        "operation": "CREATE",
        "namespace": NS,
        "name": obj["metadata"]["name"],
        "object": obj,
        "userInfo": {"username": "bench"},
    }


def timed(n: int, fn: Any) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reviews", type=int, default=200)
    ap.add_argument("--pending", type=int, default=100, help="unscheduled pods in the namespace")
    args = ap.parse_args()

    from webhook.dev.cluster import ClusterError, LocalCluster
    from webhook.dra.inventory import Inventory
    from webhook.policy.load import load_policies
    from webhook.server import admission, lookups
    from webhook.server.admission import Snapshot
    from webhook.server.caches import KubeHttp

    state = Path(tempfile.mkdtemp(prefix="draguard-bench-lookups-"))
    cluster = LocalCluster(state, None, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    try:
        cluster.up(with_driver=False, with_webhook=False)
        kube = cluster.kube()
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        cluster.wait_default_sa(NS)
        uid = kube.create(f"/api/v1/namespaces/{NS}/pods", pod("owner"))["metadata"]["uid"]
        for i in range(args.pending):
            kube.create(f"/api/v1/namespaces/{NS}/pods", pod(f"pending-{i}", "shared" if i == 0 else None))
        http = KubeHttp.from_kubeconfig(str(cluster.kubeconfig))
        snap = Snapshot(policies=load_policies(ROOT / "policies"), inventory=Inventory.empty())

        def run(obj: dict[str, Any], expect: str) -> Any:
            def one(i: int) -> None:
                req = request(obj, i)
                wants = lookups.wanted(req, snap)
                got = lookups.fetch(http, wants, snap) if wants else None
                out = admission.review("validate", req, snap, lookups=got)
                assert out.verdict == expect, (out.verdict, [f.message for f in out.findings])

            return one

        # Baseline: the same review where no tier policy applies (kube-system is excluded), so
        # nothing is looked up.
        base_req = request(claim("free", "gpu.nvidia.com-a100", "owner"), 0)
        base_req["namespace"] = base_req["object"]["metadata"]["namespace"] = "kube-system"
        assert not lookups.wanted(base_req, snap)
        arms: dict[str, Any] = {
            "no lookup (baseline)": lambda i: admission.review("validate", base_req, snap),
            "owner pod GET": run(claim("owned", "gpu.nvidia.com-a100", "owner", uid), "denied"),
            f"pending pods list ({args.pending})": run(
                claim("shared", "gpu.nvidia.com-a100", None), "denied"
            ),
        }
        results: dict[str, list[float]] = {}
        for _ in range(2):  # alternate, so both see the same background load
            for name, fn in arms.items():
                fn(0)  # warm
                results.setdefault(name, []).extend(timed(args.reviews // 2, fn))
    except ClusterError as exc:
        print(f"bench/tier_lookups.py: the local control plane is not available: {exc}", file=sys.stderr)
        return 3
    finally:
        cluster.down(keep_logs=False)
    base = statistics.median(results["no lookup (baseline)"])
    print(f"{'review':<28} {'p50 ms':>8} {'p99 ms':>8} {'x base':>8}")
    for name, lat in results.items():
        lat.sort()
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"{name:<28} {p50 * 1000:8.2f} {p99 * 1000:8.2f} {p50 / base:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
