"""Two audit replicas with leader election, as `draguard audit run --leader-elect` runs them, against a
real kube-apiserver as the bundle's draguard-audit ServiceAccount (so its Lease rights are the
bundle's): only the leader scans and writes; the follower, ready all along, takes over when the
leader shuts down (released lease) or can no longer renew (expired lease), and a replica that lost
the lease stops scanning before another starts. The failover times are printed (run with -s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kustomize"))  # the bundle tests' harness

from kapi import Api, api_server, wait_for
from kaudit import install, policies_with_h200_only, sample

from tests.apiserver import _free_port
from webhook.audit.controller import AuditController, AuditOptions
from webhook.audit.leader import LeaderElector, LeaseConfig
from webhook.server.caches import KubeHttp

pytestmark = pytest.mark.e2e

LEASE = "/apis/coordination.k8s.io/v1/namespaces/draguard-system/leases/draguard-audit"
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
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path]]:
    with api_server() as a:
        yield a, install(a, tmp_path_factory.mktemp("ha") / "kubeconfig")


class Replica:
    """One `audit run --leader-elect` process: a controller and its elector, in a thread."""

    def __init__(self, kubeconfig: Path, policies: Path, identity: str) -> None:
        http = KubeHttp.from_kubeconfig(str(kubeconfig))
        self.elector = LeaderElector(
            http, LeaseConfig(namespace="draguard-system", identity=identity, **TIMING)
        )
        opts = AuditOptions(str(policies), interval=3600.0, poll_interval=0.3, debounce=0.2)
        self.ctl = AuditController(http, opts, elector=self.elector)
        self.thread = threading.Thread(target=self.ctl.run, daemon=True)
        self.thread.start()

    def leader(self) -> float:
        return sample(self.ctl, "draguard_audit_leader")

    def sigterm(self) -> None:
        """What the SIGTERM handler does; run() then stops, and releases the lease on its way out."""
        self.ctl.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def _holder(a: Api) -> dict[str, Any]:
    res = a.kubectl("get", "--raw", LEASE)
    assert res.returncode == 0, res.stderr
    spec: dict[str, Any] = json.loads(res.stdout)["spec"]
    return spec


def _report_count(a: Api) -> int:
    res = a.kubectl("get", "clusterpolicyreports.wgpolicyk8s.io", "-o", "name")
    return len(res.stdout.split()) if res.returncode == 0 else 0


def test_one_replica_scans_and_the_other_takes_over(api: tuple[Api, Path], tmp_path: Path) -> None:
    a, kubeconfig = api
    policies = policies_with_h200_only(tmp_path / "policies")
    one = Replica(kubeconfig, policies, "audit-one")
    time.sleep(0.2)  # one starts first, so the roles are known; the other then finds the lease held
    two = Replica(kubeconfig, policies, "audit-two")
    replicas = [one, two]
    try:
        wait_for(lambda: one.ctl.scans_ok >= 1, "the leader's first full scan", timeout=60)
        assert _report_count(a) >= 1
        time.sleep(2 * TIMING["lease_duration"])  # several lease durations of renewals
        assert (one.leader(), two.leader()) == (1.0, 0.0)
        assert _holder(a)["holderIdentity"] == "audit-one"
        # The follower never scanned, wrote nothing, kept no watch, and is ready to take over.
        assert two.ctl.scans_ok == 0 and two.ctl.namespace_scans_ok == 0
        assert sample(two.ctl, "draguard_audit_scans_total", outcome="ok") == 0.0
        assert sample(two.ctl, "draguard_audit_reports_written_total") == 0.0
        assert two.ctl.watches == []
        assert two.ctl.ready() and one.ctl.ready()

        # Shutdown (a roll, a drain): the leader stops, releases, and the follower takes over at once.
        t0 = time.monotonic()
        one.sigterm()
        wait_for(lambda: two.leader() == 1.0, "the follower to be elected", timeout=10)
        elected = time.monotonic() - t0
        wait_for(lambda: two.ctl.scans_ok >= 1, "the new leader's full scan", timeout=60)
        written = time.monotonic() - t0
        print(f"\nfailover on SIGTERM: elected after {elected:.2f} s, reports written after {written:.2f} s")
        # A released lease is taken at the follower's next retry: sooner than any expiry could be.
        # (Printed figures are the measurement; the bound only tells release from expiry on a busy CI.)
        assert elected < TIMING["lease_duration"] - TIMING["retry_period"]
        assert one.leader() == 0.0 and one.ctl.scans_ok == 1  # it scanned while it led, not after
        lease = _holder(a)
        assert lease["holderIdentity"] == "audit-two" and lease["leaseTransitions"] == 1

        # A third replica joins (the roll's new pod), then the leader loses the API server: it stops
        # scanning within its renew deadline, and only then can the third take over.
        three = Replica(kubeconfig, policies, "audit-three")
        replicas.append(three)
        wait_for(three.ctl.ready, "the new follower to be ready", timeout=10)
        dead = tmp_path / "dead.kubeconfig"
        dead.write_text(DEAD_KUBECONFIG)
        scans_before = two.ctl.scans_ok
        t0 = time.monotonic()
        two.elector.http = KubeHttp.from_kubeconfig(str(dead))  # its renewals now fail
        stepped = wait_for(lambda: two.leader() == 0.0, "the cut-off leader to step down", timeout=10)
        expired = wait_for(
            lambda: three.leader() == 1.0, "the follower to take the expired lease", timeout=15
        )
        wait_for(lambda: three.ctl.scans_ok >= 1, "the third replica's full scan", timeout=60)
        print(
            f"failover on lost renewals: stepped down {stepped:.2f} s, taken over {stepped + expired:.2f} s"
        )
        assert stepped <= TIMING["renew_deadline"] + 1.0  # measured by polling: slack for a busy machine
        assert three.elector.acquired_at is not None
        assert two.elector.deadline() < three.elector.acquired_at  # never two scanning at once
        assert sample(two.ctl, "draguard_audit_leader_changes_total", to="follower") == 1.0
        assert two.ctl.watches == [] and two.ctl.state is None  # dropped with the lease
        assert two.ctl.scans_ok == scans_before  # nothing scanned after it stepped down
        assert _holder(a)["holderIdentity"] == "audit-three"
    finally:
        for r in replicas:
            r.ctl.stop()
        for r in replicas:
            r.thread.join(timeout=30)


def _leader_metric(port: int) -> float | None:
    """draguard_audit_leader from a process's /metrics; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("draguard_audit_leader "):
            return float(line.split()[1])
    return None


def test_sigterm_to_the_leader_process_hands_over_within_a_retry(
    api: tuple[Api, Path], tmp_path: Path
) -> None:
    """`draguard audit run --leader-elect` as two processes: SIGTERM to the leader ends it cleanly
    (exit 0), releases the Lease, and the other process reports itself leader a moment later."""
    a, kubeconfig = api
    policies = policies_with_h200_only(tmp_path / "policies")
    exe = str(Path(sys.executable).with_name("draguard"))
    ports = [_free_port(), _free_port()]
    procs: list[subprocess.Popen[bytes]] = []
    for i, port in enumerate(ports):
        args = [exe, "audit", "run", "--kubeconfig", str(kubeconfig), "--policies", str(policies),
                "--leader-elect", "--leader-elect-namespace", "draguard-system", "--lease-duration", "3",
                "--renew-deadline", "2", "--retry-period", "0.5", "--metrics-port", str(port),
                "--interval", "3600"]  # fmt: skip
        env = {**os.environ, "POD_NAME": f"proc-{i}"}
        with open(tmp_path / f"audit-{i}.log", "wb") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))
        if i == 0:  # the first one leads: it is up and elected before the second starts
            wait_for(lambda: _leader_metric(ports[0]) == 1.0, "the first process to lead", timeout=60)
    try:
        wait_for(lambda: _leader_metric(ports[1]) == 0.0, "the second process to follow", timeout=60)
        assert _holder(a)["holderIdentity"].startswith("proc-0_")
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        wait_for(lambda: _leader_metric(ports[1]) == 1.0, "the second process to lead", timeout=10)
        took = time.monotonic() - t0
        assert procs[0].wait(timeout=30) == 0
        print(f"\nprocess failover on SIGTERM: {took:.2f} s")
        assert took < TIMING["lease_duration"] + 1.0  # the log below shows it was a release, not an expiry
        lease = _holder(a)
        assert lease["holderIdentity"].startswith("proc-1_") and lease["leaseTransitions"] >= 1
        log_text = (tmp_path / "audit-0.log").read_text()
        assert "became the audit leader" in log_text and "released the audit lease" in log_text
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)


def test_a_replica_that_does_not_lead_sends_no_scan_request(tmp_path: Path) -> None:
    """A scan asked of a follower ends before its first request: against an unreachable API server a
    request would be an `error`; the follower's scan is `abandoned` instead. The same controller
    without an elector does send them."""
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(DEAD_KUBECONFIG)
    policies = policies_with_h200_only(tmp_path / "policies")
    http = KubeHttp.from_kubeconfig(str(dead))
    follower = LeaderElector(http, LeaseConfig(namespace="draguard-system", identity="idle", **TIMING))
    ctl = AuditController(http, AuditOptions(str(policies)), elector=follower)
    assert ctl.load_policies()
    assert ctl.scan_once() is None
    assert sample(ctl, "draguard_audit_scans_total", outcome="abandoned") == 1.0
    assert sample(ctl, "draguard_audit_scans_total", outcome="error") == 0.0
    assert sample(ctl, "draguard_audit_leader") == 0.0
    alone = AuditController(http, AuditOptions(str(policies)))
    assert alone.load_policies()
    assert alone.scan_once() is None
    assert sample(alone, "draguard_audit_scans_total", outcome="error") == 1.0
    assert sample(alone, "draguard_audit_leader") == 1.0  # the only replica is the one that scans


def test_the_bundle_grants_the_audit_its_own_lease_only(api: tuple[Api, Path]) -> None:
    a, _ = api
    sa = "--as=system:serviceaccount:draguard-system:draguard-audit"

    def can(*args: str) -> bool:
        return a.kubectl("auth", "can-i", sa, *args).stdout.strip() == "yes"

    for verb in ("get", "update"):
        assert can(verb, "leases.coordination.k8s.io/draguard-audit", "-n", "draguard-system")
        # Not another component's lease, nor the control plane's.
        assert not can(verb, "leases.coordination.k8s.io/draguard-webhook", "-n", "draguard-system")
        assert not can(verb, "leases.coordination.k8s.io/kube-scheduler", "-n", "kube-system")
    assert can("create", "leases.coordination.k8s.io", "-n", "draguard-system")
    assert not can("create", "leases.coordination.k8s.io", "-n", "kube-system")
    assert not can("delete", "leases.coordination.k8s.io/draguard-audit", "-n", "draguard-system")
    assert not can("list", "leases.coordination.k8s.io", "-n", "draguard-system")
