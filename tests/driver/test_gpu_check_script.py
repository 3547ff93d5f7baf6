"""scripts/gpu-check.sh: the prepared real-GPU check, run here on a simulated node (same code path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gotool import go_tool

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    full.update({"PYTHON": sys.executable, **env})
    return subprocess.run(["bash", str(ROOT / "scripts/gpu-check.sh"), *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_gpu_check_on_a_simulated_node_goes_through_every_step() -> None:
    p = run("--sim", "a100-4x-mig", CDICHECK=str(go_tool("cdicheck")), DEVICE="gpu-2-mig-3g20gb-9-4")
    assert p.returncode == 0, p.stdout + p.stderr
    steps = [line.split(":")[0] for line in p.stdout.splitlines() if line.startswith("[")]
    assert steps == [
        "[ok] NVML inventory", "[ok] driver root", "[ok] nvidia-smi -L from the driver root",
        "[ok] CDI library (tags.cncf.io/container-device-interface)", "[ok] registration",
        "[ok] NodePrepareResources", "[ok] CDI spec written", "[ok] NodeUnprepareResources",
        "[ok] CDI spec removed",
    ]  # fmt: skip
    assert "claim=6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f00-gpu-2-mig-3g20gb-9-4" in p.stdout
    assert "/dev/nvidia-caps/nvidia-cap" in p.stdout  # the printed spec has the MIG capability nodes
    assert p.stdout.rstrip().endswith("GPU CHECK: OK")


def test_gpu_check_without_a_gpu_fails_with_a_clear_message() -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a GPU machine: the real check is meant to pass here")
    p = run()
    assert p.returncode != 0
    assert "NVML is not usable on this machine" in p.stderr and "Traceback" not in p.stderr
