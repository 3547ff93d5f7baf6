"""`config/opaque` judged by NVIDIA's DRA driver: every config kind it accepts, checked as its strict
decoder, `Normalize()`/`Validate()` and prepare-time checks do (webhook/dra/drivers/nvidia.py),
on NVIDIA's own demo manifests (tests/rules/fixtures/nvidia/, each naming its source)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rules.conftest import load_docs, read_sources
from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.drivers import nvidia
from webhook.dra.inventory import Inventory, load_inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate
from webhook.policy.model import PolicySet

NV = Path(__file__).parent / "fixtures" / "nvidia"
API = "resource.nvidia.com/v1beta1"
RULE = "config/opaque"


@pytest.fixture(scope="module")
def nv_inventory() -> Inventory:
    return load_inventory(NV / "inventory.yaml")


def _run(objs: list[SourceObject], inventory: Inventory | None = None, **ctx: Any) -> list[Finding]:
    r = evaluate(
        objs, PolicySet.empty(), inventory or Inventory.empty(), Context(**ctx), rule_modules=("opaque",)
    )
    assert not [f for f in r.findings if f.rule.startswith("internal/")], r.findings
    return [f for f in r.findings if f.rule == RULE]


def _vfio_template() -> dict[str, Any]:
    docs = load_docs(NV / "gpu-test-vfio-config.yaml")
    return next(d for d in docs if d["kind"] == "ResourceClaimTemplate")


def _params(doc: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = doc["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    return params


# -- NVIDIA's demo manifests ------------------------------------------------------------------------


def test_vfio_demo_is_accepted_under_nvidias_driver(nv_inventory: Inventory) -> None:
    objs = read_sources(NV / "gpu-test-vfio-config.yaml")
    assert _run(objs, nv_inventory) == []
    # Without an inventory, NVIDIA's chart classes among the reviewed files are the evidence.
    assert _run([*read_sources(NV / "deviceclasses.yaml"), *objs]) == []
    # The claim's own request for `vfio.gpu.nvidia.com` (a class only NVIDIA's chart installs) is too.
    assert _run(objs) == []


def test_vfio_demo_is_denied_when_the_bundled_driver_serves_the_cluster() -> None:
    findings = _run(read_sources(NV / "gpu-test-vfio-config.yaml"), driver_schema="draguard")
    assert findings and all(f.mode is Mode.ENFORCE for f in findings)
    assert any("unsupported kind 'VfioDeviceConfig'" in f.message for f in findings)


def test_mps_demo_is_accepted(nv_inventory: Inventory) -> None:
    assert _run(read_sources(NV / "gpu-test-mps.yaml"), nv_inventory) == []


@pytest.mark.parametrize(
    ("mutate", "field", "says"),
    [
        (lambda p: p["iommu"].update(backendPolicy="Preferred"), "iommu.backendPolicy",
         "unknown IOMMU backend policy: 'Preferred', supported IOMMU backend policies: "
         "LegacyOnly, PreferIommuFD"),
        (lambda p: p["iommu"].update(enableApiDevice=True), "iommu.enableApiDevice", "unknown field"),
        (lambda p: p["iommu"].update(enableAPIDevice="yes"), "iommu.enableAPIDevice",
         "must be true or false"),
        (lambda p: p.update(sharing={"strategy": "MPS"}), "sharing", "unknown field"),
        (lambda p: p.update(kind="ComputeDomainChannelConfig"), "kind",
         "ComputeDomainChannelConfig is a config of driver compute-domain.nvidia.com, not gpu.nvidia.com"),
        (lambda p: p.update(kind="ComputeDomain"), "kind", "ComputeDomain is not a device configuration"),
    ],
)
def test_broken_vfio_demo_names_the_field(
    nv_inventory: Inventory, mutate: Any, field: str, says: str
) -> None:
    doc = _vfio_template()
    mutate(_params(doc))
    findings = _run([SourceObject(doc)], nv_inventory)
    hit = [f for f in findings if f".parameters.{field}:" in f.message]
    assert hit, findings
    assert says in hit[0].message and hit[0].mode is Mode.ENFORCE and hit[0].severity is Severity.ERROR
    assert hit[0].message.startswith(f"spec.spec.devices.config[0].opaque.parameters.{field}: ")


def test_vfio_config_on_a_full_gpu_request_fails_as_prepare_does(nv_inventory: Inventory) -> None:
    doc = _vfio_template()
    doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    objs = [*read_sources(NV / "deviceclasses.yaml"), SourceObject(doc)]
    findings = _run(objs, nv_inventory)
    assert len(findings) == 1
    assert "VfioDeviceConfig cannot be applied to devices of type gpu; use kind GpuConfig" in (
        findings[0].message)


def test_mps_demo_on_a_mig_class_warns_for_a_class_wide_config(nv_inventory: Inventory) -> None:
    doc = next(d for d in load_docs(NV / "gpu-test-mps.yaml") if d["kind"] == "ResourceClaimTemplate")
    devices = doc["spec"]["spec"]["devices"]
    devices["requests"][0]["exactly"]["deviceClassName"] = "mig.nvidia.com"
    del devices["config"][0]["requests"]
    findings = _run([*read_sources(NV / "deviceclasses.yaml"), SourceObject(doc)], nv_inventory)
    assert len(findings) == 1 and findings[0].mode is Mode.WARN
    assert "GpuConfig applies to none of the devices" in findings[0].message
    assert findings[0].fix == "use MigDeviceConfig for these devices"


def _channel_claim(params: dict[str, Any], driver: str = "compute-domain.nvidia.com") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "imex-channel", "namespace": "imex"},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "channel",
                          "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
            "config": [{"requests": ["channel"], "opaque": {"driver": driver, "parameters": params}}],
        }}},
    }


def test_compute_domain_configs(nv_inventory: Inventory) -> None:
    good = {"apiVersion": API, "kind": "ComputeDomainChannelConfig",
            "domainID": "8c3e9a4e-7b44-4c59-9a9d-2f1b0c6d1e11", "allocationMode": "All"}
    classes = read_sources(NV / "deviceclasses.yaml")
    assert _run([*classes, SourceObject(_channel_claim(good))], nv_inventory) == []
    empty = _run([*classes, SourceObject(_channel_claim({**good, "domainID": ""}))], nv_inventory)
    assert [f.message.split(": ", 1)[1] for f in empty] == [
        "domainID cannot be empty (the ComputeDomain's UID)"]
    daemon = {"apiVersion": API, "kind": "ComputeDomainDaemonConfig", "domainID": "x"}
    misfit = _run([*classes, SourceObject(_channel_claim(daemon))], nv_inventory)
    assert len(misfit) == 1
    assert "ComputeDomainDaemonConfig cannot be applied to devices of type channel; use kind " \
           "ComputeDomainChannelConfig" in misfit[0].message
    # A daemon config does not carry allocationMode (strict decoding).
    extra = _run([*classes, SourceObject(_channel_claim({**daemon, "allocationMode": "All"}))], nv_inventory)
    assert any(".parameters.allocationMode: unknown field" in f.message for f in extra)


# -- the validator, rule by rule (each case: NVIDIA's Go source and what it does) -------------------


def _gpu(sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


def _mig(sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": sharing}


CASES: list[tuple[str, str, dict[str, Any], str | None]] = [
    # (why, driver, parameters, the path of the first error or None when accepted)
    ("no sharing: Validate() returns nil", "gpu.nvidia.com", {"apiVersion": API, "kind": "GpuConfig"}, None),
    ("TimeSlicing without config: Normalize() fills interval Default", "gpu.nvidia.com",
     _gpu({"strategy": "TimeSlicing"}), None),
    ("empty timeSlicingConfig: Validate() reads a nil interval", "gpu.nvidia.com",
     _gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {}}), "sharing.timeSlicingConfig.interval"),
    ("interval outside Default/Short/Medium/Long", "gpu.nvidia.com",
     _gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
     "sharing.timeSlicingConfig.interval"),
    ("GetTimeSlicingConfig refuses an MpsConfig", "gpu.nvidia.com",
     _gpu({"strategy": "TimeSlicing", "mpsConfig": {}}), "sharing.mpsConfig"),
    ("GetMpsConfig refuses a TimeSlicingConfig", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}), "sharing.timeSlicingConfig"),
    ("MIG sharing has no timeSlicingConfig field", "gpu.nvidia.com",
     _mig({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
     "sharing.timeSlicingConfig"),
    ("MIG TimeSlicing ignores mpsConfig (GetTimeSlicingConfig returns nil)", "gpu.nvidia.com",
     _mig({"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercentage": 10}}), None),
    ("thread percentage over 100", "gpu.nvidia.com",
     _mig({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
     "sharing.mpsConfig.defaultActiveThreadPercentage"),
    ("thread percentage is an int", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 12.5}}),
     "sharing.mpsConfig.defaultActiveThreadPercentage"),
    ("multiUser (MpsConfig, 2026-08)", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "mpsConfig": {"multiUser": True}}), None),
    ("pinned limit under 1 MiB: Megabyte() is 0", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"),
    ("pinned limit not a quantity", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "ten gigs"}}),
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"),
    ("per-device keys: an index or a UUID", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {
         "0": "1Gi", "GPU-4a1f2c3e-0000-0000-0000-000000000001": "2Gi"}}}), None),
    ("per-device key neither", "gpu.nvidia.com",
     _gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"first": "1Gi"}}}),
     "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.first"),
    ("strategy missing: an empty strategy is unknown", "gpu.nvidia.com", _gpu({}), "sharing.strategy"),
    ("VFIO defaults: Normalize() sets LegacyOnly", "gpu.nvidia.com",
     {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"enableAPIDevice": False}}, None),
    ("VFIO PreferIommuFD", "gpu.nvidia.com",
     {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "PreferIommuFD"}}, None),
    ("legacy apiVersion", "gpu.nvidia.com", {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"},
     "apiVersion"),
    ("GpuConfig is not a compute-domain config", "compute-domain.nvidia.com",
     {"apiVersion": API, "kind": "GpuConfig"}, "kind"),
    ("daemon config needs domainID", "compute-domain.nvidia.com",
     {"apiVersion": API, "kind": "ComputeDomainDaemonConfig"}, "domainID"),
    ("domainID null decodes as empty", "compute-domain.nvidia.com",
     {"apiVersion": API, "kind": "ComputeDomainDaemonConfig", "domainID": None}, "domainID"),
]


@pytest.mark.parametrize(("why", "driver", "params", "path"), CASES, ids=[c[0] for c in CASES])
def test_validator_follows_nvidias_rules(
    why: str, driver: str, params: dict[str, Any], path: str | None
) -> None:
    errors = nvidia.validate(driver, params)
    if path is None:
        assert errors == [], why
    else:
        assert errors and errors[0].path == path, (why, errors)


def test_sharing_needs_the_feature_gates_the_driver_was_started_with() -> None:
    ts = _gpu({"strategy": "TimeSlicing"})
    assert nvidia.validate("gpu.nvidia.com", ts) == []
    errors = nvidia.validate("gpu.nvidia.com", ts, gates={"MPSSupport"})
    assert [e.message for e in errors] == [
        "'TimeSlicing' is selected as the GPU sharing strategy, but the 'TimeSlicingSettings' feature gate "
        "is not enabled"]


# -- generated configs --------------------------------------------------------------------------------

_quantities = st.sampled_from(["1Mi", "10Gi", "1G", "2048Mi", "1.5Gi", 1073741824])
_mps = st.fixed_dictionaries({}, optional={
    "defaultActiveThreadPercentage": st.integers(0, 100),
    "defaultPinnedDeviceMemoryLimit": _quantities,
    "defaultPerDevicePinnedMemoryLimit": st.dictionaries(
        st.sampled_from(["0", "1", "7", "GPU-1", "MIG-0a"]), _quantities, max_size=3),
    "multiUser": st.booleans(),
})
_gpu_sharing = st.one_of(
    st.fixed_dictionaries({"strategy": st.just("TimeSlicing")},
                          optional={"timeSlicingConfig": st.fixed_dictionaries(
                              {"interval": st.sampled_from(nvidia.INTERVALS)})}),
    st.fixed_dictionaries({"strategy": st.just("MPS")}, optional={"mpsConfig": _mps}),
)
_valid = st.one_of(
    st.builds(_gpu, _gpu_sharing),
    st.builds(_mig, st.fixed_dictionaries({"strategy": st.sampled_from(nvidia.STRATEGIES)},
                                          optional={"mpsConfig": _mps})),
    st.fixed_dictionaries({"apiVersion": st.just(API), "kind": st.just("VfioDeviceConfig")},
                          optional={"iommu": st.fixed_dictionaries({}, optional={
                              "backendPolicy": st.sampled_from(nvidia.BACKEND_POLICIES),
                              "enableAPIDevice": st.booleans()})}),
)


def _objects(obj: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every object in a config that has a fixed set of fields ("" is the top)."""
    out = [prefix]
    for k, v in obj.items():
        if isinstance(v, dict) and k != "defaultPerDevicePinnedMemoryLimit":
            out += _objects(v, f"{prefix}.{k}" if prefix else k)
    return out


def _at(obj: Any, path: str) -> Any:
    for part in filter(None, path.split(".")):
        obj = obj[part]
    return obj


@settings(max_examples=150, deadline=None)
@given(_valid, st.data())
def test_generated_valid_configs_pass_and_any_unknown_field_is_named(
    params: dict[str, Any], data: Any
) -> None:
    assert nvidia.validate("gpu.nvidia.com", params) == []
    where = data.draw(st.sampled_from(_objects(params)))
    broken = copy.deepcopy(params)
    _at(broken, where)["replicas"] = 2
    errors = nvidia.validate("gpu.nvidia.com", broken)
    expected = f"{where}.replicas" if where else "replicas"
    assert [e.path for e in errors] == [expected]
    assert "unknown field" in errors[0].message


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["apiVersion", "kind", "sharing", "strategy", "mpsConfig", "timeSlicingConfig",
                         "interval", "iommu", "backendPolicy", "domainID", "defaultActiveThreadPercentage",
                         "defaultPerDevicePinnedMemoryLimit", "defaultPinnedDeviceMemoryLimit", "0", "x"])
        | st.integers(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.sampled_from(["gpu.nvidia.com", "compute-domain.nvidia.com", "other"]))
def test_hostile_parameters_get_errors_never_exceptions(params: Any, driver: str) -> None:
    mig_mps = {"apiVersion": API, "kind": "MigDeviceConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": params}}
    for candidate in (params, {"apiVersion": API, "kind": "GpuConfig", "sharing": params}, mig_mps):
        errors = nvidia.validate(driver, candidate)
        assert all(isinstance(e.message, str) and e.message for e in errors)
