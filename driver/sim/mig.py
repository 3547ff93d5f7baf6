"""MIG GPU instance profiles of the simulated boards, as NVML reports them (pure data).

Each profile: NVML's profile index (`NVML_GPU_INSTANCE_PROFILE_*`), its profile id, the memory slices
it spans (`size`), the compute slices it uses, the placements (first memory slice) NVML allows, and
what the instance gets. The figures follow NVIDIA's MIG user guide for the A100 80GB and H100 80GB
(7 compute slices, 8 memory slices); the placement rules are NVML's: an instance starts only at one of
its profile's placements, and no two instances share a memory slice.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY_SLICES = 8
MAX_GPU_INSTANCES = 14  # GPU instance ids 1..14, as /proc/driver/nvidia-caps/mig-minors numbers them
COMPUTE_SLICES = 7

# NVML_GPU_INSTANCE_PROFILE_* indices (nvml.h).
PROFILE_1_SLICE = 0
PROFILE_2_SLICE = 1
PROFILE_3_SLICE = 2
PROFILE_4_SLICE = 3
PROFILE_7_SLICE = 4
PROFILE_1_SLICE_REV1 = 7
PROFILE_1_SLICE_REV2 = 9
PROFILE_INDEX_COUNT = 14

# NVML_COMPUTE_INSTANCE_PROFILE_* index → compute slices (a full compute instance of its GPU instance).
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}


@dataclass(frozen=True, slots=True)
class GiProfile:
    index: int
    id: int
    name: str  # as NVML names it, without the "MIG " prefix
    size: int  # memory slices
    compute: int  # compute slices
    starts: tuple[int, ...]
    memory_mb: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


def _table(
    gb: tuple[int, int, int, int, int], mb: tuple[int, int, int, int, int], sms: int
) -> tuple[GiProfile, ...]:
    """The 80 GB boards' profiles; `gb` names the memory of 1g, 1g (2 slices), 2g, 3g/4g, 7g."""
    one, one2, two, three, seven = gb
    m1, m12, m2, m3, m7 = mb
    return (
        GiProfile(PROFILE_1_SLICE, 19, f"1g.{one}gb", 1, 1, tuple(range(7)), m1, sms, 1, 0, 0, 0, 0),
        GiProfile(PROFILE_1_SLICE_REV1, 20, f"1g.{one}gb+me", 1, 1, tuple(range(7)), m1, sms, 1, 1, 0, 1, 1),
        GiProfile(PROFILE_1_SLICE_REV2, 15, f"1g.{one2}gb", 2, 1, (0, 2, 4, 6), m12, sms, 1, 1, 0, 0, 0),
        GiProfile(PROFILE_2_SLICE, 14, f"2g.{two}gb", 2, 2, (0, 2, 4), m2, 2 * sms, 2, 1, 0, 0, 0),
        GiProfile(PROFILE_3_SLICE, 9, f"3g.{three}gb", 4, 3, (0, 4), m3, 3 * sms, 3, 2, 0, 0, 0),
        GiProfile(PROFILE_4_SLICE, 5, f"4g.{three}gb", 4, 4, (0,), m3, 4 * sms, 4, 2, 0, 0, 0),
        GiProfile(PROFILE_7_SLICE, 0, f"7g.{seven}gb", 8, 7, (0,), m7, 7 * sms, 7, 5, 0, 1, 1),
    )


A100_80GB = _table((10, 20, 20, 40, 80), (9728, 19968, 19968, 40192, 80896), 14)
H100_80GB = _table((10, 20, 20, 40, 80), (9984, 20096, 20096, 40448, 81408), 16)


def profiles_for(product_name: str) -> tuple[GiProfile, ...]:
    """The MIG profiles of a simulated board, by its NVML product name; empty when it has none known."""
    if "A100" in product_name and "80GB" in product_name:
        return A100_80GB
    if "H100" in product_name and "80GB" in product_name:
        return H100_80GB
    return ()
