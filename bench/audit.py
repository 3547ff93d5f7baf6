"""Benchmark: one background-audit scan of 50,000 objects, against just reading them, in one run.

The objects arrive as the API server's list pages would (500 per page, JSON text decoded as the
audit's client decodes it) over 500 namespaces: LLM Deployments on A100 (they fail the shipped
tier policy) and on H100, legacy `nvidia.com/gpu` pods, Jobs, user ResourceClaims, and pods without
GPUs (not judged). Each arm runs in a fresh process, so its peak RSS is its own:

  * list: decode and trim every page (what any scan pays before judging);
  * scan: the same, then `auditable` with its index of owners (owner_filter), the admission engine
    on each page and the PolicyReports.

The API server's own list time is not included (both arms would pay it alike).

    .venv/bin/python bench/audit.py [--objects 50000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGE = 500
NAMESPACES = 500


def _deployment(ns: str, i: int, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"llm-{i}",
            "namespace": ns,
            "uid": f"d-{i}",
            "labels": {"app": f"llm-{i}"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": f"llm-{i}"}},
            "template": {
                "metadata": {"labels": {"app": f"llm-{i}"}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"llm-{cls}"}],
                },
            },
        },
        "status": {"replicas": 2, "readyReplicas": 2},
    }


def _pod(ns: str, i: int, gpu: bool) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{i}", "namespace": ns, "uid": f"p-{i}"},
        "spec": {"containers": [{"name": "c", "image": "cuda:12", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }


def _job(ns: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"job-{i}", "namespace": ns, "uid": f"j-{i}"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "t",
                            "image": "nvcr.io/nvidia/pytorch:24.01",
                            "command": ["torchrun", "train.py"],
                            "resources": {"limits": {"nvidia.com/gpu": "4"}},
                        }
                    ],
                }
            }
        },
    }


def _claim(ns: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{i}", "namespace": ns, "uid": f"c-{i}"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com-h100"}}]}
        },
    }


def _template(ns: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"llm-{cls}", "namespace": ns, "uid": f"t-{ns}-{cls}"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": f"gpu.nvidia.com-{cls}"}}]
                }
            }
        },
    }


def objects(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        ns = f"team-{i % NAMESPACES:03d}"
        k = i % 10
        if k < 2:
            yield _deployment(ns, i, "a100")
        elif k < 4:
            yield _deployment(ns, i, "h100")
        elif k < 7:
            yield _pod(ns, i, gpu=True)
        elif k < 8:
            yield _job(ns, i)
        elif k < 9:
            yield _claim(ns, i)
        else:
            yield _pod(ns, i, gpu=False)


def pages(n: int) -> Iterator[list[dict[str, Any]]]:
    """Pages as the client receives them: JSON text, decoded, trimmed."""
    from webhook.audit.source import trim

    batch: list[dict[str, Any]] = []
    for o in objects(n):
        batch.append(o)
        if len(batch) == PAGE:
            yield [
                trim(x, keep_status=x["kind"] == "ResourceClaim")
                for x in json.loads(json.dumps({"items": batch}))["items"]
            ]
            batch = []
    if batch:
        yield [trim(x) for x in json.loads(json.dumps({"items": batch}))["items"]]


def arm(name: str, n: int) -> dict[str, Any]:
    import yaml

    from webhook.audit.scan import judge_pages, owner_filter
    from webhook.audit.source import ClusterState
    from webhook.dra.inventory import Inventory
    from webhook.policy.load import load_policies

    policies = load_policies(ROOT / "policies")
    inv_objs = [o for o in yaml.safe_load_all((ROOT / "examples" / "inventory.yaml").read_text()) if o]
    templates = [_template(f"team-{j:03d}", c) for j in range(NAMESPACES) for c in ("a100", "h100")]
    state = ClusterState(
        Inventory.from_objects([*inv_objs, *templates]),
        {f"team-{j:03d}": {} for j in range(NAMESPACES)},
        frozenset({"v1"}),
        templates,
    )
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    count = 0
    extra: dict[str, Any] = {}
    if name == "list":
        for page in pages(n):
            count += len(page)
    else:

        keep, _owners = owner_filter(policies, state, frozenset)

        def judged() -> Iterator[list[dict[str, Any]]]:
            nonlocal count
            for page in pages(n):
                count += len(page)
                yield [o for o in page if keep(o)]

        out = judge_pages(judged(), policies, state)
        fails = sum(r["summary"]["fail"] for r in out.reports)
        size = max(len(json.dumps(r)) for r in out.reports)
        extra = {
            "judged": out.objects,
            "reports": len(out.reports),
            "fail": fails,
            "largest_report_bytes": size,
        }
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "arm": name,
        "objects": count,
        "seconds": secs,
        "peak_rss_mib": rss,
        "start_rss_mib": base_rss,
        **extra,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--objects", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--arm", choices=["list", "scan"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.objects)))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"list": [], "scan": []}
    for _ in range(args.repeat):
        for name in ("list", "scan"):  # alternated, so load on the machine hits both alike
            proc = subprocess.run(
                [sys.executable, __file__, "--arm", name, "--objects", str(args.objects)],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    lst, scan = best["list"], best["scan"]
    print(
        f"objects: {args.objects} in {args.objects // PAGE} pages over {NAMESPACES} namespaces "
        f"(judged: {scan['judged']}; {scan['reports']} reports, {scan['fail']} fail results, "
        f"largest report {scan['largest_report_bytes'] / 1024:.0f} KiB)"
    )
    print(f"{'arm':<6} {'seconds':>8} {'peak RSS MiB':>13} {'RSS at start MiB':>17}")
    for r in (lst, scan):
        print(f"{r['arm']:<6} {r['seconds']:>8.2f} {r['peak_rss_mib']:>13.0f} {r['start_rss_mib']:>17.0f}")
    t_ratio = scan["seconds"] / lst["seconds"]
    rss_ratio = scan["peak_rss_mib"] / lst["peak_rss_mib"]
    extra = scan["peak_rss_mib"] - lst["peak_rss_mib"]
    print(f"scan / list: time {t_ratio:.2f}x, peak RSS {rss_ratio:.2f}x (+{extra:.0f} MiB)")
    print(f"per judged object: {scan['seconds'] / max(scan['judged'], 1) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
