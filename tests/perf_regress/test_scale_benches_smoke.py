"""The large-cluster benches that take one component apart run end to end at tiny sizes.

bench/cache_rebuild.py (the webhook's inventory rebuild, in-process) and bench/ledger_reconcile.py (the
quota ledger's reconcile pass against a real API server): every row is measured, and what each bench
checks of the code it measures holds (a quiet ledger pass writes nothing, a churn is reconciled).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def needs_control_plane() -> None:
    from webhook.dev.cluster import ClusterError, find_bin_dir

    try:
        find_bin_dir()
    except ClusterError as exc:
        pytest.skip(str(exc))


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_cache_rebuild_bench_times_each_rebuild_at_each_step(tmp_path: Path) -> None:
    out = tmp_path / "rebuild.json"
    proc = run("bench/cache_rebuild.py", "--steps", "2,4", "--repeat", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    # 8 GPUs (as the rebuilt inventory holds them: each slice its own name) and 25 claims per node,
    # and the one claim the "one claim more" rebuild adds.
    assert [(r["nodes"], r["devices"], r["claims"]) for r in rows] == [(2, 16, 51), (4, 32, 101)]
    for r in rows:
        for m in ("first_ms", "first_cpu_ms", "one_claim_ms", "unchanged_ms", "claim_review_ms"):
            assert math.isfinite(r[m]) and r[m] > 0, (r["nodes"], m, r[m])
    assert "| first build after sync, wall (ms) |" in proc.stdout and "growth 2→4" in proc.stdout


@pytest.mark.e2e
def test_ledger_bench_reconciles_a_churn_at_each_step(tmp_path: Path) -> None:
    needs_control_plane()
    out = tmp_path / "ledger.json"
    proc = run("bench/ledger_reconcile.py", "--quick", "--json", str(out), "--state-dir", str(tmp_path / "s"),
               timeout=600)  # fmt: skip
    # Exit 2 would mean a quiet pass rewrote a ledger, or a churn was left unreconciled.
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["nodes"], r["claims"], r["ledgers"]) for r in rows] == [(4, 100, 1), (8, 200, 1)]
    for r in rows:
        churn = r["churn"]
        # Each deleted claim is asked about (404) and each created one fetched, in one pass.
        assert churn["deleted"] == churn["created"] == r["claims"] // 100
        assert r["churn_gets"] == churn["deleted"] + churn["created"] and r["churn_rewrites"] == 1
        assert all(p["written"] == 0 for p in r["steady"])
        assert r["steady_cpu_ms"] > 0 and r["listed_kib"] > 0
    assert "steady pass p50, CPU (ms)" in proc.stdout


@pytest.mark.e2e
def test_cache_sync_bench_splits_each_start_into_lists_and_rebuild(tmp_path: Path) -> None:
    needs_control_plane()
    out = tmp_path / "sync.json"
    proc = run("bench/cache_sync.py", "--quick", "--json", str(out), "--state-dir", str(tmp_path / "s"),
               timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["nodes"] for r in rows] == [0, 2, 4]
    for r in rows:
        # The replica's own figures come from its /metrics: every watched resource's list was timed.
        start = r["starts"][0]
        assert set(start["lists"]) >= {"resourceslices", "resourceclaims", "nodes", "namespaces"}
        assert 0 < start["list_s"] < start["sync_s"] and start["build_cpu_s"] > 0
        # What the plain client listed is what the step created: the claims' bytes grow with them.
        assert r["raw"]["resourceclaims"]["pages"] == 1
        # The claims streamed as a watch's initial events are the claims the step has.
        assert r["stream"]["events"] == 25 * r["nodes"]
    assert rows[2]["raw"]["resourceclaims"]["bytes"] > rows[1]["raw"]["resourceclaims"]["bytes"] > 0
    assert "| replica: start to ready (s) |" in proc.stdout
