"""Requests for a namespace the namespace watch has not shown yet.

`kubectl apply` of a new namespace and what goes in it sends the namespace and, milliseconds later,
its claims and pods; the resourceclaim controller and the scheduler make claims as fast. A review
judged before this replica's watch shows the namespace has no labels to scope policies by and no
namespace to read the tier rule's lookups in. Such a request waits, briefly and bounded, for the
next published cache view that shows it.

A forged review may name a namespace that will never exist: it waits too, holding only its own
connection, and at most `MAX_WAITERS` wait at once; past that a request goes on without waiting.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

from .admission import Snapshot

MAX_WAITERS = 64
# Re-read the snapshot at least this often while waiting, for callers whose views are swapped in
# without `published` (tests, a ledger used on its own).
RECHECK_S = 0.25
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class NamespaceArrivals:
    """Wakes the requests waiting for a namespace when a cache view that shows it is published."""

    def __init__(self, snapshot: Callable[[], Snapshot], max_waiters: int = MAX_WAITERS) -> None:
        self.snapshot = snapshot
        self.max_waiters = max_waiters
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._count = 0
        self.stats = {"waited": 0, "seen": 0, "gave_up": 0, "over_limit": 0}

    def unseen(self, namespace: object, snap: Snapshot) -> bool:
        """Whether `namespace` is a valid name the (running) namespace watch does not show."""
        return (
            bool(snap.namespace_labels)  # an empty map: no watch here, nothing will arrive
            and isinstance(namespace, str)
            and _NAMESPACE.fullmatch(namespace) is not None
            and namespace not in snap.namespace_labels
        )

    @property
    def waiting(self) -> int:
        return self._count

    async def seen(self, namespace: str, timeout: float) -> Snapshot | None:
        """A snapshot that shows `namespace`, waited for up to `timeout` seconds; None if none came."""
        snap = self.snapshot()
        if namespace in snap.namespace_labels:
            return snap
        if self._count >= self.max_waiters or timeout <= 0:
            self.stats["over_limit" if timeout > 0 else "gave_up"] += 1
            return None
        self._count += 1
        self.stats["waited"] += 1
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stats["gave_up"] += 1
                    return None
                fut: asyncio.Future[None] = loop.create_future()
                waiters = self._waiting.setdefault(namespace, [])
                waiters.append(fut)
                try:
                    await asyncio.wait_for(fut, min(left, RECHECK_S))
                except TimeoutError:
                    pass
                finally:
                    if fut in waiters:
                        waiters.remove(fut)
                    if not waiters and self._waiting.get(namespace) is waiters:
                        del self._waiting[namespace]
                snap = self.snapshot()
                if namespace in snap.namespace_labels:
                    self.stats["seen"] += 1
                    return snap
        finally:
            self._count -= 1

    def published(self) -> None:
        """A new view was swapped in: wake whoever waits for a namespace it shows (on the loop)."""
        if not self._waiting:
            return
        labels = self.snapshot().namespace_labels
        for ns in [ns for ns in self._waiting if ns in labels]:
            for fut in self._waiting.pop(ns):
                if not fut.done():
                    fut.set_result(None)
