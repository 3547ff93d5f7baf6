"""NVML (simulated) → devices: names, attributes, capacities, nvlinkDomain, schema agreement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.devices import (
    build_devices,
    coerce_semver,
    cuda_driver_version,
    is_strict_semver,
    mig_device_name,
)
from driver.nvml import NvmlUnavailable, normalize_pci_bus_id, open_nvml, open_sim
from driver.schema import ATTRIBUTES, DRIVER_NAME, export_schema, lookup, normalize_key
from driver.sim import TopologyError, load_topology

TOPOLOGIES = ["h100-8x-nvlink", "a100-4x-mig", "a100-4x-nvlink", "mixed-nvlink-pairs"]


def devices_of(topology: str):
    return build_devices(open_sim(topology).enumerate())


def test_h100_node_attributes():
    devs = devices_of("h100-8x-nvlink")
    assert [d.name for d in devs] == [f"gpu-{i}" for i in range(8)]
    d = devs[0]
    a = {k: v for k, (_t, v) in d.attributes.items()}
    assert a["type"] == "gpu" and a["productName"] == "NVIDIA H100 80GB HBM3"
    assert a["architecture"] == "Hopper" and a["brand"] == "Nvidia"
    assert d.attributes["cudaComputeCapability"] == ("version", "9.0.0")
    assert d.attributes["driverVersion"] == ("version", "550.54.15")
    assert d.attributes["cudaDriverVersion"] == ("version", "12.4.0")
    assert a["resource.kubernetes.io/pciBusID"] == "0000:18:00.0"
    assert a["resource.kubernetes.io/pcieRoot"] == "pci0000:15"
    assert a["uuid"].startswith("GPU-")
    assert d.capacity == {"memory": 81559 * 2**20}
    # One NVLink domain through the NVSwitches: every GPU carries the same value.
    assert len({x.attributes["nvlinkDomain"] for x in devs}) == 1


def test_mig_devices_named_like_nvidia():
    devs = devices_of("a100-4x-mig")
    assert len(devs) == 8 and all(d.type == "mig" for d in devs)
    assert [d.name for d in devs[:2]] == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"]
    d = devs[1]
    assert d.attributes["profile"] == ("string", "3g.20gb")
    assert d.attributes["productName"] == ("string", "NVIDIA A100 80GB PCIe")
    assert d.attributes["parentUUID"][1].startswith("GPU-") and d.attributes["uuid"][1].startswith("MIG-")
    assert d.attributes["driverVersion"] == ("version", "535.104.5")  # leading zero dropped
    assert d.capacity["multiprocessors"] == 42 and d.capacity["memory"] == 19968 * 2**20
    assert {k for k in d.capacity if k.startswith("memorySlice")} == {f"memorySlice{i}" for i in range(4, 8)}
    assert "nvlinkDomain" not in d.attributes
    assert d.gi_id == 2 and d.minor == 0


def test_mig_name_rules():
    assert mig_device_name(0, "1g.10gb", 19, 0) == "gpu-0-mig-1g10gb-19-0"
    assert mig_device_name(3, "1c.3g.40gb", 9, 4) == "gpu-3-mig-1c3g40gb-9-4"
    # NVIDIA's rule: drop dots, lowercase, anything else outside [a-z0-9-] becomes "-".
    assert mig_device_name(1, "1g.12gb+me", 20, 6) == "gpu-1-mig-1g12gb-me-20-6"
    assert mig_device_name(0, "1g.10gb+gfx", 47, 2) == "gpu-0-mig-1g10gb-gfx-47-2"
    # Compute instances sharing one GPU instance: one name each.
    assert mig_device_name(3, "1c.3g.40gb", 9, 4, 0) == "gpu-3-mig-1c3g40gb-9-4-0"


def test_nvlink_domains_in_mixed_node():
    devs = {d.name: d for d in devices_of("mixed-nvlink-pairs")}
    dom = {n: d.attributes.get("nvlinkDomain", (None, None))[1] for n, d in devs.items()}
    assert dom["gpu-0"] == dom["gpu-1"] and dom["gpu-2"] == dom["gpu-3"]
    assert dom["gpu-0"] != dom["gpu-2"]
    assert dom["gpu-4"] is None  # the L4 has no NVLink: no attribute at all
    assert devs["gpu-4"].attributes["architecture"] == ("string", "Ada Lovelace")


def test_a100_nvlink_ring_is_one_domain():
    devs = devices_of("a100-4x-nvlink")
    assert len({d.attributes["nvlinkDomain"] for d in devs}) == 1 and len(devs) == 4


def test_nvlink_domain_is_stable_and_node_unique():
    a = devices_of("mixed-nvlink-pairs")
    b = devices_of("mixed-nvlink-pairs")
    assert [d.attributes.get("nvlinkDomain") for d in a] == [d.attributes.get("nvlinkDomain") for d in b]
    other = devices_of("a100-4x-nvlink")[0].attributes["nvlinkDomain"]
    assert other not in {d.attributes.get("nvlinkDomain") for d in a}


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("535.104.05", "535.104.5"),
        ("9.0", "9.0.0"),
        ("12", "12.0.0"),
        ("550.54.15", "550.54.15"),
        ("470.57.02.1", "470.57.2+1"),
        ("v1.2.3", "1.2.3"),
        ("1.2.3-rc.01", "1.2.3-rc.1"),
        ("0.0.0", "0.0.0"),
    ],
)
def test_semver_coercion(raw, want):
    assert coerce_semver(raw) == want
    assert is_strict_semver(want)


@pytest.mark.parametrize("raw", ["", "abc", "1.x", "1..2", "-1.0.0"])
def test_semver_coercion_rejects_garbage(raw):
    with pytest.raises(ValueError, match="version"):
        coerce_semver(raw)


def test_cuda_driver_version():
    assert cuda_driver_version(12040) == "12.4.0"
    assert cuda_driver_version(11080) == "11.8.0"
    assert cuda_driver_version(12060) == "12.6.0"


def test_pci_bus_id_normalised():
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id(b"00000001:AF:00.1") == "0001:af:00.1"


def test_memory_not_supported_omits_capacity(tmp_path: Path):
    topo = tmp_path / "t.yaml"
    topo.write_text(
        "driverVersion: '560.35.03'\ncudaDriverVersion: 12060\ngpus:\n"
        "- {name: NVIDIA GH200 480GB, uuid: GPU-1, architecture: Hopper, computeCapability: '9.0',\n"
        "   memoryBytes: null, pciBusId: '00000009:01:00.0', addressingMode: ATS}\n"
    )
    (d,) = build_devices(open_sim(topo).enumerate())
    assert d.capacity == {}
    assert d.attributes["addressingMode"] == ("string", "ATS")
    assert d.attributes["resource.kubernetes.io/pciBusID"] == ("string", "0009:01:00.0")


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_published_key_is_in_the_schema(topology):
    for d in devices_of(topology):
        for key, (kind, _v) in d.attributes.items():
            spec = lookup(*normalize_key(key), kind="attribute")
            assert spec is not None, f"{d.name}: attribute {key} missing from driver/schema.py"
            assert spec.type == kind and d.type in spec.device_types
        for key in d.capacity:
            spec = lookup(*normalize_key(key), kind="capacity")
            assert spec is not None, f"{d.name}: capacity {key} missing from driver/schema.py"
            assert d.type in spec.device_types
        assert len(d.attributes) + len(d.capacity) <= 32


def test_schema_lookup_and_export():
    assert lookup(DRIVER_NAME, "memorySlice7").name == "memorySlice<N>"
    assert lookup(DRIVER_NAME, "memorySlice07") is None
    assert lookup(DRIVER_NAME, "memorySlice") is None
    assert lookup(DRIVER_NAME, "migProfile") is None  # the seed article's name; the driver says "profile"
    assert lookup("resource.kubernetes.io", "pciBusID").type == "string"
    assert lookup(DRIVER_NAME, "pciBusID") is None
    assert lookup(DRIVER_NAME, "nvlinkDomain").device_types == frozenset({"gpu"})
    doc = json.loads(json.dumps(export_schema()))
    names = {a["name"] for a in doc["attributes"]}
    assert {"type", "uuid", "productName", "nvlinkDomain", "pciBusID", "profile", "parentUUID"} <= names
    assert {c["name"] for c in doc["capacities"]} >= {"memory", "multiprocessors", "memorySlice<N>"}
    assert doc["opaqueConfig"]["oneOf"]
    assert len({(s.domain, s.name) for s in ATTRIBUTES}) == len(ATTRIBUTES)


def test_sim_selected_by_env_and_real_overrides(monkeypatch):
    monkeypatch.setenv("DRAGUARD_NVML_SIM", "a100-4x-mig")
    assert open_nvml(None, False).simulated
    with pytest.raises(NvmlUnavailable, match="NVML is not usable"):
        open_nvml(None, True)  # --real never falls back to simulation (no GPU on this machine)


def test_sim_logs_loudly(caplog):
    with caplog.at_level("WARNING"):
        load_topology("a100-4x-mig")
    assert any("SIMULATED NVML" in r.message for r in caplog.records)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus: []\n", "missing required field 'driverVersion'"),
        (
            "driverVersion: '1'\ncudaDriverVersion: 1\ngpus:\n- {name: x}\n",
            "gpus[0]: missing required field 'computeCapability'",
        ),
        (
            "driverVersion: '1'\ncudaDriverVersion: 1\ngpus:\n- {name: x, uuid: u, architecture: Foo,"
            " computeCapability: '8.0', pciBusId: p}\n",
            "unknown value 'Foo'",
        ),
        ("[unclosed\n", "not valid YAML"),
    ],
)
def test_bad_topology_errors_name_file_and_field(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(TopologyError) as err:
        load_topology(p)
    assert needle in str(err.value) and str(p) in str(err.value)


def test_nvml_errors_are_counted_and_probing_is_not(tmp_path):
    from driver.metrics import DriverMetrics

    m = DriverMetrics()
    open_sim(
        "mixed-nvlink-pairs", on_error=m.nvml_error
    ).enumerate()  # the L4 answers NOT_SUPPORTED to NVLink probes
    # The series exists from the start (alerts read its increase), at 0: probing counted nothing.
    assert m.registry.get_sample_value("dra_plugin_errors_total", {"operation": "nvml"}) == 0

    topo = tmp_path / "lost.yaml"
    topo.write_text(
        (Path(__file__).parents[2] / "driver/sim/topologies/a100-4x-nvlink.yaml").read_text()
        + "faults: {nvmlDeviceGetUUID: 15}\n"
    )  # NVML_ERROR_GPU_IS_LOST
    node = open_sim(topo, on_error=m.nvml_error).enumerate()  # every GPU lost: isolated, not fatal
    assert node.gpus == () and [f.index for f in node.failed] == [0, 1, 2, 3]
    assert all("nvmlDeviceGetUUID failed" in f.error and f.uuid is None for f in node.failed)
    # Per GPU: the failed read and the failed attempt to learn its UUID for the log.
    assert m.registry.get_sample_value("dra_plugin_nvml_errors_total", {"call": "nvmlDeviceGetUUID"}) == 8
