"""The monitoring component's PrometheusRule, checked by Prometheus' own code (tools/promrules: rulefmt
as Prometheus loads rule files, and the PromQL engine over a TSDB): every rule loads, and the audit's
alerts fire on the series the audit really exports, and only then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kbundle import build, one
from kprom import NOW, promrules, scraped

from webhook.audit.controller import AuditController, AuditOptions
from webhook.audit.scan import judge_pages
from webhook.audit.source import ClusterState
from webhook.audit.writer import WriteResult
from webhook.dra.inventory import Inventory
from webhook.policy.load import load_policies
from webhook.server.caches import KubeHttp

REPO = Path(__file__).resolve().parents[2]
H200_ONLY = """\
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {name: llm-h200-only}
spec:
  mode: enforce
  classes:
  - name: llm
    match: {imageWords: [vllm]}
    deviceClasses: [gpu.nvidia.com-h200]
"""


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rule = one(build("eks", ("monitoring",)), "PrometheusRule", "draguard")
    path = tmp_path_factory.mktemp("rules") / "draguard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def test_every_rule_loads_as_prometheus_loads_it(rules_file: Path) -> None:
    res = promrules("check", str(rules_file))
    assert res.returncode == 0, res.stderr
    alerts = {r["alert"] for r in json.loads(res.stdout)}
    assert {"DraguardAuditViolations", "DraguardAuditScansStale", "DRAPluginErrors"} <= alerts


def test_a_broken_rule_is_refused(tmp_path: Path, rules_file: Path) -> None:
    # The check can fail: a typo in an expression, and a template that does not parse.
    doc = yaml.safe_load(rules_file.read_text())
    [audit] = [g for g in doc["groups"] if g["name"] == "draguard.audit"]
    audit["rules"][0]["expr"] = "max by (rule) (draguard_audit_violations{result=fail}) > 0"
    audit["rules"][1]["annotations"]["summary"] = "{{ $labels.rule "
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    res = promrules("check", str(bad))
    assert res.returncode == 1
    assert "could not parse expression" in res.stderr and "summary" in res.stderr


def _audit_metrics(tmp_path: Path, last_success: float) -> str:
    """The audit's /metrics after a real judgement of two Deployments (one fails the tier policy)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "llm.yaml").write_text(H200_ONLY)
    ctl = AuditController(KubeHttp(None), AuditOptions(str(policies)))
    pols = load_policies(policies)
    objs = [_deployment("bad", "h100"), _deployment("good", "h200")]
    templates = [_template("h100"), _template("h200")]
    state = ClusterState(Inventory.from_objects(templates), {"ml": {}}, frozenset({"v1"}), templates)
    out = judge_pages([objs], pols, state)
    assert ctl._done(out, WriteResult(written=len(out.reports)), 0.0) is not None
    ctl.metrics.last_success.set(last_success)
    return ctl.metrics.render().decode()


def _template(short: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": f"gpu.nvidia.com-{short}"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"llm-{short}", "namespace": "ml", "uid": f"t-{short}"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _deployment(name: str, short: str) -> dict[str, Any]:
    container = {"name": "s", "image": "vllm/vllm-openai", "resources": {"claims": [{"name": "gpu"}]}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml", "uid": name},
        "spec": {
            "template": {
                "spec": {
                    "containers": [container],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"llm-{short}"}],
                }
            }
        },
    }


def _scrapes(text: str, minutes: int = 30) -> list[dict[str, Any]]:
    """The exposition as Prometheus would store it, scraped every minute up to NOW."""
    return scraped(text, {"job": "draguard-audit-metrics"}, [NOW - 60 * m for m in range(minutes)])


def _active(
    rules_file: Path, samples: list[dict[str, Any]], minutes: float, interval: float = 30.0
) -> dict[str, list[dict[str, Any]]]:
    """What Prometheus' rule engine has active at NOW, evaluating every `interval` seconds over the
    last `minutes` (each alert's `for` counted as Prometheus counts it): pending or firing."""
    stdin = json.dumps({"samples": samples, "at": NOW, "from": NOW - 60 * minutes, "interval": interval})
    res = promrules("alerts", str(rules_file), stdin=stdin)
    assert res.returncode == 0, res.stderr
    out: dict[str, list[dict[str, Any]]] = json.loads(res.stdout)
    return out


def _nothing_of_ours(minutes: int) -> list[dict[str, Any]]:
    """A Prometheus that scrapes something else every minute, and nothing of draguard's."""
    up = {"__name__": "up", "job": "other"}
    return [{"labels": up, "t": NOW - 60 * m, "v": 1.0} for m in range(minutes)]


def _firing(active: dict[str, list[dict[str, Any]]], alert: str) -> list[dict[str, Any]]:
    """The alert's active instances, each of which must be past its `for` (firing)."""
    assert [a["state"] for a in active[alert]] == ["firing"] * len(active[alert]), active[alert]
    return active[alert]


def test_audit_alerts_fire_on_the_audits_own_series(rules_file: Path, tmp_path: Path) -> None:
    fired = _active(rules_file, _scrapes(_audit_metrics(tmp_path, last_success=NOW - 120)), 30)
    [violation] = _firing(fired, "DraguardAuditViolations")
    assert violation["labels"] == {"rule": "tier/llm-h200-only"} and violation["value"] == 1.0
    assert fired["DraguardAuditRuleErrors"] == []
    assert fired["DraguardAuditScansStale"] == [] and fired["DraguardAuditDown"] == []
    # The DRA alerts evaluate too (no dra_ series here: nothing fires).
    assert fired["DRAPluginErrors"] == [] and fired["DRAResourceClaimsPending"] == []


def test_a_stale_or_missing_audit_alerts(rules_file: Path, tmp_path: Path) -> None:
    fired = _active(rules_file, _scrapes(_audit_metrics(tmp_path, last_success=NOW - 3600)), 30)
    [stale] = _firing(fired, "DraguardAuditScansStale")
    assert 3590 <= stale["value"] <= 3610
    assert fired["DraguardAuditDown"] == []
    # Nothing scraped at all for 20 minutes: only "down" can say so, once its 15 minutes are up.
    fired = _active(rules_file, _nothing_of_ours(20), 20)
    assert len(_firing(fired, "DraguardAuditDown")) == 1
    assert fired["DraguardAuditScansStale"] == [] and fired["DraguardAuditViolations"] == []


def _webhook_scrapes(
    *, slow: bool = False, broken: bool = False, cert_days: float = 60.0, minutes: int = 30
) -> list[dict[str, Any]]:
    """A webhook replica's /metrics scraped every minute for `minutes`, 20 reviews a minute: each
    answered in 2 s when `slow`; with `broken`, its claims cache unsynced, and 3 minutes before the
    end a rejected policy change, a rule error and a rejected certificate. Its serving certificate
    expires `cert_days` after the last scrape."""
    from webhook.server.metrics import DraStats, Metrics

    m = Metrics()
    m.bind(DraStats, lambda: {"resourceslices": (True, 4), "resourceclaims": (not broken, 0)})
    m.policy_rules.set(7)
    m.serving_certificate(NOW + cert_days * 86400)
    target = {"job": "draguard-webhook-metrics", "pod": "draguard-webhook-7c9-x2"}
    samples = []
    for minute in range(minutes):
        for _ in range(20):
            kids = m.answered("validate", "Pod", "CREATE", "allowed")
            kids.latency.observe(2.0 if slow else 0.004)
            kids.requests.add()
        if broken and minute == minutes - 3:
            m.policy_reload_failures.inc()
            m.rule_errors.labels("internal/quota", "validate").inc()
            m.tls_reloads.labels("invalid").inc()
        samples += scraped(m.render().decode(), target, [NOW - 60 * (minutes - 1 - minute)])
    return samples


def test_webhook_alerts_stay_quiet_on_a_healthy_replica(rules_file: Path) -> None:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    names = [r["alert"] for g in groups if g["name"] == "draguard.webhook" for r in g["rules"]]
    assert len(names) == 8
    fired = _active(rules_file, _webhook_scrapes(), 30)
    assert {a: fired[a] for a in names} == {a: [] for a in names}


def test_webhook_alerts_fire_on_the_webhooks_own_series(rules_file: Path) -> None:
    fired = _active(rules_file, _webhook_scrapes(broken=True), 30)
    [cache] = _firing(fired, "DraguardWebhookCachesNotSynced")
    assert cache["labels"]["resource"] == "resourceclaims"
    assert cache["labels"]["pod"] == "draguard-webhook-7c9-x2"
    [rejected] = _firing(fired, "DraguardPolicyChangeRejected")
    assert rejected["labels"]["pod"] == "draguard-webhook-7c9-x2" and rejected["value"] > 0
    [errors] = _firing(fired, "DraguardAdmissionRuleErrors")
    # A series at 0 from the start: the first error of a rule is an increase.
    assert errors["labels"] == {"rule": "internal/quota"} and errors["value"] > 0
    [cert] = _firing(fired, "DraguardServingCertificateRejected")
    assert cert["labels"]["outcome"] == "invalid"
    assert fired["DraguardAdmissionSlow"] == [] and fired["DraguardWebhookDown"] == []
    [slow] = _firing(_active(rules_file, _webhook_scrapes(slow=True), 30), "DraguardAdmissionSlow")
    assert slow["labels"] == {"endpoint": "validate"} and slow["value"] > 1
    # No replica scraped at all: admission fails closed, and only "down" can say so.
    down = _active(rules_file, _nothing_of_ours(10), 10)
    assert len(_firing(down, "DraguardWebhookDown")) == 1 and down["DraguardWebhookCachesNotSynced"] == []


def test_certificate_expiry_warns_a_week_ahead_and_pages_a_day_ahead(rules_file: Path) -> None:
    soon, today = "DraguardServingCertificateExpiresSoon", "DraguardServingCertificateExpiresToday"

    def active(cert_days: float, minutes: int = 90) -> dict[str, list[dict[str, Any]]]:
        return _active(rules_file, _webhook_scrapes(cert_days=cert_days, minutes=minutes), minutes)

    assert active(8)[soon] == []
    fired = active(3)
    [warning] = fired[soon]
    assert warning["state"] == "firing" and warning["labels"]["pod"] == "draguard-webhook-7c9-x2"
    assert 3 * 86400 - 60 <= warning["value"] <= 3 * 86400
    assert fired[today] == []
    # Under an hour of data: the warning waits out its `for: 1h`.
    [early] = active(3, minutes=40)[soon]
    assert early["state"] == "pending"
    fired = active(0.5)
    assert [a["state"] for a in fired[soon] + fired[today]] == ["firing", "firing"]
    # Expired already: still firing (negative time left), not silently resolved.
    [expired] = active(-1)[today]
    assert expired["state"] == "firing" and expired["value"] < 0


def _driver_scrapes(errors_at_end: int) -> list[dict[str, Any]]:
    """One node's driver scraped every 15 s for 10 minutes (as its ServiceMonitor does), with
    `errors_at_end` failed prepares in the last 30 s and none before."""
    from prometheus_client import generate_latest

    from driver.metrics import DriverMetrics

    d = DriverMetrics()
    target = {"job": "draguard-driver-metrics", "pod": "draguard-driver-q8", "node": "gpu-node-0"}
    samples = []
    steps = 40
    for step in range(steps):
        if step == steps - 2:
            for _ in range(errors_at_end):
                d.prepared(False, 0.01)
        samples += scraped(generate_latest(d.registry).decode(), target, [NOW - 15 * (steps - 1 - step)])
    return samples


def test_a_drivers_first_errors_fire_the_critical_alert(rules_file: Path) -> None:
    # Its very first errors: the series was there at 0 before them, so they are an increase.
    [fired] = _firing(_active(rules_file, _driver_scrapes(6), 10, interval=15), "DRAPluginErrors")
    assert fired["labels"] == {"node": "gpu-node-0"} and fired["value"] >= 5
    assert _active(rules_file, _driver_scrapes(2), 10, interval=15)["DRAPluginErrors"] == []


def _driver_up(down_minutes: int) -> list[dict[str, Any]]:
    """`up` of one node's driver target, scraped every 15 s for 10 minutes, failing (0) for the last
    `down_minutes`: what Prometheus records for a driver pod that crash-loops."""
    labels = {"__name__": "up", "job": "draguard-driver-metrics", "pod": "draguard-driver-q8",
              "node": "gpu-node-0", "namespace": "draguard-driver"}  # fmt: skip
    return [
        {"labels": labels, "t": NOW - 15 * step, "v": 0.0 if step < down_minutes * 4 else 1.0}
        for step in range(40)
    ]


def test_a_driver_that_stops_answering_pages_after_five_minutes(rules_file: Path) -> None:
    def active(down_minutes: int, job: str = "draguard-driver-metrics") -> list[dict[str, Any]]:
        samples = [{**x, "labels": {**x["labels"], "job": job}} for x in _driver_up(down_minutes)]
        return _active(rules_file, samples, 10, interval=15)["DraguardDriverDown"]

    assert active(0) == []
    [restarting] = active(3)  # a restart, not an outage: pending, no page
    assert restarting["state"] == "pending"
    [down] = active(7)
    assert down["state"] == "firing" and down["labels"]["node"] == "gpu-node-0" and down["value"] == 0
    # Another job's failing target is not the driver's.
    assert active(7, job="node-exporter") == []


def _dra_scrapes(pending_from_minute: int, minutes: int = 20) -> list[dict[str, Any]]:
    """Two webhook replicas' DRA series, scraped every minute: both see the same cluster (claims
    pending from `pending_from_minute` on; H100s 1 free of 20, A100s 5 of 10; every claim allocated
    45 s after its creation)."""
    from webhook.server.metrics import DraStats, Metrics

    samples = []
    replicas = []
    for pod in ("draguard-webhook-7c9-x2", "draguard-webhook-7c9-k4"):
        replicas.append((Metrics(), {"job": "draguard-webhook-metrics", "pod": pod}))
    for minute in range(minutes):
        pending = 2 if minute >= pending_from_minute else 0
        stats = DraStats(30, pending, 28 - pending, {"h100": 1, "a100": 5}, {"h100": 19, "a100": 5})
        for m, target in replicas:
            m.bind(lambda stats=stats: stats, lambda: {"resourceclaims": (True, 30)})
            for _ in range(10):
                m.allocation.observe(45.0)
            samples += scraped(m.render().decode(), target, [NOW - 60 * (minutes - 1 - minute)])
    return samples


def test_the_dra_alerts_fire_once_for_the_cluster_not_once_per_replica(rules_file: Path) -> None:
    fired = _active(rules_file, _dra_scrapes(pending_from_minute=8), 20)
    [pending] = _firing(fired, "DRAResourceClaimsPending")
    assert pending["labels"] == {} and pending["value"] == 2
    [low] = _firing(fired, "DRADeviceAvailabilityLow")
    assert low["labels"] == {"device_class": "h100"} and low["value"] == 0.05
    [slow] = _firing(fired, "DRAAllocationSlow")
    assert slow["labels"] == {} and slow["value"] > 30
    # Claims pending for 3 minutes: waiting out the article's 5, not paging yet.
    [early] = _active(rules_file, _dra_scrapes(pending_from_minute=17), 20)["DRAResourceClaimsPending"]
    assert early["state"] == "pending"
