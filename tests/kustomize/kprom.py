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
