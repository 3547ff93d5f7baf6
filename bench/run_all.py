"""Run every benchmark in bench/ and print a summary (the `make bench` driver).

    python bench/run_all.py [--quick] [--only NAME[,NAME]] [--skip NAME[,NAME]] [--out DIR]

Each bench/*.py (except this file and plot.py) runs as its own process; its full output goes to
DIR/<name>.txt (default bench/results/), and the summary shows its exit status, wall time and the
last lines it printed (the figures). `--quick` passes smaller sizes to the slow ones, for a smoke
run (its plots go to DIR, not docs/); the published figures in docs/performance.md come from full
runs. A benchmark that needs something this machine lacks (the Kubernetes binaries, a peer tool)
says so and is reported as skipped (exit 3), not failed. Afterwards bench/plot.py draws the PNGs
when its inputs exist.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).parent
NOT_BENCHMARKS = {"run_all", "plot"}
SKIPPED = 3  # exit status of a benchmark that cannot run here

# Extra arguments: the results the plots and docs use (--json), and smaller sizes for --quick.
FULL_ARGS: dict[str, list[str]] = {
    "scaling": ["--json", "{out}/scaling.json"],
    "webhook_concurrency": ["--json", "{out}/webhook_concurrency.json"],
    "apiserver": ["--json", "{out}/apiserver.json"],
    "peer": ["--json", "{out}/peer.json"],
    "peer_webhook": ["--json", "{out}/peer_webhook.json"],
    "driver_churn": ["--json", "{out}/driver_churn.json"],
    "ledger_reconcile": ["--json", "{out}/ledger_reconcile.json"],
    "cache_rebuild": ["--json", "{out}/cache_rebuild.json"],
    "cache_sync": ["--json", "{out}/cache_sync.json"],
}
QUICK_ARGS: dict[str, list[str]] = {
    "scaling": ["--devices", "1000,10000", "--policies", "10,100", "--reviews", "60"],
    "webhook_concurrency": ["--seconds", "2", "--warmup", "1", "--devices", "1000"],
    "webhook": ["--seconds", "2", "--warmup", "1", "--paced-seconds", "2", "--devices", "1000"],
    "apiserver": ["--pods", "200", "--deployments", "50", "--blocks", "2"],
    "peer": ["--workloads", "200"],
    "peer_webhook": ["--quick"],
    "engine": ["--workloads", "300", "--repeat", "1"],
    "cel_lint": ["--nodes", "1000", "--repeat", "1"],
    "driver": ["--iterations", "50"],
    "driver_churn": ["--quick"],
    "ledger_reconcile": ["--quick"],
    "cache_rebuild": ["--steps", "20,40", "--repeat", "1"],
    "cache_sync": ["--quick"],
    "review": ["--repeat", "1"],
    "migration": ["--sizes", "250,1000", "--repeat", "2"],
    "audit": ["--objects", "5000", "--repeat", "1"],
    "assess": ["--pods", "1000"],
    "tier_index": ["--reviews", "60", "--rounds", "2"],
    "json_codecs": ["--rounds", "2", "--number", "300"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--skip", default="", help="comma-separated benchmark names")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per benchmark, seconds")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = sorted(
        p.stem for p in HERE.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_")
    )
    only = {n for n in args.only.split(",") if n}
    skip = {n for n in args.skip.split(",") if n}
    unknown = (only | skip) - set(names)
    if unknown:
        print(
            f"run_all: no benchmark named {', '.join(sorted(unknown))} (have: {', '.join(names)})",
            file=sys.stderr,
        )
        return 2
    rows = []
    for name in names:
        if (only and name not in only) or name in skip:
            continue
        extra = [a.format(out=args.out) for a in FULL_ARGS.get(name, [])]
        if args.quick:
            extra += QUICK_ARGS.get(name, [])
        cmd = [sys.executable, str(HERE / f"{name}.py"), *extra]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = (
                124,
                (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""),
                "timeout",
            )
        took = time.monotonic() - t0
        (args.out / f"{name}.txt").write_text(f"$ {' '.join(cmd)}\n{out}\n--- stderr ---\n{err}")
        tail = [ln for ln in out.strip().splitlines() if ln.strip()][-6:]
        for ln in tail:
            print(f"   {ln}")
        if rc not in (0, SKIPPED) and err.strip():
            print(f"   stderr: {err.strip().splitlines()[-1]}")
        status = {0: "ok", SKIPPED: "skipped"}.get(rc, f"exit {rc}")
        rows.append((name, status, took))
    print("\nsummary")
    for name, status, took in rows:
        print(f"  {name:<22} {status:<10} {took:>7.1f} s")
    if (args.out / "scaling.json").exists() or (args.out / "webhook_concurrency.json").exists():
        # A quick run must not replace the published figures: its plots stay next to its results.
        dest = args.out if args.quick else ROOT / "docs"
        subprocess.run(
            [sys.executable, str(HERE / "plot.py"), "--results", str(args.out), "--out", str(dest)], cwd=ROOT
        )
    failed = [n for n, s, _ in rows if s not in ("ok", "skipped")]
    if failed:
        print(f"not met or failed: {', '.join(failed)} (see {args.out}/<name>.txt)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
