"""GPU health: XID events and lost GPUs end in tainted devices; a bad GPU never stops the node.

Unit parts use the simulated NVML in-process; the end-to-end part runs `draguard driver run` against
a real kube-apiserver and injects events through the simulator's events file, as a node would.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from driver_helpers import NODE, InMemoryClaims, Kubelet, make_claim, make_state

from driver.devices import build_devices
from driver.health import HealthTracker, XidWatcher, carry_lost
from driver.nvml import open_sim
from driver.sim import TOPOLOGY_DIR
from driver.slices import build_slices, validate_slices
from driver.state import ClaimRef
from tests.apiserver import ApiServer, find_bin, start

ROOT = Path(__file__).resolve().parents[2]


def topology(tmp: Path, name: str, edit: Any) -> Path:
    doc = yaml.safe_load((TOPOLOGY_DIR / f"{name}.yaml").read_text())
    edit(doc)
    out = tmp / f"{name}-edited.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def test_xids_become_taints_and_application_xids_do_not() -> None:
    nvml = open_sim("a100-4x-mig")
    devices = build_devices(nvml.enumerate())
    gpu0 = nvml.lib.gpus[0].uuid
    tracker = HealthTracker()
    assert tracker.xid(gpu0, 13) is False  # an application's illegal memory access
    assert all(not d.taints for d in tracker.apply(devices))
    assert tracker.xid(gpu0, 63) is True  # row remapping pending: no new work
    tainted = {d.name: d.taints for d in tracker.apply(devices) if d.taints}
    assert set(tainted) == {"gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"}  # both MIG devices of GPU 0
    (t,) = tainted["gpu-0-mig-3g20gb-9-0"]
    assert (t["key"], t["value"], t["effect"]) == ("gpu.nvidia.com/unhealthy", "xid-63", "NoSchedule")
    assert tracker.xid(gpu0, 79) is True  # fallen off the bus: evict too
    assert tracker.apply(devices)[0].taints[0]["effect"] == "NoExecute"
    assert tracker.apply(devices)[0].taints[0]["timeAdded"] == t["timeAdded"]  # the first sighting
    slices = build_slices(tracker.apply(devices), node_name=NODE, driver_name="gpu.nvidia.com", generation=0)
    validate_slices(slices)
    assert slices[0]["spec"]["devices"][0]["taints"][0]["value"] == "xid-79"


def test_xid_watcher_sees_an_injected_event() -> None:
    nvml = open_sim("h100-8x-nvlink")
    node = nvml.enumerate()
    seen = threading.Event()
    tracker = HealthTracker(on_change=seen.set)
    watcher = XidWatcher(nvml, tracker, [g.uuid for g in node.gpus], poll_ms=200)
    watcher.start()
    try:
        nvml.lib.simInjectXid(node.gpus[5].uuid, 48)  # double-bit ECC error
        assert seen.wait(10)
        assert tracker.snapshot() == {node.gpus[5].uuid: "xid-48"}
        assert watcher.alive()
    finally:
        watcher.stop()
    assert not watcher.alive() or watcher.uuids == []


def test_a_gpu_lost_at_run_time_is_tainted_by_the_watcher_without_an_inventory_read() -> None:
    nvml = open_sim("h100-8x-nvlink")
    node = nvml.enumerate()
    changed = threading.Event()
    tracker = HealthTracker(on_change=changed.set)
    watcher = XidWatcher(nvml, tracker, [g.uuid for g in node.gpus], poll_ms=60_000)
    watcher.start()
    try:
        reads = nvml.lib.calls
        nvml.lib.simLoseGpu(node.gpus[3].uuid)
        # The wait answers GPU_IS_LOST long before its 60 s timeout; only GPU 3 is marked.
        assert changed.wait(10)
        assert tracker.snapshot() == {node.gpus[3].uuid: "gpu-lost"}
        assert watcher.uuids == [g.uuid for g in node.gpus if g.index != 3]
        # The watcher goes on with the other seven: an XID on one of them still arrives.
        changed.clear()
        nvml.lib.simInjectXid(node.gpus[6].uuid, 63)
        assert changed.wait(10)
        assert tracker.snapshot() == {node.gpus[3].uuid: "gpu-lost", node.gpus[6].uuid: "xid-63"}
        assert watcher.alive() and watcher.error == ""
        assert nvml.lib.calls - reads < 100  # one probe per GPU and a fresh event set, no inventory
    finally:
        watcher.stop()


def test_a_lost_answer_that_no_gpu_confirms_taints_nothing(tmp_path: Path) -> None:
    # Every event wait answers GPU_IS_LOST, yet each GPU still reads fine: no GPU is tainted on
    # suspicion (NVIDIA's drivers would mark all eight), the error is kept for the probes.
    path = topology(tmp_path, "h100-8x-nvlink", lambda d: d.update(faults={"nvmlEventSetWait_v2": 15}))
    nvml = open_sim(path)
    node = nvml.enumerate()
    tracker = HealthTracker()
    watcher = XidWatcher(nvml, tracker, [g.uuid for g in node.gpus], poll_ms=50)
    watcher.start()
    try:
        _until("the wait's lost answer recorded", lambda: "error 15" in watcher.error, timeout=10)
        assert tracker.snapshot() == {}
        assert watcher.uuids == [g.uuid for g in node.gpus] and watcher.alive()
    finally:
        watcher.stop()


def test_a_gpu_lost_at_run_time_is_isolated_kept_tainted_and_refused(short_dir: Path) -> None:
    claims = InMemoryClaims()
    state = make_state(short_dir, claims, topology="h100-8x-nvlink")
    assert state.nvml is not None
    before = state.nvml.enumerate()
    devices = build_devices(before)
    lost = before.gpus[3]
    state.nvml.lib.simLoseGpu(lost.uuid)
    after = state.nvml.enumerate()  # no exception: the other seven are read
    assert [g.minor for g in after.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert [(f.index, f.uuid) for f in after.failed] == [(3, None)]  # a lost GPU cannot tell its UUID
    tracker = HealthTracker()
    fresh = carry_lost(devices, before.gpus, after.failed, build_devices(after), tracker)
    assert [d.name for d in fresh] == [d.name for d in devices]  # still published ...
    (t,) = {d.name: d for d in tracker.apply(fresh)}["gpu-3"].taints  # ... with a NoExecute taint
    assert (t["value"], t["effect"]) == ("gpu-lost", "NoExecute")
    state.health = tracker
    claims.add(make_claim("c", "uid-lost", [("gpu", "gpu-3")]))
    err = state.prepare(ClaimRef("default", "c", "uid-lost")).error
    assert "device gpu-3 is unhealthy (gpu-lost)" in err
    claims.add(make_claim("d", "uid-ok", [("gpu", "gpu-4")]))
    assert state.prepare(ClaimRef("default", "d", "uid-ok")).error == ""


def test_multi_ci_mig_me_profiles_and_numa_nodes(tmp_path: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        gpu = doc["gpus"][0]
        gpu["numaNode"] = 1
        first = gpu["mig"]["devices"][0]
        two_cis = []
        for ci in (0, 1):  # one 3g.20gb GPU instance split into two compute instances
            d = dict(
                first, computeInstanceId=ci, computeInstanceSlices=1, uuid=f"MIG-ci{ci}-{first['uuid'][4:]}"
            )
            d["profile"] = "1c.3g.20gb"
            d["multiprocessors"] = 14
            two_cis.append(d)
        gpu["mig"]["devices"][0:1] = two_cis
        me = doc["gpus"][1]["mig"]["devices"][1]
        me.update(profile="1g.10gb+me", giProfileId=20, placement={"start": 6, "size": 1})

    node = open_sim(topology(tmp_path, "a100-4x-mig", edit)).enumerate()
    devs = {d.name: d for d in build_devices(node)}  # no "duplicate device names"
    assert {"gpu-0-mig-1c3g20gb-9-0-0", "gpu-0-mig-1c3g20gb-9-0-1", "gpu-1-mig-1g10gb-me-20-6"} <= set(devs)
    assert devs["gpu-0-mig-1c3g20gb-9-0-1"].ci_id == 1
    assert devs["gpu-0-mig-3g20gb-9-4"].attributes["numaNode"] == ("int", 1)
    # The standard key a selector written for any driver uses, with the same value.
    assert devs["gpu-0-mig-3g20gb-9-4"].attributes["resource.kubernetes.io/numaNode"] == ("int", 1)
    assert "numaNode" not in devs["gpu-1-mig-1g10gb-me-20-6"].attributes  # GPU 1 has no NUMA affinity
    assert "resource.kubernetes.io/numaNode" not in devs["gpu-1-mig-1g10gb-me-20-6"].attributes
    validate_slices(
        build_slices(list(devs.values()), node_name=NODE, driver_name="gpu.nvidia.com", generation=0)
    )


# --- end to end: the driver process against a real kube-apiserver ------------------------------

BIN = find_bin()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ApiServer]:
    if BIN is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("kube-apiserver/etcd binaries not built", pytrace=False)
        pytest.skip("kube-apiserver/etcd binaries not built (see DRAGUARD_K8S_BIN)")
    base = Path(tempfile.mkdtemp(prefix="dg-hapi-", dir="/tmp"))
    server = start(BIN, base)
    server.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def _probe(port: int, what: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{what}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _until(what: str, fn: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _devices(server: ApiServer) -> dict[str, dict[str, Any]]:
    items = server.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return {d["name"]: d for s in items if s["spec"]["pool"]["name"] == NODE for d in s["spec"]["devices"]}


@pytest.mark.e2e
def test_driver_process_taints_devices_on_xid_and_reports_probes(apiserver: ApiServer) -> None:
    base = Path(tempfile.mkdtemp(prefix="dg-h-", dir="/tmp"))
    events = base / "events.jsonl"
    events.write_text("")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    env["DRAGUARD_NVML_SIM_EVENTS"] = str(events)
    with open(base / "driver.log", "w") as log_file:  # the child keeps its own descriptor
        proc = _spawn(log_file,
        [sys.executable, "-m", "driver.cli", "driver", "run", "--sim", "h100-8x-nvlink", "--node-name", NODE,
         "--kubeconfig", str(apiserver.kubeconfig), "--plugin-dir", str(base / "plugins"),
         "--registry-dir", str(base / "registry"), "--cdi-root", str(base / "cdi"), "--metrics-port", "0",
         "--health-port", str(port), "--resync-seconds", "3600"],
        env=env)  # fmt: skip
    try:
        _until("startup probe", lambda: _probe(port, "startupz")[0] == 200 if _port_open(port) else False)
        assert len(_devices(apiserver)) == 8
        code, body = _probe(port, "readyz")
        assert code == 503 and body["registered"] is False  # no kubelet has registered it yet
        assert _probe(port, "livez")[0] == 200
        import asyncio

        asyncio.run(_register(base / "registry" / "gpu.nvidia.com-reg.sock"))
        _until("readiness after registration", lambda: _probe(port, "readyz")[0] == 200)
        gpu2 = _devices(apiserver)["gpu-2"]["attributes"]["uuid"]["string"]
        with events.open("a") as f:
            f.write(json.dumps({"uuid": gpu2, "xid": 79}) + "\n")
        tainted = _until("a taint on gpu-2", lambda: _devices(apiserver)["gpu-2"].get("taints"), timeout=30)
        assert [(t["key"], t["value"], t["effect"]) for t in tainted] == [
            ("gpu.nvidia.com/unhealthy", "xid-79", "NoExecute")
        ]
        assert not any(d.get("taints") for n, d in _devices(apiserver).items() if n != "gpu-2")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def _spawn(log_file: Any, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log_file)


async def _register(socket_path: Path) -> None:
    kubelet = Kubelet(socket_path)  # the channel belongs to this event loop
    await kubelet.register()
    await kubelet.close()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.e2e
def test_node_without_gpus_starts_and_publishes_nothing(apiserver: ApiServer, tmp_path: Path) -> None:
    """Real NVML, no NVIDIA driver: nvmlInit fails, the driver still serves.

    The node's /dev and /proc are given as an empty host root, so the test does not depend on what
    this machine's own /dev holds.
    """
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    base = Path(tempfile.mkdtemp(prefix="dg-n-", dir="/tmp"))
    (base / "host").mkdir()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "driver.cli", "driver", "run", "--real", "--node-name", "node-nogpu",
         "--kubeconfig", str(apiserver.kubeconfig), "--plugin-dir", str(base / "plugins"),
         "--registry-dir", str(base / "registry"), "--cdi-root", str(base / "cdi"), "--metrics-port", "0",
         "--health-port", str(port), "--dev-root", str(base / "host"), "--proc-root", str(base / "host")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = False
    try:
        _until("startup probe", lambda: _port_open(port) and _probe(port, "startupz")[0] == 200)
        started = True
        items = apiserver.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        assert [s for s in items if s["spec"]["pool"]["name"] == "node-nogpu"] == []
        assert (base / "registry" / "gpu.nvidia.com-reg.sock").exists()
        assert proc.poll() is None
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
        assert started, err
    assert "no NVIDIA driver on this node" in err and "serving no devices" in err


def test_daemonset_probes_ask_the_port_and_paths_the_driver_serves() -> None:
    ds = yaml.safe_load((ROOT / "kustomize/base/driver/daemonset.yaml").read_text())
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    port = c["args"][c["args"].index("--health-port") + 1]
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["health"] == int(port)
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert {k: (v["path"], v["port"]) for k, v in probes.items()} == {
        "startupProbe": ("/startupz", "health"),
        "readinessProbe": ("/readyz", "health"),
        "livenessProbe": ("/livez", "health"),
    }
    # The local overlay replaces the arguments: it must keep the probe port too.
    local = yaml.safe_load((ROOT / "kustomize/overlays/local/driver-sim.yaml").read_text())
    args = local["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--health-port") + 1] == port


@pytest.mark.e2e
def test_driver_refuses_a_node_another_gpu_driver_serves(apiserver: ApiServer) -> None:
    node = "node-nvidia"
    apiserver.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    )
    theirs = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "nvidia-owned"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }  # fmt: skip
    apiserver.request("POST", "/apis/resource.k8s.io/v1/resourceslices", theirs)
    base = Path(tempfile.mkdtemp(prefix="dg-x-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "driver.cli", "driver", "run", "--sim", "h100-8x-nvlink", "--node-name", node,
         "--kubeconfig", str(apiserver.kubeconfig), "--plugin-dir", str(base / "plugins"),
         "--registry-dir", str(base / "registry"), "--cdi-root", str(base / "cdi"), "--metrics-port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def events() -> list[dict[str, Any]]:
        items = apiserver.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")["items"]
        return [e for e in items if e["regarding"].get("name") == node]

    try:
        (ev,) = _until("a Node event", events)
        assert (ev["type"], ev["reason"], ev["regarding"]["kind"]) == (
            "Warning",
            "ConflictingGPUDriver",
            "Node",
        )
        assert "nvidia-owned" in ev["note"] and "uninstall NVIDIA's DRA driver" in ev["note"]
        slices = apiserver.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        assert [s["metadata"]["name"] for s in slices if s["spec"]["nodeName"] == node] == ["nvidia-owned"]
        assert not (base / "registry").exists() or not any((base / "registry").iterdir())  # never registered
        assert proc.poll() is None
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    assert "refusing to serve GPUs on node node-nvidia" in err and "Traceback" not in err


@pytest.mark.e2e
def test_device_plugin_capacity_counts_as_a_conflict(apiserver: ApiServer) -> None:
    from driver.coexist import find_conflicts
    from driver.slices import SlicePublisher

    node = "node-devplugin"
    apiserver.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    )
    pub = SlicePublisher.from_kubeconfig(str(apiserver.kubeconfig), node, "gpu.nvidia.com")
    assert find_conflicts(pub.api, node, "gpu.nvidia.com", "v1") == []
    obj = apiserver.request("GET", f"/api/v1/nodes/{node}")
    obj.setdefault("status", {})["capacity"] = {"nvidia.com/gpu": "8"}  # what the device plugin reports
    apiserver.request("PUT", f"/api/v1/nodes/{node}/status", obj)
    (why,) = find_conflicts(pub.api, node, "gpu.nvidia.com", "v1")
    assert "capacity nvidia.com/gpu=8" in why and "device plugin" in why
    # Its own slices (labelled by draguard) are no conflict.
    devices = build_devices(open_sim("mixed-nvlink-pairs").enumerate())
    other = SlicePublisher.from_kubeconfig(str(apiserver.kubeconfig), "node-nvidia-free", "gpu.nvidia.com")
    apiserver.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                "metadata": {"name": "node-nvidia-free"}})  # fmt: skip
    other.publish(devices)
    assert find_conflicts(other.api, "node-nvidia-free", "gpu.nvidia.com", "v1") == []


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_kubelet_health_stream_reports_an_xid_on_the_dra_socket(short_dir: Path, version: str) -> None:
    """The kubelet's DRA health service (KEP-4680), as kubelet 1.37 calls it (v1, or v1alpha1)."""
    import grpc

    from driver.plugin import HEALTH_SERVICES, HealthFeed, PluginServer
    from driver.proto import dra_health_v1_pb2, dra_health_v1alpha1_pb2

    pb = dra_health_v1_pb2 if version == "v1" else dra_health_v1alpha1_pb2
    state = make_state(short_dir, InMemoryClaims(), topology="a100-4x-mig")
    tracker = HealthTracker()
    feed = HealthFeed(NODE, lambda: list(state.devices.values()), tracker.reason, poll=0.05)
    server = PluginServer(state, driver_name="gpu.nvidia.com", plugin_dir=short_dir / "plugins",
                          registry_dir=short_dir / "registry", health=feed)  # fmt: skip
    await server.start()
    kubelet = Kubelet(server.paths.registration)
    try:
        # Kubelet 1.37 opens the health stream only for a plugin whose registration names the service.
        info = await kubelet.register()
        assert list(info.supported_versions) == [
            "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth",
        ]  # fmt: skip
        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as ch:
            watch = ch.unary_stream(
                f"/{HEALTH_SERVICES[version]}/NodeWatchResources",
                request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
                response_deserializer=pb.NodeWatchResourcesResponse.FromString,
            )
            stream = watch(pb.NodeWatchResourcesRequest(), timeout=30)
            first = await stream.read()
            assert len(first.devices) == 8 and {d.health for d in first.devices} == {pb.HEALTHY}
            # Longer than the resend interval: a steady device never turns Unknown between reports.
            assert {d.health_check_timeout_seconds for d in first.devices} == {90}
            assert {d.device.pool_name for d in first.devices} == {NODE}
            assert state.nvml is not None
            tracker.xid(state.nvml.lib.gpus[1].uuid, 79)
            update = await stream.read()
            bad = {d.device.device_name: d.message for d in update.devices if d.health == pb.UNHEALTHY}
            assert bad == {
                "gpu-1-mig-3g20gb-9-0": "xid-79 (NoExecute)",
                "gpu-1-mig-3g20gb-9-4": "xid-79 (NoExecute)",
            }
            assert len(update.devices) == 8 and all(d.last_updated_time > 0 for d in update.devices)
            stream.cancel()
    finally:
        await kubelet.close()
        await server.stop(0)


def test_a_node_with_a_driver_but_no_usable_nvml_fails_at_start(tmp_path: Path) -> None:
    """/dev/nvidiactl present but no libnvidia-ml under the driver root: a misconfiguration, not 'no GPUs'."""
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    (tmp_path / "host/dev").mkdir(parents=True)
    (tmp_path / "host/dev/nvidiactl").write_text("")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DRAGUARD_NVML_SIM", "DRIVER_ROOT")}
    p = subprocess.run(
        [sys.executable, "-m", "driver.cli", "driver", "run", "--real", "--node-name", NODE,
         "--kubeconfig", str(tmp_path / "kubeconfig"), "--plugin-dir", str(tmp_path / "plugins"),
         "--registry-dir", str(tmp_path / "registry"), "--cdi-root", str(tmp_path / "cdi"),
         "--dev-root", str(tmp_path / "host"), "--proc-root", str(tmp_path / "host")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 1 and "NVML is not usable on this machine" in p.stderr
    assert "Traceback" not in p.stderr
