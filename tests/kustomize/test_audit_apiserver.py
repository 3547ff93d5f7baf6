"""The audit's reports against a real API server: the bundle's CRDs accept them, the bundle's RBAC
is enough to write them, split parts and stale reports are handled, and `audit once` works."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kapi import Api, api_server
from kaudit import install

from webhook.audit.report import Collector, Subject, build_reports, passed, result_of
from webhook.audit.scan import ScanOutcome, scan_cluster
from webhook.audit.writer import ReportWriter
from webhook.core.findings import Finding, Mode, ObjectRef, Severity
from webhook.policy.load import load_policies
from webhook.server.caches import KubeHttp

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path]]:
    with api_server() as a:
        # (the harness has made the namespaces draguard-system and ml)
        yield a, install(a, tmp_path_factory.mktemp("audit") / "kubeconfig", deviceclasses=False)


def _reports(api: Api, ns: str) -> dict[str, dict[str, object]]:
    res = api.kubectl("get", "policyreports.wgpolicyk8s.io", "-n", ns, "-o", "json")
    assert res.returncode == 0, res.stderr
    return {r["metadata"]["name"]: r for r in json.loads(res.stdout)["items"]}


def _findings(n: int, message: str) -> Collector:
    c = Collector()
    for i in range(n):
        ref = ObjectRef("apps/v1", "Deployment", "ml", f"d{i}")
        f = Finding("tier/gpu-tiers", Severity.ERROR, Mode.ENFORCE, ref, message, fix="use an H100 class")
        c.add(result_of(f, Subject("apps/v1", "Deployment", "ml", f"d{i}", uid=f"u{i}")))
    return c


def test_split_reports_are_accepted_and_stale_parts_removed(api: tuple[Api, Path]) -> None:
    a, kubeconfig = api
    writer = ReportWriter(KubeHttp.from_kubeconfig(str(kubeconfig)))
    # 1,500 results with 1 KiB messages: about 2 MiB, more than one object may hold.
    c = _findings(1500, "x" * 1024)
    c.add(passed(Subject("resource.k8s.io/v1", "DeviceClass", None, "gpu.nvidia.com-h100")))
    reports = build_reports(c, 1_700_000_000)
    res = writer.sync(reports)
    assert res.failed == [] and res.written == len(reports)
    got = _reports(a, "ml")
    assert len(got) >= 3, sorted(got)
    assert sum(r["summary"]["fail"] for r in got.values()) == 1500  # type: ignore[index]
    assert sum(len(r["results"]) for r in got.values()) == 1500  # type: ignore[arg-type]
    cluster = json.loads(
        a.kubectl("get", "clusterpolicyreports.wgpolicyk8s.io", "draguard-audit", "-o", "json").stdout
    )
    assert cluster["summary"]["pass"] == 1
    # Applying the same reports again is a no-op for the API server, not a conflict.
    assert writer.sync(reports).failed == []

    # The next scan finds less: the parts it no longer needs and the cluster report go.
    small = build_reports(_findings(3, "wrong class"), 1_700_000_100)
    res = writer.sync(small)
    assert res.failed == [] and res.deleted == len(reports) - 1
    got = _reports(a, "ml")
    assert sorted(got) == ["draguard-audit"]
    assert got["draguard-audit"]["summary"] == {"pass": 0, "fail": 3, "warn": 0, "error": 0, "skip": 0}
    assert a.kubectl("get", "clusterpolicyreports.wgpolicyk8s.io", "draguard-audit").returncode != 0


def test_reports_of_others_are_left_alone(api: tuple[Api, Path]) -> None:
    a, kubeconfig = api
    other = {
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": "PolicyReport",
        "metadata": {"name": "kyverno-like", "namespace": "ml"},
        "results": [],
    }
    assert a.kubectl("apply", "-f", "-", stdin=json.dumps(other)).returncode == 0
    writer = ReportWriter(KubeHttp.from_kubeconfig(str(kubeconfig)))
    assert writer.sync([]).failed == []
    assert "kyverno-like" in _reports(a, "ml")


def test_audit_once_reports_a_legacy_gpu_pod(api: tuple[Api, Path]) -> None:
    a, kubeconfig = api
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy", "namespace": "ml"},
        "spec": {
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    assert a.kubectl("apply", "-f", "-", stdin=json.dumps(pod)).returncode == 0
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "audit",
            "once",
            "--kubeconfig",
            str(kubeconfig),
            "--policies",
            str(REPO / "policies"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "objects judged" in proc.stdout
    rep = _reports(a, "ml")["draguard-audit"]
    entries = [(r["result"], r["rule"]) for r in rep["results"] if r["resources"][0]["name"] == "legacy"]  # type: ignore[index, union-attr]
    assert ("warn", "migrate/legacy-gpu") in entries, entries


def test_audit_once_names_a_broken_policy_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: policy.draguard.io/v1alpha1\nkind: GpuTierPolicy\n"
        "metadata: {name: x}\nspec: {classes: 3}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "audit", "once", "--policies", str(bad), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 2
    assert "bad.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_a_namespace_deleted_since_the_scan_does_not_fail_the_write(api: tuple[Api, Path]) -> None:
    _, kubeconfig = api
    c = Collector()
    c.add(passed(Subject("v1", "Pod", "gone-already", "p")))
    c.add(passed(Subject("v1", "Pod", "ml", "p")))
    res = ReportWriter(KubeHttp.from_kubeconfig(str(kubeconfig))).sync(build_reports(c, 1))
    assert res.failed == [] and res.skipped == 1 and res.written == 1


def test_a_full_scan_judges_pods_whose_owner_reference_is_forged(api: tuple[Api, Path]) -> None:
    a, kubeconfig = api
    spec = {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": {"metadata": {"labels": {"app": "trainer"}}, "spec": spec},
        },
    }
    assert a.kubectl("apply", "-f", "-", stdin=json.dumps(dep)).returncode == 0
    got = a.kubectl("get", "deployment", "trainer", "-n", "ml", "-o", "jsonpath={.metadata.uid}")
    uid = got.stdout.strip()
    assert uid, got.stderr
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "trainer", "uid": uid, "controller": True}
    eight = {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    pods = [
        ("trainer-honest", spec, ref),  # what the template makes (the API server adds requests)
        ("trainer-more", eight, ref),  # the real owner's uid, eight GPUs
        ("trainer-ghost", spec, {**ref, "name": "gone", "uid": "5f0c2a34-0000-4000-8000-000000000000"}),
    ]
    for name, pod_spec, owner in pods:
        meta = {"name": name, "namespace": "ml", "labels": {"app": "trainer"}, "ownerReferences": [owner]}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
        res = a.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        assert res.returncode == 0, res.stderr
    out = scan_cluster(KubeHttp.from_kubeconfig(str(kubeconfig)), load_policies(REPO / "policies"))
    judged = {
        (r["resources"][0]["kind"], r["resources"][0]["name"])
        for rep in out.reports
        if rep["metadata"].get("namespace") == "ml"
        for r in rep.get("results") or []
    }
    assert ("Deployment", "trainer") in judged
    assert ("Pod", "trainer-honest") not in judged  # its finding is the Deployment's
    assert ("Pod", "trainer-more") in judged and ("Pod", "trainer-ghost") in judged
    # The Deployment is deleted; no garbage collector runs here, so its pods stay, as they do until
    # it has run (and a terminating pod's grace period is over). The next full scan, given the last
    # one's owners, still leaves the honest pod to the deleted Deployment; a fresh audit cannot.
    assert a.kubectl("delete", "deployment", "trainer", "-n", "ml").returncode == 0
    http = KubeHttp.from_kubeconfig(str(kubeconfig))
    policies = load_policies(REPO / "policies")
    assert out.state is not None
    after = _judged(scan_cluster(http, policies, owners=out.state.owners), "ml")
    assert ("Pod", "trainer-honest") not in after
    assert ("Pod", "trainer-more") in after and ("Pod", "trainer-ghost") in after
    assert ("Pod", "trainer-honest") in _judged(scan_cluster(http, policies), "ml")
    assert a.kubectl("delete", "pods", *(n for n, _, _ in pods), "-n", "ml").returncode == 0


def _judged(out: ScanOutcome, namespace: str) -> set[tuple[str, str]]:
    return {
        (r["resources"][0]["kind"], r["resources"][0]["name"])
        for rep in out.reports
        if rep["metadata"].get("namespace") == namespace
        for r in rep.get("results") or []
    }
