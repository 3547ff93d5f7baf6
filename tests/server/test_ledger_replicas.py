"""Replicas sharing one quota ledger, each with a claim watch of its own, against a real kube-apiserver.

Each `QuotaLedger` here is one replica's: the same code `draguard serve` runs, its claim watch a list
the test refreshes from the API server (or leaves stale, as a lagging watch is). Reconcile passes are
run by hand, so every step happens in a known order and nothing waits on time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import ApiServer, running
from tests.server.conftest import review, seed_inventory
from webhook.policy.load import load_policies
from webhook.server import admission, ledger
from webhook.server.admission import Outcome, Snapshot
from webhook.server.caches import KubeHttp
from webhook.server.ledger import QuotaLedger, decode, ledger_name

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LEDGERS = "draguard-quota"
A100 = "gpu.nvidia.com-a100"
BUDGET = 8  # the shipped `team-*` budget of A100s
TTL = 10.0
POLICIES = load_policies(ROOT / "policies")
INVENTORY = seed_inventory()


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    with running("ledger") as server:
        namespace(server, LEDGERS)
        yield server


def namespace(server: ApiServer, name: str) -> str:
    server.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": name}})  # fmt: skip
    return name


class Watch:
    """One replica's claim watch: what the API server listed at the last `refresh`. As the webhook's
    reflector does, an object whose resourceVersion did not change stays the object it was (a watch
    delivers only what changed)."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.items: list[dict[str, Any]] = []

    def refresh(self) -> None:
        def key(o: dict[str, Any]) -> tuple[str, str, str]:
            m = o["metadata"]
            return m["namespace"], m["name"], m["resourceVersion"]

        kept = {key(o): o for o in self.items}
        listed = self.server.request("GET", "/apis/resource.k8s.io/v1/resourceclaims")["items"]
        self.items = [kept.get(key(o), o) for o in listed]


class Clock:
    """The replicas' wall clock, moved by the test (reservations are protected for `ttl` seconds)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def past_ttl(self) -> None:
        self.now += TTL + 1


class Replica:
    def __init__(self, server: ApiServer, ns: str, clock: Clock) -> None:
        self.server = server
        self.watch = Watch(server)
        self.snap = Snapshot(policies=POLICIES, inventory=INVENTORY,
                             namespace_labels={ns: {}, LEDGERS: {}})  # fmt: skip
        # A generous decision timeout: a loaded test machine must not turn admissions into
        # "retry" denials, which would hide whether the budget itself was kept.
        self.ledger = QuotaLedger(KubeHttp.from_kubeconfig(str(server.kubeconfig)), LEDGERS, timeout=20.0,
                                  ttl=TTL, claims=lambda: self.watch.items, snapshot=lambda: self.snap,
                                  clock=clock)  # fmt: skip

    def request(self, ns: str, name: str, count: int) -> dict[str, Any]:
        body = review(claim(ns, name, count), group="resource.k8s.io", kind="ResourceClaim", namespace=ns,
                      uid=str(uuid.uuid4()))  # fmt: skip
        return dict(body["request"])

    async def admit(self, ns: str, name: str, count: int = 1) -> Outcome:
        req = self.request(ns, name, count)
        first = admission.review("validate", req, self.snap)
        group = self.ledger.group_for(req, self.snap)
        assert group == ns
        return await self.ledger.admit(group, req, self.snap, first)


def claim(ns: str, name: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": A100, "count": count}},
        ]}},
    }  # fmt: skip


def admit_and_create(r: Replica, ns: str, name: str, count: int = 1) -> bool:
    """What the API server does with a create: ask the webhook, persist the claim if it was allowed."""
    out = asyncio.run(r.admit(ns, name, count))
    if out.response["allowed"]:
        r.server.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                         claim(ns, name, count))  # fmt: skip
    return bool(out.response["allowed"])


def delete(server: ApiServer, ns: str, name: str) -> None:
    server.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")


def entries(server: ApiServer, ns: str) -> dict[str, ledger.LedgerEntry]:
    cm = server.request("GET", f"/api/v1/namespaces/{LEDGERS}/configmaps/{ledger_name(ns)}")
    return decode((cm.get("data") or {}).get(ledger.DATA_KEY))


def devices_in_use(server: ApiServer, ns: str) -> int:
    return sum(e.devices.get(A100, 0) for e in entries(server, ns).values())


def test_a_lagging_watch_does_not_put_deleted_claims_back(api: ApiServer) -> None:
    ns = namespace(api, "team-lag")
    clock = Clock()
    a, b = Replica(api, ns, clock), Replica(api, ns, clock)
    assert all(admit_and_create(a, ns, f"c{i}") for i in range(BUDGET))
    assert not admit_and_create(a, ns, "over")
    for r in (a, b):
        r.watch.refresh()
        r.ledger.reconcile()
    assert all(e.uid for e in entries(api, ns).values()) and devices_in_use(api, ns) == BUDGET

    for i in range(BUDGET):
        delete(api, ns, f"c{i}")
    clock.past_ttl()
    a.watch.refresh()  # replica b's watch has not delivered the deletes yet
    a.ledger.reconcile()
    assert entries(api, ns) == {}, "the replica that saw the deletes releases all 8 in one pass"
    b.ledger.reconcile()
    assert entries(api, ns) == {}, "the lagging replica put deleted claims back into the ledger"
    checks = b.ledger.stats["checks"]
    b.ledger.reconcile()
    assert b.ledger.stats["checks"] == checks, "a claim already found gone is not asked about again"

    # What a user sees: right after the deletes the whole budget is free, whichever replica answers.
    assert all(admit_and_create(b, ns, f"again-{i}") for i in range(BUDGET))
    assert not admit_and_create(a, ns, "again-over")
    b.watch.refresh()  # caught up: nothing stays remembered for claims the watch no longer lists
    b.ledger.reconcile()
    assert len(b.ledger._gone) == 0
    assert devices_in_use(api, ns) == BUDGET


def test_a_lagging_watch_never_lowers_the_charge_of_a_recreated_claim(api: ApiServer) -> None:
    ns = namespace(api, "team-recreate")
    clock = Clock()
    a, b = Replica(api, ns, clock), Replica(api, ns, clock)
    assert admit_and_create(a, ns, "x", 1)
    for r in (a, b):
        r.watch.refresh()
        r.ledger.reconcile()
    delete(api, ns, "x")
    clock.past_ttl()
    a.watch.refresh()
    a.ledger.reconcile()
    assert entries(api, ns) == {}
    assert admit_and_create(a, ns, "x", 4)  # the same name, now four GPUs
    b.ledger.reconcile()  # b's watch still has the old one-GPU x
    assert devices_in_use(api, ns) == 4
    clock.past_ttl()
    b.ledger.reconcile()
    assert devices_in_use(api, ns) == 4
    a.watch.refresh()
    a.ledger.reconcile()
    b.ledger.reconcile()
    (x,) = entries(api, ns).values()
    live = api.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/x")
    assert (x.uid, x.devices) == (live["metadata"]["uid"], {A100: 4})
    # Four more fit beside it, a fifth does not.
    assert [admit_and_create(b, ns, f"y{i}") for i in range(5)] == [True] * 4 + [False]


def test_a_create_under_an_existing_name_does_not_lower_its_charge(api: ApiServer) -> None:
    """A tenant's create under the name of a claim that exists (the API server refuses it after
    admission) must not replace the live claim's charge with a smaller one."""
    ns = namespace(api, "team-same-name")
    clock = Clock()
    a = Replica(api, ns, clock)
    assert admit_and_create(a, ns, "big", 4)
    a.watch.refresh()
    a.ledger.reconcile()
    out = asyncio.run(a.admit(ns, "big", 1))  # the API server then answers AlreadyExists
    assert out.response["allowed"]
    assert devices_in_use(api, ns) == 4
    assert [admit_and_create(a, ns, f"y{i}") for i in range(5)] == [True] * 4 + [False]
    clock.past_ttl()
    a.watch.refresh()
    a.ledger.reconcile()
    big = entries(api, ns)[f"{ns}/big"]
    live = api.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/big")
    assert (big.uid, big.devices) == (live["metadata"]["uid"], {A100: 4})


def test_a_create_on_its_way_keeps_its_reservation(api: ApiServer) -> None:
    """A lagging watch that still lists a deleted claim of the same name must not let another replica
    release the reservation of a create the API server has not persisted yet."""
    ns = namespace(api, "team-in-flight")
    clock = Clock()
    a, b = Replica(api, ns, clock), Replica(api, ns, clock)
    assert admit_and_create(a, ns, "x")
    for r in (a, b):
        r.watch.refresh()
        r.ledger.reconcile()
    delete(api, ns, "x")
    clock.past_ttl()
    a.watch.refresh()
    a.ledger.reconcile()
    assert entries(api, ns) == {}
    assert asyncio.run(a.admit(ns, "x")).response["allowed"]  # reserved; the create is on its way
    b.ledger.reconcile()  # b's watch: the old x
    a.ledger.reconcile()  # a's watch: no x at all, and a GET would not find one yet
    assert devices_in_use(api, ns) == 1
    api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim(ns, "x"))
    clock.past_ttl()
    for r in (a, b):
        r.ledger.reconcile()
    assert devices_in_use(api, ns) == 1
    assert [admit_and_create(b, ns, f"y{i}") for i in range(BUDGET)] == [True] * (BUDGET - 1) + [False]


def test_concurrent_admissions_on_two_replicas_never_exceed_the_budget(api: ApiServer) -> None:
    ns = namespace(api, "team-race")
    clock = Clock()
    a, b = Replica(api, ns, clock), Replica(api, ns, clock)

    async def burst(prefix: str, n: int) -> list[str]:
        async def one(r: Replica, name: str) -> str | None:
            out = await r.admit(ns, name)
            return name if out.response["allowed"] else None

        # Both replicas decide at once, one batch each, on their own reads and writes (409s between).
        got = await asyncio.gather(*(one((a, b)[i % 2], f"{prefix}-{i}") for i in range(n)))
        return [g for g in got if g is not None]

    first = asyncio.run(burst("r", 60))
    assert len(first) == BUDGET, (first, a.ledger.stats, b.ledger.stats)
    for name in first:
        api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim(ns, name))
    for r in (a, b):
        r.watch.refresh()
        r.ledger.reconcile()
    assert devices_in_use(api, ns) == BUDGET

    # All deleted; b's watch lags and its reconcile pass runs while both replicas take a new burst.
    for name in first:
        delete(api, ns, name)
    clock.past_ttl()
    a.watch.refresh()
    a.ledger.reconcile()

    async def burst_while_b_reconciles() -> list[str]:
        # Three passes one after another (as `run` does), in a thread beside the admissions.
        loop = asyncio.get_running_loop()
        passes = loop.run_in_executor(None, lambda: [b.ledger.reconcile() for _ in range(3)])
        got = await burst("s", 60)
        await passes
        return got

    second = asyncio.run(burst_while_b_reconciles())
    assert len(second) == BUDGET, (second, a.ledger.stats, b.ledger.stats)
    assert devices_in_use(api, ns) == BUDGET


def test_forgotten_claims_are_bounded(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant creating and deleting claims in a loop while a watch lags: what a replica remembers
    about claims found gone stays within its bound, and the ledger stays empty."""
    monkeypatch.setattr(ledger, "MAX_GONE", 50)
    ns = namespace(api, "team-churn")
    b = Replica(api, ns, Clock())
    # The lagging watch still lists 300 claims that the API server no longer has.
    b.watch.items = [claim(ns, f"gone-{i}") for i in range(300)]
    for c in b.watch.items:
        c["metadata"]["uid"] = str(uuid.uuid4())
    for _ in range(6):
        b.ledger.reconcile()
        assert len(b.ledger._gone) <= 50
    assert b.ledger.stats["checks"] <= 6 * ledger.CHECKS_PER_PASS
    assert b.ledger.stats["checks"] >= 300  # every stale claim was checked, none added
    assert not any(k.startswith(f"{ns}/") for k in _all_entries(api))


def _all_entries(api: ApiServer) -> dict[str, Any]:
    items = api.request("GET", f"/api/v1/namespaces/{LEDGERS}/configmaps")["items"]
    out: dict[str, Any] = {}
    for cm in items:
        out.update(decode((cm.get("data") or {}).get(ledger.DATA_KEY)))
    return out



def test_a_quiet_pass_skips_agreeing_ledgers_and_still_sees_every_change() -> None:
    """A ledger the watch agrees with is not read entry by entry again while neither changes (on a quiet
    2,000-node cluster every pass decoded 50,000 entries, a third of a core; bench/ledger_reconcile.py).
    Whatever can change its verdict still reaches it: another replica's write, a claim the watch stops
    listing, and nothing but time passing over a reservation whose create never came."""
    with running("ledger-quiet") as api:
        namespace(api, LEDGERS)
        quiet, busy = namespace(api, "team-quiet"), namespace(api, "team-busy")
        clock = Clock()
        a, b = Replica(api, quiet, clock), Replica(api, busy, clock)
        for r in (a, b):
            r.snap = Snapshot(policies=POLICIES, inventory=INVENTORY,
                              namespace_labels={quiet: {}, busy: {}, LEDGERS: {}})  # fmt: skip
        for ns in (quiet, busy):
            assert all(admit_and_create(a, ns, f"c{i}") for i in range(2))
        a.watch.refresh()
        a.ledger.reconcile()  # the claims' uids go into both ledgers
        assert a.ledger.reconcile() == 0
        unchanged = a.ledger.stats["unchanged"]
        assert a.ledger.reconcile() == 0
        assert a.ledger.stats["unchanged"] == unchanged + 2, "a pass with nothing changed read a ledger again"

        # A claim deleted: its ledger is read again and the entry released; the other stays skipped.
        delete(api, quiet, "c0")
        clock.past_ttl()
        a.watch.refresh()
        unchanged = a.ledger.stats["unchanged"]
        assert a.ledger.reconcile() == 1
        assert a.ledger.stats["unchanged"] == unchanged + 1
        assert set(entries(api, quiet)) == {f"{quiet}/c1"}

        # Another replica reserves in `busy` for a create that never comes: a's next pass reads that
        # ledger again (its resourceVersion moved) and leaves the reservation while it is recent ...
        assert asyncio.run(b.admit(busy, "never")).response["allowed"]
        assert a.ledger.reconcile() == 0
        assert f"{busy}/never" in entries(api, busy)
        # ... and with nothing else changed, time alone makes the next pass release it.
        clock.past_ttl()
        assert a.ledger.reconcile() == 1
        assert set(entries(api, busy)) == {f"{busy}/c0", f"{busy}/c1"}
        assert a.ledger.reconcile() == 0
        unchanged = a.ledger.stats["unchanged"]
        assert a.ledger.reconcile() == 0
        assert a.ledger.stats["unchanged"] == unchanged + 2
