"""Exact GPU budgets across replicas: a usage ledger per budget group, written with optimistic concurrency.

Each replica's caches lag the API server (watch delay, debounce, reconnects), so budgets checked
against them alone let concurrent creates on different replicas overshoot. For a ResourceClaim
CREATE in a namespace that some GpuQuotaPolicy budget covers, the validating path therefore
decides against a ledger kept in the API server, as Kubernetes' ResourceQuota admission does with
`status.used`:

- one ConfigMap per budget group (a team when the namespace has a team label, else the namespace)
  in the ledger namespace, `data.claims` a JSON map `namespace/name -> charge`;
- the verdict is the engine's, with the ledger's sum as the usage; an allowed claim is added to the
  ledger by an update carrying the read `resourceVersion` (409 Conflict: read again, decide again);
- concurrent requests for one group on one replica share one read and one write (a batch), so a
  burst costs a few round trips per replica, not one per request;
- a background pass reconciles each ledger with the watched claims. A watch lags (and each
  replica's by a different amount), so it only ever suggests; a GET of the claim decides: entries of
  claims that are gone are dropped, a claim the ledger lacks (created while draguard was not asked)
  is added only if the GET finds it, so a lagging watch cannot put a deleted claim back. An entry
  is neither dropped nor lowered within `ttl` seconds (default 10) of its reservation: its create
  may still be on its way (the validating webhook times out after 3 s, so a create allowed in time
  is persisted long before); a reservation whose create never happened expires after that.
  Claims a GET found gone while this replica's watch still lists them are remembered (at most
  MAX_GONE, and only while the watch lists them) so they are not asked about on every pass.
- a review may be forged (anything that reaches the port can send one), so only a claim the API
  server could persist is reserved: valid names, a namespace the watch knows and equal to the
  object's. What can be reserved without a claim appearing is bounded per namespace (MAX_PENDING,
  MAX_PENDING_BYTES), ledgers of namespaces that are gone are deleted, and each ledger and each
  entry is reconciled in a step of its own, so one bad entry never stops the others.

The request path waits on the API server here: a claim is decided within `timeout` seconds (default
1.5 s) or denied with a message to retry; a ledger write already under way then finishes within
WRITE_TIMEOUT (1 s), so the answer comes within 2.5 s, inside the validating webhook's 3 s. Its
cost: per batch one GET and one PUT of the group's ConfigMap, repeated on conflicts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import quote

from ..dra.objects import as_map, as_str, claim_spec_of
from ..engine.context import QuotaUsage
from ..engine.quota import (
    ClaimCharge,
    budget_group,
    charge_of,
    inventory_calculator,
    team_labels_of,
    team_scope,
)
from ..engine.quota import usage_from_charges as _usage_from_charges
from . import admission
from .admission import Outcome, Snapshot
from .caches import ApiError, KubeHttp
from .namespaces import NamespaceArrivals

log = logging.getLogger("draguard.ledger")

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "draguard-quota-ledger"
GROUP_ANNOTATION = "draguard.io/budget-group"
DATA_KEY = "claims"
MAX_LEDGER_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB
MAX_BATCH = 256
CHECKS_PER_PASS = 64  # GETs of claims per ledger per reconcile pass
# One ledger read or write. A request is decided within --quota-timeout; a write already under way
# then finishes within this, so the answer comes before the validating webhook's 3 s timeout.
WRITE_TIMEOUT = 1.0
# Watched claims (`namespace/name`, uid) that a GET found gone: a lagging watch's deleted claims, kept
# so they are not fetched again each pass. Bounded: a tenant creating and deleting claims in a loop
# makes the oldest forgotten (costing one more GET each), never more memory (~0.5 KiB an entry).
MAX_GONE = 4096
# Reservations whose claim has not appeared yet, per namespace: what a sender can plant without a
# claim ever existing. A real burst beyond this (hundreds of creates within one reconcile pass) is
# refused with "retry"; the resourceclaim controller retries. Confirmed entries are real claims and
# are bounded only by the ledger's size.
MAX_PENDING = 256
MAX_PENDING_BYTES = 128 * 1024
# Ledger ConfigMaps: one per budget group of a namespace the watch knows; this caps them whatever
# the number of namespaces.
MAX_LEDGERS = 4096
_Pass = Literal["written", "agreed", "open"]  # what one ledger's reconcile did (_reconcile_one)
_NO_CLAIMS: Mapping[str, tuple[str, ClaimCharge]] = MappingProxyType({})  # one object: compared by identity
LOG_NAME = 80  # characters of a tenant-chosen name that reach a log line
# A claim for a namespace the watch has not shown yet (created a moment ago) waits this long for it
# (webhook/server/namespaces.py bounds how many wait).
NAMESPACE_WAIT_S = 2.0

# As the API server validates them: a namespace is a DNS label, a ResourceClaim's name a DNS subdomain.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_namespace(text: str) -> bool:
    return _DNS_LABEL.fullmatch(text) is not None


def is_claim_name(text: str) -> bool:
    return len(text) <= 253 and _DNS_SUBDOMAIN.fullmatch(text) is not None


def valid_key(key: str) -> bool:
    """Whether a ledger key is `namespace/name` of an object the API server could hold."""
    ns, sep, name = key.partition("/")
    return bool(sep) and is_namespace(ns) and is_claim_name(name)


def safe(text: object, limit: int = LOG_NAME) -> str:
    """A tenant-chosen string fit for a log line or a message: control characters escaped, truncated."""
    raw = str(text)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in raw[: limit + 1])
    return out if len(raw) <= limit and len(out) <= limit else out[:limit] + "..."


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """What one admitted claim charges; `uid` is empty until its claim has been seen."""

    devices: Mapping[str, int]
    gpu: Fraction
    reserved: float
    uid: str = ""

    def to_json(self) -> list[Any]:
        return [dict(sorted(self.devices.items())), [self.gpu.numerator, self.gpu.denominator],
                round(self.reserved, 3), self.uid]  # fmt: skip


def decode(text: str | None) -> dict[str, LedgerEntry]:
    """The ledger's entries; entries that are not well formed are dropped (and logged)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        log.warning("quota ledger is not JSON; starting it afresh")
        return {}
    out: dict[str, LedgerEntry] = {}
    for key, val in raw.items() if isinstance(raw, dict) else ():
        try:
            devs, (num, den), reserved, uid = val
            out[str(key)] = LedgerEntry(
                {str(k): int(v) for k, v in devs.items()},
                Fraction(int(num), int(den)),
                float(reserved),
                str(uid),
            )
        except (TypeError, ValueError, AttributeError, ZeroDivisionError):
            log.warning("quota ledger entry unreadable; dropped", extra={"object": safe(key)})
    return out


def encode(entries: Mapping[str, LedgerEntry]) -> str:
    return json.dumps({k: e.to_json() for k, e in sorted(entries.items())}, separators=(",", ":"))


_NAME_BAD = re.compile(r"[^a-z0-9-]+")


def ledger_name(group: str) -> str:
    """A valid, stable ConfigMap name for a group (`team:ml` -> `draguard-quota-team-ml-<hash>`)."""
    digest = hashlib.sha256(group.encode()).hexdigest()[:10]
    # 63 characters at most, so the name also fits in a label value.
    room = 63 - len("draguard-quota--") - len(digest)
    readable = _NAME_BAD.sub("-", group.lower().replace(":", "-")).strip("-")[:room].strip("-")
    return f"draguard-quota-{readable}-{digest}" if readable else f"draguard-quota-{digest}"


def usage_of(entries: Mapping[str, LedgerEntry], labels: Mapping[str, Mapping[str, str]],
             team_labels: list[str], skip: str | None = None) -> QuotaUsage:
    """Usage per scope from a ledger's entries (the scopes of the group's namespaces)."""
    charges = [
        ClaimCharge(key.partition("/")[0] or "default", e.devices, e.gpu)
        for key, e in entries.items() if key != skip
    ]  # fmt: skip
    return _usage_from_charges(charges, labels, team_labels)


def _add(a: QuotaUsage, b: QuotaUsage) -> QuotaUsage:
    from .usage import add_usage

    return add_usage(a, b)


@dataclass
class _Item:
    key: str
    request: Mapping[str, Any]
    snap: Snapshot
    future: asyncio.Future[Outcome]
    deadline: float = 0.0  # monotonic time after which it is no longer decided (denied: retry)
    writing: bool = False  # decided and part of a write in flight: its answer follows the write's


@dataclass
class _Group:
    pending: list[_Item] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None


class LedgerError(Exception):
    """The ledger could not be read or written; the claim is denied (validation fails closed)."""


class QuotaLedger:
    """Reserves claim charges in the API server before the validating webhook allows them."""

    def __init__(
        self,
        http: KubeHttp,
        namespace: str,
        *,
        timeout: float = 1.5,
        ttl: float = 10.0,
        claims: Callable[[], list[dict[str, Any]]] | None = None,
        snapshot: Callable[[], Snapshot] | None = None,
        synced: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.time,
        arrivals: NamespaceArrivals | None = None,
    ) -> None:
        self.http = http
        self.namespace = namespace
        self.timeout = timeout
        self.ttl = ttl
        self.claims = claims or (lambda: [])
        self.snapshot = snapshot
        # Shared with the webhook's other waits for new namespaces, so one bound holds for all.
        self.arrivals = arrivals or (NamespaceArrivals(snapshot) if snapshot is not None else None)
        self.synced = synced or (lambda: True)
        self.clock = clock
        self._groups: dict[str, _Group] = {}
        self._watched_memo: tuple[Any, dict[str, dict[str, tuple[str, ClaimCharge]]]] | None = None
        # Per watched claim (`namespace/name`): the object last seen, its group and (uid, charge);
        # a claim whose object is unchanged is not charged again (see _watched).
        self._per_claim: dict[str, tuple[Any, str | None, tuple[str, ClaimCharge] | None]] = {}
        self._gone: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._gone_version = 0  # moves whenever _gone changes: it decides what a pass asks about
        # Ledgers the last pass found in agreement with the watch: group -> (resourceVersion, the
        # watched claims' mapping, _gone_version). While all three are the same, nothing in the
        # ledger can have changed, and the pass skips it (see reconcile).
        self._stable: dict[str, tuple[str, Mapping[str, tuple[str, ClaimCharge]], int]] = {}
        self._ledgers = 0  # ledger ConfigMaps the last reconcile pass listed
        self._may_delete = True
        self.stats = {"reads": 0, "writes": 0, "conflicts": 0, "timeouts": 0, "expired": 0, "released": 0,
                      "checks": 0, "invalid": 0, "refused": 0, "removed": 0, "errors": 0,
                      "unchanged": 0}  # fmt: skip

    # --- which requests --------------------------------------------------------------------------

    def group_for(self, request: Mapping[str, Any], snap: Snapshot) -> str | None:
        """The budget group a persisted ResourceClaim CREATE reserves in; None for anything else."""
        kind = request.get("kind")
        if not isinstance(kind, Mapping) or kind.get("group") != admission.DRA_GROUP:
            return None
        if kind.get("kind") != "ResourceClaim" or request.get("operation") != "CREATE":
            return None
        if request.get("dryRun") or request.get("subResource") or snap.policies is None:
            return None
        ns = str(request.get("namespace") or "default")
        return budget_group(snap.policies, ns, snap.namespace_labels.get(ns))

    # --- the request path ------------------------------------------------------------------------

    async def admit(self, group: str, request: Mapping[str, Any], snap: Snapshot, first: Outcome) -> Outcome:
        """The verdict with the ledger's usage; an allowed claim is in the ledger when this returns."""
        if first.verdict in ("denied", "error") and not _only_quota(first):
            return first  # denied for another reason: nothing to reserve
        meta = as_map(as_map(request.get("object")).get("metadata"))
        name = as_str(meta.get("name")) or str(request.get("name") or "")
        if not name:
            return first  # generateName: the name is unknown until after admission (see docs)
        if snap.namespace_labels and self.namespace not in snap.namespace_labels:
            # The watch sees every namespace: no need to ask the API server to learn it is missing.
            return _denied(first, request, self._missing())
        refused = self._refusal(request, meta, name, snap)
        unseen = self.arrivals is not None and self.arrivals.unseen(request.get("namespace"), snap)
        if refused is not None and unseen:
            # `kubectl apply` of a new namespace and its claims sends the claim right after the namespace
            # is created: give the watch a moment to show it rather than refuse a real claim. A forged
            # review for a namespace that does not exist waits too, holding only its own connection.
            fresh = await self._wait_for_namespace(str(request.get("namespace")))
            if fresh is not None:
                snap = fresh
                refused = self._refusal(request, meta, name, snap)
        if refused is not None:
            # Nothing is reserved for an object the API server could not persist: a forged review
            # changes its own answer and no shared state.
            self.stats["refused"] += 1
            where = safe(f"{request.get('namespace')}/{name}")
            log.info("quota ledger refused a reservation", extra={"object": where, "reason": refused})
            return _denied(first, request, refused)
        loop = asyncio.get_running_loop()
        item = _Item(f"{request.get('namespace')}/{name}", request, snap, loop.create_future(),
                     deadline=time.monotonic() + self.timeout)  # fmt: skip
        g = self._groups.setdefault(group, _Group())
        g.pending.append(item)
        if g.worker is None or g.worker.done():
            g.worker = asyncio.create_task(self._work(group, g))
        try:
            return await asyncio.wait_for(asyncio.shield(item.future), self.timeout)
        except TimeoutError:
            if item.writing:
                # Reserved and being written: answering "denied" now would leave the reservation
                # behind for a claim that never comes. The write is bounded by its own timeout.
                return await item.future
            self.stats["timeouts"] += 1
            if item in g.pending:
                g.pending.remove(item)
            return _denied(first, request, self._late())

    async def _wait_for_namespace(self, ns: str) -> Snapshot | None:
        """A snapshot whose namespace watch shows `ns`, within NAMESPACE_WAIT_S; None if not."""
        if self.arrivals is None:
            return None
        return await self.arrivals.seen(ns, NAMESPACE_WAIT_S)

    def _refusal(
        self, request: Mapping[str, Any], meta: Mapping[str, Any], name: str, snap: Snapshot
    ) -> str | None:
        """Why no reservation is made for this request (None: it is one the API server could persist)."""
        ns = request.get("namespace")
        if not isinstance(ns, str) or not is_namespace(ns):
            return f"namespace {safe(ns)!r} is not a valid namespace name (a DNS label)"
        if not is_claim_name(name):
            return f"name {safe(name)!r} is not a valid ResourceClaim name (a DNS subdomain)"
        if as_str(meta.get("namespace")) != ns:
            return (f"the object's metadata.namespace {safe(meta.get('namespace'))!r} is not the request's "
                    f"namespace {ns!r}")  # fmt: skip
        if request.get("name") and request.get("name") != name:
            return f"the request's name {safe(request.get('name'))!r} is not the object's name {name!r}"
        if ns not in snap.namespace_labels:
            return (f"namespace {ns} is not in draguard's namespace watch yet (just created, or it does not "
                    "exist); retry the request")  # fmt: skip
        return None

    def _crowded(self, ns: str) -> str:
        return (f"namespace {ns} has {MAX_PENDING} claims (or {MAX_PENDING_BYTES // 1024} KiB) reserved that "
                "the API server has not shown yet; retry the request once they exist")  # fmt: skip

    def _missing(self) -> str:
        return (f"namespace {self.namespace} for the quota ledgers does not exist; create it (the bundle "
                "ships it) or run serve with --quota-ledger-namespace ''")  # fmt: skip

    def _late(self) -> str:
        return (f"the quota ledger could not be updated within {self.timeout:g} s (API server slow or busy); "
                "retry the request")  # fmt: skip

    async def _work(self, group: str, g: _Group) -> None:
        loop = asyncio.get_running_loop()
        while g.pending:
            batch = g.pending[:MAX_BATCH]
            del g.pending[: len(batch)]
            now = time.monotonic()
            for it in batch:
                if it.deadline and now > it.deadline:
                    self.stats["timeouts"] += 1
                    _resolve(it, _denied_item(it, self._late()))
            batch = [i for i in batch if not i.future.done()]
            if not batch:
                continue
            try:
                cm = await loop.run_in_executor(None, self._read, group)
            except Exception as e:
                for it in batch:
                    _resolve(it, _denied_item(it, f"the quota ledger could not be read ({_why(e)})"))
                continue
            entries = decode(as_str(as_map(cm.get("data")).get(DATA_KEY)) if cm else None)
            allowed = self._decide(batch, entries)
            if not allowed:
                continue
            for it, _o in allowed:
                it.writing = True
            try:
                await loop.run_in_executor(None, self._write, group, cm, entries)
            except ApiError as e:
                if e.status == 409:  # another replica wrote first: decide these again on a fresh read
                    self.stats["conflicts"] += 1
                    for it, _o in allowed:
                        it.writing = False
                    g.pending[:0] = [it for it, _o in allowed if not it.future.done()]
                    continue
                if e.status == 404:
                    for it, _o in allowed:
                        _resolve(it, _denied_item(it, self._missing()))
                    continue
                for it, _o in allowed:
                    _resolve(it, _denied_item(it, f"the quota ledger could not be written ({_why(e)})"))
                continue
            except Exception as e:
                for it, _o in allowed:
                    _resolve(it, _denied_item(it, f"the quota ledger could not be written ({_why(e)})"))
                continue
            for it, out in allowed:
                _resolve(it, out)

    def _decide(self, batch: list[_Item], entries: dict[str, LedgerEntry]) -> list[tuple[_Item, Outcome]]:
        """Decide each request in order against the ledger, adding the allowed ones to `entries`."""
        allowed: list[tuple[_Item, Outcome]] = []
        now = self.clock()
        usage: QuotaUsage | None = None
        pending = _pending_per_namespace(entries)
        for it in batch:
            snap = it.snap
            labels = snap.namespace_labels
            teams = team_labels_of(snap.policies)
            if usage is None or it.key in entries:
                usage = usage_of(entries, labels, teams, skip=it.key)
            out = admission.review("validate", it.request, replace(snap, usage=usage))
            if out.verdict in ("denied", "error"):
                _resolve(it, out)
                continue
            charge = _charge(it, snap)
            if charge is None:
                _resolve(it, out)
                continue
            old = entries.get(it.key)
            ns = it.key.partition("/")[0]
            count, size = pending.get(ns, (0, 0))
            if old is None or old.uid:
                new = LedgerEntry(dict(charge.devices), charge.gpu_equivalents, now)
                size += _entry_bytes(it.key, new)
                if count + 1 > MAX_PENDING or size > MAX_PENDING_BYTES:
                    _resolve(it, _denied_item(it, self._crowded(ns)))
                    continue
                pending[ns] = (count + 1, size)
            if old is None:
                entries[it.key] = LedgerEntry(dict(charge.devices), charge.gpu_equivalents, now)
                usage = _add(usage, _usage_from_charges([charge], labels, teams))
            else:
                # A create under the name of a ledgered claim: that claim may still exist (the API
                # server then refuses this create), so its charge is not replaced by a smaller one.
                entries[it.key] = LedgerEntry(*_larger(old, charge), now)
                usage = None
            allowed.append((it, out))
        return allowed

    # --- API calls (in a thread) -------------------------------------------------------------------

    def _path(self, name: str = "") -> str:
        base = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/configmaps"
        return f"{base}/{quote(name, safe='')}" if name else base

    def _read(self, group: str) -> dict[str, Any] | None:
        self.stats["reads"] += 1
        try:
            return self.http.get_json(self._path(ledger_name(group)), timeout=WRITE_TIMEOUT)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def _write(self, group: str, cm: Mapping[str, Any] | None, entries: Mapping[str, LedgerEntry]) -> None:
        text = encode(entries)
        if len(text) > MAX_LEDGER_BYTES:
            raise LedgerError(f"ledger of {group} would exceed {MAX_LEDGER_BYTES // 1024} KiB")
        if cm is None and self._ledgers >= MAX_LEDGERS:
            raise LedgerError(f"there are {self._ledgers} quota ledgers already, the most draguard keeps")
        self.stats["writes"] += 1
        if cm is None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": ledger_name(group),
                    "namespace": self.namespace,
                    "labels": {COMPONENT_LABEL: COMPONENT, "app.kubernetes.io/managed-by": "draguard"},
                    "annotations": {GROUP_ANNOTATION: group},
                },
                "data": {DATA_KEY: text},
            }
            # A create racing another replica's create answers 409 too: read again, decide again.
            self.http.request_json("POST", self._path(), body=body, timeout=WRITE_TIMEOUT)
            return
        meta = as_map(cm.get("metadata"))
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": meta.get("name"),
                "namespace": self.namespace,
                # The precondition: the update fails with 409 if anyone wrote since our read.
                "resourceVersion": meta.get("resourceVersion"),
                "labels": meta.get("labels") or {},
                "annotations": meta.get("annotations") or {},
            },
            "data": {DATA_KEY: text},
        }
        self.http.request_json("PUT", self._path(str(meta.get("name"))), body=body, timeout=WRITE_TIMEOUT)

    # --- reconciliation (background) ----------------------------------------------------------------

    def reconcile(self) -> int:
        """One pass over every ledger and the watched claims; returns the ledgers rewritten or removed.

        Blocking (API calls): run it in a thread, one pass at a time. Never changes a ledger on the
        word of a lagging watch alone: an entry leaves only when a GET says its claim is gone, a claim
        is added only when a GET finds it, and nothing is dropped or lowered within `ttl` of its
        reservation (its create may still be on its way). Each ledger, and each entry within it, is
        its own step: whatever one holds (a damaged entry, an answer that is not a claim) is logged and
        counted, and the others are reconciled all the same.
        """
        if self.snapshot is None or not self.synced():
            return 0
        snap = self.snapshot()
        if snap.policies is None:
            return 0
        listed = self.http.get_json(
            self._path(), [("labelSelector", f"{COMPONENT_LABEL}={COMPONENT}")], timeout=10.0
        )
        items: list[dict[str, Any]] = [cm for cm in listed.get("items") or [] if isinstance(cm, dict)]
        self._ledgers = len(items)
        ledgers: dict[str, dict[str, Any]] = {}
        for item in items:
            group = as_str(as_map(as_map(item.get("metadata")).get("annotations")).get(GROUP_ANNOTATION))
            if group:
                ledgers[group] = item
        watched = self._watched(snap)
        self._prune_gone(watched)
        live = _live_groups(snap)
        written = 0
        groups = sorted(set(ledgers) | set(watched))
        for stale in self._stable.keys() - set(groups):
            del self._stable[stale]
        for group in groups:
            cm = ledgers.get(group)
            try:
                if cm is not None and live and group not in live:
                    self._stable.pop(group, None)
                    written += self._remove(group, cm)
                    continue
                mine = watched.get(group, _NO_CLAIMS)
                was = self._stable.pop(group, None)
                rv = as_str(as_map(cm.get("metadata")).get("resourceVersion")) if cm else ""
                if (
                    was is not None
                    and rv
                    and was[0] == rv
                    and was[1] is mine
                    and was[2] == self._gone_version
                ):
                    # Neither the ledger nor its group's watched claims changed since a pass found
                    # them in agreement: a quiet cluster's pass costs the list, not a decode of every
                    # entry (50,000 on a 2,000-node cluster, every second).
                    self._stable[group] = was
                    self.stats["unchanged"] += 1
                    continue
                outcome = self._reconcile_one(group, cm, mine, snap)
                if outcome == "written":
                    written += 1
                elif outcome == "agreed" and rv:
                    self._stable[group] = (rv, mine, self._gone_version)
            except ApiError as e:
                if e.status != 409:  # 409: an admission wrote meanwhile; the next pass sees it
                    self._failed("quota ledger reconcile failed", group, e)
            except Exception as e:  # one ledger's trouble must not stop every other team's
                self._failed("quota ledger reconcile failed", group, e)
        return written

    def _failed(self, what: str, name: str, e: BaseException) -> None:
        self.stats["errors"] += 1
        log.warning(what, extra={"object": safe(name), "reason": safe(_why(e), 200)})

    def _remove(self, group: str, cm: Mapping[str, Any]) -> int:
        """Delete the ledger of a group no namespace the watch knows belongs to (its namespaces are
        gone), once nothing in it was reserved within `ttl` (a create may still be on its way)."""
        now = self.clock()
        entries = decode(as_str(as_map(cm.get("data")).get(DATA_KEY)))
        if any(now - e.reserved <= self.ttl for e in entries.values()) or not self._may_delete:
            return 0
        meta = as_map(cm.get("metadata"))
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"resourceVersion": meta.get("resourceVersion")}}  # fmt: skip
        try:
            self.http.request_json(
                "DELETE", self._path(str(meta.get("name"))), body=body, timeout=WRITE_TIMEOUT
            )
        except ApiError as e:
            if e.status == 404:
                return 0
            if e.status == 403:
                # A bundle from before ledgers were removed: say so once, not on every pass.
                self._may_delete = False
                log.warning("quota ledgers of deleted namespaces stay: the webhook may not delete ConfigMaps "
                            f"in {safe(self.namespace)} (apply the current bundle's Role)")  # fmt: skip
                return 0
            raise
        self.stats["removed"] += 1
        log.info("quota ledger of a deleted namespace removed", extra={"object": safe(group)})
        return 1

    def _watched(self, snap: Snapshot) -> dict[str, dict[str, tuple[str, ClaimCharge]]]:
        """Watched claims per budget group: (uid, charge) by `namespace/name`. A claim is charged
        again only when its object changed, all of them when the namespace labels, policies or
        devices did; a group none of whose claims changed keeps its mapping object, so the pass can
        tell by identity that nothing in it moved."""
        claims = self.claims()
        # The memo holds the objects themselves, so an identity match cannot be a reused address.
        key = (claims, snap.namespace_labels, snap.policies, snap.inventory.devices, snap.inventory.classes)
        memo = self._watched_memo
        same_context = memo is not None and all(a is b for a, b in zip(memo[0][1:], key[1:], strict=True))
        if (
            memo is not None
            and same_context
            and len(memo[0][0]) == len(claims)
            and all(a is b for a, b in zip(memo[0][0], claims, strict=True))
        ):
            return memo[1]
        before = memo[1] if memo is not None and same_context else {}
        seen = self._per_claim if same_context else {}
        calc: Any = None
        per_claim: dict[str, tuple[Any, str | None, tuple[str, ClaimCharge] | None]] = {}
        changed: set[str | None] = set()
        watched: dict[str, dict[str, tuple[str, ClaimCharge]]] = {}
        for obj in claims:
            meta = as_map(obj.get("metadata"))
            ns = as_str(meta.get("namespace")) or "default"
            name = f"{ns}/{as_str(meta.get('name'))}"
            hit = seen.get(name)
            if hit is None or hit[0] is not obj:
                if calc is None:
                    calc = inventory_calculator(snap.inventory)
                group = budget_group(snap.policies, ns, snap.namespace_labels.get(ns))
                charge = _charge_obj(obj, calc) if group is not None else None
                val = (
                    (as_str(meta.get("uid")) or "", charge)
                    if group is not None and charge is not None
                    else None
                )
                hit = (obj, group if val is not None else None, val)
                changed.add(hit[1])
                if name in seen:
                    changed.add(seen[name][1])
            per_claim[name] = hit
            if hit[1] is not None and hit[2] is not None:
                watched.setdefault(hit[1], {})[name] = hit[2]
        changed.update(g for name, (_o, g, _v) in seen.items() if name not in per_claim)
        for group in watched.keys() & before.keys():
            if group not in changed:
                watched[group] = before[group]
        self._per_claim = per_claim
        self._watched_memo = (key, watched)
        return watched

    def _reconcile_one(self, group: str, cm: dict[str, Any] | None,
                       watched: Mapping[str, tuple[str, ClaimCharge]], snap: Snapshot) -> _Pass:
        """Reconcile one group's ledger: "written" when it was rewritten; "agreed" when it agrees with
        the watch by what the two hold alone, not by the clock (a later pass may skip it while
        neither changes); "open" when it was left as it is for now (a recent reservation, a claim
        still to be asked about)."""
        entries = decode(as_str(as_map(cm.get("data")).get(DATA_KEY)) if cm else None)
        now = self.clock()
        new = dict(entries)
        check: list[str] = []  # a GET decides: entries the watch does not confirm, claims it adds
        waiting = False  # entries left as they are only because their reservation is recent
        for key, e in entries.items():
            if not valid_key(key):
                # No object the API server holds has this name (a forged reservation from before
                # names were checked): nothing to ask about, and its path must never be built.
                self.stats["invalid"] += 1
                log.info("quota ledger entry with an invalid name dropped", extra={"object": safe(key)})
                new.pop(key)
                continue
            w = self._listed(key, watched.get(key))
            if w is not None and w[0] == e.uid:
                continue
            if w is not None and not e.uid and _same(e, w[1]):
                new[key] = replace(e, uid=w[0])  # the reservation's claim, as charged
            elif now - e.reserved > self.ttl:
                if snap.namespace_labels and key.partition("/")[0] not in snap.namespace_labels:
                    # Its namespace is gone (or never was): so is the claim, no GET needed.
                    self.stats["expired" if not e.uid else "released"] += 1
                    new.pop(key)
                else:
                    check.append(key)
            else:
                waiting = True  # reserved within ttl, its create may still be on its way
        check += [key for key, w in watched.items() if key not in entries and self._listed(key, w)]
        calc = inventory_calculator(snap.inventory)
        for key in check[:CHECKS_PER_PASS]:
            try:
                self._check(key, group, entries, new, watched.get(key), snap, calc, now)
            except Exception as e:  # this entry stays as it is; the others go on
                self._failed("quota ledger entry check failed", key, e)
        if new == entries or (cm is None and not new):
            return "open" if check or waiting else "agreed"
        self._write(group, cm, new)
        return "written"

    def _check(self, key: str, group: str, entries: Mapping[str, LedgerEntry], new: dict[str, LedgerEntry],
               w: tuple[str, ClaimCharge] | None, snap: Snapshot, calc: Any, now: float) -> None:
        """GET one claim and set its entry in `new` by what the API server holds."""
        ns, _, name = key.partition("/")
        self.stats["checks"] += 1
        try:
            # Quoted although the key was checked: a path segment is never built from raw text.
            path = f"/apis/{admission.DRA_GROUP}/v1/namespaces/{quote(ns, safe='')}/resourceclaims/" + quote(
                name, safe=""
            )
            obj = self.http.get_json(path, timeout=5.0)
        except ApiError as e:
            if e.status != 404:
                raise
            if w is not None:
                self._forget(key, w[0])
            if key in entries:
                self.stats["expired" if not entries[key].uid else "released"] += 1
                new.pop(key, None)
            return
        meta = as_map(obj.get("metadata"))
        if obj.get("kind") not in (None, "ResourceClaim") or (
            as_str(meta.get("namespace")), as_str(meta.get("name"))
        ) != (ns, name):
            raise ValueError("the answer is not this ResourceClaim")
        uid = as_str(meta.get("uid")) or ""
        if w is not None and w[0] != uid:
            self._forget(key, w[0])
        found = _charge_obj({**obj, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}, calc)
        if found is None or budget_group(snap.policies, ns, snap.namespace_labels.get(ns)) != group:
            new.pop(key, None)
            return
        old = entries.get(key)
        if old is None or old.uid != uid or not _same(old, found):
            new[key] = LedgerEntry(dict(found.devices), found.gpu_equivalents,
                                   old.reserved if old is not None else now, uid)  # fmt: skip

    def _listed(self, key: str, w: tuple[str, ClaimCharge] | None) -> tuple[str, ClaimCharge] | None:
        """The watch's claim for `key`, unless a GET already found that claim gone."""
        return None if w is None or (key, w[0]) in self._gone else w

    def _forget(self, key: str, uid: str) -> None:
        if not uid:
            return
        self._gone[(key, uid)] = None
        self._gone.move_to_end((key, uid))
        self._gone_version += 1
        while len(self._gone) > MAX_GONE:
            self._gone.popitem(last=False)

    def _prune_gone(self, watched: Mapping[str, Mapping[str, tuple[str, ClaimCharge]]]) -> None:
        """Forget gone claims the watch no longer lists (it has caught up with their deletes)."""
        if not self._gone:
            return
        listed = {(key, w[0]) for claims in watched.values() for key, w in claims.items()}
        for pair in [p for p in self._gone if p not in listed]:
            del self._gone[pair]
            self._gone_version += 1

    async def run(self, interval: float = 1.0) -> None:
        """Reconcile every `interval` seconds until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            try:
                await loop.run_in_executor(None, self.reconcile)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed("quota ledger reconcile failed", "*", e)


def _live_groups(snap: Snapshot) -> set[str]:
    """Every group a namespace the watch knows can belong to (whatever the policies say now: a budget
    switched off and on again keeps its ledger). Empty when the watch lists no namespace at all: then
    nothing is taken for gone."""
    teams = team_labels_of(snap.policies)
    out: set[str] = set()
    for ns, labels in snap.namespace_labels.items():
        out.add(ns)
        out.update(team_scope(labels[k]) for k in teams if labels.get(k))
    return out


def _entry_bytes(key: str, e: LedgerEntry) -> int:
    return len(key) + len(json.dumps(e.to_json(), separators=(",", ":"))) + 4


def _pending_per_namespace(entries: Mapping[str, LedgerEntry]) -> dict[str, tuple[int, int]]:
    """Per namespace, the number and encoded bytes of reservations whose claim has not appeared yet."""
    out: dict[str, tuple[int, int]] = {}
    for key, e in entries.items():
        if not e.uid:
            ns = key.partition("/")[0]
            count, size = out.get(ns, (0, 0))
            out[ns] = (count + 1, size + _entry_bytes(key, e))
    return out


def _only_quota(o: Outcome) -> bool:
    deny = [f for f in o.findings if f.mode.value == "enforce"]
    return bool(deny) and all(f.rule.startswith("quota/") for f in deny)


def _charge(it: _Item, snap: Snapshot) -> ClaimCharge | None:
    version = str(as_map(it.request.get("kind")).get("version") or "v1")
    obj = admission.prepare_object(it.request, admission.DRA_GROUP, version, "ResourceClaim")
    return _charge_obj(obj, inventory_calculator(snap.inventory)) if obj is not None else None


def _charge_obj(obj: Mapping[str, Any], calc: Any) -> ClaimCharge | None:
    read = claim_spec_of(obj) if obj.get("kind") else claim_spec_of(
        {**obj, "kind": "ResourceClaim", "apiVersion": obj.get("apiVersion") or "resource.k8s.io/v1"}
    )
    if read is None:
        return None
    ns = as_str(as_map(obj.get("metadata")).get("namespace")) or "default"
    return charge_of(ns, read[0], calc)


def _same(e: LedgerEntry, c: ClaimCharge) -> bool:
    return dict(e.devices) == dict(c.devices) and e.gpu == c.gpu_equivalents


def _larger(e: LedgerEntry, c: ClaimCharge) -> tuple[dict[str, int], Fraction]:
    """Per device class and in GPU-equivalents, the larger of an entry's charge and a claim's."""
    devices = dict(e.devices)
    for cls, n in c.devices.items():
        devices[cls] = max(devices.get(cls, 0), n)
    return devices, max(e.gpu, c.gpu_equivalents)


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:200]


def _resolve(it: _Item, out: Outcome) -> None:
    if not it.future.done():
        it.future.set_result(out)


def _denied_item(it: _Item, reason: str) -> Outcome:
    return _denied(None, it.request, reason)


def _denied(first: Outcome | None, request: Mapping[str, Any], reason: str) -> Outcome:
    uid = str(request.get("uid") or "")
    ns = str(request.get("namespace") or "")
    name = str(request.get("name") or "")
    # The names are the sender's and may be anything: the message carries them escaped and cut.
    msg = f"draguard denied ResourceClaim {safe(ns, 63)}/{safe(name, 253)} (quota/ledger): {reason}"
    return Outcome(
        response={
            "uid": uid,
            "allowed": False,
            "status": {"code": 403, "reason": "Forbidden", "message": msg},
        },
        kind="ResourceClaim",
        operation="CREATE",
        verdict="denied",
        findings=list(first.findings) if first is not None else [],
        namespace=ns,
        name=name,
    )
