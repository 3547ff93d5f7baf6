"""Requests for a namespace created a moment ago wait for the watch to show it, bounded."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from webhook.server.admission import Snapshot
from webhook.server.namespaces import NamespaceArrivals

KNOWN = Snapshot(policies=None, namespace_labels={"default": {}})


class Views:
    """The webhook's current snapshot, swapped as publish_view swaps it."""

    def __init__(self) -> None:
        self.snap = KNOWN

    def show(self, ns: str, labels: dict[str, str]) -> None:
        self.snap = replace(self.snap, namespace_labels={**self.snap.namespace_labels, ns: labels})


def test_only_valid_names_a_running_watch_lacks_are_waited_for() -> None:
    arrivals = NamespaceArrivals(lambda: KNOWN)
    assert arrivals.unseen("team-a", KNOWN)
    assert not arrivals.unseen("default", KNOWN)
    for forged in ("", "Team-A", "a" * 64, "../x", None, 7):
        assert not arrivals.unseen(forged, KNOWN), forged
    # No namespace watch (offline, --no-watch): nothing will ever arrive, so nobody waits.
    assert not arrivals.unseen("team-a", Snapshot(policies=None))


async def test_a_waiter_wakes_with_the_view_that_shows_its_namespace() -> None:
    views = Views()
    arrivals = NamespaceArrivals(lambda: views.snap)
    waiter = asyncio.create_task(arrivals.seen("team-a", timeout=60))
    while arrivals.waiting == 0:
        await asyncio.sleep(0)
    views.show("other", {})
    arrivals.published()
    await asyncio.sleep(0)
    assert not waiter.done()  # another namespace's arrival does not wake it
    views.show("team-a", {"draguard.io/tier": "prod"})
    arrivals.published()
    got = await asyncio.wait_for(waiter, 30)
    assert got is not None and got.namespace_labels["team-a"] == {"draguard.io/tier": "prod"}
    assert arrivals.waiting == 0 and arrivals.stats["seen"] == 1


async def test_a_namespace_that_never_comes_gives_up_and_leaves_nothing_behind() -> None:
    arrivals = NamespaceArrivals(lambda: KNOWN)
    assert await arrivals.seen("never-created", timeout=0.3) is None
    assert arrivals.waiting == 0 and arrivals.stats["gave_up"] == 1
    assert arrivals._waiting == {}


async def test_forged_reviews_cannot_hold_more_than_the_bound() -> None:
    views = Views()
    arrivals = NamespaceArrivals(lambda: views.snap, max_waiters=3)
    held = [asyncio.create_task(arrivals.seen(f"forged-{i}", timeout=60)) for i in range(3)]
    while arrivals.waiting < 3:
        await asyncio.sleep(0)
    # Past the bound a request goes on at once, without waiting.
    assert await arrivals.seen("one-more", timeout=60) is None
    assert arrivals.stats["over_limit"] == 1
    for i in range(3):
        views.show(f"forged-{i}", {})
    arrivals.published()
    assert all(r is not None for r in await asyncio.wait_for(asyncio.gather(*held), 30))
    assert arrivals.waiting == 0


async def test_a_view_swapped_without_publishing_is_still_noticed() -> None:
    views = Views()
    arrivals = NamespaceArrivals(lambda: views.snap)
    waiter = asyncio.create_task(arrivals.seen("team-b", timeout=60))
    while arrivals.waiting == 0:
        await asyncio.sleep(0)
    views.show("team-b", {})  # a ledger used on its own: nobody calls published()
    got = await asyncio.wait_for(waiter, 30)
    assert got is not None and "team-b" in got.namespace_labels
