"""Dynamic MIG: GPU and compute instances made and destroyed through (simulated) NVML, by its rules."""

from __future__ import annotations

import pytest

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
