"""One audit scan: read the cluster, judge every auditable object, build the reports."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.audit.evaluate import audit_context, auditable, judge
from webhook.audit.report import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_PARTS,
    DEFAULT_MAX_RESULTS,
    Collector,
    build_reports,
)
from webhook.audit.source import ClusterState, judged_pages, read_state, refresh_namespace
from webhook.policy.model import PolicySet
from webhook.server.caches import KubeHttp


@dataclass(frozen=True)
class Limits:
    max_results: int = DEFAULT_MAX_RESULTS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_parts: int = DEFAULT_MAX_PARTS


@dataclass
class ScanOutcome:
    reports: list[dict[str, Any]]
    collector: Collector
    objects: int  # objects judged
    seconds: float
    state: ClusterState | None = None


def judge_pages(
    pages: Iterable[list[dict[str, Any]]],
    policies: PolicySet,
    state: ClusterState,
    limits: Limits = Limits(),
    timestamp: int | None = None,
) -> ScanOutcome:
    """Judge pages of objects (already filtered by `auditable`) and build their reports."""
    start = time.monotonic()
    ctx = audit_context(state.namespace_labels, state.served_versions or frozenset({"v1"}))
    collector = Collector(keep=limits.max_results * limits.max_parts)
    objects = 0
    for page in pages:
        objects += len(page)
        collector.extend(judge(page, policies, state.inventory, ctx))
    reports = build_reports(
        collector,
        int(time.time()) if timestamp is None else timestamp,
        max_results=limits.max_results,
        max_bytes=limits.max_bytes,
        max_parts=limits.max_parts,
    )
    return ScanOutcome(reports, collector, objects, time.monotonic() - start)


def scan_cluster(http: KubeHttp, policies: PolicySet, limits: Limits = Limits()) -> ScanOutcome:
    start = time.monotonic()
    state = read_state(http)
    out = judge_pages(judged_pages(http, state, auditable), policies, state, limits)
    out.seconds = time.monotonic() - start
    out.state = state
    return out


def scan_namespace(
    http: KubeHttp, policies: PolicySet, state: ClusterState, namespace: str, limits: Limits = Limits()
) -> ScanOutcome:
    """Judge one namespace again, as a full scan would (its labels, claims and templates re-read;
    the rest of `state` as the last full scan left it). Only that namespace's reports come out."""
    start = time.monotonic()
    refresh_namespace(http, state, namespace)
    pages = judged_pages(http, state, auditable, namespace=namespace)
    out = judge_pages(pages, policies, state, limits)
    out.reports = [r for r in out.reports if (r.get("metadata") or {}).get("namespace") == namespace]
    out.seconds = time.monotonic() - start
    out.state = state
    return out


def summary_rows(reports: Iterable[Mapping[str, Any]]) -> list[tuple[str, dict[str, int]]]:
    """(scope, summary) per scope, the parts of a scope added up."""
    rows: dict[str, dict[str, int]] = {}
    for rep in reports:
        meta = rep.get("metadata") or {}
        scope = str(meta.get("namespace") or "(cluster)")
        acc = rows.setdefault(scope, dict.fromkeys(("pass", "fail", "warn", "error", "skip"), 0))
        for k, v in (rep.get("summary") or {}).items():
            acc[k] = acc.get(k, 0) + int(v)
    return sorted(rows.items())
