"""Dynamic MIG: GPU and compute instances made and destroyed through (simulated) NVML, by its rules."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from driver_helpers import InMemoryClaims, Kubelet, make_claim, make_state
from test_driver_crash import PluginProcess

from driver.checkpoint import Checkpoint
from driver.cli import main as driver_main
from driver.devices import build_devices
from driver.nvml import ERR_IN_USE, ERR_INSUFFICIENT_RESOURCES, ERR_INVALID_ARGUMENT, NvmlCallError, open_sim
from driver.plugin import PluginServer
from driver.sim import MIG_STATE_ENV
from driver.state import ClaimRef

TOPOLOGY = "a100-2x-dynamic-mig"
GPU0 = "GPU-70e97c5c-2914-58b6-94be-57df14252df3"


def profile_ids(nvml) -> dict[str, int]:
    return {p.name: p.profile_id for p in nvml.enumerate().gpus[0].mig_profiles}


def test_a_gpu_in_mig_mode_lists_its_profiles_and_placements():
    gpu = open_sim(TOPOLOGY).enumerate().gpus[0]
    assert gpu.mig_enabled and gpu.migs == ()
    got = {p.name: (p.size, p.compute_slices, p.starts) for p in gpu.mig_profiles}
    assert got == {
        "1g.10gb": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.10gb+me": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.20gb": (2, 1, (0, 2, 4, 6)),
        "2g.20gb": (2, 2, (0, 2, 4)),
        "3g.40gb": (4, 3, (0, 4)),
        "4g.40gb": (4, 4, (0,)),
        "7g.80gb": (8, 7, (0,)),
    }
    assert open_sim("h100-8x-nvlink").enumerate().gpus[0].mig_profiles == ()  # not in MIG mode


def test_create_lists_the_instance_and_destroy_removes_it():
    nvml = open_sim(TOPOLOGY)
    ids = profile_ids(nvml)
    first = nvml.create_mig(GPU0, ids["3g.40gb"], 4)
    assert (first.profile, first.placement_start, first.placement_size) == ("3g.40gb", 4, 4)
    assert first.uuid.startswith("MIG-") and first.memory_bytes == 40192 << 20 and first.multiprocessors == 42
    second = nvml.create_mig(GPU0, ids["2g.20gb"], 0)
    assert second.gi_id != first.gi_id and second.uuid != first.uuid
    assert {m.uuid for m in nvml.enumerate().gpus[0].migs} == {first.uuid, second.uuid}
    assert nvml.destroy_mig(GPU0, first.gi_id, first.ci_id) is True
    assert [m.uuid for m in nvml.enumerate().gpus[0].migs] == [second.uuid]
    assert nvml.destroy_mig(GPU0, first.gi_id, first.ci_id) is False  # already gone: nothing to do
    # The same placement again: a new instance with a UUID of its own.
    again = nvml.create_mig(GPU0, ids["3g.40gb"], 4)
    assert again.uuid not in (first.uuid, second.uuid)


@pytest.mark.parametrize(
    ("existing", "wanted", "code"),
    [
        ([("3g.40gb", 0)], ("1g.10gb", 3), ERR_INSUFFICIENT_RESOURCES),  # memory slice 3 is taken
        ([("3g.40gb", 0)], ("4g.40gb", 0), ERR_INSUFFICIENT_RESOURCES),
        ([("1g.10gb", 6)], ("7g.80gb", 0), ERR_INSUFFICIENT_RESOURCES),
        ([("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)], ("1g.10gb", 7), ERR_INVALID_ARGUMENT),
        (
            [("4g.40gb", 0), ("3g.40gb", 4)],
            ("1g.10gb", 6),
            ERR_INSUFFICIENT_RESOURCES,
        ),  # all 7 compute slices used
        ([], ("3g.40gb", 2), ERR_INVALID_ARGUMENT),  # not one of the profile's placements
        ([], ("2g.20gb", 6), ERR_INVALID_ARGUMENT),
    ],
)
def test_nvml_placement_rules(existing, wanted, code):
    nvml = open_sim(TOPOLOGY)
    ids = profile_ids(nvml)
    for name, start in existing:
        nvml.create_mig(GPU0, ids[name], start)
    with pytest.raises(NvmlCallError) as err:
        nvml.create_mig(GPU0, ids[wanted[0]], wanted[1])
    assert err.value.code == code
    assert len(nvml.enumerate().gpus[0].migs) == len(existing)  # a refused create leaves nothing behind


def test_every_placement_of_every_profile_fits_an_empty_gpu():
    nvml = open_sim(TOPOLOGY)
    for p in nvml.enumerate().gpus[0].mig_profiles:
        for start in p.starts:
            made = nvml.create_mig(GPU0, p.profile_id, start)
            assert (made.placement_start, made.placement_size) == (start, p.size)
            assert nvml.destroy_mig(GPU0, made.gi_id, made.ci_id)
    assert nvml.enumerate().gpus[0].migs == ()


def test_a_gpu_instance_with_a_compute_instance_is_in_use():
    nvml = open_sim(TOPOLOGY)
    made = nvml.create_mig(GPU0, profile_ids(nvml)["1g.10gb"], 0)
    sim = nvml.lib
    sim.nvmlInit()
    try:
        gi = sim.nvmlDeviceGetGpuInstanceById(sim.nvmlDeviceGetHandleByUUID(GPU0), made.gi_id)
        with pytest.raises(Exception) as err:
            sim.nvmlGpuInstanceDestroy(gi)
        assert err.value.value == ERR_IN_USE
    finally:
        sim.nvmlShutdown()


# --- what is published ---------------------------------------------------------------------------


def _fits(devices, names) -> bool:
    """Whether the devices named can be allocated together by their counters (the scheduler's rule)."""
    by_name = {d.name: d for d in devices}
    totals = {d.counter_set: dict(d.consumes) for d in devices if d.type == "gpu" and d.counter_set}
    used: dict[tuple[str, str], int] = {}
    for n in names:
        d = by_name[n]
        for k, v in d.consumes:
            used[(d.counter_set, k)] = used.get((d.counter_set, k), 0) + v
    return all(v <= totals[cs][k] for (cs, k), v in used.items())


def test_dynamic_mig_publishes_the_full_gpu_and_every_placement_on_one_counter_set():
    devices = build_devices(open_sim(TOPOLOGY).enumerate(), dynamic_mig=True)
    gpu0 = [d for d in devices if d.minor == 0]
    assert {d.counter_set for d in gpu0} == {"gpu-0-counter-set"}
    (full,) = [d for d in gpu0 if d.type == "gpu"]
    assert full.name == "gpu-0" and full.memory_slices == frozenset(range(8))
    parts = {d.name: d for d in gpu0 if d.type == "mig"}
    assert len(parts) == 25 and all(not d.uuid and d.parent_uuid == GPU0 for d in parts.values())
    assert parts["gpu-0-mig-3g40gb-9-4"].memory_slices == frozenset(range(4, 8))
    assert parts["gpu-0-mig-3g40gb-9-4"].attributes["profile"] == ("string", "3g.40gb")
    # What NVML allows, the counters allow; what it refuses, they refuse.
    assert _fits(devices, [f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)])
    assert _fits(devices, ["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-3g40gb-9-4"])
    assert _fits(devices, ["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-1g10gb-19-6"])
    assert not _fits(devices, ["gpu-0", "gpu-0-mig-1g10gb-19-6"])  # the full GPU and a partition
    assert not _fits(devices, ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-3"])  # one memory slice
    assert not _fits(devices, ["gpu-0-mig-1g10gb-me-20-0", "gpu-0-mig-1g10gb-me-20-1"])  # one media engine
    assert _fits(devices, ["gpu-0", "gpu-1-mig-7g80gb-0-0"])  # another GPU's counters are its own


def test_without_the_mode_a_gpu_in_mig_mode_publishes_its_instances_only():
    devices = build_devices(open_sim(TOPOLOGY).enumerate())
    assert devices == []
    static = build_devices(open_sim("a100-4x-mig").enumerate(), dynamic_mig=False)
    assert static and all(d.counter_set is None for d in static)


# --- prepare and unprepare through the kubelet's API ---------------------------------------------


class Killed(BaseException):
    """The plugin dies at a fault point: nothing after it runs (no handler catches a BaseException)."""


@pytest.fixture
async def dyn(short_dir, claims):
    """The plugin with dynamic MIG on two A100s in MIG mode, registered with a kubelet."""
    state = make_state(short_dir, claims, topology=TOPOLOGY, dynamic_mig=True)
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
        yield kubelet, state.nvml
    finally:
        await kubelet.close()
        await server.stop(0)


def instances(nvml, gpu: int = 0) -> list[tuple[str, int]]:
    return sorted((m.profile, m.placement_start) for m in nvml.enumerate().gpus[gpu].migs)


def spec_of(base: Path, uid: str) -> dict:
    return json.loads((base / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())


async def test_a_partition_exists_only_while_its_claim_is_prepared(dyn, claims, short_dir):
    kubelet, nvml = dyn
    claim = claims.add(make_claim("infer", "uid-p", [("mig", "gpu-0-mig-3g40gb-9-4")]))
    entry = (await kubelet.prepare(claim)).claims["uid-p"]
    assert entry.error == ""
    assert [d.device_name for d in entry.devices] == ["gpu-0-mig-3g40gb-9-4"]
    (made,) = nvml.enumerate().gpus[0].migs
    assert (made.profile, made.placement_start) == ("3g.40gb", 4)
    (dev,) = spec_of(short_dir, "uid-p")["devices"]
    env = dict(e.split("=", 1) for e in dev["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == made.uuid
    caps = [n["path"] for n in dev["containerEdits"]["deviceNodes"] if "nvidia-caps" in n["path"]]
    assert len(caps) == 2  # the GPU instance's and the compute instance's capability nodes
    recorded = Checkpoint(short_dir / "plugins").load()["uid-p"].devices[0].mig
    assert (recorded.uuid, recorded.gi_id, recorded.start) == (made.uuid, made.gi_id, 4)
    # A repeated prepare (kubelet retry) returns the same device, and makes no second instance.
    assert (await kubelet.prepare(claim)).claims["uid-p"] == entry
    assert instances(nvml) == [("3g.40gb", 4)]

    assert (await kubelet.unprepare(claim)).claims["uid-p"].error == ""
    assert instances(nvml) == []
    assert Checkpoint(short_dir / "plugins").load() == {}


async def test_partitions_side_by_side_and_the_full_gpu_alone(dyn, claims, short_dir):
    kubelet, nvml = dyn
    a = claims.add(make_claim("a", "uid-a", [("mig", "gpu-0-mig-4g40gb-5-0")]))
    b = claims.add(make_claim("b", "uid-b", [("mig", "gpu-0-mig-2g20gb-14-4")]))
    full = claims.add(make_claim("full", "uid-full", [("gpu", "gpu-0")]))
    over = claims.add(make_claim("over", "uid-over", [("mig", "gpu-0-mig-1g10gb-19-5")]))
    resp = await kubelet.prepare(a, b)
    assert resp.claims["uid-a"].error == "" and resp.claims["uid-b"].error == ""
    assert instances(nvml) == [("2g.20gb", 4), ("4g.40gb", 0)]
    err = (await kubelet.prepare(full)).claims["uid-full"].error
    assert "device gpu-0 overlaps gpu-0-mig-4g40gb-5-0, prepared for claim default/a (uid-a)" in err
    assert "never run together" in err
    assert "overlaps gpu-0-mig-2g20gb-14-4" in (await kubelet.prepare(over)).claims["uid-over"].error
    assert instances(nvml) == [("2g.20gb", 4), ("4g.40gb", 0)]  # refused claims made nothing
    assert (await kubelet.unprepare(a, b)).claims["uid-a"].error == ""
    # Once the partitions are gone, the full GPU: its whole-GPU instance, every slice.
    entry = (await kubelet.prepare(full)).claims["uid-full"]
    assert entry.error == ""
    assert instances(nvml) == [("7g.80gb", 0)]
    env = dict(e.split("=", 1) for e in spec_of(short_dir, "uid-full")["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert (await kubelet.unprepare(full)).claims["uid-full"].error == ""
    assert instances(nvml) == []


async def test_an_instance_nvml_refuses_fails_the_claim_cleanly(dyn, claims, short_dir):
    kubelet, nvml = dyn
    ids = profile_ids(nvml)
    outside = nvml.create_mig(GPU0, ids["1g.10gb"], 5)  # made by hand, outside the driver
    claim = claims.add(
        make_claim("c", "uid-c", [("a", "gpu-0-mig-1g10gb-19-0"), ("b", "gpu-0-mig-2g20gb-14-4")])
    )
    err = (await kubelet.prepare(claim)).claims["uid-c"].error
    assert "creating the MIG instance of gpu-0-mig-2g20gb-14-4" in err and "memory slice 4" in err
    assert f"code {ERR_INSUFFICIENT_RESOURCES}" in err or "overlaps an existing GPU instance" in err
    # The first partition, made before the refusal, is destroyed again; the hand-made one is untouched.
    assert [m.uuid for m in nvml.enumerate().gpus[0].migs] == [outside.uuid]
    assert Checkpoint(short_dir / "plugins").load() == {}
    assert not (short_dir / "cdi").exists() or not list((short_dir / "cdi").iterdir())


@pytest.mark.parametrize(
    "point",
    ["after-prepare-started", "after-mig-created", "after-cdi-written", "after-prepare-completed"],
)
@pytest.mark.parametrize("deleted", [True, False])
def test_killed_mid_prepare_nothing_leaks(short_dir, point, deleted):
    claims = InMemoryClaims()
    nvml = open_sim(TOPOLOGY)  # the GPUs outlive the plugin: the same simulated NVML after the restart

    def die(at: str) -> None:
        if at == point:
            raise Killed(at)

    state = make_state(short_dir, claims, nvml=nvml, dynamic_mig=True, fault=die)
    claims.add(make_claim("c", "uid-c", [("a", "gpu-1-mig-3g40gb-9-0"), ("b", "gpu-1-mig-1g10gb-19-4")]))
    with pytest.raises(Killed):
        state.prepare(ClaimRef("default", "c", "uid-c"))
    if deleted:
        claims.delete("default", "c")
    restarted = make_state(short_dir, claims, nvml=nvml, dynamic_mig=True)
    report = restarted.recover()
    completed = point == "after-prepare-completed"
    if deleted or not completed:
        assert report.rolled_back + report.dropped == ["uid-c"]
        assert instances(nvml, 1) == []
        assert Checkpoint(short_dir / "plugins").load() == {}
        assert not (short_dir / "cdi").exists() or not list((short_dir / "cdi").iterdir())
    else:
        assert report.kept == ["uid-c"] and instances(nvml, 1) == [("1g.10gb", 4), ("3g.40gb", 0)]
    if not deleted:  # the kubelet retries: prepared once, with exactly its two instances
        out = restarted.prepare(ClaimRef("default", "c", "uid-c"))
        assert out.error == "" and instances(nvml, 1) == [("1g.10gb", 4), ("3g.40gb", 0)]
        assert restarted.unprepare(ClaimRef("default", "c", "uid-c")) == ""
        assert instances(nvml, 1) == []


def test_killed_mid_unprepare_the_retry_destroys_the_instance(short_dir):
    claims = InMemoryClaims()
    nvml = open_sim(TOPOLOGY)

    def die(at: str) -> None:
        if at == "after-mig-destroyed":
            raise Killed(at)

    state = make_state(short_dir, claims, nvml=nvml, dynamic_mig=True, fault=die)
    claims.add(make_claim("c", "uid-c", [("a", "gpu-0-mig-7g80gb-0-0")]))
    assert state.prepare(ClaimRef("default", "c", "uid-c")).error == ""
    with pytest.raises(Killed):
        state.unprepare(ClaimRef("default", "c", "uid-c"))
    assert instances(nvml) == [] and "uid-c" in Checkpoint(short_dir / "plugins").load()
    # Meanwhile nothing else may take the slices: the claim is still recorded.
    other = claims.add(make_claim("o", "uid-o", [("a", "gpu-0-mig-1g10gb-19-0")]))
    restarted = make_state(short_dir, claims, nvml=nvml, dynamic_mig=True)
    assert "overlaps gpu-0-mig-7g80gb-0-0" in restarted.prepare(ClaimRef("default", "o", "uid-o")).error
    assert restarted.unprepare(ClaimRef("default", "c", "uid-c")) == ""
    assert restarted.prepare(ClaimRef("default", "o", "uid-o")).error == ""
    assert instances(nvml) == [("1g.10gb", 0)]
    del other


def test_inventory_command_takes_the_mode(capsys):
    assert driver_main(["driver", "inventory", "--sim", TOPOLOGY, "-o", "json", "--dynamic-mig"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s for s in doc["items"] if s["spec"].get("sharedCounters")]
    assert (
        driver_main(["driver", "inventory", "--sim", TOPOLOGY, "--dynamic-mig", "--api-version", "v1beta1"])
        == 1
    )
    assert "needs resource.k8s.io v1 or v1beta2" in capsys.readouterr().err


def test_an_instance_nvml_will_not_destroy_keeps_its_claim_recorded(short_dir):
    claims = InMemoryClaims()
    nvml = open_sim(TOPOLOGY)
    state = make_state(short_dir, claims, nvml=nvml, dynamic_mig=True)
    ref = ClaimRef("default", "c", "uid-c")
    claims.add(make_claim("c", "uid-c", [("a", "gpu-0-mig-1g10gb-19-0")]))
    assert state.prepare(ref).error == ""
    nvml.lib.faults["nvmlGpuInstanceDestroy"] = ERR_IN_USE  # a process still holds the instance
    err = state.unprepare(ref)
    assert "destroying the MIG instance of gpu-0-mig-1g10gb-19-0" in err
    assert "uid-c" in Checkpoint(short_dir / "plugins").load()  # kept: its slices stay taken
    claims.add(make_claim("o", "uid-o", [("a", "gpu-0-mig-7g80gb-0-0")]))
    assert "overlaps gpu-0-mig-1g10gb-19-0" in state.prepare(ClaimRef("default", "o", "uid-o")).error
    del nvml.lib.faults["nvmlGpuInstanceDestroy"]
    assert state.unprepare(ref) == ""  # the kubelet's retry
    assert instances(nvml) == [] and Checkpoint(short_dir / "plugins").load() == {}
    assert state.prepare(ClaimRef("default", "o", "uid-o")).error == ""
    assert instances(nvml) == [("7g.80gb", 0)]


def test_a_failed_prepare_whose_instance_stays_is_cleaned_up_by_the_retry(short_dir):
    claims = InMemoryClaims()
    nvml = open_sim(TOPOLOGY)
    state = make_state(short_dir, claims, nvml=nvml, dynamic_mig=True)
    outside = nvml.create_mig(GPU0, profile_ids(nvml)["1g.10gb"], 6)  # blocks the second partition
    ref = ClaimRef("default", "c", "uid-c")
    claims.add(make_claim("c", "uid-c", [("a", "gpu-0-mig-3g40gb-9-0"), ("b", "gpu-0-mig-3g40gb-9-4")]))
    nvml.lib.faults["nvmlGpuInstanceDestroy"] = ERR_IN_USE
    assert "creating the MIG instance of gpu-0-mig-3g40gb-9-4" in state.prepare(ref).error
    # NVML kept the first one's GPU instance: the claim stays recorded, its placements taken.
    assert Checkpoint(short_dir / "plugins").load()["uid-c"].state == "PrepareStarted"
    with pytest.raises(NvmlCallError) as err:
        nvml.create_mig(GPU0, profile_ids(nvml)["1g.10gb"], 0)
    assert err.value.code == ERR_INSUFFICIENT_RESOURCES
    del nvml.lib.faults["nvmlGpuInstanceDestroy"]
    assert nvml.destroy_mig(GPU0, outside.gi_id, outside.ci_id)
    assert state.prepare(ref).error == ""  # the retry destroys the leftover, then prepares afresh
    assert instances(nvml) == [("3g.40gb", 0), ("3g.40gb", 4)]


@pytest.mark.parametrize("point", ["after-prepare-started", "after-mig-created", "after-cdi-written"])
async def test_plugin_process_killed_mid_prepare_leaves_no_instance(short_dir, point):
    """The plugin process dies (os._exit) mid-prepare; the simulated GPUs keep their instances in a file."""
    state_file = short_dir / "mig-state.json"
    env = {MIG_STATE_ENV: str(state_file)}
    proc = PluginProcess(short_dir)
    claim = make_claim("c", "uid-c", [("a", "gpu-0-mig-2g20gb-14-2"), ("b", "gpu-0-mig-3g40gb-9-4")])
    proc.set_claims(claim)
    try:
        proc.start(crash_at=point, topology=TOPOLOGY, dynamic_mig=True, env=env)
        kubelet = Kubelet(short_dir / "registry" / "gpu.nvidia.com-reg.sock")
        await kubelet.register()
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.prepare(claim)
        await kubelet.close()
        assert proc.wait_dead() == 137
        with pytest.MonkeyPatch.context() as mp:  # what the GPUs hold now, read as the next plugin reads it
            mp.setenv(MIG_STATE_ENV, str(state_file))
            left = instances(open_sim(TOPOLOGY))
        made = {"after-prepare-started": [], "after-mig-created": [("2g.20gb", 2)]}
        assert left == made.get(point, [("2g.20gb", 2), ("3g.40gb", 4)])  # what the kill left behind
        proc.set_claims()  # the claim is deleted while the plugin is down
        report = proc.start(topology=TOPOLOGY, dynamic_mig=True, env=env)
        assert report["rolledBack"] == ["uid-c"]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(MIG_STATE_ENV, str(state_file))
            assert instances(open_sim(TOPOLOGY)) == []
        assert Checkpoint(short_dir / "plugins").load() == {}
    finally:
        proc.stop()
