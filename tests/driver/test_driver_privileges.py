"""The plugin runs as the user the bundle gives it, against directories laid out as the kubelet's.

The kubelet's plugin and registry directories are root-owned and 0750 on many distributions. The
bundle runs the driver as root (runAsUser: 0); the image's default user (65532, what the driver ran
as before) cannot create its sockets there. A separate mount namespace with a private bind mount
plays the container: the sockets and files the plugin makes are seen on the "host" side without any
mount propagation, which is why the DaemonSet carries none.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from driver_helpers import NODE, claim_msg, make_claim

from driver.proto import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from driver.sim import load_topology
from driver.sim.driverroot import make_driver_root

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DAEMONSET = ROOT / "kustomize/base/driver/daemonset.yaml"
CONTAINERFILE = ROOT / "Containerfile"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def bundle_user() -> tuple[int, int]:
    ctr = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["containers"][0]
    sc = ctr["securityContext"]
    return int(sc["runAsUser"]), int(sc["runAsGroup"])


def image_user() -> tuple[int, int]:
    (line,) = [x for x in CONTAINERFILE.read_text().splitlines() if x.startswith("USER ")]
    uid, _, gid = line.split()[1].partition(":")
    return int(uid), int(gid)


def _site_packages() -> str:
    import grpc as g

    return str(Path(g.__file__).resolve().parent.parent)


def python_for(uid: int, gid: int) -> list[str]:
    """A command prefix running this project's Python as uid:gid (the venv may sit in /root)."""
    if os.geteuid() != 0:
        _unavailable("needs root: the test creates root-owned kubelet directories and drops to other users")
    if shutil.which("setpriv") is None:
        _unavailable("setpriv (util-linux) is not installed")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    env = ["env", f"PYTHONPATH={_site_packages()}:{ROOT}:{HERE}", "PYTHONDONTWRITEBYTECODE=1"]
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *env]
    for py in dict.fromkeys(
        [os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"]
    ):
        if not os.path.exists(py):
            continue
        probe = subprocess.run([*prefix, py, "-c", "import grpc, yaml, driver.plugin"], capture_output=True)
        if probe.returncode == 0:
            return [*prefix, py]
    _unavailable(f"no {version} with this project's packages that uid {uid} can run (the venv is unreadable)")
    raise AssertionError("unreachable")


@pytest.fixture
def kubelet_dirs() -> Iterator[Path]:
    """Root-owned plugin and registry directories, mode 0750, as the kubelet creates them."""
    base = Path(tempfile.mkdtemp(prefix="dg-p-", dir="/tmp"))
    base.chmod(0o755)
    for name, mode in (("plugins", 0o750), ("registry", 0o750), ("cdi", 0o755)):
        (base / name).mkdir()
        (base / name).chmod(mode)
    # The driver's own files: its view of the API and a simulated driver root, readable by anyone.
    (base / "claims.json").write_text(json.dumps([make_claim("c", "uid-priv", [("gpu", "gpu-1")])]))
    (base / "claims.json").chmod(0o644)
    make_driver_root(base / "root", load_topology("h100-8x-nvlink"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _config(base: Path, plugin_base: Path) -> Path:
    cfg = base / "config.json"
    doc = {"base": str(plugin_base), "topology": "h100-8x-nvlink", "node": NODE,
           "claims": str(base / "claims.json"), "simRoot": str(plugin_base / "root")}  # fmt: skip
    cfg.write_text(json.dumps(doc))
    cfg.chmod(0o644)
    return cfg


def _start(cmd: list[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        assert proc.stderr is not None
        raise AssertionError(f"plugin exited {proc.returncode}: {proc.stderr.read()}")
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _register_and_prepare(registry: Path, plugins: Path) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{registry / 'gpu.nvidia.com-reg.sock'}") as ch:
        info = await pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=10
        )
    # The kubelet dials the endpoint the plugin advertises; here it is read on the host side.
    async with grpc.aio.insecure_channel(f"unix://{plugins / Path(info.endpoint).name}") as ch:
        req = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[claim_msg(dra_v1_pb2, make_claim("c", "uid-priv"))]
        )
        return info, await dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=30)


def test_bundle_runs_the_driver_as_root_and_the_image_user_is_not() -> None:
    assert bundle_user() == (0, 0)
    assert image_user()[0] != 0  # the webhook and certs pods use the image's non-root user


def test_plugin_as_the_bundle_user_serves_from_root_owned_0750_dirs(kubelet_dirs: Path) -> None:
    uid, gid = bundle_user()
    proc, ready = _start(
        [*python_for(uid, gid), str(HERE / "plugin_proc.py"), str(_config(kubelet_dirs, kubelet_dirs))]
    )
    try:
        assert ready["ready"] is True
        _info, resp = asyncio.run(_register_and_prepare(kubelet_dirs / "registry", kubelet_dirs / "plugins"))
        assert resp.claims["uid-priv"].error == ""
        assert [d.device_name for d in resp.claims["uid-priv"].devices] == ["gpu-1"]
    finally:
        _stop(proc)
    spec = kubelet_dirs / "cdi" / "k8s.gpu.nvidia.com-claim_uid-priv.json"
    checkpoint = kubelet_dirs / "plugins" / "checkpoint.json"
    # The container runtime reads CDI specs; only the plugin reads the checkpoint (it names every claim).
    assert stat.S_IMODE(spec.stat().st_mode) == 0o644
    assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o600


def test_the_image_user_cannot_create_the_plugin_sockets(kubelet_dirs: Path) -> None:
    """Why uid 65532 failed on a real node: the kubelet's directories are not writable to it."""
    uid, gid = image_user()
    cmd = [*python_for(uid, gid), str(HERE / "plugin_proc.py"), str(_config(kubelet_dirs, kubelet_dirs))]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "Permission denied" in res.stderr and str(kubelet_dirs / "plugins") in res.stderr
    assert not any((kubelet_dirs / "registry").iterdir())


def test_driver_run_as_the_image_user_fails_at_start_naming_the_directory(kubelet_dirs: Path) -> None:
    uid, gid = image_user()
    kubeconfig = kubelet_dirs / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    kubeconfig.chmod(0o644)
    res = subprocess.run(
        [*python_for(uid, gid), "-m", "driver.cli", "driver", "run", "--sim", "h100-8x-nvlink",
         "--node-name", NODE, "--kubeconfig", str(kubeconfig),
         "--plugin-dir", str(kubelet_dirs / "plugins" / "gpu.nvidia.com"),
         "--registry-dir", str(kubelet_dirs / "registry"), "--cdi-root", str(kubelet_dirs / "cdi"),
         "--metrics-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert re.search(rf"{kubelet_dirs}/plugins/gpu.nvidia.com: not writable by uid {uid}", res.stderr), (
        res.stderr
    )
    assert "runAsUser: 0" in res.stderr


def test_sockets_reach_the_host_through_a_private_bind_mount(kubelet_dirs: Path) -> None:
    """No mountPropagation: what the plugin creates in a bind-mounted directory is on the host."""
    if shutil.which("unshare") is None:
        _unavailable("unshare (util-linux) is not installed")
    ctr = Path(tempfile.mkdtemp(prefix="dg-c-", dir="/tmp"))
    try:
        cfg = _config(kubelet_dirs, ctr)  # the plugin sees the kubelet's directories at ctr/
        inner = f"mount --bind {kubelet_dirs} {ctr} && exec {sys.executable} {HERE / 'plugin_proc.py'} {cfg}"
        proc, ready = _start(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner])
        try:
            assert ready["ready"] is True
            info, resp = asyncio.run(
                _register_and_prepare(kubelet_dirs / "registry", kubelet_dirs / "plugins")
            )
            assert info.endpoint == str(ctr / "plugins" / "dra.sock")  # the plugin's own view
            assert resp.claims["uid-priv"].error == ""
            # The mount exists only in the plugin's namespace: the host's ctr/ is still empty.
            assert not any(ctr.iterdir())
        finally:
            _stop(proc)
        assert (kubelet_dirs / "cdi" / "k8s.gpu.nvidia.com-claim_uid-priv.json").exists()
    finally:
        shutil.rmtree(ctr, ignore_errors=True)
