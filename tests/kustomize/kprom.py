"""Prometheus for the monitoring tests: an exposition stored as scrapes would store it, and
tools/promrules (Prometheus' own rule loading and PromQL engine) to judge rules and queries by."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.gotool import run_tool

NOW = 1_800_000_000.0  # the evaluation time of every test


def scraped(text: str, target: Mapping[str, str], times: Iterable[float]) -> list[dict[str, Any]]:
    """The samples of exposition `text` scraped at each of `times`, with the target labels its
    ServiceMonitor adds (job, pod, node, ...)."""
    series = [
        ({**target, **s.labels, "__name__": s.name}, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]
    return [{"labels": labels, "t": t, "v": v} for t in times for labels, v in series]


def promrules(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_tool("promrules", *args, stdin=stdin)


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, from the exporters' own /metrics rendering."""
    from prometheus_client import generate_latest

    from driver.metrics import DriverMetrics
    from webhook.server.metrics import DraStats, Metrics

    hook = Metrics()
    hook.bind(
        lambda: DraStats(1, 1, 0, {"gpu.nvidia.com-h100": 3}, {"gpu.nvidia.com-h100": 5}),
        lambda: {"resourceslices": (True, 2)},
    )
    hook.allocation.observe(2.0)
    kids = hook.answered("validate", "Pod", "CREATE", "denied")
    kids.latency.observe(0.01)
    kids.requests.add()
    hook.rule_errors.labels("quota/team-budgets", "validate").inc()
    hook.tls_reloads.labels("invalid").inc()
    hook.policy_reload_failures.inc()
    hook.bad_requests.labels("too-large").inc()
    hook.serving_certificate(NOW + 60 * 86400)
    drv = DriverMetrics()
    drv.nvml_error("nvmlDeviceGetCount")
    return _label_names(hook.render().decode(), generate_latest(drv.registry).decode())


def audit_series() -> dict[str, set[str]]:
    """Series name -> label names, from the audit's own /metrics rendering."""
    from webhook.audit.metrics import AuditMetrics

    m = AuditMetrics()
    m.set_violations({("tier/gpu-tiers", "fail"): 1})
    m.scans.labels("ok").inc()
    return _label_names(m.render().decode())


def _label_names(*texts: str) -> dict[str, set[str]]:
    """Series name -> the label names its samples carry, over the expositions `texts`."""
    out: dict[str, set[str]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, set()).update(s.labels)
    return out
