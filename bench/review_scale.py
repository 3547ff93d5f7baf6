"""Benchmark `draguard review` at scale: 5, 10, 25 and 50 MB of generated GPU workloads.

Per size, in one run: the real CLI in a child process (start-up, streaming, evaluation and a JSON
report), and beside it a child that only parses the same bytes with libyaml (`yaml.CSafeLoader`,
one document at a time): wall time, CPU time and peak memory (the child's `ru_maxrss`), with the
review's ratios to the parse. The workloads are Deployments, a third asking for `nvidia.com/gpu`
limits (the migration findings, with their patches) and the rest naming ResourceClaimTemplates,
seven per namespace in twenty namespaces, written at the top of the file.

Targets: review at most 3x the parse time, at most 300 MB peak at 50 MB, growing linearly.

    .venv/bin/python bench/review_scale.py [--sizes 5,10,25,50] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = 20
TEMPLATES = 7

PARSE_ONLY = """
import sys, yaml
with open(sys.argv[1], encoding="utf-8") as fh:
    n = sum(1 for _ in yaml.load_all(fh, Loader=yaml.CSafeLoader))
print(n)
"""


def _template(ns: int, t: int) -> str:
    return f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-{t}
  namespace: team-{ns}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          count: {1 + t % 2}
"""


def _deployment(i: int) -> str:
    if i % 3 == 0:
        resources = """          resources:
            limits:
              nvidia.com/gpu: 2
              cpu: "8"
              memory: 64Gi
"""
        claims = ""
    else:
        resources = """          resources:
            claims:
            - name: gpu
            limits:
              cpu: "8"
              memory: 64Gi
"""
        claims = f"""      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: gpu-{i % TEMPLATES}
"""
    return f"""---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: serve-{i}
  namespace: team-{i % NAMESPACES}
  labels:
    app: serve-{i}
    team: t{i % NAMESPACES}
spec:
  replicas: {1 + i % 4}
  selector:
    matchLabels:
      app: serve-{i}
  template:
    metadata:
      labels:
        app: serve-{i}
    spec:
      containers:
        - name: server
          image: registry.example.com/inference/model-server:1.{i % 9}.0
          args: ["--port", "8080", "--workers", "4"]
          env:
            - name: MODEL
              value: model-{i % 50}
          ports:
            - containerPort: 8080
{resources}{claims}"""


def generate(path: Path, megabytes: float) -> int:
    """Write about `megabytes` MB of workloads to `path`; the number of documents written."""
    target = int(megabytes * 1_000_000)
    docs = 0
    with path.open("w", encoding="utf-8") as fh:
        size = 0
        for ns in range(NAMESPACES):
            for t in range(TEMPLATES):
                size += fh.write(_template(ns, t))
                docs += 1
        i = 0
        while size < target:
            size += fh.write(_deployment(i))
            i += 1
            docs += 1
    return docs


@dataclass
class Measure:
    wall: float
    cpu: float
    peak_mb: float
    code: int


def run_child(argv: list[str]) -> Measure:
    """Run `argv` to completion; its wall time, CPU time and peak RSS (from wait4's rusage)."""
    with tempfile.TemporaryFile() as errors:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)  # the rusage of this child alone
        wall = time.monotonic() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    if code not in (0, 1):  # 1: the review has enforce-mode findings, as intended
        sys.exit(f"{' '.join(argv)} failed ({code}): {err.strip()[-400:]}")
    # ru_maxrss is KiB on Linux.
    return Measure(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, code)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5,10,25,50", help="input sizes in MB, comma-separated")
    ap.add_argument("--keep", metavar="DIR", help="write the generated inputs here and keep them")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    python = sys.executable
    draguard = [python, "-m", "webhook.cli"]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="draguard-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; review: {' '.join(draguard[1:])} review FILE --policies policies "
          "-f json; parse: yaml.load_all(CSafeLoader), one document at a time")
    header = (f"{'MB':>5} {'docs':>7} | {'review s':>8} {'cpu s':>6} {'peak MB':>7} | "
              f"{'parse s':>7} {'cpu s':>6} {'peak MB':>7} | {'time x':>6} {'cpu x':>5} | {'MB/s':>5}")
    print(header)
    print("-" * len(header))
    rows: list[tuple[float, Measure, Measure]] = []
    try:
        for mb in sizes:
            path = work / f"gpu-workloads-{mb:g}MB.yaml"
            docs = generate(path, mb)
            real_mb = path.stat().st_size / 1_000_000
            parse = run_child([python, "-c", PARSE_ONLY, str(path)])
            review = run_child([*draguard, "review", str(path), "--policies", "policies", "-f", "json",
                                "--no-progress"])
            rows.append((real_mb, review, parse))
            print(f"{real_mb:5.1f} {docs:7d} | {review.wall:8.1f} {review.cpu:6.1f} {review.peak_mb:7.0f} | "
                  f"{parse.wall:7.1f} {parse.cpu:6.1f} {parse.peak_mb:7.0f} | "
                  f"{review.wall / parse.wall:6.2f} {review.cpu / parse.cpu:5.2f} | "
                  f"{real_mb / review.wall:5.2f}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if len(rows) > 1:
        (mb0, r0, _), (mb1, r1, _) = rows[0], rows[-1]
        print(f"growth {mb0:.0f} -> {mb1:.0f} MB ({mb1 / mb0:.1f}x input): "
              f"review CPU x{r1.cpu / r0.cpu:.2f}, peak memory {r0.peak_mb:.0f} -> {r1.peak_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
