"""Forged ResourceClaim reviews against the quota ledger, on a real kube-apiserver: only a claim the API
server could persist is reserved, a damaged entry or ledger never stops the reconcile pass for the others,
what a sender can plant without a claim ever appearing is bounded, and the ledgers of namespaces that are
gone are removed.

Any pod can send a review to the webhook's port when the API server's client certificate cannot be
required (managed clouds), so everything in a review here is the sender's choice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.apiserver import ApiServer, running
from tests.server.test_ledger_replicas import (
    A100,
    BUDGET,
    LEDGERS,
    Clock,
    Replica,
    admit_and_create,
    delete,
    devices_in_use,
    entries,
    namespace,
)
from webhook.server import admission, ledger
from webhook.server.admission import Outcome
from webhook.server.caches import KubeHttp
from webhook.server.ledger import LedgerEntry, encode, ledger_name

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    with running("forged-ledger") as server:
        namespace(server, LEDGERS)
        yield server


def ledgers(server: ApiServer) -> dict[str, dict[str, Any]]:
    """Every ledger ConfigMap by its group."""
    items = server.request("GET", f"/api/v1/namespaces/{LEDGERS}/configmaps")["items"]
    return {
        cm["metadata"]["annotations"][ledger.GROUP_ANNOTATION]: cm
        for cm in items
        if ledger.GROUP_ANNOTATION in (cm["metadata"].get("annotations") or {})
    }


def forge(r: Replica, ns: str, name: str, changes: dict[str, Any] | None = None) -> Outcome:
    """A ResourceClaim review sent straight to the webhook, with whatever the sender likes in it."""
    req = r.request(ns, name, 1)
    for key, value in (changes or {}).items():
        if key == "object_namespace":
            req["object"]["metadata"]["namespace"] = value
        else:
            req[key] = value
    first = admission.review("validate", req, r.snap)
    group = r.ledger.group_for(req, r.snap)
    assert group is not None
    return asyncio.run(r.ledger.admit(group, req, r.snap, first))


def plant(server: ApiServer, group: str, planted: dict[str, LedgerEntry]) -> None:
    """A ledger as an earlier draguard could have written it."""
    server.request("POST", f"/api/v1/namespaces/{LEDGERS}/configmaps", {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ledger_name(group),
            "labels": {ledger.COMPONENT_LABEL: ledger.COMPONENT},
            "annotations": {ledger.GROUP_ANNOTATION: group},
        },
        "data": {ledger.DATA_KEY: encode(planted)},
    })  # fmt: skip


def test_a_review_for_an_object_the_api_server_could_not_hold_reserves_nothing(
    api: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    ns = namespace(api, "team-forged")
    r = Replica(api, ns, Clock())
    before = set(ledgers(api))
    control = "\x1b[2J\r\nFAKE LOG LINE"
    forged = {
        "a path that collapses to /healthz": ("../../../../../../healthz", {}),
        "not a DNS subdomain": ("Upper_Case", {}),
        "longer than a name may be": ("a" * 254, {}),
        "control characters for the logs": ("x" + control + "y" * 5000, {}),
        "the object in another namespace": ("c1", {"object_namespace": "team-elsewhere"}),
        "the request for another name": ("c2", {"name": "c3"}),
    }
    with caplog.at_level(logging.INFO, logger="draguard.ledger"):
        for why, (name, changes) in forged.items():
            out = forge(r, ns, name, changes)
            assert out.response["allowed"] is False, why
            message = out.response["status"]["message"]
            assert "quota/ledger" in message, why
            # The answer says why, with the sender's names escaped and cut.
            assert len(message) < 800 and "\x1b" not in message, why
    # A namespace the watch does not know (never created, or not seen yet): nothing is reserved either.
    r.snap = r.snap.__class__(policies=r.snap.policies, inventory=r.snap.inventory,
                              namespace_labels={LEDGERS: {}})  # fmt: skip
    out = forge(r, ns, "c4")
    assert out.response["allowed"] is False
    assert f"namespace {ns} is not in draguard's namespace watch yet" in out.response["status"]["message"]
    # Nothing was read or written: no ledger for this namespace, no entry anywhere.
    assert r.ledger.stats["reads"] == 0 and r.ledger.stats["writes"] == 0
    assert set(ledgers(api)) == before
    # What reaches the log of a forged name is short and carries no terminal control.
    lines = [rec.getMessage() + json.dumps(getattr(rec, "object", "")) for rec in caplog.records]
    assert lines and all(len(line) < 400 for line in lines), max(map(len, lines))
    assert not any("\x1b" in str(getattr(rec, "object", "")) for rec in caplog.records)
    assert not any("\r\n" in str(getattr(rec, "object", "")) for rec in caplog.records)


def test_a_real_claim_is_still_reserved(api: ApiServer) -> None:
    ns = namespace(api, "team-real")
    r = Replica(api, ns, Clock())
    assert admit_and_create(r, ns, "gpu.job-1")  # a dotted name is a valid subdomain
    assert devices_in_use(api, ns) == 1


def test_one_bad_entry_or_ledger_does_not_stop_the_pass(api: ApiServer) -> None:
    """An entry planted under `../../healthz` once ended the whole pass: reservations never expired
    and deleted claims never freed budget, for every team."""
    bad, other = namespace(api, "team-bad"), namespace(api, "team-other")
    clock = Clock()
    r = Replica(api, bad, clock)
    r.snap = r.snap.__class__(policies=r.snap.policies, inventory=r.snap.inventory,
                              namespace_labels={bad: {}, other: {}, LEDGERS: {}})  # fmt: skip
    long_ago = clock.now - 3600
    plant(api, bad, {
        f"{bad}/../../../../../../healthz": LedgerEntry({A100: 4}, 4, long_ago),
        f"{bad}/deleted": LedgerEntry({A100: 2}, 2, long_ago, "uid-deleted"),
    })  # fmt: skip
    # Sorted after the bad ledger, so an exception there would have ended the pass before it.
    plant(api, other, {f"{other}/deleted": LedgerEntry({A100: 8}, 8, long_ago, "uid-gone")})
    r.ledger.reconcile()
    assert entries(api, bad) == {}
    assert entries(api, other) == {}, "a bad entry in one team's ledger kept another team's budget full"
    assert r.ledger.stats["invalid"] == 1
    # The whole budget is free again for both teams.
    assert all(admit_and_create(r, bad, f"c{i}") for i in range(BUDGET))


class OneBadAnswer(KubeHttp):
    """The real API server, except that one claim's GET answers something that is not a claim."""

    def __init__(self, inner: KubeHttp, path_end: str) -> None:
        super().__init__(inner.api)
        self.path_end = path_end

    def get_json(self, path: str, query: list[tuple[str, Any]] | None = None,
                 timeout: float = 10.0) -> dict[str, Any]:  # fmt: skip
        if path.endswith(self.path_end):
            return {"kind": "Status", "status": "ok"}
        return super().get_json(path, query, timeout)


def test_an_entry_whose_check_fails_is_kept_and_the_others_are_reconciled(api: ApiServer) -> None:
    ns, other = namespace(api, "team-odd"), namespace(api, "team-odd2")
    clock = Clock()
    r = Replica(api, ns, clock)
    r.snap = r.snap.__class__(policies=r.snap.policies, inventory=r.snap.inventory,
                              namespace_labels={ns: {}, other: {}, LEDGERS: {}})  # fmt: skip
    r.ledger.http = OneBadAnswer(r.ledger.http, "/resourceclaims/odd")
    long_ago = clock.now - 3600
    plant(api, ns, {f"{ns}/odd": LedgerEntry({A100: 1}, 1, long_ago),
                    f"{ns}/gone": LedgerEntry({A100: 3}, 3, long_ago, "u3")})  # fmt: skip
    plant(api, other, {f"{other}/gone": LedgerEntry({A100: 3}, 3, long_ago, "u4")})
    r.ledger.reconcile()
    assert set(entries(api, ns)) == {f"{ns}/odd"}  # not decided: kept for the next pass
    assert entries(api, other) == {}
    assert r.ledger.stats["errors"] == 1


def test_reservations_without_a_claim_are_bounded_per_namespace(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger, "MAX_PENDING", 3)
    ns = namespace(api, "team-flood")
    clock = Clock()
    r = Replica(api, ns, clock)
    assert all(forge(r, ns, f"f{i}").response["allowed"] for i in range(3))
    out = forge(r, ns, "f3")
    assert out.response["allowed"] is False
    message = out.response["status"]["message"]
    assert "3 claims (or 128 KiB) reserved that the API server has not shown yet" in message
    assert devices_in_use(api, ns) == 3
    # Reservations whose claims never appear lapse after the ttl; then there is room again.
    clock.past_ttl()
    r.watch.refresh()
    r.ledger.reconcile()
    assert entries(api, ns) == {}
    # Claims that exist no longer count as waiting: a namespace's real claims are not capped by this.
    for i in range(3):
        assert admit_and_create(r, ns, f"real{i}")
    r.watch.refresh()
    r.ledger.reconcile()
    assert all(e.uid for e in entries(api, ns).values())
    assert all(admit_and_create(r, ns, f"more{i}") for i in range(3))
    assert devices_in_use(api, ns) == 6


def test_bytes_of_reservations_are_bounded_per_namespace(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger, "MAX_PENDING_BYTES", 600)
    ns = namespace(api, "team-bytes")
    r = Replica(api, ns, Clock())
    long = [f"{'n' * 200}{i}" for i in range(4)]
    got = [forge(r, ns, name).response["allowed"] for name in long]
    assert got == [True, True, False, False]  # ~260 bytes each


def test_ledgers_of_namespaces_that_are_gone_are_removed(api: ApiServer) -> None:
    ns = namespace(api, "team-gone")
    clock = Clock()
    r = Replica(api, ns, clock)
    assert admit_and_create(r, ns, "c")
    # A ledger a forged review wrote, in an earlier version, for a namespace that never existed.
    plant(api, "ghost-namespace", {"ghost-namespace/x": LedgerEntry({A100: 1}, 1, clock.now - 3600)})
    # The namespace is deleted: the watch no longer lists it (nor its claims).
    r.snap = r.snap.__class__(policies=r.snap.policies, inventory=r.snap.inventory,
                              namespace_labels={LEDGERS: {}})  # fmt: skip
    r.ledger.reconcile()
    assert "ghost-namespace" not in ledgers(api)
    assert ns in ledgers(api), "a reservation within its ttl keeps its ledger: the create may be on its way"
    clock.past_ttl()
    r.ledger.reconcile()
    assert ns not in ledgers(api)
    # Other tests' namespaces on this API server are not in this replica's watch either: theirs go too.
    assert r.ledger.stats["removed"] >= 2
    delete(api, ns, "c")


def test_a_forged_storm_leaves_other_tenants_budgets_alone(api: ApiServer) -> None:
    """Forged reviews naming a real team's namespace with every kind of bad name: the team's budget
    is whole, and nothing was written for namespaces that do not exist."""
    ns = namespace(api, "team-victim")
    r = Replica(api, ns, Clock())
    before = set(ledgers(api))
    for i in range(40):
        forge(r, ns, f"../x{i}")
        forge(r, ns, f"v{i}", {"object_namespace": "team-attacker"})
        forge(r, f"nowhere-{i}", f"v{i}")  # a namespace that does not exist
    assert set(ledgers(api)) == before
    assert [admit_and_create(r, ns, f"c{i}") for i in range(BUDGET + 1)] == [True] * BUDGET + [False]


def test_a_claim_sent_right_after_its_namespace_waits_for_the_watch_instead_of_being_refused(
    api: ApiServer,
) -> None:
    """`kubectl apply` of a new namespace and its claim: the claim's review can arrive before the watch
    shows the namespace. It waits for the watch (bounded) and is reserved once the namespace shows."""
    ns = namespace(api, "team-fresh")
    r = Replica(api, ns, Clock())
    seen = r.snap
    others = {k: v for k, v in seen.namespace_labels.items() if k != ns}
    r.snap = seen.__class__(policies=seen.policies, inventory=seen.inventory, namespace_labels=others)
    req = r.request(ns, "fresh-claim", 1)
    first = admission.review("validate", req, seen)
    group = r.ledger.group_for(req, seen)
    assert group is not None

    async def run() -> Outcome:
        async def watch_catches_up() -> None:
            await asyncio.sleep(0.2)
            r.snap = seen  # the namespace event arrives
        task = asyncio.create_task(watch_catches_up())
        out = await r.ledger.admit(group, req, r.snap, first)
        await task
        return out

    out = asyncio.run(run())
    assert out.response["allowed"] is True, out.response
    assert any("fresh-claim" in key for key in entries(api, group)), entries(api, group)
