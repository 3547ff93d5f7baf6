"""The audit's watches against a real API server, as the bundle's `draguard-audit` ServiceAccount: a
workload's report entry follows its creation, fix and deletion within seconds (the periodic scan set
an hour away), a burst is written in few rescans, and an expired watch (410) relists and goes on."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kapi import Api, api_server, wait_for
from kaudit import NS, REPO, RULE, install, policies_with_h200_only, running_audit, sample, watch_driven

from webhook.audit.controller import AuditController, AuditOptions
from webhook.audit.watch import Changes, Fingerprints, ResourceWatch, Watched
from webhook.server.caches import Gone, KubeHttp


def _deployment(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:v0.6.3",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                },
            },
        },
    }


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path]]:
    # The API server compacts etcd every second, and serves Deployment watches from etcd (no watch
    # cache), so that a watch from an old resourceVersion really expires.
    args = ("--etcd-compaction-interval=1s", "--watch-cache-sizes=deployments.apps#0")
    with api_server(extra_args=args) as a:
        yield a, install(a, tmp_path_factory.mktemp("audit") / "kubeconfig")


@pytest.fixture
def controller(api: tuple[Api, Path], tmp_path: Path) -> Iterator[AuditController]:
    policies = policies_with_h200_only(tmp_path / "policies")
    opts = AuditOptions(str(policies), interval=3600.0, poll_interval=0.5, debounce=0.3, max_delay=5.0)
    with running_audit(api[1], opts) as ctl:
        yield ctl


def _entries(a: Api, name: str) -> list[tuple[str, str]]:
    res = a.kubectl("get", "policyreports.wgpolicyk8s.io", "draguard-audit", "-n", NS, "-o", "json")
    if res.returncode != 0:
        return []
    rep = json.loads(res.stdout)
    return sorted(
        (r["result"], r["rule"]) for r in rep.get("results", []) if r["resources"][0]["name"] == name
    )


def _apply(a: Api, *objs: dict[str, Any]) -> None:
    res = a.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    assert res.returncode == 0, res.stderr


def test_a_workload_entry_follows_create_fix_and_delete(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    a, _ = api
    _apply(a, _deployment("llm", "llm-h100"))
    took = wait_for(lambda: _entries(a, "llm") == [("fail", RULE)], "the new Deployment to fail", timeout=30)
    assert took < 30
    wait_for(lambda: sample(controller, "draguard_audit_violations", rule=RULE, result="fail") == 1.0,
             "the violation in the metrics")  # fmt: skip

    _apply(a, _deployment("llm", "llm-h200"))  # fixed: the class the policy asks for
    wait_for(lambda: _entries(a, "llm") == [("pass", "all")], "the fixed Deployment to pass", timeout=30)
    # (The metrics follow the reports: a rescan writes, then publishes.)
    wait_for(lambda: sample(controller, "draguard_audit_violations", rule=RULE, result="fail") == 0.0,
             "the violation to leave the metrics", timeout=10)  # fmt: skip

    assert a.kubectl("delete", "deployment", "llm", "-n", NS, "--wait=true").returncode == 0
    wait_for(lambda: _entries(a, "llm") == [], "the deleted Deployment's entry to go", timeout=30)
    assert _entries(a, "llm-h200") == [("pass", "all")]  # the template stays
    # All of it came from the watches: the periodic scan is an hour away and ran only at start.
    assert controller.scans_ok == 1
    # (A rescan writes its reports before it counts itself.)
    wait_for(lambda: controller.namespace_scans_ok >= 3, "the third rescan to count itself", timeout=10)


def test_a_burst_is_written_in_few_rescans(api: tuple[Api, Path], controller: AuditController) -> None:
    a, _ = api
    before = controller.namespace_scans_ok
    burst = [_deployment(f"burst-{i}", "llm-h100") for i in range(20)]
    _apply(a, *burst)
    wait_for(lambda: all(_entries(a, f"burst-{i}") == [("fail", RULE)] for i in range(20)),
             "all 20 Deployments in the report", timeout=60)  # fmt: skip
    # A rescan writes its reports before it counts itself: wait for the last one to be counted.
    wait_for(lambda: controller.changes.pending() == 0 and controller.namespace_scans_ok > before,
             "the burst's rescans to be counted", timeout=10)  # fmt: skip
    rescans = controller.namespace_scans_ok - before
    assert 1 <= rescans < 10, rescans  # 20 creations (and their status updates), debounced
    assert a.kubectl("delete", "deployments", "-n", NS, "--all").returncode == 0
    wait_for(lambda: _entries(a, "burst-0") == [], "the burst's entries to go", timeout=60)


def test_status_updates_do_not_rescan(api: tuple[Api, Path], controller: AuditController) -> None:
    a, _ = api
    _apply(a, _deployment("steady", "llm-h200"))
    wait_for(lambda: _entries(a, "steady") == [("pass", "all")], "the Deployment in the report", timeout=30)
    wait_for(lambda: controller.namespace_scans_ok >= 1, "the rescan to be counted")
    before = controller.namespace_scans_ok
    changes_before = sample(
        controller, "draguard_audit_watch_events_total", resource="deployments", what="change"
    )
    events_before = sample(
        controller, "draguard_audit_watch_events_total", resource="deployments", what="event"
    )
    status = {"status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "availableReplicas": 1}}
    res = a.kubectl("patch", "deployment", "steady", "-n", NS, "--subresource=status", "--type=merge",
                    "-p", json.dumps(status))  # fmt: skip
    assert res.returncode == 0, res.stderr
    wait_for(
        lambda: (
            sample(controller, "draguard_audit_watch_events_total", resource="deployments", what="event")
            > events_before
        ),
        "the status update to arrive",
    )
    assert sample(
        controller, "draguard_audit_watch_events_total", resource="deployments", what="change"
    ) == (changes_before)
    assert controller.changes.pending() == 0 and controller.namespace_scans_ok == before


def test_an_expired_watch_relists_and_goes_on(api: tuple[Api, Path]) -> None:
    a, kubeconfig = api
    http = KubeHttp.from_kubeconfig(str(kubeconfig))

    def compacted() -> bool:
        q = [("watch", "true"), ("resourceVersion", "1"), ("timeoutSeconds", 1)]
        try:
            resp = http.stream("/apis/apps/v1/deployments", q, read_timeout=5)
        except Gone:
            return True
        try:
            first = resp.read().split(b"\n", 1)[0]
        finally:
            resp.release_conn()
        return bool(first) and json.loads(first).get("object", {}).get("code") == 410

    wait_for(compacted, "etcd to compact past resourceVersion 1")
    changes = Changes(debounce=0.0)
    seen: list[tuple[str, str]] = []
    w = ResourceWatch(
        http,
        Watched("/apis/apps/v1/deployments", "apps/v1", "Deployment"),
        changes,
        Fingerprints(),
        on_event=lambda res, what: seen.append((res, what)),
    )
    w.resource_version = "1"  # long compacted: the API server answers 410 Gone
    w.start()
    try:
        wait_for(lambda: ("deployments", "expired") in seen, "the 410")
        # The relist took a fresh resourceVersion and asked for a full scan (what the watch missed).
        wait_for(lambda: changes.full_since is not None and w.resource_version not in ("", "1"), "the relist")
        _apply(a, _deployment("after-410", "llm-h100"))
        wait_for(lambda: changes.due()[0] == [NS], "the watch to report the namespace after the relist")
        assert ("deployments", "error") not in seen
    finally:
        w.stop()
        a.kubectl("delete", "deployment", "after-410", "-n", NS)


def test_a_full_scan_asked_for_by_a_watch_runs(api: tuple[Api, Path], controller: AuditController) -> None:
    # What the watch does after a 410 (above), and the controller's answer: one more full scan.
    controller.opts = dataclasses.replace(controller.opts, full_scan_gap=0.0)
    controller.changes.request_full()
    wait_for(lambda: controller.scans_ok >= 2, "the full scan a watch asked for")
    assert controller.changes.full_since is None


def test_a_namespace_label_change_re_judges_the_namespace(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    a, _ = api
    assert a.kubectl("create", "namespace", "legacy").returncode == 0
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "old-gpu", "namespace": "legacy"},
        "spec": {
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    assert a.kubectl("-n", "legacy", "create", "serviceaccount", "default").returncode == 0
    _apply(a, pod)

    def legacy() -> list[tuple[str, str]]:
        res = a.kubectl("get", "policyreports.wgpolicyk8s.io", "draguard-audit", "-n", "legacy", "-o", "json")
        if res.returncode != 0:
            return []
        return sorted((r["result"], r["rule"]) for r in json.loads(res.stdout).get("results", []))

    wait_for(lambda: legacy() == [("warn", "migrate/legacy-gpu")], "the legacy pod as a warning", timeout=30)
    # The namespace moves to enforce: nothing about the pod changed, only its namespace's label.
    res = a.kubectl("label", "namespace", "legacy", "draguard.io/migration-mode=enforce")
    assert res.returncode == 0, res.stderr
    wait_for(
        lambda: legacy() == [("fail", "migrate/legacy-gpu")], "the pod to fail under enforce", timeout=30
    )
    assert controller.scans_ok == 1


def test_watches_that_could_not_start_begin_after_the_next_full_scan(
    api: tuple[Api, Path], tmp_path: Path
) -> None:
    # As when the API server was down while the audit started: no watches yet, then a scan succeeds.
    _, kubeconfig = api
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies, ignore=shutil.ignore_patterns("tests"))
    ctl = AuditController(KubeHttp.from_kubeconfig(str(kubeconfig)), AuditOptions(str(policies)))
    try:
        assert ctl.load_policies() and ctl.watches == []
        assert ctl.scan_once() is not None
        assert ctl.watches and all(w.late for w in ctl.watches)
        # Their resourceVersions postdate that scan: they ask for another, which covers the gap.
        wait_for(lambda: ctl.changes.full_since is not None, "the late watches to ask for a full scan")
        assert ctl.changes.full_since is not None and ctl.changes.full_since > ctl.last_full_start
    finally:
        ctl.stop()


def test_a_pod_naming_a_compliant_owner_is_judged_unless_the_owner_makes_it(
    api: tuple[Api, Path], controller: AuditController
) -> None:
    a, _ = api
    owner = _deployment("owner", "llm-h200")
    _apply(a, owner)
    wait_for(lambda: _entries(a, "owner") == [("pass", "all")], "the Deployment in the report", timeout=30)
    uid = a.kubectl("get", "deployment", "owner", "-n", NS, "-o", "jsonpath={.metadata.uid}").stdout.strip()
    assert uid
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "owner", "uid": uid, "controller": True}

    def pod(name: str, template: str, owner_ref: dict[str, Any]) -> dict[str, Any]:
        tmpl = _deployment("owner", template)["spec"]["template"]
        meta = {
            "name": name,
            "namespace": NS,
            "labels": tmpl["metadata"]["labels"],
            "ownerReferences": [owner_ref],
        }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tmpl["spec"]}

    # The tenant's pods ask for what the policy forbids, naming the compliant Deployment by its real
    # uid, or an owner that does not exist; the honest one is what the Deployment's template makes.
    forged = pod("owner-forged", "llm-h100", ref)
    ghost = pod(
        "owner-ghost", "llm-h100", {**ref, "name": "gone", "uid": "5f0c2a34-0000-4000-8000-000000000000"}
    )
    _apply(a, pod("owner-honest", "llm-h200", ref), forged, ghost)
    wait_for(
        lambda: (
            _entries(a, "owner-forged") == [("fail", RULE)] and _entries(a, "owner-ghost") == [("fail", RULE)]
        ),
        "the forged pods to fail in the report",
        timeout=30,
    )
    assert _entries(a, "owner-honest") == []  # its finding is the Deployment's
    assert _entries(a, "owner") == [("pass", "all")]
    assert (
        a.kubectl("delete", "pods", "owner-honest", "owner-forged", "owner-ghost", "-n", NS).returncode == 0
    )
    assert a.kubectl("delete", "deployment", "owner", "-n", NS).returncode == 0
    wait_for(lambda: _entries(a, "owner-forged") == [], "the forged pods' entries to go", timeout=30)


class _Miss:
    """A falsy poll result that says what was seen instead (wait_for prints the last one)."""

    def __init__(self, seen: str) -> None:
        self.seen = seen

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self.seen


def _slice(products: list[str]) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {"type": {"string": "gpu"}, "productName": {"string": p}},
        }
        for i, p in enumerate(products)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "audit-node-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "audit-node",
            "pool": {"name": "audit-node", "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_a_template_s_verdict_follows_the_devices_a_driver_publishes(
    api: tuple[Api, Path], tmp_path: Path
) -> None:
    # Whether a request can ever be allocated depends on the ResourceSlices, not on the template:
    # a node that joins or loses GPUs changes the report without waiting for the periodic scan.
    a, kubeconfig = api
    opts = watch_driven(policies_with_h200_only(tmp_path / "policies"), max_delay=5.0)
    unsatisfiable = [("warn", "structure/unsatisfiable")]
    passes = [("pass", "all")]

    def h200(want: list[tuple[str, str]], what: str) -> None:
        def check() -> bool | _Miss:
            seen = _entries(a, "llm-h200")
            return seen == want or _Miss(f"entries {seen}, full scans {ctl.scans_ok}")

        wait_for(check, what, timeout=30)

    with running_audit(kubeconfig, opts) as ctl:
        try:
            assert _entries(a, "llm-h200") == passes  # no devices yet: nothing to judge by
            _apply(a, _slice(["NVIDIA H100 80GB HBM3"]))  # a node with H100s only joins
            h200(unsatisfiable, "the H200 template to warn")
            assert _entries(a, "llm-h100") == passes
            _apply(a, _slice(["NVIDIA H100 80GB HBM3", "NVIDIA H200"]))  # the node gains an H200
            h200(passes, "the H200 template to pass")
            _apply(a, _slice(["NVIDIA H100 80GB HBM3"]))  # and loses it again
            h200(unsatisfiable, "the warning back")
            # Each came from a full scan the slice watch asked for: the periodic one is an hour away.
            # (A scan writes its reports before it counts itself.)
            wait_for(lambda: ctl.scans_ok >= 4, "the third full scan to count itself", timeout=10)
            events = "draguard_audit_watch_events_total"
            assert sample(ctl, events, resource="resourceslices", what="change") >= 3
        finally:
            a.kubectl("delete", "resourceslice", "audit-node-gpu.nvidia.com", "--ignore-not-found")
