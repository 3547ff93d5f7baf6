"""Claim device status (KEP-4817, GA in Kubernetes 1.37): what `kubectl describe resourceclaim` shows of
the devices this driver prepared: a `Ready` condition and data a user can read (GPU UUID, product, the
CDI device ids), in `status.devices`.

Each write reads the claim and sends a JSON patch that removes only this driver's entries for this
node's pool and adds the new ones, with the claim's resourceVersion as a precondition (a conflict is
re-read and retried). The API server checks a permission per driver whose entries change, comparing
each entry's `data` byte for byte: a patch that rewrote the whole list (a merge patch, server-side
apply) would re-encode other drivers' entries, which the API server then counts as changes this driver
may not make; a JSON patch leaves them as stored. The API server
allows the write only for claims allocated on the writer's own node (`associated-node:patch` on
`resourceclaims/driver`, named by the driver; the bundle's ClusterRole grants just that).

The writes run on one background thread: prepare and unprepare answer the kubelet without waiting on the
API server, and a status that cannot be written (API down, claim gone, permission missing) is logged and
never fails a prepare. The queue is bounded; past it the oldest pending write is dropped (a newer write
for the same claim supersedes it anyway).
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .checkpoint import PreparedDevice
from .kube import KubeHTTPError
from .kube import request as kube_request
from .slices import format_quantity

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
JSON_PATCH = "application/json-patch+json"
ATTEMPTS = 4
MAX_PENDING = 1024
MAX_CONDITION_MESSAGE = 1024  # the API allows 32 KiB; a status line needs far less


@dataclass(frozen=True)
class StatusWrite:
    namespace: str
    name: str
    uid: str
    driver: str
    pool: str
    entries: tuple[dict[str, Any], ...]  # empty: remove this driver's entries for this pool


def device_entries(
    driver: str,
    node: str,
    devices: Sequence[PreparedDevice],
    facts: Mapping[str, Mapping[str, str]],
    now: dt.datetime | None = None,
) -> tuple[dict[str, Any], ...]:
    """One `status.devices` entry per prepared device; `facts` maps device name to readable data."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for d in devices:
        entry: dict[str, Any] = {
            "driver": driver,
            "pool": d.pool_name,
            "device": d.device_name,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": f"prepared on node {node}"[:MAX_CONDITION_MESSAGE],
                    "lastTransitionTime": stamp,
                }
            ],
            "data": {**facts.get(d.device_name, {}), "cdiDeviceIDs": list(d.cdi_device_ids)},
        }
        if d.share_id:
            entry["shareID"] = d.share_id
        if d.consumed_memory is not None:  # a share by capacity: the memory it holds, as the user asked
            entry["data"]["memory"] = format_quantity(d.consumed_memory)
        out.append(entry)
    return tuple(out)


class ClaimStatusWriter:
    """Applies claim device status in the background (see the module doc)."""

    def __init__(self, api: Any, version: str = "v1") -> None:
        self.api = api
        self.version = version
        self._queue: queue.Queue[StatusWrite | None] = queue.Queue(maxsize=MAX_PENDING)
        self._thread: threading.Thread | None = None
        self.written = 0
        self.failed = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._put(None)
            self._thread.join(timeout)
            self._thread = None

    def submit(self, write: StatusWrite) -> None:
        self._put(write)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted write is done (tests; shutdown). False on timeout."""
        done = threading.Event()

        def waiter() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        return done.wait(timeout)

    def _put(self, item: StatusWrite | None) -> None:
        while True:
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                try:
                    dropped = self._queue.get_nowait()
                    self._queue.task_done()
                    if dropped is not None:
                        log.warning("claim status for %s/%s dropped: %d writes pending", dropped.namespace,
                                    dropped.name, MAX_PENDING)  # fmt: skip
                except queue.Empty:
                    pass

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self.write(item)
            finally:
                self._queue.task_done()

    def write(self, item: StatusWrite) -> bool:
        """Write one claim's entries now; True when the API server took it (or the claim is gone)."""
        try:
            done = self._write(item)
        except Exception as exc:  # refusals, connection errors: the status is best effort, prepare is not
            self.failed += 1
            log.warning("claim status of %s/%s not written: %s", item.namespace, item.name, exc)
            return False
        if done:
            self.written += 1
        return True

    def _write(self, item: StatusWrite) -> bool:
        path = f"/apis/{GROUP}/{self.version}/namespaces/{item.namespace}/resourceclaims/{item.name}"
        for _ in range(ATTEMPTS):
            try:
                claim = kube_request(self.api, "GET", path, timeout=10)
            except KubeHTTPError as exc:
                if exc.status == 404:
                    return False  # deleted: nothing to show, nothing of ours left
                raise
            if not isinstance(claim, dict):
                return False
            meta = claim.get("metadata") or {}
            if meta.get("uid") != item.uid:
                return False  # another claim of the same name now
            status = claim.get("status")
            if not isinstance(status, dict):
                return False  # not allocated (any more): nothing to show
            current = status.get("devices") if isinstance(status.get("devices"), list) else None
            ops = patch_ops(current, item, meta.get("resourceVersion"))
            if ops is None:
                return False
            try:
                kube_request(self.api, "PATCH", f"{path}/status", ops, timeout=10, content_type=JSON_PATCH)
                return True
            except KubeHTTPError as exc:
                if exc.status == 409:
                    continue  # changed since read: read again
                if exc.status == 404:
                    return False
                raise
        raise RuntimeError(f"the claim kept changing under {ATTEMPTS} attempts")


def patch_ops(
    current: list[Any] | None, item: StatusWrite, resource_version: Any
) -> list[dict[str, Any]] | None:
    """The JSON patch from `current` (the claim's status.devices) to this write; None: nothing to do."""
    current = current or []
    mine = [i for i, e in enumerate(current) if _ours(e, item)]
    if [current[i] for i in mine] == list(item.entries):
        return None
    # A resourceVersion in the patched object is a precondition: stale, and the API server answers 409.
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version}
    ]
    if not current:
        ops.append({"op": "add", "path": "/status/devices", "value": list(item.entries)})
        return ops
    ops += [{"op": "remove", "path": f"/status/devices/{i}"} for i in reversed(mine)]
    ops += [{"op": "add", "path": "/status/devices/-", "value": e} for e in item.entries]
    return ops


def _ours(entry: Any, item: StatusWrite) -> bool:
    return isinstance(entry, dict) and entry.get("driver") == item.driver and entry.get("pool") == item.pool
