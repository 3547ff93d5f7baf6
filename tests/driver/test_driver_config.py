"""Opaque config validation (shared by the driver at prepare time and the admission webhook)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.config import (
    OPAQUE_CONFIG_SCHEMA,
    ConfigError,
    ConfigValidationError,
    GpuConfig,
    MigDeviceConfig,
    parse_opaque_config,
    validate_opaque_config,
)

V = "resource.nvidia.com/v1beta1"

VALID: list[dict[str, Any]] = [
    {"apiVersion": V, "kind": "GpuConfig"},
    {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
    {
        "apiVersion": V,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    },
    {
        "apiVersion": V,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-1a2b": "1Gi"},
            },
        },
    },
    {"apiVersion": V, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}},
    {"apiVersion": V, "kind": "MigDeviceConfig"},
]


@pytest.mark.parametrize("params", VALID)
def test_valid_configs(params):
    assert validate_opaque_config(params) == []
    jsonschema.validate(params, OPAQUE_CONFIG_SCHEMA)
    cfg = parse_opaque_config(params)
    assert isinstance(cfg, GpuConfig if params["kind"] == "GpuConfig" else MigDeviceConfig)


def test_seed_article_config_gets_exact_replacement():
    seed = {
        "apiVersion": "gpu.nvidia.com/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    errs = validate_opaque_config(seed)
    assert errs == [
        ConfigError(
            "apiVersion",
            "gpu.nvidia.com/v1alpha1 is no longer served by the driver; "
            "replace it with resource.nvidia.com/v1beta1 (kind and fields stay the same)",
        )
    ]
    assert validate_opaque_config({**seed, "apiVersion": V}) == []


@pytest.mark.parametrize(
    ("params", "path", "needle"),
    [
        ({"kind": "GpuConfig"}, "apiVersion", "required; use resource.nvidia.com/v1beta1"),
        ({"apiVersion": "v1", "kind": "GpuConfig"}, "apiVersion", "unsupported apiVersion"),
        ({"apiVersion": V}, "kind", "allowed values: GpuConfig, MigDeviceConfig"),
        ({"apiVersion": V, "kind": "VfioDeviceConfig"}, "kind", "unsupported kind 'VfioDeviceConfig'"),
        ({"apiVersion": V, "kind": "GpuConfig", "extra": 1}, "extra", "unknown field"),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {}},
            "sharing.strategy",
            "allowed values: TimeSlicing, MPS",
        ),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}},
            "sharing.strategy",
            "unknown strategy 'Spatial'",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
            },
            "sharing.timeSlicingConfig.interval",
            "allowed values: Default, Short, Medium, Long",
        ),
        (
            {
                "apiVersion": V,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            },
            "sharing.timeSlicingConfig",
            "unknown field",
        ),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}},
            "sharing.timeSlicingConfig",
            "only allowed with strategy TimeSlicing",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
            },
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "0 to 100",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "ten gigs"}},
            },
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "Kubernetes quantity",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu zero": "1Gi"}},
                },
            },
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.gpu zero",
            "GPU index",
        ),
    ],
)
def test_invalid_configs_name_path_and_allowed_values(params, path, needle):
    errs = validate_opaque_config(params)
    assert any(e.path == path and needle in e.message for e in errs), errs
    with pytest.raises(ConfigValidationError):
        parse_opaque_config(params)


def test_kind_must_fit_device_types():
    assert validate_opaque_config({"apiVersion": V, "kind": "GpuConfig"}, {"gpu"}) == []
    (err,) = validate_opaque_config({"apiVersion": V, "kind": "GpuConfig"}, {"mig"})
    assert err.path == "kind" and "use kind MigDeviceConfig" in err.message


def test_size_limit():
    big = {
        "apiVersion": V,
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {str(i): "1Gi" for i in range(1200)}},
        },
    }
    assert len(json.dumps(big)) > 10 * 1024
    assert any("10240 bytes" in e.message for e in validate_opaque_config(big))


def test_not_a_mapping():
    assert validate_opaque_config([1, 2]) == [
        ConfigError("", "opaque parameters must be an object with apiVersion and kind")
    ]  # type: ignore[arg-type]


# --- property tests ----------------------------------------------------------------------------

quantities = st.builds(
    lambda n, s: f"{n}{s}", st.integers(0, 4096), st.sampled_from(["", "Ki", "Mi", "Gi", "M", "G"])
)
mps = st.fixed_dictionaries(
    {},
    optional={
        "defaultActiveThreadPercentage": st.integers(0, 100),
        "defaultPinnedDeviceMemoryLimit": quantities,
        "defaultPerDevicePinnedMemoryLimit": st.dictionaries(
            st.integers(0, 15).map(str), quantities, max_size=4
        ),
    },
)
gpu_sharing = st.one_of(
    st.fixed_dictionaries(
        {"strategy": st.just("TimeSlicing")},
        optional={
            "timeSlicingConfig": st.fixed_dictionaries(
                {}, optional={"interval": st.sampled_from(["Default", "Short", "Medium", "Long"])}
            )
        },
    ),
    st.fixed_dictionaries({"strategy": st.just("MPS")}, optional={"mpsConfig": mps}),
)
valid_gpu = st.fixed_dictionaries(
    {"apiVersion": st.just(V), "kind": st.just("GpuConfig")}, optional={"sharing": gpu_sharing}
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(valid_gpu)
def test_generated_valid_configs_pass_both_validators(params):
    assert validate_opaque_config(params) == []
    jsonschema.validate(params, OPAQUE_CONFIG_SCHEMA)


@settings(max_examples=200, deadline=None)
@given(
    valid_gpu,
    st.text(min_size=1, max_size=12).filter(lambda k: k not in {"apiVersion", "kind", "sharing"}),
    json_values,
)
def test_any_unknown_top_level_field_is_rejected_by_name(params, key, value):
    bad = {**params, key: value}
    errs = validate_opaque_config(bad)
    assert ConfigError(key, "unknown field (allowed here: apiVersion, kind, sharing)") in errs
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, OPAQUE_CONFIG_SCHEMA)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["apiVersion", "kind", "sharing", "x"]), json_values, max_size=4))
def test_arbitrary_input_never_raises_and_agrees_with_json_schema(params):
    errs = validate_opaque_config(params)
    assert all(isinstance(e, ConfigError) and e.message for e in errs)
    schema_ok = jsonschema.Draft202012Validator(OPAQUE_CONFIG_SCHEMA).is_valid(params)
    assert (errs == []) == schema_ok, (params, errs)
