"""Hostile tenants through the real API server, and forged reviews sent straight to the webhook.

A tenant allowed only to create ResourceClaims in its own namespace sends server dry-run creates
with large never-seen selectors (nothing is persisted): the webhook's memory stays bounded and
other callers keep getting timely answers. A client on the network that POSTs forged reviews to
the webhook (no client certificate is configured here) changes nobody else's verdict.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from tests.e2e.helpers import Kubectl, wait_for
from webhook.dev import scenarios
from webhook.dev.cluster import LocalCluster

RSS_BOUND_MIB = 256


def _webhook_pid(cluster: LocalCluster) -> int:
    pid = (cluster.state.get("pids") or {}).get("webhook")
    if not pid:
        pytest.skip("the webhook is not part of this cluster (webhook/server missing)")
    return int(pid)


def _rss_mib(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1024 * 1024)


def _as(cluster: LocalCluster, user: str | None, method: str, path: str, body: Any) -> tuple[int, Any]:
    """One API request with the admin certificate, impersonating `user` when given."""
    kube = cluster.kube()
    req = urllib.request.Request(kube.server + path, data=json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    if user:
        req.add_header("Impersonate-User", user)
    try:
        with urllib.request.urlopen(req, context=kube._context(), timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _selector(tag: str, size: int = 6000) -> str:
    terms = []
    j = 0
    while sum(len(t) for t in terms) < size:
        terms.append(f"device.attributes['gpu.nvidia.com'].productName == 'NVIDIA {tag} {j}'")
        j += 1
    return "device.driver == 'gpu.nvidia.com' && (" + " || ".join(terms) + ")"


def _claim(ns: str, name: str, selectors: list[str], cls: str = scenarios.H100) -> dict[str, Any]:
    reqs = [
        {"name": f"r{i}", "exactly": {"deviceClassName": cls, "selectors": [{"cel": {"expression": s}}]}}
        for i, s in enumerate(selectors)
    ] or [{"name": "gpu", "exactly": {"deviceClassName": cls}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": reqs}},
    }


def _grant_claim_create(cluster: LocalCluster, ns: str, user: str) -> None:
    kube = cluster.kube()
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "claims-only", "namespace": ns},
            "rules": [
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create"]}
            ],
        },
    )
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "claims-only", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims-only"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


def test_a_claims_only_tenant_cannot_exhaust_the_webhook(
    cluster: LocalCluster, namespace: Callable[..., str]
) -> None:
    pid = _webhook_pid(cluster)
    ns = namespace("hostile")
    tenant = f"tenant-{ns}"
    _grant_claim_create(cluster, ns, tenant)
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims?dryRun=All"
    wait_for(lambda: _as(cluster, tenant, "POST", path, _claim(ns, "probe", []))[0] == 201, "tenant RBAC")
    before = _rss_mib(pid)
    latencies: list[float] = []
    peak = before
    for i in range(80):
        sels = [_selector(f"{i}-{k}-{uuid.uuid4().hex[:6]}") for k in range(2)]
        status, doc = _as(cluster, tenant, "POST", path, _claim(ns, f"c{i}", sels))
        # Admitted (with warnings) or refused by the API server itself: never a webhook failure.
        assert status in (201, 422), doc
        assert "failed calling webhook" not in json.dumps(doc)
        if i % 4 == 0:
            t0 = time.perf_counter()
            status, doc = _as(cluster, None, "POST", path, _claim(ns, f"normal-{i}", []))
            latencies.append(time.perf_counter() - t0)
            assert status == 201, doc
            peak = max(peak, _rss_mib(pid))
    peak = max(peak, _rss_mib(pid))
    latencies.sort()
    print(
        f"\nwebhook RSS {before:.0f} -> peak {peak:.0f} MiB; normal dry-run create "
        f"p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    assert peak <= RSS_BOUND_MIB
    assert peak - before < 64, (before, peak)
    # Through the API server (3 s webhook timeout), with the tenant's flood in between.
    assert latencies[-1] < 2.0, latencies
    # Nothing was persisted.
    assert not cluster.kube().get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]


def _forge(cluster: LocalCluster, endpoint: str, review: dict[str, Any]) -> dict[str, Any]:
    """POST an AdmissionReview straight to the webhook's port, as any pod on the network could."""
    port = int(cluster.state["ports"]["webhook"])
    ctx = ssl.create_default_context(cafile=str(cluster.paths.certs / "webhook-ca.crt"))
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}/{endpoint}", data=json.dumps(review).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        out: dict[str, Any] = json.loads(r.read())["response"]
        return out


def _review(obj: dict[str, Any], group: str, kind: str, ns: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": user},
            "object": obj,
            "dryRun": False,
        },
    }


def test_forged_reviews_change_no_one_elses_verdict(
    cluster: LocalCluster, kubectl: Kubectl, namespace: Callable[..., str]
) -> None:
    _webhook_pid(cluster)
    ns = namespace("team", {"draguard.io/migration-mode": "enforce"})
    # The watch has the namespace once its legacy pods are denied.
    wait_for(lambda: kubectl.apply(scenarios.legacy_pod(ns), "--dry-run=server").returncode != 0, "enforce")
    # A forged Namespace review saying the mode is observe ...
    forged_ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"draguard.io/migration-mode": "observe"}},
    }
    assert _forge(cluster, "validate", _review(forged_ns, "", "Namespace", "", "mallory"))["allowed"]
    # ... and forged claims filling the namespace's H100 budget (8).
    for i in range(8):
        forged = _claim(ns, f"phantom-{i}", [], scenarios.H100)
        assert _forge(cluster, "validate", _review(forged, "resource.k8s.io", "ResourceClaim", ns, "mallory"))
    # The API server's own requests: the legacy pod is still denied, a real H100 claim admitted.
    denied = kubectl.apply(scenarios.legacy_pod(ns), "--dry-run=server")
    assert denied.returncode != 0 and "migrate/legacy-gpu" in denied.stderr
    # The forged claims reserved ledger capacity (the webhook cannot tell a forged review from the
    # API server's without --client-ca): the real claim may be refused with the quota message until
    # those reservations expire (the ledger's 10 s TTL, docs/reliability.md), never for long.
    refusals: list[str] = []

    def admitted() -> bool:
        status, doc = _as(cluster, None, "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                          _claim(ns, "real-h100", []))  # fmt: skip
        if status == 201:
            return True
        assert status == 403 and "quota/" in json.dumps(doc), doc
        refusals.append(str(doc.get("message", "")))
        return False

    t0 = time.monotonic()
    wait_for(admitted, "the real H100 claim admitted once forged reservations expire", 30)
    assert time.monotonic() - t0 < 25, refusals


def test_forged_admissions_cannot_grow_the_overlay(
    cluster: LocalCluster, namespace: Callable[..., str]
) -> None:
    pid = _webhook_pid(cluster)
    ns = namespace("overlay")
    before = _rss_mib(pid)
    for i in range(120):
        tmpl = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"t{i}", "namespace": ns, "annotations": {"pad": "a" * 2_800_000}},
            "spec": {
                "spec": {
                    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": scenarios.H100}}]}
                },
                "pad": "s" * 100_000,
            },
        }
        # A new identity each time: every one gets its own share, the total stays bounded.
        resp = _forge(
            cluster, "validate", _review(tmpl, "resource.k8s.io", "ResourceClaimTemplate", ns, f"m{i}")
        )
        assert resp["allowed"] is True
    after = _rss_mib(pid)
    print(f"\nwebhook RSS {before:.0f} -> {after:.0f} MiB after 120 forged 2.9 MiB templates")
    assert after <= RSS_BOUND_MIB
    assert after - before < 64, (before, after)
