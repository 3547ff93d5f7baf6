"""GPU health → device taints on the ResourceSlices, and the DaemonSet's probe endpoints.

A GPU becomes unhealthy on an XID critical error event from NVML (application-level XIDs, which
NVIDIA's device plugin also ignores, do not count) or when NVML can no longer read it (lost). A lost
GPU is seen at once: NVML's event wait answers GPU_IS_LOST without naming the GPU, so the watcher
asks each GPU one cheap question and taints only those that answer lost (NVIDIA's drivers taint
every GPU of the node then); the next inventory read finds it too. Its
devices stay published with a taint (KEP-5055) rather than vanishing: the scheduler places no new
claim on them (`NoSchedule`), and for a lost GPU the device-taint eviction controller also moves
running pods away (`NoExecute`). Prepare refuses a lost GPU's devices. A taint is cleared only by
a restart of the plugin once the GPU reads fine again (NVIDIA's advice after an XID is a reset).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .devices import DriverDevice
from .nvml import ERR_GPU_IS_LOST, FailedGpu, GpuInfo, Nvml, NvmlCallError
from .schema import DRIVER_NAME

log = logging.getLogger("draguard.driver.health")

TAINT_KEY = f"{DRIVER_NAME}/unhealthy"
# XIDs caused by applications (illegal address, page faults, reset channel...), not by the GPU.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# XIDs after which the GPU is gone for every workload on it: evict, do not just stop scheduling.
FATAL_XIDS = frozenset({48, 79, 94, 95, 119, 120})


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str  # NoSchedule | NoExecute
    time_added: str  # RFC 3339, seconds

    def to_api(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect, "timeAdded": self.time_added}


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


class HealthTracker:
    """Which GPUs (by UUID) are unhealthy, and why; thread-safe."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._bad: dict[str, DeviceTaint] = {}
        self._lock = threading.Lock()
        self.on_change = on_change

    def mark(self, gpu_uuid: str, value: str, effect: str) -> bool:
        """Record a problem; True when it changes what is published (new, or NoSchedule → NoExecute)."""
        with self._lock:
            old = self._bad.get(gpu_uuid)
            if old is not None and (old.effect == "NoExecute" or old.effect == effect):
                return False
            self._bad[gpu_uuid] = DeviceTaint(TAINT_KEY, value, effect, old.time_added if old else _now())
        log.error("GPU %s is unhealthy (%s): its devices are tainted %s", gpu_uuid, value, effect)
        if self.on_change is not None:
            self.on_change()
        return True

    def xid(self, gpu_uuid: str, xid: int) -> bool:
        if xid in APPLICATION_XIDS:
            log.info("GPU %s: XID %d (an application error, the GPU stays healthy)", gpu_uuid, xid)
            return False
        return self.mark(gpu_uuid, f"xid-{xid}", "NoExecute" if xid in FATAL_XIDS else "NoSchedule")

    def lost(self, gpu_uuid: str) -> bool:
        return self.mark(gpu_uuid, "gpu-lost", "NoExecute")

    def taint_of(self, dev: DriverDevice) -> DeviceTaint | None:
        with self._lock:
            return self._bad.get(dev.parent_uuid or dev.uuid)

    def apply(self, devices: Iterable[DriverDevice]) -> list[DriverDevice]:
        """The devices with their taints set."""
        out = []
        for d in devices:
            t = self.taint_of(d)
            out.append(replace(d, taints=(t.to_api(),) if t is not None else ()))
        return out

    def reason(self, dev: DriverDevice) -> str | None:
        """Why the device is unhealthy (the taint's value), None when it is healthy."""
        t = self.taint_of(dev)
        return None if t is None else f"{t.value} ({t.effect})"

    def refused(self, dev: DriverDevice) -> str | None:
        """Why prepare must refuse the device (its GPU is lost), or None."""
        t = self.taint_of(dev)
        if t is not None and t.effect == "NoExecute":
            return f"device {dev.name} is unhealthy ({t.value}); the claim must be allocated elsewhere"
        return None

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return {u: t.value for u, t in self._bad.items()}


def carry_lost(
    previous: Sequence[DriverDevice], prev_gpus: Sequence[GpuInfo], failed: Sequence[FailedGpu],
    fresh: Sequence[DriverDevice], tracker: HealthTracker,
) -> list[DriverDevice]:  # fmt: skip
    """Fresh devices plus the previous devices of GPUs NVML can no longer read, marked lost.

    A lost GPU often cannot even tell its UUID any more, so it is found by its NVML index.
    """
    by_index = {g.index: g for g in prev_gpus}
    lost_uuids = set()
    for f in failed:
        uuid = f.uuid or (by_index[f.index].uuid if f.index in by_index else None)
        if uuid is not None:
            lost_uuids.add(uuid)
            tracker.lost(uuid)
    names = {d.name for d in fresh}
    kept = [d for d in previous if (d.parent_uuid or d.uuid) in lost_uuids and d.name not in names]
    return sorted([*fresh, *kept], key=lambda d: (d.minor, d.name))


class XidWatcher:
    """A thread waiting on NVML's XID critical error events for the node's GPUs."""

    def __init__(self, nvml: Nvml, tracker: HealthTracker, uuids: Sequence[str], poll_ms: int = 1000) -> None:
        self.nvml = nvml
        self.tracker = tracker
        self.uuids = list(uuids)
        self.poll_ms = poll_ms
        self._stop = threading.Event()
        self.beat = time.monotonic()
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def alive(self) -> bool:
        return self._thread.is_alive() or not self.uuids

    def _run(self) -> None:
        try:
            watch = self.nvml.watch_xids(self.uuids)
        except NvmlCallError as exc:
            self.error = str(exc)
            log.error("cannot watch XID events (%s); GPU health comes from inventory reads only", exc)
            return
        try:
            while not self._stop.is_set():
                self.beat = time.monotonic()
                try:
                    event = self.nvml.wait_xid(watch, self.poll_ms)
                except NvmlCallError as exc:
                    if exc.code == ERR_GPU_IS_LOST and self._take_lost():
                        watch = self._rewatch(watch)
                        if watch is None:
                            return
                        continue
                    self.error = str(exc)
                    log.error("waiting for XID events failed: %s", exc)
                    self._stop.wait(self.poll_ms / 1000)
                    continue
                if event is not None:
                    self.tracker.xid(*event)
        finally:
            if watch is not None:
                self.nvml.close_watch(watch)

    def _take_lost(self) -> bool:
        """Mark the GPUs NVML now answers GPU_IS_LOST for; False when none can be told apart."""
        lost = self.nvml.lost_gpus(self.uuids)
        self.uuids = [u for u in self.uuids if u not in lost]
        for uuid in lost:
            self.tracker.lost(uuid)
        return bool(lost)

    def _rewatch(self, watch: Any) -> Any:
        """A fresh event set without the lost GPUs (one left in would answer every wait GPU_IS_LOST);
        None when NVML refuses one: the thread ends and the liveness probe says so."""
        self.nvml.close_watch(watch)
        try:
            return self.nvml.watch_xids(self.uuids)
        except NvmlCallError as exc:
            self.error = str(exc)
            log.error("cannot watch XID events again after a lost GPU: %s", exc)
            return None


@dataclass
class Probes:
    """What the probe endpoints report; fields are set by the running driver."""

    started: bool = False  # sockets served and the first publish done
    registered: Callable[[], bool] = lambda: False  # kubelet accepted the plugin
    nvml_ok: bool = True  # the last inventory read worked (a node without GPUs counts as ok)
    heartbeat: float = time.monotonic()  # the publish loop's last turn
    stale_after: float = 660.0
    watcher: XidWatcher | None = None

    def check(self, what: str) -> tuple[bool, dict[str, Any]]:
        age = time.monotonic() - self.heartbeat
        detail: dict[str, Any] = {
            "started": self.started, "registered": self.registered(), "nvml": self.nvml_ok,
            "publishLoopAgeSeconds": round(age, 1),
            "xidWatcher": None if self.watcher is None else self.watcher.alive(),
        }  # fmt: skip
        if what == "startupz":
            return self.started, detail
        if what == "readyz":
            return self.started and detail["registered"] and self.nvml_ok, detail
        live = age < self.stale_after and (self.watcher is None or self.watcher.alive())
        return live, detail


def serve_probes(probes: Probes, port: int, addr: str = "") -> ThreadingHTTPServer:
    """/livez, /readyz and /startupz on `port` (all interfaces): 200 or 503 with a JSON body."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            what = self.path.strip("/").split("?")[0]
            if what not in ("livez", "readyz", "startupz"):
                self.send_error(404)
                return
            ok, detail = probes.check(what)
            body = json.dumps({"ok": ok, **detail}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not logged
            return

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server
