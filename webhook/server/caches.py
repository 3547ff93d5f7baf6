"""Cluster caches: list-then-watch of the objects admission needs, each in its own thread.

Every reflector lists (paged), then watches from the list's resourceVersion; on `410 Gone` it relists,
on errors it reconnects with exponential backoff, and it reports whether it is synced. Objects are
kept as plain dicts (the raw JSON the API server sent, minus managedFields), so any served
`resource.k8s.io` version works. The request path never calls the API: `ClusterCache` rebuilds the
inventory, quota usage and DRA statistics in a background thread, debounced, and publishes them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

from .metrics import Metrics

log = logging.getLogger("draguard.caches")

DRA_GROUP = "resource.k8s.io"
PREFERRED_DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
# DeviceTaintRule moved v1alpha3 -> v1beta2 -> v1 (GA in 1.37); it is served in none of them unless
# the cluster enables it (before 1.37 behind DRADeviceTaintRules).
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
WATCH_SECONDS = 240
# Larger than any object the API server stores (etcd refuses values over 1.5 MiB, requests are
# limited to 3 MiB), so only a broken stream reaches it; what is past it is never held.
MAX_EVENT_BYTES = 8 * 1024 * 1024
# The annotation on the bookmark that ends a watch's initial events (sendInitialEvents=true).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class WatchListRefused(Exception):
    """The API server does not stream a watch's initial state (no WatchList support): list instead."""


class KubeHttp:
    """Raw JSON access through the kubernetes client's configuration (auth, TLS, proxy)."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None) -> KubeHttp:
        from kubernetes import client, config

        if kubeconfig:
            cfg = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            try:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                cfg = client.Configuration()
                config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(cfg))

    def _open(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        timeout: float = 10.0,
        read_timeout: float | None = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        _m, url, hdrs, _b, _p = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        return self.api.rest_client.pool_manager.request(
            method,
            url,
            headers=hdrs,
            body=json.dumps(body).encode() if body is not None else None,
            preload_content=False,
            timeout=urllib3.Timeout(connect=min(timeout, 5.0), read=read_timeout or timeout),
            retries=False,
        )

    def request_json(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        timeout: float = 10.0,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        resp = self._open(method, path, query, body, timeout, content_type=content_type)
        try:
            data = resp.read()
        finally:
            resp.release_conn()
        if resp.status >= 400:
            msg = data.decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                msg = json.loads(data).get("message", msg)
            raise ApiError(resp.status, msg)
        out = json.loads(data)
        return out if isinstance(out, dict) else {}

    def get_json(
        self, path: str, query: list[tuple[str, Any]] | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        return self.request_json("GET", path, query, timeout=timeout)

    def stream(self, path: str, query: list[tuple[str, Any]], read_timeout: float) -> Any:
        resp = self._open("GET", path, query, timeout=10.0, read_timeout=read_timeout)
        if resp.status >= 400:
            data = resp.read()
            resp.release_conn()
            if resp.status == 410:
                raise Gone()
            raise ApiError(resp.status, data.decode(errors="replace")[:300])
        return resp


def discover_dra_versions(http: KubeHttp) -> tuple[str | None, frozenset[str]]:
    """(version to watch, served versions) of resource.k8s.io; (None, {}) when DRA is not served."""
    try:
        doc = http.get_json(f"/apis/{DRA_GROUP}")
    except ApiError as e:
        if e.status == 404:
            return None, frozenset()
        raise
    served = frozenset(str(v.get("version")) for v in doc.get("versions", []) if isinstance(v, dict))
    for v in PREFERRED_DRA_VERSIONS:
        if v in served:
            return v, served
    return None, served


def discover_taint_rule_version(http: KubeHttp, served: frozenset[str]) -> str | None:
    """The resource.k8s.io version serving DeviceTaintRules, newest first; None when none does (the
    caches then carry on without them, as offline review does without any in its inventory)."""
    for v in TAINT_RULE_VERSIONS:
        if v not in served:
            continue
        try:
            doc = http.get_json(f"/apis/{DRA_GROUP}/{v}")
        except ApiError as e:
            log.warning(
                "cannot read the resources of resource.k8s.io",
                extra={"version": v, "reason": str(e)[:300]},
            )
            continue
        names = {str(r.get("name")) for r in doc.get("resources") or [] if isinstance(r, dict)}
        if "devicetaintrules" in names:
            return v
    return None


def labels_only(obj: dict[str, Any]) -> dict[str, Any]:
    """A Node cut down to what the inventory reads of it (name and labels). Whole Nodes carry
    status, images and conditions, tens of kilobytes each on a large cluster, none of it used."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)},
        },
    }


@dataclass(frozen=True)
class Resource:
    name: str  # plural, used as the metric label
    kind: str
    api_version: str  # "v1" or "resource.k8s.io/v1"
    # Keep only metadata.name and metadata.labels (see labels_only).
    labels_only: bool = False

    @property
    def path(self) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{base}/{self.name}"


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def event_lines(chunks: Iterable[bytes], limit: int = MAX_EVENT_BYTES) -> Iterator[bytes | None]:
    """A watch stream's events, one JSON document per line, from chunks cut anywhere; None stands
    for one over `limit`, whose bytes are skipped, never held. Each byte is copied once, so a burst
    of thousands of events in one chunk costs its length (not its length times its lines)."""
    buf = bytearray()
    skipping = False
    for chunk in chunks:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not skipping:
                buf += piece
                if len(buf) > limit:
                    buf.clear()
                    skipping = True
            if nl < 0:
                break
            if skipping:
                yield None
                skipping = False
            elif buf.strip():
                yield bytes(buf)
            buf.clear()
            start = nl + 1
    if skipping:
        yield None
    elif buf.strip():
        yield bytes(buf)


EventFn = Callable[[Resource, str, dict[str, Any] | None, dict[str, Any] | None], None]
# (resource name, event type, object, previous object)
ListenerFn = Callable[[str, str, dict[str, Any] | None, dict[str, Any] | None], None]


class Reflector:
    """One resource kept in step with the API server: `store`, `synced`, `resource_version`."""

    def __init__(
        self, http: KubeHttp, res: Resource, on_event: EventFn, metrics: Metrics | None = None
    ) -> None:
        self.http = http
        self.res = res
        self.on_event = on_event
        self.metrics = metrics
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.synced = False
        self.resource_version = ""
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, name=f"watch-{res.name}", daemon=True)
        self.backoff_initial = 0.5
        self.backoff_max = 30.0
        # monotonic time the watch last failed, while it has not been re-established since
        self.broken_since: float | None = None
        self.list_seconds: float | None = None  # the last full list, wall time
        # Initial state as a watch stream while the API server gives it (see _watch); else pages.
        self.watch_list = True
        self.max_event_bytes = MAX_EVENT_BYTES

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # best effort: unblocks the reader
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()

    def _prepare(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("apiVersion", self.res.api_version)
        obj.setdefault("kind", self.res.kind)
        if self.res.labels_only:
            return labels_only(obj)
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)  # half the bytes, none of the meaning
        return obj

    def _list(self) -> None:
        items: dict[tuple[str, str], dict[str, Any]] = {}
        cont = ""
        t0, pages = time.monotonic(), 0
        while True:
            pages += 1
            q: list[tuple[str, Any]] = [("limit", 500)]
            if cont:
                q.append(("continue", cont))
            try:
                doc = self.http.get_json(self.res.path, q, timeout=30.0)
            except ApiError as e:
                if e.status == 410 and cont:  # continue token expired: start over
                    items, cont = {}, ""
                    continue
                raise
            for it in doc.get("items") or []:
                if isinstance(it, dict):
                    o = self._prepare(it)
                    items[_key(o)] = o
            meta = doc.get("metadata") or {}
            cont = str(meta.get("continue") or "")
            if not cont:
                self.resource_version = str(meta.get("resourceVersion") or "")
                break
        self._replace(items, time.monotonic() - t0, {"pages": pages})

    def _replace(
        self, items: dict[tuple[str, str], dict[str, Any]], took: float, how: dict[str, Any]
    ) -> None:
        """The store becomes a full list's `items` (self.resource_version is already the list's)."""
        # Where a replica's start-up time goes on a large cluster: each resource's list (the API
        # server's answer and our JSON decoding) against the first rebuild after them.
        self.list_seconds = took
        if self.metrics:
            self.metrics.cache_list_duration.labels(self.res.name).set(took)
        log.info(
            "listed",
            extra={"resource": self.res.name, "objects": len(items), **how, "seconds": round(took, 3)},
        )
        with self.lock:
            old = self.store
            self.store = items
        # Report the difference, so that consumers see deletions missed while disconnected.
        for k, o in items.items():
            prev = old.get(k)
            if prev is None or _rv(prev) != _rv(o):
                self.on_event(self.res, "ADDED" if prev is None else "MODIFIED", o, prev)
        for k, prev in old.items():
            if k not in items:
                self.on_event(self.res, "DELETED", None, prev)
        if self.metrics:
            self.metrics.cache_relists.labels(self.res.name).inc()
        self.synced = True
        self.on_event(self.res, "SYNCED", None, None)

    def _lines(self, resp: Any) -> Iterator[bytes]:
        for line in event_lines(resp.stream(amt=64 * 1024, decode_content=True), self.max_event_bytes):
            if line is None:
                # Larger than anything the API server stores: a broken stream. What it was about
                # is unknown, so the cache is listed afresh.
                log.warning("a watch event over the size limit; relisting", extra={"resource": self.res.name})
                raise Gone()
            yield line

    def _watch(self, initial: bool = False) -> None:
        """Follow the watch from self.resource_version; with `initial`, from no version, the API
        server first sending every object as an ADDED event, then a bookmark that ends them (KEP-3157,
        "watch-list", the protocol of client-go's WatchListClient). That replaces a paged list: its
        objects come from the API server's watch cache as one stream, where every page of a paged list
        costs more the larger the collection (50,000 ResourceClaims here: 2.5-4.0 s in pages of 500,
        1.0-1.1 s streamed; bench/cache_sync.py)."""
        q: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", WATCH_SECONDS),
        ]
        if initial:
            q += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        else:
            q.append(("resourceVersion", self.resource_version))
        t0 = time.monotonic()
        try:
            resp = self.http.stream(self.res.path, q, read_timeout=WATCH_SECONDS + 30)
        except ApiError as e:
            # A server without WatchList (before 1.27, or the gate off) refuses the parameters.
            if initial and e.status in (400, 422):
                raise WatchListRefused(str(e)) from e
            raise
        self._resp = resp
        self.broken_since = None  # the API server answered the watch
        pending: dict[tuple[str, str], dict[str, Any]] | None = {} if initial else None
        try:
            for line in self._lines(resp):
                if self._stop.is_set():
                    return
                ev = json.loads(line)
                typ = ev.get("type")
                obj = ev.get("object") or {}
                if typ == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                if typ == "BOOKMARK":
                    rv = _rv(obj) if isinstance(obj, dict) else ""
                    if pending is not None:
                        meta = obj.get("metadata") if isinstance(obj, dict) else None
                        notes = (meta or {}).get("annotations") if isinstance(meta, dict) else None
                        if rv and isinstance(notes, dict) and notes.get(INITIAL_EVENTS_END) == "true":
                            self.resource_version = rv
                            self._replace(pending, time.monotonic() - t0, {"streamed": True})
                            pending = None
                        continue
                    self.resource_version = rv or self.resource_version
                    continue
                if typ not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, dict):
                    continue
                o = self._prepare(obj)
                k = _key(o)
                if pending is not None:  # still the initial state: the store is replaced at its end
                    if typ == "DELETED":
                        pending.pop(k, None)
                    else:
                        pending[k] = o
                    continue
                with self.lock:
                    prev = self.store.get(k)
                    if typ == "DELETED":
                        self.store.pop(k, None)
                    else:
                        self.store[k] = o
                self.resource_version = _rv(o) or self.resource_version
                self.on_event(self.res, typ, None if typ == "DELETED" else o, prev)
            if pending is not None and not self._stop.is_set():
                # The stream ended inside its initial state (a server that sends no end bookmark
                # within the watch's time): paged lists from now on, rather than the same again.
                self.watch_list = False
                log.warning(
                    "the watch ended before its initial events did; listing in pages from now on",
                    extra={"resource": self.res.name, "objects_so_far": len(pending)},
                )
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()

    def _run(self) -> None:
        backoff = self.backoff_initial
        while not self._stop.is_set():
            try:
                if not self.resource_version and self.watch_list:
                    try:
                        self._watch(initial=True)
                    except WatchListRefused as e:
                        self.watch_list = False
                        log.info(
                            "the API server does not stream a watch's initial state; listing in pages",
                            extra={"resource": self.res.name, "reason": str(e)[:300]},
                        )
                        continue
                else:
                    if not self.resource_version:
                        self._list()
                    self._watch()
                backoff = self.backoff_initial
            except Gone:
                log.info("watch expired (410 Gone); relisting", extra={"resource": self.res.name})
                self.resource_version = ""
            except Exception as e:
                if self._stop.is_set():
                    return
                if self.broken_since is None:
                    self.broken_since = time.monotonic()
                log.warning(
                    "watch failed; reconnecting",
                    extra={
                        "resource": self.res.name,
                        "reason": f"{type(e).__name__}: {e}"[:300],
                        "retry_in_s": round(backoff, 2),
                    },
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max)

    def objects(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.store.values())


def parse_time(text: object) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def allocation_seconds(obj: Mapping[str, Any], now: dt.datetime | None = None) -> float | None:
    """Claim creation to allocation, from the claim's timestamps (now when the API has none)."""
    status = obj.get("status") or {}
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    if not alloc:
        return None
    created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return None
    at = parse_time(alloc.get("allocationTimestamp") if isinstance(alloc, Mapping) else None)
    at = at or now or dt.datetime.now(dt.UTC)
    return max((at - created).total_seconds(), 0.0)


class ClusterCache:
    """The reflectors plus change tracking; `usage.Rebuilder` turns their contents into snapshots."""

    def __init__(
        self,
        http: KubeHttp,
        metrics: Metrics,
        dra_version: str,
        served: frozenset[str],
        taint_rule_version: str | None = None,
    ) -> None:
        self.http = http
        self.metrics = metrics
        self.dra_version = dra_version
        self.served = served
        self.changed = threading.Event()
        self.generation = 0
        # Also told of every event, from the watch threads (the admission overlay drops what the
        # watch has caught up with). Must be quick and must not raise.
        self.listeners: list[ListenerFn] = []
        dra = f"{DRA_GROUP}/{dra_version}"
        self.resources = {
            "resourceslices": Resource("resourceslices", "ResourceSlice", dra),
            "deviceclasses": Resource("deviceclasses", "DeviceClass", dra),
            "resourceclaims": Resource("resourceclaims", "ResourceClaim", dra),
            "resourceclaimtemplates": Resource("resourceclaimtemplates", "ResourceClaimTemplate", dra),
            "namespaces": Resource("namespaces", "Namespace", "v1"),
            "resourcequotas": Resource("resourcequotas", "ResourceQuota", "v1"),
            # Per-device node selectors are judged against node labels.
            "nodes": Resource("nodes", "Node", "v1", labels_only=True),
        }
        self.taint_rule_version = taint_rule_version
        if taint_rule_version is not None:
            self.resources["devicetaintrules"] = Resource(
                "devicetaintrules", "DeviceTaintRule", f"{DRA_GROUP}/{taint_rule_version}"
            )
        self.reflectors = {n: Reflector(http, r, self._on_event, metrics) for n, r in self.resources.items()}

    @classmethod
    def connect(cls, http: KubeHttp, metrics: Metrics) -> ClusterCache:
        version, served = discover_dra_versions(http)
        if version is None:
            raise ApiError(
                404, "the API server serves no resource.k8s.io version draguard knows (v1, v1beta2, v1beta1)"
            )
        taint_rules = discover_taint_rule_version(http, served)
        log.info(
            "watching resource.k8s.io",
            extra={"version": version, "served": sorted(served), "device_taint_rules": taint_rules},
        )
        return cls(http, metrics, version, served, taint_rules)

    def _on_event(
        self, res: Resource, typ: str, obj: dict[str, Any] | None, prev: dict[str, Any] | None
    ) -> None:
        if (
            res.name == "resourceclaims"
            and obj is not None
            and self.reflectors["resourceclaims"].synced
            and typ in ("ADDED", "MODIFIED")
            and not ((prev or {}).get("status") or {}).get("allocation")
        ):
            secs = allocation_seconds(obj)
            if secs is not None:
                self.metrics.allocation.observe(secs)
        for listener in self.listeners:
            try:
                listener(res.name, typ, obj, prev)
            except Exception:  # a listener's bug must not stop the watch
                log.exception("cache event listener failed", extra={"resource": res.name})
        if typ != "SYNCED" and prev is not None and obj is not None and _rv(prev) == _rv(obj):
            return
        if (
            res.labels_only
            and typ == "MODIFIED"
            and prev is not None
            and obj is not None
            and (prev.get("metadata") or {}).get("labels") == (obj.get("metadata") or {}).get("labels")
        ):
            return  # a Node's status heartbeat: nothing the inventory reads changed
        self.generation += 1
        self.changed.set()

    def start(self) -> None:
        for r in self.reflectors.values():
            r.start()

    def stop(self) -> None:
        for r in self.reflectors.values():
            r.stop()

    @property
    def synced(self) -> bool:
        return all(r.synced for r in self.reflectors.values())

    def broken_for(self, seconds: float) -> list[str]:
        """Resources whose watch has been failing for longer than `seconds`."""
        now = time.monotonic()
        return [
            n
            for n, r in self.reflectors.items()
            if r.broken_since is not None and now - r.broken_since > seconds
        ]

    def states(self) -> dict[str, tuple[bool, int]]:
        return {n: (r.synced, len(r.store)) for n, r in self.reflectors.items()}

    def objects(self, name: str) -> list[dict[str, Any]]:
        return self.reflectors[name].objects()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.synced:
                return True
            time.sleep(0.05)
        return self.synced


class KubeTemplateCreator:
    """Creates the ResourceClaimTemplates migrations need (the one API write on the mutate path)."""

    def __init__(self, http: KubeHttp) -> None:
        self.http = http

    def ensure(self, tmpl: Mapping[str, Any], timeout: float) -> str:
        """'created' or 'exists' (ours); raises ApiError (409 when a foreign object has the name)."""
        meta = tmpl.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        base = f"/apis/{tmpl.get('apiVersion')}/namespaces/{ns}/resourceclaimtemplates"
        try:
            self.http.request_json("POST", base, body=dict(tmpl), timeout=timeout)
            return "created"
        except ApiError as e:
            if e.status != 409:
                raise
        existing = self.http.get_json(f"{base}/{name}", timeout=timeout)
        labels = (existing.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") == "draguard":
            return "exists"
        raise ApiError(409, f"ResourceClaimTemplate {ns}/{name} exists and is not managed by draguard")
