"""`draguard dev node add|remove` without a running cluster: a clear one-line error, no traceback,
and nothing made on the machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dev(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook.cli", "dev", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_adding_a_node_needs_a_running_cluster(tmp_path: Path) -> None:
    done = _dev("node", "add", "gpu-legacy-0", "--state-dir", str(tmp_path / "dev"))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"draguard dev: no running cluster in {tmp_path / 'dev'}; start one with `draguard dev up`"
    )
    assert not (tmp_path / "dev" / "nodes").exists()


def test_removing_an_unknown_node_names_the_added_ones(tmp_path: Path) -> None:
    done = _dev("node", "remove", "gpu-legacy-0", "--state-dir", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.strip() == "draguard dev: no added node gpu-legacy-0 in this cluster (added: none)"
    assert "Traceback" not in done.stderr
