"""ResourceSlice building, local validation and publish planning."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from driver.devices import DriverDevice, build_devices
from driver.nvml import open_sim
from driver.slices import (
    PublishPlan,
    SliceValidationError,
    build_slices,
    format_quantity,
    plan_publish,
    slice_devices,
    validate_slice,
    validate_slices,
)

NODE = "node-a"
DRV = "gpu.nvidia.com"


def big_mig_topology(path: Path, gpus: int) -> Path:
    """`gpus` A100s with 7 MIG 1g.10gb devices each (7 × gpus devices)."""
    items = []
    for g in range(gpus):
        migs = [
            {
                "profile": "1g.10gb",
                "giProfileId": 19,
                "placement": {"start": i, "size": 1},
                "gpuInstanceId": i + 7,
                "uuid": f"MIG-{g:04x}-{i}",
                "memoryMB": 9856,
                "multiprocessors": 14,
                "copyEngines": 1,
                "decoders": 0,
                "jpegEngines": 0,
                "ofaEngines": 0,
            }
            for i in range(7)
        ]
        items.append(
            {
                "name": "NVIDIA A100 80GB PCIe",
                "uuid": f"GPU-{g:04x}",
                "minor": g,
                "architecture": "Ampere",
                "computeCapability": "8.0",
                "memoryBytes": 85899345920,
                "pciBusId": f"0000{g // 256:04x}:{g % 256:02x}:00.0",
                "mig": {"enabled": True, "devices": migs},
            }
        )
    path.write_text(
        yaml.safe_dump({"driverVersion": "535.104.05", "cudaDriverVersion": 12020, "gpus": items})
    )
    return path


def test_quantities():
    assert format_quantity(85899345920) == "80Gi"
    assert format_quantity(19968 * 2**20) == "19968Mi"
    assert format_quantity(42) == "42"
    assert format_quantity(1) == "1"
    assert format_quantity(0) == "0"
    assert format_quantity(81559 * 2**20) == "81559Mi"


def test_v1_slice_shape_and_validation():
    devs = build_devices(open_sim("h100-8x-nvlink").enumerate())
    (s,) = build_slices(
        devs,
        node_name=NODE,
        driver_name=DRV,
        generation=3,
        owner={"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "n-uid"},
    )
    assert s["apiVersion"] == "resource.k8s.io/v1"
    assert s["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRV
    assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"
    dev = s["spec"]["devices"][0]
    assert "basic" not in dev
    assert dev["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert dev["capacity"]["memory"] == {"value": "81559Mi"}
    assert validate_slice(s) == []


def test_v1beta1_wraps_devices_in_basic():
    devs = build_devices(open_sim("a100-4x-mig").enumerate())
    (s,) = build_slices(devs, node_name=NODE, driver_name=DRV, generation=0, version="v1beta1")
    assert s["apiVersion"] == "resource.k8s.io/v1beta1"
    dev = s["spec"]["devices"][0]
    assert set(dev) == {"name", "basic"} and dev["basic"]["attributes"]["profile"] == {"string": "3g.20gb"}
    assert validate_slice(s) == []
    assert (
        slice_devices(s)[0]["capacity"]
        == build_slices(devs, node_name=NODE, driver_name=DRV, generation=0)[0]["spec"]["devices"][0][
            "capacity"
        ]
    )


def test_more_than_128_devices_are_split(tmp_path):
    devs = build_devices(open_sim(big_mig_topology(tmp_path / "big.yaml", 20)).enumerate())
    assert len(devs) == 140
    slices = build_slices(devs, node_name=NODE, driver_name=DRV, generation=1)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 12]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(names) == len(set(names)) == 140
    validate_slices(slices)


def _dev(**attrs) -> DriverDevice:
    return DriverDevice("gpu-0", "gpu", "GPU-x", 0, dict(attrs), {"memory": 1024})


@pytest.mark.parametrize(
    ("device", "needle"),
    [
        (_dev(driverVersion=("version", "535.104.05")), "not strict semver"),
        (_dev(productName=("string", "x" * 65)), "at most 64 characters"),
        (DriverDevice("GPU_0", "gpu", "u", 0, {}, {}), "DNS label"),
        (DriverDevice("gpu-0", "gpu", "u", 0, {f"a{i}": ("int", i) for i in range(33)}, {}), "at most 32"),
        (_dev(**{"this_name_is_far_too_long_for_a_key_x": ("bool", True)}), "C identifier"),
        (_dev(**{"Bad_Domain.io/x": ("bool", True)}), "DNS subdomain"),
    ],
)
def test_validation_catches_what_the_api_server_rejects(device, needle):
    slices = build_slices([device], node_name=NODE, driver_name=DRV, generation=0)
    with pytest.raises(SliceValidationError) as err:
        validate_slices(slices)
    assert needle in str(err.value)


def test_validation_of_slice_level_fields():
    s = build_slices([_dev()], node_name=NODE, driver_name=DRV, generation=0)[0]
    bad = copy.deepcopy(s)
    bad["spec"]["devices"] = bad["spec"]["devices"] * 129
    errs = validate_slice(bad)
    assert any("at most 128 per slice" in e for e in errs) and any("duplicate" in e for e in errs)
    bad = copy.deepcopy(s)
    bad["spec"]["driver"] = "Not_A_Driver"
    bad["spec"]["pool"]["generation"] = -1
    errs = " ".join(validate_slice(bad))
    assert "spec.driver" in errs and "generation" in errs


def _existing(slices: list[dict], names: list[str]) -> list[dict]:
    out = []
    for s, n in zip(slices, names, strict=True):
        s = copy.deepcopy(s)
        s["metadata"] = {"name": n, "resourceVersion": "7"}
        out.append(s)
    return out


def test_plan_unchanged_keeps_generation():
    devs = build_devices(open_sim("h100-8x-nvlink").enumerate())

    def build(gen: int) -> list[dict]:
        return build_slices(devs, node_name=NODE, driver_name=DRV, generation=gen)

    existing = _existing(build(4), ["s1"])
    desired = [d for s in build(0) for d in slice_devices(s)]
    plan = plan_publish(existing, desired, build)
    assert plan == PublishPlan(4, [], [], [], True)


def test_plan_change_bumps_generation_and_deletes_stale(tmp_path):
    devs = build_devices(open_sim(big_mig_topology(tmp_path / "big.yaml", 20)).enumerate())

    def build_all(gen: int) -> list[dict]:
        return build_slices(devs, node_name=NODE, driver_name=DRV, generation=gen)

    existing = _existing(build_all(2), ["s1", "s2"])
    fewer = devs[:10]  # GPUs went away: one slice is enough now

    def build(gen: int) -> list[dict]:
        return build_slices(fewer, node_name=NODE, driver_name=DRV, generation=gen)

    plan = plan_publish(existing, [d for s in build(0) for d in slice_devices(s)], build)
    assert not plan.unchanged and plan.generation == 3
    assert [u["metadata"]["name"] for u in plan.update] == ["s1"] and plan.update[0]["metadata"][
        "resourceVersion"
    ] == "7"
    assert plan.update[0]["spec"]["pool"]["generation"] == 3
    assert plan.create == [] and plan.delete == ["s2"]


def test_plan_first_publish_creates():
    devs = build_devices(open_sim("a100-4x-mig").enumerate())

    def build(gen: int) -> list[dict]:
        return build_slices(devs, node_name=NODE, driver_name=DRV, generation=gen)

    plan = plan_publish([], [d for s in build(0) for d in slice_devices(s)], build)
    assert plan.generation == 0 and len(plan.create) == 1 and not plan.update and not plan.delete
    assert plan.create[0]["metadata"]["generateName"] == f"{NODE}-{DRV}-"


def test_publisher_retries_while_api_unavailable():
    """The publisher backs off and retries on connection errors, then gives a clear error."""
    from kubernetes import client

    from driver.slices import SlicePublisher, SlicePublishError

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # nothing listens on the discard port
    sleeps: list[float] = []
    pub = SlicePublisher(client.ApiClient(cfg), NODE, DRV, sleep=sleeps.append, max_attempts=5)
    with pytest.raises(SlicePublishError, match="unavailable after 5 attempts"):
        pub.choose_version()
    assert sleeps == [0.5, 1.0, 2.0, 4.0]
