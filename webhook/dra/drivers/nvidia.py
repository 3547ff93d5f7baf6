"""NVIDIA's DRA driver (`gpu.nvidia.com`, `compute-domain.nvidia.com`): what it publishes and how it
checks opaque configs, as data and a pure-Python port of its rules.

Facts from kubernetes-sigs/dra-driver-nvidia-gpu at 95932046 (2026-08-07; the project formerly at
NVIDIA/k8s-dra-driver-gpu, whose 22407113 has the same config API less `mpsConfig.multiUser`):
- attributes: `cmd/gpu-kubelet-plugin/deviceinfo.go` (`GpuInfo.Attributes`, `addNumaNodeAttribute`,
  `addFabricManagerAttributes`, `VfioDeviceInfo.GetDevice`), `mig.go` (`CommonAttributesMig`,
  `CommonCapacitiesMig`), `cmd/compute-domain-kubelet-plugin/deviceinfo.go` (channel, daemon);
- configs: `api/nvidia.com/resource/v1beta1/{api,gpuconfig,migconfig,vfiodeviceconfig,iommu,
  sharing,validate,computedomainconfig}.go` (strict decoding, `Normalize()`, `Validate()`), and the
  prepare-time checks in `cmd/gpu-kubelet-plugin/device_state.go` (`prepareDevices`: which kind fits
  which device type; `applyConfig`: `GetTimeSlicingConfig`/`GetMpsConfig`) and `sharing.go`
  (`MpsPerDevicePinnedMemoryLimit.Normalize`: limits of at least 1 MiB, keys an index or a UUID).

The Go module proxy does not serve the driver's module (403 for every version of
github.com/NVIDIA/k8s-dra-driver-gpu and sigs.k8s.io/dra-driver-nvidia-gpu), so admission cannot
link NVIDIA's code and runs this port. `tools/nvconfig` builds NVIDIA's own API types from the
driver's source at 95932046 (fetched from git by its source.sh), and
`tests/rules/test_nvidia_differential.py` requires the same verdict from both on hand-written and
generated configs, with the sharing gates on and off.

Sharing needs the driver's `TimeSlicingSettings` / `MPSSupport` feature gates (alpha, off by default);
without them the driver refuses every `sharing` block. The gates are node flags admission cannot
see, so by default both are taken as enabled (`ASSUMED_GATES`); `validate(..., gates=...)` judges
for another setting.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from ..._driver import K8S_DOMAIN, AttrSpec, AttrType, ConfigError
from ..quantity import Quantity
from . import DriverSchema

GPU_DRIVER = "gpu.nvidia.com"
CD_DRIVER = "compute-domain.nvidia.com"
API_VERSION = "resource.nvidia.com/v1beta1"
LEGACY_API_VERSIONS = ("gpu.nvidia.com/v1alpha1", "resource.nvidia.com/v1alpha1")
MAX_PARAMETERS_BYTES = 10 * 1024  # resource.k8s.io OpaqueParametersMaxLength

GATES = frozenset({"TimeSlicingSettings", "MPSSupport"})
ASSUMED_GATES = GATES

KINDS: dict[str, dict[str, frozenset[str]]] = {
    GPU_DRIVER: {
        "GpuConfig": frozenset({"gpu"}),
        "MigDeviceConfig": frozenset({"mig"}),
        "VfioDeviceConfig": frozenset({"vfio"}),
    },
    CD_DRIVER: {
        "ComputeDomainChannelConfig": frozenset({"channel"}),
        "ComputeDomainDaemonConfig": frozenset({"daemon"}),
    },
}
# Registered in the driver's scheme (so they decode) but no device config.
_NOT_CONFIGS = ("ComputeDomain", "ComputeDomainClique")

STRATEGIES = ("TimeSlicing", "MPS")
INTERVALS = ("Default", "Short", "Medium", "Long")
BACKEND_POLICIES = ("LegacyOnly", "PreferIommuFD")

_G = frozenset({"gpu"})
_M = frozenset({"mig"})
_V = frozenset({"vfio"})
_GM = frozenset({"gpu", "mig"})
_GMV = frozenset({"gpu", "mig", "vfio"})
_GV = frozenset({"gpu", "vfio"})
_CD = frozenset({"channel", "daemon"})


def _a(name: str, typ: AttrType, types: frozenset[str], desc: str, *, domain: str = GPU_DRIVER,
       optional: bool = False) -> AttrSpec:
    return AttrSpec(domain, name, "attribute", typ, types, desc, optional)


def _c(name: str, types: frozenset[str], desc: str, *, optional: bool = False) -> AttrSpec:
    return AttrSpec(GPU_DRIVER, name, "capacity", "quantity", types, desc, optional)


ATTRIBUTES: tuple[AttrSpec, ...] = (
    _a("type", "string", _GMV, 'Device type: "gpu", "mig" or "vfio".'),
    _a("uuid", "string", _GMV, "NVML UUID of the GPU or MIG device."),
    _a("productName", "string", _GMV, 'Name from NVML, e.g. "NVIDIA H100 80GB HBM3".'),
    _a("brand", "string", _GM, "NVML brand: Tesla, Nvidia, GeForce, ..."),
    _a("architecture", "string", _GM, 'Ampere, Hopper, "Ada Lovelace", Blackwell, ...'),
    _a("cudaComputeCapability", "version", _GM, "CUDA compute capability, e.g. 9.0.0."),
    _a("driverVersion", "version", _GM, "Kernel driver version, coerced to semver."),
    _a("cudaDriverVersion", "version", _GM, "Highest CUDA version the driver supports."),
    _a("addressingMode", "string", _GM, "HMM, ATS or None; coherent-memory systems only.", optional=True),
    _a("profile", "string", _M, "MIG profile, e.g. 1g.10gb."),
    _a("parentUUID", "string", _M, "UUID of the MIG device's GPU."),
    _a("deviceID", "string", _V, "PCI device id of the VFIO device."),
    _a("vendorID", "string", _V, "PCI vendor id of the VFIO device."),
    _a("iommuFDEnabled", "bool", _V, "Whether the IOMMU FD backend is available."),
    # Up to v0.4 (and in site/content/docs/reference/resourceslice-attributes.md); later releases
    # publish resource.kubernetes.io/numaNode instead.
    _a("numa", "int", _V, "NUMA node of the VFIO device (older releases).", optional=True),
    # Published up to v25.3 (cmd/gpu-kubelet-plugin/deviceinfo.go at v25.3.2), removed in v25.8:
    # clusters still running those releases have them.
    _a("index", "int", _GM, "NVML index of the GPU or MIG device (v25.3 and earlier).", optional=True),
    _a("minor", "int", _G, "Device minor number of the GPU (v25.3 and earlier).", optional=True),
    _a("parentIndex", "int", _M, "NVML index of the MIG device's GPU (v25.3 and earlier).", optional=True),
    _a("pcieBusID", "string", _GM, "PCI bus id in the driver domain (v25.3 and earlier).", optional=True),
    # Fabric Manager partitions (gate FabricManagerPartitioning): on NVSwitch systems only.
    _a("gpuModuleID", "int", _GV, "Fabric Manager module id of the GPU.", optional=True),
    _a("partition<N>", "int", _GV, "Id of the Fabric Manager partition of N GPUs holding this GPU.",
       optional=True),
    _a("pciBusID", "string", _GMV, "PCI bus id, e.g. 0000:3b:00.0.", domain=K8S_DOMAIN),
    _a("pcieRoot", "string", _GMV, "PCIe root complex; when resolvable.", domain=K8S_DOMAIN, optional=True),
    # KEP-6072 standard attribute; a list of ints under the DRAListTypeAttributes gate.
    _a("numaNode", "int", _GMV, "NUMA node of the device; absent without one.", domain=K8S_DOMAIN,
       optional=True),
    _c("memory", _GM, "Device memory in bytes; omitted when NVML reports NOT_SUPPORTED.", optional=True),
    _c("multiprocessors", _M, "Streaming multiprocessors of the MIG device."),
    _c("copyEngines", _M, "Copy engines of the MIG device."),
    _c("decoders", _M, "Video decoders of the MIG device."),
    _c("encoders", _M, "Video encoders of the MIG device."),
    _c("jpegEngines", _M, "JPEG engines of the MIG device."),
    _c("ofaEngines", _M, "Optical flow accelerators of the MIG device."),
    _c("memorySlice<N>", _M, "1 for each memory slice N of a static MIG device's placement.", optional=True),
    _c("addressableMemory", _V, "Addressable memory of the VFIO device."),
    _a("type", "string", _CD, 'IMEX device type: "channel" or "daemon".', domain=CD_DRIVER),
    _a("id", "int", _CD, "IMEX channel or daemon number.", domain=CD_DRIVER),
)

# The DeviceClasses NVIDIA's Helm chart installs (deployments/helm/dra-driver-nvidia-gpu/templates/
# deviceclass-*.yaml): a claim naming one that the files reviewed do not define gets these selectors.
def _chart_selector(driver: str, device_type: str, extra: str = "") -> str:
    return f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{device_type}'{extra}"


CHART_CLASSES: dict[str, str] = {
    "gpu.nvidia.com": _chart_selector(GPU_DRIVER, "gpu"),
    "mig.nvidia.com": _chart_selector(GPU_DRIVER, "mig"),
    "vfio.gpu.nvidia.com": _chart_selector(GPU_DRIVER, "vfio"),
    "compute-domain-daemon.nvidia.com": _chart_selector(CD_DRIVER, "daemon"),
    "compute-domain-default-channel.nvidia.com": _chart_selector(
        CD_DRIVER, "channel", f" && device.attributes['{CD_DRIVER}'].id == 0"),
}

_FIELDS: dict[str, tuple[str, ...]] = {
    "GpuConfig": ("apiVersion", "kind", "sharing"),
    "MigDeviceConfig": ("apiVersion", "kind", "sharing"),
    "VfioDeviceConfig": ("apiVersion", "kind", "iommu"),
    "ComputeDomainChannelConfig": ("apiVersion", "kind", "domainID", "allocationMode"),
    "ComputeDomainDaemonConfig": ("apiVersion", "kind", "domainID"),
}
_MPS_FIELDS = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
               "defaultPerDevicePinnedMemoryLimit", "multiUser")
_GPU_KEY = re.compile(r"^(\+?[0-9]+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F-]+)$")
_MIB = 1 << 20


class _Errors(list[ConfigError]):
    def add(self, path: str, message: str) -> None:
        self.append(ConfigError(path, message))


def _fields(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...], errs: _Errors) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            errs.add(where, f"unknown field (the driver decodes strictly; allowed here: "
                            f"{', '.join(allowed)})")


def _object(value: Any, path: str, errs: _Errors) -> Mapping[str, Any] | None:
    """A JSON object field: None for null (Go leaves the pointer nil), an error for other types."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errs.add(path, f"must be an object, got {type(value).__name__}")
        return None
    return value


def _string(value: Any, path: str, errs: _Errors) -> str | None:
    if value is None:
        return ""  # JSON null leaves a Go string empty
    if not isinstance(value, str):
        errs.add(path, f"must be a string, got {value!r}")
        return None
    return value


def _quantity(value: Any, path: str, errs: _Errors) -> Quantity | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        errs.add(path, f"must be a quantity such as '1Gi', got {value!r}")
        return None
    try:
        return Quantity.parse(str(value).strip())
    except ValueError:
        errs.add(path, f"must be a quantity such as '1Gi' or '512Mi', got {value!r}")
        return None


def _limit_mib(q: Quantity) -> int:
    # resource.Quantity.Value() rounds up to whole bytes; the driver passes whole MiB to MPS.
    return math.ceil(q.as_approximate_float()) // _MIB


def _decode_mps(mps: Mapping[str, Any], path: str, errs: _Errors) -> None:
    """What strict decoding refuses in an mpsConfig, whatever the strategy."""
    _fields(mps, path, _MPS_FIELDS, errs)
    pct = mps.get("defaultActiveThreadPercentage")
    if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int)):
        errs.add(f"{path}.defaultActiveThreadPercentage", f"must be an integer, got {pct!r}")
    multi = mps.get("multiUser")
    if multi is not None and not isinstance(multi, bool):
        errs.add(f"{path}.multiUser", f"must be true or false, got {multi!r}")
    _quantity(mps.get("defaultPinnedDeviceMemoryLimit"), f"{path}.defaultPinnedDeviceMemoryLimit", errs)
    per = mps.get("defaultPerDevicePinnedMemoryLimit")
    if per is not None and not isinstance(per, Mapping):
        errs.add(f"{path}.defaultPerDevicePinnedMemoryLimit",
                 "must be a map from a device index or UUID to a quantity")
    elif per is not None:
        for key, val in per.items():
            _quantity(val, f"{path}.defaultPerDevicePinnedMemoryLimit.{key}", errs)


def _check_mps(mps: Mapping[str, Any], path: str, errs: _Errors) -> None:
    """What `MpsConfig.Validate()` and the MPS daemon's start refuse (decoding already passed)."""
    pct = mps.get("defaultActiveThreadPercentage")
    if isinstance(pct, int) and not isinstance(pct, bool):
        if pct < 0:
            errs.add(f"{path}.defaultActiveThreadPercentage", "active thread percentage must not be negative")
        elif pct > 100:
            errs.add(f"{path}.defaultActiveThreadPercentage",
                     "active thread percentage must not be greater than 100")
    default = _quantity(mps.get("defaultPinnedDeviceMemoryLimit"), "", _Errors())
    if default is not None and _limit_mib(default) <= 0:
        errs.add(f"{path}.defaultPinnedDeviceMemoryLimit",
                 f"invalid limit: default value set too low: {mps['defaultPinnedDeviceMemoryLimit']} "
                 "(the driver needs at least 1Mi)")
    per = mps.get("defaultPerDevicePinnedMemoryLimit")
    if not isinstance(per, Mapping):
        return
    ppath = f"{path}.defaultPerDevicePinnedMemoryLimit"
    for key, val in per.items():
        kpath = f"{ppath}.{key}"
        if not isinstance(key, str) or not _GPU_KEY.match(key):
            errs.add(kpath, "invalid device: the key must be an index of the claim's devices (0, 1, ...) "
                            "or a GPU-/MIG- UUID")
        q = _quantity(val, "", _Errors())
        if q is not None and _limit_mib(q) <= 0:
            errs.add(kpath, f"invalid limit: value set too low: {val} (the driver needs at least 1Mi)")


def _check_sharing(sharing: Mapping[str, Any], kind: str, gates: Collection[str], errs: _Errors) -> None:
    gpu = kind == "GpuConfig"
    _fields(sharing, "sharing", ("strategy", "timeSlicingConfig", "mpsConfig") if gpu
            else ("strategy", "mpsConfig"), errs)
    strategy = _string(sharing.get("strategy"), "sharing.strategy", errs)
    ts = _object(sharing.get("timeSlicingConfig"), "sharing.timeSlicingConfig", errs) if gpu else None
    mps = _object(sharing.get("mpsConfig"), "sharing.mpsConfig", errs)
    # Strict decoding covers every object present, whichever strategy reads it.
    if ts is not None:
        _fields(ts, "sharing.timeSlicingConfig", ("interval",), errs)
        _string(ts.get("interval"), "sharing.timeSlicingConfig.interval", errs)
    if mps is not None:
        _decode_mps(mps, "sharing.mpsConfig", errs)
    if strategy is None:
        return
    if strategy not in STRATEGIES:
        errs.add("sharing.strategy", f"unknown GPU sharing strategy: {strategy!r}, supported GPU sharing "
                                     f"strategies: {', '.join(STRATEGIES)}")
        return
    gate = "TimeSlicingSettings" if strategy == "TimeSlicing" else "MPSSupport"
    if gate not in gates:
        errs.add("sharing.strategy", f"{strategy!r} is selected as the GPU sharing strategy, but the "
                                     f"{gate!r} feature gate is not enabled")
        return
    if strategy == "TimeSlicing":
        if gpu and mps is not None:
            errs.add("sharing.mpsConfig", "cannot use MpsConfig with the 'TimeSlicing' strategy "
                                          "(the driver fails at prepare time)")
        if ts is not None:
            interval = ts.get("interval")
            if interval is None:
                # Normalize() fills only a missing timeSlicingConfig; an empty one reaches
                # Validate() with a nil interval, which the driver dereferences.
                errs.add("sharing.timeSlicingConfig.interval",
                         f"required when timeSlicingConfig is given (one of: {', '.join(INTERVALS)})")
            elif isinstance(interval, str) and interval not in INTERVALS:
                errs.add("sharing.timeSlicingConfig.interval",
                         f"unknown time-slice interval: {interval!r}, supported time-slice intervals: "
                         f"{', '.join(INTERVALS)}")
        return
    if ts is not None:
        errs.add("sharing.timeSlicingConfig", "cannot use TimeSlicingConfig with the 'MPS' strategy "
                                              "(the driver fails at prepare time)")
    if mps is not None:
        _check_mps(mps, "sharing.mpsConfig", errs)


def validate(
    driver: str, params: Mapping[str, Any], device_types: set[str] | None = None,
    gates: Collection[str] = ASSUMED_GATES,
) -> list[ConfigError]:
    """Every problem NVIDIA's driver `driver` finds in one opaque `parameters` object: strict
    decoding, `Normalize()` + `Validate()`, and what prepare refuses (a kind that does not fit the
    device types, sharing settings of the other strategy, pinned-memory limits under 1 MiB)."""
    errs = _Errors()
    if not isinstance(params, Mapping):
        return [ConfigError("", "opaque parameters must be an object with apiVersion and kind")]
    try:
        size = len(json.dumps(params, separators=(",", ":"), default=str).encode())
    except (TypeError, ValueError) as exc:
        return [ConfigError("", f"parameters are not JSON-serialisable: {exc}")]
    if size > MAX_PARAMETERS_BYTES:
        errs.add("", f"parameters are {size} bytes; the API limit is {MAX_PARAMETERS_BYTES} bytes")
    kinds = KINDS.get(driver, {})
    api_version = params.get("apiVersion")
    if api_version is None or api_version == "":
        errs.add("apiVersion", f"required; use {API_VERSION}")
    elif api_version in LEGACY_API_VERSIONS:
        errs.add("apiVersion", f"{api_version} is no longer served by the driver; replace it with "
                               f"{API_VERSION} (kind and fields stay the same)")
    elif api_version != API_VERSION:
        errs.add("apiVersion", f"unsupported apiVersion {api_version!r}; use {API_VERSION}")
    kind = params.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        if kind is None or kind == "":
            what = "required"
        elif isinstance(kind, str) and kind in _NOT_CONFIGS:
            what = f"{kind} is not a device configuration"
        elif isinstance(kind, str) and any(kind in k for k in KINDS.values()):
            other = next(d for d, k in KINDS.items() if kind in k)
            what = f"{kind} is a config of driver {other}, not {driver}"
        else:
            what = f"unsupported kind {kind!r}"
        errs.add("kind", f"{what} (kinds {driver} accepts: {', '.join(kinds)})")
        return errs
    _fields(params, "", _FIELDS[kind], errs)
    if kind in ("GpuConfig", "MigDeviceConfig"):
        sharing = _object(params.get("sharing"), "sharing", errs)
        if sharing is not None:
            _check_sharing(sharing, kind, gates, errs)
    elif kind == "VfioDeviceConfig":
        iommu = _object(params.get("iommu"), "iommu", errs)
        if iommu is not None:
            _fields(iommu, "iommu", ("backendPolicy", "enableAPIDevice"), errs)
            policy = _string(iommu.get("backendPolicy"), "iommu.backendPolicy", errs)
            # Normalize() turns an empty policy into LegacyOnly.
            if policy and policy not in BACKEND_POLICIES:
                errs.add("iommu.backendPolicy", f"unknown IOMMU backend policy: {policy!r}, supported IOMMU "
                                                f"backend policies: {', '.join(BACKEND_POLICIES)}")
            api = iommu.get("enableAPIDevice")
            if api is not None and not isinstance(api, bool):
                errs.add("iommu.enableAPIDevice", f"must be true or false, got {api!r}")
    else:
        domain = _string(params.get("domainID"), "domainID", errs)
        if domain == "":
            errs.add("domainID", "domainID cannot be empty (the ComputeDomain's UID)")
        if "allocationMode" in params:
            _string(params.get("allocationMode"), "allocationMode", errs)
    if device_types:
        misfit = sorted(set(device_types) - kinds[kind])
        if misfit:
            fits = next((k for k, t in kinds.items() if misfit[0] in t), None)
            hint = f"; use kind {fits} for them" if fits else ""
            errs.add("kind", f"{kind} cannot be applied to devices of type {', '.join(misfit)}{hint}")
    return errs


def _validator(driver: str, params: Mapping[str, Any], device_types: set[str] | None) -> list[ConfigError]:
    return validate(driver, params, device_types)


SCHEMA = DriverSchema(
    name="nvidia",
    title="NVIDIA's DRA driver",
    driver_name=GPU_DRIVER,
    drivers=frozenset(KINDS),
    attributes=ATTRIBUTES,
    device_types={GPU_DRIVER: frozenset({"gpu", "mig", "vfio"}), CD_DRIVER: _CD},
    config_kinds=KINDS,
    validator=_validator,
    classes=CHART_CLASSES,
)
