"""bench/driver_churn.py's quick run (mode full, 16 pods in waves of 8) on its own real node.

The bench starts and tears down its own local cluster, so this test does not use the session's
cluster fixture. It checks that the bench measured something real: every pod ran and was deleted,
each claim's prepare and unprepare was logged by the driver with a positive time, the kubelet's own
metrics counted the same gRPC calls, and the node left nothing behind on the host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = 3  # the bench's exit status when the real node cannot start here
PODS = 16


def _netns() -> set[str]:
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {ln.split()[0] for ln in proc.stdout.splitlines() if ln.strip()}


@pytest.mark.timeout(900)  # a fresh machine builds the node's images first (minutes)
def test_quick_run_prepares_and_unprepares_every_pods_claim() -> None:
    # Short: the kubelet's and the plugin's unix sockets live under the state directory.
    state = Path(tempfile.mkdtemp(prefix="dg-churn-t-"))
    out = state / "churn.json"
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "bench/driver_churn.py"), "--quick", "--json", str(out),
             "--state-dir", str(state / "c")],
            capture_output=True, text=True, timeout=840, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        if proc.returncode == SKIPPED:
            reason = (proc.stderr.strip().splitlines() or ["(no reason given)"])[-1]
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"e2e: the bench's real node cannot start under CI: {reason}", pytrace=False)
            pytest.skip(f"e2e: {reason}")
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
        doc = json.loads(out.read_text())
    finally:
        shutil.rmtree(state, ignore_errors=True)
    # The node's network namespace existed during the run and is gone with the cluster.
    assert doc["node"]["netns"].startswith("draguard-")
    assert doc["node"]["netns"] not in _netns(), "the bench left its node's network namespace behind"

    assert doc["problems"] == []
    assert doc["node"]["kubelet"].startswith("v1.")
    [row] = doc["modes"]
    assert row["mode"] == "full" and row["pods"] == PODS
    assert row["ran"] == row["deleted"] == PODS
    assert row["waves"] == 2
    for op in ("prepare", "unprepare"):
        ms = row[f"{op}_ms"]
        assert ms["n"] == PODS, ms
        assert 0 < ms["p50"] <= ms["p99"] <= ms["max"], ms
        # The kubelet timed the same calls: one successful gRPC call per claim, none longer than its
        # 45 s call timeout allows.
        grpc = row["kubelet"][f"grpc_{op}"]
        assert grpc["count"] == PODS, grpc
        assert 0 < grpc["mean_s"] < doc["kubelet_limits_s"]["defaultClientCallTimeout"], grpc
    # The table a user reads carries the same figures.
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("full ")]
    numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", line)]
    assert numbers[:6] == [PODS, 8, row["prepare_ms"]["p50"], row["prepare_ms"]["p99"],
                           row["unprepare_ms"]["p50"], row["unprepare_ms"]["p99"]], line  # fmt: skip
