# ruff: noqa: F811  (pytest fixtures imported from tests.e2e.conftest are parameters here)
"""The server's caches and `draguard certs` against a real kube-apiserver (the local control plane).

Skips (with the reason) when the control-plane binaries are not built; see scripts/build-k8s.sh.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import cluster, kubectl, namespace  # noqa: F401  (session fixtures)
from tests.server.conftest import run_cli
from webhook.dev.cluster import LocalCluster
from webhook.server.caches import ClusterCache, KubeHttp
from webhook.server.metrics import Metrics
from webhook.server.usage import CacheView, Rebuilder

pytestmark = pytest.mark.e2e


def wait(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def claim(ns: str, name: str, cls: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}]}
        },
    }


def test_caches_list_watch_and_usage(cluster: LocalCluster, namespace: Callable[..., str]) -> None:
    kube = cluster.kube()
    metrics = Metrics()
    cache = ClusterCache.connect(KubeHttp.from_kubeconfig(str(cluster.kubeconfig)), metrics)
    assert cache.dra_version == "v1" and {"v1", "v1beta1", "v1beta2"} <= set(cache.served)
    views: list[CacheView] = []
    rebuilder = Rebuilder(cache, metrics, views.append, lambda: None, debounce=0.05)
    metrics.bind(lambda: views[-1].stats, cache.states)
    cache.start()
    rebuilder.start()
    try:
        assert cache.wait_synced(30), cache.states()
        # Kubernetes 1.37 streams each watch's initial state (sendInitialEvents): no paged list.
        assert {n: r.watch_list for n, r in cache.reflectors.items()} == dict.fromkeys(cache.reflectors, True)
        api_slices = kube.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
        view = wait(lambda: views[-1] if views else None, what="first view")
        published = sum(len(s["spec"].get("devices") or []) for s in api_slices)
        assert len(view.inventory.devices) == published
        assert set(view.inventory.classes) == {
            c["metadata"]["name"] for c in kube.get("/apis/resource.k8s.io/v1/deviceclasses")["items"]
        }
        ns = namespace("cache", {"draguard.io/team": "vision"})
        cls = sorted(view.inventory.classes)[0]
        before = len(views)
        kube.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim(ns, "c1", cls, 2))

        def reflected() -> CacheView | None:
            v = views[-1]
            return v if len(views) > before and v.usage and v.usage.devices.get((ns, cls)) == 2 else None

        v = wait(reflected, what="claim in usage")
        assert v.usage is not None and v.usage.devices.get(("team:vision", cls)) == 2
        assert v.namespace_labels[ns]["draguard.io/team"] == "vision"
        assert v.stats.claims_total >= 1
        kube.delete(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/c1")
        wait(
            lambda: views[-1].usage and (ns, cls) not in views[-1].usage.devices, what="claim gone from usage"
        )
        text = metrics.render().decode()
        for res in (
            "resourceslices",
            "deviceclasses",
            "resourceclaims",
            "resourceclaimtemplates",
            "namespaces",
            "resourcequotas",
        ):
            assert f'draguard_cache_synced{{resource="{res}"}} 1.0' in text
            # How long its list took, so a slow start on a large cluster can be told apart from the
            # first rebuild.
            assert _sample(text, f'draguard_cache_list_duration_seconds{{resource="{res}"}}') > 0
            assert cache.reflectors[res].list_seconds is not None
    finally:
        rebuilder.stop()
        cache.stop()


def test_running_webhook_reports_synced_caches(cluster: LocalCluster) -> None:
    port = cluster.state["ports"].get("webhook")
    if not port:
        pytest.skip("the harness did not start the webhook")
    ctx = ssl.create_default_context(cafile=str(cluster.paths.certs / "webhook-ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=5) as resp:
        text = resp.read().decode()
    assert 'draguard_cache_synced{resource="resourceclaims"} 1.0' in text
    # Start to first view published (what readiness waited for), and each list within it.
    sync = _sample(text, "draguard_cache_sync_duration_seconds")
    claims_list = _sample(text, 'draguard_cache_list_duration_seconds{resource="resourceclaims"}')
    assert 0 < claims_list <= sync, text


def _sample(text: str, series: str) -> float:
    """The value of one series in a Prometheus text exposition (fails when it is missing)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not in /metrics")
    assert "dra_devices_available" in text and "dra_resource_claims_total" in text


def _webhook_config(kind: str, name: str) -> dict[str, Any]:
    hook = {
        "name": f"{kind.lower()}.e2e.draguard.io",
        "clientConfig": {"url": "https://127.0.0.1:1/never"},
        "rules": [
            {
                "apiGroups": ["e2e.draguard.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["nothing"],
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook],
    }


def test_certs_command_secret_and_ca_bundle(
    cluster: LocalCluster,
    namespace: Callable[..., str],
    tmp_path: Path,
) -> None:
    kube = cluster.kube()
    ns = namespace("certs")
    name = f"draguard-e2e-{uuid.uuid4().hex[:6]}"
    base = "/apis/admissionregistration.k8s.io/v1"
    kube.create(
        f"{base}/mutatingwebhookconfigurations", _webhook_config("MutatingWebhookConfiguration", name)
    )
    kube.create(
        f"{base}/validatingwebhookconfigurations", _webhook_config("ValidatingWebhookConfiguration", name)
    )
    harness_bundle = (
        kube.get(f"{base}/validatingwebhookconfigurations/draguard")["webhooks"][0]["clientConfig"].get(
            "caBundle"
        )
        if cluster.state["ports"].get("webhook")
        else None
    )
    try:
        argv = [
            "certs",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--namespace",
            ns,
            "--service",
            "draguard-webhook",
            "--secret",
            "draguard-webhook-tls",
            "--webhook-config",
            name,
        ]
        assert run_cli(argv) == 0
        secret = kube.get(f"/api/v1/namespaces/{ns}/secrets/draguard-webhook-tls")
        assert secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "draguard"
        bundle = base64.b64decode(secret["data"]["ca.crt"])
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            cfg = kube.get(f"{base}/{kind}/{name}")
            assert base64.b64decode(cfg["webhooks"][0]["clientConfig"]["caBundle"]) == bundle
        # Only the named configurations are touched.
        if harness_bundle is not None:
            after = kube.get(f"{base}/validatingwebhookconfigurations/draguard")["webhooks"][0][
                "clientConfig"
            ]
            assert after.get("caBundle") == harness_bundle
        # Idempotent: a second run keeps the certificate.
        crt = secret["data"]["tls.crt"]
        assert run_cli(argv) == 0
        assert kube.get(f"/api/v1/namespaces/{ns}/secrets/draguard-webhook-tls")["data"]["tls.crt"] == crt
        # CA rotation: the bundle keeps the previous CA next to the new one.
        assert run_cli([*argv, "--rotate-ca"]) == 0
        secret2 = kube.get(f"/api/v1/namespaces/{ns}/secrets/draguard-webhook-tls")
        assert base64.b64decode(secret2["data"]["ca.crt"]).count(b"BEGIN CERTIFICATE") == 2
        cfg = kube.get(f"{base}/validatingwebhookconfigurations/{name}")
        assert base64.b64decode(cfg["webhooks"][0]["clientConfig"]["caBundle"]) == base64.b64decode(
            secret2["data"]["ca.crt"]
        )
        assert json.dumps(secret2["data"]) != json.dumps(secret["data"])
    finally:
        kube.delete(f"{base}/mutatingwebhookconfigurations/{name}")
        kube.delete(f"{base}/validatingwebhookconfigurations/{name}")


def test_quota_usage_reads_the_cluster(
    cluster: LocalCluster, namespace: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    kube = cluster.kube()
    ns = namespace("usage", {"draguard.io/team": "speech"})
    classes = [c["metadata"]["name"] for c in kube.get("/apis/resource.k8s.io/v1/deviceclasses")["items"]]
    cls = sorted(classes)[0]
    kube.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim(ns, "u1", cls, 1))
    root = Path(__file__).resolve().parents[2]
    capsys.readouterr()
    rc = run_cli(
        [
            "quota",
            "usage",
            "--policies",
            str(root / "policies"),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-o",
            "json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {"scope": ns, "deviceClass": cls, "devices": 1} in out["devices"]
    assert {"scope": "team:speech", "deviceClass": cls, "devices": 1} in out["devices"]


def test_template_creator_creates_reuses_and_refuses_foreign(
    cluster: LocalCluster, namespace: Callable[..., str]
) -> None:
    from webhook.server.caches import ApiError, KubeTemplateCreator

    kube = cluster.kube()
    ns = namespace("tmpl")
    creator = KubeTemplateCreator(KubeHttp.from_kubeconfig(str(cluster.kubeconfig)))
    cls = sorted(c["metadata"]["name"] for c in kube.get("/apis/resource.k8s.io/v1/deviceclasses")["items"])[
        0
    ]

    def tmpl(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}
            },
        }

    ours = tmpl("draguard-x", {"app.kubernetes.io/managed-by": "draguard"})
    assert creator.ensure(ours, 5.0) == "created"
    assert creator.ensure(ours, 5.0) == "exists"
    kube.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", tmpl("someone-elses", {}))
    with pytest.raises(ApiError) as exc:
        creator.ensure(tmpl("someone-elses", {"app.kubernetes.io/managed-by": "draguard"}), 5.0)
    assert exc.value.status == 409 and "not managed by draguard" in str(exc.value)
