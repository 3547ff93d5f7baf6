"""The admission webhook server (aiohttp): endpoints, policy hot reload, caches, graceful shutdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiohttp import web

from ..dra.inventory import Inventory
from ..engine.context import ALL_RESOURCE_VERSIONS
from . import admission, logs
from .admission import Outcome, ReviewError, Snapshot
from .metrics import DraStats, Metrics
from .namespaces import NamespaceArrivals
from .overlay import scope_of

log = logging.getLogger("draguard.server")
MAX_BODY = 3 * 1024 * 1024
BIG_BODY = 256 * 1024  # bodies over this are read and reviewed BIG_BODIES at a time
BIG_BODIES = 2
# How long a validating review for a namespace the watch has not shown yet waits for it: a third of
# the validating webhooks' 3 s timeout, leaving the rest to the lookups and the quota ledger.
NAMESPACE_WAIT_S = 1.0
# A pod cannot use more devices than one node has; templates for larger counts are never made.
MAX_TEMPLATE_DEVICES_UNKNOWN = 64
T = TypeVar("T")


@dataclass
class ServeOptions:
    policies: str
    host: str | None = None  # None: every interface, IPv4 and IPv6
    port: int = 8443
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    # With client_ca: accepted client certificate names (subject CN or DNS SAN); empty: any.
    client_names: tuple[str, ...] = ()
    # Probes and /metrics, plain HTTP, on their own port (0: all on the serving port).
    probe_port: int = 0
    kubeconfig: str | None = None
    inventory: str | None = None
    no_watch: bool = False
    shutdown_delay: float = 5.0
    poll_interval: float = 2.0
    template_timeout: float = 2.0
    sync_timeout: float = 60.0
    review_cache: bool = True
    max_connections: int = 256
    idle_timeout: float = 30.0  # waiting for a request's headers (first or next)
    body_timeout: float = 10.0  # reading one request body
    handshake_timeout: float = 10.0
    # Mutate: all template creation must end this long after the request arrived, well inside the
    # API server's timeout for the mutating webhook (2 s in the bundle).
    mutate_deadline: float = 1.5
    # Ready again only while no watch has been broken longer than this.
    watch_stale_after: float = 60.0
    inject_ca_bundle: str | None = None  # keep this CA bundle in the webhook configurations' caBundle
    webhook_config: str = "draguard"
    # Exact budgets across replicas (webhook/server/ledger.py); None: budgets from this replica's caches.
    quota_ledger_namespace: str | None = None
    quota_timeout: float = 1.5


_LABEL_KINDS = frozenset({k for _g, k in admission.POD_KINDS} | admission.DRA_KINDS | {"unknown"})
_LABEL_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT", "unknown"})


def label_kind(kind: str) -> str:
    """A metric label value from a closed set: a caller can send any kind."""
    return kind if kind in _LABEL_KINDS else "other"


def label_operation(operation: str) -> str:
    return operation if operation in _LABEL_OPERATIONS else "other"


def _template_devices(tmpl: Mapping[str, Any]) -> int:
    """Devices a generated ResourceClaimTemplate asks for: each request's exact count, or for a
    `firstAvailable` list the largest of its choices (the scheduler may pick any of them)."""
    spec = ((tmpl.get("spec") or {}).get("spec") or {}).get("devices") or {}
    total = 0

    def count_of(req: Mapping[str, Any]) -> int:
        count = req.get("count", 1)
        return count if isinstance(count, int) and count > 0 else 1

    for r in spec.get("requests") or []:
        if not isinstance(r, Mapping):
            continue
        choices = r.get("firstAvailable")
        if isinstance(choices, list) and choices:
            total += max(count_of(c) if isinstance(c, Mapping) else 1 for c in choices)
            continue
        inner = r.get("exactly")
        total += count_of(inner if isinstance(inner, Mapping) else r)
    return total


class _Answer(web.Response):
    """An admission answer that runs `after` (its bookkeeping) once, when its bytes have been
    handed to the transport, or when `settle` is called first."""

    def __init__(self, body: bytes, after: Callable[[], None]) -> None:
        super().__init__(body=body, content_type="application/json")
        self._after: Callable[[], None] | None = after

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            await super().write_eof(data)
        finally:
            self.settle()

    def settle(self) -> None:
        after, self._after = self._after, None
        if after is not None:
            after()


class TemplateCreator(Protocol):
    def ensure(self, tmpl: Mapping[str, Any], timeout: float) -> str: ...


class PolicyWatcher:
    """Polls the policy directory (a mounted ConfigMap swaps its `..data` symlink) for changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sig: tuple[Any, ...] | None = None
        self.last_error: str | None = None

    def signature(self) -> tuple[Any, ...]:
        p = self.path
        try:
            if p.is_file():
                st = p.stat()
                return ((p.name, st.st_ino, st.st_mtime_ns, st.st_size),)
            entries: list[Any] = []
            data = p / "..data"
            if data.is_symlink():
                entries.append(("..data", os.readlink(data)))
            for child in sorted(p.rglob("*")):
                rel = child.relative_to(p)
                if any(part.startswith(".") for part in rel.parts):
                    continue  # ConfigMap internals; the visible links resolve into them
                try:
                    st = child.stat()
                except OSError:
                    continue
                entries.append((str(rel), st.st_ino, st.st_mtime_ns, st.st_size))
            return tuple(entries)
        except OSError as e:
            return (("error", str(e)),)

    def changed(self) -> bool:
        return self.signature() != self._sig

    def load(self) -> Any:
        """Load the policy set (raises PolicyError / OSError); remembers the signature it saw."""
        from ..policy.load import load_policies

        sig = self.signature()
        policies = load_policies(self.path)
        self._sig = sig
        self.last_error = None
        return policies

    def reject(self) -> None:
        # Don't retry the same broken content every tick; a new change is tried again.
        self._sig = self.signature()


class Webhook:
    """State and handlers of one webhook server."""

    def __init__(
        self,
        opts: ServeOptions,
        metrics: Metrics | None = None,
        creator: TemplateCreator | None = None,
    ) -> None:
        self.opts = opts
        self.metrics = metrics or Metrics()
        self.creator = creator
        self.snapshot = Snapshot(policies=None)
        self.policies_loaded = False
        self.caches_synced = False
        self.draining = False
        self.inflight = 0
        self.watcher = PolicyWatcher(opts.policies)
        self.cache: Any = None
        self.lookup_http: Any = None  # set with the caches; None without a cluster (--no-watch)
        self.rebuilder: Any = None
        self._caches_started: float | None = None
        self.ledger: Any = None
        self.arrivals = NamespaceArrivals(lambda: self.snapshot)
        self.tls: Any = None
        self.site: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="draguard-api")
        self._dra_stats = DraStats()
        self.review_cache: admission.ReviewCache | None = (
            admission.ReviewCache() if opts.review_cache else None
        )
        self.cel_rate = admission.CelRate()
        self._big_bodies = asyncio.Semaphore(BIG_BODIES)
        self._review_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=BIG_BODIES, thread_name_prefix="draguard-review"
        )
        self.metrics.bind(lambda: self._dra_stats, self._cache_states)

    # --- state -----------------------------------------------------------------------------------

    def _cache_states(self) -> Mapping[str, tuple[bool, int]]:
        return self.cache.states() if self.cache is not None else {}

    @property
    def ready(self) -> bool:
        return self.policies_loaded and self.caches_synced and not self.draining and not self._stale()

    def _stale(self) -> list[str]:
        """Watches broken for longer than `watch_stale_after` (their caches may be far behind)."""
        if self.cache is None:
            return []
        stale: list[str] = self.cache.broken_for(self.opts.watch_stale_after)
        return stale

    def load_policies(self, first: bool = False) -> bool:
        """(Re)load policies; on error keep the last good set. True when a new set took effect."""
        from ..policy.load import PolicyError

        try:
            policies = self.watcher.load()
        except (PolicyError, OSError, ValueError) as e:
            self.watcher.reject()
            self.watcher.last_error = str(e)
            self.metrics.policy_reload_failures.inc()
            log.error(
                "policy change rejected; keeping the last good set" if not first else "policies invalid",
                extra={"path": str(self.opts.policies), "reason": str(e)},
            )
            return False
        if not first:
            from .usage import warm

            # Runs off the loop (see _policy_loop): the first review under the new set does not pay
            # for its set-up (CEL programs, per-policy class matches).
            warm(self.snapshot.inventory, policies)
        self.snapshot = replace(self.snapshot, policies=policies, generation=self.snapshot.generation + 1)
        self.policies_loaded = True
        self.metrics.policy_reloads.inc()
        self.metrics.policy_rules.set(len(policies))
        log.info("policies loaded", extra={"path": str(self.opts.policies), "documents": len(policies)})
        if self.rebuilder is not None:
            self.rebuilder.poke()  # quota usage depends on the policies
        return True

    def set_inventory(self, inventory: Inventory) -> None:
        self.snapshot = replace(self.snapshot, inventory=inventory, generation=self.snapshot.generation + 1)
        self.metrics.inventory_devices.set(len(inventory.devices))

    def publish_view(self, view: Any) -> None:
        """Swap in a rebuilt cache view (called on the event loop)."""
        self.snapshot = replace(
            self.snapshot,
            inventory=view.inventory,
            namespace_labels=view.namespace_labels,
            usage=view.usage,
            templates=view.templates,
            served_versions=frozenset(self.cache.served) & ALL_RESOURCE_VERSIONS
            if self.cache is not None
            else self.snapshot.served_versions,
            generation=self.snapshot.generation + 1,
        )
        self._dra_stats = view.stats
        self.arrivals.published()
        if not self.caches_synced:
            self.caches_synced = True
            extra: dict[str, Any] = {"devices": len(view.inventory.devices)}
            if self._caches_started is not None:
                # Start-up on a large cluster, split: the lists, then the first rebuild's CPU.
                took = time.monotonic() - self._caches_started
                self.metrics.cache_sync_duration.set(took)
                extra["seconds"] = round(took, 3)
                extra["list_seconds"] = {
                    n: round(r.list_seconds, 3)
                    for n, r in self.cache.reflectors.items()
                    if r.list_seconds is not None
                }
                if self.rebuilder is not None and self.rebuilder.last_cpu is not None:
                    extra["first_build_cpu_seconds"] = round(self.rebuilder.last_cpu, 3)
            log.info("caches synced", extra=extra)

    # --- HTTP ------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        """The serving port: admission, /healthz and /readyz (they disclose nothing), and /metrics
        unless a probe port serves it. With --client-ca every request here needs the API server's
        client certificate."""
        @web.middleware
        async def authorised(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            return await self._authorised(request, handler)

        # Without --client-name there is nothing to check per request: no middleware to run.
        middlewares = [authorised] if self.opts.client_names else []
        app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
        app.router.add_post("/validate", self._validate)
        app.router.add_post("/mutate", self._mutate)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if not self.opts.probe_port:
            app.router.add_get("/metrics", self._metrics)
        return app

    def build_probe_app(self) -> web.Application:
        """The probe port (plain HTTP): kubelet probes and Prometheus, never admission."""
        app = web.Application(client_max_size=1024)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _authorised(
        self, req: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.opts.client_names:
            from .tls import peer_names

            names = peer_names(req.transport.get_extra_info("peercert") if req.transport else None)
            if not names & set(self.opts.client_names):
                self.metrics.bad_requests.labels("client-name").inc()
                log.warning("client certificate name not allowed", extra={"names": sorted(names)[:8]})
                return web.json_response(
                    {
                        "error": "client certificate name is not allowed (--client-name)",
                        "reason": "client-name",
                    },
                    status=403,
                )
        resp: web.StreamResponse = await handler(req)
        return resp

    async def _healthz(self, _req: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _req: web.Request) -> web.Response:
        if self.ready:
            return web.Response(text="ok\n")
        why = []
        if self.draining:
            why.append("shutting down")
        if not self.policies_loaded:
            why.append(f"policies not loaded ({self.watcher.last_error or 'pending'})")
        if not self.caches_synced:
            states = self._cache_states()
            pending = [n for n, (ok, _c) in states.items() if not ok]
            why.append("caches not synced" + (f": {', '.join(sorted(pending))}" if pending else ""))
        stale = self._stale()
        if stale:
            why.append(
                f"watch broken for over {self.opts.watch_stale_after:g} s: {', '.join(sorted(stale))}"
            )
        return web.Response(status=503, text="not ready: " + "; ".join(why) + "\n")

    async def _metrics(self, _req: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def _validate(self, req: web.Request) -> web.Response:
        return await self._handle("validate", req)

    async def _mutate(self, req: web.Request) -> web.Response:
        return await self._handle("mutate", req)

    def _bad(self, status: int, reason: str, message: str) -> web.Response:
        self.metrics.bad_requests.labels(reason).inc()
        log.warning(
            "bad admission request", extra={"status": status, "reason": reason, "detail": message[:300]}
        )
        return web.json_response({"error": message, "reason": reason}, status=status)

    async def _handle(self, endpoint: str, req: web.Request) -> web.Response:
        t0 = time.perf_counter()
        self.inflight += 1
        try:
            length = req.content_length
            if length is not None and length > MAX_BODY:
                return self._bad(413, "too-large", f"request body of {length} bytes exceeds 3 MiB")
            # The body's time runs from here, before any wait for a big-body slot: a body that
            # stalls leaves the queue, and its slot, when its time is up, so stalled bodies cannot
            # line up to hold the slots one after another.
            deadline = asyncio.get_running_loop().time() + self.opts.body_timeout
            if length is None or length > BIG_BODY:
                # A large body costs several times its size while it is parsed and reviewed: only
                # a few at once, so concurrency cannot multiply that.
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._big_bodies.acquire()
                except TimeoutError:
                    return self._body_timeout()
                try:
                    return await self._review_body(endpoint, req, t0, deadline)
                finally:
                    self._big_bodies.release()
            return await self._review_body(endpoint, req, t0, deadline)
        finally:
            self.inflight -= 1

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a review worker thread, in a copy of this request's context.

        A big object takes tens of milliseconds to parse and judge: on the event loop every small
        review would wait behind it. On a worker the loop keeps its turn (the interpreter switches
        threads every few milliseconds), so small reviews are answered meanwhile. At most BIG_BODIES
        run at once (the semaphore in `_review`), as many as the pool has workers."""
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._review_pool, functools.partial(ctx.run, fn, *args))

    def _body_timeout(self) -> web.Response:
        return self._bad(
            408, "body-timeout", f"request body not received within {self.opts.body_timeout:g} s"
        )

    async def _review_body(self, endpoint: str, req: web.Request, t0: float, deadline: float) -> web.Response:
        try:
            content = req.content
            if content.is_eof():
                # The whole body is buffered already (it came with the headers): take it as it is,
                # no timer and no read loop. Its size is still checked (a chunked body has no length).
                body = content.read_nowait()
                if len(body) > MAX_BODY:
                    raise web.HTTPRequestEntityTooLarge(MAX_BODY, len(body))
            else:
                async with asyncio.timeout_at(deadline):
                    body = await req.read()
        except web.HTTPRequestEntityTooLarge:
            return self._bad(413, "too-large", "request body exceeds 3 MiB")
        except TimeoutError:
            return self._body_timeout()
        big = len(body) > BIG_BODY
        try:
            parse = admission.parse_review
            request = await self._off_loop(parse, body) if big else parse(body)
        except ReviewError as e:
            return self._bad(e.status, e.reason, e.message)
        snap = self.snapshot
        if snap.policies is None:
            # Not ready; the API server's failurePolicy decides. Never guess a verdict.
            return self._bad(503, "not-ready", "draguard has no valid policy set loaded yet")
        cache = self.review_cache
        scope = scope_of(request)
        if self.rebuilder is not None:
            # What this caller had admitted a moment ago and the watch has not reported yet
            # (see overlay.py): laid over its own requests only.
            view = self.rebuilder.view_for(scope)
            if view is not None:
                snap = replace(snap, inventory=view.inventory, usage=view.usage)
                cache = None  # short-lived and per caller: not worth caching
        key = admission.ReviewCache.key(endpoint, request, snap.generation) if cache is not None else None
        uid = str(request["uid"])
        if cache is not None and key is not None:
            hit = cache.get(key)
            if hit is not None and not (hit.outcome.generated and endpoint == "mutate"):
                outcome, hit_body = hit.render(uid)
                return self._answer(hit_body, endpoint, outcome, t0, cached=True)
        new_ns = endpoint == "validate" and self.caches_synced
        if new_ns and self.arrivals.unseen(request.get("namespace"), snap):
            # A namespace created a moment ago: its labels scope the policies and the tier rule reads
            # in it, so wait briefly for the watch to show it rather than judge without them.
            fresh = await self.arrivals.seen(str(request.get("namespace")), NAMESPACE_WAIT_S)
            if fresh is not None:
                snap = replace(snap, namespace_labels=fresh.namespace_labels)
        looked = await self._lookups(endpoint, request, snap)
        allowance = self.cel_rate.allowance(scope)
        if big:
            outcome = await self._off_loop(admission.review, endpoint, request, snap, allowance, looked)
        else:
            outcome = admission.review(endpoint, request, snap, allowance, looked)
        if outcome.cel_bytes:
            self.cel_rate.charge(scope, outcome.cel_bytes)
        if endpoint == "validate" and self.ledger is not None:
            group = self.ledger.group_for(request, snap)
            if group is not None:
                # The quota ledger's wait on the API server, bounded by --quota-timeout.
                outcome = await self.ledger.admit(group, request, snap, outcome)
                cache = None  # this verdict depends on the ledger, not on the snapshot alone
        if endpoint == "validate" and self.rebuilder is not None:
            # An admitted template/claim/class: visible to this caller's next request before
            # the watch has it.
            self.rebuilder.admitted(request, outcome)
        payload: bytes | None = None
        if cache is not None and key is not None and not looked:  # a lookup's verdict holds only for now
            entry = cache.put(key, outcome)
            if entry is not None and not outcome.generated:
                payload = entry.render_bytes(uid)  # serialised once, for the cache and the reply
        if outcome.generated and endpoint == "mutate":
            outcome = await self._ensure_generated(outcome, t0 + self.opts.mutate_deadline)
        if payload is None:
            payload = admission.serialise(outcome)
        return self._answer(payload, endpoint, outcome, t0, cached=False)

    def _answer(
        self, payload: bytes, endpoint: str, outcome: Outcome, t0: float, cached: bool
    ) -> web.Response:
        """The answer, with its bookkeeping (metrics, the log line) run once aiohttp has handed its
        bytes to the socket: the API server waits for the answer, not for the bookkeeping. On a
        machine whose CPUs the API server and etcd share, the log line and metrics are about a tenth
        of the webhook's own time per call, most of it cache misses (docs/performance.md). The
        histogram's time is taken here, once the answer is serialised (before, just ahead of that)."""
        seconds = time.perf_counter() - t0
        resp = _Answer(payload, functools.partial(self._safe_account, endpoint, outcome, seconds, cached))
        # If aiohttp never writes the answer (the client went away first), the bookkeeping still
        # runs, on the loop's next turn; `settle` runs it once, whichever comes first.
        asyncio.get_running_loop().call_soon(resp.settle)
        return resp

    async def _lookups(self, endpoint: str, request: Mapping[str, Any], snap: Snapshot) -> Any:
        """What the tier rule needs from the API server for this request (webhook/server/lookups.py)."""
        if endpoint != "validate" or self.lookup_http is None:
            return None
        from . import lookups

        wants = lookups.wanted(request, snap)
        if not wants:
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lookups.fetch, self.lookup_http, wants, snap)

    def _template_limit(self) -> int:
        """The most devices one node of the inventory has (a pod cannot use more)."""
        inventory = self.snapshot.inventory

        def most() -> int:
            per_node: dict[str | None, int] = {}
            for d in inventory.devices:
                per_node[d.node] = per_node.get(d.node, 0) + 1
            return max(per_node.values()) if per_node else MAX_TEMPLATE_DEVICES_UNKNOWN

        return inventory.cached(("draguard.server", "devices-per-node"), most)

    async def _ensure_generated(self, outcome: Outcome, deadline: float) -> Outcome:
        """Create (or find) the ResourceClaimTemplates the patch refers to; else withdraw the patch.
        Everything ends by `deadline` (perf_counter time): the API server has given up after it."""
        if outcome.dry_run:
            return outcome  # nothing is persisted; neither may we
        snap = self.snapshot
        limit = self._template_limit()
        for g in outcome.generated:
            wanted = _template_devices(g)
            if wanted > limit:
                # The count is written by whoever sends the pod: a template per count would let
                # anyone make the webhook create any number of objects. No node has this many.
                self.metrics.generated.labels("too-many-devices").inc()
                return admission.without_patch(
                    outcome, f"{wanted} devices per pod is more than any node has ({limit})"
                )
            tmpl = dict(g)
            meta = dict(tmpl.get("metadata") or {})
            meta.setdefault("namespace", outcome.namespace)
            labels = dict(meta.get("labels") or {})
            labels.setdefault("app.kubernetes.io/managed-by", "draguard")
            meta["labels"] = labels
            tmpl["metadata"] = meta
            tmpl = self._served_version(tmpl)
            key = (str(meta["namespace"]), str(meta.get("name") or ""))
            existing = snap.templates.get(key)
            if existing is not None:
                owner = ((existing.get("metadata") or {}).get("labels") or {}).get(
                    "app.kubernetes.io/managed-by"
                )
                if owner == "draguard":
                    self.metrics.generated.labels("reused").inc()
                    continue
                self.metrics.generated.labels("conflict").inc()
                return admission.without_patch(outcome, f"template {key[1]} exists, not managed by draguard")
            if self.creator is None:
                self.metrics.generated.labels("unavailable").inc()
                return admission.without_patch(
                    outcome,
                    f"no API access to create template {key[1]}",
                )
            loop = asyncio.get_running_loop()
            timeout = min(self.opts.template_timeout, deadline - time.perf_counter())
            if timeout <= 0.05:
                self.metrics.generated.labels("deadline").inc()
                return admission.without_patch(outcome, f"no time left to create template {key[1]}")
            try:
                result = await asyncio.wait_for(
                    loop.run_in_executor(self._pool, self.creator.ensure, tmpl, timeout), timeout
                )
            except Exception as e:
                self.metrics.generated.labels("failed").inc()
                log.warning(
                    "creating a migration template failed",
                    extra={
                        "uid": outcome.uid,
                        "template": "/".join(key),
                        "reason": f"{type(e).__name__}: {e}"[:300],
                    },
                )
                return admission.without_patch(
                    outcome,
                    f"template {key[1]} could not be created ({type(e).__name__})",
                )
            self.metrics.generated.labels(result if result in ("created", "exists") else "other").inc()
        return outcome

    def _safe_account(self, endpoint: str, o: Outcome, seconds: float, cached: bool) -> None:
        try:
            m = self.metrics
            (m.review_cache_hit if cached else m.review_cache_miss).add()
            self._account(endpoint, o, seconds)
        except Exception:  # bookkeeping must never cost the API server its answer
            log.exception("recording an admission outcome failed")

    def _served_version(self, tmpl: dict[str, Any]) -> dict[str, Any]:
        """The template in a resource.k8s.io version the cluster serves (the pod refers to it by name,
        so its version is free); unchanged when the cluster serves the engine's choice."""
        if self.cache is None:
            return tmpl
        api = str(tmpl.get("apiVersion") or "")
        group, _, version = api.rpartition("/")
        if version in self.cache.served or group != "resource.k8s.io":
            return tmpl
        from ..dra.objects import convert_claim_spec

        target = self.cache.dra_version
        inner = dict(tmpl.get("spec") or {})
        inner["spec"] = convert_claim_spec(inner.get("spec"), api, f"resource.k8s.io/{target}")
        return {**tmpl, "apiVersion": f"resource.k8s.io/{target}", "spec": inner}

    def _account(self, endpoint: str, o: Outcome, seconds: float) -> None:
        m = self.metrics
        # Kind and operation come from the request: only known values become label values.
        kind = o.kind if o.kind in _LABEL_KINDS else "other"
        operation = o.operation if o.operation in _LABEL_OPERATIONS else "other"
        kids = m.answered(endpoint, kind, operation, o.verdict)
        kids.latency.observe(seconds)
        kids.requests.add()
        if kids.ignored is not None:
            kids.ignored.add()
        for f in o.findings:
            m.found(f.rule, f.mode.value, endpoint).add()
        for r in o.internal_rules:
            m.rule_errors.labels(r, endpoint).inc()
        if o.patch:
            m.patches.labels("dry-run" if o.dry_run else "applied").inc()
        if o.verdict == "ignored" and not log.isEnabledFor(logging.DEBUG):
            return
        fields = {
            "uid": o.uid,
            "endpoint": endpoint,
            "kind": o.kind,
            "operation": o.operation,
            "namespace": o.namespace,
            # "object", not "name": LogRecord reserves "name" and logging would raise.
            "object": f"{o.kind}/{o.namespace + '/' if o.namespace else ''}{o.name}",
            "verdict": o.verdict,
            "dry_run": o.dry_run,
            "rules": sorted({f.rule for f in o.findings}),
            "ms": round(seconds * 1000, 3),
        }
        logs.emit(log, logging.DEBUG if o.verdict == "ignored" else logging.INFO, "admission", fields)

    # --- lifecycle -------------------------------------------------------------------------------

    async def start_background(self) -> None:
        """Policies, inventory or caches, reload loops. Raises on unusable start-up input."""
        self.load_policies(first=True)
        if self.opts.inventory:
            from ..dra.inventory import load_inventory

            self.set_inventory(load_inventory(self.opts.inventory))
        if self.opts.no_watch:
            from .usage import warm

            # Ready only once the first request will not pay for CEL set-up and class matching.
            await asyncio.get_running_loop().run_in_executor(
                None, warm, self.snapshot.inventory, self.snapshot.policies
            )
            self.caches_synced = True
        else:
            await self._start_caches()
        self._tasks.append(asyncio.create_task(self._policy_loop()))
        if bundle := self.opts.inject_ca_bundle:
            from .cainject import start_injector

            self.injector = start_injector(self.opts.kubeconfig, bundle, self.opts.webhook_config)
        if self.tls is not None:
            self._tasks.append(asyncio.create_task(self.tls.watch(self.opts.poll_interval)))

    async def _start_caches(self) -> None:
        from .caches import ClusterCache, KubeHttp, KubeTemplateCreator
        from .usage import Rebuilder

        loop = asyncio.get_running_loop()
        try:
            http = await loop.run_in_executor(None, KubeHttp.from_kubeconfig, self.opts.kubeconfig)
            self.cache = await loop.run_in_executor(None, ClusterCache.connect, http, self.metrics)
        except Exception as e:
            where = self.opts.kubeconfig or "in-cluster config / ~/.kube/config"
            raise ValueError(
                f"cannot watch the cluster ({where}): {type(e).__name__}: {e}; pass --kubeconfig, run in a "
                "cluster, or use --no-watch --inventory FILE"
            ) from e
        if self.creator is None:
            self.creator = KubeTemplateCreator(http)
        self.lookup_http = http

        def publish(view: Any) -> None:
            # Admissions recorded on the loop since the view was built are laid over it again there.
            loop.call_soon_threadsafe(lambda: self.publish_view(self.rebuilder.current(view)))

        self.rebuilder = Rebuilder(self.cache, self.metrics, publish, lambda: self.snapshot.policies)
        self._caches_started = time.monotonic()
        self.cache.start()
        self.rebuilder.start()
        if self.opts.quota_ledger_namespace:
            from .ledger import QuotaLedger

            self.ledger = QuotaLedger(
                http,
                self.opts.quota_ledger_namespace,
                timeout=self.opts.quota_timeout,
                claims=lambda: self.cache.objects("resourceclaims"),
                snapshot=lambda: self.snapshot,
                synced=lambda: self.caches_synced,
                arrivals=self.arrivals,
            )
            self._tasks.append(asyncio.create_task(self.ledger.run()))

    async def _policy_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.poll_interval)
            try:
                if self.watcher.changed():
                    # Parse off the loop: a large policy set must not stall admission.
                    await asyncio.get_running_loop().run_in_executor(None, self.load_policies)
            except Exception:
                log.exception("policy reload check failed")

    async def stop_background(self) -> None:
        if getattr(self, "injector", None) is not None:
            self.injector.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self.rebuilder is not None:
            self.rebuilder.stop()
        if self.cache is not None:
            self.cache.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._review_pool.shutdown(wait=False, cancel_futures=True)


async def serve(
    opts: ServeOptions,
    stop: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
    webhook: Webhook | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or `stop`): readiness goes false first, in-flight requests finish."""
    from .tls import ReloadingTls

    wh = webhook or Webhook(opts)
    if not (opts.tls_cert and opts.tls_key):
        raise ValueError(
            "--tls-cert and --tls-key are required (the API server only calls webhooks over TLS)"
        )
    def reloaded(ok: bool) -> None:
        wh.metrics.tls_reloads.labels("ok" if ok else "invalid").inc()
        if ok:
            wh.metrics.serving_certificate(wh.tls.not_after)

    wh.tls = ReloadingTls(opts.tls_cert, opts.tls_key, opts.client_ca, on_reload=reloaded)
    wh.metrics.serving_certificate(wh.tls.not_after)
    await wh.start_background()
    # What start-up loaded (modules, policies, a --inventory file) lives as long as the process: keep
    # the cyclic GC from rescanning it on the request path. Only once: views rebuilt later from the
    # caches must stay collectable (memos can hold cycles back to their inventory).
    gc.freeze()
    from .listen import GuardedSite, quiet_disconnects

    loop = asyncio.get_running_loop()
    quiet_disconnects(loop)
    runner = web.AppRunner(
        wh.build_app(),
        handle_signals=False,
        access_log=None,
        shutdown_timeout=max(opts.shutdown_delay, 1.0) + 25.0,
        # Also runs before the first request: a client that never completes its headers goes.
        keepalive_timeout=opts.idle_timeout,
        max_line_size=8190,
        max_field_size=8190,
        max_headers=64,
    )
    await runner.setup()

    def dropped(why: str) -> None:
        wh.metrics.connections_dropped.labels(why).inc()

    site = GuardedSite(
        runner,
        opts.host,
        opts.port,
        ssl_context=wh.tls.context,
        max_connections=opts.max_connections,
        handshake_timeout=opts.handshake_timeout,
        on_drop=dropped,
    )
    await site.start()
    wh.site = site
    probe_runner: web.AppRunner | None = None
    if opts.probe_port:
        probe_runner = web.AppRunner(
            wh.build_probe_app(), handle_signals=False, access_log=None, keepalive_timeout=opts.idle_timeout
        )
        await probe_runner.setup()
        probe_site = GuardedSite(probe_runner, opts.host, opts.probe_port, max_connections=32)
        await probe_site.start()
    host = opts.host or "* (IPv4 and IPv6)"
    log.info(
        "serving",
        extra={
            "host": host,
            "port": opts.port,
            "probe_port": opts.probe_port or None,
            "client_ca": bool(opts.client_ca),
            "client_names": list(opts.client_names),
        },
    )
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if started is not None:
        started.set()
    await stop.wait()
    wh.draining = True
    log.info(
        "shutting down: readiness false, waiting for endpoints to drop this pod",
        extra={"delay_s": opts.shutdown_delay},
    )
    await asyncio.sleep(opts.shutdown_delay)
    await site.stop()  # no new connections
    # Let requests already being read or evaluated finish before connections are closed.
    deadline = time.monotonic() + 25.0
    while wh.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await runner.cleanup()
    if probe_runner is not None:
        await probe_runner.cleanup()
    await wh.stop_background()
    wh.tls.close()
    log.info("stopped")
    return 0
