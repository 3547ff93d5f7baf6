"""Dynamic MIG: GPU and compute instances made and destroyed through (simulated) NVML, by its rules."""

from __future__ import annotations

import pytest

from driver.devices import build_devices
from driver.nvml import ERR_IN_USE, ERR_INSUFFICIENT_RESOURCES, ERR_INVALID_ARGUMENT, NvmlCallError, open_sim

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
