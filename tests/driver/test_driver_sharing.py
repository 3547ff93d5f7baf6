"""Sharing a GPU by consumable capacity (KEP-5075): what is published; shares through the kubelet API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from driver_helpers import NODE, InMemoryClaims, Kubelet, make_claim, make_state, opaque
from test_driver_crash import PluginProcess

from driver.checkpoint import PREPARE_STARTED, Checkpoint
from driver.cli import main as driver_main
from driver.devices import build_devices
from driver.nvml import open_sim
from driver.plugin import PluginServer
from driver.sharing import CapacitySharing, QuantityError, parse_capacity_sharing, parse_quantity
from driver.slices import build_slices, slice_devices, validate_slices

GI = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
H100_MEMORY = 81559 * (1 << 20)  # what the simulated H100 reports
V1B1 = "resource.nvidia.com/v1beta1"


def share_claim(
    name: str, uid: str, shares: list[tuple[str, str, str, str | None]], **kw: Any
) -> dict[str, Any]:
    """A claim allocated to shares: (request, device, shareID, consumed memory or None)."""
    obj = make_claim(name, uid, [(req, dev) for req, dev, _s, _m in shares], **kw)
    for result, (_req, _dev, share, memory) in zip(
        obj["status"]["allocation"]["devices"]["results"], shares, strict=True
    ):
        result["shareID"] = share
        if memory is not None:
            result["consumedCapacity"] = {"memory": memory}
    return obj


def cdi_spec(base: Path, uid: str) -> dict[str, Any]:
    return json.loads((base / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())


def env_of(spec: dict[str, Any], device: str) -> dict[str, str]:
    (dev,) = [d for d in spec["devices"] if d["name"] == device]
    return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])


@pytest.fixture
async def shared(short_dir: Path, claims: InMemoryClaims) -> AsyncIterator[Kubelet]:
    """The plugin with every H100 shared by capacity, registered with a kubelet."""
    state = make_state(short_dir, claims, sharing=CapacitySharing())
    server = PluginServer(
        state,
        driver_name="gpu.nvidia.com",
        plugin_dir=short_dir / "plugins",
        registry_dir=short_dir / "registry",
    )
    await server.start()
    kubelet = Kubelet(server.paths.registration)
    await kubelet.register()
    try:
        yield kubelet
    finally:
        await kubelet.close()
        await server.stop(0)


# --- what is published ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_shared_gpus_publish_multiple_allocations_and_a_memory_policy(version):
    node = open_sim("mixed-nvlink-pairs").enumerate()
    names = sorted({g.name for g in node.gpus})
    assert len(names) >= 2, names
    devices = build_devices(node, sharing=CapacitySharing(frozenset({names[0]})))
    slices = build_slices(
        devices, node_name=NODE, driver_name="gpu.nvidia.com", generation=0, version=version
    )
    validate_slices(slices)
    by_name = {d["name"]: d for s in slices for d in slice_devices(s)}
    for gpu in node.gpus:
        dev = by_name[f"gpu-{gpu.minor}"]
        if gpu.name != names[0]:  # a model not named keeps being one claim's
            assert "allowMultipleAllocations" not in dev and "requestPolicy" not in dev["capacity"]["memory"]
            continue
        assert dev["allowMultipleAllocations"] is True
        memory = gpu.memory_bytes
        assert memory is not None
        policy = dev["capacity"]["memory"]["requestPolicy"]
        assert parse_quantity(dev["capacity"]["memory"]["value"]) == memory
        assert (
            parse_quantity(policy["validRange"]["min"]) == GI == parse_quantity(policy["validRange"]["step"])
        )
        default = parse_quantity(policy["default"])
        assert default % GI == 0 and 0 <= memory - default < GI  # a silent claim leaves no room for a share
        assert parse_quantity(policy["validRange"]["max"]) == default  # on the step grid, as the API wants
    if version == "v1beta1":
        assert all("basic" in d for s in slices for d in s["spec"]["devices"])


def test_gpus_in_mig_mode_are_never_shared_by_capacity():
    node = open_sim("a100-4x-mig").enumerate()
    devices = build_devices(node, sharing=CapacitySharing())
    migs = [d for d in devices if d.type == "mig"]
    assert migs and all(d.shared is None for d in migs)
    assert all(d.shared is not None for d in devices if d.type == "gpu")


def test_inventory_command_publishes_the_setting(capsys):
    assert driver_main(["driver", "inventory", "--sim", "h100-8x-nvlink", "-o", "json",
                        "--share-by-capacity", H100, "--share-memory-step", "4Gi"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    devices = [d for s in doc["items"] for d in s["spec"]["devices"]]
    assert len(devices) == 8 and all(d["allowMultipleAllocations"] for d in devices)
    assert {d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] for d in devices} == {"4Gi"}
    assert {d["capacity"]["memory"]["requestPolicy"]["default"] for d in devices} == {"76Gi"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--share-by-capacity", "all", "--share-memory-step", "lots"],
            "--share-memory-step: 'lots' is not a quantity",
        ),
        (["--share-by-capacity", "all", "--share-memory-step", "512Ki"], "below 1Mi"),
        (["--share-by-capacity", " , "], "--share-by-capacity: give `all` or GPU product names"),
    ],
)
def test_a_bad_sharing_setting_is_one_clear_line(capsys, argv, message):
    assert driver_main(["driver", "inventory", "--sim", "h100-8x-nvlink", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "value"),
    [("10Gi", 10 * GI), ("1.5Gi", 3 * GI // 2), ("12e9", 12 * 10**9), ("1k", 1000), ("0.5", 1)],
)
def test_quantities_read_as_bytes_rounded_up(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1Gi", "1e99999", "1" * 80, 12, None, "1Gi "])
def test_hostile_quantities_are_refused(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_setting_off_by_default():
    assert parse_capacity_sharing(None) is None and parse_capacity_sharing("") is None


# --- prepare and unprepare through the kubelet's API ---------------------------------------------


async def test_two_pods_share_one_gpu_each_with_its_own_cdi_device_and_limit(shared, claims, short_dir):
    a = claims.add(share_claim("a", "uid-a", [("gpu", "gpu-0", "share-a", "30Gi")]))
    b = claims.add(share_claim("b", "uid-b", [("gpu", "gpu-0", "share-b", "40Gi")]))
    resp = await shared.prepare(a, b)
    for uid, share, limit in (("uid-a", "share-a", 30 * GI), ("uid-b", "share-b", 40 * GI)):
        entry = resp.claims[uid]
        assert entry.error == ""
        (dev,) = entry.devices
        assert dev.device_name == "gpu-0" and dev.share_id == share
        assert list(dev.cdi_device_ids) == [f"k8s.gpu.nvidia.com/claim={uid}-gpu-0-{share}"]
        env = env_of(cdi_spec(short_dir, uid), f"{uid}-gpu-0-{share}")
        uuid = env["NVIDIA_VISIBLE_DEVICES"]
        assert uuid.startswith("GPU-")
        assert env["DRAGUARD_GPU_MEMORY_LIMIT"] == str(limit)
        assert env["DRAGUARD_GPU_MEMORY_LIMITS"] == f"{uuid}={limit}"
    recorded = Checkpoint(short_dir / "plugins").load()
    assert {(p.share_id, p.consumed_memory) for e in recorded.values() for p in e.devices} == {
        ("share-a", 30 * GI),
        ("share-b", 40 * GI),
    }

    # Unpreparing one share leaves the other exactly as it was.
    before = cdi_spec(short_dir, "uid-b")
    assert (await shared.unprepare(a)).claims["uid-a"].error == ""
    assert not (short_dir / "cdi" / "k8s.gpu.nvidia.com-claim_uid-a.json").exists()
    assert cdi_spec(short_dir, "uid-b") == before
    assert list(Checkpoint(short_dir / "plugins").load()) == ["uid-b"]
    # The freed memory takes a new share again.
    c = claims.add(share_claim("c", "uid-c", [("gpu", "gpu-0", "share-c", "39Gi")]))
    assert (await shared.prepare(c)).claims["uid-c"].error == ""


async def test_shares_never_hold_more_than_the_gpu_has(shared, claims):
    a = claims.add(share_claim("a", "uid-a", [("gpu", "gpu-1", "share-a", "50Gi")]))
    over = claims.add(share_claim("over", "uid-over", [("gpu", "gpu-1", "share-o", "30Gi")]))
    assert (await shared.prepare(a)).claims["uid-a"].error == ""
    err = (await shared.prepare(over)).claims["uid-over"].error
    assert "the share share-o of 30Gi does not fit" in err and "would hold 80Gi of its 81559Mi" in err
    assert (await shared.prepare(over)).claims["uid-over"].error == err  # nothing half-done was kept


async def test_a_claim_that_names_no_memory_is_charged_the_default(shared, claims, short_dir):
    silent = claims.add(share_claim("silent", "uid-s", [("gpu", "gpu-2", "share-s", None)]))
    small = claims.add(share_claim("small", "uid-m", [("gpu", "gpu-2", "share-m", "1Gi")]))
    assert (await shared.prepare(silent)).claims["uid-s"].error == ""
    env = env_of(cdi_spec(short_dir, "uid-s"), "uid-s-gpu-2-share-s")
    assert env["DRAGUARD_GPU_MEMORY_LIMIT"] == str(79 * GI)
    assert "does not fit" in (await shared.prepare(small)).claims["uid-m"].error


async def test_two_shares_of_one_gpu_in_one_claim_are_two_devices(shared, claims, short_dir):
    both = claims.add(
        share_claim("two", "uid-2", [("a", "gpu-3", "s-1", "8Gi"), ("b", "gpu-3", "s-2", "8Gi")])
    )
    entry = (await shared.prepare(both)).claims["uid-2"]
    assert entry.error == ""
    assert [(d.share_id, list(d.request_names)) for d in entry.devices] == [("s-1", ["a"]), ("s-2", ["b"])]
    spec = cdi_spec(short_dir, "uid-2")
    assert [d["name"] for d in spec["devices"]] == ["uid-2-gpu-3-s-1", "uid-2-gpu-3-s-2"]
    assert env_of(spec, "uid-2-gpu-3-s-1")["DRAGUARD_GPU_MEMORY_LIMIT"] == str(16 * GI)


async def test_a_gpu_is_shared_one_way_at_a_time(shared, claims):
    share = claims.add(share_claim("share", "uid-sh", [("gpu", "gpu-4", "share-1", "10Gi")]))
    whole = claims.add(make_claim("whole", "uid-wh", [("gpu", "gpu-4")]))
    ts = {"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    sliced = claims.add(make_claim("sliced", "uid-ts", [("gpu", "gpu-4")], config=[opaque(ts)]))
    assert (await shared.prepare(share)).claims["uid-sh"].error == ""
    assert "already prepared for claim default/share" in (await shared.prepare(whole)).claims["uid-wh"].error
    err = (await shared.prepare(sliced)).claims["uid-ts"].error
    assert "shared by claim default/share (uid-sh) with ConsumableCapacity" in err
    assert "with TimeSlicing, and a GPU is shared one way at a time" in err
    # A share that also asks for time-slicing would change the GPU under the other shares.
    both = claims.add(
        share_claim("both", "uid-both", [("gpu", "gpu-4", "share-2", "10Gi")], config=[opaque(ts)])
    )
    err = (await shared.prepare(both)).claims["uid-both"].error
    assert "a share cannot also set sharing.strategy TimeSlicing" in err


async def test_a_class_that_time_slices_whole_gpus_still_serves_shares(shared, claims, short_dir):
    """The bundle's full-GPU classes carry a TimeSlicing GpuConfig; on a GPU shared by capacity every
    allocation through them is a share, which must prepare (the class's setting is for whole GPUs)."""
    ts = {"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
    via_class = claims.add(
        share_claim("via-class", "uid-vc", [("gpu", "gpu-4", "share-1", "10Gi")],
                    config=[opaque(ts, source="FromClass")])
    )  # fmt: skip
    assert (await shared.prepare(via_class)).claims["uid-vc"].error == ""
    assert env_of(cdi_spec(short_dir, "uid-vc"), "uid-vc-gpu-4-share-1")
    # The claim's own setting still contradicts the share, and says where it came from.
    own = claims.add(
        share_claim("own", "uid-own", [("gpu", "gpu-4", "share-2", "10Gi")], config=[opaque(ts)])
    )
    assert "a share cannot also set sharing.strategy TimeSlicing" in (await shared.prepare(own)).claims[
        "uid-own"
    ].error


async def test_a_share_of_a_gpu_this_node_does_not_share_is_refused(plugin, claims):
    _server, kubelet = plugin  # the plugin without --share-by-capacity
    await kubelet.register()
    stale = claims.add(share_claim("stale", "uid-st", [("gpu", "gpu-0", "share-x", "10Gi")]))
    err = (await kubelet.prepare(stale)).claims["uid-st"].error
    assert "allocated as a share (share-x) but this node does not share it" in err
    assert "--share-by-capacity" in err


@pytest.mark.parametrize(
    ("share", "memory", "message"),
    [
        ("../../etc/passwd", "10Gi", "is not a UID"),
        ("x" * 200, "10Gi", "is not a UID"),
        ("ok", "lots", "'lots' is not a quantity"),
        ("ok", "1e999", "exponent out of range"),
        ("ok", "512Mi", "outside the published range 1Gi to 79Gi"),
        ("ok", "100Gi", "outside the published range"),
    ],
)
async def test_hostile_share_results_get_a_clear_error(shared, claims, short_dir, share, memory, message):
    bad = claims.add(share_claim("bad", "uid-bad", [("gpu", "gpu-5", share, memory)]))
    err = (await shared.prepare(bad)).claims["uid-bad"].error
    assert message in err and "internal error" not in err
    assert Checkpoint(short_dir / "plugins").load() == {}
    assert not (short_dir / "cdi").exists() or not list((short_dir / "cdi").iterdir())


# --- crashes and recovery ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "crash_at", ["after-prepare-started", "after-cdi-written", "after-prepare-completed"]
)
async def test_kill_mid_prepare_of_a_share_leaks_nothing(short_dir, crash_at):
    proc = PluginProcess(short_dir)
    keep = share_claim("keep", "uid-keep", [("gpu", "gpu-0", "share-k", "20Gi")])
    torn = share_claim("torn", "uid-torn", [("gpu", "gpu-0", "share-t", "20Gi")])
    proc.set_claims(keep, torn)
    try:
        proc.start(share_by_capacity="all")
        kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
        await kubelet.register()
        assert (await kubelet.prepare(keep)).claims["uid-keep"].error == ""
        await kubelet.close()
        proc.stop()

        proc.start(crash_at=crash_at, share_by_capacity="all")
        kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
        await kubelet.register()
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.prepare(torn)
        await kubelet.close()
        assert proc.wait_dead() == 137
        if crash_at != "after-prepare-completed":
            assert Checkpoint(short_dir / "plugins").load()["uid-torn"].state == PREPARE_STARTED
        # The torn claim is deleted while the plugin is down: after the restart no share of it is left.
        proc.set_claims(keep)
        report = proc.start(share_by_capacity="all")
        assert report["kept"] == ["uid-keep"]
        assert "uid-torn" in report["rolledBack"] + report["dropped"]
        cp = Checkpoint(short_dir / "plugins").load()
        assert [(u, [p.share_id for p in e.devices]) for u, e in cp.items()] == [("uid-keep", ["share-k"])]
        assert sorted(p.name for p in (short_dir / "cdi").iterdir()) == [
            "k8s.gpu.nvidia.com-claim_uid-keep.json"
        ]
        # The surviving share still counts: a share that would overfill the GPU is refused.
        big = share_claim("big", "uid-big", [("gpu", "gpu-0", "share-b", "70Gi")])
        proc.set_claims(keep, big)
        kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
        await kubelet.register()
        assert "does not fit" in (await kubelet.prepare(big)).claims["uid-big"].error
        await kubelet.close()
    finally:
        proc.stop()


def test_a_lost_cdi_spec_of_a_share_is_rewritten_with_its_limit(short_dir):
    claims = InMemoryClaims()
    state = make_state(short_dir, claims, sharing=CapacitySharing())
    from driver.state import ClaimRef

    claims.add(share_claim("c", "uid-c", [("gpu", "gpu-6", "share-c", "12Gi")]))
    first = state.prepare(ClaimRef("default", "c", "uid-c"))
    assert first.error == ""
    path = short_dir / "cdi" / "k8s.gpu.nvidia.com-claim_uid-c.json"
    written = path.read_text()
    path.unlink()
    again = make_state(short_dir, claims, sharing=CapacitySharing()).prepare(
        ClaimRef("default", "c", "uid-c")
    )
    assert again.error == "" and again.devices[0].cdi_device_ids == first.devices[0].cdi_device_ids
    assert path.read_text() == written


def test_claim_status_shows_each_share_with_its_memory():
    from driver.checkpoint import PreparedDevice
    from driver.status import device_entries

    shares = [
        PreparedDevice(["a"], NODE, "gpu-0", ["id-1"], "s-1", consumed_memory=8 * GI),
        PreparedDevice(["b"], NODE, "gpu-0", ["id-2"], "s-2", consumed_memory=3 * GI // 2),
    ]
    entries = device_entries("gpu.nvidia.com", NODE, shares, {"gpu-0": {"uuid": "GPU-1"}})
    assert [(e["device"], e["shareID"], e["data"]["memory"]) for e in entries] == [
        ("gpu-0", "s-1", "8Gi"),
        ("gpu-0", "s-2", "1536Mi"),
    ]
