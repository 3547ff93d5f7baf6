"""Watches that tell the audit which namespaces changed, so their reports follow within seconds.

A watch keeps no objects: each event is decoded on its own (at most `caches.MAX_EVENT_BYTES`, nesting as
deep as the admission path's decoder allows), reduced to its namespace and a fingerprint of what the
rules read, and dropped. Only the fingerprints of recently seen objects are kept (at most
`FINGERPRINTS`), so that status-only updates, the bulk of a busy cluster's events, are ignored. A
namespace that changed is re-judged after `debounce` seconds of quiet (at most `max_delay` after its
first event), so a burst of events writes its report once. An event nested deeper than that is
read with its deep part cut off, as the scan's list pages are. A watch that expires (410 Gone), or
an event that still cannot be read, asks for a full scan: the periodic scan's relist, which covers
whatever the watch may have missed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..dra.workloads import CrdTable, using_crd_table
from ..server import codec
from ..server.caches import ApiError, Gone, KubeHttp, discover_dra_versions, event_lines
from .evaluate import controller_of, uses_devices
from .owners import OwnerIndex
from .source import Collection, shallow, trim

log = logging.getLogger("draguard.audit")

FINGERPRINTS = 65536
WATCH_SECONDS = 240
# Past this many namespaces waiting, one full scan is cheaper than a rescan per namespace.
MAX_PENDING = 2000


class Changes:
    """Namespaces waiting to be re-judged, and whether a full scan was asked for. Thread-safe: the
    watch threads add, the controller takes."""

    def __init__(
        self,
        debounce: float = 1.0,
        max_delay: float = 10.0,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.debounce = debounce
        self.max_delay = max_delay
        self.max_pending = max_pending
        self.clock = clock
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.full_since: float | None = None  # when a full scan was first asked for, not yet run

    def touch(self, namespace: str) -> None:
        now = self.clock()
        with self.lock:
            self._first.setdefault(namespace, now)
            self._last[namespace] = now
            if len(self._first) > self.max_pending:
                self._first.clear()
                self._last.clear()
                self._full_locked(now)
        self.wake.set()

    def request_full(self, at: float | None = None) -> None:
        with self.lock:
            self._full_locked(self.clock() if at is None else at)
        self.wake.set()

    def _full_locked(self, at: float) -> None:
        if self.full_since is None or at < self.full_since:
            self.full_since = at

    def full_started(self, at: float) -> None:
        """A full scan began at `at`: requests made before it are answered; namespaces touched
        since are kept (the scan may have listed them before their change)."""
        with self.lock:
            if self.full_since is not None and self.full_since <= at:
                self.full_since = None
            for ns in [n for n, t in self._last.items() if t <= at]:
                del self._first[ns], self._last[ns]

    def due(self) -> tuple[list[str], float | None]:
        """Namespaces whose quiet period is over (taken out), and seconds until the next is due."""
        now = self.clock()
        out: list[str] = []
        wait: float | None = None
        with self.lock:
            for ns in list(self._first):
                ready_at = min(self._last[ns] + self.debounce, self._first[ns] + self.max_delay)
                if ready_at <= now:
                    out.append(ns)
                    del self._first[ns], self._last[ns]
                else:
                    wait = ready_at - now if wait is None else min(wait, ready_at - now)
            self.wake.clear()  # what is left is in `wait`
        return sorted(out), wait

    def pending(self) -> int:
        with self.lock:
            return len(self._first)


def fingerprint(obj: dict[str, Any]) -> bytes:
    """A digest of what the rules read (status and bookkeeping excluded)."""
    t = trim(obj)
    meta = t.get("metadata")
    if isinstance(meta, dict):
        meta.pop("uid", None)
    return hashlib.blake2b(codec.dumps(t), digest_size=16).digest()


class Fingerprints:
    """uid -> fingerprint of the objects seen last, at most `size` (the oldest go first)."""

    def __init__(self, size: int = FINGERPRINTS) -> None:
        self.size = size
        self._d: OrderedDict[str, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def changed(self, uid: str, fp: bytes | None) -> bool:
        """Record `fp` (None: deleted); True unless it is the fingerprint already known."""
        with self.lock:
            old = self._d.pop(uid, None)
            if fp is not None:
                self._d[uid] = fp
                if len(self._d) > self.size:
                    self._d.popitem(last=False)
            return old is None or old != fp

    def __len__(self) -> int:
        with self.lock:
            return len(self._d)


@dataclass(frozen=True)
class Watched:
    path: str  # the collection, e.g. /apis/apps/v1/deployments
    api_version: str
    kind: str
    # "namespace": changes re-judge the object's namespace (workloads, claims, templates);
    # "labels": a Namespace whose labels changed is re-judged; "full": any change needs a full scan.
    effect: str = "namespace"

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class Scope:
    """What relevance is judged by, shared by the watches, replaced by the controller when the
    policies or the collections change: the workload CRD table in force and the CRD kinds listed."""

    table: CrdTable | None = None
    crds: frozenset[tuple[str, str]] = frozenset()
    # What the controllers the last scans listed would make; None: nothing is vouched for yet.
    owners: OwnerIndex | None = None


class EventError(Exception):
    """An event that cannot be read (too large, too deep, not JSON)."""


def decode_event(line: bytes) -> dict[str, Any]:
    try:
        ev = codec.loads(line)
    except RecursionError as e:
        raise EventError("event nests too deeply") from e
    except (UnicodeDecodeError, ValueError) as e:
        if isinstance(e, ValueError) and codec.is_too_deep(e):
            raise EventError("event nests too deeply") from e
        raise EventError(f"event is not JSON: {str(e)[:200]}") from e
    if not isinstance(ev, dict):
        raise EventError("event is not a JSON object")
    return ev


class ResourceWatch:
    """One collection watched from a resourceVersion, with bookmarks; a 410 relists (a fresh
    resourceVersion, and a full scan asked for)."""

    def __init__(
        self,
        http: KubeHttp,
        res: Watched,
        changes: Changes,
        fingerprints: Fingerprints,
        on_event: Callable[[str, str], None] = lambda _res, _what: None,
        timeout: int = WATCH_SECONDS,
        scope: Scope | None = None,
        late: bool = False,
    ) -> None:
        self.http = http
        self.res = res
        self.changes = changes
        self.fps = fingerprints
        self.on_event = on_event  # (resource, what): metrics
        self.timeout = timeout
        self.scope = scope or Scope()
        # Started after the first full scan (a CRD installed since): its first resourceVersion
        # postdates that scan, so it asks for another.
        self.late = late
        self.resource_version = ""
        self.ready = threading.Event()  # a resourceVersion was obtained (or the first attempt failed)
        self.absent = False  # the API server does not serve this resource
        # The audit may not watch it (403: its RBAC lacks the kind): stopped, not retried every 30 s;
        # the controller starts it again after the next full scan (RBAC may have been granted).
        self.refused = False
        self._stop = threading.Event()
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, name=f"audit-watch-{res.name}", daemon=True)
        self.backoff_initial = 0.5
        self.backoff_max = 30.0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()

    def _relist(self) -> None:
        """The collection's current resourceVersion, from a one-item list: the scan reads the objects."""
        doc = self.http.get_json(self.res.path, [("limit", 1)], timeout=30.0)
        self.resource_version = str((doc.get("metadata") or {}).get("resourceVersion") or "")
        if not self.resource_version:
            raise ApiError(500, f"list of {self.res.path} has no resourceVersion")

    def _run(self) -> None:
        backoff = self.backoff_initial
        # The first resourceVersion comes before the first full scan; any later one needs a scan.
        first = not self.resource_version and not self.late
        if self.resource_version:
            self.ready.set()
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    at = self.changes.clock()
                    self._relist()
                    if not first:
                        self.changes.request_full(at)
                    first = False
                    self.ready.set()
                self._watch()
                backoff = self.backoff_initial
            except Gone:
                log.info("watch expired (410 Gone); relisting", extra={"resource": self.res.name})
                self.on_event(self.res.name, "expired")
                self.resource_version = ""
            except Exception as e:
                if self._stop.is_set():
                    return
                if isinstance(e, ApiError) and e.status == 404 and first:
                    self.absent = True  # not served here (a CRD not installed): nothing to watch
                    self.ready.set()
                    log.info("not served; not watched", extra={"resource": self.res.path})
                    return
                if isinstance(e, ApiError) and e.status == 403:
                    self.refused = True
                    self.ready.set()
                    self.on_event(self.res.name, "refused")
                    log.warning(
                        "not allowed to watch; tried again after the next full scan",
                        extra={"resource": self.res.path, "reason": str(e)[:300]},
                    )
                    return
                first = False
                self.ready.set()
                self.on_event(self.res.name, "error")
                log.warning(
                    "audit watch failed; reconnecting",
                    extra={"resource": self.res.name, "reason": f"{type(e).__name__}: {e}"[:300]},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max)

    def _watch(self) -> None:
        q: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", self.timeout),
        ]
        resp = self.http.stream(self.res.path, q, read_timeout=self.timeout + 30)
        self._resp = resp
        try:
            for line in event_lines(resp.stream(amt=64 * 1024, decode_content=True)):
                if self._stop.is_set():
                    return
                self.handle(line)
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()

    def handle(self, line: bytes | None) -> None:
        """One event line (None: one too large to read)."""
        if line is None:
            self._unreadable("event larger than the audit reads")
            return
        try:
            ev = decode_event(line)
        except EventError as e:
            try:  # nested too deep (a CRD keeps unknown fields): cut as the scan's lists are
                ev = decode_event(shallow(line))
            except EventError:
                self._unreadable(str(e))
                return
        typ = ev.get("type")
        obj = ev.get("object")
        if not isinstance(obj, dict):
            return
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        if typ == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiError(int(obj.get("code") or 500), str(obj.get("message"))[:300])
        rv = meta.get("resourceVersion")
        if typ == "BOOKMARK":
            if isinstance(rv, str) and rv:
                self.resource_version = rv
            return
        if typ not in ("ADDED", "MODIFIED", "DELETED"):
            return
        if isinstance(rv, str) and rv:
            self.resource_version = rv
        obj.setdefault("apiVersion", self.res.api_version)
        obj.setdefault("kind", self.res.kind)
        self.on_event(self.res.name, "event")
        scope = self.scope
        with using_crd_table(scope.table):
            relevant = self.relevant(str(typ), obj, scope.crds, scope.owners)
        if relevant:
            self.on_event(self.res.name, "change")
            if self.res.effect == "full":
                self.changes.request_full()
            else:
                ns = meta.get("name") if self.res.effect == "labels" else meta.get("namespace")
                if isinstance(ns, str) and ns:
                    self.changes.touch(ns)

    def relevant(
        self,
        typ: str,
        obj: dict[str, Any],
        crds: frozenset[tuple[str, str]] = frozenset(),
        owners: OwnerIndex | None = None,
    ) -> bool:
        """Whether the change can alter a report: pods a judged controller made (as `owners`
        vouches: naming an owner is not enough) are judged through it; an object seen before with
        the same fingerprint changed only its status."""
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if self.res.effect == "labels":
            labels = (obj.get("metadata") or {}).get("labels")
            fp = hashlib.blake2b(codec.dumps(labels or {}), digest_size=16).digest()
            return self.fps.changed(uid, None if typ == "DELETED" else fp) and typ != "DELETED"
        if self.res.effect == "namespace" and owners is not None:
            ref = controller_of(obj, crds)
            if ref is not None and owners.made_by_owner(obj, ref):
                return False
        if typ == "DELETED":
            self.fps.changed(uid, None)
            return uses_devices(obj) or self.res.effect == "full"
        # New to this process, or changed: it may have used devices before even if it does not now.
        return self.fps.changed(uid, fingerprint(obj))

    def _unreadable(self, why: str) -> None:
        self.on_event(self.res.name, "unreadable")
        log.warning("audit watch event not read; full scan", extra={"resource": self.res.name, "reason": why})
        self.changes.request_full()


def wait_ready(watches: list[ResourceWatch], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for w in watches:
        w.ready.wait(max(0.0, deadline - time.monotonic()))


def watched_resources(http: KubeHttp, collections: Iterable[Collection]) -> list[Watched]:
    """What the audit watches: the workloads it lists, namespaces (their labels), and the DRA
    objects it judges or consults. A DeviceClass or ResourceSlice change needs a full scan: what a
    class selects, or which devices exist, can change any namespace's verdicts (whether a request
    can be satisfied, which attributes are published). A driver that republishes unchanged devices
    keeps its pool generation and sends no event, and the full scans a watch asks for are spaced
    (AuditOptions.full_scan_gap), so a node that comes and goes costs one full scan, not one per event."""
    out = [Watched(c.path(), c.group_version, c.kind) for c in collections]
    out.append(Watched("/api/v1/namespaces", "v1", "Namespace", "labels"))
    version, _served = discover_dra_versions(http)
    if version is not None:
        av = f"resource.k8s.io/{version}"
        out.append(Watched(f"/apis/{av}/resourceclaims", av, "ResourceClaim"))
        out.append(Watched(f"/apis/{av}/resourceclaimtemplates", av, "ResourceClaimTemplate"))
        out.append(Watched(f"/apis/{av}/deviceclasses", av, "DeviceClass", "full"))
        out.append(Watched(f"/apis/{av}/resourceslices", av, "ResourceSlice", "full"))
    return out
