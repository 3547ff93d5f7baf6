"""Leader election of the audit's replicas on a coordination.k8s.io/v1 Lease, against a real
kube-apiserver (tests/apiserver.py: etcd and the API server, nothing else).

Timings are short so that failovers happen within seconds: a 3 s lease, a 2 s renew deadline and
0.5 s between attempts. Every elector is a real one talking to the API server; races are made
deterministic by a client that lets another writer in between an elector's read and its write.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import ApiServer, running
from webhook.audit.leader import LeaderElector, LeaseConfig
from webhook.server.caches import KubeHttp

pytestmark = pytest.mark.e2e

NS = "draguard-system"
TIMING = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}
DEAD_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    with running("leader") as server:
        server.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": NS}})  # fmt: skip
        yield server


@pytest.fixture
def lease_name(request: pytest.FixtureRequest) -> str:
    """A Lease of the test's own, so tests never see each other's holders."""
    return "audit-" + request.node.name.replace("_", "-")[:40].strip("-")


def _lease(api: ApiServer, name: str) -> dict[str, Any]:
    out = api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}")
    assert isinstance(out, dict)
    return out


def _elector(api: ApiServer, name: str, identity: str, http: KubeHttp | None = None) -> LeaderElector:
    cfg = LeaseConfig(namespace=NS, name=name, identity=identity, **TIMING)
    return LeaderElector(http or KubeHttp.from_kubeconfig(str(api.kubeconfig)), cfg)


def _wait(check: Callable[[], bool], what: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}", pytrace=False)


class Interleaved(KubeHttp):
    """A real client that runs `between` once, right after its next GET of the lease returns (or
    fails): another writer's update lands between this elector's read and its write."""

    def __init__(self, api: ApiServer) -> None:
        super().__init__(KubeHttp.from_kubeconfig(str(api.kubeconfig)).api)
        self.between: Callable[[], None] | None = None

    def get_json(self, path: str, query: list[tuple[str, Any]] | None = None, timeout: float = 10.0) -> Any:
        try:
            return super().get_json(path, query, timeout)
        finally:
            hook, self.between = self.between, None
            if hook is not None:
                hook()


def test_one_of_two_candidates_leads_and_the_lease_records_it(api: ApiServer, lease_name: str) -> None:
    a, b = _elector(api, lease_name, "replica-a"), _elector(api, lease_name, "replica-b")
    assert a.try_once() is True
    assert b.try_once() is False
    assert a.is_leader() and not b.is_leader()
    first = _lease(api, lease_name)["spec"]
    assert first["holderIdentity"] == "replica-a"
    assert first["leaseDurationSeconds"] == 3
    assert first["leaseTransitions"] == 0
    assert first["acquireTime"] == first["renewTime"]
    time.sleep(0.05)
    assert a.try_once() is True  # a renewal: a new renewTime, the same acquisition
    again = _lease(api, lease_name)["spec"]
    assert again["renewTime"] > first["renewTime"]
    assert again["acquireTime"] == first["acquireTime"]
    assert again["leaseTransitions"] == 0
    assert b.try_once() is False and b.holder == "replica-a"
    assert a.stats["acquired"] == 1 and a.stats["renewed"] == 1


def test_a_crashed_leader_is_replaced_within_lease_duration_plus_retry(
    api: ApiServer, lease_name: str
) -> None:
    a, b = _elector(api, lease_name, "replica-a"), _elector(api, lease_name, "replica-b")
    assert a.try_once()
    a.start()
    b.start()
    try:
        time.sleep(1.5)  # several renewals: the follower keeps waiting
        assert a.is_leader() and not b.is_leader()
        a.stop()  # the leader's process is gone: no renewal, no release
        crashed = time.monotonic()
        took = _wait(b.is_leader, "the follower to take over", timeout=10)
    finally:
        a.stop()
        b.stop()
    cfg = b.cfg
    # Not before the lease expired (it was renewed at most one retry period before the crash). At the
    # latest: the follower saw that renewal up to one jittered retry after it, and takes over at its
    # first retry past a lease duration from then (plus the API server's answers).
    low = cfg.lease_duration - cfg.retry_period - 0.1
    # The upper bound has slack for a busy CI machine; the lower bound is the protocol's.
    assert low <= took <= cfg.lease_duration + 2 * 1.2 * cfg.retry_period + 3.0
    assert b.acquired_at is not None and b.acquired_at >= crashed
    # Never two leaders: the old one's own deadline ended before the new one was elected.
    assert a.deadline() < b.acquired_at
    spec = _lease(api, lease_name)["spec"]
    assert spec["holderIdentity"] == "replica-b" and spec["leaseTransitions"] == 1


def test_a_released_lease_is_taken_over_within_a_retry_period(api: ApiServer, lease_name: str) -> None:
    a, b = _elector(api, lease_name, "replica-a"), _elector(api, lease_name, "replica-b")
    assert a.try_once()
    b.start()
    try:
        time.sleep(0.8)
        assert not b.is_leader()
        assert a.release() is True  # what SIGTERM does, once the scans have stopped
        assert not a.is_leader()
        released = _lease(api, lease_name)["spec"]
        assert released["holderIdentity"] == "" and released["leaseTransitions"] == 0
        took = _wait(b.is_leader, "the follower to take over a released lease", timeout=5)
    finally:
        b.stop()
    assert took < b.cfg.lease_duration - b.cfg.retry_period  # sooner than any expiry could be
    assert _lease(api, lease_name)["spec"]["holderIdentity"] == "replica-b"
    assert a.release() is False  # no longer the holder: nothing to give up, b's lease left alone
    assert _lease(api, lease_name)["spec"]["holderIdentity"] == "replica-b"


def test_a_leader_that_cannot_renew_stops_before_anyone_takes_over(api: ApiServer, lease_name: str) -> None:
    a, b = _elector(api, lease_name, "replica-a"), _elector(api, lease_name, "replica-b")
    assert a.try_once()
    a.start()
    b.start()
    try:
        time.sleep(1.0)
        dead = Path(api.kubeconfig).with_name(f"dead-{lease_name}.kubeconfig")
        dead.write_text(DEAD_KUBECONFIG)
        a.http = KubeHttp.from_kubeconfig(str(dead))  # its API server unreachable from now on
        cut = time.monotonic()
        _wait(lambda: not a.is_leader(), "the cut-off leader to step down", timeout=5)
        stepped_down = time.monotonic() - cut
        _wait(b.is_leader, "the follower to take over", timeout=10)
    finally:
        a.stop()
        b.stop()
    assert stepped_down <= a.cfg.renew_deadline + 1.0  # measured by polling; the margin below is exact
    assert a.stats["errors"] >= 1
    assert b.acquired_at is not None
    # The margin between the old leader stopping and the new one starting is at least the lease
    # duration less the renew deadline (1 s here), by construction rather than by luck.
    assert b.acquired_at - a.deadline() >= a.cfg.lease_duration - a.cfg.renew_deadline - 0.05


def test_a_lease_taken_between_read_and_write_is_a_conflict_and_is_not_overwritten(
    api: ApiServer, lease_name: str
) -> None:
    http = Interleaved(api)
    a = _elector(api, lease_name, "replica-a", http)
    assert a.try_once()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease_name}"

    def intruder_takes_it() -> None:
        lease = _lease(api, lease_name)
        lease["spec"]["holderIdentity"] = "intruder"
        lease["spec"]["leaseDurationSeconds"] = 30
        api.request("PUT", path, lease)

    http.between = intruder_takes_it
    assert a.try_once() is False  # its renewal was refused (409); the read after it shows the intruder
    assert a.stats["conflicts"] == 1
    assert not a.is_leader()
    assert _lease(api, lease_name)["spec"]["holderIdentity"] == "intruder"  # not overwritten


def test_an_unrelated_update_between_read_and_write_costs_the_leader_nothing(
    api: ApiServer, lease_name: str
) -> None:
    http = Interleaved(api)
    a = _elector(api, lease_name, "replica-a", http)
    assert a.try_once()

    def someone_labels_it() -> None:
        lease = _lease(api, lease_name)
        lease["metadata"].setdefault("labels", {})["team"] = "platform"
        api.request("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease_name}", lease)

    http.between = someone_labels_it
    assert a.try_once() is True  # conflict, read again, renewed
    assert a.stats["conflicts"] == 1 and a.stats["renewed"] == 1
    lease = _lease(api, lease_name)
    assert lease["spec"]["holderIdentity"] == "replica-a" and lease["spec"]["leaseTransitions"] == 0
    assert lease["metadata"]["labels"] == {"team": "platform"}  # the other writer's change kept


def test_two_candidates_creating_the_lease_at_once_end_with_one_leader(
    api: ApiServer, lease_name: str
) -> None:
    http = Interleaved(api)
    a = _elector(api, lease_name, "replica-a", http)
    b = _elector(api, lease_name, "replica-b")
    # a finds no lease (404); before it creates one, b creates it and leads.
    http.between = lambda: None if b.try_once() else pytest.fail("b did not create the lease")
    assert a.try_once() is False
    assert a.stats["conflicts"] == 1 and b.is_leader() and not a.is_leader()
    assert _lease(api, lease_name)["spec"]["holderIdentity"] == "replica-b"


def test_a_hostile_lease_record_is_read_within_bounds(api: ApiServer, lease_name: str) -> None:
    """A record written by anyone with update rights: a holder of megabytes, a lease duration of a
    century. The follower waits at most an hour, not a century, and
    takes over a record without a holder at once."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    huge = "x" * 100_000
    api.request("POST", path, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                               "metadata": {"name": lease_name},
                               "spec": {"holderIdentity": huge,
                                        "leaseDurationSeconds": 3_000_000_000 // 2}})  # fmt: skip
    a = _elector(api, lease_name, "replica-a")
    assert a.try_once() is False
    assert len(a.holder) <= 256
    assert a._seen_duration == 3600.0  # bounded, not 47 years
    lease = _lease(api, lease_name)
    lease["spec"] = {"holderIdentity": "", "leaseTransitions": 7}
    api.request("PUT", f"{path}/{lease_name}", lease)
    assert a.try_once() is True
    assert _lease(api, lease_name)["spec"]["leaseTransitions"] == 8


def test_settings_that_could_let_two_replicas_lead_are_refused() -> None:
    ok = LeaseConfig(identity="x")
    assert ok.problem() is None
    assert "shorter than the lease duration" in (dataclasses.replace(ok, renew_deadline=15.0).problem() or "")
    assert "2.4 retry periods" in (dataclasses.replace(ok, retry_period=5.0).problem() or "")
    assert "must not be empty" in (dataclasses.replace(ok, identity="").problem() or "")


def test_leadership_lapses_on_time_even_when_the_elector_thread_is_stuck(
    api: ApiServer, lease_name: str
) -> None:
    """is_leader() answers from the clock: a renewal stuck in a request cannot keep a replica leading."""
    a = _elector(api, lease_name, "replica-a")
    assert a.try_once()
    with a.lock:  # what a renewal blocked in the network looks like from the outside
        t0 = time.monotonic()
        _wait(lambda: not a.is_leader(), "the lapse", timeout=5)
    assert time.monotonic() - t0 <= a.cfg.renew_deadline + 1.0  # slack for polling on a busy machine
