"""The monitoring component's Grafana dashboard, checked by Prometheus' own code (tools/promrules).

Every panel query parses as Prometheus parses it. Evaluated by the PromQL engine over the series the
webhook, the driver and the audit really export (scraped every 15 s, with the target labels their
ServiceMonitors add), every query returns data, and every legend names labels that data carries: a
misspelt series or a legend grouped by a label the query drops shows as an empty or unlabelled panel,
and fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kbundle import build, one
from kprom import NOW, promrules, scraped
from prometheus_client import generate_latest

from driver.metrics import DriverMetrics
from webhook.audit.metrics import AuditMetrics
from webhook.server.metrics import DraStats, Metrics

# What Grafana puts in place of its own variables before the query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s"}
Query = tuple[str, str, str, str]  # (panel title, refId, expr, legendFormat)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    cm = one(build("eks", ("monitoring",)), "ConfigMap", "draguard-dashboard")
    doc: dict[str, Any] = json.loads(cm["data"]["draguard.json"])
    return doc


def _queries(dash: dict[str, Any]) -> list[Query]:
    return [
        (str(p["title"]), str(t["refId"]), str(t["expr"]), str(t.get("legendFormat") or ""))
        for p in dash["panels"]
        for t in p.get("targets") or []
    ]


def _webhook_metrics() -> str:
    m = Metrics()
    m.bind(
        lambda: DraStats(
            3, 1, 2, {"gpu.nvidia.com-h100": 6, "gpu.nvidia.com-a100": 1}, {"gpu.nvidia.com-h100": 2}
        ),
        lambda: {"resourceslices": (True, 4), "resourceclaims": (True, 3)},
    )
    for endpoint, verdict in (("validate", "denied"), ("validate", "warned"), ("mutate", "allowed")):
        kids = m.answered(endpoint, "Pod", "CREATE", verdict)
        kids.latency.observe(0.004)
        kids.requests.add()
    m.found("tier/gpu-tiers", "enforce", "validate").add()
    m.review_cache_miss.add()
    m.review_cache_hit.add()
    m.rule_errors.labels("quota/team-budgets", "validate").inc()
    m.bad_requests.labels("not-json").inc()
    m.patches.labels("applied").inc()
    m.generated.labels("created").inc()
    m.policy_rules.set(7)
    m.policy_reload_failures.inc()
    m.tls_reloads.labels("invalid").inc()
    m.serving_certificate(NOW + 30 * 86400)
    m.allocation.observe(2.0)
    return m.render().decode()


def _driver_metrics() -> str:
    d = DriverMetrics()
    d.set_devices({"gpu": 4, "mig": 0})
    d.prepared(True, 0.02)
    d.unprepared(True, 0.01)
    d.nvml_error("nvmlDeviceGetCount")
    d.slice_publishes.labels(result="success").inc()
    return generate_latest(d.registry).decode()


def _audit_metrics() -> str:
    a = AuditMetrics()
    a.set_violations({("tier/gpu-tiers", "fail"): 2, ("audit/cannot-list", "error"): 1})
    a.scans.labels("ok").inc()
    a.namespace_scans.labels("ok").inc()
    a.duration.observe(1.5)
    a.objects.set(40)
    a.last_success.set(NOW - 90)
    return a.render().decode()


# The target labels each ServiceMonitor gives its series (the driver's also relabels the node).
TARGETS = (
    (_webhook_metrics, {"job": "draguard-webhook-metrics", "namespace": "draguard-system",
                        "pod": "draguard-webhook-7c9-x2", "instance": "10.0.0.5:8081"}),
    (_driver_metrics, {"job": "draguard-driver-metrics", "namespace": "draguard-driver",
                       "pod": "draguard-driver-q8", "instance": "10.0.1.7:9400", "node": "gpu-node-0"}),
    (_audit_metrics, {"job": "draguard-audit-metrics", "namespace": "draguard-system",
                      "pod": "draguard-audit-5d-k1", "instance": "10.0.0.9:8082"}),
)  # fmt: skip


def _scrapes(minutes: int = 30, step: int = 15) -> list[dict[str, Any]]:
    times = [NOW - step * i for i in range(minutes * 60 // step)]
    return [x for render, target in TARGETS for x in scraped(render(), target, times)]


def problems(dash: dict[str, Any], tmp: Path) -> list[str]:
    """What is wrong with the dashboard's queries, one line each (empty: every panel shows data)."""
    out: list[str] = []
    rules, names = [], {}
    for i, (title, ref, expr, legend) in enumerate(_queries(dash)):
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        if "$" in expr:
            out.append(f"{title} {ref}: a variable Grafana does not fill in: {expr}")
            continue
        name = f"Q{i}"
        names[name] = (title, ref, legend)
        rules.append({"alert": name, "expr": expr})
    path = tmp / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promrules("check", str(path))
    if checked.returncode != 0:
        return [*out, f"Prometheus refuses a query: {checked.stderr.strip()}"]
    res = promrules("eval", str(path), stdin=json.dumps({"samples": _scrapes(), "at": NOW}))
    assert res.returncode == 0, res.stderr
    for name, series in json.loads(res.stdout).items():
        title, ref, legend = names[name]
        if not series:
            out.append(f"{title} {ref}: no data from the exporters' series")
            continue
        for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend):
            if not all(label in s["labels"] for s in series):
                out.append(f"{title} {ref}: the legend names {label}, which the query's result lacks")
    return out


def test_every_panel_shows_data_from_the_series_draguard_exports(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    assert problems(dashboard, tmp_path) == []
    # The article's monitoring table is all on it.
    exprs = " ".join(e for _t, _r, e, _l in _queries(dashboard))
    for series in (
        "dra_resource_claims_total", "dra_resource_claims_pending", "dra_resource_claims_allocated",
        "dra_devices_available", "dra_devices_allocated", "dra_allocation_duration_seconds_bucket",
        "dra_plugin_errors_total",
    ):  # fmt: skip
        assert series in exprs, series


def test_a_misspelt_series_a_wrong_legend_and_a_broken_query_are_found(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    # The check can fail, and says which panel.
    bad = json.loads(json.dumps(dashboard))
    targets = [t for p in bad["panels"] for t in p.get("targets") or []]
    targets[0]["expr"] = "max(dra_resource_claim_total)"
    targets[1]["legendFormat"] = "{{device_class}}"  # max() without by: no device_class
    found = problems(bad, tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("ResourceClaims A: no data") and "legend names device_class" in found[1]
    targets[2]["expr"] = "max(dra_resource_claims_allocated"
    assert problems(bad, tmp_path)[0].startswith("Prometheus refuses a query")
    targets[2]["expr"] = 'max(dra_resource_claims_allocated{namespace=~"$namespace"})'
    assert "a variable Grafana does not fill in" in problems(bad, tmp_path)[0]


def test_the_dashboard_is_one_grafana_document_the_sidecar_loads(dashboard: dict[str, Any]) -> None:
    objs = build("eks", ("monitoring",))
    cm = one(objs, "ConfigMap", "draguard-dashboard")
    assert cm["metadata"]["namespace"] == "draguard-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["uid"] == "draguard" and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        # Every query goes to the Prometheus the user picks, never to a datasource uid of ours.
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["description"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs) and all(t["datasource"] == p["datasource"] for t in p["targets"])
    (var,) = dashboard["templating"]["list"]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    # Only with the component: the base and the overlays ship no dashboard.
    assert not [
        o for o in build("eks") if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "draguard-dashboard"
    ]
