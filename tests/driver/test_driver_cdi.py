"""CDI specs a CUDA container can use, checked by the reference CDI library (tools/cdicheck).

The driver root is a simulated one on disk (driver/sim/driverroot.py): real library files with
their SONAME links, nvidia-smi, firmware, a persistenced socket, MIG capability files and mknod'ed
device nodes. The library loads each spec, resolves its devices and applies them to an OCI spec.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cdicheck import cdicheck, check_spec_file
from driver_helpers import make_claim, make_state

from driver.cdi import CdiDevice, CdiError, CdiWriter, HostLayout, spec_path
from driver.devices import build_devices
from driver.driverroot import DriverRootError, Root, parse_capabilities, validate
from driver.nvml import open_sim
from driver.sim import load_topology
from driver.sim.driverroot import cap_minor, make_driver_root, simulated_layout
from driver.state import ClaimRef

ROOT = Path(__file__).resolve().parents[2]
VERSION = "550.54.15"  # h100-8x-nvlink's driver
MIG = "gpu-0-mig-3g20gb-9-0"


@pytest.fixture(autouse=True)
def _device_nodes_need_root() -> None:
    if os.geteuid() != 0:
        msg = "creating the simulated device nodes (mknod) needs root"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    return subprocess.run([sys.executable, "-m", "driver.cli", "driver", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def writer(base: Path, topology: str = "a100-4x-mig", **kw: Any) -> tuple[CdiWriter, dict[str, Any]]:
    sim = load_topology(topology)
    layout = simulated_layout(base / "root", sim, **kw)
    devices = {d.name: d for d in build_devices(open_sim(topology).enumerate())}
    return CdiWriter(base / "cdi", layout), devices


def mounts_by_target(oci: dict[str, Any]) -> dict[str, str]:
    return {m["destination"]: m["source"] for m in oci.get("mounts") or []}


def test_full_gpu_spec_mounts_the_driver_where_cuda_images_look(short_dir: Path) -> None:
    w, devs = writer(short_dir, "h100-8x-nvlink")
    w.write("uid-a", [CdiDevice(devs["gpu-0"], ("gpu",)), CdiDevice(devs["gpu-3"], ("gpu",))])
    oci = check_spec_file(spec_path(short_dir / "cdi", "uid-a"))
    m = mounts_by_target(oci)
    lib = short_dir / "root/usr/lib/x86_64-linux-gnu"
    # The versioned file and its SONAME name, both from the driver root (no hook on this host).
    assert m[f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"] == str(lib / f"libcuda.so.{VERSION}")
    assert m["/usr/local/nvidia/lib64/libcuda.so.1"] == str(lib / f"libcuda.so.{VERSION}")
    assert m["/usr/local/nvidia/lib64/libnvidia-ml.so.1"] == str(lib / f"libnvidia-ml.so.{VERSION}")
    assert m["/usr/local/nvidia/bin/nvidia-smi"] == str(short_dir / "root/usr/bin/nvidia-smi")
    assert m[f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"].endswith(f"nvidia/{VERSION}/gsp_ga10x.bin")
    assert m["/run/nvidia-persistenced/socket"] == str(short_dir / "root/run/nvidia-persistenced/socket")
    # compute,utility only: no video or graphics libraries.
    assert not any("libnvcuvid" in t or "GLX" in t for t in m)
    devices = {d["path"]: d for d in oci["linux"]["devices"]}
    assert set(devices) == {"/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    gpu3 = devices["/dev/nvidia3"]
    assert (gpu3["type"], gpu3["major"], gpu3["minor"]) == ("c", 195, 3)
    env = dict(e.split("=", 1) for e in oci["process"]["env"])
    uuids = env["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert uuids == [devs["gpu-0"].uuid, devs["gpu-3"].uuid]
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert stat.S_IMODE(spec_path(short_dir / "cdi", "uid-a").stat().st_mode) == 0o644


def test_mig_device_gets_its_capability_nodes_with_minors_from_proc(short_dir: Path) -> None:
    w, devs = writer(short_dir)
    w.write("uid-m", [CdiDevice(devs[MIG], ("mig",))])
    oci = check_spec_file(spec_path(short_dir / "cdi", "uid-m"))
    gi, ci = cap_minor(0, 1), cap_minor(0, 1, 0)
    assert (gi, ci) == (12, 13)  # NVIDIA's numbering: gpu0/gi1/access 12, gpu0/gi1/ci0/access 13
    paths = {d["path"]: d for d in oci["linux"]["devices"]}
    assert {"/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{ci}"} <= set(
        paths
    )
    assert paths[f"/dev/nvidia-caps/nvidia-cap{ci}"]["minor"] == ci
    assert not any("/proc/" in p for p in paths)  # the /proc access files are text, not device nodes


def test_mig_device_whose_capability_file_is_gone_fails_prepare_clearly(short_dir: Path) -> None:
    w, devs = writer(short_dir)
    access = short_dir / "root/proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access"
    access.unlink()
    with pytest.raises(CdiError, match=r"gpu-0-mig-3g20gb-9-0: no capability minor in .*gi1/ci0/access"):
        w.write("uid-x", [CdiDevice(devs[MIG], ("mig",))])
    assert not spec_path(short_dir / "cdi", "uid-x").exists()


def test_missing_control_nodes_are_left_out_and_a_missing_gpu_node_is_an_error(short_dir: Path) -> None:
    w, devs = writer(short_dir, "h100-8x-nvlink")
    (short_dir / "root/dev/nvidia-uvm").unlink()
    w.write("uid-u", [CdiDevice(devs["gpu-1"], ("gpu",))])
    oci = check_spec_file(spec_path(short_dir / "cdi", "uid-u"))
    assert {d["path"] for d in oci["linux"]["devices"]} == {"/dev/nvidia1", "/dev/nvidiactl"}
    (short_dir / "root/dev/nvidia2").unlink()
    with pytest.raises(CdiError, match=r"device gpu-2: device node .*/dev/nvidia2 does not exist"):
        w.write("uid-v", [CdiDevice(devs["gpu-2"], ("gpu",))])


def test_hooks_when_nvidia_cdi_hook_is_on_the_host(short_dir: Path) -> None:
    sim = load_topology("h100-8x-nvlink")
    make_driver_root(short_dir / "root", sim)
    hook = short_dir / "root/usr/bin/nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    w, devs = writer(short_dir, "h100-8x-nvlink", hook="auto")
    w.write("uid-h", [CdiDevice(devs["gpu-0"], ("gpu",))])
    oci = check_spec_file(spec_path(short_dir / "cdi", "uid-h"))
    lib = "/usr/lib/x86_64-linux-gnu"
    m = mounts_by_target(oci)
    assert f"{lib}/libcuda.so.{VERSION}" in m and "/usr/local/nvidia/lib64/libcuda.so.1" not in m
    hooks = oci["hooks"]["createContainer"]
    assert {h["path"] for h in hooks} == {str(hook)}
    by_cmd = {h["args"][1]: h["args"] for h in hooks}
    assert f"libcuda.so.{VERSION}::{lib}/libcuda.so.1" in by_cmd["create-symlinks"]
    assert by_cmd["update-ldcache"] == ["nvidia-cdi-hook", "update-ldcache", "--folder", lib]
    assert by_cmd["enable-cuda-compat"][2] == f"--host-driver-version={VERSION}"


def test_container_paths_map_back_to_host_paths_through_the_driver_root(short_dir: Path) -> None:
    """GKE-like: the driver root is /home/kubernetes/bin/nvidia on the host, seen elsewhere by the driver."""
    seen = short_dir / "seen"
    make_driver_root(seen, load_topology("h100-8x-nvlink"))
    gke = Root.of("/home/kubernetes/bin/nvidia", str(seen))
    layout = HostLayout(dev=Root.of(str(seen)), proc=seen, driver=gke, driver_version=VERSION, hook="none")
    layout.refresh()
    dev = {d.name: d for d in build_devices(open_sim("h100-8x-nvlink").enumerate())}["gpu-0"]
    CdiWriter(short_dir / "cdi", layout).write("uid-g", [CdiDevice(dev, ("gpu",))])
    oci = check_spec_file(spec_path(short_dir / "cdi", "uid-g"))
    sources = set(mounts_by_target(oci).values())
    assert sources and all(s.startswith("/home/kubernetes/bin/nvidia/") for s in sources), sources
    assert "/home/kubernetes/bin/nvidia/usr/bin/nvidia-smi" in sources


def test_cdi_spec_command_prints_exactly_what_prepare_writes(short_dir: Path, claims: Any) -> None:
    state = make_state(short_dir, claims, topology="a100-4x-mig")
    claims.add(make_claim("two", "uid-same", [("a", MIG), ("b", "gpu-1-mig-3g20gb-9-4")]))
    out = state.prepare(ClaimRef("default", "two", "uid-same"))
    assert out.error == ""
    written = spec_path(short_dir / "cdi", "uid-same").read_text()
    p = cli("cdi-spec", "--sim", "a100-4x-mig", "--driver-root", str(short_dir / "root"),
            "--devices", f"{MIG},gpu-1-mig-3g20gb-9-4", "--claim-uid", "uid-same")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout == written + "\n"
    spec = json.loads(p.stdout)
    # One container given the whole claim sees both MIG devices, whichever edit is applied last.
    envs = {e for d in spec["devices"] for e in d["containerEdits"]["env"]}
    assert len(envs) == 1 and envs.pop().count("MIG-") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--driver-root", "/nonexistent/driver"], "driver root /nonexistent/driver does not exist"),
        (["--driver-root", "relative/dir"], "must be an absolute host path"),
        (["--devices-extra"], "unrecognized arguments"),
    ],
)
def test_cdi_spec_command_errors_are_clear(args: list[str], message: str) -> None:
    base = ["cdi-spec", "--sim", "h100-8x-nvlink", "--devices", "gpu-0"]
    p = cli(*base, *args)
    assert p.returncode != 0 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_cdi_spec_command_names_unknown_devices_and_needs_a_root_with_sim(short_dir: Path) -> None:
    make_driver_root(short_dir / "root", load_topology("h100-8x-nvlink"))
    p = cli(
        "cdi-spec", "--sim", "h100-8x-nvlink", "--driver-root", str(short_dir / "root"), "--devices", "gpu-9"
    )
    assert p.returncode == 1 and "unknown device(s) gpu-9; this node has: gpu-0, gpu-1" in p.stderr
    p = cli("cdi-spec", "--sim", "h100-8x-nvlink", "--devices", "gpu-0")
    assert p.returncode == 1 and "draguard driver sim-root DIR --sim TOPOLOGY" in p.stderr


def test_driver_root_without_nvml_is_refused_naming_what_is_missing(short_dir: Path) -> None:
    (short_dir / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    with pytest.raises(DriverRootError, match=r"no libnvidia-ml.so.1 in any of usr/lib/x86_64-linux-gnu.*"
                                              r"/run/nvidia/driver \(GPU Operator\)"):  # fmt: skip
        validate(Root.of(str(short_dir)))
    with pytest.raises(
        DriverRootError, match=r"/run/nvidia/driver \(seen at /nope\) does not exist.*mounted"
    ):
        validate(Root.of("/run/nvidia/driver", "/nope"))


def test_driver_capabilities_select_libraries(short_dir: Path) -> None:
    assert parse_capabilities("utility, compute") == ("compute", "utility")
    assert "video" in parse_capabilities("all")
    with pytest.raises(DriverRootError, match="unknown display; allowed: all, compute, graphics"):
        parse_capabilities("compute,display")
    w, devs = writer(short_dir, "h100-8x-nvlink")
    w.layout.capabilities = parse_capabilities("all")
    w.layout.refresh()
    w.write("uid-all", [CdiDevice(devs["gpu-0"], ("gpu",))])
    m = mounts_by_target(check_spec_file(spec_path(short_dir / "cdi", "uid-all")))
    assert (
        "/usr/local/nvidia/lib64/libnvcuvid.so.1" in m and "/usr/local/nvidia/lib64/libGLX_nvidia.so.0" in m
    )


def test_simulated_nvidia_smi_from_the_driver_root_lists_visible_gpus(short_dir: Path) -> None:
    if shutil.which("sh") is None:
        pytest.skip("no /bin/sh")
    sim = load_topology("h100-8x-nvlink")
    make_driver_root(short_dir / "root", sim)
    smi = short_dir / "root/usr/bin/nvidia-smi"
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": f"{sim.gpus[2].uuid},{sim.gpus[5].uuid}"}
    p = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, timeout=10)
    assert p.returncode == 0
    assert p.stdout.splitlines() == [
        f"GPU 2: {sim.gpus[2].name} (UUID: {sim.gpus[2].uuid})",
        f"GPU 5: {sim.gpus[5].name} (UUID: {sim.gpus[5].uuid})",
    ]


def test_simulated_nvidia_smi_shows_only_devices_whose_nodes_it_can_reach(short_dir: Path) -> None:
    """Like the real one, it lists what it can open: a GPU without its node, a MIG device without
    its capability node, are not there; with nothing reachable it says so and exits 6."""
    if os.geteuid() != 0:
        pytest.skip("mknod of the simulated device nodes needs root")
    sim = load_topology("a100-4x-mig")
    make_driver_root(short_dir / "root", sim)
    smi, dev = str(short_dir / "root/usr/bin/nvidia-smi"), short_dir / "root/dev"
    mig_a, mig_b = sim.gpus[1].migs
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": f"{mig_a.uuid},{mig_b.uuid}"}

    def listed() -> tuple[int, list[str]]:
        p = subprocess.run([smi, "-L"], env=env, capture_output=True, text=True, timeout=10)
        return p.returncode, p.stdout.splitlines()

    assert listed() == (
        0,
        [f"  MIG 3g.20gb Device (UUID: {mig_a.uuid})", f"  MIG 3g.20gb Device (UUID: {mig_b.uuid})"],
    )
    (dev / f"nvidia-caps/nvidia-cap{cap_minor(1, mig_b.gi_id, mig_b.ci_id)}").unlink()
    assert listed() == (0, [f"  MIG 3g.20gb Device (UUID: {mig_a.uuid})"])
    (dev / "nvidia1").unlink()
    assert listed() == (6, ["No devices were found"])


def test_a_spec_with_a_node_that_vanished_is_rejected_by_the_cdi_library(short_dir: Path) -> None:
    """The check is real: the library refuses a spec whose device node no longer exists."""
    w, devs = writer(short_dir, "h100-8x-nvlink")
    w.write("uid-z", [CdiDevice(devs["gpu-4"], ("gpu",))])
    (short_dir / "root/dev/nvidia4").unlink()
    rc, out = cdicheck(short_dir / "cdi", "k8s.gpu.nvidia.com/claim=uid-z-gpu-4")
    assert rc == 1 and "nvidia4" in out.get("injectError", ""), out


def test_real_nvml_is_loaded_from_the_driver_root(short_dir: Path) -> None:
    """With DRIVER_ROOT set, libnvidia-ml.so.1 is opened from there (here: the simulator's placeholder)."""
    make_driver_root(short_dir / "root", load_topology("h100-8x-nvlink"))
    env = {k: v for k, v in os.environ.items() if k != "DRAGUARD_NVML_SIM"}
    env["DRIVER_ROOT"] = str(short_dir / "root")
    p = subprocess.run([sys.executable, "-m", "driver.cli", "driver", "inventory", "--real"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    lib = short_dir / "root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert p.returncode == 1 and f"cannot load {lib}" in p.stderr and "Traceback" not in p.stderr, p.stderr


def _move_version(root: Path, stem: str, old: str, new: str) -> None:
    """A half-finished driver upgrade: the library's files are of another version than NVML's."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    (lib / f"{stem}.so.{old}").rename(lib / f"{stem}.so.{new}")
    for link in lib.iterdir():
        if link.is_symlink() and link.name.startswith(f"{stem}.so") and not link.exists():
            link.unlink()
            link.symlink_to(f"{stem}.so.{new}")


def test_libcuda_of_another_version_is_refused_naming_versions_and_setting(short_dir: Path) -> None:
    root = short_dir / "root"
    make_driver_root(root, load_topology("h100-8x-nvlink"))
    _move_version(root, "libcuda", VERSION, "560.35.03")
    p = cli("cdi-spec", "--sim", "h100-8x-nvlink", "--driver-root", str(root), "--devices", "gpu-0")
    assert p.returncode == 1, p.stdout
    assert f"NVML reports driver {VERSION}" in p.stderr
    where = f"{root}/usr/lib/x86_64-linux-gnu"
    assert f"libcuda.so.{VERSION} (compute): found only 560.35.03 ({where})" in p.stderr
    assert "--driver-root" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""  # no spec that would start a container without CUDA


def test_nvml_library_of_another_version_fails_utility_and_spares_compute_only(short_dir: Path) -> None:
    root = short_dir / "root"
    make_driver_root(root, load_topology("h100-8x-nvlink"))
    _move_version(root, "libnvidia-ml", VERSION, "535.183.01")
    p = cli("cdi-spec", "--sim", "h100-8x-nvlink", "--driver-root", str(root), "--devices", "gpu-0")
    assert p.returncode == 1
    assert f"libnvidia-ml.so.{VERSION} (utility): found only 535.183.01" in p.stderr
    # Without the utility capability, NVML's library is not required in the container.
    p = cli("cdi-spec", "--sim", "h100-8x-nvlink", "--driver-root", str(root), "--devices", "gpu-0",
            "--driver-capabilities", "compute")  # fmt: skip
    assert p.returncode == 0, p.stderr
    spec = json.loads(p.stdout)
    paths = json.dumps(spec)
    assert f"libcuda.so.{VERSION}" in paths and "libnvidia-ml" not in paths


def test_a_root_with_no_libcuda_at_all_says_so(short_dir: Path) -> None:
    root = short_dir / "root"
    make_driver_root(root, load_topology("h100-8x-nvlink"))
    for f in (root / "usr/lib/x86_64-linux-gnu").glob("libcuda.so*"):
        f.unlink()
    expected = rf"libcuda.so.{VERSION} \(compute\): no version of it was found"
    with pytest.raises(DriverRootError, match=expected):
        simulated_layout(root, load_topology("h100-8x-nvlink"), create=False)


def test_the_hosts_mps_pipe_directory_is_never_mounted(short_dir: Path) -> None:
    # The driver refuses MPS; a shared read-write pipe directory would reach another tenant's daemon.
    root = short_dir / "root"
    make_driver_root(root, load_topology("h100-8x-nvlink"))
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    (root / "tmp/nvidia-mps/control").write_text("")
    p = cli("cdi-spec", "--sim", "h100-8x-nvlink", "--driver-root", str(root), "--devices", "gpu-0")
    assert p.returncode == 0, p.stderr
    spec = json.loads(p.stdout)
    mounts = [m for d in spec["devices"] for m in d["containerEdits"].get("mounts", [])]
    mounts += spec["containerEdits"].get("mounts", [])
    assert mounts, "the spec mounts the driver's libraries"
    assert not any("nvidia-mps" in m["hostPath"] or "nvidia-mps" in m["containerPath"] for m in mounts)
