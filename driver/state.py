"""Prepare / unprepare logic, claim reading and start-up recovery.

Prepare is two-phase through the checkpoint: `PrepareStarted` is recorded before any side effect
(time-slice setting, CDI spec), `PrepareCompleted` once all are done. A repeated prepare of a
completed claim returns the recorded devices, rewriting the claim's CDI spec if it is missing.
Unprepare drops the checkpoint entry before the CDI spec, so a claim the checkpoint holds as
prepared always has its spec; a spec left by a crash in between is swept by start-up recovery.
Unprepare needs only the claim UID, so it works for claims prepared by an older driver version and
for claims already deleted from the API.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from . import __version__ as _driver_version
from .cdi import CdiDevice, CdiError, CdiWriter
from .checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointCorrupt,
    ClaimEntry,
    MigInstance,
    PreparedDevice,
)
from .config import (
    INTERVAL_VALUES,
    KINDS,
    DeviceConfig,
    GpuConfig,
    default_config,
    parse_opaque_config,
    validate_opaque_config,
)
from .devices import DriverDevice
from .kube import KubeHTTPError
from .kube import request as kube_request
from .metrics import DriverMetrics
from .nvml import Nvml, NvmlCallError, SharingUnsupported
from .sharing import MODE_CAPACITY, check_share_id, consumed_memory
from .slices import format_quantity
from .status import ClaimStatusWriter, StatusWrite, device_entries

log = logging.getLogger("draguard.driver.state")

GROUP = "resource.k8s.io"


# Fault injection for crash tests: the process exits (no cleanup, like SIGKILL) at the named point.
CRASH_ENV = "DRAGUARD_DRIVER_CRASH_AT"


def env_fault(point: str) -> None:
    if os.environ.get(CRASH_ENV) == point:
        os._exit(137)


class ClaimReadError(RuntimeError):
    """The API server could not be asked (as opposed to: the claim does not exist)."""


class ClaimReader(Protocol):
    """Reads ResourceClaims from the API server (or something playing it in tests)."""

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim as a JSON object, None when it does not exist; ClaimReadError when unknown."""
        ...


class KubeClaimReader:
    """ClaimReader over a `kubernetes.client.ApiClient` (any served resource.k8s.io version)."""

    def __init__(self, api_client: Any, version: str = "v1") -> None:
        self.api = api_client
        self.version = version

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/{GROUP}/{self.version}/namespaces/{namespace}/resourceclaims/{name}"
        try:
            obj = kube_request(self.api, "GET", path, timeout=20)
        except KubeHTTPError as exc:
            if exc.status == 404:
                return None
            raise ClaimReadError(f"reading ResourceClaim {namespace}/{name}: {exc}") from None
        except Exception as exc:  # urllib3 connection errors and the like
            raise ClaimReadError(f"reading ResourceClaim {namespace}/{name}: {exc}") from None
        return obj if isinstance(obj, dict) else None


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class Planned:
    """One device (or one share of it) of a claim, as prepare will set it up."""

    dev: DriverDevice
    requests: tuple[str, ...]
    share: str | None
    cfg: DeviceConfig
    memory: int | None = None  # bytes of a share's memory (consumedCapacity)

    def cdi(self) -> CdiDevice:
        return CdiDevice(self.dev, self.requests, self.share, self.memory)


def _intended(dev: DriverDevice) -> MigInstance | None:
    """The MIG instance a dynamic-MIG device needs, before it exists."""
    if dev.counter_set is None or dev.mig_profile_id is None or dev.mig_start is None:
        return None
    return MigInstance(dev.parent_uuid or dev.uuid, dev.mig_profile_id, dev.mig_start)


def _concrete(dev: DriverDevice, mig: MigInstance | None) -> DriverDevice:
    """A dynamic-MIG device as the MIG instance made for it (what the CDI spec names)."""
    if mig is None or mig.uuid is None:
        return dev
    parent = mig.parent_uuid
    return replace(dev, type="mig", uuid=mig.uuid, gi_id=mig.gi_id, ci_id=mig.ci_id, parent_uuid=parent)


def _mode(share: str | None, admin: bool, strategy: str | None) -> str | None:
    """How a prepared device is shared: 'adminAccess', a strategy, or None when it is exclusive."""
    if admin:
        return "adminAccess"
    return MODE_CAPACITY if share else strategy


@dataclass
class PrepareOutcome:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class MigCreateError(RuntimeError):
    """NVML would not create a dynamic-MIG device's instance; the message names device and placement."""


class PrepareError(Exception):
    """A per-claim failure; the message goes back to kubelet in the claim's `error`."""


@dataclass
class RecoveryReport:
    rolled_back: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    orphan_specs_removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    checkpoint_quarantined: str | None = None


def _names(devices: Sequence[PreparedDevice]) -> str:
    return ",".join(d.device_name for d in devices) or "(none)"


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _strategy(cfg: DeviceConfig) -> str | None:
    return cfg.sharing.strategy if cfg.sharing is not None else None


def _request_matches(names: Sequence[str], request: str) -> bool:
    # A result for subrequest "req/sub" is configured by configs naming "req" or "req/sub".
    return request in names or request.split("/", 1)[0] in names


class DeviceState:
    """Everything prepare/unprepare needs; thread-safe (calls are serialised by the checkpoint lock)."""

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        devices: Sequence[DriverDevice],
        checkpoint: Checkpoint,
        cdi: CdiWriter,
        claims: ClaimReader,
        nvml: Nvml | None = None,
        metrics: DriverMetrics | None = None,
        version: str = _driver_version,
        fault: Callable[[str], None] | None = None,
        health: Any = None,
        status: ClaimStatusWriter | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.devices = {d.name: d for d in devices}
        self.checkpoint = checkpoint
        self.cdi = cdi
        self.claims = claims
        self.nvml = nvml
        self.metrics = metrics
        self.version = version
        self.fault = fault or env_fault
        self.health = health  # driver.health.HealthTracker: devices of lost GPUs are refused
        self.status = status  # claim device status (KEP-4817), written in the background

    # --- prepare ---------------------------------------------------------------------------------
    def prepare(self, ref: ClaimRef) -> PrepareOutcome:
        start = time.perf_counter()
        try:
            with self.checkpoint.locked():
                devices = self._prepare_locked(ref)
            outcome = PrepareOutcome(devices=devices)
        except PrepareError as exc:
            outcome = PrepareOutcome(error=str(exc))
        except CheckpointCorrupt as exc:
            outcome = PrepareOutcome(error=f"checkpoint unreadable, restart the plugin to recover: {exc}")
        except Exception as exc:  # unexpected: still a per-claim error, never a crashed call
            log.exception("prepare of claim %s failed unexpectedly", ref)
            outcome = PrepareOutcome(error=f"internal error preparing claim {ref}: {exc}")
        if self.metrics is not None:
            self.metrics.prepared(not outcome.error, time.perf_counter() - start)
        took = (time.perf_counter() - start) * 1000
        if outcome.error:
            log.warning("prepare %s failed after %.1f ms: %s", ref, took, outcome.error)
        else:
            log.info("prepared claim %s: devices %s in %.1f ms", ref, _names(outcome.devices), took)
            self._publish_status(ref, outcome.devices)
        return outcome

    def _publish_status(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        if self.status is None:
            return
        facts: dict[str, dict[str, str]] = {}
        for d in devices:
            dev = self.devices.get(d.device_name)
            if dev is not None:
                dev = _concrete(dev, d.mig)
                product = dev.attributes.get("productName")
                facts[d.device_name] = {"uuid": dev.uuid, "type": dev.type}
                if product is not None:
                    facts[d.device_name]["productName"] = str(product[1])
        entries = device_entries(self.driver_name, self.node_name, devices, facts)
        self.status.submit(
            StatusWrite(ref.namespace, ref.name, ref.uid, self.driver_name, self.node_name, entries)
        )

    def _prepare_locked(self, ref: ClaimRef) -> list[PreparedDevice]:
        claims = self.checkpoint.load()
        entry = claims.get(ref.uid)
        if entry is not None and entry.state == PREPARE_COMPLETED:
            restored = self._ensure_spec(ref, entry, claims)
            if restored is not None:
                return restored
        if entry is not None:  # died between the phases, or spec not restorable: start over
            if not self._rollback(ref.uid, entry):
                raise PrepareError(f"claim {ref}: MIG instances of an earlier attempt cannot be destroyed")
            claims.pop(ref.uid, None)
            self.checkpoint.save(claims)
        obj = self._read(ref)
        plan = self._plan(ref, obj)
        results = _get(obj, "status", "allocation", "devices", "results") or []
        admin = {str(r.get("device")) for r in results if isinstance(r, Mapping) and r.get("adminAccess")}
        self._check_exclusive(ref, plan, claims, admin)
        self.fault("before-prepare-checkpoint")
        prepared = [
            PreparedDevice(
                list(item.requests),
                self.node_name,
                item.dev.name,
                [],
                item.share,
                sharing=_strategy(item.cfg),
                admin_access=item.dev.name in admin,
                consumed_memory=item.memory,
                mig=_intended(item.dev),
            )
            for item in plan
        ]
        claims[ref.uid] = ClaimEntry(PREPARE_STARTED, ref.name, ref.namespace, prepared, self.version)
        self.checkpoint.save(claims)
        self.fault("after-prepare-started")
        started = claims[ref.uid]
        try:
            cdi = []
            for item, p in zip(plan, prepared, strict=True):
                self._apply(item.dev, item.cfg)
                if p.mig is not None:
                    self._create_mig(item.dev, p.mig)
                    self.fault("after-mig-created")
                cdi.append(replace(item.cdi(), device=_concrete(item.dev, p.mig)))
            if any(p.mig is not None for p in prepared):
                self.checkpoint.save(claims)  # the instances' ids, for unprepare
            ids = self.cdi.write(ref.uid, cdi)
            self.fault("after-cdi-written")
        except (SharingUnsupported, NvmlCallError, MigCreateError, CdiError, OSError) as exc:
            if self._rollback(ref.uid, started):
                claims.pop(ref.uid, None)
                self.checkpoint.save(claims)
            # else the entry stays (PrepareStarted): its placements stay taken, and the kubelet's
            # retry or the next start destroys the instance NVML kept this time
            raise PrepareError(f"claim {ref}: {exc}") from None
        for p, cdi_id in zip(prepared, ids, strict=True):
            p.cdi_device_ids = [cdi_id]
        claims[ref.uid] = ClaimEntry(PREPARE_COMPLETED, ref.name, ref.namespace, prepared, self.version)
        self.checkpoint.save(claims)
        self.fault("after-prepare-completed")
        return prepared

    def _check_exclusive(
        self, ref: ClaimRef, plan: list[Planned], claims: dict[str, ClaimEntry], admin: set[str]
    ) -> None:
        """Refuse a device another prepared claim holds, unless both sides share it the same way.

        Shared on purpose: a sharing strategy in the claim's config (TimeSlicing), a shareID from the
        scheduler (consumable capacity), or adminAccess (which goes beside anything). Anything else is
        an allocation this node must not honour twice: two pods would silently get the same GPU. Two
        ways of sharing never meet on one GPU (one strategy per GPU at a time), and the shares of a
        GPU never hold more memory than it has, whatever the allocation says.
        """
        errors = []
        held: dict[str, int] = {}  # memory the shares of each device hold, this claim's included
        errors += self._overlaps(ref, plan, claims)
        for mine in plan:
            dev = mine.dev
            if dev.counter_set is not None:
                continue  # dynamic MIG: _overlaps decided; such a device is never shared
            my_mode = _mode(mine.share, dev.name in admin, _strategy(mine.cfg))
            if mine.memory is not None:
                held[dev.name] = held.get(dev.name, 0) + mine.memory
            for uid, entry in claims.items():
                if uid == ref.uid:
                    continue
                for p in entry.devices:
                    if p.device_name != dev.name:
                        continue
                    theirs = _mode(p.share_id, p.admin_access, p.sharing)
                    if p.consumed_memory is not None and mine.memory is not None:
                        held[dev.name] += p.consumed_memory
                    if "adminAccess" in (my_mode, theirs) or (my_mode is not None and my_mode == theirs):
                        continue
                    who = f"claim {entry.namespace}/{entry.name} ({uid})"
                    if my_mode is not None and theirs is not None:
                        errors.append(
                            f"device {dev.name} is shared by {who} with {theirs}; this claim would share it "
                            f"with {my_mode}, and a GPU is shared one way at a time"
                        )
                        continue
                    errors.append(
                        f"device {dev.name} is already prepared for {who}; two claims get the same device "
                        "only when both share it (GpuConfig sharing.strategy TimeSlicing, a shareID, or "
                        "adminAccess)"
                    )
            total = dev.capacity.get("memory")
            if mine.memory is not None and total is not None and held[dev.name] > total:
                errors.append(
                    f"device {dev.name}: the share {mine.share} of {format_quantity(mine.memory)} does not "
                    "fit: "
                    f"the GPU's prepared shares would hold {format_quantity(held[dev.name])} of its "
                    f"{format_quantity(total)} (the allocation is stale; the claim must be allocated again)"
                )
        if errors:
            raise PrepareError("; ".join(dict.fromkeys(errors)))

    def _overlaps(self, ref: ClaimRef, plan: list[Planned], claims: dict[str, ClaimEntry]) -> list[str]:
        """Dynamic MIG: a full GPU and its partitions, or two partitions on one memory slice, never together.

        The scheduler's counters keep them apart; this holds also for stale or forged allocations
        (NVML would refuse the instance anyway, but with less to go on).
        """
        errors: list[str] = []
        mine = [p.dev for p in plan if p.dev.counter_set is not None]
        for i, dev in enumerate(mine):
            for other in mine[:i]:
                if other.counter_set == dev.counter_set and other.memory_slices & dev.memory_slices:
                    errors.append(f"devices {other.name} and {dev.name} of this claim overlap on their GPU")
            for uid, entry in claims.items():
                if uid == ref.uid:
                    continue
                for p in entry.devices:
                    held = self.devices.get(p.device_name)
                    if held is None or held.counter_set != dev.counter_set:
                        continue
                    if held.memory_slices & dev.memory_slices:
                        errors.append(
                            f"device {dev.name} overlaps {held.name}, prepared for claim {entry.namespace}/"
                            f"{entry.name} ({uid}): a full GPU and its MIG partitions, or two partitions on "
                            "one memory slice, never run together"
                        )
        return errors

    def _create_mig(self, dev: DriverDevice, mig: MigInstance) -> None:
        """Create the device's MIG instance through NVML and record which it is in `mig`."""
        if self.nvml is None:
            raise SharingUnsupported(f"device {dev.name}: creating a MIG instance needs NVML")
        try:
            made = self.nvml.create_mig(mig.parent_uuid, mig.profile_id, mig.start)
        except NvmlCallError as exc:
            raise MigCreateError(
                f"creating the MIG instance of {dev.name} (profile id {mig.profile_id} at memory slice "
                f"{mig.start} of GPU {mig.parent_uuid}): {exc}"
            ) from None
        mig.gi_id, mig.ci_id, mig.uuid = made.gi_id, made.ci_id, made.uuid

    def _destroy_migs(self, uid: str, entry: ClaimEntry) -> str:
        """Destroy the claim's MIG instances: whatever sits at their placements (none: nothing to do).

        '' when none is left; otherwise what NVML said (the caller keeps the claim to try again).
        """
        errors = []
        for p in entry.devices:
            m = p.mig
            if m is None or self.nvml is None:
                continue
            try:
                # By placement, never by the recorded instance id: an id freed by a destroy whose
                # checkpoint write was lost may belong to another claim's instance by now, while the
                # placement stays this claim's as long as the checkpoint holds it (_overlaps).
                self.nvml.destroy_mig_at(m.parent_uuid, m.profile_id, m.start)
            except NvmlCallError as exc:
                errors.append(f"destroying the MIG instance of {p.device_name}: {exc}")
                if self.metrics is not None:
                    self.metrics.error("unprepare")
        if errors:
            log.error("claim %s: %s", uid, "; ".join(errors))
        return "; ".join(errors)

    def _reset_settings(self, uid: str, entry: ClaimEntry, claims: dict[str, ClaimEntry]) -> None:
        """Put a GPU's time-slice back to Default once no other prepared claim time-slices it."""
        for p in entry.devices:
            dev = self.devices.get(p.device_name)
            if p.sharing != "TimeSlicing" or dev is None or dev.type != "gpu" or self.nvml is None:
                continue
            if any(o.device_name == p.device_name and o.sharing == "TimeSlicing"
                   for u, e in claims.items() if u != uid for o in e.devices):  # fmt: skip
                continue
            try:
                self.nvml.set_time_slice(dev.uuid, INTERVAL_VALUES["Default"])
            except (SharingUnsupported, NvmlCallError) as exc:  # the claim is gone either way
                log.error("claim %s: resetting the time-slice of %s failed: %s", uid, dev.name, exc)
                if self.metrics is not None:
                    self.metrics.error("unprepare")

    def _read(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            obj = self.claims.get_claim(ref.namespace, ref.name)
        except ClaimReadError as exc:
            raise PrepareError(str(exc)) from None
        if obj is None:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} not found")
        uid = _get(obj, "metadata", "uid")
        if uid != ref.uid:
            raise PrepareError(
                f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, kubelet asked for {ref.uid} "
                "(the claim was deleted and recreated)"
            )
        if not _get(obj, "status", "allocation"):
            raise PrepareError(
                f"ResourceClaim {ref.namespace}/{ref.name} is not allocated (no status.allocation)"
            )
        return obj

    def _plan(self, ref: ClaimRef, obj: dict[str, Any]) -> list[Planned]:
        results = _get(obj, "status", "allocation", "devices", "results") or []
        mine = [r for r in results if r.get("driver") == self.driver_name and r.get("pool") == self.node_name]
        if not mine:
            raise PrepareError(
                f"allocation of {ref.namespace}/{ref.name} has no device of driver {self.driver_name} "
                f"in pool {self.node_name}"
            )
        merged: dict[tuple[str, str | None], list[str]] = {}
        consumed: dict[tuple[str, str | None], int | None] = {}
        for r in mine:
            name = str(r.get("device", ""))
            if name not in self.devices:
                have = ", ".join(sorted(self.devices)) or "none"
                raise PrepareError(
                    f"allocated device {name!r} is not published by this node (devices: {have})"
                )
            share = r.get("shareID")
            if share is not None:
                try:
                    share = check_share_id(share)
                    memory = consumed_memory(r, self.driver_name)
                except ValueError as exc:  # QuantityError included
                    raise PrepareError(f"allocated device {name}: {exc}") from None
                consumed.setdefault((name, share), memory)
            merged.setdefault((name, share), []).append(str(r.get("request", "")))
        configs = self._configs(obj)
        plan = []
        errors: list[str] = []
        for (name, share), reqs in merged.items():
            dev = self.devices[name]
            why = self.health.refused(dev) if self.health is not None else None
            if why:
                errors.append(why)
                continue
            try:
                cfg, where = self._config_for(dev, reqs, configs)
                if share is not None and cfg.sharing is not None and where.endswith("(FromClass)"):
                    # A class's sharing setting (the bundle's full-GPU classes time-slice) is for the
                    # GPUs it gives whole; on a GPU shared by capacity every allocation is a share, and
                    # a share is shared already. Only a claim's own setting is a contradiction.
                    log.info("a share ignores its class's sharing setting",
                             extra={"device": dev.name, "config": where, "strategy": cfg.sharing.strategy})
                    cfg = replace(cfg, sharing=None)
                memory = self._share_memory(dev, share, consumed.get((name, share)), cfg)
            except PrepareError as exc:
                errors.append(str(exc))
                continue
            plan.append(Planned(dev, tuple(reqs), share, cfg, memory))
        if errors:
            raise PrepareError("; ".join(errors))
        return plan

    @staticmethod
    def _share_memory(
        dev: DriverDevice, share: str | None, memory: int | None, cfg: DeviceConfig
    ) -> int | None:
        """The memory a share holds, checked against the device's policy; None when not a share."""
        if share is None:
            return None
        policy = dev.shared
        total = dev.capacity.get("memory")
        if policy is None or total is None:
            raise PrepareError(
                f"device {dev.name} was allocated as a share ({share}) but this node does not share it by "
                "capacity (--share-by-capacity does not name its product); the allocation predates a "
                "change of that setting: delete the claim so that it is allocated again"
            )
        if cfg.sharing is not None:
            raise PrepareError(
                f"device {dev.name} is shared by capacity; a share cannot also set sharing.strategy "
                f"{cfg.sharing.strategy} (a GPU is shared one way at a time): remove sharing from the "
                "claim's GpuConfig"
            )
        if memory is None:  # no consumedCapacity: charged what the scheduler charges a silent claim
            return policy.default_share(total)
        top = policy.default_share(total)
        if not policy.step <= memory <= top:
            raise PrepareError(
                f"device {dev.name}: share {share} consumes {format_quantity(memory)} of memory, outside "
                f"the published range {format_quantity(policy.step)} to {format_quantity(top)}"
            )
        return memory

    def _configs(self, obj: dict[str, Any]) -> list[tuple[str, list[str], Mapping[str, Any]]]:
        """This driver's opaque configs, lowest precedence first (class before claim, in order)."""
        out: list[tuple[str, list[str], Mapping[str, Any]]] = []
        raw = _get(obj, "status", "allocation", "devices", "config") or []
        for source in ("FromClass", "FromClaim"):
            for i, c in enumerate(raw):
                if c.get("source", "FromClaim") != source:
                    continue
                opaque = c.get("opaque") or {}
                if opaque.get("driver") != self.driver_name:
                    continue
                params = opaque.get("parameters")
                if not isinstance(params, Mapping):
                    params = {}
                where = f"status.allocation.devices.config[{i}] ({source})"
                out.append((where, list(c.get("requests") or []), params))
        return out

    def _config_for(
        self, dev: DriverDevice, reqs: list[str], configs: list[tuple[str, list[str], Mapping[str, Any]]]
    ) -> tuple[DeviceConfig, str]:
        """The config that applies to `dev` and where it came from ("" for the default)."""
        named = [c for c in configs if c[1] and any(_request_matches(c[1], r) for r in reqs)]
        if named:
            chosen = named[-1]
        else:
            fitting = [
                c for c in configs if not c[1] and dev.type in KINDS.get(str(c[2].get("kind")), frozenset())
            ]
            if not fitting:
                return default_config(dev.type), ""
            chosen = fitting[-1]
        where, _reqs, params = chosen
        at = where.split(" ", 1)[0]
        errs = validate_opaque_config(params, {dev.type})
        if errs:
            detail = "; ".join(
                f"{at}.opaque.parameters.{e.path}: {e.message}".replace(". :", ":") for e in errs
            )
            raise PrepareError(f"device {dev.name}: invalid opaque config: {detail}")
        return parse_opaque_config(params, {dev.type}), where

    def _apply(self, dev: DriverDevice, cfg: DeviceConfig) -> None:
        sharing = cfg.sharing
        if sharing is None:
            return
        if sharing.strategy == "MPS":
            raise SharingUnsupported(
                f"device {dev.name}: sharing strategy MPS is not supported by this driver "
                "(it does not run an MPS control daemon); use strategy TimeSlicing or omit sharing"
            )
        if isinstance(cfg, GpuConfig) and sharing.strategy == "TimeSlicing":
            if self.nvml is None:
                raise SharingUnsupported(
                    f"device {dev.name}: time-slicing needs NVML, which is not available"
                )
            self.nvml.set_time_slice(dev.uuid, INTERVAL_VALUES[sharing.interval or "Default"])
        # MIG devices already time-share their compute instance; there is nothing to set.

    def _rollback(self, uid: str, entry: ClaimEntry | None = None) -> bool:
        """Undo a claim's side effects: its MIG instances, then its CDI spec; False when an instance stays."""
        ok = entry is None or not self._destroy_migs(uid, entry)
        self.cdi.remove(uid)
        return ok

    def _ensure_spec(
        self, ref: ClaimRef, entry: ClaimEntry, claims: dict[str, ClaimEntry]
    ) -> list[PreparedDevice] | None:
        """The devices of a completed claim, with its CDI spec present and naming every recorded id.

        A missing or damaged spec (deleted by hand, or lost by an older driver's unprepare order)
        is written again from the checkpoint: kubelet must never get ids that resolve to nothing.
        None when a recorded device is no longer published, so the claim is prepared afresh.
        """
        recorded = {i for p in entry.devices for i in p.cdi_device_ids}
        present = self.cdi.device_ids(ref.uid)
        if present is not None and recorded and recorded <= present:
            return entry.devices
        devs = [self.devices.get(p.device_name) for p in entry.devices]
        if not entry.devices or any(d is None for d in devs):
            log.warning(
                "claim %s: CDI spec missing and its devices are not all published; preparing again", ref
            )
            return None
        try:
            ids = self.cdi.write(
                ref.uid,
                [
                    CdiDevice(_concrete(d, p.mig), tuple(p.requests), p.share_id, p.consumed_memory)
                    for d, p in zip(devs, entry.devices, strict=True)
                    if d
                ],
            )
        except (OSError, CdiError) as exc:
            raise PrepareError(f"claim {ref}: rewriting its missing CDI spec failed: {exc}") from None
        log.warning("claim %s: CDI spec was missing or incomplete; rewrote it from the checkpoint", ref)
        changed = False
        for p, cdi_id in zip(entry.devices, ids, strict=True):
            if p.cdi_device_ids != [cdi_id]:
                p.cdi_device_ids = [cdi_id]
                changed = True
        if changed:  # spec first, then the entry: a crash in between leaves the old entry and a spec
            claims[ref.uid] = entry
            self.checkpoint.save(claims)
        return entry.devices

    # --- unprepare -------------------------------------------------------------------------------
    def unprepare(self, ref: ClaimRef) -> str:
        """Drop the claim's checkpoint entry, then its CDI spec; '' on success (also when already gone).

        The entry goes first so that a crash between the two steps never leaves a claim recorded as
        prepared without its spec; the spec it may leave behind belongs to no claim in the
        checkpoint, and start-up recovery (or the kubelet's retry of this call) removes it.
        """
        start = time.perf_counter()
        error = ""
        released: list[PreparedDevice] | None = None
        try:
            with self.checkpoint.locked():
                claims = self.checkpoint.load()
                self.fault("before-unprepare")
                entry = claims.get(ref.uid)
                failed = self._destroy_migs(ref.uid, entry) if entry is not None else ""
                if failed:  # the claim stays recorded: the kubelet's retry destroys them then
                    raise OSError(failed)
                self.fault("after-mig-destroyed")
                claims.pop(ref.uid, None)
                if entry is not None:
                    released = entry.devices
                    self._reset_settings(ref.uid, entry, claims)
                    self.checkpoint.save(claims)
                self.fault("after-unprepare-checkpoint")
                self.cdi.remove(ref.uid)
                self.fault("after-cdi-removed")
        except CheckpointCorrupt as exc:
            error = f"checkpoint unreadable, restart the plugin to recover: {exc}"
        except OSError as exc:
            error = f"unprepare of claim {ref} failed: {exc}"
        if self.metrics is not None:
            self.metrics.unprepared(not error, time.perf_counter() - start)
        took = (time.perf_counter() - start) * 1000
        if error:
            log.warning("unprepare %s failed after %.1f ms: %s", ref, took, error)
        elif released is None:
            log.info("unprepared claim %s: nothing was prepared for it (%.1f ms)", ref, took)
        else:
            log.info("unprepared claim %s: devices %s in %.1f ms", ref, _names(released), took)
            if self.status is not None:  # an apply with no entries removes this driver's
                self.status.submit(
                    StatusWrite(ref.namespace, ref.name, ref.uid, self.driver_name, self.node_name, ())
                )
        return error

    # --- start-up --------------------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Roll back half-prepared claims, drop claims gone from the API, remove orphan CDI specs."""
        report = RecoveryReport()
        with self.checkpoint.locked():
            try:
                claims = self.checkpoint.load()
            except CheckpointCorrupt as exc:
                report.checkpoint_quarantined = str(self.checkpoint.quarantine())
                log.error("%s; moved aside to %s, starting with an empty checkpoint", exc,
                          report.checkpoint_quarantined)  # fmt: skip
                claims = {}
            for uid, entry in list(claims.items()):
                if entry.state != PREPARE_COMPLETED:
                    if not self._rollback(uid, entry):
                        report.kept.append(uid)  # an instance NVML would not destroy: try at the next start
                        continue
                    del claims[uid]
                    report.rolled_back.append(uid)
                    continue
                try:
                    obj = self.claims.get_claim(entry.namespace, entry.name)
                except ClaimReadError as exc:
                    log.warning("cannot check claim %s/%s (%s); keeping it", entry.namespace, entry.name, exc)
                    report.kept.append(uid)
                    continue
                if obj is None or _get(obj, "metadata", "uid") != uid:
                    if not self._rollback(uid, entry):
                        report.kept.append(uid)
                        continue
                    del claims[uid]
                    report.dropped.append(uid)
                else:
                    report.kept.append(uid)
            for uid in self.cdi.claim_uids():
                if uid not in claims:
                    self.cdi.remove(uid)
                    report.orphan_specs_removed.append(uid)
            self.checkpoint.save(claims)
        if report.rolled_back or report.dropped or report.orphan_specs_removed:
            log.info("recovery: rolled back %s, dropped %s, removed orphan CDI specs %s",
                     report.rolled_back, report.dropped, report.orphan_specs_removed)  # fmt: skip
        return report
