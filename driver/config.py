"""Opaque device configuration accepted by the driver (`resource.nvidia.com/v1beta1`).

`validate_opaque_config` is the one validator: the driver calls it at prepare time and the
admission webhook calls it on ResourceClaims, templates and DeviceClasses, so both always agree.
Decoding is strict like NVIDIA's: unknown fields are errors. Pure module (no I/O).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

API_GROUP = "resource.nvidia.com"
API_VERSION = "resource.nvidia.com/v1beta1"
LEGACY_API_VERSIONS = ("gpu.nvidia.com/v1alpha1", "resource.nvidia.com/v1alpha1")
KINDS: dict[str, frozenset[str]] = {"GpuConfig": frozenset({"gpu"}), "MigDeviceConfig": frozenset({"mig"})}
STRATEGIES = ("TimeSlicing", "MPS")
INTERVALS = ("Default", "Short", "Medium", "Long")
MAX_PARAMETERS_BYTES = 10 * 1024

# nvidia-smi compute-policy --set-timeslice values.
INTERVAL_VALUES: dict[str, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")
_GPU_KEY = re.compile(r"^(0|[1-9][0-9]*|GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F-]+)$")

Strategy = Literal["TimeSlicing", "MPS"]
Interval = Literal["Default", "Short", "Medium", "Long"]


@dataclass(frozen=True, slots=True)
class ConfigError:
    """One problem in an opaque config; `path` is a dotted field path like `sharing.strategy`."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigValidationError(ValueError):
    """Raised by `parse_opaque_config` with every problem found."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


@dataclass(frozen=True, slots=True)
class MpsConfig:
    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: str | None = None
    default_per_device_pinned_memory_limit: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sharing:
    strategy: Strategy
    interval: Interval | None = None
    mps: MpsConfig | None = None


@dataclass(frozen=True, slots=True)
class GpuConfig:
    sharing: Sharing | None = None
    kind: Literal["GpuConfig"] = "GpuConfig"


@dataclass(frozen=True, slots=True)
class MigDeviceConfig:
    sharing: Sharing | None = None
    kind: Literal["MigDeviceConfig"] = "MigDeviceConfig"


DeviceConfig = GpuConfig | MigDeviceConfig


def _quantity_schema() -> dict[str, Any]:
    return {"type": "string", "pattern": _QUANTITY.pattern}


_MPS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "defaultActiveThreadPercentage": {"type": "integer", "minimum": 0, "maximum": 100},
        "defaultPinnedDeviceMemoryLimit": _quantity_schema(),
        "defaultPerDevicePinnedMemoryLimit": {
            "type": "object",
            "propertyNames": {"pattern": _GPU_KEY.pattern},
            "additionalProperties": _quantity_schema(),
        },
    },
}


def _sharing_schema(time_slicing: bool) -> dict[str, Any]:
    props: dict[str, Any] = {"strategy": {"enum": list(STRATEGIES)}, "mpsConfig": _MPS_SCHEMA}
    if time_slicing:
        props["timeSlicingConfig"] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {"interval": {"enum": list(INTERVALS)}},
        }
    return {"type": "object", "additionalProperties": False, "required": ["strategy"], "properties": props}


OPAQUE_CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://draguard.io/schemas/resource.nvidia.com/v1beta1/opaque-config.json",
    "title": "Opaque device configuration for the gpu.nvidia.com driver",
    "oneOf": [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["apiVersion", "kind"],
            "properties": {
                "apiVersion": {"const": API_VERSION},
                "kind": {"const": kind},
                "sharing": _sharing_schema(time_slicing=(kind == "GpuConfig")),
            },
        }
        for kind in KINDS
    ],
}


def _fields(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...], errs: list[ConfigError]) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            errs.append(ConfigError(where, f"unknown field (allowed here: {', '.join(allowed)})"))


def _check_quantity(value: Any, path: str, errs: list[ConfigError]) -> None:
    if not isinstance(value, str) or not _QUANTITY.match(value):
        errs.append(
            ConfigError(path, f"must be a Kubernetes quantity such as '10Gi' or '512Mi', got {value!r}")
        )
    elif value.startswith("-"):
        errs.append(ConfigError(path, f"must not be negative, got {value!r}"))


def _check_mps(mps: Any, path: str, errs: list[ConfigError]) -> None:
    if not isinstance(mps, Mapping):
        errs.append(ConfigError(path, "must be an object"))
        return
    _fields(
        mps,
        path,
        (
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
        ),
        errs,
    )
    pct = mps.get("defaultActiveThreadPercentage")
    if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int) or not 0 <= pct <= 100):
        errs.append(
            ConfigError(
                f"{path}.defaultActiveThreadPercentage", f"must be an integer from 0 to 100, got {pct!r}"
            )
        )
    if "defaultPinnedDeviceMemoryLimit" in mps:
        _check_quantity(mps["defaultPinnedDeviceMemoryLimit"], f"{path}.defaultPinnedDeviceMemoryLimit", errs)
    per = mps.get("defaultPerDevicePinnedMemoryLimit")
    if per is not None:
        ppath = f"{path}.defaultPerDevicePinnedMemoryLimit"
        if not isinstance(per, Mapping):
            errs.append(ConfigError(ppath, "must be a map from GPU index or UUID to a quantity"))
        else:
            for key, val in per.items():
                if not isinstance(key, str) or not _GPU_KEY.match(key):
                    errs.append(
                        ConfigError(f"{ppath}.{key}", "key must be a GPU index (0, 1, ...) or a GPU/MIG UUID")
                    )
                _check_quantity(val, f"{ppath}.{key}", errs)


def _check_sharing(sharing: Any, kind: str, errs: list[ConfigError]) -> None:
    if not isinstance(sharing, Mapping):
        errs.append(ConfigError("sharing", "must be an object with a 'strategy' field"))
        return
    allowed = (
        ("strategy", "timeSlicingConfig", "mpsConfig") if kind == "GpuConfig" else ("strategy", "mpsConfig")
    )
    _fields(sharing, "sharing", allowed, errs)
    strategy = sharing.get("strategy")
    if strategy is None:
        errs.append(ConfigError("sharing.strategy", f"required (allowed values: {', '.join(STRATEGIES)})"))
    elif strategy not in STRATEGIES:
        errs.append(
            ConfigError(
                "sharing.strategy", f"unknown strategy {strategy!r} (allowed values: {', '.join(STRATEGIES)})"
            )
        )
    ts = sharing.get("timeSlicingConfig")
    if ts is not None and kind == "GpuConfig":
        if strategy == "MPS":
            errs.append(ConfigError("sharing.timeSlicingConfig", "only allowed with strategy TimeSlicing"))
        if not isinstance(ts, Mapping):
            errs.append(
                ConfigError("sharing.timeSlicingConfig", "must be an object with an 'interval' field")
            )
        else:
            _fields(ts, "sharing.timeSlicingConfig", ("interval",), errs)
            interval = ts.get("interval")
            if interval is not None and interval not in INTERVALS:
                errs.append(
                    ConfigError(
                        "sharing.timeSlicingConfig.interval",
                        f"unknown interval {interval!r} (allowed values: {', '.join(INTERVALS)})",
                    )
                )
    mps = sharing.get("mpsConfig")
    if mps is not None:
        if strategy == "TimeSlicing":
            errs.append(ConfigError("sharing.mpsConfig", "only allowed with strategy MPS"))
        _check_mps(mps, "sharing.mpsConfig", errs)


def validate_opaque_config(
    params: Mapping[str, Any], device_types: set[str] | None = None
) -> list[ConfigError]:
    """Validate one opaque `parameters` object; return every problem found (empty list = valid).

    `device_types`, when given, are the device types (`gpu`, `mig`) the config will be applied to;
    each of them must fit the kind (GpuConfig → gpu, MigDeviceConfig → mig).
    """
    errs: list[ConfigError] = []
    if not isinstance(params, Mapping):
        return [ConfigError("", "opaque parameters must be an object with apiVersion and kind")]
    try:
        size = len(json.dumps(params, separators=(",", ":"), default=str).encode())
    except (TypeError, ValueError) as exc:
        return [ConfigError("", f"parameters are not JSON-serialisable: {exc}")]
    if size > MAX_PARAMETERS_BYTES:
        errs.append(
            ConfigError("", f"parameters are {size} bytes; the API limit is {MAX_PARAMETERS_BYTES} bytes")
        )
    api_version = params.get("apiVersion")
    if api_version is None:
        errs.append(ConfigError("apiVersion", f"required; use {API_VERSION}"))
    elif api_version in LEGACY_API_VERSIONS:
        errs.append(
            ConfigError(
                "apiVersion",
                f"{api_version} is no longer served by the driver; "
                f"replace it with {API_VERSION} (kind and fields stay the same)",
            )
        )
    elif api_version != API_VERSION:
        errs.append(ConfigError("apiVersion", f"unsupported apiVersion {api_version!r}; use {API_VERSION}"))
    kind = params.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        what = "required" if kind is None else f"unsupported kind {kind!r}"
        errs.append(ConfigError("kind", f"{what} (allowed values: {', '.join(KINDS)})"))
        _fields(params, "", ("apiVersion", "kind", "sharing"), errs)
        return errs
    _fields(params, "", ("apiVersion", "kind", "sharing"), errs)
    if "sharing" in params and params["sharing"] is not None:
        _check_sharing(params["sharing"], kind, errs)
    if device_types:
        misfit = sorted(set(device_types) - KINDS[kind])
        if misfit:
            fits = (
                next(k for k, t in KINDS.items() if misfit[0] in t) if misfit[0] in {"gpu", "mig"} else None
            )
            hint = f"; use kind {fits} for them" if fits else ""
            errs.append(
                ConfigError("kind", f"{kind} cannot be applied to devices of type {', '.join(misfit)}{hint}")
            )
    return errs


def parse_opaque_config(params: Mapping[str, Any], device_types: set[str] | None = None) -> DeviceConfig:
    """Validate then decode; raises ConfigValidationError listing every problem."""
    errs = validate_opaque_config(params, device_types)
    if errs:
        raise ConfigValidationError(errs)
    sharing: Sharing | None = None
    raw = params.get("sharing")
    if isinstance(raw, Mapping):
        mps_raw = raw.get("mpsConfig")
        mps = None
        if isinstance(mps_raw, Mapping):
            mps = MpsConfig(
                default_active_thread_percentage=mps_raw.get("defaultActiveThreadPercentage"),
                default_pinned_device_memory_limit=mps_raw.get("defaultPinnedDeviceMemoryLimit"),
                default_per_device_pinned_memory_limit=dict(
                    mps_raw.get("defaultPerDevicePinnedMemoryLimit") or {}
                ),
            )
        ts = raw.get("timeSlicingConfig")
        interval = ts.get("interval") if isinstance(ts, Mapping) else None
        if raw["strategy"] == "TimeSlicing" and interval is None:
            interval = "Default"
        sharing = Sharing(strategy=raw["strategy"], interval=interval, mps=mps)
    if params["kind"] == "GpuConfig":
        return GpuConfig(sharing=sharing)
    return MigDeviceConfig(sharing=sharing)


def default_config(device_type: str) -> DeviceConfig:
    """The lowest-precedence config a device gets when nothing else applies."""
    return MigDeviceConfig() if device_type == "mig" else GpuConfig()
