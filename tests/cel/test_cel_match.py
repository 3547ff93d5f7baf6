"""Profile-grouped matching gives exactly the per-device answer, with far fewer evaluations."""

from __future__ import annotations

import pytest
from cel_devices import A100, DRIVER, H100, gpu, inventory, mig
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.cel.env import CelCompileError
from webhook.cel.match import match_devices, match_naive
from webhook.dra.device import AttrValue, Device, Version

GUARD = f"device.driver == '{DRIVER}'"
NV = f"device.attributes['{DRIVER}']"

EXPRESSIONS = [
    f"{GUARD} && device.attributes['{DRIVER}'].productName == '{A100}'",
    f"{GUARD} && device.attributes['{DRIVER}'].productName == '{H100}'",
    f"{GUARD} && {NV}.type == 'mig' && {NV}.profile == '3g.20gb'",
    f"{GUARD} && device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0",
    f"{GUARD} && device.attributes['{DRIVER}'].driverVersion.isGreaterThan(semver('560.0.0'))",
    f"{GUARD} && device.attributes['{DRIVER}'].uuid == 'GPU-node-a-0002'",
    f"{GUARD} && device.attributes['resource.kubernetes.io'].pciBusID.endsWith('19:00.0')",
    # Dynamic: iterates the domain map, so the whole device is the profile.
    f"{GUARD} && device.attributes['{DRIVER}'].exists(k, k == 'parentUUID')",
    f"{GUARD} && device.attributes['{DRIVER}'].all(k, k != 'uuid' || "
    f"device.attributes['{DRIVER}'][k].endsWith('-1'))",
    "cel.bind(nv, device.attributes['gpu.nvidia.com'], has(nv.type) && nv.type == 'gpu')",
    "device.attributes['fpga.example.com'].size() > 0",
]


def names(devices: list[Device]) -> list[str]:
    return [f"{d.node}/{d.name}" for d in devices]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_grouped_matching_equals_per_device_evaluation(expression: str) -> None:
    devices = inventory()
    grouped = match_devices([expression], devices)
    assert names(grouped.matched) == names(match_naive([expression], devices))


def test_profiles_ignore_unread_identity_attributes() -> None:
    devices = [gpu(f"node-{n}", g) for n in range(50) for g in range(8)]
    result = match_devices([EXPRESSIONS[0]], devices)
    assert len(result.matched) == 400
    assert result.profiles == 1  # uuid and pciBusID differ on every device, but nothing reads them


def test_reading_an_identity_attribute_keeps_devices_apart() -> None:
    devices = [gpu(f"node-{n}", g) for n in range(5) for g in range(8)]
    result = match_devices([f"{GUARD} && device.attributes['{DRIVER}'].uuid == 'GPU-node-3-0005'"], devices)
    assert names(result.matched) == ["node-3/gpu-5"]
    assert result.profiles == 40


def test_dynamic_expression_falls_back_to_the_full_device() -> None:
    devices = [gpu(f"node-{n}", g) for n in range(3) for g in range(4)]
    # `exists` over the map could read uuid without naming it.
    expression = f"{NV}.exists(k, {NV}[k] == 'GPU-node-1-0002')"
    result = match_devices([expression], devices)
    assert names(result.matched) == ["node-1/gpu-2"]
    assert result.profiles == 12


def test_all_expressions_must_hold() -> None:
    devices = inventory()
    both = match_devices(
        [EXPRESSIONS[0], f"device.attributes['{DRIVER}'].type == 'gpu'"], devices
    )
    assert names(both.matched) == ["node-a/gpu-1", "node-a/gpu-2", "node-a/gpu-3"]


def test_evaluation_errors_are_reported_once_per_profile() -> None:
    devices = inventory()
    # Unguarded MIG-only attribute: every full GPU fails with "no such key".
    result = match_devices([f"{GUARD} && device.attributes['{DRIVER}'].profile == '3g.20gb'"], devices)
    assert names(result.matched) == ["node-a/gpu-0-mig-3g.20gb-0", "node-a/gpu-0-mig-3g.20gb-1"]
    assert {e.missing_key for e in result.errors} == {"profile"}
    assert sum(e.devices for e in result.errors) == result.failed == 7
    # All seven GPUs look alike to the expression (no `profile`), so one evaluation, one error.
    assert len(result.errors) == 1
    assert result.profiles == 3  # GPUs, MIG devices, the FPGA of another driver


def test_version_and_string_values_are_not_confused() -> None:
    as_version = Device(DRIVER, "p", "v", "n", {DRIVER: {"level": Version("1.0.0")}}, {})
    as_string = Device(DRIVER, "p", "s", "n", {DRIVER: {"level": "1.0.0"}}, {})
    as_bool = Device(DRIVER, "p", "b", "n", {DRIVER: {"flag": True}}, {})
    as_int = Device(DRIVER, "p", "i", "n", {DRIVER: {"flag": 1}}, {})
    result = match_devices([f"device.attributes['{DRIVER}'].level == '1.0.0'"], [as_version, as_string])
    assert names(result.matched) == ["n/s"]
    result = match_devices([f"device.attributes['{DRIVER}'].flag == 1"], [as_bool, as_int])
    assert names(result.matched) == ["n/i"]


def test_unknown_domain_matches_nothing_without_error() -> None:
    result = match_devices(["has(device.attributes['vendor.example.com'].model)"], [mig("n", 0, 0)])
    assert result.matched == [] and result.errors == []


def test_bad_expression_raises_compile_error() -> None:
    with pytest.raises(CelCompileError) as info:
        match_devices(["device.driver =="], inventory())
    assert info.value.issue.check == "cel/syntax"


def test_empty_inventory() -> None:
    result = match_devices([EXPRESSIONS[0]], [])
    assert result.matched == [] and result.profiles == 0


_VALUES: st.SearchStrategy[AttrValue] = st.sampled_from(
    ["a", "b", "1.0.0", Version("1.0.0"), Version("2.0.0"), True, False, 1, 0, 7]
)


@st.composite
def _device(draw: st.DrawFn) -> Device:
    attrs: dict[str, AttrValue] = {
        name: draw(_VALUES)
        for name in ("productName", "type", "level", "profile")
        if draw(st.booleans())
    }
    domains: dict[str, dict[str, AttrValue]] = {DRIVER: attrs}
    if draw(st.booleans()):
        domains["vendor.example.com"] = {"level": draw(_VALUES)}
    capacity = {DRIVER: {"memory": draw(st.sampled_from(["40Gi", "80Gi", "81920Mi", "1"]))}} if draw(
        st.booleans()) else {}
    index = draw(st.integers(0, 10**6))
    return Device(draw(st.sampled_from([DRIVER, "other.example.com"])), "pool", f"d{index}", "node", domains,
                  capacity)


_RANDOM_EXPRESSIONS = [
    f"{NV}.productName == 'a'",
    f"{NV}.level == '1.0.0'",
    f"{NV}.level == semver('1.0.0')",
    f"has({NV}.profile) && {NV}.profile == true",
    f"'type' in {NV} && {NV}.type == 1",
    f"{GUARD} && device.capacity['{DRIVER}'].memory.compareTo(quantity('80Gi')) >= 0",
    f"device.attributes['vendor.example.com'].level == 7 || {NV}.productName == 'b'",
    f"{NV}.exists(k, k == 'level')",
    f"cel.bind(x, {NV}, has(x.type) && x.type == 0)",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_device(), max_size=25),
    st.lists(st.sampled_from(_RANDOM_EXPRESSIONS), min_size=1, max_size=3),
)
def test_grouping_never_changes_the_answer(devices: list[Device], expressions: list[str]) -> None:
    grouped = match_devices(expressions, devices)
    assert names(grouped.matched) == names(match_naive(expressions, devices))
    assert grouped.profiles <= len(devices)
