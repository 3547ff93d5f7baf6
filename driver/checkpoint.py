"""The driver's checkpoint: which claims are prepared (or half-prepared) on this node.

Layout (JSON): `{"checksum": <crc32 of the canonical "v2" text>, "v2": {"nodeBootID": ...,
"preparedClaims": {<claimUID>: {"checkpointState": "PrepareStarted" | "PrepareCompleted", "name",
"namespace", "preparedDevices": [...], "driverVersion"}}}}`. Writes are atomic (temp file, fsync,
rename, fsync of the directory). A node-wide lock file serialises prepare and unprepare, also
across two plugin processes overlapping during a rolling update. The checkpoint is discarded when
the node's boot id changes: after a reboot nothing is prepared any more.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

log = logging.getLogger("draguard.driver.checkpoint")

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
State = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"


class CheckpointCorrupt(RuntimeError):
    """The checkpoint file cannot be trusted (bad JSON or checksum mismatch)."""


@dataclass
class MigInstance:
    """A MIG instance prepare creates for a dynamic-MIG device: where, and once made, which it is.

    The placement is recorded before the instance is created, so that a plugin killed in between
    can still find and destroy it (instances never share a memory slice).
    """

    parent_uuid: str
    profile_id: int
    start: int
    gi_id: int | None = None
    ci_id: int | None = None
    uuid: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parentUUID": self.parent_uuid, "profileId": self.profile_id}
        out["start"] = self.start
        if self.gi_id is not None:
            out.update(gpuInstanceId=self.gi_id, computeInstanceId=self.ci_id, uuid=self.uuid)
        return out

    @classmethod
    def from_json(cls, d: Any) -> MigInstance | None:
        if not isinstance(d, dict):
            return None

        def num(key: str) -> int | None:
            v = d.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 16 else None

        parent, profile, start = d.get("parentUUID"), num("profileId"), num("start")
        if not isinstance(parent, str) or profile is None or start is None:
            return None
        made = num("gpuInstanceId")
        uuid = d.get("uuid") if isinstance(d.get("uuid"), str) else None
        if made is None or num("computeInstanceId") is None or uuid is None:
            return cls(parent, profile, start)
        return cls(parent, profile, start, made, num("computeInstanceId"), uuid)


@dataclass
class PreparedDevice:
    requests: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None = None
    sharing: str | None = None  # the claim's sharing strategy for this device (TimeSlicing), if any
    admin_access: bool = False
    consumed_memory: int | None = None  # bytes of the GPU's memory this share holds (consumedCapacity)
    mig: MigInstance | None = None  # the instance made for a dynamic-MIG device

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIDs": self.cdi_device_ids,
        }
        if self.share_id:
            out["shareID"] = self.share_id
        if self.sharing:
            out["sharing"] = self.sharing
        if self.admin_access:
            out["adminAccess"] = True
        if self.consumed_memory is not None:
            out["consumedCapacity"] = {"memory": str(self.consumed_memory)}
        if self.mig is not None:
            out["dynamicMig"] = self.mig.to_json()
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreparedDevice:
        return cls(
            requests=list(d.get("requests") or d.get("Requests") or []),
            pool_name=str(d.get("poolName") or d.get("PoolName") or ""),
            device_name=str(d.get("deviceName") or d.get("DeviceName") or ""),
            cdi_device_ids=list(d.get("cdiDeviceIDs") or d.get("CDIDeviceIDs") or []),
            share_id=d.get("shareID") or d.get("ShareID"),
            sharing=d.get("sharing") if isinstance(d.get("sharing"), str) else None,
            admin_access=d.get("adminAccess") is True,
            consumed_memory=_bytes(d.get("consumedCapacity")),
            mig=MigInstance.from_json(d.get("dynamicMig")),
        )


def _bytes(consumed: Any) -> int | None:
    """The recorded memory of a share; None when absent or not a plain byte count."""
    raw = consumed.get("memory") if isinstance(consumed, dict) else None
    if isinstance(raw, str) and raw.isdigit() and len(raw) <= 24:
        return int(raw)
    return None


@dataclass
class ClaimEntry:
    state: State
    name: str
    namespace: str
    devices: list[PreparedDevice] = field(default_factory=list)
    driver_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # fields written by other versions, kept as-is

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "checkpointState": self.state,
            "name": self.name,
            "namespace": self.namespace,
            "preparedDevices": [d.to_json() for d in self.devices],
            "driverVersion": self.driver_version,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClaimEntry:
        known = {"checkpointState", "name", "namespace", "preparedDevices", "driverVersion"}
        state = d.get("checkpointState", PREPARE_COMPLETED)
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            state = PREPARE_STARTED  # unknown states are treated as unfinished: rolled back on start
        return cls(
            state=state,
            name=str(d.get("name", "")),
            namespace=str(d.get("namespace", "")),
            devices=[
                PreparedDevice.from_json(x) for x in d.get("preparedDevices") or [] if isinstance(x, dict)
            ],
            driver_version=str(d.get("driverVersion", "")),
            extra={k: v for k, v in d.items() if k not in known},
        )


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _checksum(obj: Any) -> int:
    return zlib.crc32(_canonical(obj).encode())


class Checkpoint:
    """`<plugin dir>/checkpoint.json` plus the `pu.lock` file lock."""

    def __init__(self, directory: str | Path, *, boot_id_path: Path = BOOT_ID_PATH) -> None:
        self.dir = Path(directory)
        self.path = self.dir / "checkpoint.json"
        self.lock_path = self.dir / "pu.lock"
        self.boot_id_path = boot_id_path
        self._tlock = threading.Lock()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the node-wide prepare/unprepare lock (thread- and process-wide)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._tlock:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def load(self) -> dict[str, ClaimEntry]:
        """Claims in the checkpoint; empty when absent or written before the last reboot.

        Raises CheckpointCorrupt when the file exists but fails its checksum.
        """
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return {}
        except UnicodeDecodeError as exc:  # garbled bytes are damage too: recovery quarantines the file
            raise CheckpointCorrupt(f"{self.path}: not UTF-8 text (byte {exc.start})") from None
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CheckpointCorrupt(f"{self.path}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise CheckpointCorrupt(f"{self.path}: expected a JSON object")
        v2 = doc.get("v2")
        if v2 is None and "v1" in doc:  # legacy layout: every listed claim counts as completed
            v1 = doc.get("v1") or {}
            try:
                return {uid: ClaimEntry.from_json({"checkpointState": PREPARE_COMPLETED, **(e or {})})
                        for uid, e in (v1.get("preparedClaims") or {}).items()}  # fmt: skip
            except (AttributeError, KeyError, TypeError, ValueError) as exc:  # v1 carries no checksum
                raise CheckpointCorrupt(f"{self.path}: unreadable v1 checkpoint ({exc})") from None
        if not isinstance(v2, dict):
            raise CheckpointCorrupt(f"{self.path}: missing the 'v2' section")
        if doc.get("checksum") != _checksum(v2):
            raise CheckpointCorrupt(f"{self.path}: checksum mismatch (file damaged or edited by hand)")
        boot = read_boot_id(self.boot_id_path)
        if boot and v2.get("nodeBootID") and v2["nodeBootID"] != boot:
            log.warning("node rebooted since the checkpoint was written (boot id changed); discarding it")
            return {}
        claims = v2.get("preparedClaims") or {}
        return {uid: ClaimEntry.from_json(e) for uid, e in claims.items() if isinstance(e, dict)}

    def save(self, claims: dict[str, ClaimEntry]) -> None:
        v2 = {
            "nodeBootID": read_boot_id(self.boot_id_path),
            "preparedClaims": {uid: e.to_json() for uid, e in sorted(claims.items())},
        }
        doc = {"checksum": _checksum(v2), "v2": v2}
        # 0600: the checkpoint names every claim on the node; only the plugin reads it.
        atomic_write(self.path, json.dumps(doc, indent=2, sort_keys=True).encode(), mode=0o600)

    def quarantine(self) -> Path:
        """Move a corrupt checkpoint aside (kept for inspection) and start afresh."""
        dest = self.path.with_suffix(".corrupt")
        os.replace(self.path, dest)
        return dest


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` so readers see either the old or the new file, never a torn one.

    The file gets exactly `mode` (whatever the umask), before any byte is in it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
