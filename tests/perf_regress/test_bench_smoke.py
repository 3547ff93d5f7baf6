"""The webhook benches run end to end at tiny sizes: their servers start, answer and are measured.

The figures are not judged here (that is what the benches are for); what is checked is that a user
running them gets every row, with answers and without errors.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _webhook_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_webhook", ROOT / "bench" / "webhook.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_webhook_bench_never_sends_the_same_review_twice() -> None:
    """Its stream is what a cluster's /validate sees: a cache must not be able to answer it."""
    wb = _webhook_bench()
    senders = [wb._sender(b) for b in wb.distinct_reviews()]
    sent = [senders[i % len(senders)]() for i in range(5 * 2000)]
    assert len(set(sent)) == len(sent)
    docs = [json.loads(b) for b in sent[:10]]
    uids = {d["request"]["uid"] for d in docs}
    names = {d["request"]["object"]["metadata"]["name"] for d in docs}
    assert len(uids) == len(names) == 10
    assert all(d["request"]["name"] == d["request"]["object"]["metadata"]["name"] for d in docs)
    # The mark is as long as the number written over it: a request's Content-Length stays right.
    assert {len(b) for b in sent[::5]} == {len(wb.distinct_reviews()[0])}


def test_webhook_bench_reports_what_the_review_cache_answered() -> None:
    common = (
        "--rounds", "1", "--seconds", "0.5", "--warmup", "0.2", "--paced-seconds", "0.3",
        "--devices", "64", "--json",
    )  # fmt: skip
    fresh = run("bench/webhook.py", *common)
    repeated = run("bench/webhook.py", "--repeat", *common)
    for done in (fresh, repeated):
        assert done.returncode in (0, 1), done.stderr[-2000:]
    fresh_cache = json.loads(fresh.stdout)["draguard"]["review_cache"]
    repeated_cache = json.loads(repeated.stdout)["draguard"]["review_cache"]
    assert fresh_cache["hit"] == 0 and fresh_cache["miss"] > 0, fresh_cache
    # The same five bodies over and over: validating CREATEs are still each evaluated.
    assert repeated_cache["hit"] == 0 and repeated_cache["miss"] > 0, repeated_cache
