"""A simulated NVML that answers the pynvml calls `driver/nvml.py` makes, from a YAML topology.

Used only when `--sim FILE` or `DRAGUARD_NVML_SIM` selects it; every load logs a warning so a
simulated node can never pass for a real one. Errors carry NVML's numeric codes in `.value`,
like `pynvml.NVMLError`, so the code in `driver/nvml.py` handles both the same way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from .mig import CI_PROFILE_SLICES, COMPUTE_SLICES, MAX_GPU_INSTANCES, GiProfile, profiles_for

log = logging.getLogger("draguard.driver.sim")

TOPOLOGY_DIR = Path(__file__).parent / "topologies"

# NVML return codes and enums (values as in nvml.h / pynvml).
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
EVENT_XID_CRITICAL = 8
EVENTS_ENV = "DRAGUARD_NVML_SIM_EVENTS"  # a JSON-lines file: {"uuid": U, "xid": N} or {"lost": U}
# A JSON file holding the MIG instances made at run time, so that they outlive the process as they
# outlive the plugin on a real GPU (crash tests, and a simulated node's driver restarts).
MIG_STATE_ENV = "DRAGUARD_NVML_SIM_MIG_STATE"
BRANDS = {
    "Unknown": 0, "Quadro": 1, "Tesla": 2, "NVS": 3, "Grid": 4, "GeForce": 5, "Titan": 6,
    "NvidiaVApps": 7, "NvidiaVPC": 8, "NvidiaVCS": 9, "NvidiaVWS": 10, "NvidiaCloudGaming": 11,
    "QuadroRTX": 12, "NvidiaRTX": 13, "Nvidia": 14, "GeForceRTX": 15, "TitanRTX": 16,
}  # fmt: skip
ARCHITECTURES = {
    "Kepler": 2, "Maxwell": 3, "Pascal": 4, "Volta": 5, "Turing": 6, "Ampere": 7,
    "Ada Lovelace": 8, "Hopper": 9, "Blackwell": 10, "Unknown": 0xFFFFFFFF,
}  # fmt: skip
ADDRESSING_MODES = {"None": 0, "HMM": 1, "ATS": 2}
MAX_NVLINKS = 18


class SimNVMLError(Exception):
    """Same shape as `pynvml.NVMLError`: the NVML return code is in `.value`."""

    def __init__(self, value: int, what: str = "") -> None:
        self.value = value
        super().__init__(f"NVML error {value}{': ' + what if what else ''} (simulated)")


class TopologyError(ValueError):
    """The topology file is unreadable or malformed; the message names the file and field."""


@dataclass
class _Mig:
    uuid: str
    profile: str
    gi_profile_id: int
    placement_start: int
    placement_size: int
    gi_id: int
    ci_id: int
    memory_mb: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    gi_slices: int
    ci_slices: int


@dataclass
class _Gpu:
    index: int
    minor: int
    name: str
    uuid: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_bytes: int | None
    pci_bus_id: str
    pcie_root: str | None
    addressing_mode: int | None
    time_slicing_supported: bool
    mig_enabled: bool
    max_mig_devices: int
    migs: list[_Mig] = field(default_factory=list)
    nvlinks: list[str] = field(default_factory=list)
    timeslice: int | None = None
    numa_node: int | None = None
    lost: bool = False  # every call on it answers GPU_IS_LOST, as NVML does for a fallen-off GPU
    dyn_gis: dict[int, _Gi] = field(default_factory=dict)  # GPU instances created at run time
    created: int = 0  # instances created so far: each new MIG device gets a UUID of its own


@dataclass(frozen=True)
class _MigHandle:
    gpu: _Gpu
    mig: _Mig


@dataclass(frozen=True)
class _GiHandle:
    gpu: _Gpu
    mig: _Mig


@dataclass
class _Gi:
    """A GPU instance created at run time (dynamic MIG); `ci` is its compute instance, once made."""

    gi_id: int
    profile: GiProfile
    start: int
    ci: _Mig | None = None


@dataclass(frozen=True)
class _DynGiHandle:
    gpu: _Gpu
    gi: _Gi


@dataclass(frozen=True)
class _CiHandle:
    gpu: _Gpu
    gi: _Gi
    mig: _Mig


def _req(d: dict[str, Any], key: str, where: str, typ: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise TopologyError(f"{where}: missing required field '{key}'")
    val = d[key]
    if not isinstance(val, typ) or (typ is int and isinstance(val, bool)):
        tname = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise TopologyError(f"{where}.{key}: expected {tname}, got {val!r}")
    return val


def _enum(table: dict[str, int], val: str, where: str) -> int:
    if val not in table:
        raise TopologyError(f"{where}: unknown value {val!r} (allowed: {', '.join(table)})")
    return table[val]


def _parse_mig(raw: Any, where: str) -> _Mig:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: expected a mapping")
    profile = _req(raw, "profile", where, str)
    place = _req(raw, "placement", where, dict)
    gi_slices = int(profile.split("g.")[0].split(".")[-1]) if "g." in profile else 1
    return _Mig(
        uuid=_req(raw, "uuid", where, str),
        profile=profile,
        gi_profile_id=_req(raw, "giProfileId", where, int),
        placement_start=_req(place, "start", f"{where}.placement", int),
        placement_size=_req(place, "size", f"{where}.placement", int),
        gi_id=_req(raw, "gpuInstanceId", where, int),
        ci_id=int(raw.get("computeInstanceId", 0)),
        memory_mb=_req(raw, "memoryMB", where, int),
        multiprocessors=_req(raw, "multiprocessors", where, int),
        copy_engines=int(raw.get("copyEngines", 0)),
        decoders=int(raw.get("decoders", 0)),
        encoders=int(raw.get("encoders", 0)),
        jpeg_engines=int(raw.get("jpegEngines", 0)),
        ofa_engines=int(raw.get("ofaEngines", 0)),
        gi_slices=gi_slices,
        ci_slices=int(raw.get("computeInstanceSlices", gi_slices)),
    )


def _parse_gpu(raw: Any, where: str, index: int) -> _Gpu:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: expected a mapping")
    cc = str(_req(raw, "computeCapability", where, (str, float)))
    try:
        major, minor = (int(p) for p in cc.split("."))
    except ValueError:
        raise TopologyError(f"{where}.computeCapability: expected '<major>.<minor>', got {cc!r}") from None
    mig_raw = raw.get("mig") or {}
    if not isinstance(mig_raw, dict):
        raise TopologyError(f"{where}.mig: expected a mapping with 'enabled' and 'devices'")
    migs = [_parse_mig(m, f"{where}.mig.devices[{i}]") for i, m in enumerate(mig_raw.get("devices") or [])]
    links_raw = raw.get("nvlinks") or []
    if not isinstance(links_raw, list) or len(links_raw) > MAX_NVLINKS:
        raise TopologyError(f"{where}.nvlinks: expected a list of at most {MAX_NVLINKS} remote PCI bus ids")
    mode = raw.get("addressingMode")
    mem = raw.get("memoryBytes")
    if mem is not None and (not isinstance(mem, int) or isinstance(mem, bool) or mem <= 0):
        raise TopologyError(
            f"{where}.memoryBytes: expected a positive integer or null (NOT_SUPPORTED), got {mem!r}"
        )
    return _Gpu(
        index=index,
        minor=int(raw.get("minor", index)),
        name=_req(raw, "name", where, str),
        uuid=_req(raw, "uuid", where, str),
        brand=_enum(BRANDS, str(raw.get("brand", "Tesla")), f"{where}.brand"),
        architecture=_enum(
            ARCHITECTURES, str(_req(raw, "architecture", where, str)), f"{where}.architecture"
        ),
        compute_capability=(major, minor),
        memory_bytes=mem,
        pci_bus_id=_req(raw, "pciBusId", where, str),
        pcie_root=raw.get("pcieRoot"),
        addressing_mode=None
        if mode is None
        else _enum(ADDRESSING_MODES, str(mode), f"{where}.addressingMode"),
        time_slicing_supported=bool(raw.get("timeSlicingSupported", True)),
        mig_enabled=bool(mig_raw.get("enabled", False)),
        max_mig_devices=int(mig_raw.get("maxDevices", 7)),
        migs=migs,
        nvlinks=[str(x) for x in links_raw],
        numa_node=_opt_int(raw, "numaNode", where),
        lost=bool(raw.get("lost", False)),
    )


def _opt_int(raw: dict[str, Any], key: str, where: str) -> int | None:
    val = raw.get(key)
    if val is not None and (not isinstance(val, int) or isinstance(val, bool)):
        raise TopologyError(f"{where}.{key}: expected an integer, got {val!r}")
    return val


class SimulatedNvml:
    """Answers the subset of the pynvml API used by `driver/nvml.py`."""

    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED

    def __init__(self, topology: dict[str, Any], source: str) -> None:
        self.source = source
        where = source
        if not isinstance(topology, dict):
            raise TopologyError(f"{where}: expected a mapping at the top level")
        self.driver_version = str(_req(topology, "driverVersion", where, (str, int, float)))
        self.cuda_driver_version = _req(topology, "cudaDriverVersion", where, int)
        gpus_raw = _req(topology, "gpus", where, list)
        self.gpus = [_parse_gpu(g, f"{where}: gpus[{i}]", i) for i, g in enumerate(gpus_raw)]
        seen: set[str] = set()
        for g in self.gpus:
            for ident in [g.uuid, g.pci_bus_id, *(m.uuid for m in g.migs)]:
                if ident in seen:
                    raise TopologyError(f"{where}: duplicate UUID or PCI bus id {ident!r}")
                seen.add(ident)
        faults = topology.get("faults") or {}
        if not isinstance(faults, dict) or not all(isinstance(v, int) for v in faults.values()):
            raise TopologyError(f"{where}.faults: expected a mapping of NVML call name to NVML error code")
        self.faults: dict[str, int] = dict(faults)  # call name -> NVML error code it fails with
        self._initialised = 0
        self._lock = threading.Lock()
        self.calls = 0  # how many NVML calls were answered (tests and benchmarks read it)
        self._events: deque[tuple[_Gpu, int]] = deque()
        self._event_cond = threading.Condition()
        self._events_file = os.environ.get(EVENTS_ENV) or None
        self._events_offset = 0
        self._mig_state = os.environ.get(MIG_STATE_ENV) or None
        self._load_migs()

    # --- lifecycle -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if "nvmlInit" in self.faults:  # e.g. 9 = DRIVER_NOT_LOADED: a node without a working driver
            raise SimNVMLError(self.faults["nvmlInit"], "nvmlInit (injected by the topology's faults)")
        with self._lock:
            self._initialised += 1
        self._read_events_file()

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._initialised == 0:
                raise SimNVMLError(NVML_ERROR_UNINITIALIZED, "nvmlShutdown without nvmlInit")
            self._initialised -= 1

    def _check(self, h: Any = None) -> None:
        self.calls += 1
        if self._initialised == 0:
            raise SimNVMLError(NVML_ERROR_UNINITIALIZED, "NVML used before nvmlInit")
        if self.faults:
            call = sys._getframe(1).f_code.co_name
            if call in self.faults:
                raise SimNVMLError(self.faults[call], f"{call} (injected by the topology's faults)")
        gpu = h.gpu if isinstance(h, (_MigHandle, _GiHandle, _DynGiHandle, _CiHandle)) else h
        if isinstance(gpu, _Gpu) and gpu.lost:
            raise SimNVMLError(NVML_ERROR_GPU_IS_LOST, f"GPU {gpu.uuid} is lost")

    # --- run-time events (not part of pynvml: what tests and the simulated node use to inject) --
    def simLoseGpu(self, uuid: str) -> None:
        """The GPU falls off the bus: every later call on it fails with GPU_IS_LOST."""
        with self._lock:
            self._gpu_by_uuid(uuid).lost = True
        with self._event_cond:  # a waiting nvmlEventSetWait answers at once
            self._event_cond.notify_all()

    def simInjectXid(self, uuid: str, xid: int) -> None:
        """Queue an XID critical error event for the GPU (or the parent of a MIG device)."""
        gpu = self._gpu_by_uuid(uuid)
        with self._event_cond:
            self._events.append((gpu, xid))
            self._event_cond.notify_all()

    def _read_events_file(self) -> None:
        """Take new lines of the events file (how a separate process injects into a running driver)."""
        if not self._events_file:
            return
        try:
            with open(self._events_file, "rb") as f:
                f.seek(self._events_offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # only whole lines
        self._events_offset += end
        for line in data[:end].splitlines():
            try:
                ev = json.loads(line)
                if "lost" in ev:
                    self.simLoseGpu(str(ev["lost"]))
                else:
                    self.simInjectXid(str(ev["uuid"]), int(ev["xid"]))
            except (ValueError, KeyError, TypeError, SimNVMLError) as exc:
                log.warning("simulated NVML: ignoring event line %r in %s: %s", line, self._events_file, exc)

    # --- events (pynvml's event set API) -------------------------------------------------------
    def nvmlEventSetCreate(self) -> set[str]:
        self._check()
        self._read_events_file()
        return set()

    def nvmlDeviceRegisterEvents(self, h: _Gpu, mask: int, events: set[str]) -> None:
        self._check(h)
        if mask & EVENT_XID_CRITICAL:
            events.add(h.uuid)

    def nvmlEventSetWait_v2(self, events: set[str], timeout_ms: int) -> SimpleNamespace:
        self._check()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._read_events_file()
            # NVML answers GPU_IS_LOST from the wait itself when a GPU of the set falls off the bus,
            # without saying which one.
            if any(g.lost for g in self.gpus if g.uuid in events):
                raise SimNVMLError(NVML_ERROR_GPU_IS_LOST, "a GPU of the event set is lost")
            with self._event_cond:
                for i, (gpu, xid) in enumerate(self._events):
                    if gpu.uuid in events:
                        del self._events[i]
                        none = 0xFFFFFFFF  # not a MIG-scoped event
                        return SimpleNamespace(device=gpu, eventType=EVENT_XID_CRITICAL, eventData=xid,
                                               gpuInstanceId=none, computeInstanceId=none)  # fmt: skip
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SimNVMLError(NVML_ERROR_TIMEOUT, "no event")
                self._event_cond.wait(min(left, 0.2))

    def nvmlEventSetFree(self, events: set[str]) -> None:
        self._check()
        events.clear()

    def _gpu_by_uuid(self, uuid: str) -> _Gpu:
        for g in self.gpus:
            if g.uuid == uuid or any(m.uuid == uuid for m in g.migs):
                return g
        raise SimNVMLError(NVML_ERROR_NOT_FOUND, f"no GPU with UUID {uuid}")

    # --- system ----------------------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return int(self.cuda_driver_version)

    # --- devices ---------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Gpu:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, f"no GPU at index {index}")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Gpu:
        self._check()
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise SimNVMLError(NVML_ERROR_NOT_FOUND, f"no GPU with UUID {uuid}")

    def nvmlDeviceGetName(self, h: _Gpu) -> str:
        self._check(h)
        return h.name

    def nvmlDeviceGetUUID(self, h: _Gpu | _MigHandle) -> str:
        self._check(h)
        return h.mig.uuid if isinstance(h, _MigHandle) else h.uuid

    def nvmlDeviceGetMinorNumber(self, h: _Gpu) -> int:
        self._check(h)
        return h.minor

    def nvmlDeviceGetBrand(self, h: _Gpu) -> int:
        self._check(h)
        return h.brand

    def nvmlDeviceGetArchitecture(self, h: _Gpu) -> int:
        self._check(h)
        return h.architecture

    def nvmlDeviceGetCudaComputeCapability(self, h: _Gpu) -> tuple[int, int]:
        self._check(h)
        return h.compute_capability

    def nvmlDeviceGetMemoryInfo(self, h: _Gpu | _MigHandle) -> SimpleNamespace:
        self._check(h)
        if isinstance(h, _MigHandle):
            total = h.mig.memory_mb * 1024 * 1024
        elif h.memory_bytes is None:
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, "memory info")
        else:
            total = h.memory_bytes
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetPciInfo(self, h: _Gpu) -> SimpleNamespace:
        self._check(h)
        return SimpleNamespace(busId=h.pci_bus_id, busIdLegacy=h.pci_bus_id)

    def nvmlDeviceGetAddressingMode(self, h: _Gpu) -> int:
        self._check(h)
        if h.addressing_mode is None:
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, "addressing mode")
        return h.addressing_mode

    # --- MIG -------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h: _Gpu) -> list[int]:
        self._check(h)
        mode = 1 if h.mig_enabled else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Gpu) -> int:
        self._check(h)
        return h.max_mig_devices if h.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Gpu, index: int) -> _MigHandle:
        self._check(h)
        if not h.mig_enabled:
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, "MIG is disabled")
        if not 0 <= index < len(h.migs):
            raise SimNVMLError(NVML_ERROR_NOT_FOUND, f"no MIG device at index {index}")
        return _MigHandle(h, h.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, mh: _MigHandle) -> int:
        self._check(mh)
        return mh.mig.gi_id

    def nvmlDeviceGetComputeInstanceId(self, mh: _MigHandle) -> int:
        self._check(mh)
        return mh.mig.ci_id

    def nvmlDeviceGetAttributes(self, mh: _MigHandle) -> SimpleNamespace:
        self._check(mh)
        m = mh.mig
        return SimpleNamespace(
            multiprocessorCount=m.multiprocessors,
            sharedCopyEngineCount=m.copy_engines,
            sharedDecoderCount=m.decoders,
            sharedEncoderCount=m.encoders,
            sharedJpegCount=m.jpeg_engines,
            sharedOfaCount=m.ofa_engines,
            gpuInstanceSliceCount=m.gi_slices,
            computeInstanceSliceCount=m.ci_slices,
            memorySizeMB=m.memory_mb,
        )

    def nvmlDeviceGetGpuInstanceById(self, h: _Gpu, gi_id: int) -> _GiHandle | _DynGiHandle:
        self._check(h)
        if gi_id in h.dyn_gis:
            return _DynGiHandle(h, h.dyn_gis[gi_id])
        for m in h.migs:
            if m.gi_id == gi_id:
                return _GiHandle(h, m)
        raise SimNVMLError(NVML_ERROR_NOT_FOUND, f"no GPU instance {gi_id}")

    def nvmlGpuInstanceGetInfo(self, gi: _GiHandle | _DynGiHandle) -> SimpleNamespace:
        self._check(gi)
        if isinstance(gi, _DynGiHandle):
            g = gi.gi
            return SimpleNamespace(
                id=g.gi_id, profileId=g.profile.id,
                placement=SimpleNamespace(start=g.start, size=g.profile.size),
            )  # fmt: skip
        return SimpleNamespace(
            id=gi.mig.gi_id,
            profileId=gi.mig.gi_profile_id,
            placement=SimpleNamespace(start=gi.mig.placement_start, size=gi.mig.placement_size),
        )

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, h: _Gpu, profile_id: int) -> SimpleNamespace:
        self._check(h)
        dyn = {g.ci.uuid for g in h.dyn_gis.values() if g.ci is not None}
        for m in h.migs:  # the topology's own instances name their profile as the topology says
            if m.gi_profile_id == profile_id and m.uuid not in dyn:
                base = m.profile.split(".", 1)[1] if m.ci_slices != m.gi_slices else m.profile
                return SimpleNamespace(id=profile_id, name=f"MIG {base}", sliceCount=m.gi_slices)
        for p in profiles_for(h.name):
            if p.id == profile_id:
                return self._profile_info(p)
        raise SimNVMLError(NVML_ERROR_NOT_FOUND, f"no GPU instance profile {profile_id}")

    # --- dynamic MIG: GPU and compute instances made and destroyed at run time ----------------------
    def _load_migs(self) -> None:
        """Recreate the instances the state file records (each GPU's, by its profiles)."""
        if not self._mig_state:
            return
        try:
            doc = json.loads(Path(self._mig_state).read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise TopologyError(f"{self._mig_state}: unreadable MIG state ({exc})") from None
        try:
            for g in self.gpus:
                for rec in doc.get(g.uuid, []) if isinstance(doc, dict) else []:
                    prof = next((p for p in profiles_for(g.name) if p.id == rec.get("profileId")), None)
                    if prof is None:
                        continue
                    gi = _Gi(int(rec["gi"]), prof, int(rec["start"]))
                    g.dyn_gis[gi.gi_id] = gi
                    g.created = max(g.created, int(rec.get("created", 0)))
                    if rec.get("uuid"):
                        gi.ci = self._new_ci(g, gi, str(rec["uuid"]))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise TopologyError(f"{self._mig_state}: malformed MIG state ({exc})") from None

    def _save_migs(self) -> None:
        if not self._mig_state:
            return
        doc = {
            g.uuid: [
                {"gi": gi.gi_id, "profileId": gi.profile.id, "start": gi.start, "created": g.created,
                 "uuid": gi.ci.uuid if gi.ci is not None else None}
                for gi in g.dyn_gis.values()
            ]
            for g in self.gpus
        }  # fmt: skip
        tmp = Path(f"{self._mig_state}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self._mig_state)

    @staticmethod
    def _new_ci(h: _Gpu, g: _Gi, mig_uuid: str) -> _Mig:
        p = g.profile
        mig = _Mig(
            uuid=mig_uuid, profile=p.name, gi_profile_id=p.id, placement_start=g.start,
            placement_size=p.size, gi_id=g.gi_id, ci_id=0, memory_mb=p.memory_mb,
            multiprocessors=p.multiprocessors, copy_engines=p.copy_engines, decoders=p.decoders,
            encoders=p.encoders, jpeg_engines=p.jpeg_engines, ofa_engines=p.ofa_engines,
            gi_slices=p.compute, ci_slices=p.compute,
        )  # fmt: skip
        h.migs.append(mig)
        return mig

    @staticmethod
    def _profile_info(p: GiProfile) -> SimpleNamespace:
        return SimpleNamespace(
            id=p.id, name=f"MIG {p.name}", sliceCount=p.compute, instanceCount=len(p.starts),
            memorySizeMB=p.memory_mb, multiprocessorCount=p.multiprocessors,
            copyEngineCount=p.copy_engines, decoderCount=p.decoders, encoderCount=p.encoders,
            jpegCount=p.jpeg_engines, ofaCount=p.ofa_engines,
        )  # fmt: skip

    def _profile(self, h: _Gpu, *, index: int | None = None, profile_id: int | None = None) -> GiProfile:
        if not h.mig_enabled:
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, f"MIG is disabled on GPU {h.uuid}")
        for p in profiles_for(h.name):
            if p.index == index or p.id == profile_id:
                return p
        raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, f"no such GPU instance profile on {h.name}")

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: _Gpu, index: int, version: int = 2) -> SimpleNamespace:
        self._check(h)
        if not 0 <= index < 14:
            raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, f"profile index {index}")
        return self._profile_info(self._profile(h, index=index))

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, h: _Gpu, profile_id: int, placements: Any, count: Any
    ) -> int:
        """NVML's two-call form: `placements` None asks for the count only (set through `count`)."""
        self._check(h)
        p = self._profile(h, profile_id=profile_id)
        target = getattr(count, "_obj", count)  # byref(c_uint) or anything with .value
        if placements is not None:
            if target.value < len(p.starts):
                raise SimNVMLError(NVML_ERROR_INSUFFICIENT_SIZE, "placement array too small")
            for i, start in enumerate(p.starts):
                placements[i].start, placements[i].size = start, p.size
        target.value = len(p.starts)
        return 0

    def _used(self, h: _Gpu) -> list[tuple[int, int, int]]:
        """(first memory slice, memory slices, compute slices) of every GPU instance on the GPU."""
        used = [(g.start, g.profile.size, g.profile.compute) for g in h.dyn_gis.values()]
        dyn = {g.ci.uuid for g in h.dyn_gis.values() if g.ci is not None}
        seen: set[int] = set()
        for m in h.migs:
            if m.uuid not in dyn and m.gi_id not in seen:
                seen.add(m.gi_id)
                used.append((m.placement_start, m.placement_size, m.gi_slices))
        return used

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, h: _Gpu, profile_id: int, placement: Any
    ) -> _DynGiHandle:
        self._check(h)
        with self._lock:
            p = self._profile(h, profile_id=profile_id)
            place = getattr(placement, "_obj", placement)  # byref(c_nvmlGpuInstancePlacement_t) too
            start, size = int(place.start), int(place.size)
            if start not in p.starts or size != p.size:
                raise SimNVMLError(
                    NVML_ERROR_INVALID_ARGUMENT, f"placement {start}+{size} is not one of {p.name}'s"
                )
            used = self._used(h)
            taken = {s for first, n, _c in used for s in range(first, first + n)}
            compute = sum(c for *_x, c in used) + p.compute
            if taken & set(range(start, start + size)) or compute > COMPUTE_SLICES:
                raise SimNVMLError(
                    NVML_ERROR_INSUFFICIENT_RESOURCES,
                    f"{p.name} at memory slice {start} overlaps an existing GPU instance",
                )
            ids = set(h.dyn_gis) | {m.gi_id for m in h.migs}
            gi_id = next(i for i in range(1, MAX_GPU_INSTANCES + 1) if i not in ids)
            gi = _Gi(gi_id, p, start)
            h.dyn_gis[gi_id] = gi
            self._save_migs()
            return _DynGiHandle(h, gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: _DynGiHandle, index: int, eng_profile: int = 0, version: int = 2
    ) -> SimpleNamespace:
        self._check(gi)
        slices = CI_PROFILE_SLICES.get(index)
        if slices is None or slices != gi.gi.profile.compute:  # only the full compute instance is simulated
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, f"compute instance profile {index}")
        return SimpleNamespace(id=index, sliceCount=slices, multiprocessorCount=gi.gi.profile.multiprocessors)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: _DynGiHandle, profile_id: int) -> _CiHandle:
        self._check(gi)
        with self._lock:
            g, h = gi.gi, gi.gpu
            if h.dyn_gis.get(g.gi_id) is not g:
                raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, f"GPU instance {g.gi_id} was destroyed")
            if CI_PROFILE_SLICES.get(profile_id) != g.profile.compute:
                raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, f"compute instance profile {profile_id}")
            if g.ci is not None:
                raise SimNVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"GPU instance {g.gi_id} is full")
            h.created += 1
            made = uuid.uuid5(uuid.NAMESPACE_OID, f"{h.uuid}/{g.gi_id}/{h.created}")
            g.ci = self._new_ci(h, g, f"MIG-{made}")
            self._save_migs()
            return _CiHandle(h, g, g.ci)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: _DynGiHandle, ci_id: int) -> _CiHandle:
        self._check(gi)
        if gi.gi.ci is None or ci_id != gi.gi.ci.ci_id:
            raise SimNVMLError(NVML_ERROR_NOT_FOUND, f"no compute instance {ci_id} in instance {gi.gi.gi_id}")
        return _CiHandle(gi.gpu, gi.gi, gi.gi.ci)

    def nvmlComputeInstanceGetInfo(self, ci: _CiHandle) -> SimpleNamespace:
        self._check(ci)
        return SimpleNamespace(id=ci.mig.ci_id, gpuInstanceId=ci.gi.gi_id)

    def nvmlComputeInstanceDestroy(self, ci: _CiHandle) -> None:
        self._check(ci)
        with self._lock:
            if ci.gi.ci is not ci.mig:
                raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, "compute instance already destroyed")
            ci.gi.ci = None
            ci.gpu.migs.remove(ci.mig)
            self._save_migs()

    def nvmlGpuInstanceDestroy(self, gi: _GiHandle | _DynGiHandle) -> None:
        self._check(gi)
        with self._lock:
            if isinstance(gi, _GiHandle) or gi.gi.ci is not None:
                raise SimNVMLError(NVML_ERROR_IN_USE, "the GPU instance still has a compute instance")
            if gi.gpu.dyn_gis.get(gi.gi.gi_id) is not gi.gi:
                raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, "GPU instance already destroyed")
            del gi.gpu.dyn_gis[gi.gi.gi_id]
            self._save_migs()

    # --- NVLink ----------------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, h: _Gpu, link: int) -> int:
        self._check(h)
        if not 0 <= link < MAX_NVLINKS:
            raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, f"link {link}")
        if link >= len(h.nvlinks):
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, f"link {link} not present")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: _Gpu, link: int) -> SimpleNamespace:
        self._check(h)
        if not 0 <= link < len(h.nvlinks):
            raise SimNVMLError(NVML_ERROR_INVALID_ARGUMENT, f"link {link}")
        return SimpleNamespace(busId=h.nvlinks[link])

    # --- control (not part of pynvml; see driver/nvml.py for how the real node does it) ---------
    def simSetComputeTimeslice(self, uuid: str, value: int) -> None:
        """Record a time-slice setting; raises NOT_SUPPORTED where the topology says so."""
        self._check()
        gpu = self.nvmlDeviceGetHandleByUUID(uuid)
        if not gpu.time_slicing_supported:
            raise SimNVMLError(NVML_ERROR_NOT_SUPPORTED, f"time-slicing on {gpu.name}")
        gpu.timeslice = value


def load_topology(path: str | Path) -> SimulatedNvml:
    """Load a topology file (a path, or the name of a shipped topology such as `h100-8x-nvlink`)."""
    p = Path(path)
    if not p.exists() and not p.suffix:
        shipped = TOPOLOGY_DIR / f"{p.name}.yaml"
        if shipped.exists():
            p = shipped
    try:
        text = p.read_text()
    except OSError as exc:
        names = ", ".join(sorted(x.stem for x in TOPOLOGY_DIR.glob("*.yaml")))
        raise TopologyError(
            f"cannot read simulated NVML topology {p}: {exc.strerror}; shipped topologies: {names}"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{p}: not valid YAML: {exc}") from None
    sim = SimulatedNvml(data, str(p))
    log.warning("SIMULATED NVML in use: %d GPU(s) from topology %s; no real GPU is queried", len(sim.gpus), p)
    return sim
