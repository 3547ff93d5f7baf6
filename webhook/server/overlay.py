"""Objects the webhook has just admitted, visible to the same caller's next request before the
watch reports them.

`kubectl apply` of a ResourceClaimTemplate followed by a Deployment that uses it sends the two
requests milliseconds apart; the watch learns about the template a moment later. Without help the
Deployment would be judged without its template. The validating endpoint therefore records what it
admits in this overlay; admission reads the watch caches with the overlay laid over them.

What is recorded is attacker input whenever the webhook port is reachable without the API server's
client certificate (anyone can POST a forged AdmissionReview). So:

- only kinds the bundled webhook configurations send (ResourceClaimTemplate, ResourceClaim,
  DeviceClass), only when their own review allowed them, never Namespaces (the API server never
  sends them, so a recorded one could only be forged);
- each entry belongs to the identity that sent it (`request.userInfo`: username, uid, groups) and
  is laid over the views of that identity's requests only. A forged review can therefore change
  answers only for requests that carry the same identity, within the time-to-live, and only where
  they name an object the watch does not have yet; with `--client-ca` it cannot be sent at all;
- an entry holds only what verdicts read (kind, name, namespace, uid, resourceVersion, spec), and
  the overlay is bounded by bytes, in all and per identity; the oldest entries go first.

An entry lives until the watch delivers the object itself (the watch's version then wins, for every
identity) or until its time-to-live runs out, which readers enforce themselves (no watch event is
needed): an admitted object may still be rejected by a later admission plugin or webhook, and then
no watch event ever comes. Nothing here calls the API server.

Confirmation and the views: the watch stores an object before it reports the event, but the view
admission reads is rebuilt from the stores a little later. A confirmed entry is therefore kept,
stamped with a confirmation number, and still laid over every view built from stores read before
that number (`snapshot(after=...)`); views built later contain the object itself.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import codec

# Kind -> (API group, cache resource name). Only these kinds change what admission of *other*
# objects depends on (claim resolution, classes, quota usage), and the API server sends them.
OVERLAY_KINDS: Mapping[str, tuple[str, str]] = {
    "ResourceClaimTemplate": ("resource.k8s.io", "resourceclaimtemplates"),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims"),
    "DeviceClass": ("resource.k8s.io", "deviceclasses"),
}
DEFAULT_TTL = 30.0
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # in all (estimated: kept JSON bytes x 4, for the parsed forms)
DEFAULT_SCOPE_BYTES = 1024 * 1024  # per identity
MAX_ENTRY_BYTES = 128 * 1024  # larger objects are not recorded: the watch brings them
_PARSED_FACTOR = 4

Key = tuple[str, str]  # (namespace or "", name)
Slot = tuple[str, str, Key]  # (scope, resource, key)


def scope_of(request: Mapping[str, Any]) -> str:
    """The identity an AdmissionReview request was sent for (username, uid and groups), as a digest."""
    info = request.get("userInfo")
    info = info if isinstance(info, Mapping) else {}
    groups = info.get("groups")
    ident = [
        str(info.get("username") or ""),
        str(info.get("uid") or ""),
        sorted(str(g) for g in groups) if isinstance(groups, list) else [],
    ]
    # orjson, as the rest of the request path (json writes what orjson refuses, a lone surrogate).
    return hashlib.blake2b(codec.dumps(ident), digest_size=12).hexdigest()


def _trim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What verdicts read of an admitted object: no annotations, labels, status or managed fields."""
    meta = _meta(obj)
    keep = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": keep,
        "spec": obj.get("spec"),
    }


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
    obj: Mapping[str, Any]  # trimmed (see `_trim`)
    operation: str  # CREATE | UPDATE
    uid: str  # metadata.uid as admitted ("" when the request did not carry one)
    base_rv: str  # resourceVersion the admitted object carried ("" on CREATE)
    expires: float
    scope: str = ""
    size: int = 0  # estimated bytes held
    # What readers derived from `obj` (parsed spec, quota charge), so that each admission does not
    # parse every pending entry again. Filled by whichever thread gets there first.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


class AdmittedOverlay:
    """Short-lived records of admitted objects, per identity, superseded by the watch and expiring
    after `ttl`.

    Written by the request path (`record`) and the watch threads (`observe`); read by whoever
    assembles the view admission uses (`snapshot`). `version(scope)` changes whenever that
    identity's live set may have.
    """

    def __init__(
        self,
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_scope_bytes: int = DEFAULT_SCOPE_BYTES,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_scope_bytes = max_scope_bytes
        self.clock = clock
        self._counter = 0
        self._versions: dict[str, int] = {}  # scope -> counter value of its last change
        self.stamp = 0  # confirmations so far (see the module docstring)
        self._lock = threading.Lock()
        self._entries: dict[Slot, Entry] = {}  # oldest first
        self._scope_bytes: dict[str, int] = {}
        self.bytes = 0
        # Confirmed by the watch: (entry, confirmation stamp), oldest first.
        self._confirmed: dict[Slot, tuple[Entry, int]] = {}
        # Counters for tests and logs: how entries ended.
        self.superseded = 0
        self.expired = 0
        self.evicted = 0
        self.refused = 0  # too large to record

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def version(self) -> int:
        return self._counter

    def scope_version(self, scope: str) -> int:
        with self._lock:
            return self._versions.get(scope, 0)

    def has(self, scope: str) -> bool:
        """Whether this identity has entries (live or recently confirmed); a cheap first check."""
        return scope in self._versions

    def _bump(self, scope: str) -> None:
        self._counter += 1
        self._versions[scope] = self._counter

    def _drop(self, slot: Slot) -> Entry:
        e = self._entries.pop(slot)
        self.bytes -= e.size
        left = self._scope_bytes.get(e.scope, 0) - e.size
        if left > 0:
            self._scope_bytes[e.scope] = left
        else:
            self._scope_bytes.pop(e.scope, None)
        self._bump(e.scope)
        return e

    def _gc_versions(self) -> None:
        live = {slot[0] for slot in self._entries} | {slot[0] for slot in self._confirmed}
        for scope in [sc for sc in self._versions if sc not in live]:
            del self._versions[scope]

    def record(self, obj: Mapping[str, Any], operation: str, scope: str = "") -> bool:
        """Remember an admitted CREATE/UPDATE of an overlay kind for `scope`; False when not kept."""
        kind = obj.get("kind")
        if not isinstance(kind, str) or kind not in OVERLAY_KINDS or operation not in ("CREATE", "UPDATE"):
            return False
        key = object_key(obj)
        if not key[1] or "<" in key[1]:
            return False  # no real name yet (generateName placeholders): nothing can refer to it
        trimmed = _trim(obj)
        try:
            size = len(json.dumps(trimmed, separators=(",", ":"), default=str)) * _PARSED_FACTOR
        except (TypeError, ValueError, RecursionError):
            return False
        if size > MAX_ENTRY_BYTES * _PARSED_FACTOR:
            self.refused += 1
            return False
        meta = _meta(obj)
        resource = OVERLAY_KINDS[kind][1]
        entry = Entry(
            resource=resource,
            key=key,
            obj=trimmed,
            operation=operation,
            uid=str(meta.get("uid") or ""),
            base_rv=str(meta.get("resourceVersion") or "") if operation == "UPDATE" else "",
            expires=self.clock() + self.ttl,
            scope=scope,
            size=size,
        )
        slot = (scope, resource, key)
        with self._lock:
            if slot in self._entries:
                self._drop(slot)  # re-insert: newest last
            self._confirmed.pop(slot, None)
            self._entries[slot] = entry
            self.bytes += size
            self._scope_bytes[scope] = self._scope_bytes.get(scope, 0) + size
            self._bump(scope)
            # This identity's oldest first, then everyone's oldest.
            while self._scope_bytes.get(scope, 0) > self.max_scope_bytes:
                self._drop(next(s for s in self._entries if s[0] == scope))
                self.evicted += 1
            while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
                self.evicted += 1
            self._gc_versions()
        return True

    def observe(
        self, resource: str, typ: str, obj: Mapping[str, Any] | None, prev: Mapping[str, Any] | None
    ) -> None:
        """A watch event: drop the entries it reports on (the cache now has that version or a later
        one), whoever recorded them."""
        seen = obj if obj is not None else prev
        if seen is None or typ not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = object_key(seen)
        uid = str(_meta(seen).get("uid") or "")
        rv = str(_meta(seen).get("resourceVersion") or "")
        with self._lock:
            if not self._entries:
                return
            for slot in [s for s in self._entries if s[1] == resource and s[2] == key]:
                entry = self._entries[slot]
                if entry.uid and uid and uid != entry.uid:
                    continue  # an earlier object of the same name (e.g. its late DELETED event)
                if entry.base_rv and not _newer(rv, entry.base_rv):
                    continue  # the version the admitted update started from, or older: not it yet
                self._drop(slot)
                self.superseded += 1
                self.stamp += 1
                self._confirmed[slot] = (entry, self.stamp)
            while len(self._confirmed) > self.max_entries:
                self._confirmed.pop(next(iter(self._confirmed)))  # the oldest: in any recent view

    def _expire(self, now: float) -> None:
        stale = [slot for slot, e in self._entries.items() if e.expires <= now]
        for slot in stale:
            self._drop(slot)
        self.expired += len(stale)
        for slot in [slot for slot, (e, _n) in self._confirmed.items() if e.expires <= now]:
            del self._confirmed[slot]
            self._bump(slot[0])
        if stale:
            self._gc_versions()

    def expire(self) -> None:
        """Drop every expired entry now."""
        with self._lock:
            self._expire(self.clock())

    def snapshot(self, after: int | None = None, scope: str = "") -> tuple[int, dict[str, dict[Key, Entry]]]:
        """(version, entries of `scope` by cache resource name), taken together: those still waiting
        for the watch, plus those confirmed after stamp `after` (the stamp the stores were read at;
        None: none of the confirmed ones). Expired entries are dropped first."""
        out: dict[str, dict[Key, Entry]] = {}
        with self._lock:
            self._expire(self.clock())
            if after is not None:
                for (sc, resource, key), (e, n) in self._confirmed.items():
                    if n > after and sc == scope:
                        out.setdefault(resource, {})[key] = e
            for (sc, resource, key), e in self._entries.items():
                if sc == scope:
                    out.setdefault(resource, {})[key] = e
            return self._versions.get(scope, 0), out

    def forget_confirmed(self, upto: int) -> None:
        """Drop confirmations up to stamp `upto`: the view now in use was read after them."""
        with self._lock:
            for slot in [slot for slot, (_e, n) in self._confirmed.items() if n <= upto]:
                del self._confirmed[slot]
                self._bump(slot[0])
            self._gc_versions()

    def live(self, scope: str = "") -> dict[str, dict[Key, Entry]]:
        """Entries of `scope` still waiting for the watch."""
        return self.snapshot(scope=scope)[1]

    def next_expiry(self) -> float | None:
        """Seconds until the next entry expires (None when empty)."""
        with self._lock:
            if not self._entries:
                return None
            return max(min(e.expires for e in self._entries.values()) - self.clock(), 0.0)
