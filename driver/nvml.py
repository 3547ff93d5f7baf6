"""Everything the driver reads from (or sets on) the GPUs, through NVML.

This is the only module that calls pynvml (nvidia-ml-py). The same calls are answered by
`driver.sim.SimulatedNvml` when a topology file is selected, so the code path is identical.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("draguard.driver.nvml")

SIM_ENV = "DRAGUARD_NVML_SIM"

# NVML return codes used here (nvml.h).
ERR_NOT_SUPPORTED = 3
ERR_NOT_FOUND = 6
ERR_INVALID_ARGUMENT = 2
ERR_FUNCTION_NOT_FOUND = 13
ERR_TIMEOUT = 10
ERR_GPU_IS_LOST = 15
EVENT_XID_CRITICAL = 8  # nvmlEventTypeXidCriticalError
MAX_NVLINKS = 18
ERR_IN_USE = 19
ERR_INSUFFICIENT_RESOURCES = 23
_ABSENT = (ERR_NOT_SUPPORTED, ERR_NOT_FOUND, ERR_FUNCTION_NOT_FOUND, ERR_INVALID_ARGUMENT)
GI_PROFILE_INDICES = 14  # NVML_GPU_INSTANCE_PROFILE_COUNT (nvml.h, 12.x)
CI_PROFILE_INDICES = 8  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
MAX_PLACEMENTS = 16  # more placements than memory slices is not a GPU's answer
MAX_GPU_INSTANCE_ID = 14  # the GPU instance ids NVIDIA's capability numbering has room for


class _Placement(ctypes.Structure):
    """nvmlGpuInstancePlacement_t: the first memory slice of a GPU instance and how many it spans."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]

BRAND_NAMES = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}  # fmt: skip
ARCH_NAMES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace",
    9: "Hopper", 10: "Blackwell",
}  # fmt: skip
ADDRESSING_NAMES = {1: "HMM", 2: "ATS"}  # 0 = None: not published


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no library, no driver); the message says what to do."""


class NvmlCallError(RuntimeError):
    """An NVML call failed; `call` names it and `code` is NVML's return code."""

    def __init__(self, call: str, code: int | None, detail: str) -> None:
        self.call = call
        self.code = code
        super().__init__(f"NVML {call} failed: {detail}")


class SharingUnsupported(RuntimeError):
    """The requested sharing setting cannot be applied to this device."""


@dataclass(frozen=True, slots=True)
class MigInfo:
    uuid: str
    profile: str  # e.g. "3g.20gb" (or "1c.3g.20gb" when the CI is smaller than its GI)
    gi_profile_id: int
    gi_id: int
    ci_id: int
    placement_start: int
    placement_size: int
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU instance profile NVML offers on a GPU in MIG mode, with where it may be placed."""

    profile_id: int
    name: str  # e.g. "1g.10gb"
    size: int  # memory slices one instance spans
    compute_slices: int
    starts: tuple[int, ...]  # the memory slices an instance may start at
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    minor: int
    uuid: str
    name: str
    brand: str
    architecture: str
    compute_capability: str  # "<major>.<minor>"
    memory_bytes: int | None  # None: NVML said NOT_SUPPORTED
    pci_bus_id: str  # lowercase, 4-digit domain: 0000:3b:00.0
    pcie_root: str | None
    addressing_mode: str | None
    mig_enabled: bool
    migs: tuple[MigInfo, ...] = ()
    nvlink_remotes: tuple[str, ...] = ()  # normalised PCI bus ids at the far end of each active link
    numa_node: int | None = None
    mig_profiles: tuple[MigProfile, ...] = ()  # on a GPU in MIG mode: what could be created (dynamic MIG)


@dataclass(frozen=True, slots=True)
class FailedGpu:
    """A GPU NVML counts but could not read (lost, or erroring): isolated, not fatal."""

    index: int
    uuid: str | None  # when NVML still gave it
    error: str


@dataclass(frozen=True, slots=True)
class NodeGpus:
    driver_version: str
    cuda_driver_version: int  # NVML form: 12040 = 12.4
    gpus: tuple[GpuInfo, ...]
    simulated: bool
    source: str  # "nvml" or the topology path
    failed: tuple[FailedGpu, ...] = ()


def normalize_pci_bus_id(raw: str | bytes) -> str:
    """NVML's `00000000:3B:00.0` → Kubernetes' `0000:3b:00.0`."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    text = text.strip().lower()
    if ":" not in text:
        return text
    domain, rest = text.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _code(exc: BaseException) -> int | None:
    val = getattr(exc, "value", None)
    return val if isinstance(val, int) else None


@dataclass
class Nvml:
    """A handle on NVML (real or simulated). `lib` is the pynvml module or a SimulatedNvml."""

    lib: Any
    simulated: bool
    source: str
    sysfs_root: Path = Path("/sys/bus/pci/devices")
    on_error: Callable[[str], None] | None = None
    smi: Path | None = None  # the driver root's nvidia-smi; None: look it up on PATH
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _call(self, name: str, *args: Any, expected: tuple[int, ...] = ()) -> Any:
        try:
            return getattr(self.lib, name)(*args)
        except Exception as exc:
            code = _code(exc)
            if code is None and not type(exc).__name__.startswith(("NVMLError", "SimNVMLError")):
                raise
            if self.on_error is not None and code not in expected:
                self.on_error(name)
            raise NvmlCallError(name, code, str(exc)) from exc

    def _optional(self, name: str, *args: Any) -> Any:
        """A call whose NOT_SUPPORTED / NOT_FOUND / missing-function answer means "absent".

        Those answers are normal (e.g. probing NVLink links a GPU does not have), so they are not
        counted as NVML errors.
        """
        try:
            return self._call(name, *args, expected=_ABSENT)
        except NvmlCallError as exc:
            if exc.code in _ABSENT:
                return None
            raise
        except AttributeError:  # an older nvidia-ml-py without this function
            return None

    def enumerate(self) -> NodeGpus:
        """Read every GPU, its MIG devices and NVLink links."""
        with self._lock:
            self._call("nvmlInit")
            try:
                driver = _text(self._call("nvmlSystemGetDriverVersion"))
                cuda = int(self._call("nvmlSystemGetCudaDriverVersion"))
                count = int(self._call("nvmlDeviceGetCount"))
                gpus: list[GpuInfo] = []
                failed: list[FailedGpu] = []
                for i in range(count):
                    try:
                        gpus.append(self._gpu(i))
                    except NvmlCallError as exc:  # one bad GPU must not hide the others
                        failed.append(FailedGpu(i, self._uuid_or_none(i), str(exc)))
                        log.error("GPU at index %d left out of the inventory: %s", i, exc)
            finally:
                self._call("nvmlShutdown")
        return NodeGpus(driver, cuda, tuple(gpus), self.simulated, self.source, tuple(failed))

    def _uuid_or_none(self, index: int) -> str | None:
        try:
            return _text(self._call("nvmlDeviceGetUUID", self._call("nvmlDeviceGetHandleByIndex", index)))
        except NvmlCallError:
            return None

    def _gpu(self, index: int) -> GpuInfo:
        h = self._call("nvmlDeviceGetHandleByIndex", index)
        major, minor_cc = self._call("nvmlDeviceGetCudaComputeCapability", h)
        mem = self._optional("nvmlDeviceGetMemoryInfo", h)
        pci = normalize_pci_bus_id(self._call("nvmlDeviceGetPciInfo", h).busId)
        arch = self._optional("nvmlDeviceGetArchitecture", h)
        mode = self._optional("nvmlDeviceGetAddressingMode", h)
        mig_mode = self._optional("nvmlDeviceGetMigMode", h)
        mig_enabled = bool(mig_mode and int(mig_mode[0]) == 1)
        uuid = _text(self._call("nvmlDeviceGetUUID", h))
        return GpuInfo(
            index=index,
            minor=int(self._call("nvmlDeviceGetMinorNumber", h)),
            uuid=uuid,
            name=_text(self._call("nvmlDeviceGetName", h)),
            brand=BRAND_NAMES.get(int(self._call("nvmlDeviceGetBrand", h)), "Unknown"),
            architecture=ARCH_NAMES.get(int(arch), "Unknown") if arch is not None else "Unknown",
            compute_capability=f"{int(major)}.{int(minor_cc)}",
            memory_bytes=int(mem.total) if mem is not None else None,
            pci_bus_id=pci,
            pcie_root=self._pcie_root(h, pci),
            addressing_mode=ADDRESSING_NAMES.get(int(mode)) if mode is not None else None,
            mig_enabled=mig_enabled,
            migs=self._migs(h) if mig_enabled else (),
            nvlink_remotes=self._nvlinks(h),
            numa_node=self._numa(h, pci),
            mig_profiles=self._mig_profiles(h) if mig_enabled else (),
        )

    def _mig_profiles(self, h: Any) -> tuple[MigProfile, ...]:
        out: list[MigProfile] = []
        for index in range(GI_PROFILE_INDICES):
            info = self._optional("nvmlDeviceGetGpuInstanceProfileInfo", h, index)
            if info is None or any(p.profile_id == int(info.id) for p in out):
                continue
            count = ctypes.c_uint(0)
            if self._optional("nvmlDeviceGetGpuInstancePossiblePlacements", h, int(info.id), None,
                              ctypes.byref(count)) is None:  # fmt: skip
                continue
            n = min(int(count.value), MAX_PLACEMENTS)
            places = (_Placement * max(n, 1))()
            count.value = n
            self._call("nvmlDeviceGetGpuInstancePossiblePlacements", h, int(info.id), places,
                       ctypes.byref(count))  # fmt: skip
            got = places[: min(int(count.value), n)]
            if not got:
                continue
            name = _text(getattr(info, "name", "")).removeprefix("MIG ").strip()
            memory_mb = int(info.memorySizeMB)
            out.append(
                MigProfile(
                    profile_id=int(info.id),
                    name=name or f"{int(info.sliceCount)}g.{-(-memory_mb // 1024)}gb",
                    size=int(got[0].size),
                    compute_slices=int(info.sliceCount),
                    starts=tuple(sorted(int(p.start) for p in got)),
                    memory_bytes=memory_mb * 2**20,
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                )
            )
        return tuple(sorted(out, key=lambda p: (p.size, p.compute_slices, p.profile_id)))

    # --- dynamic MIG -----------------------------------------------------------------------------
    def create_mig(self, gpu_uuid: str, profile_id: int, start: int) -> MigInfo:
        """Create a GPU instance of `profile_id` at memory slice `start`, and its full compute instance.

        NvmlCallError when NVML refuses (ERR_INSUFFICIENT_RESOURCES: the slices are taken). A GPU
        instance whose compute instance cannot be made is destroyed again before the error is raised.
        """
        with self._lock:
            self._call("nvmlInit")
            try:
                h = self._call("nvmlDeviceGetHandleByUUID", gpu_uuid)
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfoById", h, profile_id)
                place = _Placement(start, 0)
                for p in self._mig_profiles(h):
                    if p.profile_id == profile_id:
                        place.size = p.size
                gi = self._call(
                    "nvmlDeviceCreateGpuInstanceWithPlacement", h, profile_id, ctypes.byref(place)
                )
                try:
                    ci_profile = None
                    for index in range(CI_PROFILE_INDICES):
                        cp = self._optional("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, index, 0)
                        if cp is not None and int(cp.sliceCount) == int(info.sliceCount):
                            ci_profile = int(cp.id)
                            break
                    if ci_profile is None:
                        why = f"no full compute instance profile for GPU instance profile {profile_id}"
                        call = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
                        raise NvmlCallError(call, ERR_NOT_SUPPORTED, why)
                    ci = self._call("nvmlGpuInstanceCreateComputeInstance", gi, ci_profile)
                except NvmlCallError:
                    self._optional("nvmlGpuInstanceDestroy", gi)
                    raise
                gi_id = int(self._call("nvmlGpuInstanceGetInfo", gi).id)
                ci_id = int(self._call("nvmlComputeInstanceGetInfo", ci).id)
                for m in self._migs(h):
                    if (m.gi_id, m.ci_id) == (gi_id, ci_id):
                        return m
                raise NvmlCallError("nvmlDeviceGetMigDeviceHandleByIndex", ERR_NOT_FOUND,
                                    f"the new MIG device (GPU instance {gi_id}) is not listed")  # fmt: skip
            finally:
                self._call("nvmlShutdown")

    def destroy_mig_at(self, gpu_uuid: str, profile_id: int, start: int) -> bool:
        """Destroy the GPU instance of `profile_id` at memory slice `start` with its compute instances.

        For recovery: a plugin killed between creating an instance and recording its id left it
        behind, and since instances never share a memory slice, the one at this placement is the
        claim's. False when there is none. Probes GPU instance ids 1..MAX_GPU_INSTANCE_ID (bounded).
        """
        with self._lock:
            self._call("nvmlInit")
            try:
                h = self._call("nvmlDeviceGetHandleByUUID", gpu_uuid)
                for gi_id in range(1, MAX_GPU_INSTANCE_ID + 1):
                    gi = self._optional("nvmlDeviceGetGpuInstanceById", h, gi_id)
                    if gi is None:
                        continue
                    info = self._call("nvmlGpuInstanceGetInfo", gi)
                    if int(info.profileId) != profile_id or int(info.placement.start) != start:
                        continue
                    for ci_id in range(CI_PROFILE_INDICES):
                        ci = self._optional("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
                        if ci is not None:
                            self._call("nvmlComputeInstanceDestroy", ci)
                    self._call("nvmlGpuInstanceDestroy", gi)
                    return True
                return False
            finally:
                self._call("nvmlShutdown")

    def destroy_mig(self, gpu_uuid: str, gi_id: int, ci_id: int) -> bool:
        """Destroy a compute instance and its GPU instance; False when they were already gone."""
        with self._lock:
            self._call("nvmlInit")
            try:
                h = self._call("nvmlDeviceGetHandleByUUID", gpu_uuid)
                gi = self._optional("nvmlDeviceGetGpuInstanceById", h, gi_id)
                if gi is None:
                    return False
                ci = self._optional("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
                if ci is not None:
                    self._call("nvmlComputeInstanceDestroy", ci)
                self._call("nvmlGpuInstanceDestroy", gi)
                return True
            finally:
                self._call("nvmlShutdown")

    def _numa(self, h: Any, pci: str) -> int | None:
        if self.simulated:
            node = getattr(h, "numa_node", None)
            return int(node) if isinstance(node, int) and node >= 0 else None
        try:  # sysfs, as the kernel reports it for the PCI device; -1: no NUMA affinity
            node = int((self.sysfs_root / pci / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def _pcie_root(self, h: Any, pci: str) -> str | None:
        if self.simulated:
            root = getattr(h, "pcie_root", None)
            return str(root) if root else None
        # /sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/0000:00:01.0/<bdf>
        try:
            target = os.path.realpath(self.sysfs_root / pci)
        except OSError:
            return None
        for part in Path(target).parts:
            if part.startswith("pci") and ":" in part:
                return part
        return None

    def _migs(self, parent: Any) -> tuple[MigInfo, ...]:
        out: list[MigInfo] = []
        for i in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", parent))):
            mh = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", parent, i)
            if mh is None:
                continue
            attrs = self._call("nvmlDeviceGetAttributes", mh)
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mh))
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mh))
            gi_info = self._call(
                "nvmlGpuInstanceGetInfo", self._call("nvmlDeviceGetGpuInstanceById", parent, gi_id)
            )
            gi_slices, ci_slices = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
            prof = self._optional("nvmlDeviceGetGpuInstanceProfileInfoById", parent, int(gi_info.profileId))
            if prof is not None and _text(prof.name).strip():
                name = _text(prof.name).removeprefix("MIG ").strip()
            else:  # older drivers: NVIDIA's naming rule, <slices>g.<memory GB rounded up>gb
                name = f"{gi_slices}g.{-(-int(attrs.memorySizeMB) // 1024)}gb"
            if ci_slices and ci_slices != gi_slices:
                name = f"{ci_slices}c.{name}"
            out.append(
                MigInfo(
                    uuid=_text(self._call("nvmlDeviceGetUUID", mh)),
                    profile=name,
                    gi_profile_id=int(gi_info.profileId),
                    gi_id=gi_id,
                    ci_id=ci_id,
                    placement_start=int(gi_info.placement.start),
                    placement_size=int(gi_info.placement.size),
                    memory_bytes=int(attrs.memorySizeMB) * 2**20,
                    multiprocessors=int(attrs.multiprocessorCount),
                    copy_engines=int(attrs.sharedCopyEngineCount),
                    decoders=int(attrs.sharedDecoderCount),
                    encoders=int(attrs.sharedEncoderCount),
                    jpeg_engines=int(attrs.sharedJpegCount),
                    ofa_engines=int(attrs.sharedOfaCount),
                )
            )
        return tuple(out)

    def _nvlinks(self, h: Any) -> tuple[str, ...]:
        remotes: list[str] = []
        for link in range(MAX_NVLINKS):
            state = self._optional("nvmlDeviceGetNvLinkState", h, link)
            if state is None:
                continue
            if int(state) != 1:
                continue
            info = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            if info is not None:
                remotes.append(normalize_pci_bus_id(info.busId))
        return tuple(remotes)

    # --- XID events (driver/health.py) -------------------------------------------------------
    def watch_xids(self, uuids: list[str]) -> Any:
        """An NVML event set registered for XID critical errors on these GPUs (NVML stays initialised)."""
        self._call("nvmlInit")
        try:
            events = self._call("nvmlEventSetCreate")
            for uuid in uuids:
                try:
                    h = self._call("nvmlDeviceGetHandleByUUID", uuid)
                    self._call("nvmlDeviceRegisterEvents", h, EVENT_XID_CRITICAL, events, expected=_ABSENT)
                except NvmlCallError as exc:  # a GPU without events (or already lost): others still count
                    log.warning("no XID events for GPU %s: %s", uuid, exc)
        except BaseException:
            self._call("nvmlShutdown")
            raise
        return events

    def wait_xid(self, events: Any, timeout_ms: int) -> tuple[str, int] | None:
        """(GPU UUID, XID) of the next event, None after `timeout_ms` without one."""
        wait = "nvmlEventSetWait_v2" if hasattr(self.lib, "nvmlEventSetWait_v2") else "nvmlEventSetWait"
        try:
            data = self._call(wait, events, timeout_ms, expected=(ERR_TIMEOUT,))
        except NvmlCallError as exc:
            if exc.code == ERR_TIMEOUT:
                return None
            raise
        return _text(self._call("nvmlDeviceGetUUID", data.device)), int(data.eventData)

    def lost_gpus(self, uuids: Sequence[str]) -> list[str]:
        """Those of `uuids` NVML answers GPU_IS_LOST for: one cheap query each, inside a watch
        (NVML initialised), to tell which GPU a wait's GPU_IS_LOST was about."""
        lost = []
        for uuid in uuids:
            try:
                self._call("nvmlDeviceGetMinorNumber", self._call("nvmlDeviceGetHandleByUUID", uuid))
            except NvmlCallError as exc:
                if exc.code == ERR_GPU_IS_LOST:
                    lost.append(uuid)
                else:
                    log.warning("probing GPU %s after a lost-GPU answer: %s", uuid, exc)
        return lost

    def close_watch(self, events: Any) -> None:
        try:
            self._call("nvmlEventSetFree", events)
        except NvmlCallError as exc:
            log.warning("freeing the NVML event set failed: %s", exc)
        finally:
            self._call("nvmlShutdown")

    def set_time_slice(self, gpu_uuid: str, value: int) -> None:
        """Set the compute time-slice of a full GPU (0=Default, 1=Short, 2=Medium, 3=Long).

        pynvml exposes no compute time-slice call, so a real node uses `nvidia-smi compute-policy`
        (what NVIDIA's own driver does); the simulator records the value.
        """
        if self.simulated:
            with self._lock:
                self._call("nvmlInit")
                try:
                    self._call("simSetComputeTimeslice", gpu_uuid, value)
                except NvmlCallError as exc:
                    if exc.code == ERR_NOT_SUPPORTED:
                        raise SharingUnsupported(f"time-slicing is not supported on GPU {gpu_uuid}") from None
                    raise
                finally:
                    self._call("nvmlShutdown")
            return
        smi = str(self.smi) if self.smi is not None else shutil.which("nvidia-smi")
        if smi is None:
            raise SharingUnsupported(
                "time-slicing needs nvidia-smi: none in the driver root (--driver-root) nor on PATH"
            )
        env = dict(os.environ)
        lib = getattr(getattr(self.lib, "nvmlLib", None), "_name", None)
        if isinstance(lib, str) and "/" in lib:  # nvidia-smi loads libnvidia-ml.so.1 from the driver root too
            env["LD_LIBRARY_PATH"] = os.path.dirname(lib)
        proc = subprocess.run(  # fixed argv, no shell
            [smi, "compute-policy", "-i", gpu_uuid, f"--set-timeslice={value}"],
            capture_output=True, text=True, timeout=30, check=False, env=env,
        )  # fmt: skip
        if proc.returncode != 0:
            if self.on_error is not None:
                self.on_error("nvidia-smi compute-policy")
            msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
            raise SharingUnsupported(f"setting the time-slice on {gpu_uuid} failed: {msg}")


def open_real(
    on_error: Callable[[str], None] | None = None, library: Path | None = None, smi: Path | None = None
) -> Nvml:
    """NVML from nvidia-ml-py; raises NvmlUnavailable with a clear message when it cannot load.

    `library` is the driver root's libnvidia-ml.so.1 (loaded instead of the loader's search path);
    `smi` its nvidia-smi.
    """
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(
            "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
        ) from None
    if library is not None and getattr(pynvml, "nvmlLib", None) is None:
        import ctypes

        try:
            pynvml.nvmlLib = ctypes.CDLL(str(library))  # pynvml keeps an already loaded library
        except OSError as exc:
            raise NvmlUnavailable(f"cannot load {library}: {exc}") from None
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(
            f"NVML is not usable on this machine ({exc}); run on a node with the NVIDIA driver installed, "
            f"or use --sim TOPOLOGY.yaml (or {SIM_ENV}) for a simulated node"
        ) from None
    return Nvml(pynvml, simulated=False, source="nvml", on_error=on_error, smi=smi)


def open_sim(path: str | Path, on_error: Callable[[str], None] | None = None) -> Nvml:
    from .sim import load_topology

    sim = load_topology(path)
    return Nvml(sim, simulated=True, source=sim.source, on_error=on_error)


def open_nvml(
    sim: str | None,
    real: bool,
    on_error: Callable[[str], None] | None = None,
    library: Path | None = None,
    smi: Path | None = None,
) -> Nvml:
    """Pick the backend: `--sim FILE`, else `DRAGUARD_NVML_SIM`, else real NVML.

    `--real` wins over the environment variable, so a node can never be silently simulated.
    """
    if sim:
        return open_sim(sim, on_error)
    env = os.environ.get(SIM_ENV)
    if env and not real:
        return open_sim(env, on_error)
    return open_real(on_error, library, smi)
