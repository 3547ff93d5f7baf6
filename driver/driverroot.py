"""Where the NVIDIA driver lives on the host, and the files of it a CUDA container needs.

A root has two forms: the host path (what goes into CDI specs, which the container runtime reads
on the host) and the path where this process sees it (`mount`; in the DaemonSet the host's driver
root is mounted at /driver-root). Known layouts: `/` (driver installed on the host),
`/run/nvidia/driver` (the GPU Operator's driver container), `/home/kubernetes/bin/nvidia` (GKE).

What is collected follows nvidia-container-toolkit's CDI generator (`pkg/nvcdi`): the libraries
named `*.so.<driver version>` (selected here by driver capability), the driver's binaries, GSP
firmware under `lib/firmware/nvidia/<version>/`, and the persistenced / fabricmanager sockets and
the MPS pipe directory when they exist.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
    "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib",
)  # fmt: skip
BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
FIRMWARE_DIRS = ("lib/firmware", "usr/lib/firmware", "firmware")
KNOWN_ROOTS = "/ (driver on the host), /run/nvidia/driver (GPU Operator), /home/kubernetes/bin/nvidia (GKE)"
SIM_MARKER = "draguard-simulated-driver-root.json"

# Library stems by NVIDIA_DRIVER_CAPABILITIES value (libnvidia-container's lists).
CAPABILITY_LIBS: dict[str, tuple[str, ...]] = {
    "utility": ("libnvidia-ml", "libnvidia-cfg"),
    "compute": (
        "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
        "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
        "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",
    ),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": (
        "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
        "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia",
        "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv",
    ),
    "ngx": ("libnvidia-ngx",),
}  # fmt: skip
CAPABILITY_BINS: dict[str, tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
# The libraries without which a capability does not work at all in the container: CUDA needs libcuda
# (the driver API every CUDA runtime loads) and NVML-based tools need libnvidia-ml. Video, graphics and
# NGX libraries are absent from data-center installs made without them (--no-opengl-files), and
# only some applications load them, so they are mounted when present and never required.
REQUIRED_LIBS: dict[str, tuple[str, ...]] = {"utility": ("libnvidia-ml",), "compute": ("libcuda",)}
DEFAULT_CAPABILITIES = ("compute", "utility")
IPC_SOCKETS = ("run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket",
               "run/nvidia-fabricmanager/socket", "var/run/nvidia-fabricmanager/socket")  # fmt: skip
HOOK_CANDIDATES = ("usr/bin/nvidia-cdi-hook", "usr/local/nvidia/toolkit/nvidia-cdi-hook")


class DriverRootError(ValueError):
    """The driver root is unusable; the message names the path, what is missing and what to do."""


@dataclass(frozen=True)
class Root:
    """A directory by its host path and the path where this process reads it."""

    host: PurePosixPath
    mount: Path

    @classmethod
    def of(cls, host: str, mount: str | None = None) -> Root:
        if not host.startswith("/"):
            raise DriverRootError(f"{host!r}: the driver root must be an absolute host path ({KNOWN_ROOTS})")
        return cls(PurePosixPath(host), Path(mount or host))

    def to_host(self, seen: Path) -> str:
        """The host path of a file found under `mount`."""
        return str(self.host / seen.relative_to(self.mount))

    def describe(self) -> str:
        return str(self.host) if str(self.host) == str(self.mount) else f"{self.host} (seen at {self.mount})"


@dataclass(frozen=True)
class Library:
    path: Path  # the versioned file, under the root's mount
    links: tuple[str, ...]  # names in the same directory that resolve to it (libcuda.so.1, ...)


@dataclass
class DriverFiles:
    """What a CUDA container needs from the driver root (paths under the root's mount)."""

    root: Root
    version: str
    libraries: list[Library] = field(default_factory=list)
    binaries: list[Path] = field(default_factory=list)
    firmware: list[Path] = field(default_factory=list)
    sockets: list[Path] = field(default_factory=list)
    hook: str | None = None  # host path of nvidia-cdi-hook


def _lib_dirs(root: Path) -> list[Path]:
    out: list[Path] = []
    seen: set[str] = set()
    for d in LIB_DIRS:
        p = root / d
        if p.is_dir() and not p.is_symlink():  # lib -> usr/lib on merged-/usr systems: read once
            real = os.path.realpath(p)
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


def find_nvml(root: Root) -> Path | None:
    """libnvidia-ml.so.1 under the root, as this process sees it."""
    for d in _lib_dirs(root.mount):
        p = d / "libnvidia-ml.so.1"
        if p.exists():
            return p
    return None


def find_binary(root: Root, name: str) -> Path | None:
    for d in BIN_DIRS:
        p = root.mount / d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def validate(root: Root) -> None:
    """Fail with a clear message unless the root holds an NVIDIA driver installation."""
    m = root.mount
    if not m.exists():
        hint = "" if str(root.host) == str(m) else " (is the host directory mounted into the driver pod?)"
        raise DriverRootError(
            f"driver root {root.describe()} does not exist{hint}; set --driver-root to where the NVIDIA "
            f"driver is installed on the host: {KNOWN_ROOTS}"
        )
    if not m.is_dir():
        raise DriverRootError(f"driver root {root.describe()} is not a directory")
    if find_nvml(root) is None:
        dirs = ", ".join(LIB_DIRS)
        raise DriverRootError(
            f"driver root {root.describe()}: no libnvidia-ml.so.1 in any of {dirs}; the NVIDIA driver is not "
            f"installed there. Set --driver-root to where it is on the host: {KNOWN_ROOTS}"
        )


def simulated_roots(root: Root) -> tuple[str, str] | None:
    """(dev root, proc root) recorded in a simulated driver root's marker file, else None."""
    try:
        doc = json.loads((root.mount / SIM_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    dev, proc = doc.get("devRoot"), doc.get("procRoot")
    return (str(dev), str(proc)) if isinstance(dev, str) and isinstance(proc, str) else None


def parse_capabilities(text: str) -> tuple[str, ...]:
    """`compute,utility` or `all` → the capability names; unknown names are an error."""
    names = tuple(sorted({p.strip() for p in text.split(",") if p.strip()}))
    if names == ("all",):
        return tuple(sorted(CAPABILITY_LIBS))
    unknown = [n for n in names if n not in CAPABILITY_LIBS]
    if unknown or not names:
        raise DriverRootError(
            f"driver capabilities {text!r}: unknown {', '.join(unknown) or '(empty)'}; "
            f"allowed: all, {', '.join(sorted(CAPABILITY_LIBS))}"
        )
    return names


def _stem(filename: str, version: str) -> str:
    return filename[: -len(f".so.{version}")]


def discover(
    root: Root, version: str, capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES, hook: str = "auto"
) -> DriverFiles:
    """Collect the driver files for `version` (NVML's driver version string, e.g. 535.104.05)."""
    out = DriverFiles(root=root, version=version)
    wanted = {s for c in capabilities for s in CAPABILITY_LIBS.get(c, ())}
    suffix = f".so.{version}"
    for d in _lib_dirs(root.mount):
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        versioned = [e for e in entries if e.name.endswith(suffix) and not e.is_symlink() and e.is_file()]
        for lib in versioned:
            if _stem(lib.name, version) not in wanted:
                continue
            stem, real = _stem(lib.name, version), os.path.realpath(lib)
            links = tuple(
                e.name for e in entries
                if e.name.startswith(f"{stem}.so") and e.is_symlink() and os.path.realpath(e) == real
            )  # fmt: skip
            out.libraries.append(Library(lib, links))
    for name in sorted({b for c in capabilities for b in CAPABILITY_BINS.get(c, ())}):
        p = find_binary(root, name)
        if p is not None:
            out.binaries.append(p)
    for fw_dir in FIRMWARE_DIRS:
        fw = root.mount / fw_dir / "nvidia" / version
        if fw.is_dir():
            out.firmware.extend(sorted(p for p in fw.glob("gsp*.bin") if p.is_file()))
    seen: set[str] = set()
    for rel in IPC_SOCKETS:
        p = root.mount / rel
        if p.is_socket() and os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            out.sockets.append(p)
    out.hook = _find_hook(root, hook)
    _require_libraries(out, capabilities)
    return out


def _versions_found(root: Root, stem: str) -> list[str]:
    """Where `<stem>.so.<version>` files of any version are under the root, as `version (dir)`."""
    found: list[str] = []
    prefix = f"{stem}.so."
    for d in _lib_dirs(root.mount):
        try:
            names = sorted(e.name for e in d.iterdir() if e.name.startswith(prefix) and not e.is_symlink())
        except OSError:
            continue
        for name in names:
            version = name[len(prefix):]
            if version and version[0].isdigit() and "." in version:  # not libcuda.so.1 (a SONAME link)
                found.append(f"{version} ({root.to_host(d)})")
    return found


def _require_libraries(files: DriverFiles, capabilities: tuple[str, ...]) -> None:
    """A container without libcuda or libnvidia-ml starts and then fails inside CUDA with no hint why;
    refuse here instead, naming NVML's version, what the root holds and the setting to fix."""
    have = {_stem(lib.path.name, files.version) for lib in files.libraries}
    missing = [
        (cap, stem) for cap in capabilities for stem in REQUIRED_LIBS.get(cap, ()) if stem not in have
    ]
    if not missing:
        return
    parts = []
    for cap, stem in missing:
        others = _versions_found(files.root, stem)
        seen = f"found only {', '.join(others)}" if others else "no version of it was found"
        parts.append(f"{stem}.so.{files.version} ({cap}): {seen}")
    raise DriverRootError(
        f"driver root {files.root.describe()}: NVML reports driver {files.version}, but the root lacks the "
        f"libraries of that version: {'; '.join(parts)}. A driver upgrade that is not finished (reboot or "
        f"reload the kernel module) or --driver-root pointing at another installation does this; set "
        f"--driver-root (DRIVER_ROOT) to the root of the driver NVML runs, or drop the capability from "
        f"--driver-capabilities. Known roots: {KNOWN_ROOTS}"
    )


def _find_hook(root: Root, hook: str) -> str | None:
    if hook == "none":
        return None
    if hook != "auto":
        return hook  # an explicit host path: the runtime runs it on the host, where we cannot look
    for rel in HOOK_CANDIDATES:
        p = root.mount / rel
        if p.is_file() and os.access(p, os.X_OK):
            return root.to_host(p)
    return None


def read_cap_minor(proc_root: Path, parent_minor: int, gi: int, ci: int | None = None) -> int | None:
    """The minor of `/dev/nvidia-caps/nvidia-cap<minor>` for a MIG GPU or compute instance.

    The driver publishes it in /proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access as
    `DeviceFileMinor: <minor>`.
    """
    path = proc_root / f"proc/driver/nvidia/capabilities/gpu{parent_minor}/mig/gi{gi}"
    if ci is not None:
        path = path / f"ci{ci}"
    try:
        text = (path / "access").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None
