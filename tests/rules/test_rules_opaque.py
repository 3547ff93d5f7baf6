"""`config/opaque`: the bundled driver's opaque configs, checked with the driver's own validator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.config import ConfigValidationError, parse_opaque_config
from webhook.core.findings import Finding, Mode, Severity
from webhook.core.source import SourceObject
from webhook.dra.inventory import Inventory
from webhook.engine.context import Context
from webhook.engine.evaluate import evaluate

RULE = "config/opaque"
GOOD_GPU = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}
GOOD_MIG = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "MigDeviceConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
}


def _run(objs: list[SourceObject], inventory: Inventory | None = None) -> list[Finding]:
    from webhook.policy.model import PolicySet

    r = evaluate(objs, PolicySet.empty(), inventory or Inventory.empty(), Context(), rule_modules=("opaque",))
    assert not [f for f in r.findings if f.rule.startswith("internal/")], r.findings
    return r.findings


def _claim(
    params: Any,
    requests: list[str] | None = None,
    cls: str = "gpu.nvidia.com",
    driver: str = "gpu.nvidia.com",
    version: str = "resource.k8s.io/v1",
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        cfg["requests"] = requests
    req: dict[str, Any] = (
        {"name": "g", "exactly": {"deviceClassName": cls}}
        if version != "resource.k8s.io/v1beta1"
        else {"name": "g", "deviceClassName": cls}
    )
    return {
        "apiVersion": version,
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ml"},
        "spec": {"devices": {"requests": [req], "config": [cfg]}},
    }


def test_seed_classes_old_api_version(sources: Callable[[Path], list[SourceObject]], seed_dir: Path) -> None:
    findings = _run(sources(seed_dir / "deviceclasses.yaml"))
    assert len(findings) == 2  # the A100 and H100 classes; the MIG class has no config
    for f in findings:
        assert f.rule == RULE and f.mode is Mode.ENFORCE and f.severity is Severity.ERROR
        assert f.message.startswith("spec.config[0].opaque.parameters.apiVersion: gpu.nvidia.com/v1alpha1")
        assert "resource.nvidia.com/v1beta1" in f.message
        assert f.fix == "set parameters.apiVersion: resource.nvidia.com/v1beta1"
        assert f.line is not None and f.file is not None


def test_valid_configs_are_clean(inventory: Inventory) -> None:
    assert _run([SourceObject(_claim(GOOD_GPU, ["g"]))], inventory) == []
    assert _run([SourceObject(_claim(GOOD_MIG, ["g"], cls="a100-mig-3g20gb"))], inventory) == []
    assert _run([SourceObject(_claim(GOOD_GPU, version="resource.k8s.io/v1beta1"))], inventory) == []


def test_unknown_field_and_bad_value_name_the_path() -> None:
    params = {**GOOD_GPU, "sharing": {"strategy": "Spatial", "bogus": True}}
    msgs = sorted(f.message for f in _run([SourceObject(_claim(params))]))
    assert any(
        m.startswith("spec.devices.config[0].opaque.parameters.sharing.bogus: unknown field") for m in msgs
    )
    assert any(
        "sharing.strategy: unknown strategy 'Spatial' (allowed values: TimeSlicing, MPS)" in m for m in msgs
    )


def test_gpu_config_on_mig_only_request(inventory: Inventory) -> None:
    # From the inventory: the class matches MIG devices only.
    findings = _run([SourceObject(_claim(GOOD_GPU, ["g"], cls="a100-mig-3g20gb"))], inventory)
    assert len(findings) == 1 and findings[0].mode is Mode.ENFORCE
    assert (
        "GpuConfig cannot be applied to devices of type mig; use kind MigDeviceConfig" in findings[0].message
    )
    # Without an inventory the class name / selector text tells the type.
    findings = _run([SourceObject(_claim(GOOD_GPU, ["g"], cls="gpu.nvidia.com-a100-mig-3g20gb"))])
    assert len(findings) == 1 and "type mig" in findings[0].message


def test_config_without_requests_that_fits_nothing_warns(inventory: Inventory) -> None:
    findings = _run([SourceObject(_claim(GOOD_GPU, cls="a100-mig-3g20gb"))], inventory)
    assert len(findings) == 1
    assert findings[0].mode is Mode.WARN and "the driver ignores it" in findings[0].message
    # A class config fitting some of its devices is fine (the driver applies it to those).
    dc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "any-nvidia"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": GOOD_GPU}}],
        },
    }
    assert _run([SourceObject(dc)], inventory) == []


def test_requests_must_exist() -> None:
    findings = _run([SourceObject(_claim(GOOD_GPU, ["g", "nope", "g/sub"]))])
    assert len(findings) == 1
    assert (
        findings[0].message
        == "spec.devices.config[0].requests: nope, g/sub not in this claim (requests here: g)"
    )


def test_subrequest_reference_and_other_drivers() -> None:
    claim = _claim(GOOD_MIG, ["g/small"])
    claim["spec"]["devices"]["requests"] = [
        {
            "name": "g",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.nvidia.com-h100"},
                {"name": "small", "deviceClassName": "mig-1g"},
            ],
        }
    ]
    assert _run([SourceObject(claim)]) == []
    other = _claim({"anything": "goes"}, driver="example.com/other")
    assert _run([SourceObject(other)]) == []


def test_size_limit() -> None:
    params = {
        **GOOD_GPU,
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {str(i): "1Gi" for i in range(1000)}},
        },
    }
    findings = _run([SourceObject(_claim(params))])
    assert any("the API limit is 10240 bytes" in f.message for f in findings)


def test_missing_or_non_object_parameters() -> None:
    for params in (None, "text", [1, 2], {}):
        findings = _run([SourceObject(_claim(params))])
        assert findings and all(f.rule == RULE for f in findings)


# -- the rule and the driver's decoder agree ------------------------------------------------------

# Built once: hypothesis reruns the test body many times.
_INVENTORY = Inventory.from_objects(
    d for d in yaml.safe_load_all((Path(__file__).parent / "fixtures" / "inventory.yaml").read_text()) if d
)

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 150),
    st.text(max_size=6),
    st.sampled_from(["TimeSlicing", "MPS", "Long", "Short", "1Gi", "0", "GPU-abc", "-1Gi"]),
)
_mps = st.dictionaries(
    st.sampled_from(
        [
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "extra",
        ]
    ),
    st.one_of(_values, st.dictionaries(st.sampled_from(["0", "1", "GPU-1a", "x"]), _values, max_size=2)),
    max_size=3,
)
_sharing = st.fixed_dictionaries(
    {},
    optional={
        "strategy": st.sampled_from(["TimeSlicing", "MPS", "Other"]),
        "timeSlicingConfig": st.one_of(
            _values,
            st.fixed_dictionaries(
                {}, optional={"interval": st.sampled_from(["Default", "Short", "Medium", "Long", "Huge"])}
            ),
        ),
        "mpsConfig": st.one_of(_values, _mps),
        "unknown": _values,
    },
)
_params = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.sampled_from(["resource.nvidia.com/v1beta1", "gpu.nvidia.com/v1alpha1", "v1"]),
        "kind": st.sampled_from(["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"]),
        "sharing": st.one_of(_values, _sharing),
        "extra": _values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=_params, mig=st.booleans())
def test_rule_and_driver_decoder_agree(params: dict[str, Any], mig: bool) -> None:
    """Admission accepts exactly what the driver's prepare can decode for the request's devices."""
    cls = "a100-mig-3g20gb" if mig else "gpu.nvidia.com-h100"
    findings = _run([SourceObject(_claim(params, ["g"], cls=cls))], _INVENTORY)
    try:
        parse_opaque_config(params, {"mig" if mig else "gpu"})
        decodes = True
    except ConfigValidationError:
        decodes = False
    denied = [f for f in findings if f.mode is Mode.ENFORCE]
    assert decodes == (not denied), (params, [f.message for f in findings])
