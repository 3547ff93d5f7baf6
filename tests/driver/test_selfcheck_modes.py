"""`draguard driver self-check` in each sharing mode, on simulated nodes, as a user runs it.

The command goes through the plugin's unix socket exactly as on a GPU machine; only NVML is the
simulator. What is asserted is what the user reads (the step lines, the exit status) and what the
check leaves behind (no CDI spec, no checkpoint, no MIG instance on the simulated GPUs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.nvml import GpuInfo
from driver.selfcheck import mig_off_reason, parse_mig_modes

ROOT = Path(__file__).resolve().parents[2]
A100_GPU0 = "GPU-70e97c5c-2914-58b6-94be-57df14252df3"  # a100-2x-dynamic-mig's first GPU


@pytest.fixture
def tmp() -> Iterator[Path]:
    # Short and under /tmp: the plugin's socket paths must stay under the kernel's 107 bytes.
    d = Path(tempfile.mkdtemp(prefix="dg-sc-", dir="/tmp"))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def self_check(tmp: Path, topology: str, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    root, work = tmp / "root", tmp / "work"
    if not root.exists():
        cmd = [sys.executable, "-m", "driver.cli", "driver", "sim-root", str(root), "--sim", topology]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    work.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    full.update({"TMPDIR": str(work), **env})
    return subprocess.run([sys.executable, "-m", "driver.cli", "driver", "self-check", "--sim", topology,
                           "--driver-root", str(root), *flags],
                          cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)  # fmt: skip


def steps(out: str) -> list[str]:
    return [line.split(":")[0] for line in out.splitlines() if line.startswith("[")]


def line(out: str, step: str) -> str:
    return next(x for x in out.splitlines() if x.startswith(step))


COMMON = [
    "[ok] NVML inventory",
    "[ok] driver root",
    "[ok] nvidia-smi -L from the driver root",
    "[ok] registration",
]


def test_share_mode_prepares_two_shares_each_with_its_own_device_and_limit(tmp: Path) -> None:
    p = self_check(tmp, "h100-8x-nvlink", "--share-by-capacity", "all")
    assert p.returncode == 0, p.stdout + p.stderr
    assert steps(p.stdout) == [
        *COMMON, "[ok] NodePrepareResources share 1", "[ok] NodePrepareResources share 2",
        "[ok] CDI device of share 1", "[ok] CDI device of share 2",
        "[ok] NodeUnprepareResources share 1", "[ok] CDI spec of share 1 removed", "[ok] share 2 untouched",
        "[ok] NodeUnprepareResources share 2", "[ok] CDI spec of share 2 removed",
        "[ok] nothing left prepared",
    ]  # fmt: skip
    assert p.stdout.splitlines()[0] == "mode: share by capacity"
    # Two shareIDs on gpu-0, each its own CDI device, each its own limit (2Gi and 1Gi, step 1Gi).
    one, two = (
        line(p.stdout, "[ok] NodePrepareResources share 1"),
        line(p.stdout, "[ok] NodePrepareResources share 2"),
    )
    assert (
        "-gpu-0-a3c54e1d-7f2b-4c69-8e0d-2b1f9c7a5d01'" in one
        and "-gpu-0-a3c54e1d-7f2b-4c69-8e0d-2b1f9c7a5d02'" in two
    )
    assert "DRAGUARD_GPU_MEMORY_LIMIT=2147483648 (2Gi)" in line(p.stdout, "[ok] CDI device of share 1")
    assert "DRAGUARD_GPU_MEMORY_LIMIT=1073741824 (1Gi)" in line(p.stdout, "[ok] CDI device of share 2")
    assert p.stdout.rstrip().endswith("GPU CHECK: OK")
    assert list((tmp / "work").iterdir()) == []  # no CDI spec, checkpoint or socket left


def test_share_memory_step_comes_from_the_drivers_own_flag(tmp: Path) -> None:
    p = self_check(tmp, "h100-8x-nvlink", "--share-by-capacity", "all", "--share-memory-step", "4Gi")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "DRAGUARD_GPU_MEMORY_LIMIT=8589934592 (8Gi)" in line(p.stdout, "[ok] CDI device of share 1")
    assert "DRAGUARD_GPU_MEMORY_LIMIT=4294967296 (4Gi)" in line(p.stdout, "[ok] CDI device of share 2")


def test_share_mode_naming_no_gpu_of_the_node_fails_with_what_it_has(tmp: Path) -> None:
    p = self_check(tmp, "h100-8x-nvlink", "--share-by-capacity", "NVIDIA L4")
    assert p.returncode == 1
    assert "[FAIL] shared GPU: --share-by-capacity names no GPU of this node (NVIDIA L4); its GPUs are: " \
           "NVIDIA H100 80GB HBM3" in p.stdout  # fmt: skip
    assert p.stdout.rstrip().endswith("GPU CHECK: FAILED") and "Traceback" not in p.stderr


def test_share_mode_on_a_node_whose_gpus_are_all_in_mig_mode_is_skipped(tmp: Path) -> None:
    p = self_check(tmp, "a100-4x-mig", "--share-by-capacity", "all")
    assert p.returncode == 0, p.stdout + p.stderr
    skip = line(p.stdout, "[skip] share by capacity")
    assert "no GPU of this node can be shared: GPU 0 (NVIDIA A100 80GB PCIe) is in MIG mode" in skip
    assert "[FAIL]" not in p.stdout and p.stdout.rstrip().endswith("GPU CHECK: SKIPPED")


def test_dynamic_mig_makes_the_smallest_partition_and_destroys_it(tmp: Path) -> None:
    state = tmp / "mig-state.json"
    p = self_check(tmp, "a100-2x-dynamic-mig", "--dynamic-mig", DRAGUARD_NVML_SIM_MIG_STATE=str(state))
    assert p.returncode == 0, p.stdout + p.stderr
    assert steps(p.stdout) == [
        *COMMON, "[ok] NodePrepareResources", "[ok] MIG instance created",
        "[ok] CDI spec names the MIG instance", "[ok] NodeUnprepareResources",
        "[ok] MIG instance destroyed", "[ok] CDI spec removed",
    ]  # fmt: skip
    # The smallest profile at its first placement; NVML listed its instance, the spec names that instance.
    assert "    gpu-0-mig-1g10gb-19-0: 1g.10gb at memory slice 0 of GPU 0" in p.stdout
    made = line(p.stdout, "[ok] MIG instance created").split(": ", 2)[2].split()[0]
    assert made.startswith("MIG-")
    assert f"NVIDIA_VISIBLE_DEVICES={made}" in line(p.stdout, "[ok] CDI spec names the MIG instance")
    assert p.stdout.rstrip().endswith("GPU CHECK: OK")
    # The simulated GPUs (shared with any later process through the state file) hold no instance.
    assert all(v == [] for v in json.loads(state.read_text()).values())
    assert list((tmp / "work").iterdir()) == []


def test_dynamic_mig_takes_a_free_placement_and_leaves_other_instances_alone(tmp: Path) -> None:
    # An instance made outside the check holds memory slice 0 of GPU 0 (1g.10gb, profile 19).
    state = tmp / "mig-state.json"
    theirs = {
        "gi": 5,
        "profileId": 19,
        "start": 0,
        "created": 1,
        "uuid": "MIG-11111111-2222-3333-4444-555555555555",
    }
    state.write_text(json.dumps({A100_GPU0: [theirs]}))
    p = self_check(tmp, "a100-2x-dynamic-mig", "--dynamic-mig", DRAGUARD_NVML_SIM_MIG_STATE=str(state))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "    gpu-0-mig-1g10gb-19-1: 1g.10gb at memory slice 1 of GPU 0" in p.stdout
    assert "[FAIL]" not in p.stdout
    left = json.loads(state.read_text())
    assert [(r["profileId"], r["start"], r["uuid"]) for r in left[A100_GPU0]] == [(19, 0, theirs["uuid"])]


def test_dynamic_mig_without_mig_mode_is_skipped_with_the_command_to_run(tmp: Path) -> None:
    p = self_check(tmp, "h100-8x-nvlink", "--dynamic-mig")
    assert p.returncode == 0, p.stdout + p.stderr
    skip = line(p.stdout, "[skip] dynamic MIG")
    assert "GPU 0, 1, 2, 3, 4, 5, 6, 7 (NVIDIA H100 80GB HBM3): not in MIG mode" in skip
    assert "`nvidia-smi -i 0 -mig 1`" in skip
    assert "[FAIL]" not in p.stdout and "registration" not in p.stdout  # nothing prepared
    assert p.stdout.rstrip().endswith("GPU CHECK: SKIPPED")


def test_one_mode_at_a_time(tmp: Path) -> None:
    p = self_check(tmp, "h100-8x-nvlink", "--dynamic-mig", "--share-by-capacity", "all")
    assert p.returncode == 1
    assert "the check runs one mode at a time" in p.stderr and "Traceback" not in p.stderr


def _gpu(index: int, mig: bool = False) -> GpuInfo:
    return GpuInfo(index=index, minor=index, uuid=f"GPU-{index}", name="NVIDIA H200", brand="Nvidia",
                   architecture="Hopper", compute_capability="9.0", memory_bytes=150 << 30,
                   pci_bus_id=f"0000:0{index}:00.0", pcie_root=None, addressing_mode=None,
                   mig_enabled=mig)  # fmt: skip


def test_what_nvidia_smi_says_of_mig_mode_decides_the_message() -> None:
    # nvidia-smi's own answer to --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader
    modes = parse_mig_modes("0, Disabled, Disabled\n1, Disabled, Enabled\n2, [N/A], [N/A]\n")
    assert modes == {0: ("Disabled", "Disabled"), 1: ("Disabled", "Enabled"), 2: ("[N/A]", "[N/A]")}
    why = mig_off_reason([_gpu(0), _gpu(1), _gpu(2)], modes).split("; ")
    assert why[0].startswith("GPU 0 (NVIDIA H200): MIG mode is off, turn it on with `nvidia-smi -i 0 -mig 1`")
    assert (
        why[1].startswith("GPU 1 (NVIDIA H200): MIG mode is enabled but pending")
        and "nvidia-smi -i 1 -r" in why[1]
    )
    assert why[2] == "GPU 2 (NVIDIA H200): no MIG support"
    assert mig_off_reason([_gpu(3, mig=True)], {}) == (
        "GPU 3 (NVIDIA H200): in MIG mode, but NVML lists no GPU instance profiles"
    )
