"""Peer comparison: `draguard review` vs the Kyverno CLI on the same 2,000 manifests, same policy idea.

    python bench/peer.py [--workloads 2000] [--kyverno PATH] [--repeat 3] [--json OUT]
    python bench/peer.py --webhook [...]   Kyverno's and Gatekeeper's admission webhooks beside
                                           draguard's on one local control plane (bench/peer_webhook.py)

The manifests are bench/engine.py's generated workloads (Pods, Deployments, StatefulSets, Jobs,
CronJobs, DaemonSets, ReplicaSets; 20 % still on nvidia.com/gpu) plus the claim templates they use,
in one multi-document YAML file. The policy on both sides is "LLM workloads (a vLLM image) must use
H100s":
- draguard: one GpuTierPolicy (enforce) whose `llm` class allows only gpu.nvidia.com-h100; draguard
  resolves each workload's claim template to its DeviceClass.
- Kyverno: one ClusterPolicy (Enforce) denying a vLLM pod whose claim templates are not the H100
  one. The Kyverno CLI sees one resource at a time and cannot join a pod to its template, so the rule
  matches the template *name* (t-gpu.nvidia.com-h100): a weaker check, stated in docs/performance.md.
Kyverno auto-generates the same rule for pod controllers.

Both run as processes over the same file, best of --repeat, with a one-document run to separate
start-up from per-document cost. The Kyverno CLI is looked up at --kyverno, $DRAGUARD_KYVERNO, where
`scripts/build-peer.sh cli` builds it, or ~/.cache/draguard/peer/bin/kubectl-kyverno;
without it the draguard half runs alone and the script exits 3 (skipped) saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DRAGUARD_POLICY = """apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata:
  name: llm-must-use-h100
spec:
  mode: enforce
  classes:
  - name: llm
    match:
      images: ["*vllm*"]
    deviceClasses: [gpu.nvidia.com-h100]
"""
KYVERNO_POLICY = """apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: llm-must-use-h100
spec:
  validationFailureAction: Enforce
  background: false
  rules:
  - name: llm-claims-h100
    match:
      any:
      - resources:
          kinds: [Pod]
    validate:
      message: "LLM workloads (vLLM images) must use H100 claim templates"
      deny:
        conditions:
          all:
          - key: "{{ request.object.spec.containers[].image }}"
            operator: AnyIn
            value: ["*vllm*"]
          - key: "{{ request.object.spec.resourceClaims[].resourceClaimTemplateName || `[]` }}"
            operator: AnyNotIn
            value: ["t-gpu.nvidia.com-h100"]
"""
DEFAULT_KYVERNO = Path.home() / ".cache" / "draguard" / "peer" / "bin" / "kubectl-kyverno"


def built_cli() -> str | None:
    """Where `scripts/build-peer.sh cli` puts the CLI (built or not)."""
    try:
        out = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-peer.sh"), "--path", "cli"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def find_kyverno(explicit: str | None) -> Path | None:
    for cand in (
        explicit,
        os.environ.get("DRAGUARD_KYVERNO"),
        built_cli(),
        str(DEFAULT_KYVERNO),
        shutil.which("kubectl-kyverno"),
    ):
        if cand and os.access(cand, os.X_OK):
            return Path(cand)
    return None


def timed(cmd: list[str], repeat: int) -> tuple[float, subprocess.CompletedProcess[str]]:
    best = float("inf")
    proc: subprocess.CompletedProcess[str] | None = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
        best = min(best, time.perf_counter() - t0)
    assert proc is not None
    return best, proc


def draguard_cmd(manifests: Path, policy_dir: Path, inventory: Path) -> list[str]:
    return [
        sys.executable, "-m", "webhook.cli", "review", str(manifests), "--policies", str(policy_dir),
        "--inventory", str(inventory), "--format", "json",
    ]  # fmt: skip


def kyverno_cmd(kyverno: Path, manifests: Path, policy: Path) -> list[str]:
    return [str(kyverno), "apply", str(policy), "--resource", str(manifests)]


def kyverno_counts(out: str) -> dict[str, int]:
    """The CLI's closing line: `pass: N, fail: N, warn: N, error: N, skip: N`."""
    m = re.search(r"pass: (\d+), fail: (\d+), warn: (\d+), error: (\d+), skip: (\d+)", out)
    if not m:
        return {}
    return dict(zip(("pass", "fail", "warn", "error", "skip"), map(int, m.groups()), strict=True))


def denied_by_draguard(out: str) -> int:
    try:
        doc = json.loads(out)
    except ValueError:
        return -1
    objs = {
        json.dumps(f.get("object"), sort_keys=True)
        for f in doc.get("findings", [])
        if str(f.get("rule", "")).startswith("tier/") and f.get("mode") == "enforce"
    }
    return len(objs)


def main() -> int:
    if "--webhook" in sys.argv[1:]:
        from bench.peer_webhook import main as webhook_main

        return webhook_main([a for a in sys.argv[1:] if a != "--webhook"])
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workloads", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kyverno", default=None)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    from bench.engine import generate

    objs = generate(args.workloads)
    docs = len(objs)
    kyverno = find_kyverno(args.kyverno)
    res: dict[str, Any] = {"documents": docs, "workloads": args.workloads}
    with tempfile.TemporaryDirectory(prefix="draguard-peer-") as tmp:
        d = Path(tmp)
        manifests = d / "manifests.yaml"
        manifests.write_text(yaml.safe_dump_all(objs, sort_keys=False))
        one = d / "one.yaml"
        one.write_text(yaml.safe_dump_all(objs[-1:], sort_keys=False))
        pol_dir = d / "draguard-policy"
        pol_dir.mkdir()
        (pol_dir / "tier.yaml").write_text(DRAGUARD_POLICY)
        kpol = d / "kyverno-policy.yaml"
        kpol.write_text(KYVERNO_POLICY)
        inventory = ROOT / "tests" / "fixtures" / "seed" / "cluster-inventory.yaml"
        inv = d / "inventory.yaml"
        inv.write_text(
            inventory.read_text() + "\n---\n" + (ROOT / "tests/fixtures/seed/deviceclasses.yaml").read_text()
        )

        full_s, proc = timed(draguard_cmd(manifests, pol_dir, inv), args.repeat)
        if proc.returncode not in (0, 1):
            print(f"draguard review failed ({proc.returncode}): {proc.stderr[-800:]}", file=sys.stderr)
            return 1
        start_s, _ = timed(draguard_cmd(one, pol_dir, inv), args.repeat)
        res["draguard"] = {
            "wall_s": round(full_s, 3),
            "startup_s": round(start_s, 3),
            "docs_per_s": round(docs / full_s),
            "docs_per_s_after_startup": round(docs / max(full_s - start_s, 1e-6)),
            "denied_objects": denied_by_draguard(proc.stdout),
        }
        if kyverno is not None:
            version = subprocess.run([str(kyverno), "version"], capture_output=True, text=True).stdout.strip()
            kfull, kproc = timed(kyverno_cmd(kyverno, manifests, kpol), args.repeat)
            kstart, _ = timed(kyverno_cmd(kyverno, one, kpol), args.repeat)
            counts = kyverno_counts(kproc.stdout + kproc.stderr)
            res["kyverno"] = {
                "version": version.splitlines()[0] if version else "?",
                "wall_s": round(kfull, 3),
                "startup_s": round(kstart, 3),
                "docs_per_s": round(docs / kfull),
                "docs_per_s_after_startup": round(docs / max(kfull - kstart, 1e-6)),
                "exit": kproc.returncode,
                "results": counts,
            }
    print(
        f"{docs} documents ({args.workloads} workloads + claim templates), one YAML file, "
        f"best of {args.repeat}"
    )
    print(f"{'tool':<10} {'wall s':>8} {'startup s':>9} {'docs/s':>8} {'docs/s excl. startup':>21}")
    for name in ("draguard", "kyverno"):
        r = res.get(name)
        if r:
            print(
                f"{name:<10} {r['wall_s']:>8.2f} {r['startup_s']:>9.2f} {r['docs_per_s']:>8} "
                f"{r['docs_per_s_after_startup']:>21}"
            )
    print(f"draguard denied {res['draguard']['denied_objects']} objects")
    if "kyverno" in res:
        kr = res["kyverno"]
        print(f"kyverno ({kr['version']}): exit {kr['exit']}; rule results {kr['results']} (fail = denied)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if kyverno is None:
        print(
            "kyverno CLI not found (--kyverno, $DRAGUARD_KYVERNO, `scripts/build-peer.sh --path cli` or "
            "~/.cache/draguard/peer/bin/kubectl-kyverno); build it with: scripts/build-peer.sh cli"
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
