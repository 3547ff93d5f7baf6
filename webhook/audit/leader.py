"""Leader election for the audit on a `coordination.k8s.io/v1` Lease, so that of its replicas exactly
one scans and writes PolicyReports while the others wait, ready to take over.

The protocol is the one Kubernetes' own controllers use (client-go's leaderelection), rebuilt on the
raw JSON client the audit already has:

- The Lease names its holder (`holderIdentity`), how long a renewal holds (`leaseDurationSeconds`),
  when it was last renewed and acquired, and how many times it changed hands (`leaseTransitions`).
- Every write is an update carrying the `resourceVersion` that was read, so two replicas racing for
  the same Lease cannot both win: the API server refuses the second with 409 Conflict.
- Expiry is judged on each replica's own monotonic clock, never by comparing `renewTime` with the
  local wall clock (the replicas' clocks may disagree): a replica that sees the record unchanged for
  `leaseDurationSeconds` takes it over.
- The leader counts itself leader only until `renew_deadline` after the *start* of its last
  successful renewal. The renewal was stored after it started, and any other replica saw it after
  it was stored, so the leader stops counting itself leader at least `lease_duration -
  renew_deadline` before any other replica may take over: never two active scanners, as long as
  the replicas' clocks run at about the same rate.
- On shutdown the leader, after it has stopped writing, empties `holderIdentity`; the others then
  take over at their next retry instead of waiting for the lease to expire.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..server.caches import ApiError, KubeHttp

log = logging.getLogger("draguard.audit")

LEASE_NAME = "draguard-audit"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# leaseDurationSeconds as another writer left it is obeyed within these bounds: a hostile or broken
# record cannot make a replica wait forever, nor take over a lease renewed a moment ago.
MIN_DURATION, MAX_DURATION = 1, 3600
MAX_IDENTITY = 256  # characters of a holder's identity kept (for the log) and compared
MAX_TRANSITIONS = 2**31 - 1  # an int32 in the API


def default_identity() -> str:
    """The pod's name (the downward API's POD_NAME, else the host name) and a random suffix: a
    restarted pod of the same name is a new candidate, never mistaken for the one that held it."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "draguard-audit"
    return f"{base[:200]}_{uuid.uuid4().hex[:10]}"


def default_namespace() -> str:
    """The namespace the pod runs in (POD_NAMESPACE, else the service account's), else draguard-system."""
    ns = os.environ.get("POD_NAMESPACE", "").strip()
    if ns:
        return ns
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as f:
            ns = f.read(256).strip()
    except OSError:
        ns = ""
    return ns or "draguard-system"


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str = "draguard-system"
    name: str = LEASE_NAME
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0  # how long a follower waits after the last renewal it saw
    renew_deadline: float = 10.0  # how long the leader goes on without a successful renewal
    retry_period: float = 2.0  # between attempts (renewals while leading)

    def problem(self) -> str | None:
        """Why these settings cannot keep two leaders apart, or None."""
        if not self.namespace or not self.name or not self.identity:
            return "the lease namespace, name and identity must not be empty"
        if not MIN_DURATION <= self.lease_duration <= MAX_DURATION:
            return f"the lease duration must be between {MIN_DURATION} and {MAX_DURATION} s"
        if self.retry_period <= 0:
            return "the retry period must be positive"
        if self.renew_deadline >= self.lease_duration:
            return (
                f"the renew deadline ({self.renew_deadline:g} s) must be shorter than the lease duration "
                f"({self.lease_duration:g} s), or a leader that lost the lease could still be writing when "
                "another takes over"
            )
        # Jittered retries come up to 1.2 retry periods apart; the leader needs at least two tries per
        # deadline so that one slow request does not cost it the lease.
        if self.renew_deadline < 2 * 1.2 * self.retry_period:
            return (
                f"the renew deadline ({self.renew_deadline:g} s) must be at least 2.4 retry periods "
                f"({self.retry_period:g} s), so that the leader gets two tries to renew"
            )
        return None


@dataclass(frozen=True)
class Record:
    """What a Lease's spec says, read defensively (the object is anyone's who may update Leases)."""

    holder: str
    duration: float
    transitions: int
    acquire_time: str | None

    @classmethod
    def of(cls, lease: Any, default_duration: float) -> Record:
        spec = lease.get("spec") if isinstance(lease, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        holder = spec.get("holderIdentity")
        dur = spec.get("leaseDurationSeconds")
        trans = spec.get("leaseTransitions")
        acq = spec.get("acquireTime")
        duration = (
            float(min(max(dur, MIN_DURATION), MAX_DURATION))
            if isinstance(dur, int) and not isinstance(dur, bool)
            else default_duration
        )
        return cls(
            holder=holder[:MAX_IDENTITY] if isinstance(holder, str) else "",
            duration=duration,
            transitions=(
                min(max(trans, 0), MAX_TRANSITIONS)
                if isinstance(trans, int) and not isinstance(trans, bool)
                else 0
            ),
            acquire_time=acq if isinstance(acq, str) and len(acq) <= 64 else None,
        )


def _dict(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def micro_time(at: float) -> str:
    """A metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's candidacy. `run` (in a thread of its own, so that a long scan never delays a
    renewal) tries to acquire or renew every retry period; `is_leader()` answers from the clock alone,
    so leadership lapses at the deadline even when the thread is stuck in a request."""

    def __init__(
        self,
        http: KubeHttp,
        cfg: LeaseConfig,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.http = http
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.on_change = on_change
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{cfg.namespace}/leases/{cfg.name}"
        self.lock = threading.Lock()
        self._until = float("-inf")  # leader while clock() < this
        self._seen: tuple[str, str] | None = None  # (resourceVersion, holder) last read or written
        self._seen_at = float("-inf")  # when that record was first seen (local clock)
        self._seen_duration = cfg.lease_duration
        self._contact = float("-inf")  # the last answer from the API server, of any kind
        self._reported = False  # the leadership last told to on_change
        self.holder = ""  # who holds the lease, as last seen
        self.acquired_at: float | None = None  # local clock, when this replica last became leader
        self.lost_at: float | None = None  # local clock, when it last stopped counting itself leader
        self.stats = {"acquired": 0, "renewed": 0, "conflicts": 0, "errors": 0, "released": 0}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Each request gives up well before the deadline, so that a hung connection leaves time to retry.
        self._timeout = max(0.5, min(5.0, (cfg.renew_deadline - cfg.retry_period) / 2))

    # --- what the controller asks -------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.clock() < self._until

    def deadline(self) -> float:
        """The local clock's time at which this replica stops counting itself leader (-inf: follower)."""
        return self._until

    def healthy(self) -> bool:
        """The API server answered within a lease duration: a follower that can take over."""
        return self.clock() - self._contact < self.cfg.lease_duration

    # --- one attempt --------------------------------------------------------------------------

    def try_once(self) -> bool:
        """One acquire-or-renew attempt; whether this replica leads afterwards."""
        with self.lock:
            try:
                # A conflict means someone else wrote the lease between our read and write: read it
                # again at once, so that a lease taken over is noticed now, not a retry period later.
                for _ in range(2):
                    if not self._attempt():
                        break
            except ApiError as e:
                self._contact = self.clock()
                self.stats["errors"] += 1
                log.warning(
                    "leader election: the lease could not be read or written",
                    extra={"lease": self.path, "reason": str(e)[:300]},
                )
            except Exception as e:  # connection errors, timeouts, an unreadable body
                self.stats["errors"] += 1
                log.warning(
                    "leader election: the API server did not answer",
                    extra={"lease": self.path, "reason": f"{type(e).__name__}: {e}"[:300]},
                )
            return self._report()

    def _attempt(self) -> bool:
        """Read the lease, then acquire or renew it when it is ours or free; True on a conflict."""
        start = self.clock()
        try:
            lease = self.http.get_json(self.path, timeout=self._timeout)
        except ApiError as e:
            if e.status != 404:
                raise
            self._contact = self.clock()
            return self._create(start)
        self._contact = self.clock()
        meta = _dict(lease.get("metadata"))
        rv = meta.get("resourceVersion")
        if not isinstance(rv, str) or not rv or len(rv) > 64:
            raise ApiError(500, "the lease has no usable resourceVersion")
        rec = Record.of(lease, self.cfg.lease_duration)
        self.holder = rec.holder
        if self._seen != (rv, rec.holder):
            # Timed from the answer, not the request: a read that began before the holder's renewal was
            # stored may still return it, and the expiry must not start before the renewal was seen.
            self._seen, self._seen_at, self._seen_duration = (rv, rec.holder), self.clock(), rec.duration
        mine = rec.holder == self.cfg.identity
        if rec.holder and not mine and self.clock() < self._seen_at + self._seen_duration:
            if self._until > start:
                log.warning("leader election: another replica holds the lease", extra={"holder": rec.holder})
            self._until = float("-inf")  # someone else holds it: stop at once, whatever the deadline
            return False
        spec = {
            "holderIdentity": self.cfg.identity,
            "leaseDurationSeconds": int(self.cfg.lease_duration),
            "renewTime": micro_time(self.wall()),
            "acquireTime": rec.acquire_time if mine and rec.acquire_time else micro_time(self.wall()),
            "leaseTransitions": rec.transitions if mine else min(rec.transitions + 1, MAX_TRANSITIONS),
        }
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace, "resourceVersion": rv},
            "spec": spec,
        }
        # Labels and annotations others put on the Lease are kept; nothing else of theirs is sent back.
        for k in ("labels", "annotations"):
            if isinstance(meta.get(k), dict):
                body["metadata"][k] = meta[k]
        try:
            out = self.http.request_json("PUT", self.path, body=body, timeout=self._timeout)
        except ApiError as e:
            if e.status != 409:
                raise
            # Written by someone else since it was read. Nothing of ours was stored; until the lease is
            # read again a leader keeps its deadline, which another replica's write cannot have moved.
            self._contact = self.clock()
            self.stats["conflicts"] += 1
            log.info("leader election: the lease changed while it was being written; reading it again")
            return True
        self._won(start, out, renewed=mine)
        return False

    def _create(self, start: float) -> bool:
        now = micro_time(self.wall())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
            "spec": {
                "holderIdentity": self.cfg.identity,
                "leaseDurationSeconds": int(self.cfg.lease_duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            out = self.http.request_json(
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{self.cfg.namespace}/leases",
                body=body,
                timeout=self._timeout,
            )
        except ApiError as e:
            if e.status != 409:
                raise
            self.stats["conflicts"] += 1  # another replica created it first: read theirs
            return True
        self._won(start, out, renewed=False)
        return False

    def _won(self, start: float, out: dict[str, Any], renewed: bool) -> None:
        self._contact = self.clock()
        rv = _dict(out.get("metadata")).get("resourceVersion")
        self._seen = (rv if isinstance(rv, str) else "", self.cfg.identity)
        self._seen_at, self._seen_duration = start, self.cfg.lease_duration
        self.holder = self.cfg.identity
        self._until = start + self.cfg.renew_deadline
        self.stats["renewed" if renewed else "acquired"] += 1

    def _report(self) -> bool:
        """Tell on_change (and the log) when leadership began or ended since last told."""
        now_leading = self.is_leader()
        if now_leading != self._reported:
            self._reported = now_leading
            if now_leading:
                self.acquired_at = self.clock()
                log.info("became the audit leader", extra={"identity": self.cfg.identity, "lease": self.path})
            else:
                self.lost_at = self.clock()
                log.warning(
                    "no longer the audit leader",
                    extra={"identity": self.cfg.identity, "holder": self.holder or None},
                )
            if self.on_change is not None:
                self.on_change(now_leading)
        return now_leading

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="audit-leader", daemon=True)
        self._thread.start()

    def run(self) -> None:
        while not self._stop.is_set():
            leading = self.try_once()
            wait = self.cfg.retry_period
            if not leading:  # followers spread their reads so they do not all arrive at once
                wait *= 1.0 + 0.2 * random.random()
            else:  # never sleep past the deadline: wake to notice (and report) a lapse on time
                wait = max(0.0, min(wait, self._until - self.clock()))
            if self._stop.wait(wait):
                break
        with self.lock:
            self._report()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop trying; the lease is left as it is (release() gives it up)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def release(self) -> bool:
        """Give the lease up, for a fast failover: only this replica's own record is emptied, and
        only with the resourceVersion it read, so a lease someone else took meanwhile is left alone.
        (It is released even past the renew deadline: what matters is that nothing is written any
        more, so call it only then.) True when released."""
        with self.lock:
            self._until = float("-inf")  # from here on nothing may be written, even if the PUT fails
            self._report()
            if self.holder != self.cfg.identity:
                return False  # a follower, as far as it last saw: no request at all
            try:
                lease = self.http.get_json(self.path, timeout=self._timeout)
                rv = _dict(lease.get("metadata")).get("resourceVersion")
                rec = Record.of(lease, self.cfg.lease_duration)
                if rec.holder != self.cfg.identity or not isinstance(rv, str):
                    return False
                now = micro_time(self.wall())
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.cfg.name,
                        "namespace": self.cfg.namespace,
                        "resourceVersion": rv,
                    },
                    "spec": {
                        "holderIdentity": "",
                        "leaseDurationSeconds": 1,
                        "acquireTime": now,
                        "renewTime": now,
                        "leaseTransitions": rec.transitions,
                    },
                }
                self.http.request_json("PUT", self.path, body=body, timeout=self._timeout)
            except Exception as e:  # the lease then expires on its own
                log.warning(
                    "leader election: the lease could not be released; it expires on its own",
                    extra={"reason": f"{type(e).__name__}: {e}"[:300]},
                )
                return False
            self.stats["released"] += 1
            self.holder = ""
            log.info("released the audit lease", extra={"identity": self.cfg.identity})
            return True
