"""`bench/peer.py --webhook --quick` on its own local control plane: baseline, null webhook, draguard.

Kyverno's admission controller (a 35-minute build, not part of CI) is left out with --arms; this
checks that the side-by-side harness runs end to end: the namespaces' selectors route each create to
its arm's webhook alone, draguard denies exactly the objects the policy forbids, and the figures come
from the server's own process and metrics.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench import peer_webhook as pw
from webhook.dev.cluster import ClusterError, find_bin_dir

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_without_kyverno(tmp_path: Path) -> None:
    try:
        find_bin_dir()
    except ClusterError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"control-plane binaries missing under CI: {exc}")
        pytest.skip(str(exc))
    out = tmp_path / "peer.json"
    # Short: the drivers' unix sockets live under the state directory (107-byte limit).
    short = Path(tempfile.mkdtemp(prefix="dgp-"))
    state = short / "s"
    try:
        proc = subprocess.run(
            [sys.executable, "bench/peer.py", "--webhook", "--quick", "--arms", "none,null,draguard",
             "--state-dir", str(state), "--json", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        state_left = state.exists()
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    n = res["objects_per_arm"]
    forbidden = sorted(i for i in range(n) if pw.workload(i, "x")[2])
    assert forbidden and res["denied"] == {"none": [], "null": [], "draguard": forbidden}
    assert res["other_errors"] == {"none": 0, "null": 0, "draguard": 0}
    assert res["probes"]["none"]["a100"] == 201 and res["probes"]["null"]["a100"] == 201
    assert res["probes"]["draguard"]["a100"] == 403
    assert res["rows"]["null"]["server"]["reviews"] == n  # one call per create in its namespace
    server = res["rows"]["draguard"]["server"]
    assert server["reviews"] >= n  # every create in its namespace was reviewed
    assert server["cpu_s"] > 0 and server["rss_mib"] > 0
    row = res["rows"]["draguard"]["all"]
    assert row["n"] == n - len(forbidden)
    lo, hi = row["added_p50_ci90_ms"]
    assert lo <= hi
    assert "draguard: denied" in proc.stdout and "agrees" in proc.stdout
    assert not state_left  # the bench took its control plane down
