"""Objects the webhook has just admitted, visible to the request path before the watch reports them.

`kubectl apply` of a ResourceClaimTemplate followed by a Deployment that uses it sends the two
requests milliseconds apart; the watch learns about the template a moment later. Without help the
Deployment would be judged without its template. The validating endpoint therefore records what it
admits (ResourceClaimTemplates, ResourceClaims, DeviceClasses, and Namespaces should a webhook rule
send them) in this overlay; admission reads the watch caches with the overlay laid over them.

An entry lives until the watch delivers the object itself (the watch's version then wins) or until
its time-to-live runs out: an admitted object may still be rejected by a later admission plugin or
webhook, and then no watch event ever comes. The overlay is bounded; the oldest entries go first.
Nothing here calls the API server.

Confirmation and the views: the watch stores an object before it reports the event, but the view
admission reads is rebuilt from the stores a little later. A confirmed entry is therefore kept,
stamped with a confirmation number, and still laid over every view built from stores read before
that number (`snapshot(after=...)`); views built later contain the object itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Kind -> (API group, cache resource name). Only these kinds change what admission of *other*
# objects depends on (claim resolution, classes, namespace labels, quota usage).
OVERLAY_KINDS: Mapping[str, tuple[str, str]] = {
    "ResourceClaimTemplate": ("resource.k8s.io", "resourceclaimtemplates"),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims"),
    "DeviceClass": ("resource.k8s.io", "deviceclasses"),
    "Namespace": ("", "namespaces"),
}
DEFAULT_TTL = 30.0
DEFAULT_MAX_ENTRIES = 1024

Key = tuple[str, str]  # (namespace or "", name)


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = _meta(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _newer(rv: str, than: str) -> bool:
    """Whether resourceVersion `rv` is later than `than`. Kubernetes calls resourceVersions opaque;
    every API server backed by etcd uses its integer revision, so integers are compared as such and
    anything else counts as newer when it differs."""
    if rv.isdigit() and than.isdigit():
        return int(rv) > int(than)
    return rv != than


@dataclass(frozen=True, slots=True)
class Entry:
    resource: str
    key: Key
    obj: Mapping[str, Any]
    operation: str  # CREATE | UPDATE
    uid: str  # metadata.uid as admitted ("" when the request did not carry one)
    base_rv: str  # resourceVersion the admitted object carried ("" on CREATE)
    expires: float
    # What readers derived from `obj` (parsed spec, quota charge), so that each admission does not
    # parse every pending entry again. Filled by whichever thread gets there first.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


class AdmittedOverlay:
    """Short-lived records of admitted objects, superseded by the watch and expiring after `ttl`.

    Written by the request path (`record`) and the watch threads (`observe`); read by whoever
    assembles the view admission uses (`live`). `version` changes whenever the live set may have.
    """

    def __init__(
        self,
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self.version = 0  # changes when an entry is recorded or expires
        self.stamp = 0  # confirmations so far (see the module docstring)
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, Key], Entry] = {}
        # Confirmed by the watch: (entry, confirmation stamp), oldest first.
        self._confirmed: dict[tuple[str, Key], tuple[Entry, int]] = {}
        # Counters for tests and logs: how entries ended.
        self.superseded = 0
        self.expired = 0
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def record(self, obj: Mapping[str, Any], operation: str) -> bool:
        """Remember an admitted CREATE/UPDATE of an overlay kind; False when it is not one."""
        kind = obj.get("kind")
        if not isinstance(kind, str) or kind not in OVERLAY_KINDS or operation not in ("CREATE", "UPDATE"):
            return False
        key = object_key(obj)
        if not key[1] or "<" in key[1]:
            return False  # no real name yet (generateName placeholders): nothing can refer to it
        meta = _meta(obj)
        resource = OVERLAY_KINDS[kind][1]
        entry = Entry(
            resource=resource,
            key=key,
            obj=obj,
            operation=operation,
            uid=str(meta.get("uid") or ""),
            base_rv=str(meta.get("resourceVersion") or "") if operation == "UPDATE" else "",
            expires=self.clock() + self.ttl,
        )
        with self._lock:
            self._entries.pop((resource, key), None)  # re-insert: newest last
            self._confirmed.pop((resource, key), None)
            self._entries[(resource, key)] = entry
            while len(self._entries) > self.max_entries:
                self._entries.pop(next(iter(self._entries)))
                self.evicted += 1
            self.version += 1
        return True

    def observe(
        self, resource: str, typ: str, obj: Mapping[str, Any] | None, prev: Mapping[str, Any] | None
    ) -> None:
        """A watch event: drop the entry it reports on (the cache now has that version or a later one)."""
        seen = obj if obj is not None else prev
        if seen is None or typ not in ("ADDED", "MODIFIED", "DELETED"):
            return
        slot = (resource, object_key(seen))
        with self._lock:
            entry = self._entries.get(slot)
            if entry is None:
                return
            uid = str(_meta(seen).get("uid") or "")
            if entry.uid and uid and uid != entry.uid:
                return  # an earlier object of the same name (e.g. its late DELETED event)
            if entry.base_rv and not _newer(str(_meta(seen).get("resourceVersion") or ""), entry.base_rv):
                return  # the version the admitted update started from, or older: not it yet
            del self._entries[slot]
            self.superseded += 1
            self.stamp += 1
            self._confirmed[slot] = (entry, self.stamp)
            while len(self._confirmed) > self.max_entries:
                self._confirmed.pop(next(iter(self._confirmed)))  # the oldest: in any recent view

    def snapshot(self, after: int | None = None) -> tuple[int, dict[str, dict[Key, Entry]]]:
        """(version, entries by cache resource name), taken together: those still waiting for the
        watch, plus those confirmed after stamp `after` (the stamp the stores were read at; None:
        none of the confirmed ones). Expired entries are dropped first."""
        now = self.clock()
        out: dict[str, dict[Key, Entry]] = {}
        with self._lock:
            stale = [slot for slot, e in self._entries.items() if e.expires <= now]
            for slot in stale:
                del self._entries[slot]
            if stale:
                self.expired += len(stale)
                self.version += 1
            for slot in [slot for slot, (e, _n) in self._confirmed.items() if e.expires <= now]:
                del self._confirmed[slot]
            if after is not None:
                for (resource, key), (e, n) in self._confirmed.items():
                    if n > after:
                        out.setdefault(resource, {})[key] = e
            for (resource, key), e in self._entries.items():
                out.setdefault(resource, {})[key] = e
            return self.version, out

    def forget_confirmed(self, upto: int) -> None:
        """Drop confirmations up to stamp `upto`: the view now in use was read after them."""
        with self._lock:
            for slot in [slot for slot, (_e, n) in self._confirmed.items() if n <= upto]:
                del self._confirmed[slot]

    def live(self) -> dict[str, dict[Key, Entry]]:
        """Entries still waiting for the watch."""
        return self.snapshot()[1]

    def next_expiry(self) -> float | None:
        """Seconds until the next entry expires (None when empty)."""
        with self._lock:
            if not self._entries:
                return None
            return max(min(e.expires for e in self._entries.values()) - self.clock(), 0.0)
