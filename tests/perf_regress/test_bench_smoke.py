"""The webhook benches run end to end at tiny sizes: their servers start, answer and are measured.

The figures are not judged here (that is what the benches are for); what is checked is that a user
running them gets every row, with answers and without errors.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_webhook_bench_measures_both_servers() -> None:
    done = run(
        "bench/webhook.py", "--no-cache", "--rounds", "1", "--seconds", "0.5", "--warmup", "0.2",
        "--paced-seconds", "0.3", "--devices", "64", "--json",
    )  # fmt: skip
    # Exit 1 means "targets not met" at these sizes; a server that failed to start leaves no JSON.
    assert done.returncode in (0, 1), done.stderr[-2000:]
    res = json.loads(done.stdout)
    for server in ("bare", "draguard"):
        row = res[server]
        assert row["requests"] > 0, (server, row)
        assert row["errors"] == 0, (server, row["first_error"])
        assert math.isfinite(row["cpu_ms_per_review"]) and row["cpu_ms_per_review"] > 0, row


def test_webhook_concurrency_bench_serves_every_row(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = run(
        "bench/webhook_concurrency.py", "--seconds", "0.5", "--warmup", "0.2", "--devices", "64",
        "--connections", "1,4", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    # One worker at each connection count, then two workers sharing the port (SO_REUSEPORT).
    assert [(r["workers"], r["connections"]) for r in rows] == [(1, 1), (1, 4), (2, 4)]
    for r in rows:
        assert r["requests"] > 0 and r["errors"] == 0, r
