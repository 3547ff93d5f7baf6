"""scripts/gpu-check.sh: the prepared real-GPU check, run here on a simulated node (same code path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.gotool import go_tool

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    full.update({"PYTHON": sys.executable, **env})
    return subprocess.run(["bash", str(ROOT / "scripts/gpu-check.sh"), *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def sections(out: str) -> dict[str, str]:
    """The script's output by `== ` section title."""
    parts: dict[str, str] = {}
    title = ""
    for line in out.splitlines():
        if line.startswith("== "):
            title = line[3:]
            parts[title] = ""
        elif title:
            parts[title] += line + "\n"
    return parts


def steps(text: str) -> list[str]:
    return [line.split(":")[0] for line in text.splitlines() if line.startswith("[")]


def check(out: str, mode: str) -> str:
    return next(v for k, v in sections(out).items() if k.startswith(f"self-check, {mode}"))


def test_gpu_check_on_a_simulated_node_goes_through_every_step() -> None:
    p = run("--sim", "a100-4x-mig", CDICHECK=str(go_tool("cdicheck")), DEVICE="gpu-2-mig-3g20gb-9-4")
    assert p.returncode == 0, p.stdout + p.stderr
    exclusive = check(p.stdout, "exclusive")
    assert steps(exclusive) == [
        "[ok] NVML inventory", "[ok] driver root", "[ok] nvidia-smi -L from the driver root",
        "[ok] CDI library (tags.cncf.io/container-device-interface)", "[ok] registration",
        "[ok] NodePrepareResources", "[ok] CDI spec written", "[ok] NodeUnprepareResources",
        "[ok] CDI spec removed",
    ]  # fmt: skip
    assert "claim=6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f00-gpu-2-mig-3g20gb-9-4" in exclusive
    assert "/dev/nvidia-caps/nvidia-cap" in exclusive  # the printed spec has the MIG capability nodes
    assert exclusive.rstrip().endswith("GPU CHECK: OK")
    # Every GPU is in MIG mode with its slices taken by instances made beforehand: neither sharing
    # mode can run, and each says why instead of failing.
    assert "[skip] share by capacity: no GPU of this node can be shared" in check(
        p.stdout, "shared by capacity"
    )
    assert "[skip] dynamic MIG: every placement is taken by MIG instances" in check(p.stdout, "dynamic MIG")
    assert sections(p.stdout)["summary"].split("\n")[:3] == [
        "exclusive: OK",
        "share: SKIPPED",
        "dynamic-mig: SKIPPED",
    ]


def test_gpu_check_runs_all_three_modes_on_a_node_with_a_mig_gpu_and_a_full_gpu(tmp_path: Path) -> None:
    # One A100 80GB in MIG mode with no instance (dynamic MIG) beside one H100 in no MIG mode (exclusive,
    # shared by capacity), both from the shipped topologies.
    tops = ROOT / "driver/sim/topologies"
    mig = yaml.safe_load((tops / "a100-2x-dynamic-mig.yaml").read_text())
    full = yaml.safe_load((tops / "h100-8x-nvlink.yaml").read_text())["gpus"][0]
    full.pop("nvlinks")
    mig["gpus"] = [mig["gpus"][0], {**full, "minor": 1}]
    topology = tmp_path / "mixed.yaml"
    topology.write_text(yaml.safe_dump(mig))
    p = run("--sim", str(topology), CDICHECK=str(go_tool("cdicheck")), DEVICE="gpu-1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert sections(p.stdout)["summary"].split("\n")[:3] == ["exclusive: OK", "share: OK", "dynamic-mig: OK"]
    share = check(p.stdout, "shared by capacity")
    assert "[ok] share 2 untouched" in share and "[ok] CDI library" in share
    assert "DRAGUARD_GPU_MEMORY_LIMIT=2147483648" in share and "DRAGUARD_GPU_MEMORY_LIMIT=1073741824" in share
    dynamic = check(p.stdout, "dynamic MIG")
    assert "gpu-0-mig-1g10gb-19-0: 1g.10gb at memory slice 0 of GPU 0" in dynamic
    assert "[ok] MIG instance destroyed" in dynamic and "[ok] CDI library" in dynamic
    assert "[FAIL]" not in p.stdout


def test_gpu_check_without_a_gpu_fails_with_a_clear_message() -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a GPU machine: the real check is meant to pass here")
    p = run()
    assert p.returncode != 0
    assert "NVML is not usable on this machine" in p.stderr and "Traceback" not in p.stderr
