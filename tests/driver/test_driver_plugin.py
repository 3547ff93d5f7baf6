"""The kubelet plugin over real gRPC on unix sockets, with a test client playing the kubelet."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest
from driver_helpers import NODE, Kubelet, make_claim, make_state, opaque

from driver.checkpoint import PREPARE_COMPLETED, Checkpoint
from driver.plugin import PluginServer
from driver.registration import socket_paths

V1B1 = "resource.nvidia.com/v1beta1"


def cdi_file(base: Path, uid: str) -> Path:
    return base / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"


async def test_get_info_advertises_v1_then_v1beta1(plugin):
    server, kubelet = plugin
    info = await kubelet.register()
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.nvidia.com"
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert info.endpoint == str(server.paths.dra) and Path(info.endpoint).is_socket()
    await asyncio.wait_for(server.registration.registered.wait(), 5)


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_then_unprepare(plugin, claims, short_dir, version):
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("train", "uid-1", [("gpu", "gpu-0"), ("gpu", "gpu-3")]))
    resp = await kubelet.prepare(claim, version=version)
    entry = resp.claims["uid-1"]
    assert entry.error == ""
    assert [d.device_name for d in entry.devices] == ["gpu-0", "gpu-3"]
    assert all(d.pool_name == NODE and list(d.request_names) == ["gpu"] for d in entry.devices)
    ids = [i for d in entry.devices for i in d.cdi_device_ids]
    assert ids == ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0", "k8s.gpu.nvidia.com/claim=uid-1-gpu-3"]
    # The spec is on disk before the ids come back, and names exactly these devices.
    spec = json.loads(cdi_file(short_dir, "uid-1").read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert [d["name"] for d in spec["devices"]] == ["uid-1-gpu-0", "uid-1-gpu-3"]

    resp = await kubelet.unprepare(claim, version=version)
    assert resp.claims["uid-1"].error == ""
    assert not cdi_file(short_dir, "uid-1").exists()
    assert Checkpoint(short_dir / "plugins").load() == {}
    # Unprepare again (kubelet retries): still fine.
    resp = await kubelet.unprepare(claim, version=version)
    assert resp.claims["uid-1"].error == ""


async def test_prepare_and_unprepare_log_one_info_line_each(plugin, claims, caplog):
    """An operator reading the driver's log sees each claim come and go: which, what, how long."""
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("train", "uid-log", [("gpu", "gpu-2"), ("gpu", "gpu-5")]))
    with caplog.at_level(logging.INFO, logger="draguard.driver.state"):
        assert (await kubelet.prepare(claim)).claims["uid-log"].error == ""
        assert (await kubelet.unprepare(claim)).claims["uid-log"].error == ""
        assert (await kubelet.unprepare(claim)).claims["uid-log"].error == ""
    lines = [r for r in caplog.records if r.name == "draguard.driver.state"]
    assert [r.levelno for r in lines] == [logging.INFO] * 3, [r.getMessage() for r in lines]
    prepared, unprepared, again = (r.getMessage() for r in lines)
    claim_ref = r"claim default/train \(uid-log\): "
    assert re.fullmatch(r"prepared " + claim_ref + r"devices gpu-2,gpu-5 in \d+\.\d ms", prepared)
    assert re.fullmatch(r"unprepared " + claim_ref + r"devices gpu-2,gpu-5 in \d+\.\d ms", unprepared)
    assert re.fullmatch(r"unprepared " + claim_ref + r"nothing was prepared for it \(\d+\.\d ms\)", again)


async def test_a_refused_prepare_logs_a_warning_with_the_reason(plugin, claims, caplog):
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("ghost", "uid-ghost", [("gpu", "gpu-404")]))
    with caplog.at_level(logging.INFO, logger="draguard.driver.state"):
        err = (await kubelet.prepare(claim)).claims["uid-ghost"].error
    assert err
    [rec] = [r for r in caplog.records if r.name == "draguard.driver.state"]
    assert rec.levelno == logging.WARNING
    message = rec.getMessage()
    assert message.startswith("prepare default/ghost (uid-ghost) failed after ") and err in message


async def test_cdi_spec_has_required_fields(plugin, claims, short_dir):
    _server, kubelet = plugin
    await kubelet.register()
    claims.add(make_claim("one", "uid-cdi", [("gpu", "gpu-5")]))
    await kubelet.prepare(make_claim("one", "uid-cdi"))
    spec = json.loads(cdi_file(short_dir, "uid-cdi").read_text())
    assert spec["cdiVersion"] and spec["kind"] == "k8s.gpu.nvidia.com/claim"
    (dev,) = spec["devices"]
    nodes = [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia5"]
    env = dev["containerEdits"]["env"]
    assert len(env) == 1 and env[0].startswith("NVIDIA_VISIBLE_DEVICES=GPU-")
    common = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    # The simulated host has no /dev/nvidia-uvm-tools (like many real ones): it is not listed.
    assert common == ["/dev/nvidiactl", "/dev/nvidia-uvm"]


async def test_repeated_prepare_returns_recorded_result(plugin, claims, short_dir):
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("c", "uid-r", [("gpu", "gpu-1")]))
    first = await kubelet.prepare(claim)
    reads = claims.reads
    second = await kubelet.prepare(claim)
    assert first == second
    assert claims.reads == reads  # answered from the checkpoint, no second API read


async def test_concurrent_prepare_of_one_claim(plugin, claims, short_dir):
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("c", "uid-cc", [("gpu", "gpu-2"), ("gpu", "gpu-4")]))
    results = await asyncio.gather(*(kubelet.prepare(claim) for _ in range(8)))
    assert all(r.claims["uid-cc"].error == "" for r in results)
    assert len({r.SerializeToString(deterministic=True) for r in results}) == 1
    cp = Checkpoint(short_dir / "plugins").load()
    assert list(cp) == ["uid-cc"] and cp["uid-cc"].state == PREPARE_COMPLETED
    # Concurrent unprepare too.
    results = await asyncio.gather(*(kubelet.unprepare(claim) for _ in range(8)))
    assert all(r.claims["uid-cc"].error == "" for r in results)
    assert not cdi_file(short_dir, "uid-cc").exists()


async def test_per_claim_errors_do_not_fail_other_claims(plugin, claims, short_dir):
    _server, kubelet = plugin
    await kubelet.register()
    good = claims.add(make_claim("good", "uid-good", [("gpu", "gpu-0")]))
    missing = make_claim("missing", "uid-missing")
    unallocated = claims.add(make_claim("pending", "uid-pending", allocated=False))
    recreated = make_claim("recreated", "uid-old")
    claims.add(make_claim("recreated", "uid-new"))
    foreign = claims.add(make_claim("foreign", "uid-foreign", pool="other-node"))
    unknown = claims.add(make_claim("unknown", "uid-unknown", [("gpu", "gpu-99")]))
    resp = await kubelet.prepare(good, missing, unallocated, recreated, foreign, unknown)
    assert set(resp.claims) == {
        "uid-good",
        "uid-missing",
        "uid-pending",
        "uid-old",
        "uid-foreign",
        "uid-unknown",
    }
    assert resp.claims["uid-good"].error == "" and len(resp.claims["uid-good"].devices) == 1
    assert "default/missing not found" in resp.claims["uid-missing"].error
    assert "not allocated" in resp.claims["uid-pending"].error
    assert "uid-new" in resp.claims["uid-old"].error and "recreated" in resp.claims["uid-old"].error
    assert "pool node-a" in resp.claims["uid-foreign"].error
    assert "gpu-99" in resp.claims["uid-unknown"].error
    for uid in ("uid-missing", "uid-pending", "uid-old", "uid-foreign", "uid-unknown"):
        assert not resp.claims[uid].devices
        assert not cdi_file(short_dir, uid).exists()
    assert list(Checkpoint(short_dir / "plugins").load()) == ["uid-good"]


async def test_api_unavailable_is_a_per_claim_error(plugin, claims):
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("c", "uid-down"))
    claims.unavailable = True
    resp = await kubelet.prepare(claim)
    assert "connection refused" in resp.claims["uid-down"].error
    claims.unavailable = False
    resp = await kubelet.prepare(claim)  # the kubelet's retry succeeds once the API is back
    assert resp.claims["uid-down"].error == ""


async def test_only_this_drivers_results_are_prepared(plugin, claims):
    _server, kubelet = plugin
    await kubelet.register()
    claim = make_claim("mixed", "uid-mixed", [("gpu", "gpu-0")])
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth0"}
    )
    claims.add(claim)
    resp = await kubelet.prepare(claim)
    assert [d.device_name for d in resp.claims["uid-mixed"].devices] == ["gpu-0"]


async def test_time_slicing_config_is_applied_through_nvml(short_dir, claims):
    state = make_state(short_dir, claims, topology="h100-8x-nvlink")
    server = PluginServer(
        state, driver_name="gpu.nvidia.com", plugin_dir=short_dir / "p", registry_dir=short_dir / "r"
    )
    await server.start()
    kubelet = Kubelet(server.paths.registration)
    try:
        await kubelet.register()
        cfg = opaque(
            {
                "apiVersion": V1B1,
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            }
        )
        claim = claims.add(make_claim("ts", "uid-ts", [("gpu", "gpu-6")], config=[cfg]))
        resp = await kubelet.prepare(claim)
        assert resp.claims["uid-ts"].error == ""
        sim = state.nvml.lib  # the simulated NVML records what was set
        gpu6 = next(g for g in sim.gpus if g.minor == 6)
        assert gpu6.timeslice == 3  # Long
        assert all(g.timeslice is None for g in sim.gpus if g.minor != 6)
    finally:
        await kubelet.close()
        await server.stop(0)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"}, "resource.nvidia.com/v1beta1"),
        ({"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}, "MPS is not supported"),
        ({"apiVersion": V1B1, "kind": "MigDeviceConfig"}, "cannot be applied to devices of type gpu"),
        (
            {"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "bogus": 1}},
            "sharing.bogus: unknown field",
        ),
    ],
)
async def test_bad_or_unsupported_config_is_a_per_claim_error(plugin, claims, short_dir, params, needle):
    _server, kubelet = plugin
    await kubelet.register()
    claim = claims.add(make_claim("cfg", "uid-cfg", [("gpu", "gpu-1")], config=[opaque(params, ["gpu"])]))
    resp = await kubelet.prepare(claim)
    assert needle in resp.claims["uid-cfg"].error
    assert not cdi_file(short_dir, "uid-cfg").exists()
    assert Checkpoint(short_dir / "plugins").load() == {}


async def test_time_slicing_unsupported_gpu_rolls_back(short_dir, claims, tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text(
        "driverVersion: '550.54.15'\ncudaDriverVersion: 12040\ngpus:\n"
        "- {name: NVIDIA L4, uuid: GPU-aaaa, architecture: Ada Lovelace, computeCapability: '8.9',\n"
        "   memoryBytes: 24152899584, pciBusId: '00000000:01:00.0', timeSlicingSupported: false}\n"
    )
    state = make_state(short_dir, claims, topology=str(topo))
    cfg = opaque({"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})
    claims.add(make_claim("ts", "uid-nots", [("gpu", "gpu-0")], config=[cfg]))
    from driver.state import ClaimRef

    out = await asyncio.to_thread(state.prepare, ClaimRef("default", "ts", "uid-nots"))
    assert "time-slicing is not supported" in out.error
    assert not cdi_file(short_dir, "uid-nots").exists()
    assert Checkpoint(short_dir / "plugins").load() == {}


async def test_config_precedence_claim_over_class_and_named_request(short_dir, claims):
    state = make_state(short_dir, claims)
    ts = {
        "apiVersion": V1B1,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
    }
    ts_long = {**ts, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
    ts_med = {**ts, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}}
    config = [opaque(ts_long, source="FromClaim"), opaque(ts, source="FromClass"), opaque(ts_med, ["b"])]
    claims.add(make_claim("p", "uid-p", [("a", "gpu-0"), ("b", "gpu-1")], config=config))
    from driver.state import ClaimRef

    out = await asyncio.to_thread(state.prepare, ClaimRef("default", "p", "uid-p"))
    assert out.error == ""
    slices = {g.minor: g.timeslice for g in state.nvml.lib.gpus}
    assert slices[0] == 3  # claim config (Long) beats the class config (Short)
    assert slices[1] == 2  # a config naming request "b" beats configs without requests


async def test_restart_with_changed_version_then_unprepare(short_dir, claims):
    old = make_state(short_dir, claims, version="0.0.9")
    server = PluginServer(
        old, driver_name="gpu.nvidia.com", plugin_dir=short_dir / "p", registry_dir=short_dir / "r"
    )
    await server.start()
    kubelet = Kubelet(server.paths.registration)
    claim = claims.add(make_claim("v", "uid-v", [("gpu", "gpu-7")]))
    await kubelet.register()
    assert (await kubelet.prepare(claim)).claims["uid-v"].error == ""
    await kubelet.close()
    await server.stop(0)
    assert Checkpoint(short_dir / "plugins").load()["uid-v"].driver_version == "0.0.9"

    new = make_state(short_dir, claims, version="0.2.0-rc.1")
    report = new.recover()
    assert report.kept == ["uid-v"]
    server = PluginServer(
        new, driver_name="gpu.nvidia.com", plugin_dir=short_dir / "p", registry_dir=short_dir / "r"
    )
    await server.start()
    kubelet = Kubelet(server.paths.registration)
    try:
        await kubelet.register()
        again = await kubelet.prepare(claim)  # still prepared: answered from the old version's record
        assert [d.device_name for d in again.claims["uid-v"].devices] == ["gpu-7"]
        claims.delete("default", "v")  # unprepare must not need the API object
        resp = await kubelet.unprepare(claim)
        assert resp.claims["uid-v"].error == ""
        assert not cdi_file(short_dir, "uid-v").exists()
        assert Checkpoint(short_dir / "plugins").load() == {}
    finally:
        await kubelet.close()
        await server.stop(0)


async def test_rolling_update_sockets_overlap(short_dir, claims):
    """Old and new plugin pods serve at the same time on their own per-pod-UID sockets."""
    claims.add(make_claim("ru", "uid-ru", [("gpu", "gpu-0")]))
    servers, kubelets = [], []
    for pod in ("pod-old", "pod-new"):
        state = make_state(short_dir, claims)
        s = PluginServer(
            state,
            driver_name="gpu.nvidia.com",
            plugin_dir=short_dir / "p",
            registry_dir=short_dir / "r",
            pod_uid=pod,
        )
        await s.start()
        servers.append(s)
        kubelets.append(Kubelet(s.paths.registration))
    try:
        assert servers[0].paths == socket_paths(short_dir / "p", short_dir / "r", "gpu.nvidia.com", "pod-old")
        assert servers[0].paths.registration.name == "gpu.nvidia.com-pod-old-reg.sock"
        assert servers[1].paths.dra.name == "dra-pod-new.sock"
        infos = [await k.register() for k in kubelets]
        assert infos[0].endpoint != infos[1].endpoint
        # Prepare through the old pod, then the old pod goes away; the new one answers from the checkpoint.
        r1 = await kubelets[0].prepare(make_claim("ru", "uid-ru"))
        await kubelets[0].close()
        await servers[0].stop(0)
        assert not servers[0].paths.registration.exists()
        assert servers[1].paths.registration.is_socket()
        r2 = await kubelets[1].prepare(make_claim("ru", "uid-ru"))
        assert r1 == r2
    finally:
        await kubelets[1].close()
        await servers[1].stop(0)


async def test_metrics_count_prepares_and_errors(short_dir, claims):
    from driver.metrics import DriverMetrics
    from driver.state import ClaimRef

    state = make_state(short_dir, claims)
    state.metrics = m = DriverMetrics()
    claims.add(make_claim("m", "uid-m"))
    state.prepare(ClaimRef("default", "m", "uid-m"))
    state.prepare(ClaimRef("default", "nope", "uid-nope"))
    state.unprepare(ClaimRef("default", "m", "uid-m"))
    val = m.registry.get_sample_value
    assert val("dra_plugin_prepare_total", {"result": "success"}) == 1
    assert val("dra_plugin_prepare_total", {"result": "error"}) == 1
    assert val("dra_plugin_errors_total", {"operation": "prepare"}) == 1
    assert val("dra_plugin_unprepare_total", {"result": "success"}) == 1
    assert val("dra_plugin_prepare_duration_seconds_count") == 2


def test_metrics_every_error_series_starts_at_zero_and_counts_its_operation():
    from driver.metrics import OPERATIONS, DriverMetrics

    m = DriverMetrics()
    val = m.registry.get_sample_value
    # An alert reads these through increase(): each must exist before its first error.
    assert {op: val("dra_plugin_errors_total", {"operation": op}) for op in OPERATIONS} == dict.fromkeys(
        ("publish", "prepare", "unprepare", "nvml"), 0.0
    )
    m.published(True)
    m.published(False)
    m.unprepared(False, 0.01)
    m.nvml_error("nvmlDeviceGetCount")
    assert val("dra_plugin_slice_publishes_total", {"result": "success"}) == 1
    assert val("dra_plugin_slice_publishes_total", {"result": "error"}) == 1
    assert val("dra_plugin_errors_total", {"operation": "publish"}) == 1
    assert val("dra_plugin_unprepare_total", {"result": "error"}) == 1
    assert val("dra_plugin_errors_total", {"operation": "unprepare"}) == 1
    assert val("dra_plugin_errors_total", {"operation": "nvml"}) == 1
    assert val("dra_plugin_nvml_errors_total", {"call": "nvmlDeviceGetCount"}) == 1
    assert val("dra_plugin_errors_total", {"operation": "prepare"}) == 0
