"""The monitoring component: alerts match the DRA monitoring table, and every series they read is one
the webhook or the driver really exports, with the labels the expressions group by."""

from __future__ import annotations

import re

import pytest
from kbundle import build, find, one
from kprom import audit_series, exported_series


def _rules(group: str = "draguard.dra") -> dict[str, dict[str, object]]:
    objs = build("eks", ("monitoring",))
    rule = one(objs, "PrometheusRule", "draguard")
    return {r["alert"]: r for g in rule["spec"]["groups"] if g["name"] == group for r in g["rules"]}


def test_alerts_encode_the_seed_thresholds() -> None:
    rules = _rules()
    assert set(rules) == {
        "DRAResourceClaimsPending",
        "DRADeviceAvailabilityLow",
        "DRAAllocationSlow",
        "DRAPluginErrors",
    }
    pending = rules["DRAResourceClaimsPending"]
    assert "dra_resource_claims_pending" in str(pending["expr"]) and pending["for"] == "5m"
    avail = " ".join(str(rules["DRADeviceAvailabilityLow"]["expr"]).split())
    assert "dra_devices_available" in avail and "dra_devices_allocated" in avail and avail.endswith("< 0.10")
    slow = " ".join(str(rules["DRAAllocationSlow"]["expr"]).split())
    assert slow.startswith("histogram_quantile(0.99,") and "dra_allocation_duration_seconds_bucket" in slow
    assert slow.endswith("> 30")
    errors = rules["DRAPluginErrors"]
    assert re.search(r"increase\(dra_plugin_errors_total\[1m\]\)\) >= 5$", str(errors["expr"]))
    assert errors["labels"] == {"severity": "critical"}
    assert {r["labels"]["severity"] for n, r in rules.items() if n != "DRAPluginErrors"} == {"warning"}  # type: ignore[index]


def test_alerts_read_series_the_exporters_publish() -> None:
    # node: added by the driver ServiceMonitor's relabeling, not by the exporter.
    _read_exported_series(_rules(), exported_series(), r"dra_[a-z_]+", "the webhook or the driver", {"node"})


def _read_exported_series(
    rules: dict[str, dict[str, object]],
    exported: dict[str, set[str]],
    pattern: str,
    who: str,
    scrape_labels: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Every series each rule reads (names matching `pattern`) is exported by `who`, with every
    label the rule groups by (le: a histogram's own; `scrape_labels`: added when scraped)."""
    for name, rule in rules.items():
        expr = str(rule["expr"])
        used = set(re.findall(rf"\b({pattern})\b", expr))
        assert used, name
        for series in used:
            assert series in exported, f"{name}: {series} is not exported by {who}"
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (x.strip() for x in group.split(",")):
                if label != "le" and label not in scrape_labels:
                    assert all(label in exported[s] for s in used), f"{name}: label {label} missing on {used}"


def test_webhook_alerts_read_series_the_webhook_publishes() -> None:
    rules = _rules("draguard.webhook")
    assert set(rules) == {
        "DraguardWebhookDown",
        "DraguardWebhookCachesNotSynced",
        "DraguardPolicyChangeRejected",
        "DraguardAdmissionRuleErrors",
        "DraguardAdmissionSlow",
        "DraguardServingCertificateRejected",
        "DraguardServingCertificateExpiresSoon",
        "DraguardServingCertificateExpiresToday",
    }
    _read_exported_series(rules, exported_series(), r"draguard_[a-z_]+", "the webhook")
    # Admission fails closed when no replica answers or the certificate expires: those page.
    paging = {"DraguardWebhookDown", "DraguardServingCertificateExpiresToday"}
    for name in paging:
        assert rules[name]["labels"] == {"severity": "critical"}, name
    others = {str(r["labels"]["severity"]) for n, r in rules.items() if n not in paging}  # type: ignore[index]
    assert others == {"warning"}


def test_audit_alerts_read_series_the_audit_publishes() -> None:
    rules = _rules("draguard.audit")
    assert set(rules) == {
        "DraguardAuditViolations",
        "DraguardAuditRuleErrors",
        "DraguardAuditScansStale",
        "DraguardAuditDown",
    }
    _read_exported_series(rules, audit_series(), r"draguard_audit_[a-z_]+", "the audit")
    for name, rule in rules.items():
        assert rule["labels"] == {"severity": "warning"}, name  # type: ignore[comparison-overlap]


def test_scrape_targets_match_the_workloads() -> None:
    objs = build("eks", ("monitoring",))
    monitors = {m["metadata"]["name"]: m for m in find(objs, "ServiceMonitor")}
    webhook_svc = one(objs, "Service", "draguard-webhook-metrics")
    driver_svc = one(objs, "Service", "draguard-driver-metrics")
    hook = monitors["draguard-webhook"]
    assert hook["spec"]["selector"]["matchLabels"].items() <= webhook_svc["metadata"]["labels"].items()
    (ep,) = hook["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in webhook_svc["spec"]["ports"]} and ep["scheme"] == "http"
    hook_ctr = one(objs, "Deployment", "draguard-webhook")["spec"]["template"]["spec"]["containers"][0]
    dep_ports = {p["name"]: p["containerPort"] for p in hook_ctr["ports"]}
    (svc_port,) = webhook_svc["spec"]["ports"]
    assert svc_port["targetPort"] == "probes" and svc_port["port"] == dep_ports["probes"]
    drv = monitors["draguard-driver"]
    assert drv["spec"]["selector"]["matchLabels"].items() <= driver_svc["metadata"]["labels"].items()
    ds = one(objs, "DaemonSet", "draguard-driver")
    assert driver_svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (dep,) = drv["spec"]["endpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in dep["relabelings"]
    ctr = ds["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in ctr["ports"]


def test_audit_metrics_are_scraped_from_its_metrics_port() -> None:
    objs = build("eks", ("monitoring",))
    monitor = one(objs, "ServiceMonitor", "draguard-audit")
    svc = one(objs, "Service", "draguard-audit-metrics")
    dep = one(objs, "Deployment", "draguard-audit")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (ep,) = monitor["spec"]["endpoints"]
    (port,) = svc["spec"]["ports"]
    assert ep["port"] == port["name"] and ep["scheme"] == "http"
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    declared = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert port["targetPort"] == "metrics" and declared["metrics"] == port["port"]
    args = ctr["args"]
    assert args[args.index("--metrics-port") + 1] == str(port["port"])


@pytest.mark.parametrize("overlay", ["base", "aks", "eks", "gke", "local"])
def test_the_alerts_are_optional_and_build_on_every_overlay(overlay: str) -> None:
    # Without the component nothing needs the Prometheus Operator's CRDs, so the bundle applies on
    # clusters that lack them (tests/kustomize/test_kustomize_apiserver.py applies the overlays so).
    plain = build(overlay)
    assert not [o for o in plain if str(o["apiVersion"]).startswith("monitoring.coreos.com/")]
    with_alerts = build(overlay, ("monitoring",))
    ops = sorted(
        (o["kind"], o["metadata"]["name"])
        for o in with_alerts
        if o["apiVersion"] == "monitoring.coreos.com/v1"
    )
    assert ops == [
        ("PrometheusRule", "draguard"),
        ("ServiceMonitor", "draguard-audit"),
        ("ServiceMonitor", "draguard-driver"),
        ("ServiceMonitor", "draguard-webhook"),
    ]
    groups = {g["name"] for g in one(with_alerts, "PrometheusRule", "draguard")["spec"]["groups"]}
    assert groups == {"draguard.dra", "draguard.driver", "draguard.webhook", "draguard.audit"}


def test_driver_down_reads_the_job_and_node_the_driver_scrape_gives() -> None:
    objs = build("eks", ("monitoring",))
    [rule] = _rules("draguard.driver").values()
    job = re.fullmatch(r'up\{job="([a-z0-9-]+)"\} == 0', str(rule["expr"]))
    assert job, rule["expr"]
    # The Prometheus Operator names a ServiceMonitor's job after the Service it scrapes.
    monitor = one(objs, "ServiceMonitor", "draguard-driver")
    selected = monitor["spec"]["selector"]["matchLabels"]
    [service] = [
        o
        for o in find(objs, "Service")
        if o["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]
        and selected.items() <= o["metadata"].get("labels", {}).items()
    ]
    assert service["metadata"]["name"] == job.group(1)
    relabel = monitor["spec"]["endpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in relabel
    assert "{{ $labels.node }}" in str(rule["annotations"])
    assert rule["labels"] == {"severity": "critical"}
