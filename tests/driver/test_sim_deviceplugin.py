"""The simulated NVIDIA device plugin against real gRPC over unix sockets: the test plays the
kubelet (its Registration service on kubelet.sock, and a DevicePlugin client on the plugin's socket)."""

from __future__ import annotations

import os
import queue
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.proto import deviceplugin_v1beta1_pb2 as pb
from driver.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from driver.sim import load_topology
from driver.sim.deviceplugin import ENDPOINT, KUBELET_SOCKET, DevicePlugin, Server
from driver.sim.driverroot import make_driver_root

ROOT = Path(__file__).resolve().parents[2]


class FakeKubeletRegistration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """The kubelet's side of registration: a real gRPC server on kubelet.sock."""

    def __init__(self, directory: Path) -> None:
        self.requests: queue.Queue[Any] = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{directory / KUBELET_SOCKET}")
        self.server.start()

    def Register(self, request: Any, context: Any) -> Any:
        self.requests.put(request)
        return pb.Empty()

    def stop(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def node(short_dir: Path) -> Iterator[tuple[Any, DevicePlugin, Path, FakeKubeletRegistration]]:
    sim = load_topology("a100-4x-nvlink")
    root = short_dir / "root"
    make_driver_root(root, sim)
    plugin = DevicePlugin(sim, root)
    kdir = short_dir / "device-plugins"
    kdir.mkdir()
    kubelet = FakeKubeletRegistration(kdir)
    server = Server(plugin, kdir)
    stop = threading.Event()
    keeper = threading.Thread(target=server.keep_registered, args=(stop, 0.05), daemon=True)
    health = threading.Thread(target=plugin.watch_health, args=(50,), daemon=True)
    keeper.start()
    health.start()
    try:
        yield sim, plugin, kdir, kubelet
    finally:
        stop.set()
        plugin.stopping.set()
        keeper.join(5)
        health.join(5)
        server.stop()
        kubelet.stop()


def _stub(kdir: Path) -> Iterator[Any]:
    with grpc.insecure_channel(f"unix://{kdir / ENDPOINT}") as ch:
        yield pb_grpc.DevicePluginStub(ch)


@pytest.fixture
def stub(node: tuple[Any, DevicePlugin, Path, FakeKubeletRegistration]) -> Iterator[Any]:
    kdir, kubelet = node[2], node[3]
    req = kubelet.requests.get(timeout=10)  # the plugin registered: its socket is served
    assert req.endpoint == ENDPOINT
    yield from _stub(kdir)


def test_registers_nvidia_gpu_with_the_kubelet(node: Any) -> None:
    _sim, _plugin, kdir, kubelet = node
    req = kubelet.requests.get(timeout=10)
    assert (req.version, req.resource_name, req.endpoint) == ("v1beta1", "nvidia.com/gpu", ENDPOINT)
    assert not req.options.pre_start_required and not req.options.get_preferred_allocation_available
    assert stat.S_ISSOCK((kdir / ENDPOINT).stat().st_mode)


def test_lists_every_gpu_by_uuid_healthy(node: Any, stub: Any) -> None:
    sim = node[0]
    opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert not opts.pre_start_required and not opts.get_preferred_allocation_available
    first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    assert sorted((d.ID, d.health) for d in first.devices) == sorted((g.uuid, "Healthy") for g in sim.gpus)
    assert len(first.devices) == 4


def test_allocate_returns_uuids_and_the_simulated_device_nodes(node: Any, stub: Any) -> None:
    sim, plugin = node[0], node[1]
    g1, g3 = sim.gpus[1], sim.gpus[3]
    resp = stub.Allocate(
        pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[g1.uuid, g3.uuid]),
                                pb.ContainerAllocateRequest(devices_ids=[sim.gpus[0].uuid])]
        ),
        timeout=5,
    )  # fmt: skip
    first, second = resp.container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{g1.uuid},{g3.uuid}"}
    assert dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": sim.gpus[0].uuid}
    dev = plugin.driver_root / "dev"
    want = ["/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{g1.minor}", f"/dev/nvidia{g3.minor}"]
    assert [d.container_path for d in first.devices] == want
    assert [d.host_path for d in first.devices] == [str(dev / p[5:]) for p in want]
    assert {d.permissions for d in first.devices} == {"rw"}
    assert not first.mounts and not first.cdi_devices
    if os.geteuid() == 0:  # mknod needs root; the real node always has it
        node_of = {d.container_path: os.stat(d.host_path) for d in first.devices}
        assert all(stat.S_ISCHR(s.st_mode) for s in node_of.values())
        rdev = node_of[f"/dev/nvidia{g3.minor}"].st_rdev
        assert (os.major(rdev), os.minor(rdev)) == (195, g3.minor)


@pytest.mark.parametrize(
    "ids, message",
    [
        (["GPU-not-on-this-node"], "unknown device 'GPU-not-on-this-node'"),
        ([], "names no device"),
        ("dup", "repeats a device"),
        (["../../etc/passwd"], "unknown device '../../etc/passwd'"),
    ],
)
def test_allocate_refuses_what_a_kubelet_never_sends(node: Any, stub: Any, ids: Any, message: str) -> None:
    sim = node[0]
    if ids == "dup":
        ids = [sim.gpus[0].uuid, sim.gpus[0].uuid]
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                      timeout=5)  # fmt: skip
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_allocate_bounds_the_request(stub: Any) -> None:
    many = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])] * 65)
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(many, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 64" in err.value.details()
    huge = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x" * (2 << 20)])])
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(huge, timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_health_follows_nvml_events(node: Any, stub: Any) -> None:
    sim = node[0]
    updates = iter(stub.ListAndWatch(pb.Empty(), timeout=30))
    assert {d.health for d in next(updates).devices} == {"Healthy"}
    # An application error (XID 13) leaves the GPU usable; XID 79 (fell off the bus) does not.
    sim.simInjectXid(sim.gpus[2].uuid, 13)
    sim.simInjectXid(sim.gpus[1].uuid, 79)
    health = {d.ID: d.health for d in next(updates).devices}
    assert health == {g.uuid: "Unhealthy" if g is sim.gpus[1] else "Healthy" for g in sim.gpus}
    sim.simLoseGpu(sim.gpus[3].uuid)
    health = {d.ID: d.health for d in next(updates).devices}
    assert {u for u, h in health.items() if h == "Unhealthy"} == {sim.gpus[1].uuid, sim.gpus[3].uuid}


def test_registers_again_when_the_kubelet_restarts(node: Any) -> None:
    _sim, _plugin, kdir, kubelet = node
    kubelet.requests.get(timeout=10)
    # A starting kubelet empties its device-plugins directory and serves a new kubelet.sock.
    kubelet.stop()
    for f in kdir.iterdir():
        f.unlink()
    second = FakeKubeletRegistration(kdir)
    try:
        req = second.requests.get(timeout=10)
        assert req.resource_name == "nvidia.com/gpu"
        for s in _stub(kdir):
            assert len(next(iter(s.ListAndWatch(pb.Empty(), timeout=5))).devices) == 4
    finally:
        second.stop()


def _main(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "driver.sim.deviceplugin", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_bad_arguments_get_one_clear_line(short_dir: Path) -> None:
    done = _main("--topology", str(short_dir / "none.yaml"), "--kubelet-dir", str(short_dir),
                 "--driver-root", str(short_dir / "root"))  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(
        f"device plugin: cannot read simulated NVML topology {short_dir / 'none.yaml'}"
    )
    deep = short_dir / ("d" * 100)
    done = _main(
        "--topology", "a100-4x-nvlink", "--kubelet-dir", str(deep), "--driver-root", str(short_dir / "r")
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "unix sockets allow 107 (shorten --kubelet-dir)" in done.stderr
    assert not (short_dir / "r").exists(), "nothing is laid out before the arguments are checked"
